"""The batch shape of contrastive next-token tasks (BLiMP, IOI): what ``explain(..., target=, foil=)`` and
``mean_reciprocal_rank(scores, evidence, candidates)`` read, shared by :class:`~bcos_plugins.data.BlimpBatch` and
:class:`~bcos_plugins.data.IOIBatch` so the metrics take either unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from .._checks import require_int
from ..errors import argument_error

__all__ = ["ContrastiveBatch", "left_pad", "word_tokens_after"]


@dataclass
class ContrastiveBatch:
    """Tokenised prompts, left-padded, with the token to explain against its foil and the evidence to find.

    ``evidence`` marks the tokens a faithful explanation should rank first; ``candidates`` the tokens that are
    ranked (real prompt tokens, BOS excluded).
    """

    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    target_ids: Int[Tensor, " batch"]
    foil_ids: Int[Tensor, " batch"]
    evidence: Bool[Tensor, "batch pos"]
    candidates: Bool[Tensor, "batch pos"]

    def __len__(self) -> int:
        return self.target_ids.shape[0]


def left_pad(rows: Sequence[Sequence[int]], evidence: Sequence[Sequence[bool]], *, pad_token_id: int,
             bos_token_id: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Token rows in one batch, left-padded so that each ends at the last column (where the model predicts),
    ``bos_token_id`` prepended to each when given: ``(input_ids, attention_mask, evidence, candidates,
    starts)``. ``evidence`` holds one flag per token of each row; ``candidates`` marks the rows' tokens (not
    the BOS, not the padding); ``starts`` is the column of each row's first token (after the BOS).

    Raises:
        BcosValueError: no rows, a row without tokens, ``evidence`` not one flag per token of each row (the
            rows named), or a negative ``pad_token_id``.
    """
    _check_rows_and_flags(rows, evidence)
    # a negative id was written into the batch as padding: the embedding refuses it, or a negative index reads
    # another token's row from the end of the table
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0,
                               fix="Pass the tokenizer's pad id, an int >= 0 (tokenizer.pad_token_id)")
    shift = int(bos_token_id is not None)
    length = max(len(row) for row in rows) + shift
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(batch, length, dtype=torch.long)
    evidence_mask = torch.zeros(batch, length, dtype=torch.bool)
    candidates = torch.zeros(batch, length, dtype=torch.bool)
    starts = torch.zeros(batch, dtype=torch.long)
    for i, (row, flags) in enumerate(zip(rows, evidence, strict=True)):
        start = starts[i] = length - len(row)
        input_ids[i, start - shift:] = torch.tensor([bos_token_id, *row] if shift else list(row), dtype=torch.long)
        attention_mask[i, start - shift:] = 1
        evidence_mask[i, start:] = torch.tensor(list(flags), dtype=torch.bool)
        candidates[i, start:] = True
    return input_ids, attention_mask, evidence_mask, candidates, starts


def _check_rows_and_flags(rows: Sequence[Sequence[int]], evidence: Sequence[Sequence[bool]]) -> None:
    """One flag per token of each row, refused by name: a mismatch failed inside torch's slice assignment ("The
    expanded size of the tensor ... must match") or zip's strict check, naming neither argument nor row."""
    if len(rows) == 0:
        raise argument_error("rows", "is empty", "Pass at least one token row")
    # an empty row became a row of padding alone (or the BOS alone) with no candidate: its "prediction" at the last
    # column was the model's output at a padding token, explained and scored beside the real rows without a word
    empty = [i for i, row in enumerate(rows) if len(row) == 0]
    if empty:
        raise argument_error("rows", f"rows {empty[:8]}{' ...' if len(empty) > 8 else ''} hold no tokens",
                             "Drop them: the explained prediction follows a row's last token, so a row needs one")
    if len(evidence) != len(rows):
        raise argument_error("evidence", f"has {len(evidence)} rows of flags but rows has {len(rows)}",
                             "Give one row of evidence flags per token row")
    wrong = [(i, len(flags), len(row)) for i, (row, flags) in enumerate(zip(rows, evidence, strict=True))
             if len(flags) != len(row)]
    if wrong:
        shown = ", ".join(f"row {i}: {f} flags for {n} tokens" for i, f, n in wrong[:8])
        raise argument_error("evidence", f"must hold one flag per token of each row ({shown})",
                             "Build the flags from the same tokenisation as rows")


def word_tokens_after(tokenizer, prefix: str, word: str, prefix_ids: Sequence[int] | None = None) -> list[int] | None:
    """The ids of `` word`` as the model reads them after ``prefix`` (tokenised as ``prefix_ids``, tokenised here when
    not given): the tail of ``prefix + " " + word``'s ids; ``None`` where those ids do not start with the prefix's (the
    tokenizer merged the prefix's end with the word). The one reading of a next word's ids of the contrastive tasks
    (:func:`~bcos_plugins.data.encode_blimp`'s targets and foils, the IOI names): `` word`` tokenised alone is
    ``["▁", "▁word"]`` for a SentencePiece tokenizer that marks the leading space itself (Llama 2's), a bare "▁" that
    the model never reads there; for GPT-2 (byte-level) both readings give the same ids."""
    if prefix_ids is None:
        prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    whole = tokenizer(f"{prefix} {word}", add_special_tokens=False)["input_ids"]
    n = len(prefix_ids)
    return list(whole[n:]) if list(whole[:n]) == list(prefix_ids) and len(whole) > n else None
