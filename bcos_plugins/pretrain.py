"""The B-cos LM paper's two-stage recipes (its §5): "B-cos then task" and "task then B-cos".

- :func:`pretrain_masked_lm`: B-cos masked-LM pre-training on unlabelled text (transformers' ``Trainer`` and
  ``DataCollatorForLanguageModeling``). A ``BertForMaskedLM`` is B-cosified like any other model: the encoder
  and the MLM head's transform (dense, GELU, LayerNorm) become B-cos / dynamic-weight layers; the decoder, tied
  to the word embeddings, is kept (as the paper keeps LM heads) and applied without its vocabulary bias.
- :func:`classifier_from_masked_lm`: a B-cos ``BertForSequenceClassification`` whose encoder carries the
  pre-trained B-cos encoder's weights (and the B of every layer); fine-tune it with
  :func:`~bcos_plugins.fine_tuning.fine_tune_classifier`.
- :func:`fine_tune_task_then_bcos`: fine-tune conventionally, B-cosify, fine-tune again with ``bcos_loss``.

All three run unchanged under ``torchrun`` / ``accelerate launch`` (the ``Trainer`` does the distribution).
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

from torch import nn

from ._checks import (
    require_bool,
    require_choice,
    require_classifier,
    require_count,
    require_finite_parameters,
    require_number,
    require_run_settings,
    require_texts,
    require_trainable,
)
from .convert.architectures import SPECS, spec_for
from .convert.bcosify import bcosify, plan_conversion
from .convert.checkpoint_format import BCOS_CONFIG_KEY
from .corpus import (
    mask_keywords,
    pad_rows,
    require_texts_with_tokens,
    require_tokenizer_fits,
    truncated_token_counts,
    truncation_named,
    truncation_warned,
    warn_of_truncated_texts,
)
from .encoded_texts import EncodedTexts, truncation_length
from .errors import BcosTypeError, BcosValueError, argument_error
from .fine_tuning import (
    fine_tune_classifier,
    require_no_label_smoothing_with_bce,
    run_output_dir,
    train_handing_back_own_forward,
    training_arguments,
)
from .losses import cross_entropy_loss
from .nn.dynamic import has_dynamic_weights
from .nn.linear import check_b
from .persistence import load_bcos_model

__all__ = ["BCOS_STAGE_SCHEDULE", "MASKED_LM_ARCHITECTURES", "TASK_THEN_BCOS_PRESETS",
           "TASK_THEN_BCOS_PRESET_STAGES", "classifier_from_masked_lm",
           "fine_tune_task_then_bcos", "pretrain_masked_lm"]

#: The learning-rate schedule of the best recipe's B-cos stage (docs/recipes.md): 10 % linear warm-up, then cosine
#: decay, as ``TrainingArguments`` keywords; :func:`fine_tune_task_then_bcos`'s default for its second stage.
BCOS_STAGE_SCHEDULE = {"warmup_steps": 0.1, "lr_scheduler_type": "cosine"}

#: The B of each :func:`fine_tune_task_then_bcos` preset, the rest of the recipe (stock query/key, both stages'
#: schedules) being the same apart from the B-cos stage (:data:`TASK_THEN_BCOS_PRESET_STAGES`): ``"accurate"``, the
#: default, is the B whose explanations lead the best post-hoc methods on comprehensiveness by the most;
#: ``"faithful"`` the B whose explanations lead them on sufficiency and SeqPG by the most, within 3 accuracy points
#: of the conventional model (its comprehensiveness lead held on seed 0, not on seed 1; docs/benchmarks.md#frontier).
TASK_THEN_BCOS_PRESETS = {"accurate": 1.1, "faithful": 1.5}

#: The B-cos stage of each preset, as the defaults of :func:`fine_tune_task_then_bcos`'s ``epochs`` and
#: ``distill_from_task_stage``: "faithful" trains B = 1.5 for twice the epochs, distilled from the task-stage
#: model (at B = 1.5 the recipe's 2 epochs lose many points on a four-class task, this schedule few;
#: docs/benchmarks.md#frontier has the numbers). A ``b`` of the caller's own gets the "accurate" stage.
TASK_THEN_BCOS_PRESET_STAGES = {"accurate": {"epochs": 2.0, "distill_from_task_stage": False},
                                "faithful": {"epochs": 4.0, "distill_from_task_stage": True}}

# the preset when neither b nor preset is given: "accurate". Neither preset leads the best post-hoc method on all three
# metrics across seeds (the faithful preset's comprehensiveness lead did not hold on seed 1), so the default is the
# one with the large comprehensiveness lead at half the B-cos training (docs/benchmarks.md#frontier)
_DEFAULT_TASK_THEN_BCOS_PRESET = "accurate"

#: Masked-LM classes ``pretrain_masked_lm`` trains, with the sequence classifier their encoder moves into.
MASKED_LM_ARCHITECTURES = {name: spec.masked_lm_classifier for name, spec in SPECS.items()
                           if spec.masked_lm_classifier}


def _masked_lm_name(model: nn.Module, name: str = "model") -> str:
    settings = getattr(getattr(model, "config", None), BCOS_CONFIG_KEY, None)
    arch = settings.get("architecture") if isinstance(settings, dict) else type(model).__name__
    if arch not in MASKED_LM_ARCHITECTURES:
        raise argument_error(name, f"must be a masked-LM model ({', '.join(MASKED_LM_ARCHITECTURES)}), got "
                             f"{arch}", "pass a path/hub id (loaded with AutoModelForMaskedLM) or "
                             "transformers.BertForMaskedLM", kind=BcosTypeError)
    spec_for(model)  # the real class, not only the name, must be the one the spec describes
    return arch


def _load_masked_lm(source, b: float | None, bcos_query_key: bool | None) -> nn.Module:
    """A B-cos masked LM from a module or a folder / hub id (B-cos checkpoints reload at their own B)."""
    if isinstance(source, str | os.PathLike):
        from transformers import AutoConfig, AutoModelForMaskedLM

        path = os.fspath(source)
        try:
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as err:
            from .errors import BcosFileError

            raise BcosFileError(f"model: cannot read a model configuration from {path} ({err}). Pass a folder "
                                "written by save_pretrained or a hub model id.") from None
        if isinstance(getattr(config, BCOS_CONFIG_KEY, None), dict):
            source = load_bcos_model(path)
        else:
            source = AutoModelForMaskedLM.from_pretrained(path)
    if not isinstance(source, nn.Module):
        raise argument_error("model", f"must be a masked-LM model or a path to one, got {type(source).__name__}",
                             "pass e.g. 'bert-base-uncased' or transformers.BertForMaskedLM(config)",
                             kind=BcosTypeError)
    _masked_lm_name(source)
    if not has_dynamic_weights(source):
        return bcosify(source, b=1.25 if b is None else b, bcos_query_key=bcos_query_key is not False,
                       verbose=False)
    own = source.config.bcos["b"]
    if b is not None and check_b(b) != own:
        raise argument_error("b", f"is {b} but the model is already B-cos with B = {own}",
                             "leave b out to continue with the model's own B, or start from the stock model")
    own_query_key = source.config.bcos.get("query_key") != "stock"
    if bcos_query_key is not None and bcos_query_key != own_query_key:
        raise argument_error("bcos_query_key", f"is {bcos_query_key} but the model is already B-cos with "
                             f"bcos_query_key={own_query_key}", "leave bcos_query_key out to continue with the "
                             "model's own setting, or start from the stock model")
    return source


def _task_then_bcos_b(b: float | None, preset: str | None) -> float:
    """The B of ``fine_tune_task_then_bcos``: ``b`` itself, else the preset's (checked before any training)."""
    if preset is not None:
        require_choice("preset", preset, tuple(TASK_THEN_BCOS_PRESETS),
                       f"Pick one of those, or leave preset out (the default, {_DEFAULT_TASK_THEN_BCOS_PRESET!r})")
        if b is not None:
            raise argument_error("b", f"is {b!r} and preset is {preset!r}, but a preset sets B itself "
                                 f"(B = {TASK_THEN_BCOS_PRESETS[preset]})",
                                 "pass either b= (your own B) or preset=, not both")
        return TASK_THEN_BCOS_PRESETS[preset]
    return TASK_THEN_BCOS_PRESETS[_DEFAULT_TASK_THEN_BCOS_PRESET] if b is None else b


