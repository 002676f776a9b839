"""Annealing the alignment pressure B during training (a transformers ``TrainerCallback``)."""

from __future__ import annotations

import functools
import math

from torch import nn

from ._checks import require_number
from .convert.checkpoint_format import BCOS_CONFIG_KEY
from .errors import BcosTypeError, argument_error
from .losses import own_training_loss
from .nn.linear import AlignmentPressure, check_b

__all__ = ["BWarmupCallback", "refuse_a_second_schedule", "refuse_evaluations_compared_during"]


class _LazyCallbackType(type):
    """The type of :class:`BWarmupCallback`: its instances are of a ``transformers.TrainerCallback`` subclass built on
    first use (:func:`_callback_class`), which this type counts as its own in ``isinstance`` / ``issubclass``.

    Each instance had a class of its own, unrelated to ``BWarmupCallback``: ``isinstance(callback, BWarmupCallback)``
    was False, so ``trainer.remove_callback(BWarmupCallback)`` / ``pop_callback`` left the warm-up in the trainer
    (a second ``train()`` annealed B again) and transformers' warning of a second callback of the same class never
    came, without a word."""

    def __instancecheck__(cls, instance) -> bool:
        return isinstance(instance, _callback_class())

    def __subclasscheck__(cls, subclass) -> bool:
        return isinstance(subclass, type) and issubclass(subclass, _callback_class())


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    return type("BWarmupCallback", (_BWarmup, TrainerCallback), {"__module__": __name__,
                                                                 "__qualname__": "BWarmupCallback"})


class BWarmupCallback(metaclass=_LazyCallbackType):
    """Anneal the alignment pressure B of every B-cos layer from ``start`` to the model's B during training.

    A pretrained model B-cosified with B > 1 starts far from its pretrained function: every B-cos layer scales
    its output by ``|cos|^(B-1)`` (about 0.3 for B = 1.5 and typical cosines), so the sub-layers' share of the
    residual stream collapses and short fine-tunings cannot recover. With B = 1 the converted model is close
    to the pretrained one (only biases removed); raising B linearly over the first ``fraction`` of the
    training steps lets the weights align as the pressure grows (with ``fraction=1`` B reaches the model's B on the
    last step, so that the last step, and an evaluation after it, run at the B of the model returned). At the end
    every layer has the target B
    recorded in ``model.config.bcos["b"]``, so saved models are ordinary B-cos models. Every layer stores the B
    it runs with in its checkpoint entry ``bcos_b``, so a Trainer checkpoint written during the warm-up (or a
    model saved after an interrupted one) reloads at the B it was running with, not the final one. It is an
    option to experiment with, not a recommendation (docs/benchmarks.md has what it measured). The layers keep
    the model's B until training begins (an evaluation or a save before ``train()`` runs at the model's B).
    ``load_best_model_at_end``, and any ``metric_for_best_model`` (which ``EarlyStoppingCallback``,
    ``save_strategy="best"`` and ``lr_scheduler_type="reduce_lr_on_plateau"`` compare evaluations by), are refused
    unless no evaluation runs before the warm-up ends (``eval_delay`` past it, or a first multiple of ``eval_steps`` past
    it, with ``eval_strategy="steps"``; in epochs with ``"epoch"``, where the epochs provably cover the warm-up's
    steps): the best checkpoint could be one
    evaluated at a smaller B, and the model's B set on it at the end would change the logits its metric was measured
    on; and evaluations at a rising B compare different models, so a metric that worsens as B rises would stop the
    training early or cut the learning rate.
    ``eval_on_start`` does not change that: its evaluation runs at global step 0, so at B = ``start`` (the B training
    begins with), and the Trainer chooses the best model among saved checkpoints only, never from it.

    A model that holds a converted part takes the part's B (a Space Model over a B-cos encoder: the encoder's
    ``config.bcos['b']``; every B-cos layer it holds is annealed). ``label_smoothing_factor`` is refused when training
    begins for a model whose own loss is not the cross-entropy (``BcosViT``'s B-cos BCE, a Space Model's loss):
    transformers' ``Trainer`` then takes the labels away from the model and trains its own smoothed cross-entropy of
    the logits instead (with a ``compute_loss_func`` it ignores the factor), and the model never sees the setting.

    Built lazily as a ``transformers.TrainerCallback`` subclass so that importing this module stays cheap.
    """

    def __new__(cls, *args, **kwargs):
        instance = object.__new__(_callback_class())
        instance.__init__(*args, **kwargs)
        return instance


