"""The one explanation mechanism of the package: dynamic-weight modules and ``explanation_mode``.

Every module whose output can be written ``W(x) x`` with an input-dependent ``W`` derives from
:class:`DynamicWeightModule`. Inside :func:`explanation_mode` such a module treats ``W(x)`` as a constant for
autograd (it detaches the factor that makes up the dynamic weight). The whole network is then a
linear map of its input as far as autograd can see, so for any scalar output ``y``

    x · dy/dx = y            (completeness)

and every explanation in the project is plain input x gradient inside this mode. Forward values are
bit-identical in and out of the mode: both paths run the same arithmetic, one of them detached.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor, nn

__all__ = ["DynamicWeightModule", "dynamic_weights_used", "evaluating", "explanation_mode", "has_dynamic_weights",
           "is_explaining", "no_parameter_gradients", "parameter_gradients_unused"]

# Explanation mode without a model handle is per thread: a forward pass runs in the caller's thread, and
# another thread (a data loader, a second model being trained) must not see its modules switched.
_THREAD_STATE = threading.local()


def _thread_depth() -> int:
    return getattr(_THREAD_STATE, "depth", 0)


def dynamic_weights_used() -> int:
    """How many dynamic weights were held constant (in either form of the mode) in this thread so far.

    The Captum adapter reads it around a call of a plain function to check that the function ran through
    B-cos modules at all (otherwise its input x gradient is not a ``W(x) x`` explanation). Modules running
    inside a graph compiled by ``torch.compile`` are not counted.
    """
    return getattr(_THREAD_STATE, "used", 0)


def parameter_gradients_unused() -> bool:
    """Whether the current thread runs inside :func:`no_parameter_gradients` (see there)."""
    return getattr(_THREAD_STATE, "no_parameter_gradients", 0) > 0


@contextmanager
def no_parameter_gradients() -> Iterator[None]:
    """Declare that no gradient with respect to a parameter is taken from the autograd graph built in this
    block (in this thread): only gradients with respect to inputs (``torch.autograd.grad(out, inputs)``).

    Explanations (:func:`~bcos_plugins.attribution.input_x_gradient`) run in it. B-cos layers then reuse their
    cached unit-norm weights (:func:`bcos_plugins.nn.functional.cached_unit_norm`), which carry no autograd
    history back to the raw weights, instead of normalising the weights again in every forward pass. A
    parameter gradient taken from such a graph would silently lack the normalisation's part: code that trains
    through an explanation (a loss on input x gradient) must not run in this block.
    """
    _THREAD_STATE.no_parameter_gradients = getattr(_THREAD_STATE, "no_parameter_gradients", 0) + 1
    try:
        yield
    finally:
        _THREAD_STATE.no_parameter_gradients -= 1


def _count_use() -> None:
    # counted in both forms: a plain function called inside the user's own explanation_mode(model) ran through
    # B-cos modules too. Not while torch.compile traces: the count would become a guard of the compiled graph
    # (its value differs at every call, so every call would compile the model again).
    if not torch.compiler.is_compiling():
        _THREAD_STATE.used = dynamic_weights_used() + 1


class DynamicWeightModule(nn.Module):
    """Mixin for modules computing ``W(x) x`` with an input-dependent ``W`` (B-cos layers, norms, gated
    activations, attention, bilinear branches, TransformerLens hook points): ``explaining`` makes ``W(x)`` a
    constant for autograd. It is true while the module's model is in :func:`explanation_mode` or while the
    thread-wide form ``explanation_mode()`` is active."""

    _explaining_module: bool = False

    @property
    def explaining(self) -> bool:
        return self._explaining_module or _thread_depth() > 0

    @explaining.setter
    def explaining(self, value: bool) -> None:
        self._set_explaining(value)

    def _set_explaining(self, value: bool) -> None:
        # a plain instance attribute (never a parameter, buffer or submodule), written past nn.Module.__setattr__'s
        # checks: explanation_mode sets and restores it on every dynamic-weight module at each call
        self.__dict__["_explaining_module"] = bool(value)

    def dynamic_weight(self, factor: Tensor) -> Tensor:
        """Return ``factor`` as it must enter the product: detached while explaining."""
        if self._explaining_module or _thread_depth() > 0:
            _count_use()
            return factor.detach()
        return factor

    def holds_constant(self) -> bool:
        """Whether this call must treat the dynamic weight as a constant (counted like :meth:`dynamic_weight`).

        For layers whose fused kernels take the decision as an argument instead of detaching a tensor.
        """
        if self._explaining_module or _thread_depth() > 0:
            _count_use()
            return True
        return False

    def dynamic_scope(self) -> AbstractContextManager:
        """Context for computing the dynamic factor: ``torch.no_grad()`` while explaining.

        The factor is detached then anyway; computing it without recording the autograd graph saves the
        time and memory of saving its intermediate tensors. The arithmetic (and so the value) is the same.
        """
        return torch.no_grad() if self.explaining else nullcontext()


def has_dynamic_weights(model: nn.Module) -> bool:
    """Whether ``model`` contains dynamic-weight modules (it was B-cosified, or built B-cos or bilinear)."""
    # the walk stops at the first dynamic module (explain asks at every call)
    return any(isinstance(m, DynamicWeightModule) for m in _each_module(model))


def is_explaining(module: nn.Module) -> bool:
    """True if any dynamic-weight submodule of ``module`` is in explanation mode."""
    return any(m.explaining for m in module.modules() if isinstance(m, DynamicWeightModule))


@contextmanager
def explanation_mode(model: nn.Module | None = None) -> Iterator[nn.Module | None]:
    """Make every dynamic weight of ``model`` a constant for autograd while the block runs.

    Without ``model`` (``with explanation_mode():``) every dynamic-weight module that runs in the current
    thread is in explanation mode, whichever model it belongs to: the form for code that only holds a
    function (Captum's ``forward_func``). That form cannot switch dropout off: call ``model.eval()`` first.

    Nested and re-entrant use is safe: each module's previous state is restored on exit, also when the
    block raises. The model is put in eval mode for the duration (dropout would otherwise make the
    explained function random) and its training flag is restored afterwards.

    Examples:
        >>> import torch
        >>> from bcos_plugins.nn import BcosLinear, explanation_mode
        >>> model = torch.nn.Sequential(BcosLinear(8, 16), BcosLinear(16, 3))   # any model with B-cos layers
        >>> with explanation_mode(model):
        ...     x = torch.randn(1, 8).requires_grad_()
        ...     logit = model(x)[0, 1]
        ...     contributions = x * torch.autograd.grad(logit, x)[0]
        >>> torch.allclose(contributions.sum(), logit)                          # they sum to the logit
        True
    """
    if model is None:
        _THREAD_STATE.depth = _thread_depth() + 1
        try:
            yield None
        finally:
            _THREAD_STATE.depth -= 1
        return
    modules, training_flags = _dynamic_modules_and_training(model)
    previous = [m._explaining_module for m in modules]
    with _in_eval_mode(model, training_flags):
        for m in modules:
            m.__dict__["_explaining_module"] = True  # as _set_explaining, without a method call per module
        try:
            yield model
        finally:
            for m, state in zip(modules, previous, strict=True):
                m.__dict__["_explaining_module"] = state


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode while the block runs (dropout off: an explained or scored function must be
    deterministic), and afterwards every module in the training mode it had before, also when the block raises.

    ``model.train(was_training)``, which restores the model's own flag only, sets every submodule to it: a module a
    training loop keeps in eval mode (a frozen encoder, a normalisation layer with fixed statistics) came back in
    training mode after an explanation or a metric, silently changing what the loop computes. A model wholly in
    eval mode is not touched (``eval()`` walks the whole model). The one way the package's explanations and
    metrics switch a model to eval mode (:func:`explanation_mode` does the same).
    """
    with _in_eval_mode(model, _dynamic_modules_and_training(model)[1]):
        yield model


@contextmanager
def _in_eval_mode(model: nn.Module, training_flags: list[tuple[nn.Module, bool]] | None) -> Iterator[None]:
    """``model`` in eval mode inside, and afterwards every module's training flag as recorded
    (:func:`_dynamic_modules_and_training`): ``model.train`` with the model's own flag (a model's ``train`` override
    runs, as it did before), then the modules whose flag differed from the model's set one by one. Nothing is
    switched when no module was training (``training_flags`` is ``None``): eval() and the restoring train() walk the
    whole model (transformers' train() more than that), and a model already wholly in eval mode (every explain call
    after the first) needs neither."""
    if training_flags is None:
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train(training_flags[0][1])  # the walk records the model first
        for module, was_training in training_flags:
            if module.training != was_training:
                module.training = was_training


def _each_module(model: nn.Module) -> Iterator[nn.Module]:
    """Every module of ``model`` once, ``model`` first, as ``model.modules()`` yields them but walked over the
    ``_modules`` dicts directly: ``model.modules()`` runs ``named_modules``, which builds every module's dotted name
    and a generator per level, 2.5x this walk's time (33 vs 13 us on a 2-layer Qwen2). The one walk of
    :func:`has_dynamic_weights` and :func:`_dynamic_modules_and_training`, afresh at every call, so a submodule
    replaced or added since the last call is seen (no cache to go stale)."""
    modules = [model]
    seen = {model}
    for m in modules:  # the list grows while it is read: each module once, model first
        yield m
        for child in m._modules.values():
            if child is not None and child not in seen:
                seen.add(child)
                modules.append(child)


def _dynamic_modules_and_training(
        model: nn.Module) -> tuple[list[DynamicWeightModule], list[tuple[nn.Module, bool]] | None]:
    """The dynamic-weight modules of ``model`` (each once, ``model`` included, as ``model.modules()`` yields them)
    and, if any module of it is in training mode, every module's training flag (``model``'s first; ``None`` when
    none is: nothing to switch or restore, see :func:`evaluating`), from one walk (:func:`_each_module`).
    """
    modules = list(_each_module(model))
    dynamic = [m for m in modules if isinstance(m, DynamicWeightModule)]
    # the flags are paired with their modules only where something is switched (after the first call, never)
    return dynamic, ([(m, m.training) for m in modules] if any(m.training for m in modules) else None)

