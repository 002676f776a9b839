"""Rationale alignment: how well token scores agree with human rationale masks (docs/design.md#metrics).

Both metrics take any per-token scores (attention, B-cos contributions, Captum attributions, Space Model
context attribution) of shape ``(batch, pos)`` (attributions at the embeddings ``(batch, pos, d)`` or Captum's one-input
tuple are summed over ``d``; an explanation of the package: its contributions, its
``attention_mask`` the default ``valid_mask``), a gold mask of the same shape (1 on rationale tokens) and the
positions that count (``valid_mask``: real tokens, usually without special tokens). Positions outside
``valid_mask`` (padding, [CLS], [SEP]) never enter a metric, whatever their score.

- **Top-k IoU** (Self-Guided Attention paper, Eq. 10): per row, ``|top-k ∩ gold| / |top-k ∪ gold|`` where
  top-k are the k highest-scoring valid tokens. ``k=None`` (default) takes k = the number of gold tokens of
  the row, so a perfect ranking scores 1; an int fixes k; a float in (0, 1] takes that fraction of the
  row's valid tokens (at least 1). Ties at the k-th score are broken by position, the earlier token first (a
  stable sort; ``torch.topk`` promises no order among ties).
- **AUPRC** (average precision): per row, ``AP = sum_t (R_t - R_{t-1}) P_t`` over the distinct score
  thresholds t in decreasing order, which is the definition of scikit-learn's ``average_precision_score``
  (tied scores form one threshold). Written here in torch so that a whole padded batch is scored at once
  with padding excluded by the mask and no per-row Python loop or transfer to NumPy; the tests check it
  against scikit-learn on random rows with ties.

Rows without any gold token (or any valid token) have no defined IoU or AP: they are NaN in the per-row
output and left out of the mean (``RationaleAlignment.n_rows`` says how many rows counted). A row whose valid
scores are all equal (all zero: a method that found nothing) has no ranking, so its top-k would be the tie rule's
pick: its IoU is NaN too and left out of the IoU mean (``n_iou_rows``), as MRR
(:func:`~bcos_plugins.metrics.mean_reciprocal_rank`) leaves out such rows; it counts where ``k`` takes every
valid token, which no ranking changes. Its AP is defined (one threshold: the share of gold tokens) and kept.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import bad_rows, require_same_shape, require_tensor
from ..errors import argument_error
from .attributions import (
    ranking_dtype,
    refuse_boolean_scores,
    scores_and_positions,
    share_as_written,
    share_counts,
)

__all__ = ["RationaleAlignment", "rationale_alignment", "top_k_iou", "average_precision"]


def _check(scores: Tensor, gold_mask: Tensor, valid_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    # an explanation of the package: its contributions, its padding no valid position (it was refused)
    scores, valid_mask = scores_and_positions(scores, valid_mask, ranked_as="valid_mask")
    scores = require_tensor("scores", scores, ndim=2, finite=False, shape_hint="(batch, pos)")
    refuse_boolean_scores("scores", scores)
    if 0 in scores.shape:
        raise argument_error("scores", f"are empty (shape {tuple(scores.shape)})",
                             "Pass the scores of at least one token of one example")
    # A gold mask of 2s or NaNs would silently count as rationale (bool()); annotator averages are thresholded
    # by the caller (gold_mask_from_words).
    gold_mask = require_tensor("gold_mask", gold_mask, ndim=2, kind="mask")
    require_same_shape("gold_mask", gold_mask, "scores", scores)
    if valid_mask is None:
        valid_mask = torch.ones_like(gold_mask, dtype=torch.bool)
    valid_mask = require_tensor("valid_mask", valid_mask, ndim=2, kind="mask")
    require_same_shape("valid_mask", valid_mask, "scores", scores)
    valid = valid_mask.bool()
    gold = gold_mask.bool() & valid
    bad = ~torch.isfinite(scores) & valid
    if bad.any():
        raise argument_error("scores", f"contain NaN or inf at valid positions in {bad_rows(bad)}",
                             "Fix the attribution method for those rows (or mark the positions invalid)")
    return scores.detach().to(ranking_dtype(scores.dtype)), gold, valid


def top_k_iou(
    scores: Float[Tensor, "batch pos"],
    gold_mask: Tensor,
    valid_mask: Tensor | None = None,
    k: int | float | None = None,
) -> Float[Tensor, " batch"]:
    """Per-row top-k IoU of ``scores`` against ``gold_mask`` over ``valid_mask`` positions (see module doc). NaN for
    rows without a gold or valid token, and for rows whose valid scores are all equal while ``k`` leaves some out
    (no ranking to pick the top k by: the tie rule scored the earliest tokens, 1.0 where the gold ones come first).
    One rule with :func:`~bcos_plugins.metrics.reciprocal_rank`: a row whose scores are all equal is NaN where the
    metric's definition needs the scores to order the row's tokens. A top k needs an order only to pick k of the
    valid tokens, so a tied row counts where ``k`` takes them all (its IoU is ``|gold| / |valid|`` whatever the
    scores, a row of one valid token too); a rank always needs one, so MRR leaves out every tied row, a row of one
    candidate too (rank 1 for every method). Neither metric leaves out a row its scores do order, even where every
    order gives the same value."""
    scores, gold, valid = _check(scores, gold_mask, valid_mask)
    n_valid = valid.sum(1)
    n_gold = gold.sum(1)
    # the number a NumPy scalar or a 0-d tensor holds (np.int64(2) was refused as "not an int"); booleans stay refused
    # a float32 k (torch.tensor(0.7), np.float32(0.7)) as the decimal it stands for: read as 0.69999999 it took 6 of 10
    # valid tokens for 7, silently
    k = share_as_written(k)
    if isinstance(k, Tensor) and k.ndim == 0 and k.dtype != torch.bool:
        k = k.item()
    if isinstance(k, numbers.Integral) and not isinstance(k, bool | np.bool_):
        k = int(k)
    elif isinstance(k, numbers.Real) and not isinstance(k, bool | np.bool_):
        k = float(k)
    if k is None:
        k_row = n_gold
    elif isinstance(k, float):
        if not 0 < k <= 1:
            raise argument_error("k", f"a float k is a fraction of the valid tokens and must lie in (0, 1], got {k}",
                                 "Pass a fraction in (0, 1], an int or None")
        k_row = share_counts(n_valid, k)
    elif isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= scores.shape[1]:
        # Rows with fewer valid tokens than k select all of them (k is capped per row).
        k_row = torch.full_like(n_gold, k)
    else:
        raise argument_error("k", f"k must be None (= number of gold tokens), an int in [1, {scores.shape[1]}] "
                             f"(the number of positions) or a fraction in (0, 1], got {k!r}", "Pass one of those")
    k_row = torch.minimum(k_row, n_valid)
    # Invalid positions sink below every valid score, so top-k never picks them while k <= n_valid.
    ranked = scores.masked_fill(~valid, float("-inf"))
    order = ranked.argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    selected = (rank < k_row[:, None]) & valid
    # in the scores' ranking dtype (float64 kept), as aopc and reciprocal_rank keep float64: it was float32 always
    inter = (selected & gold).sum(1).to(scores.dtype)
    union = (selected | gold).sum(1).to(scores.dtype)
    iou = inter / union.clamp_min(1)
    # all valid scores equal (MRR skips such rows): the top k would be the tie rule's pick, unless k takes them all
    tied = scores.masked_fill(~valid, float("inf")).amin(1) == scores.masked_fill(~valid, float("-inf")).amax(1)
    ranked_rows = (n_gold > 0) & (n_valid > 0) & ~(tied & (k_row < n_valid))
    return torch.where(ranked_rows, iou, torch.full_like(iou, float("nan")))


def average_precision(
    scores: Float[Tensor, "batch pos"],
    gold_mask: Tensor,
    valid_mask: Tensor | None = None,
) -> Float[Tensor, " batch"]:
    """Per-row average precision (area under the precision-recall curve) over ``valid_mask`` positions."""
    scores, gold, valid = _check(scores, gold_mask, valid_mask)
    # at_or_above[b, i, j]: valid token j scores >= token i (token i's threshold admits j).
    at_or_above = (scores[:, None, :] >= scores[:, :, None]) & valid[:, None, :]
    # in the scores' ranking dtype (float64 kept), as top_k_iou: it was float32 always
    retrieved = at_or_above.sum(-1).to(scores.dtype)
    hits = (at_or_above & gold[:, None, :]).sum(-1).to(scores.dtype)
    precision_at_own_threshold = hits / retrieved.clamp_min(1)
    n_gold = gold.sum(1)
    ap = (precision_at_own_threshold * gold).sum(1) / n_gold.clamp_min(1)
    return torch.where(n_gold > 0, ap, torch.full_like(ap, float("nan")))


@dataclass
class RationaleAlignment:
    """Batch summary: means over rows with a rationale, and the per-row values. ``n_rows`` counts the rows of the
    AUPRC mean, ``n_iou_rows`` those of the IoU mean (fewer where rows' scores are all tied, see module doc)."""

    iou: float
    auprc: float
    n_rows: int
    iou_per_row: Tensor
    auprc_per_row: Tensor
    n_iou_rows: int

    def as_dict(self) -> dict[str, float]:
        # each mean with its own count: the IoU mean leaves out tied rows the AUPRC mean keeps
        return {"iou": self.iou, "auprc": self.auprc, "n_rows": self.n_rows, "n_iou_rows": self.n_iou_rows}


def rationale_alignment(
    scores: Float[Tensor, "batch pos"],
    gold_mask: Tensor,
    valid_mask: Tensor | None = None,
    k: int | float | None = None,
) -> RationaleAlignment:
    """Top-k IoU and AUPRC of ``scores`` against ``gold_mask`` in one call (means over rows with a rationale).

    ``scores`` may be signed (B-cos contributions): higher means "more evidence for the explained class".
    Pass ``scores.abs()`` to rank by magnitude instead.

    Args:
        scores: one score per token ``(batch, pos)``, e.g. ``explain(...).contributions``.
        gold_mask: the human rationale ``(batch, pos)``, 1 (or True) on rationale tokens.
        valid_mask: tokens that may be ranked ``(batch, pos)`` (e.g. the attention mask without special tokens);
            ``None``: every token.
        k: how many top tokens the IoU takes: ``None`` (each row's number of gold tokens), an int, or a fraction of
            the row's valid tokens in (0, 1].

    Returns:
        A :class:`RationaleAlignment`: ``iou`` and ``auprc`` (floats: means over the rows with a rationale, NaN where
        none has one), ``n_rows`` / ``n_iou_rows`` (the rows in each mean), ``iou_per_row`` and ``auprc_per_row``
        ``(batch,)`` (NaN for rows left out).
    """
    iou = top_k_iou(scores, gold_mask, valid_mask, k)
    ap = average_precision(scores, gold_mask, valid_mask)
    counted = ~torch.isnan(ap)
    n = int(counted.sum())
    ranked = ~torch.isnan(iou)  # a subset of the counted rows: top_k_iou also leaves out rows of tied scores
    n_iou = int(ranked.sum())
    return RationaleAlignment(
        iou=float(iou[ranked].mean()) if n_iou else float("nan"),
        auprc=float(ap[counted].mean()) if n else float("nan"),
        n_rows=n,
        iou_per_row=iou,
        auprc_per_row=ap,
        n_iou_rows=n_iou,
    )
