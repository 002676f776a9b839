"""What the dataset loaders share: the folder of shipped data and the readers of its tab-separated slices.

The loaders (``bcos_plugins.data``, :mod:`.ag_news`, :mod:`.blimp`, :mod:`.ioi`) import from here, below them all,
so that no loader imports the package that re-exports it.
"""

from __future__ import annotations

from pathlib import Path

from .._checks import require_int
from ..errors import BcosFileError, argument_error

__all__ = ["SHIPPED_DATA", "TextClassificationData", "check_n", "read_tsv", "shipped_data", "shipped_split"]

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
    with path.open(encoding="utf-8") as f:
        lines = f.read().splitlines()
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


def check_n(n) -> int | None:
    """``n`` rows to keep (``None``: all) as a Python int, refusing a negative number, a float or a bool (NumPy's
    integer scalars taken: ``np.int64(3)``, a count read from an array, was refused as "not an int")."""
    if n is None:
        return None
    return require_int("n", n, minimum=0, fix="Pass the number of rows to keep, an int >= 0 (None keeps all)")


def shipped_split(dataset: str, split: str, splits: tuple[str, ...]) -> Path:
    """The shipped ``<dataset>/<split>.tsv``, refusing a split the shipped slice does not have."""
    if split not in splits:
        raise argument_error("split", f"the shipped {dataset} slice has {list(splits)}, got {split!r}",
                             "Pick one of those, pass path=... to your own file, or source='hub'")
    return SHIPPED_DATA / dataset / f"{split}.tsv"
