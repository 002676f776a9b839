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

The unit-norm weight ``ŵ`` is reused between forward passes while no gradient of ``w`` is needed
(:func:`cached_unit_norm`), for every B-cos layer and the TransformerLens components alike.

Two implementations of ``out = dyn * lin`` (docs/api/nn.md#fused-and-reference-kernels):

- :func:`bcos_product` (the default, "fused"): the element-wise steps run in place on one fresh tensor.
  Training, it is one autograd node that saves only ``lin`` and ``||x||`` for the backward pass, which
  recomputes ``dyn`` (a few cheap element-wise operations) instead of keeping the four or five output-sized
  intermediates that autograd saves for the step-by-step form; explaining, ``dyn`` is computed without
  recording and one plain product is recorded, which saves ``dyn`` alone (the backward is one product) and is
  written into the matrix product's output where the layer hands it over; inference leaves out the floor on
  ``|cos|``, which only derivatives need (:func:`_inference_product`). Plain tensor code, so ``torch.compile``
  traces it (no graph break) and inductor fuses each direction into one kernel.
- :func:`bcos_scale` followed by ``dyn * lin`` (the reference): the maths step by step, differentiated by
  autograd. Selected for the whole process by :func:`reference_path`; the tests compare the two.

Training a linear layer without MaxOut goes one step further: :func:`bcos_linear` runs the normalisation, the
matrix product and the product above as one autograd node that keeps the raw weight instead of ``ŵ`` and the
output instead of ``lin`` (the next operation usually keeps the output anyway), and recomputes the rest in the
backward pass (:class:`BcosLinearNode`). Inference and explanations of such a layer run :func:`inference_linear` and
:func:`explaining_linear`: the kernels of the helpers above in the same order (the same values), written out in one
function each, because at a small model's widths the helpers' nested Python calls cost a few per cent of a forward.

Under ``torch.autocast`` (or with bfloat16 weights) ``lin`` is low precision. ``||x||`` is always accumulated
in float32 for half-precision inputs (range: the squares overflow float16; precision: bfloat16 sums of
hundreds of squares lose digits). The fused cosine and ``dyn`` are stored in ``lin``'s dtype when that is
bfloat16 (float32's range; ``dyn`` lies in [0, 1] and is rounded to bfloat16 before the product in either
form; ``|lin|`` is multiplied by the float32 ``1 / ||x||`` in place, so neither tensor is cast) and in
float32 for float16 (whose range cannot hold ``||x||`` past 65504, nor ``1 / ||x||`` past 2^14 without losing
digits).
"""

from __future__ import annotations

import math
import numbers
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from .._checks import require_bool
from ..errors import BcosRuntimeError, BcosTypeError, BcosValueError, argument_error
from .dynamic import parameter_gradients_unused, reusable_context

__all__ = ["NORM_EPS", "COS_FLOOR", "HALF_DTYPES", "at_least_float32", "unit_norm", "cached_unit_norm", "clear_unit_norm_cache",
           "reuse_unit_weights",
           "input_norm", "overflowed_norm_as_nan", "bcos_scale", "bcos_product", "inference_linear", "explaining_linear", "explaining_scale", "detach_units", "bcos_linear",
           "max_out", "reference_path", "using_reference_path"]


# Constants: each is a literal returned by a function, and the code reads the call, not a module-level float.
# Under torch.compile(dynamic=True), torch 2.13's dynamo makes every float it reads from a module, a class, a
# default argument or an object attribute a graph input (a SymFloat), first realised where it is read: read inside
# an autograd.Function, the input belongs to that Function's subgraph, and the next Function reading the same float
# fails with "AssertionError: lift_tracked_freevar_to_input should not be called on root SubgraphTracer" (training
# and explain of every B-cos model; tests/test_compile_dynamic.py). A literal in the code is a constant to dynamo.
def _norm_eps() -> float:
    """The floor of a weight norm and the square of the input norm's additive floor."""
    return 1e-6


def _cos_floor() -> float:
    """The floor of ``|cos|`` where a derivative is taken."""
    return 1e-12


NORM_EPS = _norm_eps()  # the values, for code outside the Functions (the Triton kernel's arguments, conv.py)
COS_FLOOR = _cos_floor()
HALF_DTYPES = (torch.float16, torch.bfloat16)


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` widened to float32 if it is a narrower float (float16, bfloat16), float64 kept, integers and booleans
    read in float64: the dtype the package sums, ranks and takes softmaxes in, where half precision keeps 3
    significant digits (it hid completeness gaps and tied close scores) and float32 would undo a float64 model's
    precision. Integers (scores, counts, ids) go to float64, exact to 2**53: float32 rounded every integer above 2**24
    (2**24 + 1 read as 2**24), silently."""
    if dtype in _FLOATS_WIDENED:  # (the floating dtypes without a dispatched op: the backward passes ask per layer)
        return _FLOATS_WIDENED[dtype]
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.float64
    return torch.promote_types(dtype, torch.float32)


_FLOATS_WIDENED = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
                   torch.float64: torch.float64}


# sqrt(NORM_EPS) as the 0-d second argument of torch.hypot, per norm dtype: a CPU scalar tensor enters a kernel
# on any device as a plain number (no copy), and a 0-d tensor does not promote the norm's dtype. One per dtype
# (float64's exact, float32's rounded to float32, the value a float64 constant took in float32 kernels) so
# that no call casts the constant first (a CPU op of its own, per layer and call)
_SQRT_NORM_EPS = {dtype: torch.tensor(NORM_EPS**0.5, dtype=dtype) for dtype in (torch.float32, torch.float64)}


def unit_norm(weight: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """``weight`` scaled so that each unit's input weights (the axes ``dim``) have norm 1."""
    return _divided_by_norm(weight, _unit_norms(weight, dim).clamp_min(_norm_eps()))


def _unit_norms(weight: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """``||w||`` of each unit (the axes ``dim`` kept), float32 for half-precision weights, an overflowed one NaN.

    Every B-cos layer's unit norms come from here (linear, ``Conv1D``, convolution, attention projections, the
    TransformerLens components, the cached unit weights of :func:`reuse_unit_weights`); the fused inference path
    (:func:`inference_linear`) and the Triton kernel do the same inline. A unit whose weights are finite but whose
    squared norm passes float32's range (an element beyond about 1.8e19, or many beyond 1e18) had ``||w|| = inf``, so
    ``ŵ = w / inf = 0`` and the unit gave 0 in every row, silently (float64 gives about ``x_k``): the norm is made NaN
    (:func:`overflowed_norm_as_nan`, as an input row's), so that unit's outputs are NaN in every row, and so are the
    gradients that pass through it (training, explaining). Finite norms keep their bits (one element-wise kernel on a
    ``(units, 1)`` vector). float16 weights never get there (their norm is taken in float32); bfloat16 weights can."""
    if weight.dtype in HALF_DTYPES:
        return overflowed_norm_as_nan(torch.linalg.vector_norm(weight, dim=dim, keepdim=True, dtype=torch.float32))
    return overflowed_norm_as_nan(torch.linalg.vector_norm(weight, dim=dim, keepdim=True))


def _unrecorded_unit_norm(view: Tensor, dim: int | tuple[int, ...], cast: torch.dtype | None = None) -> Tensor:
    """:func:`unit_norm` of ``view`` where autograd records nothing (its clamp in place), stored in ``cast`` (the
    matrix product's dtype under ``torch.autocast``, :func:`_matmul_cast`) if given, else in ``view``'s dtype
    (:func:`_stored_quotient`)."""
    return _stored_quotient(view, _unit_norms(view, dim).clamp_min_(_norm_eps()), cast or view.dtype)


def _stored_quotient(view: Tensor, clamped_norm: Tensor, dtype: torch.dtype) -> Tensor:
    """``view / clamped_norm`` in ``dtype``, where autograd records nothing: one division kernel that computes in
    float32 (float64 for float64) and rounds once on store. The bits of the quotient followed by its cast (autocast's
    own cast of a float32 weight, a half-precision weight's float32 quotient rounded back) without the copies before
    and after it, each a kernel launch on a GPU (docs/benchmarks.md#gpu). The result keeps ``view``'s strides (a
    transposed ``Conv1D`` weight stays transposed), as the quotient did, so the matrix product reading it runs the
    same kernel. Tensor subclasses (DTensor, quantised weights) take the quotient and the cast as two steps."""
    if view.dtype == clamped_norm.dtype == dtype:  # (no cast to save: no output allocated by hand)
        return view / clamped_norm
    if type(view) not in _PLAIN_TENSORS:
        unit = _divided_by_norm(view, clamped_norm)
        return unit if unit.dtype == dtype else unit.to(dtype)
    return torch.div(view, clamped_norm, out=torch.empty_like(view, dtype=dtype))


_PLAIN_TENSORS = (Tensor, nn.Parameter)


def _matmul_cast(weight: Tensor) -> torch.dtype | None:
    """The dtype ``torch.autocast`` casts a float32 ``weight`` to for a matrix product here, ``None`` if none."""
    if weight.dtype == torch.float32 and torch.is_autocast_enabled(weight.device.type):
        return torch.get_autocast_dtype(weight.device.type)
    return None


def _divided_by_norm(weight: Tensor, clamped_norm: Tensor, keep_wide: bool = False) -> Tensor:
    """``weight / clamped_norm``; half-precision weights are divided in float32 and rounded back unless
    ``keep_wide`` (the backward of :class:`BcosLinearNode` wants the float32 quotient)."""
    if weight.dtype in HALF_DTYPES:
        unit = weight.float() / clamped_norm
        return unit if keep_wide else unit.to(weight.dtype)
    return weight / clamped_norm


# weight -> {form: (validity key, unit-norm weight)}; entries die with their weight (ids are compared, never
# tensor values, and the cached tensors hold no autograd history that could keep the weight alive)
_UNIT_WEIGHTS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def cached_unit_norm(weight: Tensor, dim: int | tuple[int, ...], *, transposed: bool = False,
                     first_unit: int = 0, autocast: bool = False) -> Tensor:
    """:func:`unit_norm` of ``weight`` (of ``weight.T`` if ``transposed``, from row ``first_unit`` on), reused
    across forward passes while it cannot differ and no gradient reaches ``weight`` through it, inside
    :func:`reuse_unit_weights` only (outside it, always :func:`unit_norm` afresh).

    The one cache of unit-norm weights (B-cos layers and the TransformerLens components). Inference,
    evaluation and explanations call a model many times with the same weights; normalising them costs a
    reduction, a clamp and a division per layer and call. A cached value is used when

    - autograd needs no gradient of ``weight``: gradients are off, ``weight.requires_grad`` is False, or the
      call runs inside :func:`~bcos_plugins.nn.dynamic.no_parameter_gradients` (explanations). Training
      recomputes the normalisation every time, so that autograd differentiates through it;
    - the weight is the same tensor object (a parameter replaced by a new one misses), with the same
      storage object (``model.half()`` then ``.float()`` and ``param.data = t`` replace it), version counter (every in-place write through the tensor, ``load_state_dict`` and optimiser
      steps included, bumps it), dtype, device, shape and strides, and the inference-mode state matches.

    Writes that bypass the version counter (``weight.data.copy_(...)``, code that refills a parameter's
    storage behind autograd's back) are not seen: after them, :func:`clear_unit_norm_cache`. Weights of
    tensor subclasses (DTensor, quantised parameters), the reference path and ``torch.compile`` traces always
    normalise afresh. Memory: one normalised copy per cached weight, alive until the weight is used for
    training (a forward pass that needs its gradient drops it), cleared, or freed.

    Outside :func:`reuse_unit_weights`, inside :func:`~bcos_plugins.nn.dynamic.no_parameter_gradients`, the
    fresh normalisation is computed without autograd recording (no gradient of ``weight`` is taken there; the
    reference path records it).

    ``autocast``: the caller feeds the result to an op that ``torch.autocast`` casts (``F.linear``,
    ``F.conv2d``); under autocast the cast to the autocast dtype is cached too (the same rounding as
    autocast's own per-call cast).
    """
    view = weight.T if transposed else weight
    if first_unit:
        view = view[first_unit:]
    if torch.compiler.is_compiling():
        return unit_norm(view, dim)
    recorded = torch.is_grad_enabled() and weight.requires_grad
    if not _REUSE_UNIT_WEIGHTS:
        if _REFERENCE_PATH or (recorded and not parameter_gradients_unused()):
            return unit_norm(view, dim)
        # nothing to record: inference, or an explanation, which takes no gradient of the weight (three autograd
        # nodes and their saved tensors per layer and call saved, as a reused copy saves them); under autocast
        # divided straight into the matrix product's dtype (one kernel fewer per layer and call)
        with torch.no_grad():
            return _unrecorded_unit_norm(view, dim, _matmul_cast(weight) if autocast else None)
    if recorded and not parameter_gradients_unused():
        _forget_unit_norm(weight)
        return unit_norm(view, dim)
    if type(weight) not in _PLAIN_TENSORS or _REFERENCE_PATH or weight.is_inference() or weight.is_meta:
        return unit_norm(view, dim)
    cast = _matmul_cast(weight) if autocast else None
    form = (dim, transposed, first_unit, cast)
    key = (weight._version, weight.data_ptr(), weight.dtype, weight.device, weight.shape, weight.stride(),
           torch.is_inference_mode_enabled())
    # the storage object too: ``model.half()`` then ``.float()`` (any ``param.data = t``) keeps the parameter's
    # version counter, and the new storage can land at the freed one's address, so the key above matched and the
    # copy of the weights before the float16 rounding was served (2e-3 off the logit, silently)
    storage = weight.untyped_storage()
    forms = _UNIT_WEIGHTS.get(weight)
    if forms is None:
        forms = _UNIT_WEIGHTS[weight] = {}
    hit = forms.get(form)
    if hit is not None and hit[0] == key and hit[2]() is storage:
        return hit[1]
    with torch.no_grad():
        unit = _unrecorded_unit_norm(view, dim, cast)
    forms[form] = (key, unit, weakref.ref(storage))
    return unit


def _forget_unit_norm(weight: Tensor) -> None:
    """Drop ``weight``'s cached unit-norm copies: it is being trained (its forward pass needs its gradient), so
    the copy an evaluation left would only hold memory (training memory stays as it was without the cache)."""
    if _UNIT_WEIGHTS:
        _UNIT_WEIGHTS.pop(weight, None)


# The process-wide switches of reuse_unit_weights() and reference_path(): plain module globals, so that the hot
# paths (and torch.compile's guards) read a bool, set by one context manager
_REUSE_UNIT_WEIGHTS = False
_REFERENCE_PATH = False


@contextmanager
def _process_switch(flag: str, enabled: bool, function: str,
                    on_exit: Callable[[bool], None] | None = None) -> Iterator[None]:
    """Set the module global ``flag`` to ``enabled`` while the block runs and restore it after (then
    ``on_exit(restored value)``); ``function`` names the public context manager in the error message."""
    require_bool("enabled", enabled, fix=f"Call {function}() or {function}(False)")
    module = globals()
    previous = module[flag]
    module[flag] = enabled
    try:
        yield
    finally:
        module[flag] = previous
        if on_exit is not None:
            on_exit(previous)


@reusable_context  # (entered again: torch.no_grad()'s objects can be)
def reuse_unit_weights(enabled: bool = True) -> Iterator[None]:
    """Let the B-cos layers reuse their normalised weights across forward passes while the block runs
    (:func:`cached_unit_norm`): inference and explanations then skip a reduction, a clamp and a division per
    layer and call (the eager forward on a GPU is bound by kernel launches; docs/benchmarks.md#gpu).

    Opt-in, because one way of editing weights cannot be seen: a write through ``weight.data`` (``layer.weight
    .data[:, i] = 0``, a common way to ablate a unit) does not bump the weight's version counter, so a reused
    copy would silently keep the old weight. Nor can a write through another tensor that shares the weight's
    memory: ``torch.nn.utils.vector_to_parameters(vec, ...)`` makes the parameters views of ``vec``, so a later
    write into ``vec`` (and calling it again with the same ``vec``) is not seen either. Inside this block, edit
    weights under ``torch.no_grad()`` (``layer.weight[:, i] = 0``) or call :func:`clear_unit_norm_cache` after a
    ``.data`` write or a write through such a shared tensor. Outside it
    (the default) every forward normalises the weight it reads. Process-wide, like :func:`reference_path`;
    the cached copies are dropped when the block ends, and when a ``reuse_unit_weights(False)`` block inside it
    ends (weights may have been edited through ``.data`` there).
    """
    with _process_switch("_REUSE_UNIT_WEIGHTS", enabled, "reuse_unit_weights",
                         on_exit=lambda still_reusing: _after_reuse(still_reusing, enabled)):
        yield


def _after_reuse(still_reusing: bool, was_enabled: bool) -> None:
    # the outermost block ended: its cached copies would go stale unseen outside it. A reuse_unit_weights(False)
    # block inside one ended: weights edited in it through .data (safe there) left the outer block's copies stale,
    # and they were served after it (an explanation 15-1500 % off the logit, silently)
    if not still_reusing or not was_enabled:
        _UNIT_WEIGHTS.clear()


def clear_unit_norm_cache(model: nn.Module | None = None) -> None:
    """Drop the cached unit-norm weights of ``model``'s parameters (of every weight when ``None``).

    Needed only after writing a weight in a way its version counter does not record (``weight.data``
    edits; see :func:`cached_unit_norm`), or to free the memory of the normalised copies.
    """
    if model is None:
        _UNIT_WEIGHTS.clear()
        return
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"must be a torch.nn.Module or None, got {type(model).__name__}",
                             "pass the model whose cached weights to drop, or nothing to drop all",
                             kind=BcosTypeError)
    for parameter in model.parameters():
        _UNIT_WEIGHTS.pop(parameter, None)


# The last input a layer read without autograd recording, per thread: (weak reference to it, its version counter,
# {what the layers reading it derived from it: ("norm", dim), ("reciprocal", dim), ("cast", dtype)})
_LAST_INPUT = threading.local()


def _derived_from(x: Tensor) -> dict | None:
    """The values derived from ``x`` by the layers that read it, shared between them (an attention block's query, key
    and value projections, a gated MLP's gate and up projections) while ``x`` is the same tensor, unchanged (its
    version counter, which every in-place write bumps, is the same); ``None`` where nothing is shared: autograd
    records (a shared value would tie one graph to another), ``torch.compile`` traces, the reference path, tensor
    subclasses and inference-mode tensors (which have no version counter). A write through ``x.data`` is not seen."""
    if (torch.compiler.is_compiling() or torch.is_grad_enabled() or _REFERENCE_PATH or type(x) is not Tensor
            or x.is_inference()):
        return None
    entry = getattr(_LAST_INPUT, "entry", None)
    if entry is None or entry[0]() is not x or entry[1] != x._version:
        entry = _LAST_INPUT.entry = (weakref.ref(x), x._version, {})
    return entry[2]


def input_norm(x: Tensor, dim: int | tuple[int, ...] = -1) -> Tensor:
    """``||x||`` over ``dim`` (kept), with an epsilon so that a zero input gives a zero output, not NaN.

    ``sqrt(||x||^2 + eps)`` with the norm from one fused reduction: squaring ``x`` first would allocate and
    fill a tensor of its full size on every call. Half-precision ``x`` gives a float32 norm (see the module
    docstring), whose square cannot overflow. The fused path takes ``hypot(||x||, sqrt(eps))``, the reference
    path the three steps.

    Layers that read the same input (an attention block's query, key and value projections, a gated MLP's
    gate and up projections) share its norm: without autograd recording (inference, and explanation mode,
    which computes the factor without it) the fused path returns the previous call's norm when ``x`` is the
    same tensor, unchanged (:func:`_derived_from`). Callers must not write into the returned tensor.
    """
    derived = _derived_from(x)
    if derived is None:
        return _input_norm(x, dim)
    norm = derived.get(("norm", dim))
    if norm is None:
        norm = derived[("norm", dim)] = _input_norm(x, dim)
    return norm


def _input_norm(x: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """:func:`input_norm` computed afresh."""
    if x.dtype in HALF_DTYPES:
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=torch.float32)
    else:
        norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
    if _REFERENCE_PATH:
        return overflowed_norm_as_nan((norm * norm + _norm_eps()).sqrt())
    # the same value in one kernel instead of three (equal to within one rounding of the dtype; hypot skips
    # the rounding of norm * norm); its gradient norm / hypot is 0, not NaN, at norm = 0
    return overflowed_norm_as_nan(torch.hypot(norm, _SQRT_NORM_EPS.get(norm.dtype, _SQRT_NORM_EPS[torch.float64])))


def overflowed_norm_as_nan(norm: Tensor) -> Tensor:
    """``norm`` (an input's norms, one per row or patch, or a layer's unit norms, :func:`_unit_norms`) with an
    infinite entry made NaN, every finite one unchanged (the same bits). A float32 or bfloat16 input row whose sum of squares passes float32's range (an element beyond
    about 1.8e19) has ``||x|| = inf``, so ``|cos| = 0`` and the layer's output was 0 (2e7 where float64 gives 1e19 on
    the training path), silently; NaN carries on to the output, where :func:`~bcos_plugins.explain` refuses it naming
    the row. One element-wise kernel on the norms, once per distinct input (shared as :func:`input_norm` shares the
    norm), once per unit-norm computation of a weight; float16 inputs and weights never get there (their norm is taken
    in float32: at most 65504 * sqrt(n))."""
    return torch.nan_to_num(norm, nan=math.nan, posinf=math.nan)


def _shared_cast(x: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``x`` cast to ``dtype`` as ``torch.autocast`` casts a matrix product's float32 input (``x`` itself for ``None``
    or another dtype), once for the layers that read it (:func:`_derived_from`): the query, key and value projections
    of one input under autocast take one copy instead of three."""
    if dtype is None or x.dtype != torch.float32:
        return x
    derived = _derived_from(x)
    if derived is None:
        return x  # (autocast casts it in the matrix product)
    cast = derived.get(("cast", dtype))
    if cast is None:
        cast = derived[("cast", dtype)] = x.to(dtype)
    return cast


def bcos_scale(lin: Tensor, x_norm: Tensor, b: float) -> Tensor:
    """The dynamic weight ``|lin / ||x|| | ** (B - 1)`` (``|cos|`` clamped below, see ``BcosLinear``).

    When no gradient is recorded (explanation mode computes the factor under ``no_grad``, and so does
    inference) the element-wise steps run in place on the one fresh tensor; with autograd recording they
    run out of place. Both run the same operations in the same order, so the values are bit-identical.
    The common exponents use square roots (several times faster than ``pow`` on CPU). With a float32
    ``x_norm`` (half-precision inputs) the cosine and the factor are float32, and the factor is returned in
    ``lin``'s dtype (it lies in [0, 1], so the cast cannot overflow).
    """
    _require_pressure(b)
    cos = lin / x_norm
    in_place = not (torch.is_grad_enabled() and cos.requires_grad)
    abs_cos = cos.abs_().clamp_min_(_cos_floor()) if in_place else cos.abs().clamp_min(_cos_floor())
    if b == 2.0:
        dyn = abs_cos
    elif b == 1.5:
        dyn = abs_cos.sqrt_() if in_place else abs_cos.sqrt()
    elif b == 1.25:
        dyn = abs_cos.sqrt_().sqrt_() if in_place else abs_cos.sqrt().sqrt()
    else:
        dyn = abs_cos.pow_(b - 1.0) if in_place else abs_cos.pow(b - 1.0)
    return dyn if dyn.dtype == lin.dtype else dyn.to(lin.dtype)


def _fused_dtype(lin: Tensor) -> torch.dtype:
    """The dtype the fused cosine and ``dyn`` are computed in (module docstring)."""
    return torch.float32 if lin.dtype == torch.float16 else lin.dtype


def _abs_cos(lin: Tensor, x_norm: Tensor) -> Tensor:
    """``|lin| * (1 / ||x||)`` in :func:`_fused_dtype`, a fresh tensor (see :func:`_fused_scale`)."""
    abs_lin = lin.float().abs_() if lin.dtype == torch.float16 else lin.abs()
    return abs_lin.mul_(_norm_reciprocal(x_norm))


def _norm_reciprocal(x_norm: Tensor) -> Tensor:
    """``1 / ||x||``. Without autograd recording, that of a norm :func:`input_norm` shares between the layers reading
    one input is taken once and shared too (an attention block's query, key and value projections: one kernel
    instead of three); the same value either way. Callers must not write into it."""
    if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
        entry = getattr(_LAST_INPUT, "entry", None)
        derived = {} if entry is None else entry[2]
        for (what, dim), value in list(derived.items()):
            if what == "norm" and value is x_norm:
                reciprocal = derived.get(("reciprocal", dim))
                if reciprocal is None:
                    reciprocal = derived[("reciprocal", dim)] = x_norm.reciprocal()
                return reciprocal
    return x_norm.reciprocal()


def _fused_scale(lin: Tensor, x_norm: Tensor, b: float | Tensor) -> Tensor:
    """``dyn`` for the fused path, in :func:`_fused_dtype`; a fresh tensor (the caller may write into it).

    ``|lin| * (1 / ||x||)``: the reciprocal is taken once per row (a tensor of ``lin``'s size divided
    element-wise costs more than a product), and ``|lin|`` is the one pass that makes the fresh tensor, which
    every further step updates in place. ``x_norm`` is float32 or float64 (:func:`input_norm`): a bfloat16
    ``lin`` is multiplied by the float32 reciprocal in place (computed in float32 and rounded once, with no
    cast of either operand), a float16 ``lin`` is widened first (module docstring). Called without autograd
    recording (in the forward and the backward of :class:`_BcosProduct`).
    """
    return _floored_power_(_abs_cos(lin, x_norm), b)


def _lin_dtype_scale(lin: Tensor, x_norm: Tensor, b: float | Tensor) -> Tensor:
    """The fused forward's ``dyn`` as it enters the product: :func:`_fused_scale` rounded to ``lin``'s dtype
    (a fresh tensor)."""
    dyn = _fused_scale(lin, x_norm, b)
    return dyn if dyn.dtype == lin.dtype else dyn.to(lin.dtype)


def _floored_power_(abs_cos: Tensor, b: float | Tensor) -> Tensor:
    """``max(|cos|, floor) ** (B - 1)``, written into ``abs_cos``."""
    return _power_(abs_cos.clamp_min_(_cos_floor()), b)


def _power_(abs_cos: Tensor, b: float | Tensor) -> Tensor:
    """``|cos| ** (B - 1)``, written into ``abs_cos``; 0 where ``|cos|`` is 0 (every exponent is positive).

    Square roots for the common exponents (a CPU's ``pow`` took 5-14x a square root's time: docs/benchmarks.md,
    2026-11-27 18:33 UTC and 2026-11-28 14:04 UTC). B = 1.25
    takes the fourth root as ``rsqrt(rsqrt(.))`` in float32 and float64, where a CPU's ``rsqrt`` took 0.6-0.75 of
    ``sqrt``'s time in float32 and half in float64 (within an ulp or two of ``sqrt(sqrt(.))``; ``rsqrt(rsqrt(0))
    = rsqrt(inf) = 0``), and as two square roots in bfloat16, whose ``rsqrt`` is the slower there.
    """
    if isinstance(b, Tensor):  # B read from the layer's buffer inside a compiled graph (pow: exact for B = 1)
        return abs_cos.pow_(b - 1.0)
    if b == 2.0:
        return abs_cos
    if b == 1.5:
        return abs_cos.sqrt_()
    if b == 1.25:
        return abs_cos.sqrt_().sqrt_() if abs_cos.dtype in HALF_DTYPES else abs_cos.rsqrt_().rsqrt_()
    return abs_cos.pow_(b - 1.0)


def _inference_product(lin: Tensor, x_norm: Tensor, b: float | Tensor, *, overwrite_lin: bool = False) -> Tensor:
    """``dyn * lin`` where autograd records nothing (inference), with ``dyn = |cos| ** (B - 1)`` unfloored.

    The floor on ``|cos|`` exists for derivatives (it keeps the gradient of ``|cos| ** (B - 1)`` finite at 0,
    and explanation mode keeps it so that the constant ``dyn`` its backward multiplies by is the training
    one); without a backward pass it only changes outputs where ``|cos| < COS_FLOOR``, from ``|cos| ** (B -
    1) lin`` to ``COS_FLOOR ** (B - 1) lin``, both below ``COS_FLOOR ** B ||x||`` in size. Leaving it out saves
    one pass over the output per layer and computes the formula as written; zero rows and zero inputs still
    give 0. A fresh tensor (``lin`` is not written), except with ``overwrite_lin`` (the caller hands over ``lin``, a
    fresh matrix product's output of ``x_norm``'s leading shape), where a large one is computed in place
    (:func:`_blocked_product_`).
    """
    if overwrite_lin and lin.dtype != torch.float16 and _blocks_the_product(lin, b):  # (float16: dyn is float32)
        return _blocked_product_(lin, _norm_reciprocal(x_norm), b)
    dyn = _power_(_abs_cos(lin, x_norm), b)
    return (dyn if dyn.dtype == lin.dtype else dyn.to(lin.dtype)).mul_(lin)


# torch's private functorch predicates, read in one place (_blocks_the_product, _plain_gradient)
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_is_legacy_batched = torch._C._functorch.is_legacy_batchedtensor
# whether a torch.func transform (grad, jacrev, vmap, ...) runs: one C call (25 ns; two is_functorch_wrapped_tensor
# calls cost 400 ns), read by the training nodes' callers (bcos_product, BcosLinear._trains_fused)
functorch_transforms_active = torch._C._are_functorch_transforms_active


# Outputs of at least this many bytes take the blocked product (_blocks_the_product), in blocks of rows of about
# _PRODUCT_BLOCK_BYTES each (docs/benchmarks.md, 2026-11-28 16:05 UTC: MiniLM's 1024 x 1536 float32 intermediate
# output, 6 MB, is the one a bench_core forward blocks; its 1.5 MB outputs keep the fresh tensor)
_BLOCKED_PRODUCT_BYTES = 4 << 20
_PRODUCT_BLOCK_BYTES = 1 << 20


def _blocks_the_product(lin: Tensor, b: float | Tensor) -> bool:
    """Whether :func:`_blocked_product_` computes ``lin``'s inference product: a large contiguous CPU output (at least
    ``_BLOCKED_PRODUCT_BYTES``), eager, and a B whose power is square roots or none. ``pow`` is left out: its vectorised
    kernel need not round as its scalar one, and a block moves which elements the vector loop's scalar tail takes. So
    are tensor subclasses, traced calls and functorch's wrapped tensors (``torch.func.vmap`` has no batching rule for
    the ``out=`` kernel the blocks write through)."""
    return (lin.is_cpu and isinstance(b, float) and b in (1.5, 1.25, 2.0)
            and lin.numel() * lin.element_size() >= _BLOCKED_PRODUCT_BYTES and lin.is_contiguous()
            and type(lin) is Tensor and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
            and not _is_functorch_wrapped(lin))


def _blocked_product_(lin: Tensor, reciprocal: Tensor, b: float) -> Tensor:
    """``|lin| * (1 / ||x||)``, :func:`_power_`'s roots and the product with ``lin``, for one block of rows at a time
    into one block-sized scratch tensor, the product written into ``lin`` (returned): the same kernels on the same
    elements (each kernel computes an element the same way in its vector loop and its scalar tail, so a block gives
    the bits of the whole tensor, as tests/test_blocked_inference_product.py checks; CPU float32 ``sqrt`` is not
    correctly rounded on every build, but it is consistent; ``dyn * lin`` and ``lin * dyn`` are one product), without the output-sized fresh tensor of :func:`_inference_product`. On a CPU a fresh tensor of
    megabytes is usually memory the allocator maps afresh, and its first pass pays a page fault per 4 kB (about 600
    us for 6 MB): in a process that only runs forwards, MiniLM's forward (16 x 64 tokens) took 0.93-0.99 of the
    time with its six 6 MB products blocked (docs/benchmarks.md, 2026-11-28 16:05 UTC). Where nothing faults, blocked
    and whole passes took the same time (the passes are not limited by memory here). ``reciprocal`` has ``lin``'s
    leading shape and a last dimension of 1."""
    units = lin.shape[-1]
    rows, factors = lin.view(-1, units), reciprocal.view(-1, 1)
    total = rows.shape[0]
    count = -(-lin.numel() * lin.element_size() // _PRODUCT_BLOCK_BYTES)
    step = -(-total // count)
    scratch = torch.empty((min(step, total), units), dtype=lin.dtype)
    for start in range(0, total, step):
        block = rows[start:start + step]
        part = scratch[:block.shape[0]]
        _power_(torch.abs(block, out=part).mul_(factors[start:start + step]), b)
        block.mul_(part)
    return lin


def inference_linear(x: Tensor, weight: Tensor, b: float, *, units_are_columns: bool = False) -> Tensor:
    """A B-cos linear layer without MaxOut where autograd records nothing (inference, evaluation), fused path:
    ``x @ unit_norm(w).T`` times ``|cos| ** (B - 1)`` (:func:`_inference_product`), ``b`` a float.

    The kernels of :func:`cached_unit_norm`, ``F.linear``, :func:`input_norm` and :func:`_inference_product`, in the same
    order on the same tensors (so the same values, bit for bit), written out in one function outside
    :func:`reuse_unit_weights`: at a small model's widths (128 tokens x 128 features) the Python of the nested
    helpers cost 2-4 % of a decoder's forward pass (thread CPU, measured on Qwen2, Mistral and ModernBERT at the
    bench_core family shape; docs/benchmarks.md, 2026-11-27 22:20 UTC). The weight cache takes the helper. Under
    autocast the float32 input is cast once for the layers reading it (:func:`_shared_cast`; autocast's own cast,
    the same bits).

    A float32 or float64 layer and input without autocast, the weight cache or the reference path (the common call)
    skip even the helpers' calls: nothing is cast there, so every dtype decision is taken, and the kernels run inline
    in the helpers' order (the weight's norm, its clamp and the division; ``F.linear``; ``||x||`` and ``1 / ||x||``,
    shared between the layers reading one input as :func:`input_norm` and :func:`_norm_reciprocal` share them;
    ``|lin|``, the product, :func:`_power_`'s roots, the product with ``lin``). In a forward pass each layer's Python
    runs once with cold caches, where those calls cost 3-3.5 % of a ModernBERT forward's thread time at the
    bench_core family shape (a loop over one layer hides most of it; docs/benchmarks.md, 2026-11-28 13:16 UTC)."""
    _require_pressure(b)
    dtype = weight.dtype
    # (the device type read without building a torch.device for a CPU weight: the check in 0.55 of the time,
    # docs/benchmarks.md, 2026-11-28 14:11 UTC)
    if (dtype in _PLAIN_FLOATS and x.dtype == dtype and not (_REUSE_UNIT_WEIGHTS or _REFERENCE_PATH)
            and not (dtype == torch.float32
                     and torch.is_autocast_enabled("cpu" if weight.is_cpu else weight.device.type))):
        view = weight.T if units_are_columns else weight
        lin = torch.nn.functional.linear(
            x, view / overflowed_norm_as_nan(torch.linalg.vector_norm(view, dim=1, keepdim=True)).clamp_min_(_norm_eps()))
        if b == 1.0:
            return lin
        # _derived_from's rule: shared only where nothing is recorded or traced, for a plain tensor with a version
        if (type(x) is Tensor and not torch.is_grad_enabled() and not x.is_inference()
                and not torch.compiler.is_compiling()):
            entry = getattr(_LAST_INPUT, "entry", None)
            if entry is None or entry[0]() is not x or entry[1] != x._version:
                entry = _LAST_INPUT.entry = (weakref.ref(x), x._version, {})
            derived = entry[2]
            norm = derived.get(("norm", -1))
            if norm is None:
                norm = derived[("norm", -1)] = overflowed_norm_as_nan(
                    torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True), _SQRT_NORM_EPS[dtype]))
            blocked = _blocks_the_product(lin, b)
            abs_cos = None if blocked else lin.abs()
            reciprocal = derived.get(("reciprocal", -1))
            if reciprocal is None:
                reciprocal = derived[("reciprocal", -1)] = norm.reciprocal()
            if blocked:
                return _blocked_product_(lin, reciprocal, b)
            abs_cos.mul_(reciprocal)
        else:
            norm = overflowed_norm_as_nan(torch.hypot(torch.linalg.vector_norm(x, dim=-1, keepdim=True),
                                                      _SQRT_NORM_EPS[dtype]))
            if _blocks_the_product(lin, b):
                return _blocked_product_(lin, norm.reciprocal(), b)
            abs_cos = lin.abs().mul_(norm.reciprocal())
        if b == 1.25:  # _power_'s branches for float32 / float64
            abs_cos.rsqrt_().rsqrt_()
        elif b == 1.5:
            abs_cos.sqrt_()
        elif b != 2.0:
            abs_cos.pow_(b - 1.0)
        return abs_cos.mul_(lin)
    cast = _matmul_cast(weight)
    if _REUSE_UNIT_WEIGHTS:
        unit = cached_unit_norm(weight, dim=1, transposed=units_are_columns, autocast=True)
    else:  # cached_unit_norm's branch without reuse
        unit = _unrecorded_unit_norm(weight.T if units_are_columns else weight, 1, cast)
    lin = torch.nn.functional.linear(_shared_cast(x, cast), unit)
    if b == 1.0:
        return lin
    return _inference_product(lin, input_norm(x), b, overwrite_lin=True)


_PLAIN_FLOATS = (torch.float32, torch.float64)


def explaining_linear(x: Tensor, weight: Tensor, b: float, *, units_are_columns: bool = False,
                      constant_units: slice | None = None) -> Tensor:
    """A B-cos linear layer without MaxOut in explanation mode when no parameter gradient is taken
    (:func:`~bcos_plugins.nn.dynamic.no_parameter_gradients`, as every explanation of the package runs) and
    ``x`` requires a gradient, fused path, ``b`` a float: one recorded matrix product with the unit-norm weight and
    one recorded product with the constant ``dyn`` (:func:`bcos_product`, ``constant_units`` as there).

    The kernels of :func:`cached_unit_norm`, :func:`input_norm`, ``F.linear`` and :func:`bcos_product`'s explaining
    branch, in the same order on the same tensors (the same values, bit for bit). A plain weight without
    :func:`reuse_unit_weights` and without autocast (every explanation's usual case) runs them all as one autograd
    node (:class:`_ExplainingLinear`, or :class:`_KeptUnitsProduct` for one block of kept units), whose forward runs
    without recording and whose backward is ``(grad * dyn) @ ŵ``: one ``Function.apply``, no ``no_grad`` blocks and
    no recorded in-place product, where the matrix product's node, the product's node and two ``no_grad`` blocks
    cost about 15 us of Python per layer at hidden 128 (docs/benchmarks.md#bench-core-method)."""
    _require_pressure(b)
    units = weight.shape[1] if units_are_columns else weight.shape[0]
    kept = None if constant_units is None else kept_unit_block(constant_units, units)
    if (not _REUSE_UNIT_WEIGHTS and type(weight) in _PLAIN_TENSORS
            and not torch.is_autocast_enabled(x.device.type)):
        view = weight.detach()  # (the raw weight, kept for the backward; its version counter still guards it)
        if units_are_columns:
            view = view.T
        if kept is not None:
            return _KeptUnitsProduct.apply(x, view, b, kept)
        return _ExplainingLinear.apply(x, view, b, constant_units)
    # a cached ŵ (resident anyway), autocast (whose casts the matrix product makes) or a tensor subclass
    with torch.no_grad():
        if _REUSE_UNIT_WEIGHTS:
            unit = cached_unit_norm(weight, dim=1, transposed=units_are_columns, autocast=True)
        else:  # cached_unit_norm's branch without reuse (_unrecorded_unit_norm's steps)
            view = weight.T if units_are_columns else weight
            unit = _stored_quotient(view, _unit_norms(view, 1).clamp_min_(_norm_eps()),
                                    _matmul_cast(weight) or view.dtype)
        x_norm = input_norm(x)
    if kept is not None and not torch.is_autocast_enabled(x.device.type):
        return _KeptUnitsProduct.apply(x, unit, b, kept, x_norm)
    lin = torch.nn.functional.linear(x, unit)
    with torch.no_grad():
        dyn = _lin_dtype_scale(lin, x_norm, b)
    if constant_units is None:
        return lin.mul_(dyn)
    return _PartlyConstantProduct.apply(lin, dyn, constant_units, True)


def _explaining_forward(x: Tensor, view: Tensor, b: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(clamped norms, ``ŵ``, ``lin``, ``dyn``) of :func:`explaining_linear`'s node forward, where autograd records
    nothing: :func:`_unrecorded_unit_norm`'s steps (the clamped norms kept), :func:`input_norm`, ``F.linear`` and
    :func:`_lin_dtype_scale`, the kernels of the layer's explaining forward in their order."""
    clamped = _unit_norms(view, 1).clamp_min_(_norm_eps())
    unit = _stored_quotient(view, clamped, view.dtype)
    x_norm = input_norm(x)
    lin = torch.nn.functional.linear(x, unit)
    return clamped, unit, lin, _lin_dtype_scale(lin, x_norm, b)


class _ExplainingLinear(torch.autograd.Function):
    """:func:`explaining_linear` for a plain weight (no cached ``ŵ``, no autocast) as one node: the forward is
    :func:`_explaining_forward`'s kernels and ``lin * dyn`` written into ``lin`` (the values of ``F.linear(x, ŵ)``
    followed by the recorded ``lin.mul_(dyn)``), the backward ``(grad * dyn) @ ŵ`` with ``constant`` units' gradient
    set to 0 first (:class:`_PartlyConstantProduct`'s), the same kernels as those two nodes' backward passes, so the
    same values.

    It keeps the raw weight (``view``, detached: resident anyway, and its version counter still guards it against
    in-place writes before the backward pass), the per-unit clamped norms (one number a unit) and ``dyn`` (the
    product's own saved factor), and recomputes ``ŵ = view / clamped`` in the backward pass with the forward's
    division (the same bits): ``F.linear`` saved its weight operand, a weight-sized copy per layer alive until the
    backward pass (34.3 MB of a MiniLM explanation at 16 x 64 tokens; docs/benchmarks.md#bench-core-method). The
    backward is plain tensor code (differentiable again, batched gradients). Written as ``forward(ctx, ...)`` without
    ``setup_context`` (see :class:`_BcosProduct`)."""

    @staticmethod
    def forward(ctx, x: Tensor, view: Tensor, b: float, constant: slice | None) -> Tensor:
        clamped, _, lin, dyn = _explaining_forward(x, view, b)
        ctx.constant = constant
        ctx.save_for_backward(view, clamped, dyn)
        return lin.mul_(dyn)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        view, clamped, dyn = ctx.saved_tensors
        # out of place: under batched gradients (autograd.grad(..., is_grads_batched=True)) grad_out is vmapped
        grad_lin = grad_out * dyn
        if ctx.constant is not None:
            grad_lin[..., ctx.constant] = 0.0
        with torch.no_grad():
            unit = _stored_quotient(view, clamped, view.dtype)
        return grad_lin @ unit, None, None, None


def kept_unit_block(constant: slice, units: int) -> slice | None:
    """The units outside ``constant`` as one slice when they are one block at either end (ModernBERT's fused q|k|v
    projection: the value units after the constant query and key), else ``None``."""
    start, stop, step = constant.indices(units)
    if step != 1 or start >= stop or (start > 0 and stop < units) or (start == 0 and stop == units):
        return None
    return slice(stop, units) if start == 0 else slice(0, start)


class _KeptUnitsProduct(torch.autograd.Function):
    """Explaining, a projection whose only non-constant units are one block ``kept``: :func:`explaining_linear`'s
    kernels (the same values) as one node whose backward is ``(grad * dyn)[..., kept] @ ŵ[kept]``. The constant units'
    gradient is 0, so their rows of the matrix product's backward are left out instead of multiplied as zeros (2/3 of
    ModernBERT's ``Wqkv``; helper-49 measured 183 -> 71 us per call at 4 x 32 tokens); adding those zero rows changes
    no bit of the sum on this CPU (tested). ``weight`` is the raw weight (``x_norm`` left out: the forward computes
    ŵ and ``||x||`` itself, :func:`_explaining_forward`) or, with ``x_norm`` (under :func:`reuse_unit_weights`), the
    unit-norm weight itself. Written as ``forward(ctx, ...)`` without ``setup_context`` (see :class:`_BcosProduct`);
    the backward is plain tensor code (differentiable again, batched gradients)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, b: float, kept: slice, x_norm: Tensor | None = None) -> Tensor:
        if x_norm is None:
            _, unit, lin, dyn = _explaining_forward(x, weight, b)
        else:
            unit, lin = weight, torch.nn.functional.linear(x, weight)
            dyn = _lin_dtype_scale(lin, x_norm, b)
        ctx.kept = kept
        ctx.save_for_backward(dyn[..., kept], unit[kept])
        return lin.mul_(dyn)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        dyn_kept, unit_kept = ctx.saved_tensors
        return (grad_out[..., ctx.kept] * dyn_kept) @ unit_kept, None, None, None, None


class _BcosProduct(torch.autograd.Function):
    """``out = |lin / ||x|| | ** (B - 1) * lin`` as one autograd node for training (module docstring).

    Gradients, with ``dyn = max(|cos|, floor) ** (B - 1)`` and ``active`` where ``|cos| > floor``: ``d out / d
    lin = B dyn`` where active (the product rule collapses: ``lin d dyn / d lin = (B - 1) dyn``), ``dyn``
    elsewhere; ``d out / d ||x|| = -(B - 1) out / ||x||`` where active, summed over the units that share the
    norm. No negative power of ``|cos|`` appears, so zero inputs keep finite gradients in any dtype.
    Explaining (``dyn`` a constant) needs no Function: :func:`bcos_product` records one plain product.

    Written as ``forward(ctx, ...)`` without ``setup_context``: with one, torch's ``Function.apply`` binds the
    arguments through ``inspect.signature`` on every call (20-30 us, about 4x the element-wise product of a 128 x
    128 input; docs/benchmarks.md, 2026-11-28 14:04 UTC).
    """

    @staticmethod
    def forward(ctx, lin: Tensor, x_norm: Tensor, b: float | Tensor) -> Tensor:
        dyn = _lin_dtype_scale(lin, x_norm, b)
        # dyn is recomputed in the backward pass, so the product is written into it
        if isinstance(b, Tensor):
            ctx.save_for_backward(lin, x_norm, b)
        else:
            ctx.b = b
            ctx.save_for_backward(lin, x_norm)
        return dyn.mul_(lin)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        # (a BcosConv2d, a MaxOut layer: a second derivative failed inside torch, in the second backward pass, with
        # "modified by an inplace operation", the gradient written into in place below)
        _refuse_second_derivative("product's", "writes the gradient into its own buffers in place")
        lin, x_norm, *b_tensor = ctx.saved_tensors
        b = b_tensor[0] if b_tensor else ctx.b
        grad_lin, grad_norm = _scale_backward(grad_out, [*_scale_from_lin(lin, x_norm, b)], x_norm, b,
                                              ctx.needs_input_grad[1], lin=lin)
        return grad_lin.to(lin.dtype), grad_norm, None


def _refuse_second_derivative(what: str, why: str) -> None:
    """Refuse a backward pass that the engine records (``create_graph=True``) through a training B-cos node whose
    backward is not differentiable again (:class:`BcosLinearNode`, :class:`_BcosProduct`), naming the one path that
    is: the reference path's step-by-step maths."""
    if torch.is_grad_enabled():  # the engine records the backward pass: create_graph=True
        raise argument_error(
            "create_graph", f"a training B-cos {what} backward pass cannot be differentiated again (it {why})",
            "take second derivatives inside bcos_plugins.nn.reference_path(), whose step-by-step maths autograd "
            "differentiates twice", kind=BcosRuntimeError)


def _scale_from_lin(lin: Tensor, x_norm: Tensor, b: float | Tensor) -> tuple[Tensor, Tensor]:
    """The forward's ``dyn`` (bit for bit: the same steps) and where ``|cos| > floor`` (the clamp left it)."""
    abs_cos = _abs_cos(lin, x_norm)
    active = _above(abs_cos, _cos_floor())
    return _floored_power_(abs_cos, b), active


def _above(t: Tensor, threshold: float) -> Tensor:
    """``1.0`` where ``t > threshold``, else ``0.0``, in ``t``'s dtype or float32 if that is wider (the mask
    becomes the factor ``1 + (B - 1) mask``, and bfloat16 would round B = 1.1 to 1.1016): a float mask
    multiplies in one vectorised pass, where ``torch.where`` and products with a bool mask cost 5-6x that on
    a CPU (docs/benchmarks.md, 2026-11-28 14:04 UTC)."""
    return torch.gt(t, threshold, out=torch.empty_like(t, dtype=at_least_float32(t.dtype)))


def _scale_from_out(out: Tensor, x_norm: Tensor, b: float) -> tuple[Tensor, Tensor]:
    """``dyn`` and where ``|cos| > floor``, recovered from the layer's output ``out = dyn * lin``.

    ``|out| / ||x|| = |cos| ** B`` where ``|cos| > floor`` and at most ``floor ** B`` elsewhere, so ``dyn =
    max(|out| / ||x||, floor ** B) ** ((B - 1) / B)`` in both cases. As precise as ``out`` itself: its
    rounding error, divided by B, plus that of the power. Only where ``out`` is a normal number of its dtype
    (:func:`scale_recoverable`). Half-precision ``out`` is widened to float32 (one rounding of ``dyn`` fewer
    than the forward's, which computes it in bfloat16 for bfloat16).
    """
    wide = torch.float32 if out.dtype in HALF_DTYPES else out.dtype
    ratio = out.to(wide).abs_() if out.dtype != wide else out.abs()
    ratio = ratio.mul_(x_norm.reciprocal())
    floor = _cos_floor()**b
    active = _above(ratio, floor)
    dyn = ratio.clamp_min_(floor)
    # (pow rather than exp(log(.) * p), which was no faster on a CPU (0.84-1.15 of pow's time; docs/benchmarks.md,
    # 2026-11-28 14:04 UTC) and loses digits the weight gradient's cancellation through the normalisation shows:
    # fused and reference then differ by 1e-5 in float32)
    return (dyn.sqrt_() if b == 2.0 else dyn.pow_((b - 1.0) / b)), active


def _scale_backward(grad_out: Tensor, scale: list[Tensor], x_norm: Tensor, b: float | Tensor,
                    norm_grad: bool, *, lin: Tensor | None = None,
                    out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Gradients of ``out = dyn * lin`` wrt ``lin`` (in ``dyn``'s dtype) and, if ``norm_grad``, ``||x||``
    (``None`` otherwise), from the forward's ``dyn`` and ``active`` (a 0/1 mask, :func:`_above`), handed over
    as the list ``scale = [dyn, active]`` (emptied here), and one of ``lin`` or ``out``; writes into ``active``.

    The list hands over the only references, so both are written into and freed here, not held by the caller
    until the node returns. With ``out`` and an ordinary incoming gradient (:func:`_plain_gradient`) the gradient
    is written into ``dyn`` and the norm's product into ``active``: two output-sized tensors allocated in all
    (the two recovered ones), where the out-of-place steps take three (a MiniLM training step's peak, 16 x 64:
    197.7 -> 189.4 -> 184.2 MB, docs/benchmarks.md, 2026-11-28 15:00 and 16:40 UTC). Otherwise (``lin``, batched
    gradients, ``torch.compile``) out of place, ``dyn`` freed once its product is taken. The same products either
    way: the same bits.

    ``d out / d lin = B dyn`` where active (the product rule collapses: ``lin d dyn / d lin = (B - 1) dyn``),
    ``dyn`` elsewhere; ``d out / d ||x|| = -(B - 1) dyn lin / ||x|| = -(B - 1) out / ||x||`` where active,
    summed over the units that share the norm. No negative power of ``|cos|`` appears, so zero inputs keep
    finite gradients in any dtype.
    """
    dyn, active = scale
    scale.clear()
    dtype = dyn.dtype
    grad = grad_out.to(dtype)  # (once: both products below take it)
    if (out is not None and active.dtype == dtype and not isinstance(b, Tensor) and not torch.compiler.is_compiling()
            and _plain_gradient(grad)):
        # recovered from out: the same products, in place into the two fresh tensors.
        # dyn's buffer becomes the gradient, active's the norm's product, which is taken last: two output-sized
        # tensors allocated here, not three (the mask, grad * dyn, grad * out)
        grad_dyn_lin = dyn.mul_(grad)
        del dyn
        grad_dyn_lin.addcmul_(grad_dyn_lin, active, value=b - 1.0)  # times B where active
        grad_norm = None
        if norm_grad:
            # (active * out) * grad: the factor 1 leaves out as it is, so the same values as (grad * out) * active
            per_unit = active.mul_(_widening(out, dtype)).mul_(grad)
            del active
            wide = torch.float64 if x_norm.dtype == torch.float64 else torch.float32  # (no dispatched op)
            grad_norm = per_unit.sum_to_size(x_norm.shape).to(wide)
            grad_norm = (grad_norm * (1.0 - b) / x_norm.to(wide)).to(x_norm.dtype)
        return grad_dyn_lin, grad_norm
    # out of place: under batched gradients (autograd.grad(..., is_grads_batched=True)) grad_out is vmapped, and
    # an in-place product into the unbatched dyn is refused
    grad_dyn_lin = grad * dyn
    del dyn
    grad_norm = None
    if norm_grad:
        per_unit = grad_dyn_lin * _widening(lin, dtype) if out is None else grad * _widening(out, dtype)
        wide = torch.float64 if x_norm.dtype == torch.float64 else torch.float32  # (no dispatched op)
        grad_norm = per_unit.mul_(active).sum_to_size(x_norm.shape).to(wide)
        grad_norm = (grad_norm * (1.0 - b) / x_norm.to(wide)).to(x_norm.dtype)
    if isinstance(b, Tensor) or active.dtype != grad_dyn_lin.dtype:
        return grad_dyn_lin.mul_(active.mul_(b - 1.0).add_(1.0)), grad_norm  # times B where active
    # times B where active in one kernel, g + (B - 1) g [active], instead of building the factor first (three)
    return grad_dyn_lin.addcmul_(grad_dyn_lin, active, value=b - 1.0), grad_norm


def _plain_gradient(grad: Tensor) -> bool:
    """Whether an incoming gradient is an ordinary tensor, whose product may be written into an unbatched one: not
    a batched gradient (``autograd.grad(..., is_grads_batched=True)`` runs the backward under the legacy vmap,
    ``torch.func.vmap`` under functorch's), another ``torch.func`` wrapper or a tensor subclass."""
    return type(grad) is Tensor and not _is_functorch_wrapped(grad) and not _is_legacy_batched(grad)


# (narrower, wider) dtype pairs whose widening is exact: a kernel with operands of both computes in the wider one
_EXACT_WIDENINGS = {(torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.bfloat16, torch.float64),
                    (torch.float16, torch.float64), (torch.float32, torch.float64)}


def _widening(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` as an operand of an element-wise op computed in ``dtype``: ``t`` itself where the op's kernel widens it
    on load (exact: the same values as a copy in ``dtype``, without the copy's kernel), else ``t.to(dtype)``."""
    return t if t.dtype == dtype or (t.dtype, dtype) in _EXACT_WIDENINGS else t.to(dtype)


def scale_recoverable(dtype: torch.dtype, b: float | Tensor) -> bool:
    """Whether :func:`_scale_from_out` recovers ``dyn`` to ``dtype``'s precision at this B.

    Every unit with ``|cos| > floor`` has ``|out| = |cos| ** B ||x|| > COS_FLOOR ** B * sqrt(NORM_EPS)``
    (``||x||`` carries the epsilon), which must be a normal number of ``dtype``: below that ``out`` is
    subnormal or 0 and ``dyn`` loses its digits (float32 at B = 4 and ``|cos| = 2e-12``: ``out`` underflows to
    0 although ``dyn = 8e-36`` is a normal number, and the gradient would come out 32x too small). float32 and
    bfloat16: B <= 2.9; float64: every B up to :data:`~bcos_plugins.nn.linear.MAX_B`; float16: never. A
    tensor B (a layer's buffer inside a compiled graph) has no value while the graph is built: not recoverable.
    """
    return not isinstance(b, Tensor) and _cos_floor()**b * _norm_eps()**0.5 >= torch.finfo(dtype).tiny


def _without_autocast(device_type: str):
    """The backward of :class:`BcosLinearNode` computes in the dtypes its forward chose, also when the caller runs
    the backward pass inside ``torch.autocast``."""
    return torch.autocast(device_type, enabled=False) if torch.is_autocast_enabled(device_type) else nullcontext()


class BcosLinearNode(torch.autograd.Function):
    """A B-cos linear layer without MaxOut, ``ŵ = w / ||w||``, ``lin = x @ ŵ.T``, ``out = dyn * lin``, as one
    autograd node for training (docs/api/nn.md#fused-and-reference-kernels).

    Saved for the backward pass: ``x`` (only if the weight needs a gradient), the weight parameter itself,
    ``||w||`` per unit and ``||x||`` per row (tiny), and ``out``, the output, which the next operation
    usually keeps as its own input anyway (the next linear layer, GELU, attention's query / key / value).
    Not ``ŵ`` (a weight-sized copy per layer, recomputed in the backward: one reduction-free division) and not
    ``lin`` (``dyn`` is recovered from ``out``, :func:`_scale_from_out`). Where that recovery would lose
    digits (:func:`scale_recoverable`: float16, float32 / bfloat16 above B = 2.9, B as a tensor under
    ``torch.compile``) it keeps ``lin`` instead, as :class:`_BcosProduct` does.

    Gradients: those of :func:`_scale_backward` for the product, then ``d / dx = grad_lin @ ŵ`` and, through
    the normalisation, ``d / dw = (G - ŵ <G, ŵ>) / ||w||`` per unit row with ``G = grad_lin.T @ x`` (``G /
    max(||w||, eps)`` for a row whose norm is below the clamp, whose norm then is a constant). The matrix
    products run in ``lin``'s dtype (bfloat16 under autocast, with the same casts of ``x`` and ``ŵ`` as
    autocast's), the normalisation's gradient in float32 for half-precision weights. ``x_norm`` is ``None``
    for B = 1 (no scale).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, x_norm: Tensor | None, b: float | Tensor,
                units_are_columns: bool, own_norm: bool = False) -> Tensor:
        if own_norm:
            # not shared with other layers reading x, as input_norm shares it without autograd: training writes
            # through x.data between calls (torch.autograd.gradcheck perturbs its inputs so) would go unseen
            x_norm = _input_norm(x, -1)
        ctx.own_norm = own_norm
        view = weight.T if units_are_columns else weight
        norms = _unit_norms(view, 1)
        # the same steps as unit_norm and bcos_product: the values equal the unfused forward's bit for bit (the
        # unit-norm weight stored in the matrix product's dtype, as autocast would cast it)
        lin = torch.nn.functional.linear(
            x, _stored_quotient(view, norms.clamp_min(_norm_eps()), _matmul_cast(weight) or view.dtype))
        ctx.units_are_columns = units_are_columns
        ctx.x_dtype = x.dtype
        ctx.keeps_lin = x_norm is not None and not scale_recoverable(lin.dtype, b)
        if x_norm is None:
            out = lin
        else:
            dyn = _lin_dtype_scale(lin, x_norm, b)
            out = dyn * lin if ctx.keeps_lin else dyn.mul_(lin)
        if not isinstance(b, Tensor):
            ctx.b, b = b, None
        kept = None if x_norm is None else lin if ctx.keeps_lin else out
        keeps_x = ctx.needs_input_grad[1] or (own_norm and ctx.needs_input_grad[0])
        ctx.save_for_backward(x if keeps_x else None, weight, norms, kept, x_norm, b)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        _refuse_second_derivative("linear layer's", "recomputes the unit-norm weight and the scale without "
                                  "recording them, so a second derivative would silently miss their terms")
        x, weight, norms, kept, x_norm, b_tensor = ctx.saved_tensors
        b = ctx.b if b_tensor is None else b_tensor
        matmul_dtype = grad_out.dtype  # lin's
        with _without_autocast(weight.device.type):
            grad_norm = None
            if x_norm is None:
                grad_lin = grad_out
            else:
                scale = [*(_scale_from_lin(kept, x_norm, b) if ctx.keeps_lin else _scale_from_out(kept, x_norm, b))]
                grad_lin, grad_norm = _scale_backward(
                    grad_out, scale, x_norm, b, ctx.needs_input_grad[0 if ctx.own_norm else 2],
                    **{"lin" if ctx.keeps_lin else "out": kept})
                grad_lin = grad_lin.to(matmul_dtype)
            view = weight.T if ctx.units_are_columns else weight
            clamped = norms.clamp_min(_norm_eps())
            # the forward's ŵ, divided once: half-precision weights are divided in float32 (the normalisation's
            # gradient below wants that quotient) and rounded to the weight's dtype as the forward rounded it
            wide_unit = _divided_by_norm(view, clamped, keep_wide=True)
            unit = wide_unit.to(view.dtype)
            grad_x = grad_weight = None
            # the weight's gradient first: its weight-sized temporaries are then freed before the input's gradient
            # (input-sized) is allocated, not alive beside it
            if ctx.needs_input_grad[1]:
                rows = grad_lin.reshape(-1, grad_lin.shape[-1])
                inputs = x.reshape(-1, x.shape[-1]).to(matmul_dtype)
                # G in the weight's own layout, so that the gradient comes out contiguous like the weight
                grad_unit = (inputs.T @ rows).T if ctx.units_are_columns else rows.T @ inputs
                grad_unit = _widening(grad_unit, wide_unit.dtype)
                radial = (grad_unit * wide_unit).sum(dim=1, keepdim=True)
                radial = radial.masked_fill_(norms < _norm_eps(), 0.0)  # a clamped norm is a constant
                # into G, a fresh tensor, where it has the quotient's dtype (a half-precision G: out of place, in
                # float32)
                grad_view = (grad_unit.addcmul_(wide_unit, radial, value=-1.0) if grad_unit.dtype == wide_unit.dtype
                             else torch.addcmul(grad_unit, wide_unit, radial, value=-1.0)).div_(clamped)
                grad_weight = (grad_view.T if ctx.units_are_columns else grad_view).to(weight.dtype)
            if ctx.needs_input_grad[0]:
                grad_x = grad_lin @ unit.to(matmul_dtype)
                if ctx.own_norm and grad_norm is not None:
                    # the norm's own gradient, d ||x|| / dx = x / ||x|| (its epsilon included), added in the same
                    # kernel: autograd's norm nodes took seven (the hypot's and the norm's steps and the sum); into
                    # the fresh product where that has x's dtype (one rounding to it either way), else (bfloat16
                    # under autocast for a float32 x) out of place in the wider dtype, as before
                    grad_x = (grad_x.addcmul_(x, grad_norm / x_norm) if grad_x.dtype == ctx.x_dtype
                              else torch.addcmul(grad_x, x, grad_norm / x_norm))
                grad_x = grad_x.to(ctx.x_dtype)
        return grad_x, grad_weight, None if ctx.own_norm else grad_norm, None, None, None


def bcos_linear(x: Tensor, weight: Tensor, x_norm: Tensor | None, b: float | Tensor, *,
                units_are_columns: bool = False, own_norm: bool = False) -> Tensor:
    """A B-cos linear layer's output ``dyn * (x @ ŵ.T)`` for training, as one autograd node that keeps neither
    the unit-norm weight nor the pre-scale output for the backward pass (:class:`BcosLinearNode`).

    ``weight`` is the raw weight, ``(units, d_in)`` or, with ``units_are_columns``, ``(d_in, units)``
    (GPT-2's ``Conv1D``); ``x_norm`` is :func:`input_norm` of ``x``, ``None`` for B = 1; ``b`` may be a 0-d
    tensor (a compiled graph). No MaxOut, no explanation mode (``dyn`` is differentiated), fused path only:
    :class:`~bcos_plugins.nn.BcosLinear` calls it when it trains and runs the unfused steps otherwise.
    Training drops the weight's cached unit-norm copies, as :func:`cached_unit_norm` does. Its backward pass is
    not differentiable again: a backward pass with ``create_graph=True`` through it raises a
    :class:`~bcos_plugins.errors.BcosRuntimeError` naming :func:`reference_path`, which gives second derivatives.

    ``own_norm`` (with ``x_norm=None``): the node computes ``||x||`` itself, without recording it, and adds the
    norm's gradient ``x * g / ||x||`` to the input gradient in one kernel, where autograd's nodes for
    :func:`input_norm` take seven per layer (the same gradient to rounding). :class:`~bcos_plugins.nn.BcosLinear`
    trains this way.
    """
    _require_pressure(b)
    if own_norm and x_norm is not None:
        raise argument_error("x_norm", "must be None with own_norm=True (the node computes ||x|| itself)",
                             "pass x_norm=None, or own_norm=False with x_norm=input_norm(x)", kind=BcosValueError)
    if weight.requires_grad and not torch.compiler.is_compiling():
        _forget_unit_norm(weight)
    return BcosLinearNode.apply(x, weight, x_norm, b, units_are_columns, own_norm)


def bcos_product(lin: Tensor, x_norm: Tensor, b: float | Tensor, explaining: bool, *,
                 overwrite_lin: bool = False, constant_units: slice | None = None) -> Tensor:
    """``dyn * lin`` with ``dyn = |lin / ||x|| | ** (B - 1)`` (``dyn`` a constant for autograd when
    ``explaining``), through the fused path or, inside :func:`reference_path`, the reference one.

    ``x_norm`` broadcasts against ``lin`` (``(..., 1)`` for a linear layer, ``(batch, 1, h, w)`` for a
    convolution). The forward values are the same whether ``explaining`` or not; only the gradient differs.
    Without autograd recording (inference) the fused path leaves out the floor on ``|cos|``, which only
    derivatives need (:func:`_inference_product`). ``b`` may be a 0-d tensor (a layer's ``bcos_b`` inside a
    compiled graph; fused path only).

    ``overwrite_lin``: the caller hands ``lin`` over (a fresh tensor that nothing else reads and that no autograd
    node saved for its backward pass, such as a matrix product's output): the fused path may then write the
    explaining product into it, one output-sized allocation fewer per layer.

    ``constant_units`` (explaining only): the units of the last axis whose outputs are constants too (the query
    and key part of a fused q|k|v projection): their gradient is 0, as if they were detached.

    Explaining, the fused path computes ``dyn`` without recording and records one plain product with it, whose
    backward multiplies by the saved ``dyn`` (no ``autograd.Function``, whose call cost about 55 us of Python at
    hidden 128, docs/benchmarks.md, 2026-11-27 18:33 UTC); with ``constant_units`` that product is
    :class:`_PartlyConstantProduct`. Training runs :class:`_BcosProduct`.
    """
    # b is checked once on each path: by bcos_scale and explaining_scale where they compute dyn, here on the others
    if _REFERENCE_PATH:
        if explaining:
            with torch.no_grad():
                dyn = bcos_scale(lin, x_norm, b)
            out = dyn * lin
            return out if constant_units is None else detach_units(out, constant_units)
        return bcos_scale(lin, x_norm, b) * lin
    if not (torch.is_grad_enabled() and (lin.requires_grad or x_norm.requires_grad)):
        # nothing to record (and no unit to detach): the product without Function.apply's per-call cost
        _require_pressure(b)
        return _inference_product(lin, x_norm, b)
    if explaining:
        dyn = explaining_scale(lin, x_norm, b)
        if constant_units is None:
            return lin.mul_(dyn) if overwrite_lin else lin * dyn
        if torch.compiler.is_compiling() or functorch_transforms_active():
            # (inductor fuses the slices and the concatenation; torch.func takes no Function without setup_context)
            return detach_units(lin * dyn, constant_units)
        return _PartlyConstantProduct.apply(lin, dyn, constant_units, overwrite_lin)
    if functorch_transforms_active():
        # torch.func's transforms (grad, jacrev, vmap of a training call) take no autograd.Function without
        # setup_context (which _BcosProduct leaves out for its per-call cost): torch's "must override the
        # setup_context staticmethod" was all a call got. The step-by-step maths, the reference path's
        return bcos_scale(lin, x_norm, b) * lin
    _require_pressure(b)
    return _BcosProduct.apply(lin, x_norm, b)


def explaining_scale(lin: Tensor, x_norm: Tensor, b: float | Tensor) -> Tensor:
    """The constant ``dyn`` that the fused explaining product multiplies ``lin`` by (``|cos|`` floored, rounded to
    ``lin``'s dtype), computed without recording; a fresh tensor.

    For :func:`bcos_product` and for a layer whose whole output is a constant while explaining (a query or key
    projection), which runs its product without recording at all and gets the same values."""
    _require_pressure(b)
    with torch.no_grad():
        return _lin_dtype_scale(lin, x_norm, b)


class _PartlyConstantProduct(torch.autograd.Function):
    """The explaining product ``lin * dyn`` (``dyn`` constant) whose ``constant`` units are constants as well:
    the backward is ``grad * dyn`` with those units' gradient set to 0.

    The same gradient as detaching the units' slice of the product and concatenating the pieces again
    (:func:`detach_units`), without the copy of the output that the concatenation makes nor the zero-filled,
    output-sized gradient of each slice (ModernBERT's fused q|k|v projection, 128 tokens, 128 -> 384, explaining
    forward and backward: 1080 us with the concatenation, 916 us with this node; docs/benchmarks.md, 2026-11-27
    22:20 UTC).
    Differentiable again (``create_graph=True``): the backward is plain tensor code. Written as
    ``forward(ctx, ...)`` without ``setup_context`` (see :class:`_BcosProduct`)."""

    @staticmethod
    def forward(ctx, lin: Tensor, dyn: Tensor, constant: slice, overwrite_lin: bool) -> Tensor:
        ctx.constant = constant
        ctx.save_for_backward(dyn)
        if overwrite_lin:
            ctx.mark_dirty(lin)
            return lin.mul_(dyn)
        return lin * dyn

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (dyn,) = ctx.saved_tensors
        # out of place: under batched gradients (autograd.grad(..., is_grads_batched=True)) grad_out is vmapped
        grad_lin = grad_out * dyn
        grad_lin[..., ctx.constant] = 0.0
        return grad_lin, None, None, None


def detach_units(t: Tensor, part: slice) -> Tensor:
    """``t`` with the units ``part`` of its last axis detached (a constant for autograd), the others unchanged."""
    if part == slice(None):
        return t.detach()
    n = t.shape[-1]
    start, stop, step = part.indices(n)
    if step != 1:
        # every step-th unit only: the three pieces below took start:stop whole (slice(0, n, 2) detached every unit,
        # where the fused explaining product zeroed the gradient of every other one), silently
        constant = torch.zeros(n, dtype=torch.bool, device=t.device)
        constant[torch.arange(start, stop, step, device=t.device)] = True  # (a tensor's slice takes no negative step)
        return torch.where(constant, t.detach(), t)
    return torch.cat([t[..., :start], t[..., start:stop].detach(), t[..., stop:]], dim=-1)


def using_reference_path() -> bool:
    """Whether the B-cos layers run the step-by-step reference implementation (see :func:`reference_path`)."""
    return _REFERENCE_PATH


@reusable_context  # (entered again: torch.no_grad()'s objects can be)
def reference_path(enabled: bool = True) -> Iterator[None]:
    r"""Run every B-cos layer (linear, convolution, LayerNorm, activations) through the reference
    implementation, the maths written step by step and differentiated by autograd, while the block runs.

    For tests and debugging: the fused default computes the same values with fewer kernels and less saved
    memory (docs/api/nn.md). Process-wide (not per thread), and read when a forward pass runs, so a
    ``torch.compile``\ d model recompiles when it changes.
    """
    with _process_switch("_REFERENCE_PATH", enabled, "reference_path"):
        yield


def max_out(lin: Tensor, m: int) -> Tensor:
    """Maximum over groups of ``m`` consecutive units of the last axis (identity for ``m == 1``)."""
    if type(m) is not int or m < 1:  # check_features on a Python int; anything else on the slow path
        _require_group_size(m)
    return lin if m == 1 else lin.unflatten(-1, (-1, m)).amax(dim=-1)


def _require_pressure(b) -> None:
    """:func:`check_b` for the public functions that take ``b``, at the cost of a type check and two comparisons for
    a Python float in [1, MAX_B] (NaN fails the range). Anything else takes
    the validator, except a 0-d tensor (a layer's ``bcos_b``) and anything under ``torch.compile`` (whose dynamo makes
    a float it reads a SymFloat), which are left to the layer that checked its B when it was built: reading a tensor
    here would cost a device sync per call."""
    if (type(b) is not float or not 1.0 <= b <= MAX_B) and not (isinstance(b, Tensor)
                                                             or torch.compiler.is_compiling()):
        check_b(b)


def _require_group_size(m) -> None:
    """:func:`check_features` for :func:`max_out`'s ``m`` (left to the layer under ``torch.compile``, as there)."""
    if not torch.compiler.is_compiling():
        check_features("m", m)


MAX_B = 10.0
"""Largest accepted alignment pressure. A B-cos layer scales its output by ``|cos|^(B - 1)``; the papers use
B <= 2.5, and above 10 even a well-aligned input (``|cos| = 0.5``) is scaled by less than 0.002 per layer, so a
few layers drive every output to 0 (an all-zero model whose explanation is trivially "complete")."""


def check_b(b, name: str = "b") -> float:
    """Validate the alignment pressure B: a finite real number in [1, :data:`MAX_B`]; returns it as a float.

    ``name`` is the argument named in the error (``"b"``, ``"start"``, ``"config.bcos['b']"``, ...).
    """
    fix = (f"{name} must be >= 1 (b=1 is a plain bias-free linear layer) and at most {MAX_B:g} (above it every "
           "B-cos output is scaled by |cos|^(b-1), which drives the model to all zeros); use 1.25-1.5 for "
           "classifiers and 1.1 for decoders")
    if isinstance(b, Tensor) and b.numel() == 1 and not b.is_complex():
        b = b.item()
    if isinstance(b, bool) or not isinstance(b, numbers.Real):
        raise argument_error(name, f"must be a real number, got {type(b).__name__} {b!r}", fix,
                             kind=BcosTypeError)
    value = float(b)
    if not math.isfinite(value) or not 1.0 <= value <= MAX_B:
        raise argument_error(name, f"must be a finite number in [1, {MAX_B:g}], got {value!r}", fix)
    return value


def check_features(name: str, value) -> int:
    """A layer size or MaxOut count: a positive integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise argument_error(name, f"must be a positive integer, got {value!r}",
                             "pass the number of features/units (max_out=1 disables MaxOut)",
                             kind=BcosTypeError if not isinstance(value, numbers.Integral) else BcosValueError)
    return int(value)
