"""One Triton kernel per B-cos linear layer (no MaxOut), opt-in through :func:`triton_kernels`.

The eager forward of a B-cos model on a GPU is bound by kernel launches (docs/benchmarks.md#gpu): per layer the
PyTorch path launches the weight's norm, its division, the matrix product, ``||x||`` and the element-wise chain of
``dyn * lin``. The kernel here computes the layer in one launch::

    acc    = x @ w.T                 tiled; in the same K loop the sums of squares of the x tiles (per row) and of
                                     the w tiles (per unit), accumulated in float32 from the unrounded values
    lin    = acc / max(||w||, NORM_EPS)  an overflowed ||w|| (inf) made NaN, as the PyTorch path's overflowed_norm_as_nan
    x_norm = hypot(||x||, sqrt(NORM_EPS))  the same for an overflowed row norm
    cos    = |lin| / x_norm          floored at COS_FLOOR when a derivative is taken (explaining, training)
    dyn    = cos ** (B - 1)          square roots for B = 1.25, 1.5, 2; exp2(log2(.)) otherwise
    out    = lin * dyn               stored in the output dtype

The weight is normalised after the product (the PyTorch path normalises first), so the values equal that path's to
the dtype's rounding, not bit for bit. Under ``torch.autocast`` the tiles are cast to the autocast dtype for the
product (as autocast casts ``F.linear``'s operands) while the norms and the epilogue stay float32.

Autograd, as :class:`~bcos_plugins.nn.BcosLinear` decides on the PyTorch path:

- inference (nothing records): ``out`` alone;
- explaining (``x`` requires a gradient, no parameter gradient is taken): :class:`_TritonExplainingLinear`, whose
  backward is ``(grad * dyn) @ ŵ``, computed as ``(grad * s) @ w`` with ``s = dyn / max(||w||, NORM_EPS)`` stored by
  the kernel (two kernels, three under autocast: no normalised copy of the weight);
- training: :class:`_TritonBcosLinear`, the training node :class:`~bcos_plugins.nn.functional.BcosLinearNode` with
  only its forward replaced: it saves the same tensors in the same fields, so the backward is that node's.

Everything else takes the PyTorch path: MaxOut, B = 1, ``constant_outputs``, float64, tensor subclasses,
``torch.func`` transforms (``vmap``), ``torch.compile`` tracing (inductor fuses the chain there already), the
reference path, a training step whose ``dyn`` cannot be recovered from the output (float16, B > 2.9: that node keeps
``lin`` instead), inputs that are not contiguous, empty inputs, and CPU tensors unless Triton's interpreter is on
(``TRITON_INTERPRET=1``, how the tests run the kernel without a GPU).

Tiles per dtype (:func:`default_tiles`, :data:`DEFAULT_TILES`): 128 x 128 output tiles and K steps of 32 for every
dtype, 4 warps and the norms reduced after the K loop for bfloat16 / float16 products, 8 warps for float32 (IEEE)
ones; on an H200 these took 2.62x and 1.95x ``F.linear``'s time per launch where the earlier default, 64 x 64 x 32
for all, took 4.74x and 2.35x (docs/benchmarks.md#gpu). Default off: on that H200 (2026-11-28) it passes every check
compiled, but the whole models were timed only with the earlier tiles, with which it beat the PyTorch path only where
launches dominate (a bfloat16 MiniLM forward). The PyTorch path is the tested reference. Triton is optional (Linux
x86-64; the ``dev`` extra installs it for the tests).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import MappingProxyType
from typing import NamedTuple

import torch
from torch import Tensor

from .._checks import require_bool
from ..errors import BcosRuntimeError, argument_error
from .dynamic import parameter_gradients_unused, reusable_context
from .functional import (
    COS_FLOOR,
    NORM_EPS,
    BcosLinearNode,
    clear_unit_norm_cache,
    scale_recoverable,
    using_reference_path,
)

__all__ = ["triton_kernels", "using_triton_kernels"]

# The process-wide switch, a plain module global; BcosLinear.forward asks using_triton_kernels() first (one call)
_ENABLED = False


def using_triton_kernels() -> bool:
    """Whether the B-cos linear layers run the Triton kernel where it applies (see :func:`triton_kernels`)."""
    return _ENABLED


def _interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``): the kernel then runs on CPU tensors too."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@reusable_context  # (entered again: torch.no_grad()'s objects can be)
def triton_kernels(enabled: bool = True) -> Iterator[None]:
    """Run every B-cos linear layer without MaxOut as one Triton kernel (this module's docstring) while the block
    runs; process-wide, like :func:`~bcos_plugins.nn.reference_path`.

    Opt-in: it exists to cut the kernel launches of the eager forward on a GPU (docs/benchmarks.md#gpu: on an H200 a
    bfloat16 MiniLM forward 1.92x -> 1.22x the conventional model, other shapes slower, with the earlier 64 x 64 x 32
    tiles; whole models are not yet timed with the per-dtype tiles of :func:`default_tiles`). Values equal the PyTorch
    path's to the dtype's rounding (the kernel normalises the weight after the product). Layers and calls the kernel does not cover take
    the PyTorch path unchanged. Raises a :class:`~bcos_plugins.errors.BcosRuntimeError` when Triton cannot be
    imported, or when no CUDA device exists and the interpreter (``TRITON_INTERPRET=1``) is off.
    """
    require_bool("enabled", enabled, fix="Call triton_kernels() or triton_kernels(False)")
    if enabled:
        if not _triton_importable():
            raise argument_error(
                "enabled", "triton_kernels(True) needs the triton package, which cannot be imported here",
                "install it (pip install triton; Linux x86-64 with a CUDA GPU) or leave the switch off: the PyTorch "
                "path computes the same values", kind=BcosRuntimeError)
        if not torch.cuda.is_available() and not _interpreting():
            raise argument_error(
                "enabled", "triton_kernels(True) needs a CUDA device and torch sees none",
                "run on a machine with a CUDA GPU, leave the switch off (the PyTorch path computes the same values), "
                "or start the process with TRITON_INTERPRET=1 (set before triton is first imported) to run the kernel "
                "in Triton's CPU interpreter (slow; for tests)", kind=BcosRuntimeError)
    # (functional._process_switch writes functional's own globals, so the flag of this module is set here)
    global _ENABLED
    previous, _ENABLED = _ENABLED, enabled
    try:
        yield
    finally:
        _ENABLED = previous


# ---------------------------------------------------------------------------------------------------------------
# The kernel

# B as a compile-time mode: the exponents with square roots, and one general kernel whose exponent B - 1 is a runtime
# argument (a B warm-up changes B at every step; one constexpr per value would compile a kernel per step)
_B_MODES = {2.0: 2, 1.5: 1, 1.25: 3}
_GENERAL_B = 0



class KernelTiles(NamedTuple):
    """A launch configuration of the kernel: the output tile (``block_m`` rows x ``block_n`` units), the step along
    K, and Triton's ``num_warps`` / ``num_stages`` (powers of two, blocks at least 16: ``tl.dot``'s smallest);
    ``late_norms``: the sums of squares kept element-wise in tiles and reduced once after the K loop (not each
    step); ``norms_first``: the sums of squares in a K loop of their own before the product's (the tiles read twice);
    both give the same norms to float32 rounding (another summation order). ``units_fastest``: the grid's programs
    in the order units first (programs that run together share their rows), not rows first.

    The five numbers have no defaults (``KernelTiles()`` is refused by Python): the kernel's own choice depends on the
    dtype, :func:`default_tiles`."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    late_norms: bool = False
    norms_first: bool = False
    units_fastest: bool = False


