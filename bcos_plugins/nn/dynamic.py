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

import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ContextDecorator, contextmanager, nullcontext

import torch
from torch import Tensor, nn

from ..errors import BcosTypeError, argument_error

__all__ = ["DynamicWeightModule", "dynamic_weights_used", "evaluating", "explanation_mode", "has_dynamic_weights",
           "is_explaining", "no_parameter_gradients", "parameter_gradients_unused", "reusable_context"]


class _ReusableContext(ContextDecorator):
    """One call of a :func:`reusable_context` function: each ``with`` runs the generator afresh (blocks nested or
    opened again in the same thread exit in the reverse order; each thread keeps its own open blocks)."""

    def __init__(self, make: Callable[..., AbstractContextManager], args: tuple, kwargs: dict) -> None:
        self._make, self._args, self._kwargs = make, args, kwargs
        self._open = threading.local()

    def __enter__(self):
        block = self._make(*self._args, **self._kwargs)
        value = block.__enter__()
        self._open.__dict__.setdefault("blocks", []).append(block)
        return value

    def __exit__(self, *exc_info):
        return self._open.blocks.pop().__exit__(*exc_info)


def reusable_context(function: Callable[..., Iterator]) -> Callable[..., AbstractContextManager]:
    """``contextlib.contextmanager`` whose context managers can be entered more than once, as ``torch.no_grad()``'s
    can: ``mode = explanation_mode(model)``, then ``with mode:`` in a loop. A ``contextmanager`` object runs its
    generator once: a second ``with`` failed with contextlib's "'_GeneratorContextManager' object has no attribute
    'args'", naming nothing of the package. Also a decorator, as ``contextmanager``'s are."""

    make = contextmanager(function)

    @functools.wraps(function)
    def context(*args, **kwargs) -> AbstractContextManager:
        return _ReusableContext(make, args, kwargs)

    return context

# Explanation mode is per thread, in both forms: a forward pass runs in the caller's thread, and another thread
# (a data loader, a training loop on the same model object, a second explanation) must not see its modules switched.
# Nothing is written on the modules themselves (a flag there was seen by every thread: a training thread's query/key
# weights got no gradient while another thread explained). A thread's ``explained`` is the frozenset of id(module) of
# the modules its explanation_mode(model) blocks switched, with _EVERY_MODULE while the thread-wide form runs; its
# ``depths`` count the blocks per key (nesting). ``explained`` is a new frozenset at each change, never a dict changed
# in place, and read with getattr from a plain threading.local: torch.compile guards that by value in the calling
# thread (seen with torch 2.13: it missed in-place changes of a thread-local dict, and attributes of a
# threading.local subclass altogether, running a graph traced outside explanation mode inside it, silently).
_THREAD_STATE = threading.local()
_EVERY_MODULE = 0  # the thread-wide form's key: no object's id() is 0
_NOTHING: frozenset[int] = frozenset()
_THREAD_KEYS = itertools.count(1)
# Set for the importing (main) thread, as the first explanation_mode block's exit leaves it: getattr's default costs
# an AttributeError raised and caught inside, 0.45-0.5 us per read more, and every dynamic-weight module reads it in
# every forward, so a process that only predicts (never explains) paid it 25-40 times a forward pass of the
# bench_core family shape (docs/benchmarks.md, 2026-11-28 16:16 UTC). Other threads read the default until theirs.
_THREAD_STATE.explained = _NOTHING


def _explaining_here(module: nn.Module) -> bool:
    # read in every dynamic-weight module's forward: one thread-local read, and nothing more while this thread
    # explains nothing (training, inference)
    explained = getattr(_THREAD_STATE, "explained", _NOTHING)
    return bool(explained) and (_EVERY_MODULE in explained or id(module) in explained)


def _switch(keys: list[int], step: int) -> None:
    """Enter (``step`` 1) or leave (-1) this thread's explanation mode for the modules ``keys``."""
    depths = getattr(_THREAD_STATE, "depths", None)
    if depths is None:
        depths = _THREAD_STATE.depths = {}
    for key in keys:
        depth = depths.get(key, 0) + step
        if depth > 0:
            depths[key] = depth
        else:
            depths.pop(key, None)
    _THREAD_STATE.explained = frozenset(depths) if depths else _NOTHING


def thread_token() -> int:
    """A number that stands for the calling thread (the same at every call in one thread; never another thread's).

    For hooks registered on a model that every thread's forward runs (the attribution point's capture): they act
    only where ``thread_token() ==`` the token taken when they were registered. Under ``torch.compile`` the comparison
    is a guard on this thread-local value, not a graph break (``threading.get_ident`` is one, and its numbers are
    reused by later threads).
    """
    token = getattr(_THREAD_STATE, "token", 0)
    if not token:
        token = _THREAD_STATE.token = next(_THREAD_KEYS)
    return token


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


