"""Tokenised texts as a ``torch`` dataset for transformers' ``Trainer`` (the package's training helpers), and the
length the training and prediction helpers truncate texts to, checked against the model's position limit."""

from __future__ import annotations

import torch
from torch import nn

from ._checks import (
    require_count,
    require_max_length_beyond_special_tokens,
    require_row_ids,
    require_text_pairs,
    require_texts,
)
from .convert.architectures import position_limit, require_max_length_fits
from .errors import argument_error

__all__ = ["EncodedTexts", "require_max_length_fits", "truncation_length"]


class EncodedTexts(torch.utils.data.Dataset):
    """Tokenised texts (or sentence pairs) for ``Trainer`` (padding is left to the collator)."""

    def __init__(self, tokenizer, texts: list[str], labels: list[int] | None, max_length: int,
                 text_pairs: list[str] | None = None):
        texts = require_texts(texts)
        text_pairs = require_text_pairs(text_pairs, len(texts))
        # One label short used to surface as an IndexError at that row inside Trainer, mid-epoch; one label too
        # many was dropped silently (every label after a missing text then belongs to the wrong text).
        if labels is not None and len(labels) != len(texts):
            raise argument_error("labels", f"{len(texts)} texts but {len(labels)} labels",
                                 "Pass one label per text (labels[i] is the class of texts[i])")
        if labels is not None:
            # read by the package's one id parser: a float label was truncated by int() in __getitem__ (0.7 trained
            # as class 0), silently
            labels = require_row_ids("labels", labels, len(texts), what="classes", broadcast=False).tolist()
        if max_length is not None:
            # 0 gave rows of no token (trained on as empty texts), a negative or float one failed inside the tokenizer
            max_length = require_count("max_length", max_length)
            require_max_length_beyond_special_tokens(tokenizer, max_length, text_pairs is not None)
        self.encodings = tokenizer(texts, text_pairs, truncation=True, max_length=max_length)
        self.labels = labels
        self.teacher_logits: list[list[float]] | None = None

    def __len__(self) -> int:
        return len(self.encodings["input_ids"])

    def __getitem__(self, i: int) -> dict:
        item = {k: v[i] for k, v in self.encodings.items()}
        if self.labels is not None:
            item["labels"] = int(self.labels[i])
        if self.teacher_logits is not None:
            item["teacher_logits"] = self.teacher_logits[i]
        return item


def truncation_length(model: nn.Module, max_length, *, default: int) -> int:
    """The length the training and prediction helpers truncate texts to for ``model``, checked before any work.

    ``max_length`` longer than the model's position limit
    (:func:`~bcos_plugins.convert.architectures.position_limit`) is refused: the first longer text would reach
    the position table and fail inside the embedding with an opaque index error (a device-side assert on a GPU),
    possibly after part of the training had run. ``None``: ``default`` (a helper's usual length), capped at that
    limit, so a model with fewer positions runs on its default. Without a table (rotary positions) every length
    runs.
    """
    if max_length is None:
        limit = position_limit(model).max_length
        return default if limit is None else min(default, limit)
    max_length = require_count("max_length", max_length, minimum=2)
    require_max_length_fits(model, max_length)
    return max_length


