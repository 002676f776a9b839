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

from ..errors import argument_error
from .ag_news import load_ag_news
from .blimp import BLIMP_SUBSETS, BlimpBatch, BlimpPair, encode_blimp, load_blimp
from .contrastive import ContrastiveBatch
from .ioi import (
    IOIBatch,
    IOIPrompt,
    corrupt_ioi,
    encode_ioi,
    ioi_name_pool,
    load_ioi,
    make_ioi_prompts,
)
from .shipped import (
    SHIPPED_DATA,
    TextClassificationData,
    check_n,
    data_file,
    drop_empty_texts,
    first_rows,
    read_tsv,
    require_one_source,
    shipped_data,
    shipped_split,
)


def load_sst2(split: str = "train", *, n: int | None = None, path: str | Path | None = None,
              source: str = "local") -> TextClassificationData:
    """SST-2 sentences with labels 0 = negative, 1 = positive.

    Args:
        split: ``"train"`` (3,000 rows) or ``"test"`` (600 rows) of the shipped balanced slice; with
            ``source="hub"``: ``"train"`` or ``"validation"`` of GLUE SST-2 (its ``"test"`` split, whose labels GLUE
            keeps hidden, is refused). Ignored when ``path`` is given.
        n: keep the first ``n`` rows (``None``: all; more than there are: all, with a ``UserWarning``).
        path: a ``sentence<TAB>label`` file with a header line, instead of the shipped slice.
        source: ``"local"`` (default, no network) or ``"hub"`` (``datasets.load_dataset("glue", "sst2")``).

    Raises:
        BcosFileError: ``path`` does not exist.
        BcosValueError: an unknown ``split`` or ``source``, a negative ``n``, or a line of the file without a
            tab or with a label other than 0 / 1 (the message names the line).

    Rows whose sentence is empty are dropped, with a ``UserWarning`` that counts them.
    """
    names = ["negative", "positive"]
    n = check_n(n)
    require_one_source(path, source, "load_sst2")
    if source == "hub":
        from datasets import load_dataset

        ds = load_dataset("glue", "sst2", split=split)
        # stripped as the shipped slice's are: GLUE's sentences end in a space, which a byte-level tokenizer keeps as a
        # last token of its own (the token a GPT-2 classifier reads), so the hub's rows were classified unlike the same
        # shipped rows
        rows = [(r["sentence"].strip(), int(r["label"])) for r in ds]
        hidden = sum(label not in (0, 1) for _, label in rows)
        if hidden:
            # GLUE's test split holds label -1 on every row: it was returned as a class id, silently
            raise argument_error("split", f"GLUE SST-2's {split!r} split has no labels ({hidden} of {len(rows)} rows "
                                 "are labelled -1: GLUE keeps its test labels hidden)",
                                 "Use split='validation' (the labelled held-out split) with source='hub', or the "
                                 "shipped slice's 'test' split (source='local')")
    elif source == "local":
        file = data_file(path) if path is not None else shipped_split("sst2", split, ("train", "test"))
        rows = []
        for text, label, number in read_tsv(file):
            if label not in ("0", "1"):
                raise argument_error("path", f"{file}, line {number}: label {label!r} is not 0 or 1",
                                     "SST-2 labels are 0 (negative) and 1 (positive)")
            rows.append((text.strip(), int(label)))
    else:
        raise argument_error("source", f"must be 'local' or 'hub', got {source!r}",
                             "Use 'local' for the shipped slice or your path=..., 'hub' for `datasets`")
    kept = drop_empty_texts(rows, "load_sst2", "sentence")
    where = (f"GLUE SST-2's {split!r} split" if source == "hub" else f"the file {file}" if path is not None
             else f"the shipped SST-2 {split!r} split")
    return TextClassificationData(first_rows(kept, n, "load_sst2", where), names)