def pretrain_masked_lm(
    model,
    tokenizer,
    texts: list[str],
    *,
    b: float | None = None,
    bcos_query_key: bool | None = None,
    epochs: float = 1.0,
    batch_size: int = 32,
    learning_rate: float = 5e-5,
    mlm_probability: float = 0.15,
    max_length: int | None = None,
    output_dir: str | Path | None = None,
    seed: int = 0,
    progress: bool = True,
    **training_args,
):
    """B-cos masked-LM pre-training on unlabelled ``texts``; returns the ``Trainer`` (the model is ``.model``).

    Args:
        model: a stock ``BertForMaskedLM`` (B-cosified here, in place, at ``b``; default 1.25), a B-cos one
            (training continues at its own B), or a folder / hub id (a stock checkpoint is loaded with
            ``AutoModelForMaskedLM`` (a base-model checkpoint gets a fresh MLM head transform), a B-cos one
            with :func:`~bcos_plugins.load_bcos_model`).
        bcos_query_key: passed to :func:`~bcos_plugins.bcosify` when the model is converted here (default
            True); an already-B-cos model keeps its own setting (a different value is refused).
        tokenizer: the model's tokenizer; it needs a mask token.
        texts: unlabelled texts (tokenised with truncation at ``max_length``; a ``UserWarning`` names those cut).
        max_length: default 128, capped at the model's position limit; a longer one is refused before training.
        mlm_probability: share of tokens masked per batch (``DataCollatorForLanguageModeling``; 80 % become
            the mask token, 10 % a random token, 10 % stay).
        **training_args: passed to ``TrainingArguments`` (e.g. ``warmup_ratio``, ``use_cpu``).

    Without ``output_dir`` the ``Trainer`` works in a temporary folder, removed when the call returns (also on error)
    unless the run saved checkpoints there (``save_strategy``). Save the result with ``trainer.save_model(folder)``
    (only the main process writes under ``torchrun``)
    and continue with :func:`classifier_from_masked_lm`. The loss is the cross-entropy over the masked positions
    (:func:`~bcos_plugins.losses.cross_entropy_loss`: the model's own, but the mean over every masked token of the
    accumulated batches under ``gradient_accumulation_steps``, which the model's own is not). With ``bf16=True``
    the model returned computes in its weights' dtype again, as it saves and reloads.

    Raises:
        BcosTypeError / BcosValueError: not a masked-LM model, a tokenizer without a mask token or with more
            tokens than the model's embedding rows, empty texts, ``b`` different from an already-B-cos model's B,
            a ``max_length`` past the model's position table, or a setting out of range (named).
    """
    from transformers import DataCollatorForLanguageModeling, Trainer

    if b is not None:
        check_b(b)
    # checked before any training (bcosify would refuse it only after loading the model)
    require_bool("bcos_query_key", bcos_query_key, or_none=True,
                 fix="Pass True (B-cos query/key layers), False (keep the pretrained query/key maps) or None (True "
                 "for a stock model, a B-cos model's own setting)")
    if not callable(tokenizer) or getattr(tokenizer, "mask_token", None) is None:
        raise argument_error("tokenizer", f"must be a transformers tokenizer with a mask token, got "
                             f"{type(tokenizer).__name__}", "pass AutoTokenizer.from_pretrained(...) of the model")
    texts = require_texts(texts)
    require_run_settings(epochs, batch_size, max_length, learning_rate, seed)
    require_number("mlm_probability", mlm_probability, low=0.0, low_open=True, high=1.0)
    model = _load_masked_lm(model, b, bcos_query_key)
    require_finite_parameters(model)
    require_trainable(model)
    max_length = truncation_length(model, max_length, default=128)
    require_tokenizer_fits(model, tokenizer)  # the one check of a tokenizer larger than the embedding
    # output_dir=None: a temporary folder, removed when the call ends unless the run saved checkpoints there
    with run_output_dir(output_dir, "bcos_mlm_", resume=training_args.get("resume_from_checkpoint")) as output_dir:
        args = training_arguments(output_dir, len(texts), epochs, batch_size, learning_rate, seed, progress,
                                  training_args, helper=pretrain_masked_lm)
        dataset = EncodedTexts(tokenizer, texts, None, max_length)
        kept = [len(ids) for ids in dataset.encodings["input_ids"]]
        # a batch of texts without tokens (rows of padding alone) failed mid-training inside the attention
        require_texts_with_tokens(kept, range(len(texts)), texts, "texts", "pre-train on", scope="")
        # texts longer than max_length (128 by default) were pre-trained on as their first tokens without a word
        warn_of_truncated_texts("pretrain_masked_lm", truncated_token_counts(tokenizer, texts, None, kept, max_length),
                                max_length, model, tokenizer, False, outcome="pre-trained on as")
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=dataset,
            data_collator=MaskedLMPadding(tokenizer, DataCollatorForLanguageModeling(
                tokenizer, mlm=True, mlm_probability=mlm_probability, seed=args.seed)),  # (a Python int)
            # the masked-LM cross-entropy through a loss of our own: transformers' masked LMs take **kwargs, so the
            # Trainer left the division by the accumulation steps to them and they ignore num_items_in_batch (with
            # gradient_accumulation_steps=2 the loss and gradients were twice too large)
            compute_loss_func=functools.partial(cross_entropy_loss, label_smoothing=args.label_smoothing_factor),
        )
        # TrainingArguments keeps resume_from_checkpoint without acting on it ("intended to be used by your training
        # scripts"): passed through **training_args it started the run afresh without a word
        train_handing_back_own_forward(trainer, model, args.resume_from_checkpoint)
        model.eval()
        return trainer


