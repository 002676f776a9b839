"""B-cos linear layers: ``BcosLinear`` (from ``nn.Linear``) and ``BcosConv1D`` (from GPT-2's ``Conv1D``).

Maths (unit-norm weight rows ``ŵ``, no bias, MaxOut over groups of ``M`` consecutive units, ``B >= 1``)::

    lin = x @ ŵ.T                       then max over each group of M units if M > 1
    dyn = |lin / ||x|| | ** (B - 1)      (= |cos(x, ŵ)| ** (B - 1))
    out = dyn * lin

``dyn`` is the dynamic weight: constant for autograd in explanation mode, so that ``x · d out / dx = out``.
``||x||`` carries a small epsilon (a zero input, e.g. padding, gives 0, never NaN), and ``|cos|`` is
clamped from below before the power so that the gradient of ``|cos| ** (B - 1)`` stays finite at 0 for
``1 < B < 2`` (the clamp changes outputs only where ``|lin| < 1e-12 ||x||``, i.e. by less than 1e-12 ||x||).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .dynamic import DynamicWeightModule
from .functional import COS_FLOOR, NORM_EPS, bcos_scale, input_norm, max_out, unit_norm

__all__ = ["BcosLinear", "BcosConv1D", "check_b"]

_NORM_EPS = NORM_EPS  # kept: other layers import these names
_COS_FLOOR = COS_FLOOR


def check_b(b: float) -> float:
    """Validate the alignment pressure B, with an error that says what to use instead."""
    b = float(b)
    if not b >= 1.0:  # also catches NaN
        raise ValueError(
            f"B-cos alignment pressure b={b} is invalid: b must be >= 1 (b=1 is a plain bias-free linear "
            "layer; the papers recommend 1.25-1.5 for classifiers and 1.1 for decoders)."
        )
    return b


class BcosLinear(DynamicWeightModule):
    """B-cos linear layer with weight of shape ``(out_features * max_out, in_features)``.

    Args:
        in_features, out_features: sizes as in ``nn.Linear``.
        b: alignment pressure, >= 1.
        max_out: number of units per output taken the maximum over (MaxOut); 1 disables it.
        constant_outputs: output features that only feed a dynamic weight elsewhere (the query and key of
            attention, which only shape the attention matrix): in explanation mode they are detached
            whole, which makes the attention matrix a constant. ``None`` (default) for none,
            ``slice(None)`` for all.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        b: float = 2.0,
        max_out: int = 1,
        constant_outputs: slice | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if max_out < 1:
            raise ValueError(f"max_out={max_out} must be >= 1 (1 disables MaxOut)")
        self.in_features = in_features
        self.out_features = out_features
        self.b = check_b(b)
        self.max_out = int(max_out)
        self.constant_outputs = constant_outputs
        self.weight = nn.Parameter(
            torch.empty(self._weight_shape(), device=device, dtype=dtype)
        )
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def _weight_shape(self) -> tuple[int, int]:
        return (self.out_features * self.max_out, self.in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, b: float, max_out: int = 1, **kwargs) -> BcosLinear:
        """Build from a pretrained ``nn.Linear``: weights copied (used row-normalised), bias dropped.

        With ``max_out > 1`` each output's M units start as copies of the pretrained row, so the layer
        starts from the pretrained B-cos output exactly.
        """
        layer = cls(linear.in_features, linear.out_features, b=b, max_out=max_out,
                    device=linear.weight.device, dtype=linear.weight.dtype, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(linear.weight.repeat_interleave(max_out, dim=0))
        return layer

    def unit_weight(self) -> Float[Tensor, "units d_in"]:
        """Weight rows scaled to unit norm, ``(out_features * max_out, in_features)``."""
        return unit_norm(self.weight, dim=1)

    def _linear(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... units"]:
        return torch.nn.functional.linear(x, self.unit_weight())

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        lin = max_out(self._linear(x), self.max_out)
        if self.b != 1.0:
            with self.dynamic_scope():
                dyn = bcos_scale(lin, input_norm(x), self.b)
            lin = self.dynamic_weight(dyn) * lin
        if self.explaining and self.constant_outputs is not None:
            lin = _detach_slice(lin, self.constant_outputs)
        return lin

    def extra_repr(self) -> str:
        extra = f", max_out={self.max_out}" if self.max_out > 1 else ""
        const = f", constant_outputs={self.constant_outputs}" if self.constant_outputs is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, b={self.b}{extra}{const}"


class BcosConv1D(BcosLinear):
    """B-cos version of transformers' GPT-2 ``Conv1D``, whose weight is stored ``(in, out)``.

    The storage layout is kept so that state dicts stay interchangeable with the stock model; units are
    normalised over the input axis (dim 0). MaxOut units are consecutive columns.
    """

    def _weight_shape(self) -> tuple[int, int]:
        return (self.in_features, self.out_features * self.max_out)

    @classmethod
    def from_conv1d(cls, conv, b: float, max_out: int = 1, **kwargs) -> BcosConv1D:
        in_features, out_features = conv.weight.shape
        layer = cls(in_features, out_features, b=b, max_out=max_out,
                    device=conv.weight.device, dtype=conv.weight.dtype, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(conv.weight.repeat_interleave(max_out, dim=1))
        return layer

    def unit_weight(self) -> Float[Tensor, "units d_in"]:
        return unit_norm(self.weight.T, dim=1)


def _detach_slice(t: Tensor, part: slice) -> Tensor:
    if part == slice(None):
        return t.detach()
    n = t.shape[-1]
    start, stop, _ = part.indices(n)
    return torch.cat([t[..., :start], t[..., start:stop].detach(), t[..., stop:]], dim=-1)
