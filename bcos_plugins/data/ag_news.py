"""AG News (4-class topic classification) from the slice shipped in ``bcos_plugins/data/files/ag_news``.

Kept in its own module so that ``bcos_plugins.data`` stays a list of small loaders; re-exported there.
"""

from __future__ import annotations

import re
from pathlib import Path

from .._checks import require_bool
from ..errors import argument_error
from .shipped import (
    TextClassificationData,
    check_n,
    data_file,
    drop_empty_texts,
    first_rows,
    read_tsv,
    require_one_source,
    shipped_split,
)

__all__ = ["AG_NEWS_LABELS", "load_ag_news"]

AG_NEWS_LABELS = ["World", "Sports", "Business", "Sci/Tech"]

# The source keeps AG's HTML-ish escapes (" #39;" for an apostrophe, "#36;" for a dollar sign, "\" for a
# line break); a tokenizer would otherwise see "#", "39" and ";" as words.
_ESCAPES = [(re.compile(r" ?#39;"), "'"), (re.compile(r"#36;"), "$"), (re.compile(r"#38;"), "&"),
            (re.compile(r" ?quot;"), '"'), (re.compile(r"\\+"), " ")]


def _clean(text: str) -> str:
    for pattern, repl in _ESCAPES:
        text = pattern.sub(repl, text)
    return " ".join(text.split())


def load_ag_news(split: str = "train", *, n: int | None = None, path: str | Path | None = None,
                 source: str = "local", clean: bool = True) -> TextClassificationData:
    """AG News descriptions with labels 0 = World, 1 = Sports, 2 = Business, 3 = Sci/Tech.

    Args:
        split: ``"train"`` (2,400 rows) or ``"test"`` (800 rows) of the shipped balanced slice; with
            ``source="hub"``: ``"train"`` or ``"test"`` of the ``ag_news`` dataset on the Hugging Face hub.
        n: keep the first ``n`` rows (the shipped files are shuffled, so any prefix is roughly balanced);
            ``None``: all; more than there are: all, with a ``UserWarning``.
        path: a ``text<TAB>label`` file without header (label a class name or id) instead of the slice.
        source: ``"local"`` (default, no network) or ``"hub"`` (``datasets.load_dataset("ag_news")``).
        clean: undo the source's escapes (`` #39;`` -> ``'``, ``\\`` -> space).

    Rows whose text is empty (after cleaning) are dropped, with a ``UserWarning`` that counts them, as
    :func:`~bcos_plugins.data.load_sst2` drops empty sentences.
    """
    n = check_n(n)
    clean = require_bool("clean", clean)  # "no" cleaned (truthy), None did not
    require_one_source(path, source, "load_ag_news")
    if source == "hub":
        from datasets import load_dataset

        ds = load_dataset("ag_news", split=split)
        rows = [(r["text"], int(r["label"])) for r in ds]
    elif source == "local":
        file = data_file(path) if path is not None else shipped_split("ag_news", split, ("train", "test"))
        rows = []
        for text, label, number in read_tsv(file, header=False):
            if label in AG_NEWS_LABELS:
                y = AG_NEWS_LABELS.index(label)
            elif label.isdigit() and int(label) < len(AG_NEWS_LABELS):
                y = int(label)
            else:
                # a first line like 'text<TAB>label' is a header, which these files do not have: say so
                header = (" (a header line? AG News files have none: drop it)" if number == 1
                          # the original AG News files number the classes 1-4: 1, 2 and 3 read as ids, 4 stopped here
                          else " (the original AG News files number the classes 1-4: subtract 1 from every label)"
                          if label == "4" else "")
                raise argument_error("path", f"{file}, line {number}: unknown AG News label {label!r}{header}",
                                     f"Labels are one of {AG_NEWS_LABELS} or an id 0-3")
            rows.append((text, y))
    else:
        raise argument_error("source", f"must be 'local' or 'hub', got {source!r}",
                             "Use 'local' for the shipped slice or your path=..., 'hub' for `datasets`")
    if clean:
        rows = [(_clean(t), y) for t, y in rows]
    # after cleaning (a text of the source's line-break escapes alone cleans to ""), as load_sst2 drops them
    rows = drop_empty_texts(rows, "load_ag_news")
    where = (f"AG News' {split!r} split" if source == "hub" else f"the file {file}" if path is not None
             else f"the shipped AG News {split!r} split")
    return TextClassificationData(first_rows(rows, n, "load_ag_news", where), list(AG_NEWS_LABELS))