class _BWarmup:
    def __init__(self, model: nn.Module, start: float = 1.0, fraction: float = 0.5) -> None:
        if not isinstance(model, nn.Module):  # None said "has no config.bcos", naming neither the argument's type nor it
            raise argument_error("model", f"expected the B-cos model (a torch.nn.Module), got {type(model).__name__}",
                                 "pass the model bcosify returned: BWarmupCallback(model)", kind=BcosTypeError)
        config = getattr(model, "config", None)
        settings = getattr(config, BCOS_CONFIG_KEY, None)
        if isinstance(settings, dict):
            target, where = settings.get("b"), "config.bcos['b']"
        elif getattr(config, "model_type", None) == "bcos_vit":
            target, where = config.b, "config.b"
        else:
            # a model holding a B-cos part (a Space Model over a B-cos encoder keeps config.bcos on its encoder): that
            # part's B. It was refused as a model "never converted with bcosify"
            target, where = _inner_bcos_b(model)
        self.fraction = require_number("fraction", fraction, low=0.0, low_open=True, high=1.0)
        self.start = check_b(start, name="start")
        self.target = check_b(target, name=where)
        if self.start > self.target:
            raise argument_error("start", f"{self.start} is larger than the model's B {self.target}",
                                 "warm up from a smaller B (default 1.0)")
        self.layers = [m for m in model.modules() if isinstance(m, AlignmentPressure)]
        if not self.layers:
            raise argument_error("model", "has no B-cos layers", "call bcosify(model, b=...) first")
        # B is first lowered when training begins, not here: constructing the callback set every layer to start,
        # so a trainer.evaluate() or a save_pretrained before train() ran at B = start, not the model's B

    # fine_tune_classifier sets it False on the callback it builds: its compute_loss_func applies the smoothing itself
    # and it refuses label_smoothing_factor where that would drop a model's own loss
    refuse_smoothing_of_own_loss = True

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # built for one model and handed to the Trainer of another, it annealed the B of the model it was built for
        # while the trained one ran at its full B throughout, without a word
        trained = {id(m) for m in model.modules()} if isinstance(model, nn.Module) else None
        if trained is not None and not all(id(layer) in trained for layer in self.layers):
            raise argument_error("model", "BWarmupCallback was built for another model than the one the Trainer "
                                 "trains: it would anneal B in that model's layers while the trained one runs at its "
                                 "full B", "build the callback with the model passed to the Trainer: "
                                 "BWarmupCallback(model) and Trainer(model=model, ...)")
        mine = {id(layer) for layer in self.layers}
        refuse_a_second_schedule(state, self, "BWarmupCallback", "B",
                                 lambda other: bool(mine & {id(layer) for layer in other.layers}),
                                 restore=lambda: self._set(self.target))  # (the first one lowered B: put back)
        own_loss = own_training_loss(model) if isinstance(model, nn.Module) else None
        if self.refuse_smoothing_of_own_loss and own_loss and getattr(args, "label_smoothing_factor", 0):
            # the model never sees the setting: the Trainer pops the labels and trains its smoothed cross-entropy of
            # the logits instead of the model's loss (a tiny BcosViT's BCE of 0.667 trained as 1.558), silently
            raise argument_error("label_smoothing_factor", f"is {args.label_smoothing_factor!r}, but "
                                 f"{type(model).__name__} trains with its own loss, {own_loss}, and transformers' "
                                 "Trainer with label_smoothing_factor takes the labels away from the model and "
                                 "trains its smoothed cross-entropy of the logits instead (or, given a "
                                 "compute_loss_func, ignores the factor)", "leave label_smoothing_factor out (0) to "
                                 "train the model's own loss")
        if self.start < self.target:
            refuse_evaluations_compared_during(
                args, state, self._last_warm_step(state), schedule="B warm-up", phase="warm-up",
                runs_at="at a smaller B than the model's", end_change="setting the model's B on it",
                worsens="as B rises")
        self.on_step_begin(args, state, control)  # from the global step: a resumed run continues its warm-up

    def _set(self, b: float) -> None:
        for layer in self.layers:
            layer.b = b

    def _last_warm_step(self, state) -> int:
        """The global step at whose beginning B reaches the target: ``fraction`` of the steps, and at the latest the
        last step. With ``fraction=1`` the ramp ended one step after training did, so the last step (and the evaluation
        after it) ran below the model's B, and on_train_end changed the logits of the model it returned after they
        were last evaluated."""
        return min(max(1, int(state.max_steps * self.fraction)), max(0, state.max_steps - 1))

    def on_step_begin(self, args, state, control, **kwargs):
        last = self._last_warm_step(state)
        t = 1.0 if last == 0 else min(1.0, state.global_step / last)
        self._set(self.start + t * (self.target - self.start))

    def on_train_end(self, args, state, control, **kwargs):
        self._set(self.target)