# The configuration every layer launches with, by the dtype its tiles are multiplied in (benchmarks/triton_probe.py
# on an H200, 2026-11-28, kernel / F.linear time as a geometric mean over the 10 linear layer shapes of MiniLM,
# bert-base and GPT-2 at 8,192 rows; docs/benchmarks.md#gpu):
# - bfloat16: 128 x 128 x 32, 4 warps, 3 stages, norms reduced after the K loop: 2.62x (64 x 64 x 32, the default
#   until then: 4.74x); float16 takes the same (the same 16-bit tensor-core products; not measured on its own);
# - float32, IEEE products (no tensor cores on sm_90): 128 x 128 x 32, 8 warps, 3 stages: 1.95x (64 x 64 x 32: 2.35x).
#   Three-pass TF32 measured 1.15x but is not the default: float32 means IEEE unless torch allows TF32.
# float64 has none: the kernel does not take it (those calls take the PyTorch path).
DEFAULT_TILES = MappingProxyType({
    torch.bfloat16: KernelTiles(128, 128, 32, num_warps=4, num_stages=3, late_norms=True),
    torch.float16: KernelTiles(128, 128, 32, num_warps=4, num_stages=3, late_norms=True),
    torch.float32: KernelTiles(128, 128, 32, num_warps=8, num_stages=3),
})


