"""Rationale guidance of attention logits: the paper's Eq. 3, 4, 5 and the renormalised product.

One pure function, :func:`guide_scores`, used by both the transformers path (``attention.py``) and the
TransformerLens hook (``hooks.py``), so that the two cannot drift apart.

With attention scores ``S = Q K^T / sqrt(d_head)`` (batch, head, query, key), a gold mask ``M`` (batch, key)
in [0, 1] and a strength ``lam >= 0`` (Gu, "Self-Guided Attention for Explainable NLI", §3.1):

- ``"multiply"`` (Eq. 3): ``softmax(S * (1 + lam M))``. The paper's chosen form. It scales scores, so it
  sharpens positive scores on rationale keys and makes *negative* ones more negative: a rationale key
  the model scores below zero gets less attention, not more. Kept as written; see ``"log1p"``.
- ``"add"`` (Eq. 4): ``softmax(S + lam M)``: every rationale key's weight grows by the factor ``e^lam``.
- ``"replace"`` (Eq. 5): attention = ``M / sum_k M_k`` over the keys a query may attend to; ``lam`` is
  not used. Query rows whose allowed keys hold no rationale token keep their normal attention (the
  formula is undefined there: 0/0).
- ``"log1p"``: ``softmax(S + log(1 + lam M))`` = ``softmax(S) * (1 + lam M)`` renormalised, which is
  what the reference code computes after the softmax ("renormalised product"); written on the logits it
  costs nothing extra and works inside any attention kernel that takes an additive bias.

``lam = 0`` leaves the scores bit-identical for ``multiply``, ``add`` and ``log1p`` (multiplying by 1.0 or
adding 0.0 is exact in IEEE arithmetic).
"""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import bad_rows, require_float
from ..errors import BcosTypeError, argument_error

__all__ = ["GuidanceMode", "GUIDANCE_MODES", "check_guidance", "check_rationale_mask", "guide_scores"]

GuidanceMode = Literal["multiply", "add", "replace", "log1p"]
GUIDANCE_MODES: tuple[str, ...] = ("multiply", "add", "replace", "log1p")


def check_guidance(mode: str, strength: float) -> tuple[str, float]:
    """The checked guidance ``(mode, strength)``: ``mode`` one of :data:`GUIDANCE_MODES` and ``strength`` (the paper's
    lambda) a finite float >= 0; anything else is refused naming the argument."""
    if mode not in GUIDANCE_MODES:
        raise argument_error("mode", f"guidance mode must be one of {GUIDANCE_MODES} (paper Eq. 3, Eq. 4, Eq. 5, "
                             f"renormalised product), got {mode!r}", "Pick one of those")
    # lambda is a weight on the gold mask: NaN or inf would turn every guided score into NaN.
    strength = require_float("strength", strength)
    if strength < 0:
        raise argument_error("strength", f"guidance strength lambda must be >= 0, got {strength}",
                             "Pass a finite lambda >= 0")
    return mode, strength


def check_rationale_mask(rationale_mask, batch: int | None = None, n_keys: int | None = None,
                         name: str = "rationale_mask") -> Tensor:
    """A gold mask ``(batch, key_pos)`` with values in [0, 1]; NaN, negative or > 1 values are refused
    (they turn the guided scores into NaN, or reverse the guidance), naming the rows."""
    if not isinstance(rationale_mask, Tensor):
        raise argument_error(name, f"must be a tensor of shape (batch, key_pos), got "
                             f"{type(rationale_mask).__name__}", "Pass a float or bool tensor like input_ids",
                             kind=BcosTypeError)
    if rationale_mask.is_complex():
        raise argument_error(name, f"must be real, got dtype {rationale_mask.dtype}",
                             "Pass a float or bool tensor", kind=BcosTypeError)
    expected = f"({'batch' if batch is None else batch}, {'key_pos' if n_keys is None else n_keys})"
    if rationale_mask.ndim != 2 or (batch is not None and rationale_mask.shape[0] != batch) \
            or (n_keys is not None and rationale_mask.shape[1] != n_keys):
        raise argument_error(name, f"must have shape (batch, key_pos) = {expected} like input_ids, got "
                             f"{tuple(rationale_mask.shape)}", "Build it from the same padded batch")
    if rationale_mask.dtype != torch.bool and rationale_mask.numel():
        values = rationale_mask.detach()
        bad = ~((values >= 0) & (values <= 1))  # NaN fails both comparisons
        if bad.any():
            raise argument_error(name, f"must hold values in [0, 1] (1 = rationale token), got "
                                 f"{values[bad].flatten()[:6].tolist()} in {bad_rows(bad)}",
                                 "Fix those rows (NaN or negative values give NaN or reversed guidance)")
    return rationale_mask


def unmasked(scores: Tensor) -> Tensor:
    """Where ``scores`` (or an additive mask) leave a key open: above half the dtype's lowest value. A masked key is
    ``-inf`` (TransformerLens' ``HookedTransformer``) or the dtype's lowest finite value (transformers' additive masks,
    which a ``TransformerBridge``'s ``hook_attn_scores`` carries): ``isfinite`` read the second as open, and
    ``"replace"`` sent a query's attention to a future or padding key on the rationale."""
    return scores > torch.finfo(scores.dtype).min / 2


def _as_key_mask(rationale_mask: Tensor, scores: Tensor) -> Float[Tensor, "batch 1 1 key"]:
    batch, _, _, n_keys = scores.shape
    rationale_mask = check_rationale_mask(rationale_mask, batch, n_keys)
    return rationale_mask.to(device=scores.device, dtype=scores.dtype)[:, None, None, :]


def guide_scores(
    scores: Float[Tensor, "batch head query key"],
    rationale_mask: Float[Tensor, "batch key"],
    mode: GuidanceMode,
    strength: float,
    allowed: torch.Tensor | None = None,
) -> Float[Tensor, "batch head query key"]:
    """Return guided attention logits (before any padding/causal mask is added).

    Args:
        scores: scaled attention scores ``Q K^T / sqrt(d_head)``.
        rationale_mask: gold mask per key position (1 = rationale token; padding and special tokens 0).
        mode, strength: see the module docstring.
        allowed: boolean, broadcastable to ``scores``: keys each query may attend to (padding/causal mask).
            Only ``"replace"`` needs it, to renormalise ``M`` over allowed keys. ``None``: all keys.

    For ``"replace"`` the result is ``log M`` on allowed rationale keys and ``-inf`` elsewhere, so that the
    softmax gives ``M / sum M``; rows without an allowed rationale key are returned unchanged.
    """
    mode, strength = check_guidance(mode, strength)
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.ndim != 4:
        raise argument_error("scores", f"must be float attention scores (batch, head, query, key), got "
                             f"{getattr(scores, 'dtype', type(scores).__name__)} {tuple(getattr(scores, 'shape', ()))}",
                             "Pass Q K^T / sqrt(d_head)", kind=BcosTypeError)
    m = _as_key_mask(rationale_mask, scores)
    if mode == "multiply":
        return scores * (1.0 + strength * m)
    if mode == "add":
        return scores + strength * m
    if mode == "log1p":
        return scores + torch.log1p(strength * m)
    on_rationale = m > 0
    if allowed is not None:
        on_rationale = on_rationale & allowed
    replaced = torch.where(on_rationale, torch.log(m.clamp_min(torch.finfo(scores.dtype).tiny)),
                           torch.full_like(scores, float("-inf")))
    has_rationale = on_rationale.any(dim=-1, keepdim=True)
    return torch.where(has_rationale, replaced, scores)
