"""The one input x gradient step of the package.

Inside :func:`~bcos_plugins.nn.explanation_mode` every dynamic weight ``W(x)`` is a constant for autograd,
so a B-cos network is, as far as autograd sees, the linear map ``x -> W(x) x`` and for an explained scalar
``y``: ``x . dy/dx = y`` (completeness). ``bcos_plugins.explain``, ``explain_image``, TransformerLens'
``explain_logits`` and Captum's ``BcosAttribution`` run :func:`input_x_gradient`; none re-implements it
(Captum's ``LayerBcos``, and inseq's method through it, run Captum's layer input x gradient in the same mode).

Rows are explained in one backward pass of the summed explained values: the rows of a batch do not interact
in a transformer (no batch statistics), so the gradient of the sum w.r.t. row ``i``'s input is the gradient
of row ``i``'s value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .._checks import named_rows
from ..errors import BcosRuntimeError, BcosValueError
from ..nn.dynamic import explanation_mode, no_parameter_gradients, thread_token

__all__ = ["GradientStep", "as_leaf", "capture_point", "input_x_gradient", "outside_inference"]

# capture_point's hook reads its probe from here (``probes[slot]``), not from its closure: the hook lives in the
# module's hook dict, and torch.compile's dynamo gives static shapes to every tensor it reaches through a torch.nn
# module (GPT-2's Dropout, Llama's Embedding hold the point), so under dynamic=True a probe in the closure fixed the
# compiled explain graph's batch and length, and every new shape compiled it again (torch 2.13). A tensor read from
# a global is a graph input with dynamic shapes. One tuple per thread (another thread's explanation has its own),
# replaced whole at each change, never changed in place (see nn/dynamic.py's _THREAD_STATE); ``None`` marks a slot
# whose block has ended while a block opened before it still runs.
_PROBES = threading.local()


@dataclass
class GradientStep:
    """What :func:`input_x_gradient` computed: the explained values, the leaves, their gradients and
    ``leaf * gradient`` (the contributions, one tensor per leaf)."""

    explained: Float[Tensor, " batch"]
    leaves: tuple[Tensor, ...]
    gradients: tuple[Tensor, ...]
    contributions: tuple[Tensor, ...]


def outside_inference(t: Tensor) -> Tensor:
    """``t``, or a normal copy of it if it was made under ``torch.inference_mode()`` (autograd cannot save
    inference tensors, so a forward pass that records a graph cannot take them as inputs)."""
    if not (isinstance(t, Tensor) and t.is_inference()):
        return t
    with torch.inference_mode(False):
        return t.clone()


def as_leaf(t: Tensor) -> Tensor:
    """``t`` detached and requiring grad: a new attribution point."""
    return outside_inference(t.detach()).requires_grad_(True)


class PointDtypeMismatch(BcosValueError):
    """Raised by :func:`capture_point` when the attribution point's dtype is not the probe's (embedding tables of
    different dtypes); ``point_dtype`` is the point's, with which :func:`~bcos_plugins.explain` makes the probe again.
    """

    def __init__(self, point_dtype: torch.dtype, probe_dtype: torch.dtype) -> None:
        super().__init__(
            f"model: its attribution point (the combined embedding) is {point_dtype} while the probe made for it is "
            f"{probe_dtype}, the input embeddings' dtype (model.get_input_embeddings()): the embedding tables "
            f"differ in dtype. Make the probe in {point_dtype}, or cast the embeddings to one dtype "
            f"(model.to({point_dtype})).")
        self.point_dtype = point_dtype


@contextmanager
def capture_point(module: nn.Module, where: str, *, probe: Tensor | None = None,
                  each_call: Callable[[], object] | None = None) -> Iterator[list[Tensor]]:
    """Replace ``module``'s first input (``where="input"``) or its output (``"output"``) by a fresh leaf on
    every call while the block runs; yields the list the leaves are appended to.

    Gradients w.r.t. a captured leaf are gradients at that point of the network (the parameters before it
    get none), which is how contributions at an inner point (the combined embedding) are taken.

    With ``probe`` (ones of the point's shape and dtype, requiring grad, made before the forward pass) the
    point of the first call is multiplied by it instead (the value is unchanged: ``x * 1 = x``) and the list
    holds the probe. The gradient w.r.t. the probe is ``x * dy/dx``, the contributions themselves, so
    :func:`input_x_gradient` returns them unchanged (``probe * gradient``). A compiled model
    (``torch.compile``) needs this form: a graph cannot make one of its own tensors a leaf.

    ``each_call`` is called (without arguments) at every call of ``module``, in the same hook: ``explain`` notes the
    autocast state there instead of registering a second hook on the module.
    """
    if where not in ("input", "output"):
        raise BcosValueError(f"where: must be 'input' or 'output', got {where!r}.")
    captured: list[Tensor] = []
    # the hook is on the model, which other threads may run meanwhile (training it, explaining it): it acts in the
    # calling thread's forward only (another thread's tensor captured here, probed and all, gave both threads wrong
    # answers)
    owner = thread_token()
    probing = probe is not None
    slot = len(getattr(_PROBES, "probes", ()))
    if probing:
        _PROBES.probes = (*getattr(_PROBES, "probes", ()), probe)

    def replace(t: Tensor) -> Tensor:
        if thread_token() != owner:
            return t
        if each_call is not None:
            each_call()
        if not probing:
            leaf = as_leaf(t)
            captured.append(leaf)
            return leaf
        if captured:
            return t
        probe = _PROBES.probes[slot]  # not the closure's: see _PROBES
        if t.shape == probe.shape and t.dtype != probe.dtype:
            # explain makes the probe in the input embeddings' dtype; a table of another dtype added to them (BERT's
            # position or token-type table) promotes the point to that one: noted here and raised when the block
            # ends, outside the forward (an exception raised inside a compiled graph's trace breaks fullgraph=True),
            # and explain retries with this dtype
            point_dtype.append(t.dtype)
            return t
        if t.shape != probe.shape or t.dtype != probe.dtype:
            raise BcosRuntimeError(f"capture_point: the attribution point is {tuple(t.shape)} {t.dtype}, the probe "
                                   f"{tuple(probe.shape)} {probe.dtype}; make the probe like the point.")
        captured.append(probe)
        return t * probe

    if where == "input":
        handle = module.register_forward_pre_hook(lambda m, args: (replace(args[0]), *args[1:]))
    else:
        handle = module.register_forward_hook(lambda m, args, out: replace(out))
    point_dtype: list[torch.dtype] = []
    try:
        yield captured
    finally:
        handle.remove()
        if probing:
            probes = list(_PROBES.probes)
            probes[slot] = None
            while probes and probes[-1] is None:
                probes.pop()
            _PROBES.probes = tuple(probes)
    if point_dtype and probe is not None:
        raise PointDtypeMismatch(point_dtype[0], probe.dtype)


def input_x_gradient(
    compute: Callable[[], tuple[Tensor, Sequence[Tensor]]],
    model: nn.Module | None = None,
    *,
    check_finite: bool = True,
    defer_finite_check: bool = False,
) -> GradientStep:
    """Run ``compute`` in explanation mode and return input x gradient of its explained values.

    Args:
        compute: called with autograd on; returns ``(explained, leaves)``: one value per row, shape
            ``(batch,)``, and the leaf tensors to attribute to (made with :func:`as_leaf` or captured by
            :func:`capture_point`).
        model: the model to put into explanation mode (and eval mode for the call); ``None`` for the
            thread-wide form, where every dynamic-weight module that runs is in explanation mode.
        check_finite: raise if the explained values or the gradients are NaN or infinite, instead of
            returning non-finite contributions.
        defer_finite_check: with ``check_finite``, leave the check of the returned step to the caller, who brings
            :func:`non_finite_step` to the host together with its own checks (one device-to-host sync instead of
            two) and calls :func:`refuse_non_finite_step` when it is true.

    Works under ``torch.no_grad()`` and ``torch.inference_mode()`` too: both are lifted for the call.
    """
    # the graph is differentiated with respect to the leaves only: B-cos layers may reuse their cached
    # unit-norm weights instead of normalising the weights in every call
    with torch.inference_mode(False), torch.enable_grad(), explanation_mode(model), no_parameter_gradients():
        try:
            explained, leaves = compute()
        except NotImplementedError as error:
            refuse_flex_attention_on_cpu(error)
            raise
        leaves = tuple(leaves)
        if not leaves:
            raise BcosRuntimeError("input_x_gradient: no attribution point was reached; the forward pass did "
                                   "not run through the captured module. Check the model and the hook point.")
        if explained.ndim != 1:
            raise BcosValueError(f"the explained value must be one scalar per row, shape (batch,); got shape "
                                 f"{tuple(explained.shape)}. Select one output per row with target=.")
        if not explained.requires_grad:
            if check_finite:
                _require_finite_output(explained)
            raise BcosRuntimeError("the explained value does not depend on the attribution point (no gradient "
                                   "path); the function ignores its input.")
        grads = torch.autograd.grad(explained.sum(), leaves, allow_unused=True)
    grads = tuple(torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads, strict=True))
    contributions = tuple(leaf.detach() * g for leaf, g in zip(leaves, grads, strict=True))
    step = GradientStep(explained=explained.detach(), leaves=tuple(leaf.detach() for leaf in leaves),
                        gradients=grads, contributions=contributions)
    # a backward pass of a non-finite output costs nothing wrong: its numbers are refused here
    if check_finite and not defer_finite_check and non_finite_step(step):
        refuse_non_finite_step(step)
    return step


def refuse_flex_attention_on_cpu(error: NotImplementedError) -> None:
    """Name the cause and the fix of torch's refusal to differentiate FlexAttention on the CPU (a model loaded or set
    with ``attn_implementation="flex_attention"``), raised inside the forward of every explanation path: its own
    message told to "set the input requires_grad to False", which no explanation can, and named neither the model's
    setting nor the switch that explains it. Any other ``NotImplementedError`` is left as it is."""
    if "FlexAttention does not support backward on CPU" in str(error):
        raise BcosRuntimeError(
            "model: runs FlexAttention (attn_implementation='flex_attention'), for which torch has no backward pass on "
            "the CPU, and an explanation differentiates the forward pass. Explain it with another attention "
            "implementation (model.set_attn_implementation('eager') or 'sdpa'; load_bcos_model(path, "
            "attn_implementation='eager')), whose explanation is the same up to float rounding, or on a GPU."
        ) from error


def non_finite_step(step: GradientStep) -> Tensor:
    """Whether the explained values or a gradient of ``step`` is NaN or infinite, as a 0-dim tensor left on the
    device: the output's and the gradients' finiteness reach the host together, in one device-to-host sync."""
    # 0 * x is 0 for every finite x and NaN for an infinite or NaN one, and a sum of zeros with a NaN is NaN: two
    # kernels per tensor (the test of two 4 x 32 x 128 tensors 26 us against 75 with isfinite(x).all() on a CPU;
    # docs/benchmarks.md, 2026-11-28 14:11 UTC), and no overflow of finite values
    zero_products = sum((t * 0).sum() for t in (step.explained, *step.gradients))
    return ~torch.isfinite(zero_products)


def refuse_non_finite_step(step: GradientStep, likely_cause: str = "") -> None:
    """Raise for a step whose :func:`non_finite_step` is true, naming the output's rows if it is not finite.
    ``likely_cause``: a sentence from a caller that knows more about its inputs (``explain``: a padded float64
    batch), naming the likelier cause and its fix; it comes first, the generic causes after it."""
    _require_finite_output(step.explained, likely_cause)
    raise BcosValueError("the gradient at the attribution point is NaN or infinite: "
                         + (f"{likely_cause} Otherwise " if likely_cause else "")
                         + "the input is outside the range the model computes in (e.g. huge values, or fp16 "
                         "overflow). Check the inputs, or explain in float32.")


def _require_finite_output(explained: Tensor, likely_cause: str = "") -> None:
    """Refuse explained values that are NaN or infinite (checked before the gradients: the cause comes first)."""
    bad = ~torch.isfinite(explained)
    if bad.any():
        raise BcosValueError(f"model: its output is NaN or infinite for row(s) {named_rows(bad)}, so there is "
                             "nothing finite to explain " + (f"({likely_cause} Otherwise " if likely_cause else "(")
                             + "an input or an embedding row of NaN, inf or a huge value overflows inside the model). "
                             "Check those rows' inputs and the embedding rows of their tokens, and the weights.")
