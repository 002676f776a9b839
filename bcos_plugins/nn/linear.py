"""B-cos linear layers: ``BcosLinear`` (from ``nn.Linear``) and ``BcosConv1D`` (from GPT-2's ``Conv1D``).

Maths (unit-norm weight rows ``ŵ``, no bias, MaxOut over groups of ``M`` consecutive units, ``B >= 1``)::

    lin = x @ ŵ.T                       then max over each group of M units if M > 1
    dyn = |lin / ||x|| | ** (B - 1)      (= |cos(x, ŵ)| ** (B - 1))
    out = dyn * lin

``dyn`` is the dynamic weight: constant for autograd in explanation mode, so that ``x · d out / dx = out``.
``||x||`` carries a small epsilon (a zero input, e.g. padding, gives 0, never NaN), and ``|cos|`` is
clamped from below before the power so that the gradient of ``|cos| ** (B - 1)`` stays finite at 0 for
``1 < B < 2`` (the clamp changes outputs only where ``|lin| < 1e-12 ||x||``, i.e. by less than 1e-12 ||x||;
inference, which has no gradient, leaves it out).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .._checks import require_bool
from ..errors import BcosTypeError, BcosValueError, argument_error
from . import triton_linear as _triton_linear
from .dynamic import DynamicWeightModule, parameter_gradients_unused
from .functional import (
    COS_FLOOR,
    MAX_B,
    NORM_EPS,
    bcos_linear,
    bcos_product,
    cached_unit_norm,
    check_b,
    check_features,
    detach_units,
    explaining_linear,
    explaining_scale,
    functorch_transforms_active,
    inference_linear,
    input_norm,
    max_out,
    using_reference_path,
)

__all__ = ["AlignmentPressure", "BcosLinear", "BcosConv1D", "MAX_B", "check_b", "recorded_pressure"]

_NORM_EPS = NORM_EPS  # kept: other layers import these names
_COS_FLOOR = COS_FLOOR


def recorded_pressure(stored: Tensor, *recorded: float) -> float:
    """The B a stored ``bcos_b`` holds: the first of ``recorded`` whose rounding to float32 (or to ``stored``'s own
    narrower dtype) ``stored`` is, else ``stored``'s value.

    MPS has no float64, so a B-cos model saved there stores every B in float32: B = 1.1 is stored as
    1.100000023841858, and a load read that as the layer's B, which then ran another function than the one trained
    (and a later save stored the rounding as its B). A float64 tensor holding that rounding is the same float32 save,
    widened by transformers' loading (which casts every tensor to the dtype of the one it replaces). The one rule of
    :func:`~bcos_plugins.persistence.load_bcos_model` (``recorded`` is ``config.bcos['b']``) and of
    :class:`AlignmentPressure`'s loading (the layer's B and the B it was built with)."""
    value = stored.item()
    if not stored.is_floating_point() or value in recorded:
        return value
    narrow = {torch.float32} | ({stored.dtype} if stored.dtype != torch.float64 else set())
    for b in recorded:
        if any(torch.tensor(b, dtype=dtype).item() == value for dtype in narrow):
            return b
    return value


def check_no_bias(bias) -> None:
    """``bias`` of a B-cos layer (kept so that ``nn.Linear`` / ``nn.Conv2d`` calls carry over): ``False`` only.

    A bias adds a term that is not ``W(x) x``, so the explanation ``W(x) x`` would no longer sum to the output. The
    flag is read by the package's one rule for flags (:func:`~bcos_plugins._checks.require_bool`: the Python bools
    only, NumPy's refused naming ``bool(bias)``), then ``True`` is refused saying why.
    """
    if require_bool("bias", bias, fix="Pass bias=False or leave it out (B-cos layers have no bias)"):
        raise argument_error("bias", "B-cos layers have no bias, got bias=True: a bias adds a term outside W(x)x, "
                             "so the explanation W(x)x would no longer sum to the output",
                             "Pass bias=False or leave it out (from_linear drops a pretrained bias)",
                             kind=BcosValueError)


def check_constant_outputs(value, units: int | None = None) -> slice | None:
    """``constant_outputs`` of :class:`BcosLinear`: ``None`` or a slice of integers (or ``None``) with a non-zero step.
    A list, an int or a float bound failed at the first explaining forward pass, inside the layer. Given the layer's
    ``units`` (output features), a slice with a negative step is returned as the slice of the same units with a
    positive step (``slice(4, 1, -1)`` of 6 units as ``slice(2, 5, 1)``): a tensor takes no negative step, and the
    explaining product's backward failed with torch's "step must be greater than zero" (B != 1) where the reference
    path held those units constant."""
    if value is None:
        return None
    fix = "Pass a slice of the output units, e.g. slice(0, 2 * hidden) for a fused q|k|v projection, or None"
    if not isinstance(value, slice):
        raise argument_error("constant_outputs", f"must be a slice or None, got {type(value).__name__} {value!r}",
                             fix, kind=BcosTypeError)
    try:
        value.indices(1)
    except (TypeError, ValueError) as error:
        raise argument_error("constant_outputs", f"{value!r} is no slice of units ({error})", fix,
                             kind=BcosTypeError if isinstance(error, TypeError) else BcosValueError) from None
    if units is not None and value.step is not None and value.step < 0:
        held = range(units)[value]
        return slice(held[-1], held[0] + 1, -held.step) if held else slice(0, 0)
    return value


class AlignmentPressure(DynamicWeightModule):
    """Base of the B-cos layers: the alignment pressure B, stored in every checkpoint.

    B is a persistent float64 buffer ``bcos_b`` (so ``state_dict`` / ``save_pretrained`` / Trainer
    checkpoints hold the B each layer was running with, also mid-way through :class:`BWarmupCallback`), and a
    Python float ``b`` that the forward pass reads (no device synchronisation per call). Whatever writes the
    buffer (``load_state_dict``, transformers' loading, an in-place edit under ``torch.no_grad()``) is picked up at
    the next forward: the buffer's identity and version counter are compared there, which costs two attribute
    reads. A write through ``bcos_b.data`` (``layer.bcos_b.data.fill_(2.0)``) bypasses the version counter and is
    not seen: the layer keeps running at its old B, and ``state_dict`` (so ``save_pretrained``) refuses to save the
    new one (docs/api/nn.md, "Writes through ``.data``"). Set ``layer.b`` instead (or write the buffer itself under
    ``torch.no_grad()``). Dtype
    conversions (``.half()``, ``.to(torch.bfloat16)``) keep the buffer float64, so a saved half-precision
    model reloads at exactly the B it ran with. A B saved in float32 (on MPS) that is the float32 rounding of the
    layer's B loads as that B (:func:`recorded_pressure`), through ``load_state_dict`` (``assign=True`` too) and
    transformers' loading, and the buffer then holds that B in float64, which a compiled graph reads. One reading
    serves every change of the buffer (an in-place write too, so a write of the float32 rounding of the layer's B
    reads as that B); a float64 B loaded into an MPS layer's float32 buffer runs at what the buffer holds.
    """

    def _init_b(self, b, device) -> None:
        self._b = self._b_init = check_b(b)
        # a normal tensor also under the caller's torch.inference_mode(): an inference tensor has no version counter,
        # so building any B-cos layer (a BcosViT, a from_pretrained) there failed with torch's "Inference tensors do
        # not track version counter"; the weights are inference tensors there, as nn.Linear's are
        with torch.inference_mode(False):
            self.register_buffer("bcos_b", torch.tensor(self._b, dtype=torch.float64, device=device))
        self._b_seen = (self.bcos_b, self.bcos_b._version)

    @property
    def b(self) -> float:
        """The alignment pressure this layer runs with (assigning validates it and updates ``bcos_b``)."""
        return self._pressure()

    @b.setter
    def b(self, value) -> None:
        self._b = check_b(value)
        with torch.no_grad():
            self.bcos_b.fill_(self._b)
        self._b_seen = (self.bcos_b, self.bcos_b._version)

    @property
    def initial_b(self) -> float:
        """The B the layer was built with.

        For a ``PreTrainedModel._init_weights`` of a model holding B-cos layers: transformers materialises a
        buffer missing from a checkpoint (one saved before B was stored per layer) uninitialised, so
        ``_init_weights`` must fill it with ``transformers.initialization.constant_(module.bcos_b,
        module.initial_b)`` (which leaves a B loaded from the checkpoint alone).
        """
        return self._b_init

    def _pressure(self) -> float:
        buf = self._buffers["bcos_b"]
        seen, version = self._b_seen
        if buf is not seen or buf._version != version:
            self._adopt_stored_b(strict=True)
        return self._b

    def _adopt_stored_b(self, strict: bool) -> None:
        """The one reading of a changed ``bcos_b`` (``load_state_dict``, transformers' loading, an in-place write):
        the layer runs at the B the buffer records (:func:`recorded_pressure`: a float32 save (MPS) of B = 1.1 holds
        1.100000023841858, and is B = 1.1), and the buffer is made to hold that B itself, in the dtype of the
        layer's device (float64; float32 on MPS), so a compiled graph, which reads the buffer, and a later save see
        it. A B outside [1, MAX_B] is refused naming the buffer (``strict``); the loads leave it to the next read
        (transformers fills a buffer missing from a checkpoint after loading). Called by :meth:`_pressure` and, right
        after a load, by the loading overrides below: a compiled graph cannot run this reading itself."""
        buf = self._buffers.get("bcos_b")
        seen, version = self._b_seen
        if not isinstance(buf, Tensor) or buf is seen and buf._version == version:
            return
        if not buf.is_meta:
            if buf.numel() != 1 and not strict:
                return  # not a B (a load of another shape fails and names it); a read refuses it
            try:
                value = recorded_pressure(buf, self._b, self._b_init)
            except RuntimeError as error:
                if not functorch_transforms_active():
                    raise
                if not strict:
                    return
                # torch.func.vmap over stacked buffers (model ensembling: stack_module_state stacks bcos_b too): B is
                # read as one number, which a batched tensor cannot give; torch's "vmap: It looks like you're calling
                # .item() on a Tensor" named nothing the caller passed
                raise argument_error(
                    f"{type(self).__name__}.bcos_b", "is batched by a torch.func transform (vmap over stacked "
                    "buffers, as torch.func.stack_module_state makes them for model ensembling), but a layer runs "
                    "at one B, read as a number", "Vmap over the parameters only and pass one model's buffers "
                    "unbatched (in_dims=None for them; the models must share B); models with different B cannot "
                    "be vmapped together") from error
            if not (math.isfinite(value) and 1.0 <= value <= MAX_B):
                if not strict:
                    return
                raise argument_error(
                    f"{type(self).__name__}.bcos_b", f"the stored alignment pressure is {value!r}, outside "
                    f"[1, {MAX_B:g}]", "the checkpoint's B is damaged, or it predates per-layer B and the "
                    "model's _init_weights does not fill bcos_b (see AlignmentPressure.initial_b): reload "
                    "with load_bcos_model, or set layer.b explicitly")
            dtype = torch.float32 if buf.device.type == "mps" else torch.float64
            with torch.inference_mode(False):  # a tensor with a version counter (see _init_b)
                exact = torch.tensor(value, dtype=dtype, device=buf.device)
            if buf.dtype != dtype or exact.item() != buf.item():
                # a new tensor, never a write into this one: after load_state_dict(assign=True) it is the caller's
                # (whose float32 B a compiled graph read as 1.100000023841858); transformers' mark that the tensor
                # was loaded (not to be initialised) is kept
                if hasattr(buf, "_is_hf_initialized"):
                    exact._is_hf_initialized = buf._is_hf_initialized
                self._buffers["bcos_b"] = buf = exact
            self._b = value
        self._b_seen = (buf, buf._version)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # torch's loading (a Trainer resuming from a checkpoint): read at once, for a compiled graph
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        self._adopt_stored_b(strict=False)

    def __setattr__(self, name, value):
        # transformers' from_pretrained sets each loaded tensor as the module's attribute: read at once, for a
        # compiled graph
        super().__setattr__(name, value)
        if name == "bcos_b" and "_b_seen" in self.__dict__:
            self._adopt_stored_b(strict=False)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # A write through bcos_b.data bumps no version counter, so the layer kept running at its old B while the
        # checkpoint took the new value: reloaded, the model ran another function than the one trained and evaluated,
        # silently. Seen here, where it would be saved, by value: one read of B per layer and save (a device
        # synchronisation on a GPU, which saving makes anyway); at every forward it would cost that synchronisation
        # per layer and call, which the cached float exists to avoid (docs/api/nn.md, "Writes through .data").
        buf = self._buffers.get("bcos_b")
        seen, version = self._b_seen
        if buf is not None and buf is seen and buf._version == version and not buf.is_meta:
            value, running = buf.item(), torch.tensor(self._b, dtype=buf.dtype).item()
            if value != running and not (math.isnan(value) and math.isnan(running)):
                raise argument_error(
                    f"{type(self).__name__}.bcos_b", f"holds B = {value!r}, but the layer runs at B = {self._b!r}: "
                    "the buffer was written through .data (e.g. bcos_b.data.fill_), which the layer cannot see, so "
                    "the checkpoint would not hold the B the model ran with", f"Set layer.b = {value!r} to run at "
                    f"the new B (or layer.b = {self._b!r} to keep the old one), then save")
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _forward_pressure(self) -> float | Tensor:
        """B as a forward pass reads it: the float of :meth:`_pressure` in eager mode; under ``torch.compile``
        the buffer ``bcos_b`` itself (a 0-d tensor), so that a compiled graph reads B at every call and follows
        every change of it. A float would be baked into the graph, and the buffer's version counter, which
        detects in-place writes, cannot be read while tracing."""
        if torch.compiler.is_compiling() and not using_reference_path():
            return self._buffers["bcos_b"]
        return self._pressure()

    def _apply(self, fn, recurse=True):
        buf = self._buffers.pop("bcos_b")
        in_sync = buf is self._b_seen[0] and buf._version == self._b_seen[1]
        try:
            return super()._apply(fn, recurse)
        finally:
            device = self.weight.device
            # MPS has no float64; float32 holds the common B values (1, 1.25, 1.5, 2) exactly.
            dtype = torch.float32 if device.type == "mps" else torch.float64
            if buf.device == device and buf.dtype == dtype:
                new = buf
            elif buf.is_meta:
                new = torch.tensor(self._b, dtype=dtype, device=device)
            else:
                new = buf.to(device=device, dtype=dtype)
            self._buffers["bcos_b"] = new
            if in_sync:
                self._b_seen = (new, new._version)


class BcosLinear(AlignmentPressure):
    """B-cos linear layer with weight of shape ``(out_features * max_out, in_features)``.

    Half precision (``.half()`` / ``.bfloat16()``): ``||x||`` and ``cos`` are computed in float32 (see
    :mod:`bcos_plugins.nn.functional`), so every float16 input's norm is held, and zero inputs keep finite
    gradients. A float32 or bfloat16 input row whose sum of squares passes float32's range (an element beyond about
    1.8e19) has ``||x|| = inf``, made NaN (:func:`~bcos_plugins.nn.functional.overflowed_norm_as_nan`), so that row's
    output is NaN, never a silent 0 (until 2026-11-29 it was 0); a transformer's normalised activations stay many
    orders of magnitude below that range. Run such inputs in float64. Completeness then holds to the dtype's rounding (docs/benchmarks.md#readme-results
    has the errors measured); as in float32, logits near 0 have larger relative errors (cancellation).

    Args:
        in_features, out_features: sizes as in ``nn.Linear``.
        b: alignment pressure in [1, :data:`MAX_B`] (see :func:`check_b`).
        max_out: number of units per output taken the maximum over (MaxOut); 1 disables it.
        constant_outputs: output features that only feed a dynamic weight elsewhere (the query and key of
            attention, which only shape the attention matrix): in explanation mode they are detached
            whole, which makes the attention matrix a constant. ``None`` (default) for none,
            ``slice(None)`` for all.
        bias: ``False`` only, accepted so that an ``nn.Linear(..., bias=False)`` call carries over; ``True`` is
            refused: a bias is a term outside ``W(x) x``, so the explanation would no longer sum to the output.
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
        *,
        bias: bool = False,
    ) -> None:
        check_no_bias(bias)
        super().__init__()
        self.in_features = check_features("in_features", in_features)
        self.out_features = check_features("out_features", out_features)
        self.max_out = check_features("max_out", max_out)
        self._init_b(b, device)
        self.constant_outputs = check_constant_outputs(constant_outputs, self.out_features)
        self.weight = nn.Parameter(
            torch.empty(self._weight_shape(), device=device, dtype=dtype)
        )
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def _weight_shape(self) -> tuple[int, int]:
        return (self.out_features * self.max_out, self.in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, b: float, max_out: int = 1, *, hold: bool = False,
                    **kwargs) -> BcosLinear:
        """Build from a pretrained ``nn.Linear``: weights copied (used row-normalised), bias dropped.

        With ``max_out > 1`` each output's M units start as copies of the pretrained row, so the layer
        starts from the pretrained B-cos output exactly. ``hold=True`` (``max_out`` 1): the layer holds
        ``linear.weight`` itself, the very parameter, not a copy (as :func:`~bcos_plugins.bcosify` converts).
        """
        if hold:
            return cls._holding(linear.weight, linear.in_features, linear.out_features, b=b, max_out=max_out,
                                **kwargs)
        layer = cls._uninitialised(linear.weight, linear.in_features, linear.out_features, b=b, max_out=max_out,
                                   **kwargs)
        with torch.no_grad():
            layer.weight.copy_(linear.weight.repeat_interleave(max_out, dim=0) if max_out > 1 else linear.weight)
        return layer

    @classmethod
    def _uninitialised(cls, like: Tensor, *args, **kwargs) -> BcosLinear:
        """A layer on ``like``'s device and dtype whose weight is allocated but not initialised.

        For the ``from_*`` constructors, which overwrite the weight at once: the random initialisation of
        ``__init__`` would cost more than the copy (a 2048 x 2048 layer built and copied into took 14-21 ms with
        it, 2.2-2.5 ms without; docs/benchmarks.md, 2026-11-28 14:11 UTC).
        """
        layer = cls(*args, device="meta", dtype=like.dtype, **kwargs)
        return layer.to_empty(device=like.device)

    @classmethod
    def _holding(cls, weight: nn.Parameter, *args, **kwargs) -> BcosLinear:
        """A layer whose weight is the parameter ``weight`` itself: built on the meta device, so nothing is allocated,
        initialised or copied (bcosify used to copy each weight and then put the original back in its place:
        docs/benchmarks.md, 2026-11-29 05:30 UTC), with its B on ``weight``'s device."""
        layer = cls(*args, device="meta", dtype=weight.dtype, **kwargs)
        if layer.weight.shape != weight.shape or not isinstance(weight, nn.Parameter):
            raise argument_error("hold", f"needs a weight parameter of the layer's shape {tuple(layer.weight.shape)} "
                                 f"(max_out 1), got a {type(weight).__name__} of shape {tuple(weight.shape)}",
                                 "Pass hold=False to build the layer from a copy", kind=BcosValueError)
        layer.weight = weight
        layer._init_b(layer._b, weight.device)
        return layer

    _UNITS_ARE_COLUMNS = False  # BcosConv1D stores the weight (in, out)

    def unit_weight(self) -> Float[Tensor, "units d_in"]:
        """Weight rows scaled to unit norm, ``(out_features * max_out, in_features)``.

        Reused between calls while no gradient of the weight is needed and the weight is unchanged
        (:func:`~bcos_plugins.nn.functional.cached_unit_norm`): read it, do not write into it."""
        return cached_unit_norm(self.weight, dim=1, transposed=self._UNITS_ARE_COLUMNS)

    def _linear(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... units"]:
        weight = cached_unit_norm(self.weight, dim=1, transposed=self._UNITS_ARE_COLUMNS, autocast=True)
        return torch.nn.functional.linear(x, weight)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        if self.max_out == 1 and _triton_linear.using_triton_kernels():  # (opt-in: bcos_plugins.nn.triton_kernels)
            out = _triton_linear.triton_forward(self, x)
            if out is not None:  # None: a call the kernel does not cover, which takes the paths below
                return out
        if (not torch.is_grad_enabled() and self.max_out == 1 and not using_reference_path()
                and not torch.compiler.is_compiling()):
            # nothing is recorded (inference, evaluation): no training node, explaining product or unit to detach.
            # The weight is read from _parameters: the attribute lookup misses the instance and its classes before
            # nn.Module.__getattr__ finds it there (0.8 us a read against 0.05), and a small model's forward is
            # Python-bound (docs/benchmarks.md, 2026-11-28 16:16 UTC); a weight that is no registered parameter (a
            # parametrization's property, torch.nn.utils.weight_norm's attribute) is read as an attribute
            b = self._pressure()
            if b != 1.0:
                self.holds_constant()  # (counts the dynamic weight while explaining, as the recorded paths do)
            weight = self._parameters.get("weight")
            return inference_linear(x, self.weight if weight is None else weight, b,
                                    units_are_columns=self._UNITS_ARE_COLUMNS)
        if (self.max_out == 1 and x.requires_grad and parameter_gradients_unused()
                and not torch.compiler.is_compiling() and not using_reference_path()
                and not functorch_transforms_active()):  # (explaining_linear's node: bcos_product's note)
            # explaining (every explain call's projections): the cheap flags first, then one explaining test that
            # also counts the dynamic weight (holds_constant, as the general path does; before, `explaining` and
            # holds_constant asked it twice), and the weight from _parameters as above: 1.6 us a layer alone in
            # these reads (docs/benchmarks.md#bench-core-method, 2026-11-28 17:04 UTC)
            b = self._pressure()
            constant = self.constant_outputs
            if b != 1.0 and constant != slice(None) and self.holds_constant():  # (a whole constant output: below)
                weight = self._parameters.get("weight")
                return explaining_linear(x, self.weight if weight is None else weight, b,
                                         units_are_columns=self._UNITS_ARE_COLUMNS, constant_units=constant)
        b = self._forward_pressure()
        if self._trains_fused(x):
            return bcos_linear(x, self.weight, None, b, units_are_columns=self._UNITS_ARE_COLUMNS,
                               own_norm=isinstance(b, Tensor) or b != 1.0)
        scaled = isinstance(b, Tensor) or b != 1.0
        explaining = self.holds_constant() if scaled else self.explaining
        constant = self.constant_outputs if explaining else None
        if constant == slice(None) and not using_reference_path():
            # explaining a query or key projection: its whole output is a constant, so nothing is recorded (the
            # matrix product and the product's autograd nodes were built only to be detached); the same kernels
            # as the explaining product, floor included, so the values are the ones detaching gave
            with torch.no_grad():
                lin = max_out(self._linear(x), self.max_out)
                return lin.mul_(explaining_scale(lin, input_norm(x), b)) if scaled else lin
        lin = max_out(self._linear(x), self.max_out)
        if scaled:
            if explaining:  # the factor is a constant: its norm is computed without recording (dynamic_scope)
                with torch.no_grad():
                    x_norm = input_norm(x)
            else:
                x_norm = input_norm(x)
            # MaxOut's maximum saves its output for its backward pass: only the matrix product's is free to reuse
            return bcos_product(lin, x_norm, b, explaining, overwrite_lin=self.max_out == 1, constant_units=constant)
        return lin if constant is None else detach_units(lin, constant)

    def _trains_fused(self, x: Tensor) -> bool:
        """Whether this call runs :func:`~bcos_plugins.nn.functional.bcos_linear`, the one autograd node that
        saves the least for the backward pass: autograd records (training, or an input gradient outside
        explanation mode), no MaxOut (its maximum needs the pre-scale outputs of every unit of a group: the
        unfused steps keep them) and not the reference path."""
        return (self.max_out == 1 and torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
                and not self.explaining and not using_reference_path()
                # torch.func's transforms take no autograd.Function without setup_context (bcos_product's note)
                and not functorch_transforms_active())

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
    def from_conv1d(cls, conv, b: float, max_out: int = 1, *, hold: bool = False, **kwargs) -> BcosConv1D:
        """Build from transformers' ``Conv1D``, as :meth:`BcosLinear.from_linear` from an ``nn.Linear``."""
        in_features, out_features = conv.weight.shape
        if hold:
            return cls._holding(conv.weight, in_features, out_features, b=b, max_out=max_out, **kwargs)
        layer = cls._uninitialised(conv.weight, in_features, out_features, b=b, max_out=max_out, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(conv.weight.repeat_interleave(max_out, dim=1) if max_out > 1 else conv.weight)
        return layer

    _UNITS_ARE_COLUMNS = True
