"""Training losses of B-cos classifiers.

- :func:`bcos_loss`: binary cross-entropy on one-hot targets, from logits (numerically stable, unlike
  sigmoid-then-BCE), with transformers ``Trainer``'s ``compute_loss_func`` signature.
- :func:`cross_entropy_loss`: the cross-entropy of a sequence classifier or a masked LM, with the same signature,
  exact under gradient accumulation (transformers' own classifier and masked-LM losses are not).
- :class:`DistillationLoss`: the task loss plus a distillation term towards a teacher's logits.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import require_class_ids, require_number
from .errors import BcosTypeError, argument_error

__all__ = ["bcos_loss", "cross_entropy_loss"]

IGNORE_INDEX = -100  # transformers' (and torch's) label of a position without loss


def own_training_loss(model: torch.nn.Module) -> str | None:
    """What a model of the package computes as its training loss where that is not the cross-entropy transformers'
    label smoother (and ``fine_tune_classifier``'s ``loss='auto'``) would put in its place (``BcosViT``'s B-cos BCE,
    a Space Model's loss: a class with ``trains_with_its_own_loss = True``), else ``None``. The one reading of "the
    model has its own loss": ``BWarmupCallback`` refuses label smoothing over it and ``fine_tune_classifier`` trains
    it as it is."""
    if getattr(getattr(model, "config", None), "model_type", None) == "bcos_vit":
        return "the B-cos BCE on one-hot targets (bcos_loss)"
    if getattr(type(model), "trains_with_its_own_loss", False) is True:
        return "the cross-entropy plus the inter- and intra-space terms its config weighs"
    return None


def bcos_loss(outputs, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """Binary cross-entropy from logits on one-hot targets (B-cos training objective).

    Usable directly as ``Trainer(..., compute_loss_func=bcos_loss)``. ``outputs`` is a model output with
    ``.logits`` (or the logits tensor); ``labels`` are class ids ``(batch,)``. The loss is the mean over
    rows and classes; with ``num_items_in_batch`` (gradient accumulation) rows are summed and divided by it.
    Half-precision logits are read in float32. There is no label smoothing: a ``Trainer`` with a
    ``compute_loss_func`` never calls its label smoother, so ``label_smoothing_factor`` does nothing here
    (:func:`~bcos_plugins.fine_tuning.fine_tune_classifier` refuses it with this loss).

    Returns:
        The loss, a 0-d tensor in at least float32 (on the logits' device, with their graph).

    Raises:
        BcosValueError / BcosTypeError: logits not ``(batch, classes)`` or an empty batch (whose mean would be
            NaN), one logit per row (one-hot over one class makes every target 1), labels not integer ids of shape
            ``(batch,)`` in ``[0, classes)``, ``num_items_in_batch`` below the batch's rows or not finite.
    """
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise argument_error("outputs", f"must be float logits or a model output with .logits, got "
                             f"{type(logits).__name__}", "pass the model's output (or its logits)",
                             kind=BcosTypeError)
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise argument_error("outputs", f"bcos_loss expects classifier logits of shape (batch, classes), got "
                             f"{tuple(logits.shape)}", "pass a sequence/image classifier's logits")
    if logits.shape[1] == 1:
        # one-hot over one class makes every target 1: a single-logit binary classifier's label 0 would be trained
        # towards class 1 (and label 1 is out of range), so the loss would be silently inverted
        raise argument_error("outputs", "has one logit per row: bcos_loss is BCE on one-hot targets over the "
                             "classes, and one class makes every target 1 (a single-logit binary classifier's "
                             "label 0 would be trained as 1)", "give the classifier two outputs (num_labels=2) "
                             "for a binary task")
    if logits.shape[0] == 0:
        raise argument_error("outputs", "the batch is empty (0 rows), whose mean loss is NaN",
                             "skip empty batches (check the data loader / dataset length)")
    if not isinstance(labels, Tensor):
        raise argument_error("labels", f"must be a tensor of class ids, got {type(labels).__name__}",
                             "pass torch.tensor(ids, dtype=torch.long)", kind=BcosTypeError)
    n_classes = logits.shape[-1]
    labels = require_class_ids("labels", labels, logits.shape[0], n_classes)
    logits = _at_least_float32(logits)
    one_hot = F.one_hot(labels.to(logits.device), n_classes).to(logits.dtype)
    if num_items_in_batch is None:
        return F.binary_cross_entropy_with_logits(logits, one_hot)
    n_items = num_items_in_batch.item() if isinstance(num_items_in_batch, Tensor) else num_items_in_batch
    # inf passed ">= 1" and made the loss 0 (no gradient) without a word
    if isinstance(n_items, bool) or not isinstance(n_items, numbers.Real) or not (
            n_items >= 1 and math.isfinite(n_items)):
        raise argument_error("num_items_in_batch", f"must be a count >= 1, got {num_items_in_batch!r}",
                             "pass the number of rows over all accumulated batches, or None")
    if n_items < logits.shape[0]:
        # the count is over every accumulated batch, this one among them: 2 for a batch of 4 rows scaled the loss
        # (and the gradients) up twofold without a word (cross_entropy_loss refuses the same)
        raise argument_error("num_items_in_batch", f"is {num_items_in_batch!r}, below this batch's "
                             f"{logits.shape[0]} rows: it counts the rows of every accumulated batch, this one among "
                             "them", "pass the number of rows over all accumulated batches, or None")
    per_row = F.binary_cross_entropy_with_logits(logits, one_hot, reduction="none").mean(-1)
    return per_row.sum() / num_items_in_batch


def _at_least_float32(logits: Tensor) -> Tensor:
    """Half-precision logits in float32 (as transformers' causal-LM loss reads them): the losses computed in bfloat16
    were 1e-3 (BCE) to 2e-3 (distillation's KL) off the loss of the same logits, 400 times their own rounding."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def cross_entropy_loss(outputs, labels: Tensor, num_items_in_batch: int | Tensor | None = None, *,
                       label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy from logits over every labelled row or token, as a ``Trainer`` ``compute_loss_func``.

    ``outputs`` is a model output with ``.logits`` (or the logits): ``(batch, classes)`` with class ids
    ``(batch,)``, or ``(batch, tokens, vocabulary)`` with token ids ``(batch, tokens)`` (a masked LM), where
    ``-100`` marks a position without loss. Without ``num_items_in_batch`` the loss is the mean over the labelled
    positions; with it (gradient accumulation) their sum divided by it, so the accumulated loss is the mean over
    every labelled position of the accumulated batches. ``label_smoothing`` is torch's (and the ``Trainer``'s
    ``label_smoothing_factor``: the same number). Half-precision logits are read in float32. No labelled
    position gives a loss of 0 (no gradient), not the NaN of an empty mean.

    Why not the model's own loss: transformers' sequence classifiers and masked LMs take ``**kwargs`` in their
    forward, so the ``Trainer`` hands them ``num_items_in_batch`` and leaves the division by the accumulation steps
    to them, and they ignore it: with ``gradient_accumulation_steps=k`` the loss and the gradients were k times
    too large (transformers 5.24).

    Raises:
        BcosValueError / BcosTypeError: logits not floating point, labels not integer ids of the logits' shape
            without their last dimension or outside ``[0, classes)`` (other than -100), ``num_items_in_batch`` not
            finite or below this batch's labelled positions, ``label_smoothing`` outside [0, 1].
    """
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.ndim < 2:
        raise argument_error("outputs", f"must be float logits (batch, ..., classes) or a model output with .logits, "
                             f"got {type(logits).__name__}", "pass the model's output (or its logits)",
                             kind=BcosTypeError)
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
        raise argument_error("labels", f"must be a tensor of integer ids, got {type(labels).__name__}"
                             f"{'' if not isinstance(labels, Tensor) else ' of ' + str(labels.dtype)}",
                             "pass torch.tensor(ids, dtype=torch.long)", kind=BcosTypeError)
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise argument_error("labels", f"has shape {tuple(labels.shape)}, but logits of shape "
                             f"{tuple(logits.shape)} need {tuple(logits.shape[:-1])}",
                             "pass one id per row (a classifier) or per token (a language model)")
    smoothing = require_number("label_smoothing", label_smoothing, low=0.0, high=1.0)
    labelled = labels != IGNORE_INDEX
    n_classes = logits.shape[-1]
    outside = labelled & ((labels < 0) | (labels >= n_classes))
    # one synchronisation for both counts on every training step (the range is read only to name it in the error)
    n_labelled, n_outside = torch.stack([labelled.sum(), outside.sum()]).tolist()
    if n_outside:
        # torch's IndexError ("Target 3 is out of bounds"; a device-side assert on a GPU) named neither the argument
        # nor the fix
        raise argument_error("labels", f"must be ids in [0, {n_classes}) or {IGNORE_INDEX} (no loss), got "
                             f"{int(labels[labelled].min())} to {int(labels[labelled].max())}",
                             "pass the class (or token) ids the model's logits index")
    if num_items_in_batch is None:
        count = n_labelled
    else:
        count = num_items_in_batch.item() if isinstance(num_items_in_batch, Tensor) else num_items_in_batch
        # the count is over every accumulated batch, this one among them: less than its own labelled positions
        # (a negative or zero count among them) would scale the loss up without a word
        if isinstance(count, bool) or not isinstance(count, numbers.Real) or not (
                math.isfinite(count) and count >= n_labelled):
            raise argument_error("num_items_in_batch", f"must be a count of the labelled positions over every "
                                 f"accumulated batch, at least this batch's {n_labelled}, got {num_items_in_batch!r}",
                                 "pass the Trainer's count (labels other than -100), or None")
    logits = _at_least_float32(logits)
    summed = F.cross_entropy(logits.reshape(-1, n_classes), labels.reshape(-1).to(logits.device),
                             ignore_index=IGNORE_INDEX, reduction="sum", label_smoothing=smoothing)
    return summed / max(count, 1)  # no labelled position: a sum of 0 over 1, not 0/0


class DistillationLoss:
    """Task loss + weight x distillation term, as a ``compute_loss_func`` (same scaling as :func:`bcos_loss`).

    The task loss is :func:`bcos_loss` (``use_bce``) or the cross-entropy; the term is ``"kl"``,
    ``T**2 * KL(softmax(teacher / T) || softmax(student / T))`` with ``T = temperature``, or ``"mse"``, the mean
    squared difference of the logits. The teacher's logits of the batch are handed over by the trainer
    (``trainer.teacher_batch``) because ``compute_loss_func`` only receives the outputs and the labels.
    """

    def __init__(self, use_bce: bool, weight: float, kind: str, temperature: float,
                 label_smoothing: float = 0.0) -> None:
        self.use_bce, self.weight, self.kind, self.temperature = use_bce, weight, kind, temperature
        self.label_smoothing = label_smoothing  # of the cross-entropy task loss (the Trainer's label_smoothing_factor)
        self.trainer = None

    def __call__(self, outputs, labels: Tensor, num_items_in_batch=None) -> Tensor:
        logits = outputs.logits if hasattr(outputs, "logits") else outputs
        if isinstance(logits, Tensor):
            logits = _at_least_float32(logits)
        teacher = self.trainer.teacher_batch.to(logits.device, logits.dtype)
        if self.use_bce:
            task = bcos_loss(logits, labels, num_items_in_batch)
        else:
            task = cross_entropy_loss(logits, labels, num_items_in_batch, label_smoothing=self.label_smoothing)
        if self.kind == "kl":
            t = self.temperature
            per_row = t * t * F.kl_div(F.log_softmax(logits / t, -1), F.log_softmax(teacher / t, -1),
                                       log_target=True, reduction="none").sum(-1)
        else:
            per_row = (logits - teacher).pow(2).mean(-1)
        term = per_row.mean() if num_items_in_batch is None else per_row.sum() / num_items_in_batch
        return task + self.weight * term
