"""Small dataset loaders for the examples, tests and benchmarks.

Loaders read the slices shipped inside the package (``bcos_plugins/data/files/<dataset>/``, package data of
the wheel, each with its SOURCE.md attribution and licence) by default, an explicit file/folder when given
(``path=...``), or the Hugging Face hub through ``datasets`` with ``source="hub"`` for users who have the
network. :data:`SHIPPED_DATA` is that folder; :func:`shipped_data` returns a file or folder in it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BLIMP_SUBSETS",
    "SHIPPED_DATA",
    "BlimpBatch",
    "BlimpPair",
    "ContrastiveBatch",
    "IOIBatch",
    "IOIPrompt",
    "TextClassificationData",
    "corrupt_ioi",
    "encode_blimp",
    "encode_ioi",
    "ioi_name_pool",
    "load_ag_news",
    "load_blimp",
    "load_ioi",
    "load_sst2",
    "make_ioi_prompts",
    "shipped_data",
]

from ..errors import BcosFileError, BcosTypeError, BcosValueError, argument_error

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


def _read_tsv(path: Path, header: bool = True) -> list[tuple[str, str, int]]:
    """``(text, label, line number)`` of a ``text<TAB>label`` file; a line without a tab raises."""
    if not path.is_file():
        raise argument_error("path", f"{path} not found",
                             "Pass path=... to a tab-separated file, or source='hub' to load with `datasets`",
                             kind=BcosFileError)
    with path.open(encoding="utf-8") as f:
        lines = f.read().splitlines()
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


def _check_n(n) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise argument_error("n", f"must be a non-negative int or None, got {n!r}",
                             "Pass the number of rows to keep (None keeps all)",
                             kind=BcosTypeError if not isinstance(n, int) or isinstance(n, bool) else BcosValueError)
    return n


def _shipped_split(dataset: str, split: str, splits: tuple[str, ...]) -> Path:
    if split not in splits:
        raise argument_error("split", f"the shipped {dataset} slice has {list(splits)}, got {split!r}",
                             "Pick one of those, pass path=... to your own file, or source='hub'")
    return SHIPPED_DATA / dataset / f"{split}.tsv"


def load_sst2(split: str = "train", *, n: int | None = None, path: str | Path | None = None,
              source: str = "local") -> TextClassificationData:
    """SST-2 sentences with labels 0 = negative, 1 = positive.

    Args:
        split: ``"train"`` (3,000 rows) or ``"test"`` (600 rows) of the shipped balanced slice; with
            ``source="hub"``: ``"train"`` or ``"validation"`` of GLUE SST-2. Ignored when ``path`` is given.
        n: keep the first ``n`` rows (``None``: all).
        path: a ``sentence<TAB>label`` file with a header line, instead of the shipped slice.
        source: ``"local"`` (default, no network) or ``"hub"`` (``datasets.load_dataset("glue", "sst2")``).

    Raises:
        BcosFileError: ``path`` does not exist.
        BcosValueError: an unknown ``split`` or ``source``, a negative ``n``, or a line of the file without a
            tab or with a label other than 0 / 1 (the message names the line).
    """
    names = ["negative", "positive"]
    n = _check_n(n)
    if source == "hub":
        from datasets import load_dataset

        ds = load_dataset("glue", "sst2", split=split)
        rows = [(r["sentence"], int(r["label"])) for r in ds]
    elif source == "local":
        file = Path(path) if path is not None else _shipped_split("sst2", split, ("train", "test"))
        rows = []
        for text, label, number in _read_tsv(file):
            if label not in ("0", "1"):
                raise argument_error("path", f"{file}, line {number}: label {label!r} is not 0 or 1",
                                     "SST-2 labels are 0 (negative) and 1 (positive)")
            rows.append((text.strip(), int(label)))
    else:
        raise argument_error("source", f"must be 'local' or 'hub', got {source!r}",
                             "Use 'local' for the shipped slice or your path=..., 'hub' for `datasets`")
    return TextClassificationData(rows[:n] if n is not None else rows, names)

# The dataset modules import the helpers above, so they come last.
from .ag_news import load_ag_news  # noqa: E402
from .blimp import BLIMP_SUBSETS, BlimpBatch, BlimpPair, encode_blimp, load_blimp  # noqa: E402
from .contrastive import ContrastiveBatch  # noqa: E402
from .ioi import (  # noqa: E402
    IOIBatch,
    IOIPrompt,
    corrupt_ioi,
    encode_ioi,
    ioi_name_pool,
    load_ioi,
    make_ioi_prompts,
)
