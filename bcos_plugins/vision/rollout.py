"""Attention rollout (Abnar & Zuidema, 2020) for mean-pooled ViTs, as a pixel map.

    R = prod over layers (bottom to top) of  0.5 * norm_rows(mean_heads(A_l)) + 0.5 * I
    token relevance_j = mean_i R[i, j]      (the classifier reads the mean over tokens, not a CLS token)

B-cos attention matrices with a multiplicative prior are not row-stochastic (Eq. 19): rows are
renormalised here, as the rollout recursion assumes. The token map is spread uniformly over each token's
``p x p`` patch. Rollout is class-agnostic and non-negative (paper §A.1: it cannot show negative evidence).
"""

from __future__ import annotations

import functools

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_float, require_int, require_tensor
from ..errors import BcosTypeError, argument_error
from ..nn.functional import at_least_float32

__all__ = ["attention_rollout"]


def attention_rollout(attentions: tuple[Tensor, ...] | list[Tensor], patch_size: int,
                      residual_weight: float = 0.5) -> Float[Tensor, "batch h w"]:
    """Pixel map ``(batch, grid * p, grid * p)`` from per-layer attention ``(batch, heads, N, N)``, in at least float32
    (float32 for float16 / bfloat16 attention, as :func:`~bcos_plugins.vision.explain_image`'s maps)."""
    if not isinstance(attentions, tuple | list):
        raise argument_error("attentions", f"must be the per-layer tuple of attention matrices, got "
                             f"{type(attentions).__name__}", "Pass model(..., output_attentions=True).attentions",
                             kind=BcosTypeError)
    if not attentions:
        raise argument_error("attentions", "attention_rollout needs the attention matrices of at least one layer",
                             "Call the model with output_attentions=True")
    patch_size = require_int("patch_size", patch_size, minimum=1)
    residual_weight = require_float("residual_weight", residual_weight, minimum=0.0, maximum=1.0)
    attentions = [require_tensor("attentions", a, ndim=4, kind="float", shape_hint="(batch, heads, N, N)")
                  for a in attentions]
    for i, a in enumerate(attentions):
        if 0 in a.shape:
            raise argument_error("attentions", f"layer {i} is empty (shape {tuple(a.shape)})",
                                 "Pass the attention matrices of at least one image, head and token")
        if a.shape != attentions[0].shape or a.shape[-1] != a.shape[-2] or a.device != attentions[0].device:
            raise argument_error("attentions", f"layer {i} has shape {tuple(a.shape)} on {a.device}; every layer must "
                                 f"be (batch, heads, N, N) like layer 0 {tuple(attentions[0].shape)} on "
                                 f"{attentions[0].device}", "Pass model(..., output_attentions=True).attentions")
        # a negative weight is no attention: its rows summed to <= 0 and were left as they were, and the map came out
        # as zeros or signs without meaning, silently
        if (a < 0).any():
            raise argument_error("attentions", f"layer {i} holds negative values; attention matrices are non-negative",
                                 "Pass softmax attention weights (model(..., output_attentions=True).attentions), "
                                 "not scores or differences")
    # computed in at least float32 (and in the widest dtype given): the product of the layers' mixing matrices in
    # bfloat16 was 0.3 % off the same attention values' rollout after six layers and tied tokens it told apart, and
    # layers of two dtypes failed inside the matrix product
    dtype = at_least_float32(functools.reduce(torch.promote_types, (a.dtype for a in attentions)))
    attentions = [a.to(dtype) for a in attentions]
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
