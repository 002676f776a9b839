"""Attention supervision: a training-time loss that pulls the [CLS] attention of the guided layers towards
the normalised gold rationale mask.

Why it exists: Eq. 3/4/5 guidance changes the attention only while the mask is applied, so the attention
learns nothing that survives evaluation without masks (issue 20: IoU 0.063 guided vs 0.062 vanilla). This
loss trains the attention itself: ``weight * KL(gold / sum(gold) || attention)``, with the attention of
``query_position`` averaged over heads and ``layers`` (:func:`attention_token_scores`). Rows without any
rationale token (e.g. neutral / contradiction pairs without highlight) are left out of the mean. It needs
the gold mask, so it is a training loss only; the model itself still refuses masks in eval mode.

``valid_mask`` (e.g. the text tokens of :func:`~bcos_plugins.guided.text_token_mask`) renormalises the
attention over those positions before the divergence, so the loss only ranks text tokens against each
other: BERT-family models park much of their attention on [CLS] / [SEP] (a no-op), and pulling that mass
onto the rationale as well changes what the classifier reads (on e-SNLI MiniLM it cost accuracy before the
alignment reached twice chance; docs/methods/self-guided-attention.md). The rationale metrics score text
tokens only, so the renormalised loss targets exactly what they measure.

``objective="rank"`` asks for less: every rationale token's attention above every other compared token's by
a factor ``exp(margin)``, a hinge on the differences of log attention,

    ``mean over (g, o) pairs of relu(margin - (log a_g - log a_o))``,

with ``g`` a rationale token and ``o`` another compared token (pairs weighted by ``gold_g * (1 - gold_o)``
for soft masks; a token is never paired with itself). Once the rationale leads by the margin the term is zero, so the attention's remaining
mass (on the hypothesis of an NLI pair, say) is left to the task, where the KL target keeps pulling all of
it onto the rationale. It is invariant to the renormalisation over ``valid_mask`` (a shift of every log
attention of a row), which then only chooses the compared tokens. The top-k IoU and AUPRC of the rationale
metrics depend on exactly this ranking.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_choice, require_float, require_int, require_seed, require_tensor
from ..errors import argument_error
from ..nn.functional import at_least_float32
from .attention import attention_token_scores
from .guidance import check_rationale_mask

__all__ = ["SUPERVISION_OBJECTIVES", "PlateauGate", "PlateauRestart", "PlateauWatch", "attention_supervision_loss",
           "supervision_warmup_factor"]

SUPERVISION_OBJECTIVES = ("kl", "rank")


def attention_supervision_loss(
    attentions: Sequence[Float[Tensor, "batch head query key"]],
    rationale_mask: Float[Tensor, "batch key"],
    attention_mask: Tensor | None = None,
    layers: int | Sequence[int] = -1,
    valid_mask: Tensor | None = None,
    weight: float = 1.0,
    query_position: int = 0,
    eps: float = 1e-8,
    heads: int | Sequence[int] | None = None,
    objective: str = "kl",
    margin: float = 1.0,
) -> Float[Tensor, ""]:
    """``weight`` x the mean over rows with a rationale of ``KL(gold / sum(gold) || [CLS] attention)``, or of
    the ranking hinge with ``objective="rank"`` (module docstring).

    Args:
        attentions: ``model(..., output_attentions=True).attentions`` of a training forward pass. Where they
            carry no gradient while autograd is on (reentrant gradient checkpointing records them without it) a
            ``UserWarning`` says that the loss trains nothing.
        rationale_mask: the gold mask ``(batch, key)`` in [0, 1]; padding is zeroed by ``attention_mask``.
        layers: the layer index or indices to supervise (the guided layers, e.g. ``[-2, -1]``).
        weight: the loss weight (0 turns it off).
        valid_mask: ``(batch, key)``, true at the positions the attention is compared on (text tokens); the
            attention is renormalised over them and the gold mask restricted to them. ``None``: all keys.
        heads: the head index or indices whose mean attention is supervised (``None``: all heads); the other
            heads of the supervised layers are left free.
        objective: ``"kl"`` (the divergence from the normalised mask) or ``"rank"`` (rationale tokens above the
            others by ``margin`` in log attention, then no pull).
        margin: of ``"rank"``, in log attention (1.0: each rationale token at least e = 2.7 times any other).
        eps: the floor of the probabilities before their log, in (0, 1).
    """
    weight = require_float("weight", weight, minimum=0.0)
    objective = require_choice("objective", objective, SUPERVISION_OBJECTIVES)
    margin = require_float("margin", margin, minimum=0.0)
    eps = require_float("eps", eps, minimum=0.0, open_minimum=True)
    if eps >= 1.0:  # every probability floored to eps: the loss was 0 for any attention, without a word
        raise argument_error("eps", f"must be below 1 (it floors the probabilities before their log), got {eps}",
                             "Pass a small floor such as the default 1e-8")
    # in at least float32: in float16 / bfloat16 the eps floor (1e-8) rounds to 0, and log(0) made the loss NaN; float64
    # attentions stay float64 (.float() rounded a float64 model's loss to 7 digits)
    scores = attention_token_scores(attentions, layers=layers, query_position=query_position, heads=heads,
                                    attention_mask=attention_mask)
    scores = scores.to(at_least_float32(scores.dtype))
    batch, n_keys = scores.shape
    gold = check_rationale_mask(rationale_mask, batch, n_keys).to(scores.dtype)
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != (batch, n_keys):
            raise argument_error("attention_mask", f"must have shape (batch, key) = ({batch}, {n_keys}), got "
                                 f"{tuple(getattr(attention_mask, 'shape', ()))}", "Pass the batch's attention mask")
        gold = gold * attention_mask.to(gold.dtype)
    if valid_mask is not None:
        if not isinstance(valid_mask, Tensor) or valid_mask.shape != (batch, n_keys):
            raise argument_error("valid_mask", f"must have shape (batch, key) = ({batch}, {n_keys}), got "
                                 f"{tuple(getattr(valid_mask, 'shape', ()))}",
                                 "Pass the batch's text-token mask (text_token_mask), padded like input_ids")
        # 0/1 only: a 2 weighted that token's attention twice in the renormalisation, a NaN zeroed the loss
        valid = require_tensor("valid_mask", valid_mask, kind="mask").to(scores.dtype)
        gold = gold * valid
        scores = scores * valid / (scores * valid).sum(1, keepdim=True).clamp_min(eps)
    if weight > 0 and torch.is_grad_enabled() and not scores.requires_grad:
        # (after the mask checks, so an input they refuse does not warn first; the casts and masking keep requires_grad)
        # transformers 5 records attentions with hooks: under reentrant gradient checkpointing
        # (gradient_checkpointing_kwargs={"use_reentrant": True}) they come from the forward run without autograd, so
        # this term added nothing to the gradient (a tiny BERT's gradients were the task loss's alone, bit for bit),
        # silently. A warning, not a refusal: a value computed by hand from plain tensors is the same number
        warnings.warn("attention_supervision_loss: the attentions carry no gradient (no autograd graph behind the "
                      "supervised layers' attention), so this loss adds nothing to a training gradient: reentrant "
                      "gradient checkpointing records them in a forward without autograd (train with "
                      "gradient_checkpointing_kwargs={'use_reentrant': False}, transformers' default), as do detached "
                      "tensors. Compute it under torch.no_grad() where only its value is wanted.", UserWarning,
                      stacklevel=2)
    total = gold.sum(1)
    has_rationale = total > 0
    if not has_rationale.any():
        return scores.sum() * 0.0  # keeps the graph, contributes nothing
    if objective == "rank":
        compared = torch.ones_like(gold) if valid_mask is None else valid_mask.to(gold.dtype)
        if attention_mask is not None:
            compared = compared * attention_mask.to(gold.dtype)
        log_attention = torch.log(scores.clamp_min(eps))
        pairs = gold[:, :, None] * ((1 - gold) * compared)[:, None, :]  # (batch, rationale token, other token)
        # o = g is no pair: a soft token (0 < gold < 1) was ranked against itself, a difference of 0 whose hinge is the
        # margin for ever (0.1667 for a token leading every other by far), and the movable pairs weighed less
        pairs = pairs * (1 - torch.eye(n_keys, dtype=pairs.dtype, device=pairs.device))
        hinge = torch.relu(margin - (log_attention[:, :, None] - log_attention[:, None, :]))
        weights = pairs.sum((1, 2))
        ranked = weights > 0  # no pair: no rationale token, or every compared token is rationale
        if not ranked.any():
            return scores.sum() * 0.0
        per_row = (hinge * pairs).sum((1, 2))[ranked] / weights[ranked]
        return weight * per_row.mean()
    target = gold[has_rationale] / total[has_rationale, None]
    log_attention = torch.log(scores[has_rationale].clamp_min(eps))
    log_target = torch.log(target.clamp_min(eps))
    kl = (target * (log_target - log_attention)).sum(1)
    return weight * kl.mean()


def supervision_warmup_factor(step: int, total_steps: int, warmup: float, start: int = 0) -> float:
    """The factor of the supervision weight at optimiser step ``step`` of ``total_steps``: 0 before step
    ``start``, then a linear ramp from 0 at ``start`` to 1 at ``start + warmup * total_steps``, then 1
    (``warmup`` = 0: 1 from ``start`` on). :class:`PlateauGate` picks ``start`` from the task loss.

    Why: at the start of fine-tuning the task loss sits on the constant-prediction plateau (ln 2 for two
    classes) and its gradient is small, so even a small supervision term steers the first steps: applied from
    the first step on e-SNLI MiniLM it held runs on the plateau far longer than vanilla fine-tuning and cost
    them accuracy (docs/methods/self-guided-attention.md has the runs). Ramping the supervision in lets the task
    leave the plateau first. In a transformers ``Trainer``: ``supervision_warmup_factor(self.state.global_step,
    self.state.max_steps, warmup)``.
    """
    total_steps = require_int("total_steps", total_steps, minimum=1)
    step = require_int("step", step, minimum=0)
    warmup = require_float("warmup", warmup, minimum=0.0, maximum=1.0)
    start = require_int("start", start, minimum=0)
    if step < start:
        return 0.0
    if warmup == 0.0:
        return 1.0
    return min(1.0, (step - start) / (warmup * total_steps))


class PlateauGate:
    """Holds the supervision back until the task loss has left its constant-prediction plateau.

    ``factor(step, total_steps, warmup, task_loss)`` once per training step gives the supervision weight's
    factor: 0 while the plateau lasts, then :func:`supervision_warmup_factor` ramped from ``start``, the first
    step at which the running mean of the task loss (exponential, ``smoothing``) fell below ``threshold`` (then
    fixed; ``None`` before). ``update(step, task_loss)`` feeds the loss alone.

    Why: the supervision term is a second gradient that, added while the task gradient is still small (the loss
    at ``ln C`` for ``C`` classes, the constant prediction), can keep a slow-starting run on the plateau for
    good: on e-SNLI MiniLM a ramped-in run and its random-mask control stayed at ln 2 to the end where vanilla
    fine-tuning of the same seed left it early (docs/methods/self-guided-attention.md has the runs). Gated, a supervised run follows vanilla fine-tuning step for step
    (same seed and data order) until the task loss has left the plateau.

    Args:
        threshold: of the running task loss (e.g. ``0.9 * math.log(num_labels)``).
        smoothing: weight of the past in the running mean, in [0, 1).
    """

    def __init__(self, threshold: float, smoothing: float = 0.8):
        self.threshold = require_float("threshold", threshold, minimum=0.0, open_minimum=True)
        self.smoothing = require_float("smoothing", smoothing, minimum=0.0, maximum=1.0)
        if self.smoothing == 1.0:
            raise argument_error("smoothing", "must be below 1 (the running mean would never move)", "Pass e.g. 0.8")
        self.running: float | None = None
        self.start: int | None = None
        self.last_step: int | None = None

    def update(self, step: int, task_loss: float) -> int | None:
        """Feed one step's task loss; returns ``start`` (``None`` while the plateau lasts). Steps never go back: a
        gate tracks one run (the micro-batches of one step may share it)."""
        step = require_int("step", step, minimum=0)
        task_loss = require_float("task_loss", task_loss)
        if self.last_step is not None and step < self.last_step:
            # a gate reused for a second run kept the first run's running loss and start: the new run's supervision
            # was switched on from that start, plateau or not
            raise argument_error("step", f"is {step}, after step {self.last_step}: this PlateauGate already "
                                 f"tracked a run (running loss {self.running:.4g}, start {self.start})",
                                 "Make a new PlateauGate (or PlateauRestart.watch) for each training run")
        self.last_step = step
        self.running = task_loss if self.running is None else (
            self.smoothing * self.running + (1 - self.smoothing) * task_loss)
        if self.start is None and self.running < self.threshold:
            self.start = step
        return self.start

    def factor(self, step: int, total_steps: int, warmup: float, task_loss: float) -> float:
        """Feed one step's task loss; returns the supervision weight's factor at ``step`` (module docstring)."""
        start = self.update(step, task_loss)
        return 0.0 if start is None else supervision_warmup_factor(step, total_steps, warmup, start=start)


class PlateauWatch:
    """One attempt of a :class:`PlateauRestart` rule: feed it each training step's task loss with ``update``; it
    answers ``True`` at the check step when the attempt is still on the plateau and may be restarted.

    Attributes: ``gate`` (the :class:`PlateauGate` that tracks the running loss; ``left_at``, its ``start``, is
    the first step whose running loss fell below the threshold, ``None`` while the plateau lasts),
    ``check_step`` (the number of steps after which the check is made), ``final`` (the last attempt allowed:
    it is never stopped) and ``stopped_at`` (the step whose ``update`` answered ``True``, else ``None``).
    """

    def __init__(self, threshold: float, smoothing: float, check_step: int, final: bool):
        self.gate = PlateauGate(threshold, smoothing)
        self.check_step = check_step
        self.final = final
        self.stopped_at: int | None = None

    @property
    def left_at(self) -> int | None:
        return self.gate.start

    def update(self, step: int, task_loss: float) -> bool:
        """Feed the task loss of training step ``step`` (0-based); ``True``: stop this attempt now and restart."""
        self.gate.update(step, task_loss)
        if self.stopped_at is None and not self.final and self.left_at is None and step + 1 >= self.check_step:
            self.stopped_at = step
        return self.stopped_at is not None


class PlateauRestart:
    """The rule that restarts a fine-tuning run which has not left its constant-prediction plateau by a fixed
    point of its training.

    An attempt is stuck when the running mean of its task loss (:class:`PlateauGate`, ``smoothing``) has not
    fallen below ``threshold`` at any of its first ``ceil(check_fraction * total_steps)`` steps; it is then
    stopped and the run starts again from the pretrained model with ``attempt_seed(seed, restart)``, which
    reseeds the fresh classifier head and the data order. At most ``max_restarts`` restarts: the last attempt
    runs to the end whatever its loss, and whoever reports it must say whether it left the plateau
    (``PlateauWatch.left_at``). Attempt 0 uses ``seed`` itself, so a run that leaves the plateau before the
    check is the run it was without the rule. The rule depends on the seed and the task losses only: variants
    that train alike until the running loss has left the plateau (a supervision gated by a :class:`PlateauGate`
    of the same threshold, say) restart on the same attempts and stay paired.

    Why: on e-SNLI MiniLM a seed can leave stock fine-tuning on ln 2 for the whole run (predicting the majority
    class), and then every variant of that seed reports the alignment of a model that has learnt nothing; the
    slow seeds seen there left the plateau well before halfway, so the default check, halfway, restarts runs
    that are stuck, not slow (docs/methods/self-guided-attention.md has the runs).

    Usage (``total_steps`` the optimiser steps of a full attempt)::

        rule = PlateauRestart(0.9 * math.log(2))
        for restart in range(rule.max_restarts + 1):
            seed = rule.attempt_seed(base_seed, restart)
            watch = rule.watch(restart, total_steps)
            ...  # train from the pretrained model with ``seed``; each step: if watch.update(step, loss): stop
            if watch.stopped_at is None:
                break

    Args:
        threshold: of the running task loss (e.g. ``0.9 * math.log(num_labels)``, the plateau being ``ln C``).
        check_fraction: of the training steps after which a run still on the plateau is restarted, in (0, 1].
        max_restarts: restarts allowed after the first attempt (0: watch only, never restart).
        smoothing: of the running mean, as :class:`PlateauGate`.
    """

    def __init__(self, threshold: float, check_fraction: float = 0.5, max_restarts: int = 3, smoothing: float = 0.8):
        self.threshold = require_float("threshold", threshold, minimum=0.0, open_minimum=True)
        self.check_fraction = require_float("check_fraction", check_fraction, minimum=0.0, maximum=1.0,
                                            open_minimum=True)
        self.max_restarts = require_int("max_restarts", max_restarts, minimum=0)
        self.smoothing = PlateauGate(self.threshold, smoothing).smoothing  # one validation of the smoothing

    def check_step(self, total_steps: int) -> int:
        """The number of steps an attempt of ``total_steps`` gets to leave the plateau (at least 1)."""
        total_steps = require_int("total_steps", total_steps, minimum=1)
        return max(1, math.ceil(self.check_fraction * total_steps))

    def attempt_seed(self, seed: int, restart: int) -> int:
        """The seed of attempt ``restart`` (0: ``seed`` itself; then a hash of both, below 2**32, so that no
        attempt repeats another seed's first attempt the way ``seed + restart`` would)."""
        seed = require_seed("seed", seed, minimum=0, maximum=None)
        restart = require_int("restart", restart, minimum=0, maximum=self.max_restarts)
        if restart == 0:
            return seed
        digest = hashlib.blake2b(f"plateau-restart/{seed}/{restart}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big")

    def watch(self, restart: int, total_steps: int) -> PlateauWatch:
        """The watch of attempt ``restart`` of ``total_steps`` steps (the last allowed one is never stopped)."""
        restart = require_int("restart", restart, minimum=0, maximum=self.max_restarts)
        return PlateauWatch(self.threshold, self.smoothing, self.check_step(total_steps),
                            final=restart == self.max_restarts)
