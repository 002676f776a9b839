"""Detachable activations: ``act(x) = x * gate(x)`` with ``gate`` the dynamic weight.

- GELU, erf form (BERT family):   ``gate = Phi(x) = 0.5 * (1 + erf(x / sqrt 2))``
- GELU, tanh form (GPT-2 "gelu_new"): ``gate = 0.5 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
- SiLU / swish:                   ``gate = sigmoid(x)``
- ReLU:                           ``gate = 1[x > 0]``
- identity ("linear"):            ``gate = 1`` (bilinear MLPs)

In explanation mode ``gate`` is a constant, so ``x · d act / dx = act(x)``. The product form is used
in both modes so that forward values are identical in and out of explanation mode. Half-precision inputs
get their gate computed in float32 (the tanh form's ``x^3`` and its derivative overflow float16 for
``|x| > 40`` and ``|x| > 148``, which gave NaN gradients) and cast back; the gate lies in [0, 1].
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from ..errors import BcosValueError, argument_error
from .dynamic import DynamicWeightModule
from .functional import HALF_DTYPES

__all__ = ["DetachableActivation", "GATES"]


def _gelu_erf_gate(x: Tensor) -> Tensor:
    return torch.special.ndtr(x)  # Phi(x) = 0.5 (1 + erf(x / sqrt 2)) in one kernel


def _gelu_tanh_gate(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


GATES = {
    "gelu": _gelu_erf_gate,
    "gelu_tanh": _gelu_tanh_gate,
    "silu": torch.sigmoid,
    "relu": lambda x: (x > 0).to(x.dtype),
}


class DetachableActivation(DynamicWeightModule):
    """``x * gate(x)`` with the gate detached in explanation mode. ``kind`` is a key of :data:`GATES`."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        if not isinstance(kind, str) or kind not in GATES:
            raise argument_error("kind", f"unknown gate {kind!r}", f"use one of {sorted(GATES)}",
                                 kind=BcosValueError)
        self.kind = kind

    def forward(self, x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
        with self.dynamic_scope():
            gate = self.gate(x)
        return x * self.dynamic_weight(gate)

    def gate(self, x: Tensor) -> Tensor:
        if x.dtype in HALF_DTYPES:
            return GATES[self.kind](x.float()).to(x.dtype)
        return GATES[self.kind](x)

    def extra_repr(self) -> str:
        return self.kind
