"""Fine-tuning sequence classifiers with transformers' ``Trainer``: one call, an optimiser with a separate head
rate, and distillation from a teacher's logits."""

from __future__ import annotations

import contextlib
import functools
import numbers
import shutil
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

from ._checks import (
    refuse_a_model_as_the_tokenizer,
    require_classifier,
    require_finite_parameters,
    require_labels,
    require_number,
    require_run_settings,
    require_text_pairs,
    require_texts,
    require_trainable,
    require_training_argument_names,
    rows_named_as,
)
from .attribution.text import padding_named_as_tokenizers, registry_spec, rows_as_alone_call
from .b_warmup import BWarmupCallback
from .corpus import (
    mask_keywords,
    pad_rows,
    require_texts_with_tokens,
    require_tokenizer_ids_fit,
    truncated_token_counts,
    truncation_warned,
    warn_of_truncated_texts,
)
from .encoded_texts import EncodedTexts, truncation_length
from .errors import BcosError, BcosTypeError, argument_error
from .losses import DistillationLoss, bcos_loss, cross_entropy_loss, own_training_loss
from .nn.dynamic import evaluating, has_dynamic_weights
from .prediction import predict

__all__ = ["fine_tune_classifier", "two_rate_adamw"]


def fine_tune_classifier(
    model: nn.Module,
    tokenizer,
    texts: list[str],
    labels: list[int],
    *,
    text_pairs: list[str] | None = None,
    epochs: float = 1.0,
    batch_size: int = 32,
    learning_rate: float = 5e-5,
    head_learning_rate: float | None = None,
    max_length: int | None = None,
    output_dir: str | Path | None = None,
    loss: str = "auto",
    seed: int = 0,
    progress: bool = True,
    b_warmup: float | None = None,
    teacher: nn.Module | None = None,
    distill_weight: float | None = None,
    distill_loss: str = "kl",
    distill_temperature: float = 1.0,
    **training_args,
):
    """Fine-tune a sequence classifier with transformers' ``Trainer`` and return the trainer.

    The defaults are generic (stock or B-cos, one stage). The two-stage recipe
    :func:`bcos_plugins.pretrain.fine_tune_task_then_bcos` (conventional fine-tuning, ``bcosify`` with stock
    query/key at the B of its ``preset="accurate"`` (the default) or ``preset="faithful"``, see
    :data:`~bcos_plugins.pretrain.TASK_THEN_BCOS_PRESETS`, then this function at ``learning_rate=2e-4`` with
    ``warmup_steps=0.1, lr_scheduler_type="cosine"``) has its own defaults, since they suit a B-cos model that
    starts from a task-trained stock model, not a stock model or a B-cos model with a fresh head; docs/recipes.md
    and docs/benchmarks.md give what each recipe and preset measured.

    ``loss="auto"`` uses :func:`bcos_loss` (BCE on one-hot targets) for B-cos models and the cross-entropy
    otherwise (:func:`~bcos_plugins.losses.cross_entropy_loss`: the loss the model computes itself, but exact under
    ``gradient_accumulation_steps``, which transformers' classifiers are not, and with ``label_smoothing_factor``);
    ``"bce"`` / ``"ce"`` force one. A Space Model (:mod:`bcos_plugins.space`) trains under ``"auto"`` with its own
    loss (the cross-entropy plus the inter- and intra-space terms its config weighs; a teacher or
    ``label_smoothing_factor``, which would replace it by the cross-entropy, are refused there); under
    ``gradient_accumulation_steps`` that loss is the mean of the accumulated batches' means, not of their rows (a
    smaller last batch weighs as much as a full one). ``label_smoothing_factor``
    with ``bcos_loss`` is refused (the ``Trainer`` would ignore it). Padding is dynamic (:class:`PaddingWithMask`), on the
    tokenizer's side; a tokenizer that pads on the left is refused before training for a classifier that reads the
    first column (BERT, DistilBERT, RoBERTa, ModernBERT with ``classifier_pooling="cls"``). Models of the
    architecture registry are trained on the batches ``explain`` would compute (``rows_as_alone_call``), so each row
    is trained on as it would be alone: a decoder classifier's positions count real tokens under either padding
    side, and its padding is written as ``config.pad_token_id`` (where it reads the last token that is not).
    Sentence-pair tasks (NLI, paraphrase): ``text_pairs`` holds the second text of each example, encoded as the
    tokenizer's pair (``[CLS] text [SEP] pair [SEP]`` with token types for BERT), truncated longest first to
    ``max_length``; pass the same ``text_pairs`` to :func:`predict` / :func:`accuracy`. ``max_length`` defaults to
    64 tokens, capped at the model's position limit; a longer one is refused before training. A ``UserWarning``
    names the texts cut to it and the ``max_length`` that keeps every token, as :func:`predict` warns (once a call).

    ``head_learning_rate`` (default: ``learning_rate``) applies to the freshly initialised head (every
    parameter outside the encoder, plus the pooler). B-cos logits are bounded by the norm of their input
    and grow only as the head's weights align with it, so a short CPU fine-tuning converges much faster
    with a larger head rate (the paper trains 5 epochs on GPUs instead). ``b_warmup=f`` anneals B from 1 to
    the model's B over the first fraction ``f`` of the steps (:class:`BWarmupCallback`). With ``head_learning_rate``
    the optimiser is the one the ``Trainer`` builds from the ``TrainingArguments`` (``optim``, ``adam_epsilon``,
    weight decay on all but biases and norms), with two rates. Extra keyword
    arguments go to ``TrainingArguments``; ``resume_from_checkpoint`` (a checkpoint folder, or ``True`` for the last
    one in ``output_dir``) resumes the run from it. Without ``output_dir`` the ``Trainer`` works in a temporary
    folder, removed when the call returns (also on error) unless the run saved checkpoints there (``save_strategy``;
    ``trainer.args.output_dir`` names it). With ``bf16=True`` / ``fp16=True`` (mixed precision) the model returned
    computes in its weights' dtype again, as it saves and reloads (accelerate leaves the forward wrapped in autocast
    when training ends); so do the trainer's ``evaluate`` / ``predict`` after the call.

    Distillation: with ``teacher`` (a classifier with the same ``num_labels`` that reads the same tokenizer's
    ids, e.g. the conventionally fine-tuned model) the loss is the task loss plus ``distill_weight`` (default
    1.0) times ``distill_loss``: ``"kl"``, ``T**2 * KL(softmax(teacher / T) || softmax(student / T))`` with
    ``T = distill_temperature``, or ``"mse"``, the mean squared difference of the logits. The teacher's logits
    are computed once, in eval mode, before training.
    """

    from transformers import Trainer

    num_labels = require_classifier(model)
    require_finite_parameters(model)
    require_trainable(model)
    texts = require_texts(texts)
    text_pairs = require_text_pairs(text_pairs, len(texts))
    labels = require_labels(labels, num_labels, n=len(texts))
    refuse_a_model_as_the_tokenizer(tokenizer, call="fine_tune_classifier(model, tokenizer, texts, labels)")
    if not callable(tokenizer):
        raise argument_error("tokenizer", f"must be a transformers tokenizer, got {type(tokenizer).__name__}",
                             "pass AutoTokenizer.from_pretrained(...) of the model", kind=BcosTypeError)
    max_length = truncation_length(model, max_length, default=64)
    require_run_settings(epochs, batch_size, max_length, learning_rate, seed)
    if head_learning_rate is not None:
        require_number("head_learning_rate", head_learning_rate, low=0.0, low_open=True)
    if b_warmup is not None:
        require_number("b_warmup", b_warmup, low=0.0, low_open=True, high=1.0)
    if not isinstance(loss, str) or loss not in ("auto", "bce", "ce"):
        raise argument_error("loss", f"must be 'auto', 'bce' or 'ce', got {loss!r}",
                             "use 'auto' (BCE for B-cos models, the model's cross-entropy otherwise)")
    distill = _check_distillation(model, teacher, distill_weight, distill_loss, distill_temperature)
    own_loss = loss == "auto" and own_training_loss(model) is not None
    if own_loss and distill is not None:
        # DistillationLoss adds its term to the cross-entropy, in place of the model's own loss
        raise _own_loss_error(model, "teacher", "is given", "the distillation loss would replace by the "
                              "cross-entropy plus its distillation term",
                              "leave teacher out, or pass loss='ce' to distil with the cross-entropy alone")
    use_bce = not own_loss and (loss == "bce" or (loss == "auto" and has_dynamic_weights(model)))
    # output_dir=None trained in a temporary folder that was never removed (one per call, holding what the Trainer
    # wrote there): removed when the call ends, also on error, unless the run saved checkpoints into it
    with run_output_dir(output_dir, "bcos_finetune_", resume=training_args.get("resume_from_checkpoint")) as output_dir:
        args = training_arguments(output_dir, len(texts), epochs, batch_size, learning_rate, seed, progress,
                                  training_args, helper=fine_tune_classifier)
        require_no_label_smoothing_with_bce(use_bce, args.label_smoothing_factor)
        if own_loss and args.label_smoothing_factor:
            # the Trainer's label smoother replaces the loss a model computes by the smoothed cross-entropy
            raise _own_loss_error(model, "label_smoothing_factor", f"is {args.label_smoothing_factor!r}",
                                  "transformers' label smoother would replace by the smoothed cross-entropy",
                                  "leave label_smoothing_factor out, or pass loss='ce' to train with the smoothed "
                                  "cross-entropy alone")
        problem_type = getattr(model.config, "problem_type", None)
        if not use_bce and problem_type not in (None, "single_label_classification"):
            # the model's own loss reads it (BCE on multi-hot float targets, MSE), and the class ids here are
            # neither: it failed at the first step; cross_entropy_loss would train it as a single-label classifier
            raise argument_error("model", f"has config.problem_type {problem_type!r}, but fine_tune_classifier trains "
                                 "one class id per text with the cross-entropy (single_label_classification)",
                                 "set model.config.problem_type = 'single_label_classification' (or None), or train "
                                 "multi-label / regression heads with transformers' Trainer directly")
        optimizers = (None, None)
        if head_learning_rate is not None:
            optimizers = (two_rate_trainer_optimizer(model, args, head_learning_rate), None)
        dataset = EncodedTexts(tokenizer, texts, labels, max_length, text_pairs)
        kept = [len(ids) for ids in dataset.encodings["input_ids"]]
        # a text without tokens would be trained on as a row of padding alone, labelled (before _check_padding_side,
        # whose refusal of that row named padding)
        require_texts_with_tokens(kept, range(len(texts)), texts, "texts", "train on", scope="")
        # texts longer than max_length (64 by default) were trained on as their first tokens without a word: warned
        # of as predict warns, once (the teacher's predict below, on the same texts, says nothing)
        warn_of_truncated_texts("fine_tune_classifier", truncated_token_counts(tokenizer, texts, text_pairs, kept,
                                                                               max_length),
                                max_length, model, tokenizer, text_pairs is not None, outcome="trained on as")
        # ids past the embedding failed inside Trainer, mid-epoch (IndexError; a device-side assert on a GPU): every
        # text's ids (and token types) checked before any training, through their smallest and largest (a running
        # minimum and maximum over the rows: one flat tensor of every id of a corpus took about 8 bytes a token)
        require_tokenizer_ids_fit(model, tokenizer, {key: _id_bounds(dataset.encodings[key])
                                                     for key in ("input_ids", "token_type_ids")
                                                     if key in dataset.encodings})
        collator = RowsAsAloneCollator(PaddingWithMask(tokenizer), model)
        _check_padding_side(collator, dataset)
        # the cross-entropy through a loss of our own, not the model's: transformers' classifiers take **kwargs, so
        # the Trainer left the division by the accumulation steps to them and they ignore num_items_in_batch (with
        # gradient_accumulation_steps=2 the loss and gradients were twice too large); cross_entropy_loss also
        # applies the label smoothing the Trainer would have (its label smoother is not called with a
        # compute_loss_func)
        smoothing = args.label_smoothing_factor
        trainer_class, loss_func = Trainer, (None if own_loss else bcos_loss if use_bce else
                                             functools.partial(cross_entropy_loss, label_smoothing=smoothing))
        if distill is not None:
            with truncation_warned():
                dataset.teacher_logits = predict(teacher, tokenizer, texts, text_pairs=text_pairs,
                                                 batch_size=batch_size, max_length=max_length).tolist()
            # the Trainer would drop "teacher_logits" (not an argument of the model's forward) before the loss
            args.remove_unused_columns = False
            trainer_class = distilling_trainer_class()
            loss_func = DistillationLoss(use_bce, *distill, label_smoothing=smoothing)
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=dataset,
            data_collator=TeacherCollator(collator) if distill else collator,
            compute_loss_func=loss_func,
            optimizers=optimizers,
            callbacks=[_warmup(model, b_warmup) if b_warmup else warmup_resume_guard(model)],
        )
        if distill is not None:
            loss_func.trainer = trainer
        # TrainingArguments keeps resume_from_checkpoint without acting on it ("intended to be used by your training
        # scripts"): passed through **training_args it started the run afresh without a word
        train_handing_back_own_forward(trainer, model, args.resume_from_checkpoint)
        model.eval()
        return trainer


