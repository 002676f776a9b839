"""Attention rollout (Abnar & Zuidema, 2020) for mean-pooled ViTs, as a pixel map.

    R = prod over layers (bottom to top) of  0.5 * norm_rows(mean_heads(A_l)) + 0.5 * I
    token relevance_j = mean_i R[i, j]      (the classifier reads the mean over tokens, not a CLS token)

B-cos attention matrices with a multiplicative prior are not row-stochastic (Eq. 19): rows are
renormalised here, as the rollout recursion assumes. The token map is spread uniformly over each token's
``p x p`` patch. Rollout is class-agnostic and non-negative (paper §A.1: it cannot show negative evidence).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_float, require_int, require_tensor
from ..errors import BcosTypeError, argument_error

__all__ = ["attention_rollout"]


def attention_rollout(attentions: tuple[Tensor, ...] | list[Tensor], patch_size: int,
                      residual_weight: float = 0.5) -> Float[Tensor, "batch h w"]:
    """Pixel map ``(batch, grid * p, grid * p)`` from per-layer attention ``(batch, heads, N, N)``."""
    if not isinstance(attentions, tuple | list):
        raise argument_error("attentions", f"must be the per-layer tuple of attention matrices, got "
                             f"{type(attentions).__name__}", "Pass model(..., output_attentions=True).attentions",
                             kind=BcosTypeError)
    if not attentions:
        raise argument_error("attentions", "attention_rollout needs the attention matrices of at least one layer",
                             "Call the model with output_attentions=True")
    patch_size = require_int("patch_size", patch_size, minimum=1)
    residual_weight = require_float("residual_weight", residual_weight, minimum=0.0, maximum=1.0)
    for i, a in enumerate(attentions):
        a = require_tensor("attentions", a, ndim=4, kind="float", shape_hint="(batch, heads, N, N)")
        if a.shape != attentions[0].shape or a.shape[-1] != a.shape[-2] or 0 in a.shape:
            raise argument_error("attentions", f"layer {i} has shape {tuple(a.shape)}; every layer must be "
                                 f"(batch, heads, N, N) like layer 0 {tuple(attentions[0].shape)}",
                                 "Pass model(..., output_attentions=True).attentions")
    batch, _, n, _ = attentions[0].shape
    grid = int(round(n**0.5))
    if grid * grid != n:
        raise argument_error("attentions", f"{n} tokens do not form a square grid",
                             "Pass the attention over patch tokens only (attention_rollout reads a mean-pooled ViT)")
    eye = torch.eye(n, dtype=attentions[0].dtype, device=attentions[0].device)
    rollout = eye.expand(batch, n, n)
    for pattern in attentions:
        averaged = pattern.mean(dim=1)
        # divided by the row sum whatever its size (a row of zeros stays zero): floored at the smallest normal number,
        # rows summing below it (float32 rows of 1e-40) were not renormalised and the identity took over the map
        row_sum = averaged.sum(dim=-1, keepdim=True)
        averaged = averaged / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
        mixed = (1 - residual_weight) * averaged + residual_weight * eye
        rollout = mixed @ rollout
    return spread_over_patches(rollout.mean(dim=1), patch_size)


def spread_over_patches(token_scores: Float[Tensor, "batch N"], patch_size: int) -> Float[Tensor, "batch h w"]:
    """Pixel map ``(batch, grid * p, grid * p)``: each of the ``N = grid^2`` patch tokens' score copied over its
    ``p x p`` patch (row-major token order, as the ViT's tokeniser lays them out)."""
    grid = int(round(token_scores.shape[-1] ** 0.5))
    return (token_scores.reshape(-1, grid, grid)
            .repeat_interleave(patch_size, dim=1).repeat_interleave(patch_size, dim=2))