def default_tiles(dtype: torch.dtype) -> KernelTiles:
    """The tiles the kernel launches with when its tiles are multiplied in ``dtype`` (the autocast dtype, or the
    layer's own): ``DEFAULT_TILES[dtype]``, a read-only table of bfloat16, float16 and float32.

    Per dtype since 2026-11-28 (docs/benchmarks.md#gpu): 128 x 128 x 32 for all; 4 warps and the norms reduced after
    the K loop for bfloat16 / float16, 8 warps for float32. ``DEFAULT_TILES`` was one :class:`KernelTiles`
    (64 x 64 x 32, 4 warps, 3 stages) before; pass that explicitly to launch with it. Raises a
    :class:`~bcos_plugins.errors.BcosValueError` for a dtype the kernel does not take (float64: the PyTorch path)."""
    tiles = DEFAULT_TILES.get(dtype) if isinstance(dtype, torch.dtype) else None
    if tiles is None:
        raise argument_error("dtype", f"the kernel multiplies bfloat16, float16 or float32 tiles, got {dtype!r}",
                             "pass one of torch.bfloat16, torch.float16, torch.float32 (float64 layers take the "
                             "PyTorch path)")
    return tiles


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# {interpreted: the decorated kernel}; decorated on first use, so that importing the package does not import triton's
# compiler, and so that one process can hold both the compiled and the interpreted kernel (the CUDA tests run both)
_KERNELS: dict = {}


def decorated_kernel(interpreted: bool):
    """The kernel decorated by ``triton.jit``, for Triton's interpreter or its compiler.

    The one place that relies on how Triton selects its interpreter: ``triton.jit`` reads ``TRITON_INTERPRET``
    (``triton.knobs.runtime.interpret``) when it decorates, not when the kernel runs (triton 3.6;
    tests/test_triton_linear.py checks it)."""
    kernel = _KERNELS.get(interpreted)
    if kernel is None:
        import triton

        from ._triton_kernel import bcos_linear_kernel

        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = interpreted
            kernel = _KERNELS[interpreted] = triton.jit(bcos_linear_kernel)
    return kernel


