"""B-cos maths as functions of tensors, for layers that keep their weights in another layout.

:class:`~bcos_plugins.nn.BcosLinear` and the TransformerLens components of the adapter (whose weights
have TransformerLens' shapes, e.g. ``W_Q: (head, d_model, d_head)``) share these, so the arithmetic is
defined once::

    ŵ   = w / ||w||              over the axes that make up one unit's input weights
    lin = x @ ŵ                  (then max over groups of M units for MaxOut)
    dyn = |lin / ||x|| | ** (B - 1)
    out = dyn * lin
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["NORM_EPS", "COS_FLOOR", "unit_norm", "input_norm", "bcos_scale", "max_out"]

NORM_EPS = 1e-6
COS_FLOOR = 1e-12


def unit_norm(weight: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """``weight`` scaled so that each unit's input weights (the axes ``dim``) have norm 1."""
    return weight / torch.linalg.vector_norm(weight, dim=dim, keepdim=True).clamp_min(NORM_EPS)


def input_norm(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """``||x||`` over ``dim`` (kept), with an epsilon so that a zero input gives a zero output, not NaN."""
    return (x.pow(2).sum(dim=dim, keepdim=True) + NORM_EPS).sqrt()


def bcos_scale(lin: Tensor, x_norm: Tensor, b: float) -> Tensor:
    """The dynamic weight ``|lin / ||x|| | ** (B - 1)`` (``|cos|`` clamped below, see ``BcosLinear``)."""
    abs_cos = (lin.abs() / x_norm).clamp_min(COS_FLOOR)
    if b == 2.0:
        return abs_cos
    # sqrt is several times faster than pow(0.5) on CPU, and B = 1.5 is the common choice
    return abs_cos.sqrt() if b == 1.5 else abs_cos.pow(b - 1.0)


def max_out(lin: Tensor, m: int) -> Tensor:
    """Maximum over groups of ``m`` consecutive units of the last axis (identity for ``m == 1``)."""
    return lin if m == 1 else lin.unflatten(-1, (-1, m)).amax(dim=-1)