def _inner_bcos_b(model: nn.Module) -> tuple[float, str]:
    """The B of the one B-cos part a model holds (a module whose ``config.bcos`` bcosify wrote: a Space Model's
    encoder) and where it is read, or a refusal that says what the model holds and what to do."""
    found: dict[int, tuple[str, dict]] = {}
    for path, module in model.named_modules():
        settings = getattr(getattr(module, "config", None), BCOS_CONFIG_KEY, None)
        if path and isinstance(settings, dict) and id(module.config) not in found:
            found[id(module.config)] = (path, settings)
    has_layers = any(isinstance(m, AlignmentPressure) for m in model.modules())
    if not found:
        layers = " (it holds B-cos layers, but no record of the B they were converted with)" if has_layers else ""
        raise argument_error("model", f"{type(model).__name__} has no config.bcos, nor does any module it holds"
                             f"{layers}: BWarmupCallback needs a model converted with bcosify, a BcosViT, or a model "
                             "holding one (a Space Model over a B-cos encoder), and reads the target B from the "
                             "config bcosify writes", "call bcosify(model, b=...) on the model (or on the encoder "
                             "before SpaceModelForSequenceClassification.from_encoder(encoder, ...))")
    targets = {settings.get("b") for _, settings in found.values()}
    if len(targets) > 1:
        parts = ", ".join(f"{path} (B {settings.get('b')})" for path, settings in found.values())
        raise argument_error("model", f"holds B-cos parts converted with different B: {parts}; BWarmupCallback "
                             "anneals every B-cos layer to one target B", "convert the parts with the same B")
    path, settings = next(iter(found.values()))
    return settings.get("b"), f"{path}.config.bcos['b']"


def refuse_a_second_schedule(state, callback, name: str, value: str, same_model, restore=None) -> None:
    """Refuse, when training begins, a second schedule callback of ``callback``'s class in the same run acting on the
    same model (``same_model(other)``): each sets ``value`` before every step, so the model followed the one called
    last, not the one whose refusals were checked, without a word (two ``SwishBetaToBilinear`` also failed after the
    last step, the second finalising a bilinear model). ``restore()`` undoes what the first did when training began.
    The run's ``TrainerState`` is new for each ``train()`` call, so it holds this run's schedules only."""
    running = vars(state).setdefault("_bcos_schedules", []) if hasattr(state, "__dict__") else []
    if any(type(other) is type(callback) and other is not callback and same_model(other) for other in running):
        if restore is not None:
            restore()
        raise argument_error("callbacks", f"holds two {name} instances for the same model: each sets {value} before "
                             "every step, so the model would follow the one called last", "keep one: remove the other "
                             f"with trainer.remove_callback({name}) before adding yours")
    running.append(callback)


