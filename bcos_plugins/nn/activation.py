"""Detachable activations: ``act(x) = x * gate(x)`` with ``gate`` the dynamic weight.

- GELU, erf form (BERT family):   ``gate = Phi(x) = 0.5 * (1 + erf(x / sqrt 2))``
- GELU, tanh form (GPT-2 "gelu_new"): ``gate = 0.5 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
- SiLU / swish:                   ``gate = sigmoid(x)``
- quick GELU (CLIP "quick_gelu"): ``gate = sigmoid(1.702 x)``
- clipped GELU ("gelu_10"):        ``gate = min(Phi(x), 10 / x)`` (``clip(gelu(x), -10, 10) = x * gate``)
- ReLU:                           ``gate = 1[x > 0]``
- identity ("linear"):            ``gate = 1`` (bilinear MLPs)
- tanh (:func:`tanh_ratio`):      ``gate = tanh(x) / x`` (a pooler's tanh, Gemma 2's logit soft-cap)

In explanation mode ``gate`` is a constant, so ``x · d act / dx = act(x)``.

Fused path (default): the forward value is torch's own activation (``F.gelu``, ``F.gelu(approximate="tanh")``,
``F.silu``, ``F.relu``: one kernel) in both modes, so forward values are identical in and out of explanation
mode and equal the conventional model's. Training differentiates it as torch does; explanation mode goes
through :class:`_ConstantGate`, whose backward is ``grad * gate(x)`` (the gate recomputed from the saved
input, nothing else kept). Reference path (:func:`~bcos_plugins.nn.functional.reference_path`): the product
``x * gate(x)`` with the gate detached in explanation mode, in both modes. Half-precision inputs get their gate
computed in float32 (the tanh form's ``x^3`` and its derivative overflow float16 for ``|x| > 40`` and
``|x| > 148``, which gave NaN gradients) and cast back; the gate lies in [0, 1]. torch's kernels compute half
inputs in float32 internally.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from ..errors import BcosValueError, argument_error
from .dynamic import DynamicWeightModule
from .functional import HALF_DTYPES, functorch_transforms_active, using_reference_path

__all__ = ["ACTIVATIONS", "DetachableActivation", "GATES"]


# the constants are literals returned by functions, not module-level floats: see nn/functional.py's _norm_eps
def _sqrt_half() -> float:
    return math.sqrt(0.5)  # M_SQRT1_2, as torch.special.ndtr multiplies by it


def _sqrt_2_over_pi() -> float:
    return math.sqrt(2.0 / math.pi)


# The gates' steps write into their first fresh tensor where autograd does not record them (an explanation's
# backward pass, which multiplies the gradient by the gate, and every gate computed under no_grad): the same
# operations in the same order, so the same values, without a new tensor of the input's size per step (at
# MiniLM's MLP width, 16 x 64 x 1536, the product of the gradient and the erf gate took 6.5-7.2 ms with the steps out
# of place, 4.9-6.0 ms in place; torch's own gelu_backward 2.0-2.4 ms; docs/benchmarks.md, 2026-11-28 14:04 UTC).
def _recording(x: Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad


def _gelu_erf_gate(x: Tensor) -> Tensor:
    """``Phi(x) = 0.5 (1 + erf(x / sqrt 2))``, the steps of ``torch.special.ndtr``."""
    if _recording(x):
        return torch.special.ndtr(x)
    return torch.erf(x * _sqrt_half()).add_(1.0).mul_(0.5)


def _gelu_tanh_gate(x: Tensor) -> Tensor:
    if _recording(x):
        return 0.5 * (1.0 + torch.tanh(_sqrt_2_over_pi() * (x + 0.044715 * x.pow(3))))
    return x.pow(3).mul_(0.044715).add_(x).mul_(_sqrt_2_over_pi()).tanh_().add_(1.0).mul_(0.5)


# transformers' QuickGELUActivation: input * torch.sigmoid(1.702 * input), the same steps
def _quick_gelu_slope() -> float:
    return 1.702


def _quick_gelu_gate(x: Tensor) -> Tensor:
    if _recording(x):
        return torch.sigmoid(_quick_gelu_slope() * x)
    return torch.mul(x, _quick_gelu_slope()).sigmoid_()


def _quick_gelu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(_quick_gelu_slope() * x)


# transformers' ClippedGELUActivation(-10, 10) ("gelu_10"): clip(F.gelu(x), -10, 10). gelu(x) >= -0.17, so the lower
# clip never binds; the upper one binds exactly where x > 10, since there Phi(x) > 1 - 8e-24 rounds to 1 in every
# floating dtype (half inputs' gates are float32) and F.gelu(x) = x. The gate is
# Phi(x) up to 10 and 10 / max(x, 10) beyond, with no division by a small x (whose 10 / x would be inf and, through
# autograd, NaN). A `where`, not torch.minimum: at x = 10 both are 1, and minimum's gradient splits such a tie between
# its operands, so the reference path's training gradient there was 0.5 where torch.clip's (the stock model's) is 1
def _gelu_clip() -> float:
    return 10.0


def _gelu_10_gate(x: Tensor) -> Tensor:
    clip = _gelu_clip()
    return torch.where(x > clip, clip / x.clamp(min=clip), _gelu_erf_gate(x))


def _gelu_10(x: Tensor) -> Tensor:
    return torch.clip(F.gelu(x), -_gelu_clip(), _gelu_clip())


GATES = {
    "gelu": _gelu_erf_gate,
    "gelu_10": _gelu_10_gate,
    "gelu_tanh": _gelu_tanh_gate,
    "quick_gelu": _quick_gelu_gate,
    "silu": torch.sigmoid,
    "relu": lambda x: (x > 0).to(x.dtype),
}

# torch's one-kernel activation for each gate: ``x * GATES[kind](x)``
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_10": _gelu_10,  # transformers' own torch.clip(gelu(x), min, max), so the same values
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": _quick_gelu,  # no one-kernel form in torch: transformers' own two steps, so the same values
    "silu": F.silu,
    "relu": F.relu,
}


# below this |x| the ratio tanh(x) / x is evaluated as its Taylor series (error < x^4 / 7 < 2e-13): the
# division itself would be 0 / 0 at x = 0
def _tanh_series_below() -> float:
    return 1e-3


def tanh_ratio(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """``tanh(x) / x``, 1 at ``x = 0`` (its limit): the dynamic weight of ``tanh(x) = x * (tanh(x) / x)``.

    Recording autograd, the ratio is its Taylor series near 0, where the quotient's gradient would cancel to
    noise. Without autograd (the gate of an explanation, held constant and computed under ``no_grad``, and
    inference) it is the quotient itself in four passes instead of ten: as accurate as ``tanh`` (which returns
    tiny and subnormal ``x`` to the last bit, so the quotient is 1 there), with the limit 1 written where
    ``x = 0`` and NaN kept where ``x`` is NaN.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        small = x.abs() < _tanh_series_below()
        safe = torch.where(small, torch.ones_like(x), x)
        return torch.where(small, 1.0 - x * x / 3.0, torch.tanh(safe) / safe)
    # The quotient is NaN exactly where x = 0 (0 / 0: the limit 1 goes there) or x is NaN (stays NaN). nan_to_num_
    # writes 1 at both, and adding 0 * tanh(x) puts NaN back where x is NaN: tanh(x) is finite everywhere else
    # (+-1 at +-inf), so the sum changes no other bit (the quotient is never -0). Two float passes instead of the
    # bool mask x == 0 and masked_fill_, which cost 0.30 ms of a 0.83 ms ratio on Gemma 2's 4 x 32 x 1000 logits
    # (one thread; docs/benchmarks.md, 2026-11-28 10:25 UTC): the same bits, NaN included, in every floating dtype
    # (tested)
    return _unrecorded_tanh_ratio(x, overwrite=False)


