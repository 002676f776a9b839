"""What the dataset loaders share: the folder of shipped data and the readers of its tab-separated slices.

The loaders (``bcos_plugins.data``, :mod:`.ag_news`, :mod:`.blimp`, :mod:`.ioi`) import from here, below them all,
so that no loader imports the package that re-exports it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .._checks import require_int
from ..errors import BcosFileError, BcosTypeError, argument_error

__all__ = ["SHIPPED_DATA", "TextClassificationData", "check_n", "data_file", "drop_empty_texts", "first_rows", "read_tsv",
           "require_one_source", "shipped_data", "shipped_split"]

#: The datasets and tokenizer files shipped as package data (one folder per dataset, each with SOURCE.md).
SHIPPED_DATA = Path(__file__).resolve().parent / "files"


def shipped_data(*parts: str) -> Path:
    """A file or folder shipped with the package, e.g. ``shipped_data("gpt2_tokenizer")``.

    Raises:
        BcosFileError: nothing of that name is shipped (the message lists what is).
    """
    path = SHIPPED_DATA.joinpath(*parts)
    if not path.exists():
        shipped = sorted(p.name for p in SHIPPED_DATA.iterdir() if p.is_dir())
        raise argument_error(
            "parts", f"{'/'.join(parts)!r} is not shipped with bcos_plugins (looked in {SHIPPED_DATA})",
            f"Use one of the shipped folders {shipped}, or pass your own file to the loader's path=...",
            kind=BcosFileError)
    return path


class TextClassificationData(list):
    """A list of ``(text, label)`` pairs with the class names attached."""

    def __init__(self, rows, label_names: list[str]):
        super().__init__(rows)
        self.label_names = label_names

    @property
    def texts(self) -> list[str]:
        return [t for t, _ in self]

    @property
    def labels(self) -> list[int]:
        return [y for _, y in self]


def read_tsv(path: Path, header: bool = True) -> list[tuple[str, str, int]]:
    """``(text, label, line number)`` of a ``text<TAB>label`` file; a line without a tab raises."""
    if not path.is_file():
        raise argument_error("path", f"{path} not found",
                             "Pass path=... to a tab-separated file, or source='hub' to load with `datasets`",
                             kind=BcosFileError)
    # utf-8-sig: a byte order mark (Windows editors write one) stayed at the start of the first text of a file without
    # a header line (AG News), "\ufeffWall St. ...", tokenised as its own token, silently
    try:
        with path.open(encoding="utf-8-sig") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as err:  # (was the bare UnicodeDecodeError, naming neither the file nor the fix)
        raise argument_error("path", f"{path} is not UTF-8 text (byte {err.start}: {err.reason})",
                             "Save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), one text<TAB>label per line"
                             ) from None
    if header and lines and "\t" in lines[0] and lines[0].rsplit("\t", 1)[1].strip().lstrip("-").isdigit():
        # A file without its header line lost its first row, silently, as the header.
        raise argument_error("path", f"{path}, line 1 is a row ({lines[0][:60]!r}), not the header line",
                             "Start the file with a header line (text<TAB>label, e.g. sentence<TAB>label)")
    rows = []
    for number, line in enumerate(lines[1 if header else 0 :], start=2 if header else 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise argument_error("path", f"{path}, line {number}: no tab between text and label ({line[:60]!r})",
                                 "Each line is text<TAB>label")
        text, label = line.rsplit("\t", 1)
        rows.append((text, label.strip(), number))
    return rows


def data_file(path) -> Path:
    """``path`` (a str or ``os.PathLike``) as a ``Path``: an int or bytes failed inside ``pathlib`` with "expected str,
    bytes or os.PathLike object", naming no argument."""
    if not isinstance(path, str | os.PathLike):
        raise argument_error("path", f"must be a file path (str or pathlib.Path), got {type(path).__name__} {path!r}",
                             "Pass path='my_data.tsv' (or pathlib.Path), or leave it out for the shipped slice",
                             kind=BcosTypeError)
    return Path(path)


def require_one_source(path, source: str, loader: str) -> None:
    """Refuse ``path=`` together with ``source="hub"``: the loaders read the hub and ignored the file, silently (the
    one check of ``load_sst2``, ``load_ag_news`` and ``load_blimp``)."""
    if source == "hub" and path is not None:
        raise argument_error("path", f"{loader} was given path={str(path)!r} and source='hub'; it reads one of them",
                             "Leave source out (source='local') to read your file, or drop path= to load from the hub")


def drop_empty_texts(rows: list[tuple[str, int]], loader: str, what: str = "text") -> list[tuple[str, int]]:
    """``rows`` without those whose text is empty or whitespace, with a ``UserWarning`` that counts them: an empty
    text was kept as a row of special tokens alone, classified and explained beside the real ones."""
    kept = [row for row in rows if row[0].strip()]
    if len(kept) < len(rows):
        warnings.warn(f"{loader}: dropped {len(rows) - len(kept)} of {len(rows)} rows whose {what} is empty (nothing "
                      "to classify or explain); n counts the rows kept", stacklevel=3)
    return kept


def check_n(n) -> int | None:
    """``n`` rows to keep (``None``: all) as a Python int, refusing a negative number, a float or a bool (NumPy's
    integer scalars taken: ``np.int64(3)``, a count read from an array, was refused as "not an int")."""
    if n is None:
        return None
    return require_int("n", n, minimum=0, fix="Pass the number of rows to keep, an int >= 0 (None keeps all)")


def first_rows(rows: list, n: int | None, loader: str, where: str, what: str = "rows") -> list:
    """The first ``n`` of ``rows`` (all of them for ``None``), with a ``UserWarning`` naming ``n``, the rows available
    and ``where`` they were read from (the split, the file) when ``n`` exceeds them: a loader returned every row
    without a word (``load_sst2("test", n=1000)`` gave the slice's 600 rows). The one check of every loader's ``n``
    (``load_sst2``, ``load_ag_news``, ``load_blimp``, ``load_ioi``); ``what`` names the rows."""
    if n is not None and n > len(rows):
        warnings.warn(f"{loader}: n={n}, but {where} has {len(rows)} {what}: all {len(rows)} are returned. Pass "
                      f"n <= {len(rows)} (or n=None for all) to silence this", UserWarning, stacklevel=3)
    return rows if n is None else rows[:n]


def shipped_split(dataset: str, split: str, splits: tuple[str, ...]) -> Path:
    """The shipped ``<dataset>/<split>.tsv``, refusing a split the shipped slice does not have."""
    if split not in splits:
        raise argument_error("split", f"the shipped {dataset} slice has {list(splits)}, got {split!r}",
                             "Pick one of those, pass path=... to your own file, or source='hub'")
    return SHIPPED_DATA / dataset / f"{split}.tsv"