class MaskedLMPadding:
    """Pads a batch with the attention mask before ``collate`` (``DataCollatorForLanguageModeling``, which pads without
    asking for it) masks its tokens: with a tokenizer whose ``model_input_names`` leave the mask out
    (:func:`~bcos_plugins.corpus.mask_keywords`) every padded row was pre-trained on with its padding attended to as
    tokens, silently. Any other tokenizer's batch goes to ``collate`` as before."""

    def __init__(self, tokenizer, collate) -> None:
        self.tokenizer, self.collate = tokenizer, collate
        self.keywords = ({} if "attention_mask" in getattr(tokenizer, "model_input_names", ["attention_mask"])
                         else mask_keywords(tokenizer))

    def __call__(self, features: list[dict]) -> dict:
        if self.keywords:
            # padded to one length with the mask here, so collate pads nothing and keeps the mask
            padded = pad_rows(self.tokenizer, features, **self.keywords)
            features = [{key: values[i] for key, values in padded.items()} for i in range(len(features))]
        return self.collate(features)


def classifier_from_masked_lm(masked_lm, num_labels: int = 2, *, pooler_from=None) -> nn.Module:
    """A B-cos sequence classifier whose encoder is the B-cos masked LM's encoder (copied).

    Args:
        masked_lm: a B-cos ``BertForMaskedLM`` (e.g. ``pretrain_masked_lm(...).model``) or the folder it was
            saved to.
        num_labels: classes of the new, freshly initialised head.
        pooler_from: optional stock checkpoint (folder / hub id of a ``BertModel`` with a pooler, e.g. the one
            the pre-training started from) to take the pooler's weights from; ``BertForMaskedLM`` has no
            pooler, so without it the pooler starts random like the classifier head.

    Every layer keeps the B it had in the masked LM, and the query/key projections their kind (B-cos or
    stock, ``bcos_query_key``), and the classifier has the masked LM's dtype. It is in eval mode; fine-tune it with
    :func:`~bcos_plugins.fine_tuning.fine_tune_classifier` (a larger ``head_learning_rate`` helps the fresh head).

    Raises:
        BcosTypeError / BcosValueError: not a B-cos masked LM, ``num_labels`` < 2, a ``pooler_from`` without a
            pooler of the same size.
    """
    import transformers

    if isinstance(masked_lm, str | os.PathLike):
        masked_lm = load_bcos_model(masked_lm)
    if not isinstance(masked_lm, nn.Module) or not has_dynamic_weights(masked_lm):
        raise argument_error("masked_lm", f"must be a B-cos masked LM (or its folder), got "
                             f"{type(masked_lm).__name__}", "pass pretrain_masked_lm(...).model or the "
                             "folder saved from it", kind=BcosTypeError)
    arch = _masked_lm_name(masked_lm, "masked_lm")
    num_labels = require_count("num_labels", num_labels)
    if num_labels == 1:
        # one logit is transformers' regression head (MSE on float targets): the classifier it built was refused
        # only later, by fine_tune_classifier, predict and explain (require_classifier)
        raise argument_error("num_labels", "is 1, which makes transformers' regression head (one logit, trained with "
                             "MSE on float targets), not a classifier", "pass num_labels=2 for a binary task")
    config = copy.deepcopy(masked_lm.config)
    delattr(config, BCOS_CONFIG_KEY)
    config.num_labels = num_labels
    config.architectures = None
    classifier = getattr(transformers, MASKED_LM_ARCHITECTURES[arch])(config)
    if pooler_from is not None:
        stock = transformers.AutoModel.from_pretrained(os.fspath(pooler_from))
        pooler = getattr(stock, "pooler", None)
        if pooler is None or pooler.dense.weight.shape != classifier.bert.pooler.dense.weight.shape:
            raise argument_error("pooler_from", f"{pooler_from} has no pooler of hidden size "
                                 f"{config.hidden_size}", "pass the stock checkpoint the pre-training started "
                                 "from, or leave pooler_from out")
        classifier.bert.pooler.load_state_dict(pooler.state_dict())
    bcosify(classifier, b=masked_lm.config.bcos["b"],
            bcos_query_key=masked_lm.config.bcos.get("query_key") != "stock", verbose=False)
    # in the masked LM's dtype before loading: load_state_dict copies into the classifier's own (float32) tensors,
    # which rounded a float64 encoder's weights and turned a bfloat16 one into a float32 model, without a word
    classifier.to(dtype=next(masked_lm.parameters()).dtype)
    missing, unexpected = classifier.bert.load_state_dict(masked_lm.bert.state_dict(), strict=False)
    stray = [k for k in missing if not k.startswith("pooler.")]
    if stray or unexpected:  # the two encoders are built from one config: anything else is a bug
        raise BcosValueError(f"masked_lm: its encoder does not fit the classifier's (missing {stray}, unexpected "
                             f"{unexpected}). Report this with the model's config.")
    classifier.to(next(masked_lm.parameters()).device)
    return classifier.eval()


