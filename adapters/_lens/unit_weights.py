"""Unit-norm weights of B-cos projections, cached while gradients are off.

B-cos layers keep raw weights and use ``ŵ = w / ||w||`` (per unit, over its inputs) on every forward.
Analysis workloads (caching, patching sweeps, SAE runs) call the same model many times without gradients;
there ``ŵ`` is reused until the parameter changes (an in-place update bumps its version counter, a new
tensor has a new storage). With gradients on (training, explanation mode) it is always recomputed, so
autograd sees the normalisation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bcos_plugins.nn.functional import unit_norm

__all__ = ["unit_weight"]


def unit_weight(module: nn.Module, name: str, dim: int | tuple[int, ...]) -> Tensor:
    """``unit_norm(getattr(module, name), dim)``, cached per module while ``torch.is_grad_enabled()`` is off."""
    weight = getattr(module, name)
    if torch.is_grad_enabled():
        return unit_norm(weight, dim)
    key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, torch.is_inference_mode_enabled())
    cache = module.__dict__.setdefault("_bcos_unit_weights", {})
    hit = cache.get(name)
    if hit is None or hit[0] != key:
        hit = (key, unit_norm(weight, dim))
        cache[name] = hit
    return hit[1]
