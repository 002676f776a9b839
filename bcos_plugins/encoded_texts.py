"""Tokenised texts as a ``torch`` dataset for transformers' ``Trainer`` (the package's training helpers)."""

from __future__ import annotations

import torch

__all__ = ["EncodedTexts"]


class EncodedTexts(torch.utils.data.Dataset):
    """Tokenised texts (or sentence pairs) for ``Trainer`` (padding is left to the collator)."""

    def __init__(self, tokenizer, texts: list[str], labels: list[int] | None, max_length: int,
                 text_pairs: list[str] | None = None):
        self.encodings = tokenizer(list(texts), text_pairs, truncation=True, max_length=max_length)
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