def fine_tune_task_then_bcos(
    model: nn.Module,
    tokenizer,
    texts: list[str],
    labels: list[int],
    *,
    b: float | None = None,
    preset: str | None = None,
    bcos_query_key: bool = False,
    task_epochs: float = 2.0,
    task_learning_rate: float = 1e-4,
    epochs: float | None = None,
    learning_rate: float = 2e-4,
    batch_size: int = 16,
    distill_from_task_stage: bool | None = None,
    **fine_tune_kwargs,
):
    """The paper's "task then B-cos": conventional fine-tuning, :func:`bcosify`, then B-cos fine-tuning.

    ``model`` (a stock sequence classifier) is first fine-tuned with its own cross-entropy for
    ``task_epochs`` at ``task_learning_rate``, then B-cosified in place at B = ``b``, or the ``preset``'s B when
    ``b`` is left out (and ``bcos_query_key``, see :func:`~bcos_plugins.bcosify`) and fine-tuned with
    ``bcos_loss`` for ``epochs`` at ``learning_rate`` by :func:`~bcos_plugins.fine_tuning.fine_tune_classifier`
    with ``fine_tune_kwargs`` (``head_learning_rate``, ``teacher``, ...; those that are not B-cos-stage settings,
    such as ``max_length`` or ``TrainingArguments`` keywords, apply to the first stage too, as does
    ``batch_size``). Returns the second stage's ``Trainer``; the B-cos model is ``model`` itself (and
    ``trainer.model``).

    The defaults are the best recipe of the recipe search (docs/recipes.md,
    ``task-then-bcos-b1.1-stockqk-warm-cos``): B = 1.1 with the query/key projections kept stock, 2 conventional
    epochs at 1e-4, then 2 B-cos epochs at 2e-4 with a 10 % linear warm-up and a cosine decay (the B-cos stage's
    default ``warmup_steps=0.1``, ``lr_scheduler_type="cosine"``; either one passed applies to both stages), batch
    16, at no more B-cos training than the conventional model's (docs/benchmarks.md has what it measured). Note
    that :func:`~bcos_plugins.bcosify` itself defaults to B-cos query/key.

    Presets (:data:`TASK_THEN_BCOS_PRESETS`) pick B on the faithfulness frontier (docs/benchmarks.md#frontier has
    the numbers). ``preset="accurate"`` (B = 1.1, the default when neither ``b`` nor ``preset`` is given) trains
    the B-cos stage for 2 epochs, and its explanations lead post-hoc methods on comprehensiveness (and, by less, on
    SeqPG) but not on sufficiency;
    ``preset="faithful"`` (B = 1.5) trains its B-cos stage for 4 epochs instead of 2, distilled from the
    task-stage model (:data:`TASK_THEN_BCOS_PRESET_STAGES`; in 2 epochs B = 1.5 lost 14.5 points on a four-class
    task, AG News), stays within 3 points of the conventional model (SST-2 and AG News, seeds 0 and 1) and leads post-hoc
    methods on sufficiency and SeqPG (and on comprehensiveness on seed 0, not on seed 1). The default is "accurate": neither
    preset leads on all three metrics across seeds, and it is the cheaper. ``b``
    sets any other B (with the "accurate" stage); passing both ``b`` and ``preset`` is refused. ``b=1.25`` is the
    setting whose explanations lead on all three metrics pooled over seeds 0 and 1, at 2.6 (SST-2) and 3.1 (AG News)
    accuracy points: just past the 3-point bound, so not a preset.

    ``epochs`` (the B-cos stage's) and ``distill_from_task_stage`` default to the preset's. With
    ``distill_from_task_stage`` the B-cos stage adds a distillation loss toward a copy of the model as the first
    stage left it (``fine_tune_classifier``'s ``teacher``; ``distill_weight`` and the other distillation
    keywords apply): one more copy of the model in memory during the second stage. A ``teacher=`` of your own
    replaces the preset's distillation; with ``distill_from_task_stage=True`` it is refused.

    Raises:
        BcosValueError / BcosTypeError: ``model`` is already B-cos (use fine_tune_classifier), ``preset`` is
            not a key of :data:`TASK_THEN_BCOS_PRESETS`, ``b`` and ``preset`` are both given,
            ``distill_from_task_stage`` is not a bool or is True with ``teacher=``, or any argument
            fine_tune_classifier refuses.
        UnsupportedModuleError: a model :func:`~bcos_plugins.bcosify` cannot convert; raised, like every
            error above, before the first stage trains.
    """
    require_classifier(model)
    if has_dynamic_weights(model):
        raise argument_error("model", "is already B-cos; task then B-cos starts from a stock classifier",
                             "pass the stock model, or call fine_tune_classifier on the B-cos one")
    b = _task_then_bcos_b(b, preset)  # validates preset: a known name, and not with b
    stage = TASK_THEN_BCOS_PRESET_STAGES[_DEFAULT_TASK_THEN_BCOS_PRESET if preset is None else preset]
    epochs = stage["epochs"] if epochs is None else epochs
    require_bool("distill_from_task_stage", distill_from_task_stage, or_none=True,
                 fix="Pass True to distil the B-cos stage from the task-stage model, False not to, or leave it out "
                 "(the preset's choice)")
    if distill_from_task_stage is None:  # a teacher of the caller's own replaces the preset's distillation
        distill_from_task_stage = stage["distill_from_task_stage"] and "teacher" not in fine_tune_kwargs
    elif distill_from_task_stage and "teacher" in fine_tune_kwargs:
        raise argument_error("distill_from_task_stage", "is True and teacher= is given, but the B-cos stage "
                             "distils from one teacher", "pass distill_from_task_stage=False to distil from "
                             "your teacher, or leave teacher= out to distil from the task-stage model")
    # the conversion between the stages (bcos_query_key among its settings: plan_conversion's require_bool), both
    # stages' own settings: checked before the first stage trains the user's model in place (an unconvertible model
    # would otherwise fail only after it)
    plan_conversion(model, b, bcos_query_key=bcos_query_key)
    require_number("task_epochs", task_epochs, low=0.0, low_open=True)
    require_number("task_learning_rate", task_learning_rate, low=0.0, low_open=True)
    max_length = truncation_length(model, fine_tune_kwargs.get("max_length"), default=64)
    require_run_settings(epochs, batch_size, max_length, learning_rate, fine_tune_kwargs.get("seed", 0))
    if fine_tune_kwargs.get("loss", "auto") == "ce":
        raise argument_error("loss", "is 'ce', but the B-cos stage trains with bcos_loss",
                             "leave loss out (or 'auto' / 'bce')")
    # refused by the B-cos stage: checked before the first stage trains
    require_no_label_smoothing_with_bce(True, fine_tune_kwargs.get("label_smoothing_factor"))
    resume = fine_tune_kwargs.get("resume_from_checkpoint")
    if resume is not None and resume is not False:
        # it went to both stages: the conventional stage trains in a temporary folder (True found no checkpoint
        # there) and loaded a B-cos stage checkpoint into the stock model (a crash in the optimiser's state)
        raise argument_error("resume_from_checkpoint", f"is {resume!r}, but fine_tune_task_then_bcos runs two stages "
                             "and a checkpoint holds one of them (the B-cos stage's, in output_dir)",
                             f"resume the B-cos stage itself: bcosify(model, b={b}, bcos_query_key={bcos_query_key}) "
                             "on the stock classifier, then fine_tune_classifier(model, ..., "
                             f"learning_rate={learning_rate}, epochs={epochs}, **BCOS_STAGE_SCHEDULE, "
                             "resume_from_checkpoint=...) with the stage's other settings (and its teacher=, if "
                             "it distilled)")
    # the B-cos stage's own settings stay out of the conventional stage; the rest (batch size, max length,
    # TrainingArguments such as use_cpu) apply to both
    own = {"head_learning_rate", "b_warmup", "teacher", "distill_weight", "distill_loss", "distill_temperature",
           "loss", "output_dir"}
    shared = {k: v for k, v in fine_tune_kwargs.items() if k not in own}
    # the conventional stage trains in a temporary folder, removed when it ends (also on error), checkpoints and
    # all: they cannot be resumed (resume_from_checkpoint is refused above); it was left behind, once per call
    # the conventional stage's truncation warning (the call's one) names this function, at the caller's line
    with run_output_dir(None, "bcos_task_stage_", keep_checkpoints=False) as task_stage_dir, \
            truncation_named("fine_tune_task_then_bcos"):
        fine_tune_classifier(model, tokenizer, texts, labels, epochs=task_epochs, learning_rate=task_learning_rate,
                             batch_size=batch_size, loss="ce", output_dir=task_stage_dir, **shared)
    if distill_from_task_stage:
        # fine_tune_classifier reads the teacher's logits once, before training; the copy is the model as the
        # first stage left it (one more copy of the model in memory during the second stage)
        fine_tune_kwargs = {"teacher": copy.deepcopy(model).eval(), **fine_tune_kwargs}
    bcosify(model, b=b, bcos_query_key=bcos_query_key, verbose=False)
    # the same texts at the same max_length: the conventional stage warned of their truncation, once for the call
    with truncation_warned():
        return fine_tune_classifier(model, tokenizer, texts, labels, epochs=epochs, learning_rate=learning_rate,
                                    batch_size=batch_size, **{**BCOS_STAGE_SCHEDULE, **fine_tune_kwargs})
