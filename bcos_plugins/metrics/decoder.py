"""Metrics for contrastive next-token explanations of decoders (B-cos LM paper §7, DESIGN.md §4).

- **Reciprocal rank** of one explanation: rank the candidate tokens of the prefix by score (descending) and
  take ``1 / rank`` of the best-ranked evidence token. MRR is its mean over examples. Ties keep the prefix
  order (a stable sort, as the paper's evaluation code sorts). Rows whose scores are all zero, or that have no
  evidence token, have no rank (NaN) and are left out of the mean, as the paper's code leaves them out.
- **Random baseline**: the expected reciprocal rank when the ``n`` candidates are ranked uniformly at random and
  ``k`` of them are evidence. The best evidence rank is ``r`` with probability ``C(n - r, k - 1) / C(n, k)``
  (the other ``k - 1`` evidence tokens all rank below ``r``), so

      E[1 / min rank] = sum_{r=1}^{n-k+1} C(n - r, k - 1) / (r C(n, k))

  which is the formula of the paper's code (``expected_inverse_of_min``), extended to ``k == n`` (value 1).
- **Probability gap**: ``p(target) - p(foil)`` under the softmax of the next-token logits at the explained
  position (the paper's Table 5 / 13 "probability gap").
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = [
    "MRRResult",
    "expected_random_reciprocal_rank",
    "mean_reciprocal_rank",
    "probability_gap",
    "random_reciprocal_rank",
    "reciprocal_rank",
]


def _check_masks(scores: Tensor, evidence: Tensor, candidates: Tensor | None) -> Tensor:
    if scores.ndim != 2:
        raise ValueError(f"scores must have shape (batch, pos); got {tuple(scores.shape)}")
    if evidence.shape != scores.shape:
        raise ValueError(f"evidence mask shape {tuple(evidence.shape)} != scores shape {tuple(scores.shape)}")
    if candidates is None:
        candidates = torch.ones_like(scores, dtype=torch.bool)
    elif candidates.shape != scores.shape:
        raise ValueError(f"candidates mask shape {tuple(candidates.shape)} != scores shape {tuple(scores.shape)}")
    candidates = candidates.bool()
    if (evidence.bool() & ~candidates).any():
        rows = (evidence.bool() & ~candidates).any(1).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} mark evidence outside the candidate tokens (padding or excluded tokens); "
                         "evidence must be a subset of the ranked prefix tokens")
    return candidates


def reciprocal_rank(
    scores: Float[Tensor, "batch pos"],
    evidence: Bool[Tensor, "batch pos"],
    candidates: Bool[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, " batch"]:
    """``1 / rank`` of the best-ranked evidence token per row, float64 (NaN where undefined, see module docstring).

    Args:
        scores: token scores of a contrastive explanation (higher = more evidence for target over foil).
        evidence: True on the ground-truth evidence tokens.
        candidates: tokens that take part in the ranking (True), e.g. the real prefix tokens without padding
            and BOS; default: all positions.
    """
    candidates = _check_masks(scores, evidence, candidates)
    # Non-candidates sink below every candidate; a stable descending sort keeps prefix order among ties.
    ranked = scores.detach().to(torch.float64).masked_fill(~candidates, float("-inf"))
    order = ranked.sort(dim=1, descending=True, stable=True).indices
    evidence_in_order = evidence.bool().gather(1, order)
    has_evidence = evidence_in_order.any(1)
    best_rank = evidence_in_order.to(torch.long).argmax(1) + 1
    rr = 1.0 / best_rank.to(torch.float64)
    all_zero = (scores.detach().masked_fill(~candidates, 0) == 0).all(1)
    return rr.masked_fill(~has_evidence | all_zero, float("nan"))


def expected_random_reciprocal_rank(n_candidates: int, n_evidence: int) -> float:
    """Expected ``1 / rank`` of the best of ``n_evidence`` evidence tokens among ``n_candidates`` ranked at random."""
    n, k = int(n_candidates), int(n_evidence)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= n_evidence <= n_candidates; got n_evidence={k}, n_candidates={n}")
    total = comb(n, k)
    return sum(comb(n - r, k - 1) / r for r in range(1, n - k + 2)) / total


def random_reciprocal_rank(
    evidence: Bool[Tensor, "batch pos"], candidates: Bool[Tensor, "batch pos"] | None = None
) -> Float[Tensor, " batch"]:
    """Per-row random baseline of :func:`reciprocal_rank` (NaN for rows without evidence)."""
    scores = torch.ones(evidence.shape, dtype=torch.float64)
    candidates = _check_masks(scores, evidence, candidates)
    n = candidates.sum(1).tolist()
    k = evidence.bool().sum(1).tolist()
    return torch.tensor([expected_random_reciprocal_rank(ni, ki) if ki > 0 else float("nan")
                         for ni, ki in zip(n, k, strict=True)], dtype=torch.float64)


@dataclass
class MRRResult:
    """Mean reciprocal rank of a set of explanations and its random baseline on the same rows.

    ``n`` counts the rows that had a rank (evidence present, scores not all zero); ``n_skipped`` the others.
    ``random`` is averaged over the rows with evidence, as the paper's code does.
    """

    mrr: float
    random: float
    n: int
    n_skipped: int
    reciprocal_ranks: Float[Tensor, " batch"]


def mean_reciprocal_rank(
    scores: Float[Tensor, "batch pos"],
    evidence: Bool[Tensor, "batch pos"],
    candidates: Bool[Tensor, "batch pos"] | None = None,
) -> MRRResult:
    """MRR of a batch of explanations with its random baseline (see :func:`reciprocal_rank`)."""
    rr = reciprocal_rank(scores, evidence, candidates)
    rand = random_reciprocal_rank(evidence, candidates)
    valid = ~rr.isnan()
    if not valid.any():
        raise ValueError("no row has both an evidence token and a non-zero score; MRR is undefined")
    return MRRResult(mrr=float(rr[valid].mean()), random=float(rand[~rand.isnan()].mean()), n=int(valid.sum()),
                     n_skipped=int((~valid).sum()), reciprocal_ranks=rr)


def probability_gap(
    logits: Float[Tensor, "batch vocab"],
    target: Int[Tensor, " batch"],
    foil: Int[Tensor, " batch"],
) -> Float[Tensor, " batch"]:
    """``softmax(logits)[target] - softmax(logits)[foil]`` per row (next-token logits at one position)."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be next-token logits of shape (batch, vocab); got {tuple(logits.shape)} "
                         "(select the explained position first, e.g. logits[rows, position])")
    target, foil = torch.as_tensor(target), torch.as_tensor(foil)
    for name, ids in (("target", target), ("foil", foil)):
        if ids.shape != logits.shape[:1] or ids.is_floating_point():
            raise ValueError(f"{name} must be integer ids of shape ({logits.shape[0]},); got {tuple(ids.shape)}")
        if (ids < 0).any() or (ids >= logits.shape[1]).any():
            raise ValueError(f"{name} ids must lie in [0, {logits.shape[1]}); got {ids.tolist()}")
    probs = logits.detach().float().softmax(-1)
    rows = torch.arange(logits.shape[0], device=logits.device)
    return probs[rows, target.to(logits.device)] - probs[rows, foil.to(logits.device)]