@reusable_context
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
    constant for autograd. It is true in a thread while that thread runs inside :func:`explanation_mode` of the
    module's model, or inside the thread-wide form ``explanation_mode()``; other threads running the same module
    at the same time are not affected."""

    @property
    def explaining(self) -> bool:
        return _explaining_here(self)

    @explaining.setter
    def explaining(self, value: bool) -> None:
        self._set_explaining(value)

    def _set_explaining(self, value: bool) -> None:
        # for the calling thread only, as explanation_mode; True holds until set False (prefer explanation_mode,
        # which restores the previous state on exit)
        depth = getattr(_THREAD_STATE, "depths", {}).get(id(self), 0)
        if value and not depth:
            _switch([id(self)], 1)
        elif not value and depth:
            _switch([id(self)], -depth)

    def dynamic_weight(self, factor: Tensor) -> Tensor:
        """Return ``factor`` as it must enter the product: detached while explaining."""
        if _explaining_here(self):
            _count_use()
            return factor.detach()
        return factor

    def holds_constant(self) -> bool:
        """Whether this call must treat the dynamic weight as a constant (counted like :meth:`dynamic_weight`).

        For layers whose fused kernels take the decision as an argument instead of detaching a tensor.
        """
        if _explaining_here(self):
            _count_use()
            return True
        return False

    def dynamic_scope(self) -> AbstractContextManager:
        """Context for computing the dynamic factor: ``torch.no_grad()`` while explaining.

        The factor is detached then anyway; computing it without recording the autograd graph saves the
        time and memory of saving its intermediate tensors. The arithmetic (and so the value) is the same.
        """
        return torch.no_grad() if _explaining_here(self) else nullcontext()


def _require_module(value, call: str, name: str = "model") -> None:
    """Refuse a ``model`` of :func:`explanation_mode`, :func:`is_explaining` or :func:`has_dynamic_weights` that is
    no ``nn.Module``: "'str' object has no attribute 'training'" (or '_modules', 'modules') was all a call got."""
    if not isinstance(value, nn.Module):
        raise argument_error(name, f"must be a torch.nn.Module, got {type(value).__name__}",
                             f"Pass the model (or layer) itself: {call}", kind=BcosTypeError)


def has_dynamic_weights(model: nn.Module) -> bool:
    """Whether ``model`` contains dynamic-weight modules (it was B-cosified, or built B-cos or bilinear)."""
    _require_module(model, "has_dynamic_weights(model)")
    # the walk stops at the first dynamic module (explain asks at every call)
    return any(isinstance(m, DynamicWeightModule) for m in _each_module(model))


def is_explaining(module: nn.Module) -> bool:
    """True if any dynamic-weight submodule of ``module`` is in explanation mode."""
    _require_module(module, "is_explaining(model)", "module")
    return any(m.explaining for m in module.modules() if isinstance(m, DynamicWeightModule))


@reusable_context
def explanation_mode(model: nn.Module | None = None) -> Iterator[nn.Module | None]:
    """Make every dynamic weight of ``model`` a constant for autograd while the block runs.

    Without ``model`` (``with explanation_mode():``) every dynamic-weight module that runs in the current
    thread is in explanation mode, whichever model it belongs to: the form for code that only holds a
    function (Captum's ``forward_func``). That form cannot switch dropout off: call ``model.eval()`` first.

    The mode holds for the calling thread only: another thread running the same model at the same time (training
    it, or explaining it in its own ``explanation_mode``) runs it as it would without this block. Nested and
    re-entrant use is safe: each module's previous state is restored on exit, also when the block raises. The
    model is put in eval mode for the duration (dropout would otherwise make the explained function random) and
    its training flags are restored afterwards, when the last block holding it in eval mode ends (also when that
    block runs in another thread). The training flags are the modules' own, seen by every thread: a thread that
    trains the model with dropout while another explains it runs without dropout meanwhile, and ``model.train()``
    called in another thread during the block makes the explained function random: a block at whose end the model is
    in training mode and has dropout raises ``BcosValueError`` (docs/in-depth.md, "Threads").

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
        _switch([_EVERY_MODULE], 1)
        try:
            yield None
        finally:
            _switch([_EVERY_MODULE], -1)
        return
    _require_module(model, "explanation_mode(model), or explanation_mode() for every module this thread runs")
    modules, training_flags = _dynamic_modules_and_training(model)
    keys = [id(m) for m in modules]  # the modules stay alive (``modules``) until the block ends: no id is reused
    with _in_eval_mode(model, training_flags):
        _switch(keys, 1)
        try:
            yield model
        finally:
            _switch(keys, -1)


@reusable_context
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


# the models held in eval mode by explanation_mode / evaluating blocks, in any thread: id(model) -> [how many blocks
# hold it, the training flags the last of them restores]. A block that finds the model held (the model already in eval
# mode because another thread's block switched it) joins the hold instead of restoring nothing on its own exit: the
# first block to end restored the training flags while the other thread still explained, silently with dropout.
_EVAL_HOLDS: dict[int, list] = {}
_EVAL_HOLDS_LOCK = threading.RLock()  # re-entrant: a model's train() override may run an explanation itself


@contextmanager
def _in_eval_mode(model: nn.Module, training_flags: list[tuple[nn.Module, bool]] | None) -> Iterator[None]:
    """``model`` in eval mode inside, and afterwards every module's training flag as recorded
    (:func:`_dynamic_modules_and_training`): ``model.train`` with the model's own flag (a model's ``train`` override
    runs, as it did before), then the modules whose flag differed from the model's set one by one. Nothing is
    switched when no module was training (``training_flags`` is ``None``): eval() and the restoring train() walk the
    whole model (transformers' train() more than that), and a model already wholly in eval mode (every explain call
    after the first) needs neither. A model held in eval mode by another block (this thread's or another's,
    ``_EVAL_HOLDS``) is restored when the last of those blocks ends."""
    key = id(model)
    with _EVAL_HOLDS_LOCK:
        hold = _EVAL_HOLDS.get(key)
        # (flags read before another thread's block switched the model, under this lock, are stale: read again)
        if hold is not None and (training_flags is None or not any(m.training for m, _ in training_flags)):
            hold[0] += 1  # switched by a block still running: restored when the last block ends
        elif training_flags is None:
            hold = None
        else:  # (a module switched back to training under a running block: switched and restored by this block)
            hold = [1, training_flags]
            if key not in _EVAL_HOLDS:
                _EVAL_HOLDS[key] = hold
            model.eval()
    if hold is None:
        yield
        _refuse_training_switched_on(model)
        return
    try:
        yield
        _refuse_training_switched_on(model)  # before the restore below, which may switch it on itself
    finally:
        with _EVAL_HOLDS_LOCK:
            hold[0] -= 1
            if hold[0] == 0:
                if _EVAL_HOLDS.get(key) is hold:
                    del _EVAL_HOLDS[key]
                flags = hold[1]
                model.train(flags[0][1])  # the walk records the model first
                for module, was_training in flags:
                    if module.training != was_training:
                        module.training = was_training


def _refuse_training_switched_on(model: nn.Module) -> None:
    """Refuse the result of a block during which ``model`` was switched back to training mode (``model.train()``,
    e.g. by transformers' ``Trainer`` in another thread, at every step) if it has dropout: the block's forward passes
    may have run with dropout, a random function, and the explanation or score came back without a word (a tiny BERT's
    explained logits 0.19 off, completeness intact). One attribute read at the block's end; seen only if the flag is
    still on then (a ``train()`` undone by ``eval()`` within the block, or on a submodule only, goes unseen), and
    refused also when the switch came after the block's last forward pass, which then ran without dropout."""
    if model.training and _has_dropout(model):
        raise argument_error(
            "model", "was switched to training mode while this explanation (or metric) ran: model.train() in "
            "another thread (a Trainer calls it at every step) or in the block; with its dropout the explained "
            "function may have been random", "Explain a copy of the model that no other thread trains "
            "(copy.deepcopy(model)), or explain between training steps")


def _has_dropout(model: nn.Module) -> bool:
    """Whether training mode changes ``model``'s function: a dropout module with p > 0, or an attention module's
    ``attention_dropout`` rate > 0 (Llama, Mistral, Qwen, Gemma 2, ModernBERT pass it to the attention function)."""
    for module in _each_module(model):
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
        rate = getattr(module, "attention_dropout", None)
        if isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0:
            return True
    return False


def _each_module(model: nn.Module) -> Iterator[nn.Module]:
    """Every module of ``model`` once, ``model`` first, those ``model.modules()`` yields but walked over the
    ``_modules`` dicts directly: ``model.modules()`` runs ``named_modules``, which builds every module's dotted name
    and a generator per level (:func:`explanation_mode`'s entry and exit took 92 us with it, 39 us with this walk, on
    a 2-layer Qwen2; docs/benchmarks.md, 2026-11-28 05:12 UTC), breadth-first. The walk of
    :func:`has_dynamic_weights` and :func:`_has_dropout` (:func:`_dynamic_modules_and_training` runs the same walk
    written out), afresh at every call, so a submodule replaced or added since the last call is seen (no cache to go
    stale: a module added by ``ModuleList.insert``, a ``_modules`` write or ``del`` fires no registration hook)."""
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
    """The dynamic-weight modules of ``model`` (each once, ``model`` included: those ``model.modules()`` yields,
    breadth-first) and, if any module of it is in training mode, every module's training flag (``model``'s first;
    ``None`` when none is: nothing to switch or restore, see :func:`evaluating`), from one walk (:func:`_each_module`'s,
    in one loop).
    """
    # _each_module's walk written out, sorting and reading the flags as it goes: one loop instead of a generator and
    # two passes over its list (docs/benchmarks.md#bench-core-method, 2026-11-28 17:04 UTC)
    modules = [model]
    seen = {model}
    dynamic = []
    training = False
    for m in modules:  # the list grows while it is read: each module once, model first
        if isinstance(m, DynamicWeightModule):
            dynamic.append(m)
        if m.training:
            training = True
        for child in m._modules.values():
            if child is not None and child not in seen:
                seen.add(child)
                modules.append(child)
    # the flags are paired with their modules only where something is switched (after the first call, never)
    return dynamic, ([(m, m.training) for m in modules] if training else None)

