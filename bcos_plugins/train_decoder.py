"""Training B-cos decoders: plain next-token cross-entropy with padding excluded from the loss.

The B-cos LM paper (§7) trains B-cos GPT-2 / Llama with the standard cross-entropy, not the classifiers' BCE:
the LM head is not B-cosified (it is tied to the embeddings), and BCE would let its unnormalised weights grow
without bound. transformers' causal LMs already compute exactly that loss from ``labels`` (shifted inside the
model, positions labelled ``-100`` ignored), so training is ``Trainer`` plus :class:`CausalLMCollator`.

Why a collator of our own: ``DataCollatorForLanguageModeling(mlm=False)`` marks padding by comparing ids with
``pad_token_id``. GPT-2 has no pad token and is usually padded with ``<|endoftext|>``, so that rule also drops
every real end-of-text token from the loss. Here padding is whatever the attention mask says it is.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from ._checks import (
    refuse_container_of_names,
    require_finite_parameters,
    require_int,
    require_same_shape,
    require_trainable,
)
from .attribution.targets import real_token_positions
from .attribution.text import require_head_output_object
from .convert.architectures import PositionLimit, position_limit, vocabulary_size
from .encoded_texts import require_max_length_fits
from .errors import BcosTypeError, argument_error
from .fine_tuning import checked_training_arguments, train_handing_back_own_forward, warmup_resume_guard
from .losses import cross_entropy_loss

__all__ = ["CausalLMCollator", "IGNORE_INDEX", "real_token_positions", "train_causal_lm"]

IGNORE_INDEX = -100  # transformers' (and torch's) cross-entropy ignore_index


class CausalLMCollator:
    """Pad tokenised examples into a causal-LM batch whose padding positions carry no loss.

    Each feature is a mapping with ``input_ids`` (list or 1-d tensor) and optionally ``attention_mask``
    (1 = real token; tokens with 0 inside a feature are treated as padding too) and ``labels`` (one per token,
    ``-100`` where there is no loss, e.g. on a prompt; default: the ``input_ids``). The batch has
    ``input_ids``, ``attention_mask``, ``position_ids`` (counting real tokens only, as ``generate`` does, so
    left padding does not shift positions) and ``labels`` = the labels with ``-100`` on padding and on a
    row's first real token (the model predicts ``labels[t]`` at ``t - 1``, which is padding there). A feature with
    ``position_ids`` of its own is refused (they would be replaced), and so is one with ``token_type_ids`` that are not
    all 0 (the batch has none, so a model reading them, GPT-2, would see type 0); other keys are left out of the batch.

    Args:
        pad_token_id: id written into padding slots (any id: padding is masked and unlabelled).
        padding_side: ``"right"`` (training default) or ``"left"`` (as for generation).
        max_length: truncate longer examples (keeping their beginning); ``None`` keeps them whole.
    """

    def __init__(self, pad_token_id: int, padding_side: Literal["left", "right"] = "right",
                 max_length: int | None = None) -> None:
        if padding_side not in ("left", "right"):
            raise argument_error("padding_side", f"padding_side must be 'left' or 'right', got {padding_side!r}",
                                 "Use 'right' for training, 'left' for generation")
        if max_length is not None:
            max_length = require_int("max_length", max_length)
            if max_length < 2:
                raise argument_error("max_length", f"max_length={max_length} leaves no next token to predict",
                                     "Use >= 2 or None")
        self.pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
        self.padding_side = padding_side
        self.max_length = max_length

    def __call__(self, features: Sequence[Mapping[str, Sequence[int] | Tensor]]) -> dict[str, Tensor]:
        if len(features) == 0:
            raise argument_error("features", "CausalLMCollator got an empty list of features",
                                 "Pass at least one tokenised example")
        ids, masks, targets = [], [], []
        for i, feature in enumerate(features):
            row, mask = _feature_tokens(feature, i, self.max_length)
            ids.append(row)
            masks.append(mask)
            targets.append(_feature_labels(feature, i, row, self.max_length))
        pad = torch.nn.utils.rnn.pad_sequence
        input_ids = pad(ids, batch_first=True, padding_value=self.pad_token_id, padding_side=self.padding_side)
        attention_mask = pad(masks, batch_first=True, padding_value=0, padding_side=self.padding_side)
        labels = pad(targets, batch_first=True, padding_value=IGNORE_INDEX, padding_side=self.padding_side)
        # The model predicts labels[t] from position t - 1. A label is real only if both its own token and the
        # token predicting it are real: with left padding the first real token would otherwise be "predicted"
        # from a padding position.
        predicted_from_real = torch.nn.functional.pad(attention_mask[:, :-1], (1, 0), value=0)
        has_loss = (attention_mask == 1) & (predicted_from_real == 1) & (labels != IGNORE_INDEX)
        if not has_loss.any():
            # The mean cross-entropy over no labelled position is NaN (0/0): refuse instead of training on it.
            raise argument_error("features", "no example of this batch has a labelled token after a real one "
                                 "(two real tokens, and labels not all -100), so there is no next token to predict "
                                 "and the loss would be NaN",
                                 "Drop examples shorter than 2 tokens or without a labelled token (or join them)")
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": real_token_positions(attention_mask),
            "labels": labels.masked_fill(~has_loss, IGNORE_INDEX),
        }


def _feature_tokens(feature, i: int, max_length: int | None) -> tuple[Tensor, Tensor]:
    """Token ids and 0/1 mask of one feature as 1-d long tensors (truncated), with errors naming the feature."""
    if not isinstance(feature, Mapping) or "input_ids" not in feature:
        keys = sorted(feature) if isinstance(feature, Mapping) else type(feature).__name__
        raise argument_error("features", f"feature {i} has no 'input_ids' (keys: {keys})",
                             "Tokenise first: each feature is a mapping with input_ids")
    if "position_ids" in feature:
        # the batch's position_ids are the collator's own (real tokens counted, as generate and explain count them):
        # a feature's own (packed documents restarting at 0) were replaced by 0, 1, 2, ... without a word
        raise argument_error("features", f"feature {i} has its own 'position_ids', which CausalLMCollator would "
                             "replace by its own (the real tokens counted from 0, as generate and explain count them)",
                             "Drop the position_ids column (one example per feature, not packed documents)")
    try:
        raw = torch.as_tensor(feature["input_ids"])
        raw_mask = torch.as_tensor(feature.get("attention_mask", torch.ones_like(raw)))
    except (TypeError, ValueError, RuntimeError):
        raise argument_error("features", f"feature {i}: input_ids / attention_mask are not sequences of ints",
                             "Pass lists or 1-d tensors of token ids", kind=BcosTypeError) from None
    if raw.is_floating_point() or raw.dtype == torch.bool or raw.ndim > 1 and raw.shape[0] != 1:
        raise argument_error("features", f"feature {i}: input_ids must be one sequence of integer ids, got "
                             f"dtype {raw.dtype} shape {tuple(raw.shape)}", "Pass a list or 1-d tensor of ints",
                             kind=BcosTypeError)
    # the 0/1 check reads the mask as given: cast to integers first, 0.5 read as padding and 1.7 as a real token
    invalid_mask = bool(((raw_mask != 0) & (raw_mask != 1)).any())
    row, mask = raw.to(torch.long).flatten(), raw_mask.to(torch.long).flatten()
    require_same_shape(f"features[{i}]['attention_mask']", mask, f"features[{i}]['input_ids']", row,
                       "Give both the same length")
    if invalid_mask or (row < 0).any():
        raise argument_error("features", f"feature {i}: attention_mask must be 0/1 and ids >= 0",
                             "Pass the tokenizer's output")
    if max_length is not None:
        row, mask = row[:max_length], mask[:max_length]
    if row.numel() == 0:
        raise argument_error("features", f"feature {i} has no tokens", "Drop empty examples")
    _refuse_nonzero_token_types(feature, i, row.numel())
    return row, mask


def _refuse_nonzero_token_types(feature, i: int, kept: int) -> None:
    """Refuse a feature whose ``token_type_ids`` the batch would drop while they change the model's input.

    The batch has no ``token_type_ids``: a model that reads them (GPT-2 adds their embedding) then sees type 0
    everywhere. All-zero ones (over the kept tokens) are that default, so dropping them changes nothing."""
    if "token_type_ids" not in feature:
        return
    try:
        types = torch.as_tensor(feature["token_type_ids"]).flatten()[:kept]
    except (TypeError, ValueError, RuntimeError):
        raise argument_error("features", f"feature {i}: token_type_ids are not a sequence of ints",
                             "Drop the token_type_ids column", kind=BcosTypeError) from None
    if bool((types != 0).any()):
        raise argument_error("features", f"feature {i} has 'token_type_ids' that are not all 0, which "
                             "CausalLMCollator leaves out of the batch: a model that reads them (GPT-2 adds their "
                             "embedding) would be trained on type 0 everywhere instead",
                             "Drop the token_type_ids column from the features (tokenize with "
                             "return_token_type_ids=False), or use a model that does not read them")



def _feature_labels(feature, i: int, row: Tensor, max_length: int | None) -> Tensor:
    """The labels of one feature as a 1-d long tensor (truncated like its ids): its own ``labels`` (ids, or -100
    where there is no loss), else a copy of its ids. Its own were dropped: a prompt masked with -100 was trained
    on as if it were the answer, without a word."""
    if "labels" not in feature:
        return row.clone()
    try:
        raw = torch.as_tensor(feature["labels"])
    except (TypeError, ValueError, RuntimeError):
        raise argument_error("features", f"feature {i}: labels are not a sequence of ints",
                             "Pass a list or 1-d tensor of token ids, with -100 where there is no loss",
                             kind=BcosTypeError) from None
    if raw.is_floating_point() or raw.dtype == torch.bool or raw.ndim > 1 and raw.shape[0] != 1:
        raise argument_error("features", f"feature {i}: labels must be one sequence of integer ids, got dtype "
                             f"{raw.dtype} shape {tuple(raw.shape)}", "Pass a list or 1-d tensor of ints, with -100 "
                             "where there is no loss", kind=BcosTypeError)
    labels = raw.to(torch.long).flatten()
    # compared before truncation: cut to max_length, labels of another length would have looked aligned
    require_same_shape(f"features[{i}]['labels']", labels, f"features[{i}]['input_ids']",
                       torch.as_tensor(feature["input_ids"]).flatten(), "Give one label per token (-100 where there "
                       "is no loss)")
    if max_length is not None:
        labels = labels[:max_length]
    if ((labels < 0) & (labels != IGNORE_INDEX)).any():
        raise argument_error("features", f"feature {i}: labels must be token ids >= 0 or -100 (no loss), got "
                             f"{int(labels[(labels < 0) & (labels != IGNORE_INDEX)][0])}",
                             "Mark positions without loss with -100")
    return labels


# how the tokenizer's output (or a table) becomes one feature per example, for train_causal_lm's refusal
_EXAMPLES_FIX = ("Pass one feature per example: datasets.Dataset.from_dict(dict(enc)) of the tokenizer's output enc, "
                 "or a list of {'input_ids': ..., 'attention_mask': ...} dicts, one per text "
                 "(a pandas table: datasets.Dataset.from_pandas(frame))")


def train_causal_lm(
    model: nn.Module,
    train_dataset,
    output_dir: str,
    *,
    pad_token_id: int,
    eval_dataset=None,
    max_length: int | None = None,
    callbacks: list | None = None,
    **training_arguments,
):
    """Fine-tune a (B-cosified) causal LM with plain cross-entropy through ``transformers.Trainer``.

    ``train_dataset`` yields features with ``input_ids`` (a ``datasets.Dataset`` or a list of dicts), and
    optionally ``labels`` (``-100`` where there is no loss, e.g. a prompt; :class:`CausalLMCollator`).
    ``training_arguments`` go to ``TrainingArguments`` (defaults: no checkpoints, no reporting, the paper's
    learning rate 5e-4, unused columns kept so the collator sees them). Returns the trained ``Trainer``. Rows are
    truncated to ``max_length`` tokens (``None``: kept whole); a ``max_length``, or without one a row, longer than
    the model's position table is refused before training. With ``bf16=True`` the model returned (and the trainer's
    ``evaluate`` after the call) computes in its weights' dtype again, as it saves and reloads.

    The returned trainer's ``evaluate()`` (and the evaluations it runs during training) reports ``eval_loss`` as
    the mean cross-entropy over every labelled token of the evaluation set, the same number whatever
    ``per_device_eval_batch_size`` is. transformers' own ``eval_loss`` averages each batch's per-token mean
    weighted by the batch's rows, so rows of different lengths gave a number that depended on the batch size
    (4.1099 with batches of one row, 4.0816 with all seven rows in one batch, on a tiny GPT-2). With
    ``label_smoothing_factor`` set, the loss is the smoothed cross-entropy of the shifted labels
    (:func:`shifted_cross_entropy_loss`, exact under ``gradient_accumulation_steps``), and ``eval_loss`` keeps the
    ``Trainer``'s per-batch weighting.

    A model whose ``loss_type`` is ``None`` (GPT-2's: its class name holds no loss name) trains under
    ``"ForCausalLM"``, the loss transformers falls back to, without transformers' "unrecognized" warning, and gets its
    ``None`` back when the call ends (the same losses; a later loss of the model warns as transformers warns).
    """
    from transformers import Trainer

    if getattr(getattr(model, "config", None), "bcos", None) is None:
        raise argument_error("model", f"{type(model).__name__} is not B-cosified (no config.bcos)",
                             "Call bcosify(model, b=1.1) first, or use transformers' Trainer directly for a stock model")
    require_finite_parameters(model)
    require_trainable(model)
    require_head_output_object(model)  # (config.return_dict=False failed at the first step inside transformers)
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
    collator = CausalLMCollator(pad_token_id, max_length=max_length)
    max_length = collator.max_length  # checked there
    if max_length is not None:
        require_max_length_fits(model, max_length)
    vocab_size, limit = vocabulary_size(model), position_limit(model)
    if vocab_size is not None and pad_token_id >= vocab_size:
        # padding is masked out of the loss but still embedded: the first padded batch failed inside the embedding,
        # mid-training (IndexError: index out of range in self; a device-side assert on a GPU)
        raise argument_error("pad_token_id", f"is {pad_token_id}, outside the model's vocabulary [0, {vocab_size}): "
                             "padding is masked out of the loss but still goes through the embedding",
                             "pass an id the model has, e.g. tokenizer.eos_token_id (any id: padding carries no loss)")
    # the tokenizer's whole output (a BatchEncoding: one list per key, not one feature per example) was indexed as
    # the examples and refused as "feature 0 has no 'input_ids' ... Tokenise first", though it was tokenised
    refuse_container_of_names("train_dataset", train_dataset, items="examples", fix=_EXAMPLES_FIX)
    if isinstance(eval_dataset, Mapping) and "input_ids" in eval_dataset:  # (a dict of evaluation sets is valid)
        refuse_container_of_names("eval_dataset", eval_dataset, items="examples", fix=_EXAMPLES_FIX)
    _check_training_rows("train_dataset", train_dataset, max_length, vocab_size, limit)
    # a dict of evaluation sets (the Trainer evaluates each, its metrics prefixed with the key) was indexed as one
    # dataset: KeyError: 0
    for name, rows in (eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]):
        if rows is not None:
            _check_training_rows("eval_dataset" if name is None else f"eval_dataset[{name!r}]", rows, max_length,
                                 vocab_size, limit)
    defaults = {"learning_rate": 5e-4, "save_strategy": "no", "report_to": [], "remove_unused_columns": False,
                "use_cpu": not torch.cuda.is_available(), "logging_steps": 10}
    # the keyword check and the logging_nan_inf_filter default: the one builder of every training helper
    args = checked_training_arguments(train_causal_lm, training_arguments, defaults, output_dir=output_dir)
    # with label smoothing the Trainer's label smoother replaces the model's loss, and shifts the labels only for a
    # class named in transformers' causal-LM mapping: a B-cos Gemma 2 (BcosGemma2ForCausalLM) was trained on its
    # unshifted labels, each token predicted from itself, without a word. The shift is ours
    smoothing = args.label_smoothing_factor
    # transformers names a model's loss from its class name, and GPT2LMHeadModel's holds none: its loss_type was None,
    # so its first loss warned "`loss_type=None` was set in the config but it is unrecognized" and fell back to
    # ForCausalLMLoss, the loss trained here. The Trainer reads it too, when built (a causal LM's labelled tokens
    # counted over labels[..., 1:]; the same count here, as the collator gives every row's first label -100). Set for
    # the call only: the user's model gets its None back afterwards (also on an error), as transformers built it
    unnamed_loss = getattr(model, "loss_type", "") is None
    if unnamed_loss:
        model.loss_type = "ForCausalLM"
    # as fine_tune_classifier's: resumed from a checkpoint written during a B warm-up without the BWarmupCallback, the
    # run trained every remaining step (and returned the model) at the checkpoint's B, 1.1 under config.bcos['b'] 1.5
    from .b_warmup import BWarmupCallback

    if not any(isinstance(c, BWarmupCallback) for c in callbacks or []):
        callbacks = [*(callbacks or []), warmup_resume_guard(
            model, without="no BWarmupCallback is among the callbacks",
            fix="pass the BWarmupCallback of the run that wrote the checkpoint in callbacks= (the warm-up continues "
                "from its step)")]
    try:
        loss_func = functools.partial(shifted_cross_entropy_loss, label_smoothing=smoothing) if smoothing else None
        trainer = _token_weighted_eval_trainer(Trainer)(model=model, args=args, train_dataset=train_dataset,
                                                       eval_dataset=eval_dataset, data_collator=collator,
                                                       callbacks=callbacks, compute_loss_func=loss_func)
        # TrainingArguments keeps resume_from_checkpoint without acting on it ("intended to be used by your training
        # scripts"): passed through **training_args it started the run afresh without a word
        train_handing_back_own_forward(trainer, model, args.resume_from_checkpoint)
    finally:
        if unnamed_loss:
            model.loss_type = None
    model.eval()
    return trainer


def shifted_cross_entropy_loss(outputs, labels: Tensor, num_items_in_batch=None, *, label_smoothing: float = 0.0
                               ) -> Tensor:
    """The causal-LM cross-entropy as a ``compute_loss_func``: the logits at ``t - 1`` predict ``labels[t]``
    (:func:`~bcos_plugins.losses.cross_entropy_loss` of the shifted pair, with its ``label_smoothing`` and its
    ``num_items_in_batch``, which the ``Trainer`` counts over ``labels[..., 1:]`` for a causal LM)."""
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    return cross_entropy_loss(logits[:, :-1], labels[:, 1:], num_items_in_batch, label_smoothing=label_smoothing)


@functools.cache
def _token_weighted_eval_trainer(trainer_class: type) -> type:
    """``trainer_class`` whose evaluation loss is the token-weighted mean over the whole evaluation set.

    transformers' ``evaluation_loop`` repeats each batch's mean loss once per row and averages those, so a batch of
    short rows counts as much as one of long rows. Here ``compute_loss``, while an evaluation runs, also adds up
    each row's summed token cross-entropy and its number of labelled tokens (gathered per row with
    ``gather_for_metrics``, which drops the rows a distributed sampler repeats), and ``evaluation_loop`` replaces
    ``<prefix>_loss`` with their ratio. Built on first use so that importing this module does not import Trainer.
    """

    class TokenWeightedEvalTrainer(trainer_class):
        _token_loss: list | None = None  # [summed loss (float64), labelled tokens] while an evaluation runs

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self._token_loss is None or self.label_smoother is not None:  # training, or a smoothed loss
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            labels = inputs.get("labels")  # before the call: a compute_loss_func pops it
            loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
            logits = outputs.get("logits") if isinstance(outputs, Mapping) else None
            if labels is not None and logits is not None:
                # the loss transformers' causal LMs compute (ForCausalLMLoss: float32 logits, shifted labels),
                # kept per row so that nothing depends on how rows were batched
                shifted = labels[:, 1:]
                per_token = nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), shifted,
                                                        ignore_index=IGNORE_INDEX, reduction="none")
                sums, counts = self.accelerator.gather_for_metrics(
                    (per_token.double().sum(1), (shifted != IGNORE_INDEX).sum(1)))
                self._token_loss[0] += float(sums.sum())
                self._token_loss[1] += int(counts.sum())
            return (loss, outputs) if return_outputs else loss

        def evaluation_loop(self, *args, **kwargs):
            self._token_loss = [0.0, 0]
            try:
                output = super().evaluation_loop(*args, **kwargs)
                summed, count = self._token_loss
            finally:
                self._token_loss = None
            prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
            if count > 0 and f"{prefix}_loss" in output.metrics:
                output.metrics[f"{prefix}_loss"] = summed / count
            return output

    return TokenWeightedEvalTrainer


def _check_training_rows(name: str, dataset, max_length: int | None, vocab_size: int | None,
                         limit: PositionLimit) -> None:
    """Refuse an empty dataset, rows with nothing to predict (fewer than 2 real tokens) and rows longer than the
    model's position table (they would fail inside the embedding, mid-training) before training.

    A batch of such rows has a loss of 0/0 = NaN and a dataset of them trains on nothing; one short row among
    others is silently unused. Datasets without a length (iterable) are checked batch by batch by the collator.
    """
    if not hasattr(dataset, "__len__"):
        return
    if len(dataset) == 0:
        raise argument_error(name, "is empty", "Pass at least one tokenised example with 2 or more tokens")
    short, unlabelled = [], []
    for i in range(len(dataset)):
        feature = dataset[i]  # (a datasets.Dataset decodes the row on every index)
        row, mask = _feature_tokens(feature, i, max_length)
        if int(mask.sum()) < 2:
            short.append(i)
        if vocab_size is not None and row.numel() and int(row.max()) >= vocab_size:
            raise argument_error(name, f"feature {i} has token id {int(row.max())} outside the vocabulary "
                                 f"[0, {vocab_size})", "Tokenise with the model's own tokenizer")
        labels = _feature_labels(feature, i, row, max_length)
        # the collator's rule for a labelled position (its own token and the one predicting it real): a row without
        # one (a prompt whose answer max_length cut off, labels all -100) was silently unused among others, and alone
        # in a batch failed mid-training (or mid-evaluation) with the collator's NaN-loss refusal, naming no row
        predicted_from_real = torch.nn.functional.pad(mask[:-1], (1, 0), value=0)
        if int(mask.sum()) >= 2 and not bool(((mask == 1) & (predicted_from_real == 1)
                                              & (labels != IGNORE_INDEX)).any()):
            unlabelled.append(i)
        if vocab_size is not None and labels.numel() and int(labels.max()) >= vocab_size:
            raise argument_error(name, f"feature {i} has label {int(labels.max())} outside the vocabulary "
                                 f"[0, {vocab_size})", "Label with the model's own tokenizer's ids (-100: no loss)")
        if limit.max_length is not None and row.numel() > limit.max_length:
            raise argument_error(name, f"feature {i} has {row.numel()} tokens but the model takes at most "
                                 f"{limit.max_length} positions ({limit.source}, its position table)",
                                 f"Pass max_length={limit.max_length} (rows are then truncated to it), or split "
                                 "long examples")
    if short:
        shown = ", ".join(str(i) for i in short[:8]) + (", ..." if len(short) > 8 else "")
        raise argument_error(name, f"{len(short)} example(s) have fewer than 2 real tokens, so there is no next "
                             f"token to predict (features [{shown}])", "Drop them or join short examples")
    if unlabelled:
        shown = ", ".join(str(i) for i in unlabelled[:8]) + (", ..." if len(unlabelled) > 8 else "")
        cut = "" if max_length is None else f" once cut to max_length={max_length}"
        raise argument_error(name, f"{len(unlabelled)} example(s) have no labelled token after a real one{cut} "
                             f"(labels all -100 there), so they have no loss to train or evaluate on (features "
                             f"[{shown}])", "Drop them, or label their answer tokens (and keep the answer within "
                             "max_length)")
