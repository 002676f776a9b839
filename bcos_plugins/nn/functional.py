"""B-cos maths as functions of tensors, for layers that keep their weights in another layout.

:class:`~bcos_plugins.nn.BcosLinear` and the TransformerLens components of the adapter (whose weights
have TransformerLens' shapes, e.g. ``W_Q: (head, d_model, d_head)``) share these, so the arithmetic is
defined once::

    ŵ   = w / ||w||              over the axes that make up one unit's input weights
    lin = x @ ŵ                  (then max over groups of M units for MaxOut)
    dyn = |lin / ||x|| | ** (B - 1)
    out = dyn * lin

Half precision (float16 / bfloat16): ``||x||`` and the cosine are computed in float32 and the factor is cast
back. In float16 the squared norm overflows once ``||x||`` passes 256 (the largest float16 is 65504), which
made every B-cos layer output exactly 0, and the ``|cos|`` floor (1e-12) rounds to 0, which made the gradient
of ``|cos| ** (B - 1)`` infinite on zero inputs (padding). float32 inputs take the unchanged path.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["NORM_EPS", "COS_FLOOR", "HALF_DTYPES", "unit_norm", "input_norm", "bcos_scale", "max_out"]

NORM_EPS = 1e-6
COS_FLOOR = 1e-12
HALF_DTYPES = (torch.float16, torch.bfloat16)


def unit_norm(weight: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """``weight`` scaled so that each unit's input weights (the axes ``dim``) have norm 1."""
    if weight.dtype in HALF_DTYPES:
        norm = torch.linalg.vector_norm(weight, dim=dim, keepdim=True, dtype=torch.float32)
        return (weight.float() / norm.clamp_min(NORM_EPS)).to(weight.dtype)
    return weight / torch.linalg.vector_norm(weight, dim=dim, keepdim=True).clamp_min(NORM_EPS)


def input_norm(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """``||x||`` over ``dim`` (kept), with an epsilon so that a zero input gives a zero output, not NaN.

    ``sqrt(||x||^2 + eps)`` with the norm from one fused reduction: squaring ``x`` first would allocate and
    fill a tensor of its full size on every call. Half-precision ``x`` gives a float32 norm (see the module
    docstring), whose square cannot overflow.
    """
    if x.dtype in HALF_DTYPES:
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=torch.float32)
    else:
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
    return (norm * norm + NORM_EPS).sqrt()


def bcos_scale(lin: Tensor, x_norm: Tensor, b: float) -> Tensor:
    """The dynamic weight ``|lin / ||x|| | ** (B - 1)`` (``|cos|`` clamped below, see ``BcosLinear``).

    When no gradient is recorded (explanation mode computes the factor under ``no_grad``, and so does
    inference) the element-wise steps run in place on the one fresh tensor; with autograd recording they
    run out of place. Both run the same operations in the same order, so the values are bit-identical.
    The common exponents use square roots (several times faster than ``pow`` on CPU). With a float32
    ``x_norm`` (half-precision inputs) the cosine and the factor are float32, and the factor is returned in
    ``lin``'s dtype (it lies in [0, 1], so the cast cannot overflow).
    """
    cos = lin / x_norm
    in_place = not (torch.is_grad_enabled() and cos.requires_grad)
    abs_cos = cos.abs_().clamp_min_(COS_FLOOR) if in_place else cos.abs().clamp_min(COS_FLOOR)
    if b == 2.0:
        dyn = abs_cos
    elif b == 1.5:
        dyn = abs_cos.sqrt_() if in_place else abs_cos.sqrt()
    elif b == 1.25:
        dyn = abs_cos.sqrt_().sqrt_() if in_place else abs_cos.sqrt().sqrt()
    else:
        dyn = abs_cos.pow_(b - 1.0) if in_place else abs_cos.pow(b - 1.0)
    return dyn if dyn.dtype == lin.dtype else dyn.to(lin.dtype)


def max_out(lin: Tensor, m: int) -> Tensor:
    """Maximum over groups of ``m`` consecutive units of the last axis (identity for ``m == 1``)."""
    return lin if m == 1 else lin.unflatten(-1, (-1, m)).amax(dim=-1)
