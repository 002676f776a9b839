"""Bias-free, detachable normalisation layers.

``BcosLayerNorm``:  ``y = (x - mean(x)) * rsqrt(var(x) + eps) * gamma``. The centring is linear and stays
differentiable; ``rsqrt(var + eps)`` is the dynamic weight (a constant in explanation mode). No bias.

``DetachableRMSNorm``: ``y = x * rsqrt(mean(x^2) + eps) * gamma``; the rsqrt factor is the dynamic weight.

Both compute the same arithmetic in and out of explanation mode, so forward values are bit-identical, and
both normalise half-precision inputs in float32 and cast back: in float16 the variance overflows once values
pass about 256, and BERT's ``eps = 1e-12`` rounds to 0 (a constant row, e.g. padding, then gives NaN).

``BcosLayerNorm``'s fused path (default) is torch's ``F.layer_norm`` without bias (one kernel, which
accumulates half-precision inputs in float32 itself) in both modes; explanation mode differentiates it through
:class:`_ConstantScaleLayerNorm`, whose backward holds ``rsqrt(var + eps)`` constant:
``grad_x = h - mean(h)`` with ``h = grad * gamma * rsqrt(var + eps)`` (the centring's transpose). The
reference path (:func:`~bcos_plugins.nn.functional.reference_path`) is the step-by-step form above.
``DetachableRMSNorm`` has one path: it is the arithmetic of Llama's own RMSNorm (the conventional model's).
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..errors import BcosTypeError, BcosValueError, argument_error
from .dynamic import DynamicWeightModule, parameter_gradients_unused
from .functional import HALF_DTYPES, functorch_transforms_active, using_reference_path

__all__ = ["BcosLayerNorm", "DetachableRMSNorm"]


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0.0 < float(eps) < float("inf"):
        raise argument_error("eps", f"must be a finite number > 0, got {eps!r}",
                             "keep the model's layer_norm_eps (e.g. 1e-5 or 1e-12)", kind=BcosValueError)
    return float(eps)


class _ConstantScaleLayerNorm(torch.autograd.Function):
    """``F.layer_norm(x, shape, gamma, None, eps)`` whose backward holds ``rsqrt(var + eps)`` constant.

    The forward runs ``torch.native_layer_norm`` (the kernel ``F.layer_norm`` calls, so the values are the
    same), which also returns ``rsqrt(var + eps)``: the backward uses it instead of recomputing the variance.
    Half-precision inputs recompute it in float32 from ``x`` (the kernel returns it rounded to ``x``'s dtype).
    ``x`` is saved only where ``gamma`` needs a gradient. The backward is differentiable again
    (``create_graph=True``) with ``rsqrt(var + eps)`` a constant, as in the reference path. Written as ``forward(ctx, ...)`` without
    ``setup_context``: with one, torch's ``Function.apply`` binds the arguments through ``inspect.signature`` on
    every call, which costs more than the kernels at a layer norm's sizes (docs/benchmarks.md).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, normalized_shape: tuple[int, ...], eps: float) -> Tensor:
        out, _, inv_std = torch.native_layer_norm(x, normalized_shape, weight, None, eps)
        recompute = x.dtype in HALF_DTYPES  # the kernel's inv_std is rounded to x's dtype
        weight_grad = weight is not None and ctx.needs_input_grad[1]
        # explaining as explain runs (float32/64 input, no gain gradient, one normalised dim): the backward is
        # _input_gradient alone, with no decision left for it (docs/benchmarks.md, 2026-11-28 00:43 UTC: 0.99 of
        # explain's time before)
        ctx.input_gradient_only = not (recompute or weight_grad) and len(normalized_shape) == 1
        if ctx.input_gradient_only:
            ctx.save_for_backward(weight, inv_std)
            return out
        ctx.dims = tuple(range(-len(normalized_shape), 0))
        ctx.eps = eps
        ctx.save_for_backward(x if recompute or weight_grad else None, weight, None if recompute else inv_std)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        if ctx.input_gradient_only:
            weight, inv_std = ctx.saved_tensors
            return _input_gradient(grad_out, weight, inv_std, -1), None, None, None
        x, weight, inv_std = ctx.saved_tensors
        dims = ctx.dims
        compute = torch.float32 if grad_out.dtype in HALF_DTYPES else grad_out.dtype
        if inv_std is None:  # recomputed in float32, and a constant like the forward's (also for create_graph=True)
            with torch.no_grad():
                inv_std = torch.rsqrt(torch.var(x.to(compute), dim=dims, correction=0, keepdim=True) + ctx.eps)
        grad = grad_out.to(compute)
        grad_weight = None
        if weight is not None and ctx.needs_input_grad[1]:
            xc = x.to(compute)
            normalised = (xc - xc.mean(dim=dims, keepdim=True)) * inv_std
            batch_dims = tuple(range(grad.ndim - len(dims)))
            per_row = grad * normalised
            # (an unbatched input has no batch dim, and sum(dim=()) sums every dim: a 0-d gradient torch refused)
            grad_weight = (per_row.sum(dim=batch_dims) if batch_dims else per_row).to(weight.dtype)
        grad_x = _input_gradient(grad, weight.to(compute) if weight is not None else None, inv_std, dims) \
            if ctx.needs_input_grad[0] else None
        return (grad_x.to(grad_out.dtype) if grad_x is not None else None), grad_weight, None, None


def _input_gradient(grad: Tensor, weight: Tensor | None, inv_std: Tensor, dims: int | tuple[int, ...]) -> Tensor:
    """The constant-scale layer norm's input gradient: ``h - mean(h)`` over ``dims``, ``h = grad * gamma *
    rsqrt(var + eps)`` (the centring's transpose); plain tensor code, so differentiable again."""
    h = (grad * weight if weight is not None else grad) * inv_std
    return h - h.mean(dim=dims, keepdim=True)


class BcosLayerNorm(DynamicWeightModule):
    """LayerNorm over the last ``normalized_shape`` dims without bias; ``1/std`` is the dynamic weight."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5,
                 elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        # any integer, as torch's LayerNorm takes it (numbers.Integral, e.g. NumPy's: a size read from an array was
        # "'numpy.int64' object is not iterable" or refused as no int, while BcosLinear took it)
        given = normalized_shape
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        dims = tuple(normalized_shape) if isinstance(normalized_shape, tuple | list | torch.Size) else None
        if not dims or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1 for d in dims):
            raise argument_error("normalized_shape", f"must be a positive int or a tuple of them, got "
                                 f"{given!r}", "pass the size of the normalised last dimension(s)",
                                 kind=BcosTypeError)
        self.normalized_shape = tuple(int(d) for d in dims)
        self.eps = _check_eps(eps)
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    @classmethod
    def from_layer_norm(cls, ln: nn.LayerNorm, *, hold: bool = False) -> BcosLayerNorm:
        """Copy ``gamma`` from a stock ``nn.LayerNorm``; its bias (if any) is dropped. ``hold=True``: the norm holds
        ``ln.weight`` itself, the very parameter (as :func:`~bcos_plugins.bcosify` converts), built without one."""
        affine = ln.weight is not None
        if hold and affine:
            _require_a_parameter_to_hold(ln.weight)
        hold = hold and affine  # a norm without a weight holds nothing and copies nothing
        new = cls(ln.normalized_shape, eps=ln.eps, elementwise_affine=affine,
                  device=("meta" if hold else ln.weight.device) if affine else None,
                  dtype=ln.weight.dtype if affine else None)
        if hold:
            new.weight = ln.weight
        elif affine:
            with torch.no_grad():
                new.weight.copy_(ln.weight)
        return new

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        # explaining under a torch.func transform (jacrev, vmap(grad)): the step-by-step form below, as torch.func
        # takes no autograd.Function without setup_context (_ConstantScaleLayerNorm's; torch's error before)
        if not using_reference_path() and not (functorch_transforms_active() and self.explaining):
            if x.dtype == torch.float16:
                # torch's float16 kernel keeps rsqrt(var + eps) in float16 for the backward pass, where BERT's
                # eps = 1e-12 makes it 1e6 on a constant row (padding): infinite, then NaN gradients
                y = self._fused(x.float(), None).to(x.dtype)
                return y * self.weight if self.weight is not None else y
            return self._fused(x, self.weight)
        dims = tuple(range(-len(self.normalized_shape), 0))
        half = x.dtype in HALF_DTYPES
        xc = x.float() if half else x
        var, mean = torch.var_mean(xc, dim=dims, correction=0, keepdim=True)
        y = (xc - mean) * self.dynamic_weight(torch.rsqrt(var + self.eps))
        if half:
            y = y.to(x.dtype)
        return y * self.weight if self.weight is not None else y

    def _fused(self, x: Tensor, weight: Tensor | None) -> Tensor:
        if self.holds_constant():
            if weight is not None and parameter_gradients_unused():
                weight = weight.detach()  # explanations take no parameter gradient: none is computed
            # float(): under torch.compile(dynamic=True) this reads eps (a graph input there) here, outside the
            # Function; first read inside it, a layer norm called twice failed (see functional._norm_eps)
            return _ConstantScaleLayerNorm.apply(x, weight, self.normalized_shape, float(self.eps))
        return F.layer_norm(x, self.normalized_shape, weight, None, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, bias=False"


def _require_a_parameter_to_hold(weight: Tensor) -> None:
    """``hold=True`` with a weight that is a plain tensor, not a parameter: refused, as ``BcosLinear.from_linear``
    refuses it (one rule for every ``from_*(..., hold=True)``); the norms fell back to a copy, silently, so the built
    norm's weight was not the tensor the caller asked it to hold."""
    if not isinstance(weight, nn.Parameter):
        raise argument_error("hold", f"needs a weight parameter to hold, got a {type(weight).__name__} of shape "
                             f"{tuple(weight.shape)}", "Pass hold=False to build the norm from a copy",
                             kind=BcosValueError)


class DetachableRMSNorm(DynamicWeightModule):
    """RMSNorm ``x * rsqrt(mean(x^2) + eps) * gamma`` whose rsqrt factor is the dynamic weight.

    Half-precision inputs are normalised in float32 (as Llama's own RMSNorm does) and cast back.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, numbers.Integral) or hidden_size < 1:
            raise argument_error("hidden_size", f"must be a positive int, got {hidden_size!r}",
                                 "pass the size of the normalised last dimension", kind=BcosTypeError)
        hidden_size = int(hidden_size)  # (a NumPy integer too, as BcosLinear's sizes)
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = _check_eps(eps)

    @classmethod
    def from_rms_norm(cls, norm: nn.Module, *, hold: bool = False) -> DetachableRMSNorm:
        """Copy the gain of a stock RMS norm; ``hold=True``: hold ``norm.weight`` itself, the very parameter (as
        :func:`~bcos_plugins.bcosify` converts), built without a copy."""
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        if eps is None:
            # torch.nn.RMSNorm(eps=None) adds the machine epsilon of its input's dtype (the model's, its weight's):
            # refused as "eps: must be a finite number > 0, got None", naming no argument the caller passed
            eps = torch.finfo(norm.weight.dtype).eps
        if norm.weight.ndim != 1:
            # torch.nn.RMSNorm((4, 5)) normalises over its last two dims, this norm over the last one: held, the
            # (4, 5) gain broadcast and the norm computed another function (0.61 off), silently; copied, torch's
            # "size of tensor a (4) must match ..."
            raise argument_error("norm", f"normalises over the last {norm.weight.ndim} dims (a gain of shape "
                                 f"{tuple(norm.weight.shape)}); DetachableRMSNorm normalises over the last one only",
                                 "Use an RMS norm over one dimension (normalized_shape an int), or reshape so the "
                                 "normalised dims are one", kind=BcosValueError)
        if hold:
            _require_a_parameter_to_hold(norm.weight)
        new = cls(norm.weight.shape[0], eps=eps, device="meta" if hold else norm.weight.device,
                  dtype=norm.weight.dtype)
        if hold:
            new.weight = norm.weight
            return new
        with torch.no_grad():
            new.weight.copy_(norm.weight)
        return new

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        weight = self.weight
        if x.shape[-1:] != weight.shape:
            # the gain broadcast against the input: a last dim of 1 (or a 0-d input) came back with the gain's
            # shape, each value sign(x) * gain, silently (torch.nn.RMSNorm refuses it)
            raise argument_error("x", f"DetachableRMSNorm({weight.shape[0]}) normalises a last dimension of size "
                                 f"{weight.shape[0]}, got an input of shape {tuple(x.shape)}",
                                 "Pass an input whose last dimension is the norm's hidden_size", kind=BcosValueError)
        dtype = x.dtype
        x32 = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
        # not explaining: the same steps without the scope and detach calls (docs/benchmarks.md, 2026-11-28 16:16
        # UTC: a small model's forward pays their Python per module and call)
        if not self.explaining:
            inv_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return weight * (x32 * inv_rms).to(dtype)
        with self.dynamic_scope():
            inv_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return weight * (x32 * self.dynamic_weight(inv_rms)).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}"