def _tl_dtype(dtype: torch.dtype):
    import triton.language as tl

    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def launch_bcos_kernel(x2: Tensor, view: Tensor, b: float, out_dtype: torch.dtype, *, floor: bool, store_dyn: bool,
                       store_norms: bool, tiles: KernelTiles | None = None,
                       precision: str | None = None) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Run the kernel on the rows ``x2`` ``(M, K)`` and the unit weights ``view`` ``(N, K)`` (any strides): ``out``,
    then ``dyn / max(||w||, NORM_EPS)`` (``out_dtype``), ``x_norm`` ``(M,)`` and ``||w||`` ``(N,)`` (float32), each
    ``None`` unless asked.

    ``tiles`` (default: :func:`default_tiles` of ``out_dtype``, the dtype the tiles are multiplied in) and
    ``precision`` (``tl.dot``'s ``input_precision``; default: IEEE float32 products unless torch allows TF32) exist
    for benchmarks/triton_probe.py, which times other configurations, and for the tests; the layers use the
    defaults."""
    m, k = x2.shape
    n = view.shape[0]
    device = x2.device
    out = torch.empty((m, n), device=device, dtype=out_dtype)
    dyn = torch.empty((m, n), device=device, dtype=out_dtype) if store_dyn else None
    x_norm = torch.empty(m, device=device, dtype=torch.float32) if store_norms else None
    w_norm = torch.empty(n, device=device, dtype=torch.float32) if store_norms else None
    interpreted = device.type != "cuda" or _interpreting()
    dot_dtype = out_dtype  # (the autocast dtype, or the inputs' own)
    # float32: IEEE products unless torch allows TF32 for its own matrix products (default: not), so that the kernel
    # keeps cuBLAS's precision; tl.dot's default would be TF32
    if precision is None:
        precision = "tf32" if dot_dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"
    if tiles is None:
        tiles = default_tiles(dot_dtype)
    mode = _B_MODES.get(b, _GENERAL_B)
    grid = (-(-m // tiles.block_m), -(-n // tiles.block_n))
    if tiles.units_fastest:
        grid = grid[::-1]
    decorated_kernel(interpreted)[grid](
        x2, view, out, out if dyn is None else dyn, out if x_norm is None else x_norm,
        out if w_norm is None else w_norm,
        m, n, x2.stride(0), x2.stride(1), view.stride(0), view.stride(1), out.stride(0), out.stride(1),
        b - 1.0,
        K=k, B_MODE=mode, FLOOR=floor, STORE_DYN=store_dyn, STORE_NORMS=store_norms,
        DOT_DTYPE=_tl_dtype(dot_dtype), PRECISION=precision,
        INTERPRETED_BF16=interpreted and dot_dtype == torch.bfloat16,
        NORM_EPS_=NORM_EPS, COS_FLOOR_=COS_FLOOR,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, LATE_NORMS=tiles.late_norms,
        NORMS_FIRST=tiles.norms_first, UNITS_FASTEST=tiles.units_fastest,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return out, dyn, x_norm, w_norm


# ---------------------------------------------------------------------------------------------------------------
# Autograd

class _TritonExplainingLinear(torch.autograd.Function):
    """Explaining (``dyn`` a constant, no parameter gradient): the kernel's ``out``; backward ``(grad * dyn) @ ŵ``,
    the gradient of the PyTorch path's recorded ``F.linear(x, ŵ) * dyn``, as ``(grad * s) @ w`` with the kernel's
    ``s = dyn / max(||w||, NORM_EPS)`` (the normalisation moved from the weight onto the units' factor: equal to
    rounding), in the output's dtype (autocast's), then in ``x``'s. Plain tensor code in the backward (differentiable again; batched gradients). Written as
    ``forward(ctx, ...)`` without ``setup_context`` (see functional's ``_BcosProduct``)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, b: float, units_are_columns: bool) -> Tensor:
        view = weight.T if units_are_columns else weight
        x2 = x.reshape(-1, x.shape[-1])
        out, scale, _, _ = launch_bcos_kernel(x2, view, b, _output_dtype(x, weight), floor=True, store_dyn=True,
                                              store_norms=False)
        ctx.units_are_columns = units_are_columns
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(weight, scale)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        weight, scale = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            matmul_dtype = scale.dtype
            grad_lin = grad_out.to(matmul_dtype) * scale.view(grad_out.shape)
            view = weight.T if ctx.units_are_columns else weight  # (units, d_in)
            grad_x = (grad_lin @ view.to(matmul_dtype)).to(ctx.x_dtype)
        return grad_x, None, None, None


class _TritonBcosLinear(BcosLinearNode):
    """:class:`~bcos_plugins.nn.functional.BcosLinearNode` (the training node, ``own_norm=True``) with its forward
    replaced by the kernel. Saves what that forward saves, in the same fields: ``x`` (if a gradient needs it), the
    weight, ``||w||`` per unit ``(N, 1)`` float32, ``out``, ``x_norm`` ``(..., 1)`` float32 and no tensor B; the
    inherited backward recomputes ``dyn`` from ``out``. Only where that recovery keeps the digits
    (:func:`~bcos_plugins.nn.functional.scale_recoverable`); elsewhere the caller takes the PyTorch path."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, x_norm: None, b: float, units_are_columns: bool,
                own_norm: bool = True) -> Tensor:
        view = weight.T if units_are_columns else weight
        x2 = x.reshape(-1, x.shape[-1])
        out, _, row_norms, unit_norms = launch_bcos_kernel(x2, view, b, _output_dtype(x, weight), floor=True,
                                                           store_dyn=False, store_norms=True)
        out = out.view(*x.shape[:-1], out.shape[-1])
        ctx.own_norm = True
        ctx.units_are_columns = units_are_columns
        ctx.x_dtype = x.dtype
        ctx.keeps_lin = False
        ctx.b = b
        keeps_x = ctx.needs_input_grad[1] or ctx.needs_input_grad[0]
        ctx.save_for_backward(x if keeps_x else None, weight, unit_norms[:, None], out,
                              row_norms.view(*x.shape[:-1], 1), None)
        return out


def _output_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The PyTorch path's output dtype: under autocast its dtype (``F.linear`` casts both operands to it), else the
    weight's (which then equals ``x``'s, :func:`_covered`)."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


# ---------------------------------------------------------------------------------------------------------------
# Dispatch

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_PLAIN = (Tensor, torch.nn.Parameter)


def _covered(x: Tensor, weight: Tensor) -> bool:
    """Whether the kernel can compute this call (the checks that do not depend on the autograd mode)."""
    if type(x) is not Tensor or type(weight) not in _PLAIN or x.device != weight.device:
        return False
    if _functorch_wrapped(x) or _functorch_wrapped(weight):  # (torch.func.vmap / grad: no storage to point at)
        return False
    if x.device.type != "cuda" and not (x.device.type == "cpu" and _interpreting()):
        return False
    if x.dtype not in _KERNEL_DTYPES or weight.dtype not in _KERNEL_DTYPES:
        return False
    if x.dtype != weight.dtype:
        # (mixed dtypes multiply only under autocast, which casts both; its dtype must be one the kernel has)
        if not torch.is_autocast_enabled(x.device.type):
            return False
    if torch.is_autocast_enabled(x.device.type) and torch.get_autocast_dtype(x.device.type) not in _KERNEL_DTYPES:
        return False
    return (x.dim() >= 1 and x.numel() > 0 and x.is_contiguous()
            and _int32_offsets_suffice(x.numel() // x.shape[-1], weight.numel() // x.shape[-1], x.shape[-1]))


def _int32_offsets_suffice(rows: int, units: int, inputs: int) -> bool:
    """Whether every element offset the kernel computes fits in int32: it multiplies int32 row and unit indices by the
    strides, so an output of 2^31 elements or more (a 128k-word LM head over 17k tokens) would wrap around and read or
    write the wrong memory; such calls take the PyTorch path."""
    return max(rows * units, rows * inputs, units * inputs) < 2**31


# torch.func's wrappers (vmap's batched tensors, grad's tracking tensors) are plain Tensors by type; torch has no
# public test for them
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def triton_forward(layer, x: Tensor) -> Tensor | None:
    """``layer``'s output through the kernel, or ``None`` where the PyTorch path must run (module docstring).

    Called by :meth:`BcosLinear.forward <bcos_plugins.nn.BcosLinear.forward>` while :func:`triton_kernels` is on,
    for layers without MaxOut; mirrors that method's choice of inference, explaining and training."""
    if torch.compiler.is_compiling() or using_reference_path():
        return None
    weight = layer.weight
    if not _covered(x, weight):
        return None
    b = layer._pressure()
    if b == 1.0:
        return None
    columns = layer._UNITS_ARE_COLUMNS
    recording = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if not recording:
        layer.holds_constant()  # (counts the dynamic weight while explaining, as the PyTorch path does)
        view = weight.T if columns else weight
        out, _, _, _ = launch_bcos_kernel(x.reshape(-1, x.shape[-1]), view, b, _output_dtype(x, weight),
                                          floor=False, store_dyn=False, store_norms=False)
        return out.view(*x.shape[:-1], out.shape[-1])
    if layer.explaining:
        if not (x.requires_grad and parameter_gradients_unused() and layer.constant_outputs is None):
            return None
        layer.holds_constant()
        return _TritonExplainingLinear.apply(x, weight, b, columns)
    if not scale_recoverable(_output_dtype(x, weight), b):
        return None  # (the training node keeps lin there; the kernel stores out only)
    if weight.requires_grad:
        clear_unit_norm_cache(layer)  # (training: a cached copy would only hold memory, as bcos_linear drops it)
    return _TritonBcosLinear.apply(x, weight, None, b, columns, True)