def _unrecorded_tanh_ratio(x: Tensor, overwrite: bool) -> Tensor:
    """:func:`tanh_ratio` without autograd; ``overwrite``: the quotient is written into ``x`` (a fresh tensor of the
    caller's that nothing else reads: one allocation of its size fewer), the same bits."""
    tanh = torch.tanh(x)
    quotient = torch.div(tanh, x, out=x) if overwrite else torch.div(tanh, x)
    return quotient.nan_to_num_(nan=1.0).add_(tanh, alpha=0.0)


def soft_cap_scale(module: DynamicWeightModule, logits: Tensor, cap: float) -> Tensor:
    """The dynamic weight ``g = tanh(z / c) / (z / c)`` of the soft-cap ``c * tanh(z / c) = z * g``, computed in
    ``module``'s dynamic scope (no autograd graph while explaining). The one form of Gemma 2's final-logit soft-cap:
    the B-cos LM head (``convert.gemma``) and the B-cos TransformerLens unembedding multiply their logits by it,
    routed through their own dynamic weight. It lives here, not in ``convert.gemma``, because that module imports
    transformers helpers that the lowest supported transformers lacks, and the TransformerLens adapter must import
    on every supported version."""
    with module.dynamic_scope():
        scaled = logits / cap
        if torch.is_grad_enabled() and scaled.requires_grad:
            return tanh_ratio(scaled)
        # nothing recorded: the ratio written into the fresh quotient (at Gemma 2's 1000-token vocabulary an allocation
        # of the logits' size costs page faults on a CPU)
        return _unrecorded_tanh_ratio(scaled, overwrite=True)