def refuse_evaluations_compared_during(args, state, last: int, *, schedule: str, phase: str, runs_at: str,
                                       end_change: str, worsens: str) -> None:
    """Refuse, when training begins, what compares evaluations run while a schedule still changes the model's function
    (the B warm-up, :class:`~bcos_plugins.bilinear.SwishBetaToBilinear`'s annealing), which reaches its end value at
    the beginning of global step ``last``. An evaluation at global step ``g`` runs with the value set when step ``g``
    began (global step ``g - 1``), so where the first evaluation is past ``last`` (with ``eval_strategy="steps"`` the
    first multiple of ``eval_steps`` from ``eval_delay`` on; with ``"epoch"`` an ``eval_delay`` in epochs that provably
    covers it) none runs during the schedule.

    - ``load_best_model_at_end``: the Trainer loads the best checkpoint before the callbacks' ``on_train_end`` sets
      the end value on it (``end_change``), so a checkpoint chosen from the schedule came back as a function its
      metric was not measured on (nor the last one trained), without a word.
    - any other ``metric_for_best_model`` (``EarlyStoppingCallback``, which transformers 5 no longer ties to
      ``load_best_model_at_end``; ``save_strategy="best"``; ``lr_scheduler_type="reduce_lr_on_plateau"``): the
      evaluations compared are of different functions, and a metric that worsens as the schedule moves read as no
      progress (early stopping ended a 12-step B warm-up after step 3, B 1.09 of 1.5; the plateau schedule cut the
      rate 100-fold within it), without a word.

    ``schedule`` and ``phase`` name the schedule in the refusal, ``runs_at`` how an evaluation during it runs,
    ``end_change`` what ``on_train_end`` does to the model, ``worsens`` when the metric worsens."""
    # (a callback driven by hand, without TrainingArguments, evaluates nothing)
    strategy = getattr(args, "eval_strategy", "no")
    strategy = getattr(strategy, "value", strategy)
    delay = getattr(args, "eval_delay", 0) or 0
    if strategy not in ("steps", "epoch") or (strategy == "steps" and _first_step_evaluation(state, delay) > last
                                              or strategy == "epoch" and _epoch_evaluations_wait_past(state, delay,
                                                                                                      last)):
        return
    fix = (f"evaluate only after the {phase} (eval_strategy='steps', eval_delay={last + 1}"
           f"{_epoch_delay_fix(state, last) if strategy == 'epoch' else ''}), or leave")
    if getattr(args, "load_best_model_at_end", False):
        raise argument_error("load_best_model_at_end", f"is True with a {schedule} to step {last + 1}: a checkpoint "
                             f"evaluated during the {phase} runs {runs_at}, and {end_change} when training ends would "
                             "change the logits its metric was measured on", f"{fix} load_best_model_at_end out")
    consumer = getattr(args, "metric_for_best_model", None)
    if consumer is not None:
        raise argument_error("metric_for_best_model", f"is {consumer!r} with evaluations during a {schedule} to step "
                             f"{last + 1}: the Trainer compares evaluations by it (EarlyStoppingCallback, "
                             "save_strategy='best', lr_scheduler_type='reduce_lr_on_plateau'), and one run during the "
                             f"{phase} runs {runs_at}, so a metric that worsens {worsens} reads as no progress "
                             "(training stopped, the learning rate cut)", f"{fix} metric_for_best_model out (and the "
                             "early stopping, best-only saving or plateau schedule that reads it)")


def _first_step_evaluation(state, delay: float) -> float:
    """The global step of the first evaluation of ``eval_strategy="steps"``: the Trainer evaluates where
    ``global_step % state.eval_steps == 0`` and ``global_step >= eval_delay``, so at the first multiple of
    ``eval_steps`` from ``max(1, eval_delay)`` on (``eval_delay`` itself where ``eval_steps`` is unknown). Only
    ``eval_delay`` was read: a run evaluating every 50 steps was refused for a warm-up that ended at step 20."""
    every = getattr(state, "eval_steps", None)
    first = max(1.0, float(delay))
    if isinstance(every, int | float) and not isinstance(every, bool) and every > 0:
        return math.ceil(first / every) * every
    return delay


def _epoch_evaluations_wait_past(state, delay: float, last: int) -> bool:
    """Whether every evaluation of ``eval_strategy="epoch"`` provably runs after global step ``last``. The Trainer
    evaluates at an epoch's end once ``state.epoch >= eval_delay`` (``eval_delay`` counts epochs there), so first at
    the end of epoch ``max(1, ceil(eval_delay))``, or at ``max_steps`` (past ``last``) where training stops inside an
    epoch. An epoch has the same number of optimiser steps each time, at least ``max_steps / num_train_epochs`` (the
    Trainer's ``num_train_epochs`` rounds ``max_steps / steps_per_epoch`` up), so that epoch ends at a global step of
    at least ``max(1, ceil(eval_delay)) * max_steps / num_train_epochs``: accepted when that is past ``last``, in
    integers (an eval_delay in epochs that covers the warm-up was refused as if it were steps)."""
    epochs, steps = getattr(state, "num_train_epochs", 0) or 0, getattr(state, "max_steps", 0) or 0
    if epochs <= 0 or steps <= 0:
        return False
    return max(1, math.ceil(delay)) * steps >= (last + 1) * epochs


def _epoch_delay_fix(state, last: int) -> str:
    """``"; or eval_strategy='epoch', eval_delay=<epochs>"``: the smallest whole number of epochs that
    :func:`_epoch_evaluations_wait_past` accepts, where it is within the run's epochs ("" otherwise)."""
    epochs, steps = getattr(state, "num_train_epochs", 0) or 0, getattr(state, "max_steps", 0) or 0
    if epochs <= 0 or steps <= 0:
        return ""
    need = max(1, -(-(last + 1) * epochs // steps))
    return f"; or eval_strategy='epoch', eval_delay={need}" if need <= epochs else ""