def train_handing_back_own_forward(trainer, model: nn.Module, resume_from_checkpoint) -> None:
    """``trainer.train(resume_from_checkpoint=...)``, then (also on error) ``model`` with its own forward again.

    With ``bf16=True`` / ``fp16=True`` (mixed precision, on the CPU too) accelerate wraps the model's forward in
    autocast and leaves it there when training ends: the model a training helper returned kept computing in
    bfloat16 (logits 0.004 off its float32 weights' on a tiny BERT), so predict, accuracy and explain of it ran in
    bfloat16 and the same model saved and reloaded gave other logits, without a word. Its weights are float32 (mixed
    precision trains them so): the model handed back computes in their dtype, as it saves and reloads."""
    try:
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    finally:
        # accelerate keeps the forward it wrapped as _original_forward. Not its unwrap_model(keep_fp32_wrapper=False):
        # that follows __wrapped__ past transformers' own decorators of the forward (can_return_tuple, ...) and left
        # the undecorated function
        original = vars(model).pop("_original_forward", None)
        if original is not None:
            if getattr(original, "__func__", None) is type(model).forward and getattr(original, "__self__", None) \
                    is model:
                del model.forward  # the class's own, as the model was given
            else:
                model.forward = original


def _warmup(model: nn.Module, fraction: float):
    """The B warm-up of a helper's run: its compute_loss_func applies ``label_smoothing_factor`` (or it was refused
    above where it would drop a model's own loss), so the callback's refusal of the Trainer's label smoother, which
    replaces a model's own loss, does not apply."""
    callback = BWarmupCallback(model, fraction=fraction)
    callback.refuse_smoothing_of_own_loss = False
    return callback