def _gate(kind: str, x: Tensor) -> Tensor:
    if x.dtype in HALF_DTYPES:
        return GATES[kind](x.float()).to(x.dtype)
    return GATES[kind](x)


class _ConstantGate(torch.autograd.Function):
    """torch's activation ``x * gate(x)`` in the forward; ``grad * gate(x)`` in the backward (gate constant).

    Written as ``forward(ctx, ...)`` without ``setup_context``: with one, torch's ``Function.apply`` binds the
    arguments through ``inspect.signature`` on every call: 20-30 us (docs/benchmarks.md, 2026-11-28 14:04 UTC), over
    half of a 128 x 256 SiLU's 39 us (2026-11-27 22:20 UTC)."""

    @staticmethod
    def forward(ctx, x: Tensor, kind: str) -> Tensor:
        ctx.kind = kind
        ctx.save_for_backward(x)
        return ACTIVATIONS[kind](x)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (x,) = ctx.saved_tensors
        # out of place: under batched gradients (autograd.grad(..., is_grads_batched=True)) grad_out is vmapped
        return grad_out * _gate(ctx.kind, x), None


class DetachableActivation(DynamicWeightModule):
    """``x * gate(x)`` with the gate detached in explanation mode. ``kind`` is a key of :data:`GATES`."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        if not isinstance(kind, str) or kind not in GATES:
            raise argument_error("kind", f"unknown gate {kind!r}", f"use one of {sorted(GATES)}",
                                 kind=BcosValueError)
        self.kind = kind

    def forward(self, x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
        # (explaining under a torch.func transform too: it takes no autograd.Function without setup_context, which
        # _ConstantGate leaves out; torch's error before)
        if using_reference_path() or (functorch_transforms_active() and self.explaining):
            with self.dynamic_scope():
                gate = self.gate(x)
            return x * self.dynamic_weight(gate)
        # the gate held constant needs its own node only where autograd records (a gated MLP's gate branch is computed
        # under no_grad while explaining): without Function.apply a SiLU of a 128 x 256 input took 39 us a call
        # instead of 70 (docs/benchmarks.md, 2026-11-27 22:20 UTC)
        if self.holds_constant() and torch.is_grad_enabled():
            return _ConstantGate.apply(x, self.kind)
        return ACTIVATIONS[self.kind](x)

    def gate(self, x: Tensor) -> Tensor:
        """The dynamic weight ``gate(x)`` (float32 arithmetic for half-precision ``x``)."""
        return _gate(self.kind, x)

    def extra_repr(self) -> str:
        return self.kind