def warmup_resume_guard(model: nn.Module, without: str = "b_warmup is not given",
                             fix: str = "pass the b_warmup of the run that wrote the checkpoint (the warm-up continues "
                                        "from its step)"):
    """A callback that refuses, when training begins, a run without ``b_warmup`` whose B-cos layers the
    ``resume_from_checkpoint`` load set to another B than they had: a checkpoint written during a B warm-up holds each
    layer's B of that step, so the resumed run trained every remaining step at it (1.1 for a model of B 1.5) and
    returned a model running at 1.1 under ``config.bcos['b'] = 1.5``, without a word. The layers get their B back."""
    from transformers import TrainerCallback

    from .nn.linear import AlignmentPressure

    layers = [m for m in model.modules() if isinstance(m, AlignmentPressure)]
    given = [layer.b for layer in layers]

    class ResumedAtTheModelsB(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            loaded = [layer.b for layer in layers]
            if loaded == given:
                return
            for layer, b in zip(layers, given, strict=True):
                layer.b = b
            found = sorted({round(b, 6) for b in loaded})
            raise argument_error("resume_from_checkpoint", f"holds B-cos layers at B {found} (a checkpoint written "
                                 f"during a B warm-up), not the model's {sorted({round(b, 6) for b in given})}, and "
                                 f"{without}: the resumed run would train its remaining steps, and return the model, "
                                 "at the checkpoint's B", fix)

    return ResumedAtTheModelsB()


def _own_loss_error(model: nn.Module, name: str, value: str, replaced_by: str, fix: str) -> BcosError:
    """The refusal of a setting that would replace ``model``'s own training loss (:func:`own_training_loss`: a Space
    Model's, BcosViT's), under ``loss="auto"``, by the cross-entropy; naming the model's class and its loss (it said
    "Space Model" and its inter- and intra-space terms of a BcosViT too)."""
    return argument_error(name, f"{value}, but loss='auto' trains {type(model).__name__} with its own loss, "
                          f"{own_training_loss(model)}, which {replaced_by}", fix)


def require_no_label_smoothing_with_bce(use_bce: bool, label_smoothing_factor) -> None:
    """Refuse ``label_smoothing_factor`` for a run trained with :func:`bcos_loss`: the ``Trainer`` calls no label
    smoother when a ``compute_loss_func`` is set, so the factor was ignored without a word, and BCE on one-hot
    targets has no smoothing defined here."""
    if use_bce and label_smoothing_factor:
        raise argument_error("label_smoothing_factor", f"is {label_smoothing_factor!r}, but the B-cos model trains "
                             "with bcos_loss (BCE on one-hot targets), which has no label smoothing, and transformers' "
                             "Trainer ignores label_smoothing_factor when a compute_loss_func is set (the run would "
                             "train without it)", "leave label_smoothing_factor out, or pass loss='ce' to train with "
                             "the smoothed cross-entropy")


def _id_bounds(rows) -> torch.Tensor:
    """The smallest and largest id of a tokenizer's rows (lists of ints), as a tensor that
    :func:`~bcos_plugins.corpus.require_tokenizer_ids_fit` reads as it would read every id: it refuses on the
    extremes and reports the largest. Memory stays that of one row (empty rows give nothing)."""
    low = high = None
    for row in rows:
        if len(row):
            row_low, row_high = min(row), max(row)
            low = row_low if low is None or row_low < low else low
            high = row_high if high is None or row_high > high else high
    return torch.tensor([] if low is None else [low, high], dtype=torch.long)


def _check_padding_side(collator, dataset: EncodedTexts) -> None:
    """Refuse, before any step, what :func:`~bcos_plugins.attribution.text.rows_as_alone_call` refuses on a padded
    batch: a tokenizer that pads on the left for a registry classifier that reads the first column (every padded row
    would be trained on a padding token's logits; the error names the text by its index in ``texts``) or for a
    transformers model outside the registry that reads a learned position table, a decoder classifier without
    ``config.pad_token_id``. The collator the ``Trainer`` pads with pads the shortest and the longest text together.
    A model outside the registry given a left-padded batch also runs that batch once, in eval mode without gradients:
    its own forward may refuse it (a Space model, of an encoder outside the registry with a learned position table)."""
    if not isinstance(collator, RowsAsAloneCollator):
        return
    lengths = [len(ids) for ids in dataset.encodings["input_ids"]]
    shortest = min(range(len(lengths)), key=lengths.__getitem__)
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[shortest] == lengths[longest]:
        return  # no batch is ever padded
    # the refusal names the caller's tokenizer's padding side (it named attention_mask, never passed)
    with rows_named_as((shortest, longest)), padding_named_as_tokenizers(collator.pad.tokenizer):
        call = collator([{name: values[i] for name, values in dataset.encodings.items()} for i in (shortest, longest)])
        mask, model = call.get("attention_mask"), collator.model
        if (mask is not None and bool((mask[:, 0] == 0).any()) and "position_ids" not in call
                and registry_spec(model) is None):
            # a Space model's refusal of its encoder's left padding came at the first training step, naming
            # attention_mask, the shuffled batch's rows and position_ids=, which fine_tune_classifier takes none of
            device = next(model.parameters()).device
            with torch.no_grad(), evaluating(model):
                model(**{key: value.to(device) if isinstance(value, torch.Tensor) else value
                         for key, value in call.items() if key != "labels"})


def _check_distillation(model, teacher, weight, kind, temperature) -> tuple[float, str, float] | None:
    """``(weight, kind, temperature)`` of a valid distillation setting, ``None`` without a teacher."""
    if teacher is None:
        if weight is not None:
            raise argument_error("distill_weight", f"is {weight!r} but no teacher was given",
                                 "pass teacher=<a fine-tuned classifier>, or leave distill_weight out")
        return None
    if not isinstance(teacher, nn.Module) or not isinstance(getattr(getattr(teacher, "config", None),
                                                                    "num_labels", None), int):
        raise argument_error("teacher", f"must be a transformers sequence classifier, got "
                             f"{type(teacher).__name__}", "pass the conventionally fine-tuned model",
                             kind=BcosTypeError)
    if teacher is model:
        raise argument_error("teacher", "is the model being trained", "pass a separate, fine-tuned model")
    # a NaN weight made predict refuse "the model's logits", which read as the model being trained
    require_finite_parameters(teacher, "teacher")
    if teacher.config.num_labels != model.config.num_labels:
        raise argument_error("teacher", f"has {teacher.config.num_labels} labels, the model "
                             f"{model.config.num_labels}", "distil from a teacher trained on the same classes")
    names = [_class_names(m) for m in (teacher, model)]
    if None not in names and names[0] != names[1]:
        # the distillation term pairs the teacher's logit i with the model's logit i: with the classes in another
        # order the student was trained towards the teacher's other class, without a word
        raise argument_error("teacher", f"names its classes {names[0]} (config.id2label), the model {names[1]}: "
                             "distillation pairs the teacher's logit i with the model's logit i",
                             "distil from a teacher with the model's classes in the model's order (or set both "
                             "configs' id2label to the same names)")
    weight = 1.0 if weight is None else require_number("distill_weight", weight, low=0.0)
    if not isinstance(kind, str) or kind not in ("kl", "mse"):
        raise argument_error("distill_loss", f"must be 'kl' or 'mse', got {kind!r}",
                             "use 'kl' (softened class probabilities) or 'mse' (logits)")
    temperature = require_number("distill_temperature", temperature, low=0.0, low_open=True)
    return weight, kind, temperature


def _class_names(model: nn.Module) -> list[str] | None:
    """The class names of ``config.id2label`` in id order; ``None`` for transformers' defaults (LABEL_0, ...), which
    name no class."""
    id2label = getattr(model.config, "id2label", None) or {}
    names = [str(id2label.get(i, id2label.get(str(i), ""))) for i in range(model.config.num_labels)]
    return None if names == [f"LABEL_{i}" for i in range(len(names))] else names


class PaddingWithMask:
    """Pads a batch of :class:`~bcos_plugins.encoded_texts.EncodedTexts` rows as ``DataCollatorWithPadding(tokenizer)``
    does, asking a transformers tokenizer for the attention mask (:func:`~bcos_plugins.corpus.mask_keywords`, as
    ``predict`` asks): a tokenizer whose ``model_input_names`` leave it out padded the batch without one, so every
    padded row was trained on with its padding attended to as tokens, silently."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.keywords = tokenizer, mask_keywords(tokenizer)

    def __call__(self, features: list[dict]) -> dict:
        return pad_rows(self.tokenizer, features, return_tensors="pt", **self.keywords)


class RowsAsAloneCollator:
    """Pads like ``pad`` (:class:`PaddingWithMask`), then turns the batch into the keyword arguments ``explain``
    calls the model with (:func:`~bcos_plugins.attribution.text.rows_as_alone_call`): without them a decoder
    classifier would be trained on a left-padded row's shifted positions (logits 0.15 off the row's own on a tiny
    GPT-2) and, where the tokenizer's padding id is not ``config.pad_token_id``, on a padding token's logits."""

    def __init__(self, pad, model: nn.Module) -> None:
        self.pad, self.model = pad, model

    def __call__(self, features: list[dict]) -> dict:
        batch = self.pad(features)
        # what a registry model's forward does not read (a pair tokenizer's token_type_ids for Llama) is left out, as
        # the Trainer's column removal does; labels are read
        return rows_as_alone_call(self.model, batch["input_ids"], batch.get("attention_mask"), tokenizer_outputs=batch)


class TeacherCollator:
    """Pads like ``DataCollatorWithPadding`` and stacks the teacher logits (the tokenizer's pad drops them)."""

    def __init__(self, pad) -> None:
        self.pad = pad

    def __call__(self, features: list[dict]) -> dict:
        missing = [i for i, f in enumerate(features) if "teacher_logits" not in f]
        if missing:
            # the distilling trainer's evaluate(eval_dataset=...) / predict(...) failed with KeyError: 'teacher_logits'
            raise argument_error("eval_dataset / test_dataset", f"has rows without 'teacher_logits' (rows "
                                 f"{missing[:8]} of the batch): the distilling trainer's loss needs the teacher's logits of every row, and "
                                 "fine_tune_classifier computed them for its training texts only",
                                 "evaluate the trained model with bcos_plugins.train.accuracy / predict, or give each "
                                 "row 'teacher_logits' (the teacher's predict(...) of its text, as a list)")
        teacher = torch.tensor([f["teacher_logits"] for f in features])
        batch = self.pad([{k: v for k, v in f.items() if k != "teacher_logits"} for f in features])
        batch["teacher_logits"] = teacher
        return batch


def distilling_trainer_class():
    from transformers import Trainer

    class BcosDistillationTrainer(Trainer):
        """Trainer that takes the precomputed teacher logits out of the batch before the model sees it."""

        teacher_batch: Tensor | None = None

        def compute_loss(self, model, inputs, *args, **kwargs):
            self.teacher_batch = inputs.pop("teacher_logits")
            return super().compute_loss(model, inputs, *args, **kwargs)

    return BcosDistillationTrainer


# TrainingArguments fields the training helpers fill from their own arguments
_SET_FROM_ARGUMENTS = {"num_train_epochs": "epochs", "per_device_train_batch_size": "batch_size",
                       "disable_tqdm": "progress"}


@contextlib.contextmanager
def run_output_dir(output_dir, prefix: str, *, keep_checkpoints: bool = True, resume=None):
    """The ``output_dir`` of a training helper's ``Trainer``: the caller's folder (never removed), or with ``None`` a
    temporary one (named with ``prefix``) removed when the block ends, also on error, unless the run saved
    checkpoints there and ``keep_checkpoints`` (``save_strategy`` asked for them without a folder:
    ``trainer.args.output_dir`` names it). ``keep_checkpoints=False`` removes it checkpoints and all (a stage whose
    checkpoints cannot be resumed). The helpers made one per call and never removed it. ``resume`` (the run's
    ``resume_from_checkpoint``) ``True`` without ``output_dir`` is refused: the last checkpoint of a new, empty folder
    does not exist (transformers' "No valid checkpoint found in output directory (/tmp/...)" named a folder the caller
    never chose)."""
    if output_dir is None and resume is True:
        raise argument_error("resume_from_checkpoint", "is True, which resumes from the last checkpoint in output_dir, "
                             "but no output_dir was given (the run would work in a new, empty temporary folder)",
                             "pass the run's output_dir as well, or the checkpoint folder itself "
                             "(resume_from_checkpoint='<output_dir>/checkpoint-<step>')")
    if output_dir is not None:
        yield output_dir
        return
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        yield folder
    finally:
        if not (keep_checkpoints and any(Path(folder).glob(f"{PREFIX_CHECKPOINT_DIR}-*"))):
            shutil.rmtree(folder, ignore_errors=True)


def training_arguments(output_dir, n_texts: int, epochs, batch_size, learning_rate, seed,
                        progress: bool, training_args: dict, helper):
    """``TrainingArguments`` of the classifier and masked-LM helpers; ``training_args`` override the defaults (not
    the settings the helpers take as arguments of their own, refused naming that argument). ``helper`` (the calling
    function) names the helper and its own arguments when a keyword is neither theirs nor a ``TrainingArguments``
    field."""
    # as Python numbers (require_run_settings accepted NumPy's): a NumPy batch_size failed in torch's sampler ("should be
    # a positive integer value, but got batch_size=4"), a NumPy seed in transformers' set_seed, a NumPy float32
    # learning_rate at the first checkpoint ("Object of type float32 is not JSON serializable"), naming none of them
    epochs, batch_size, learning_rate, seed = float(epochs), int(batch_size), float(learning_rate), int(seed)
    overridable = {"report_to": [], "save_strategy": "no", "logging_steps": max(1, n_texts // batch_size // 10),
                   "dataloader_pin_memory": torch.cuda.is_available()}
    # ReduceLROnPlateau steps on an evaluation metric, which these helpers never compute: TrainingArguments failed
    # with "lr_scheduler_type reduce_lr_on_plateau requires an eval strategy", naming no helper
    scheduler = training_args.get("lr_scheduler_type")
    if str(getattr(scheduler, "value", scheduler)) == "reduce_lr_on_plateau":
        raise argument_error("lr_scheduler_type", f"is {scheduler!r}, which lowers the learning rate when an "
                             f"evaluation metric stops improving, but {helper.__name__} takes no evaluation data",
                             "Pick a schedule by step (the default 'linear', 'cosine', 'constant'), or build a "
                             "transformers Trainer with an eval_dataset")
    args = checked_training_arguments(helper, training_args, overridable, output_dir=str(output_dir),
                                      num_train_epochs=epochs, per_device_train_batch_size=batch_size,
                                      learning_rate=learning_rate, seed=seed, disable_tqdm=not progress)
    # the helpers take no evaluation data: the Trainer refused an evaluation schedule telling to "pass an
    # eval_dataset", which they do not take (eval_on_start failed with "evaluation requires an eval_dataset")
    # save_strategy="best" saves when an evaluation improves: without evaluation data it saved no checkpoint, silently
    for key, asked in (("eval_strategy", args.eval_strategy != "no"), ("eval_on_start", args.eval_on_start),
                       ("save_strategy", getattr(args.save_strategy, "value", args.save_strategy) == "best")):
        if asked:
            raise argument_error(key, f"is {training_args[key]!r}, but {helper.__name__} takes no evaluation data",
                                 f"leave {key} out and evaluate the model it returns (for a classifier "
                                 "bcos_plugins.train.accuracy), or build a transformers Trainer with an eval_dataset")
    if args.dataloader_drop_last and n_texts < batch_size * args.world_size:
        # no full batch: the Trainer failed with "args.max_steps must be set to a positive value if dataloader does
        # not have a length, was -1"
        raise argument_error("dataloader_drop_last", f"is True with {n_texts} text(s) and batches of {batch_size} "
                             f"on each of {args.world_size} process(es): every text would be dropped",
                             "pass a batch_size of at most the number of texts, or leave dataloader_drop_last out")
    return args


def checked_training_arguments(helper, training_args: dict, defaults: dict, **settings):
    """``TrainingArguments`` of a training helper (``helper``, the calling function, whose ``**training_args`` go
    there): ``settings`` (set from the helper's own arguments), ``defaults`` overridden by ``training_args``. The
    keywords are checked first: a name neither the helper's nor a ``TrainingArguments`` field is refused naming the
    helper and the closest valid name, and one a setting comes from names the helper's argument to pass instead.
    ``logging_nan_inf_filter`` defaults to off: transformers' default logs a NaN or infinite step loss as the
    window's average of the finite ones (0.0 when none is finite), so a run whose loss was NaN at every step reported
    a loss of 0.0. One function for every helper (train_causal_lm repeated the check and the default)."""
    import inspect

    from transformers import TrainingArguments

    require_training_argument_names(training_args, helper.__name__, inspect.signature(helper).parameters)
    for key, own in _SET_FROM_ARGUMENTS.items():
        if key in settings and key in training_args:
            # TrainingArguments raised Python's bare "got multiple values for keyword argument"
            value = training_args[key]
            value = (not value) if key == "disable_tqdm" and isinstance(value, bool) else value
            raise argument_error(key, f"is set from the training helper's own argument {own}",
                                 f"Pass {own}={value!r} instead", kind=BcosTypeError)
    steps = training_args.get("gradient_accumulation_steps", 1)
    if isinstance(steps, bool) or not isinstance(steps, numbers.Real) or not (steps >= 1 and float(steps).is_integer()):
        # TrainingArguments took 0 (and -1), and the run failed in the Trainer with a bare "ZeroDivisionError: integer
        # division or modulo by zero"
        raise argument_error("gradient_accumulation_steps", f"must be a whole number >= 1 (the micro-batches per "
                             f"optimiser step), got {steps!r}", "pass 1 (no accumulation) or more")
    return TrainingArguments(**settings, **{"logging_nan_inf_filter": False, **defaults, **training_args,
                                            "gradient_accumulation_steps": int(steps)})


def two_rate_trainer_optimizer(model: nn.Module, args, head_learning_rate: float) -> torch.optim.Optimizer:
    """The optimiser the ``Trainer`` would build from ``args`` (its ``optim``, betas, epsilon, ``optim_args``; weight
    decay on every parameter but biases and norms), with ``head_learning_rate`` for the head of
    :func:`two_rate_adamw`'s split. ``fine_tune_classifier(head_learning_rate=...)`` used two_rate_adamw itself, so
    ``optim``, ``adam_epsilon`` and ``adam_beta1/2`` were ignored and the norms' weights and the biases were decayed,
    which the run without ``head_learning_rate`` does not do, without a word."""
    from transformers import Trainer

    body, head = _encoder_and_head(model)
    # the Trainer's own rule (get_decay_parameter_names does not read its instance)
    decay = set(Trainer.get_decay_parameter_names(None, model))
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    groups = [{"params": [p for p in ps if (names[id(p)] in decay) == decayed], "lr": lr,
               "weight_decay": args.weight_decay if decayed else 0.0}
              for ps, lr in ((body, args.learning_rate), (head, head_learning_rate)) for decayed in (True, False)]
    return optimizer_class([g for g in groups if g["params"]], **kwargs)


def _encoder_and_head(model: nn.Module) -> tuple[list, list]:
    """The trainable parameters of the encoder and of the head (every one outside the encoder, plus the pooler)."""
    prefix = getattr(model, "base_model_prefix", "")
    named = list(model.named_parameters())
    if not prefix or not any(name.startswith(prefix + ".") for name, _ in named):
        raise argument_error("model", f"has no encoder parameters under base_model_prefix {prefix!r}, so the "
                             "encoder cannot be told from the head", "pass a transformers classifier (e.g. "
                             "BertForSequenceClassification), or build the parameter groups yourself")
    head, body = [], []
    for name, p in named:
        if p.requires_grad:
            in_body = name.startswith(prefix + ".") and ".pooler." not in name
            (body if in_body else head).append(p)
    require_trainable(model)
    return body, head


def two_rate_adamw(model: nn.Module, learning_rate: float, head_learning_rate: float,
                   weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW with one rate for the pretrained encoder and another for the head (and the pooler).

    The head is every trainable parameter outside the encoder (``model.base_model_prefix``) plus the pooler;
    frozen parameters (``requires_grad=False``) are left out. ``weight_decay`` applies to every parameter (the
    ``Trainer``'s own optimiser exempts biases and norms, and ``fine_tune_classifier(..., head_learning_rate=...)``
    builds that one, with this split and the ``TrainingArguments``' ``optim``); pass it to a custom ``Trainer`` as
    ``optimizers=(two_rate_adamw(model, 2e-4, 1e-3, args.weight_decay), None)``. B-cos logits are bounded by
    the norm of their input and grow only as the fresh head aligns with it, so B-cos fine-tuning on a small
    budget converges faster with a larger head rate.

    Raises:
        BcosTypeError / BcosValueError: ``model`` not a module with encoder parameters under its
            ``base_model_prefix``, or with nothing trainable; a rate not finite and > 0; ``weight_decay`` < 0.
    """
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"must be a torch module, got {type(model).__name__}",
                             "pass a transformers classifier", kind=BcosTypeError)
    learning_rate = require_number("learning_rate", learning_rate, low=0.0, low_open=True)
    head_learning_rate = require_number("head_learning_rate", head_learning_rate, low=0.0, low_open=True)
    weight_decay = require_number("weight_decay", weight_decay, low=0.0)
    body, head = _encoder_and_head(model)
    # a frozen encoder (or head) leaves its group out rather than giving AdamW an empty one
    groups = [{"params": ps, "lr": lr} for ps, lr in ((body, learning_rate), (head, head_learning_rate)) if ps]
    return torch.optim.AdamW(groups, lr=learning_rate, weight_decay=weight_decay)
