"""Trust pass 21, training and persistence: unusual inputs to the training helpers, their losses, the transformers
Trainer integration and save/load, each pinned where it was silently wrong or crashed unhelpfully."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from conftest import tiny_config
from test_pretrain import QUIET, corpus, runs_of_words, word_tokenizer

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.losses import DistillationLoss, cross_entropy_loss
from bcos_plugins.pretrain import fine_tune_task_then_bcos, pretrain_masked_lm
from bcos_plugins.train import fine_tune_classifier, predict


def _classifier(bcos: bool, seed: int = 0) -> torch.nn.Module:
    """A tiny two-class BERT without dropout (the Trainer trains in train mode: its loss is then the eval one)."""
    torch.manual_seed(seed)
    config = tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = T.BertForSequenceClassification(config).eval()
    return bcosify(model, b=1.25, verbose=False) if bcos else model


def _first_step_loss(model, texts, labels, **kwargs) -> float:
    """The Trainer's training loss of one step over all of ``texts`` (2 micro-batches of 2 rows, accumulated)."""
    trainer = fine_tune_classifier(model, word_tokenizer(), texts, labels, batch_size=2, max_length=16,
                                   learning_rate=1e-3, max_steps=1, gradient_accumulation_steps=2, **QUIET, **kwargs)
    return trainer.state.log_history[-1]["train_loss"]


@pytest.mark.parametrize(("bcos", "loss"), [(False, "auto"), (True, "ce")])
def test_fine_tune_classifier_cross_entropy_is_the_mean_under_gradient_accumulation(bcos, loss):
    """transformers' classifiers take **kwargs, so the Trainer handed them num_items_in_batch and did not divide
    their loss by the accumulation steps, and they ignore it: with 2 steps the training loss (and the gradients)
    was twice the mean cross-entropy (1.37 for 0.685 on a tiny BERT)."""
    texts, labels = corpus(4, seed=2)
    with torch.no_grad():
        logits = predict(_classifier(bcos), word_tokenizer(), texts, max_length=16)
    expected = F.cross_entropy(logits.double(), torch.tensor(labels)).item()
    assert _first_step_loss(_classifier(bcos), texts, labels, loss=loss) == pytest.approx(expected, rel=1e-5)
    # with label smoothing too (the Trainer's label smoother is torch's label_smoothing)
    smoothed = F.cross_entropy(logits.double(), torch.tensor(labels), label_smoothing=0.3).item()
    assert _first_step_loss(_classifier(bcos), texts, labels, loss=loss,
                            label_smoothing_factor=0.3) == pytest.approx(smoothed, rel=1e-5)


def test_pretrain_masked_lm_loss_is_not_multiplied_by_the_accumulation_steps():
    """BertForMaskedLM ignores num_items_in_batch as the classifiers do: with 2 accumulation steps the pre-training
    loss was twice the masked-token cross-entropy (8.15 against 4.07). The masks are drawn per micro-batch, so the
    two runs see different masks: their losses agree to a few per cent, not exactly."""
    def loss(**kwargs) -> float:
        torch.manual_seed(0)
        model = T.BertForMaskedLM(tiny_config("bert"))
        trainer = pretrain_masked_lm(model, word_tokenizer(), runs_of_words(8), epochs=1, learning_rate=1e-3,
                                     max_length=12, **QUIET, **kwargs)
        return trainer.state.log_history[-1]["train_loss"]

    plain, accumulated = loss(batch_size=8), loss(batch_size=4, gradient_accumulation_steps=2)
    assert accumulated / plain == pytest.approx(1.0, abs=0.05)


def test_label_smoothing_with_bcos_loss_is_refused_instead_of_ignored():
    """The Trainer calls no label smoother when a compute_loss_func is set: label_smoothing_factor=0.3 trained a
    B-cos model with bcos_loss exactly as without it (the same loss, 0.6489), without a word."""
    texts, labels = corpus(4)
    with pytest.raises(BcosValueError, match=r"^label_smoothing_factor: is 0\.3, but the B-cos model trains with "
                                             r"bcos_loss .* leave label_smoothing_factor out, or pass loss='ce'"):
        fine_tune_classifier(_classifier(True), word_tokenizer(), texts, labels, max_length=16,
                             label_smoothing_factor=0.3, **QUIET)
    # task then B-cos: refused before its conventional stage trains the model in place
    model = _classifier(False)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BcosValueError, match=r"^label_smoothing_factor: is 0\.1, but the B-cos model trains"):
        fine_tune_task_then_bcos(model, word_tokenizer(), texts, labels, max_length=16, label_smoothing_factor=0.1,
                                 **QUIET)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_distillation_with_the_cross_entropy_applies_label_smoothing():
    """DistillationLoss is a compute_loss_func, so the Trainer's label smoother was never called: the smoothed run's
    loss was the unsmoothed one."""
    texts, labels = corpus(4, seed=2)
    teacher = _classifier(False, seed=3)
    tok = word_tokenizer()
    with torch.no_grad():
        student_logits = predict(_classifier(False), tok, texts, max_length=16).double()
        teacher_logits = predict(teacher, tok, texts, max_length=16).double()
    term = (student_logits - teacher_logits).pow(2).mean(-1).mean()
    expected = F.cross_entropy(student_logits, torch.tensor(labels), label_smoothing=0.3) + 0.5 * term
    got = _first_step_loss(_classifier(False), texts, labels, loss="ce", teacher=teacher, distill_weight=0.5,
                           distill_loss="mse", label_smoothing_factor=0.3)
    assert got == pytest.approx(expected.item(), rel=1e-5)
    # and the loss class itself, directly
    loss = DistillationLoss(False, 0.5, "mse", 1.0, label_smoothing=0.3)
    loss.trainer = type("Trainer", (), {"teacher_batch": teacher_logits})()
    torch.testing.assert_close(loss(student_logits, torch.tensor(labels)), expected)


def test_cross_entropy_loss_is_its_formula_and_refuses_what_it_cannot_read():
    torch.manual_seed(0)
    logits, labels = torch.randn(3, 5, 7, dtype=torch.float64), torch.randint(0, 7, (3, 5))
    labels[0, :2] = -100
    kept = labels != -100
    hand = -logits.log_softmax(-1).gather(-1, labels.clamp_min(0)[..., None])[..., 0][kept]
    torch.testing.assert_close(cross_entropy_loss(logits, labels), hand.mean())
    # gradient accumulation: the sum over the labelled positions divided by the count over every micro-batch
    torch.testing.assert_close(cross_entropy_loss(logits, labels, num_items_in_batch=torch.tensor(26)),
                               hand.sum() / 26)
    # nothing labelled: a loss of 0 with a zero gradient, not the NaN of an empty mean
    leaf = logits.clone().requires_grad_()
    empty = cross_entropy_loss(leaf, torch.full_like(labels, -100))
    empty.backward()
    assert empty.item() == 0.0 and torch.equal(leaf.grad, torch.zeros_like(leaf))
    # half-precision logits are read in float32
    low = logits.to(torch.bfloat16)
    torch.testing.assert_close(cross_entropy_loss(low, labels), cross_entropy_loss(low.double(), labels).float())
    with pytest.raises(BcosValueError, match=r"^labels: has shape \(3,\), but logits of shape \(3, 5, 7\) need "
                                             r"\(3, 5\)"):
        cross_entropy_loss(logits, labels[:, 0])
    with pytest.raises(BcosTypeError, match=r"^labels: must be a tensor of integer ids, got Tensor of torch\.float"):
        cross_entropy_loss(logits, labels.float())


def test_causal_lm_training_keeps_a_features_own_labels_instead_of_training_on_the_prompt(tmp_path):
    """CausalLMCollator labelled every real token with its own id and dropped a feature's labels: a prompt masked
    with -100 (instruction tuning) was trained on, and evaluated, as if it were the answer, without a word."""
    from bcos_plugins.train_decoder import CausalLMCollator, train_causal_lm

    collator = CausalLMCollator(pad_token_id=0, padding_side="left")
    batch = collator([{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}, {"input_ids": [9, 10, 11]}])
    assert batch["labels"].tolist() == [[-100, -100, 7, 8], [-100, -100, 10, 11]]
    torch.manual_seed(0)
    model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.1, verbose=False)
    rows = [{"input_ids": [5 + i, 6 + i, 7 + i, 8 + i, 9 + i], "labels": [-100, -100, -100, 8 + i, 9 + i]}
            for i in range(4)]
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, eval_dataset=rows, max_steps=1,
                              per_device_train_batch_size=4, disable_tqdm=True)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([r["input_ids"] for r in rows])).logits.double()
    # the next-token losses of the answer tokens alone (positions 3 and 4, predicted at 2 and 3)
    expected = F.cross_entropy(logits[:, 2:4].reshape(-1, logits.shape[-1]),
                               torch.tensor([r["input_ids"][3:] for r in rows]).reshape(-1))
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected.item(), rel=1e-5)


def test_causal_lm_labels_are_refused_by_name_when_they_cannot_be_read():
    from bcos_plugins.train_decoder import CausalLMCollator

    collator = CausalLMCollator(pad_token_id=0, max_length=3)
    with pytest.raises(BcosValueError, match=r"^features\[0\]\['labels'\]: has shape \(5,\) but "
                                             r"features\[0\]\['input_ids'\] has \(4,\)"):
        collator([{"input_ids": [5, 6, 7, 8], "labels": [5, 6, 7, 8, 9]}])
    with pytest.raises(BcosTypeError, match=r"^features: feature 0: labels must be one sequence of integer ids"):
        collator([{"input_ids": [5, 6, 7], "labels": [5.0, 6.0, 7.0]}])
    with pytest.raises(BcosValueError, match=r"^features: feature 0: labels must be token ids >= 0 or -100"):
        collator([{"input_ids": [5, 6, 7], "labels": [5, -1, 7]}])
    with pytest.raises(BcosValueError, match=r"^features: no example of this batch has a labelled token"):
        collator([{"input_ids": [5, 6, 7], "labels": [-100, -100, -100]}])


@pytest.mark.parametrize("settings", [{"weight_decay": 0.5, "adam_epsilon": 1e-3}, {"optim": "sgd"}])
def test_a_head_learning_rate_equal_to_the_learning_rate_trains_as_without_one(settings):
    """With head_learning_rate the helper built two_rate_adamw itself: the TrainingArguments' optim, adam_epsilon and
    betas were ignored and the norms' weights and the biases were decayed, which the Trainer's own optimiser (the run
    without head_learning_rate) does not do. The same rate twice must train the same model."""
    texts, labels = corpus(8)

    def trained(**kwargs):
        model = _classifier(True)
        fine_tune_classifier(model, word_tokenizer(), texts, labels, batch_size=4, max_length=16, learning_rate=1e-2,
                             max_steps=3, **QUIET, **settings, **kwargs)
        return model

    plain, two_rates = trained(), trained(head_learning_rate=1e-2)
    for (name, a), b in zip(plain.named_parameters(), two_rates.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_classifier_from_masked_lm_refuses_one_label_instead_of_building_a_regression_head():
    """num_labels=1 built transformers' one-logit regression head, which fine_tune_classifier, predict and explain
    refuse (every prediction is class 0): refused here, where it is chosen."""
    from bcos_plugins.pretrain import classifier_from_masked_lm

    masked_lm = bcosify(T.BertForMaskedLM(tiny_config("bert")), b=1.25, verbose=False)
    with pytest.raises(BcosValueError, match=r"^num_labels: is 1, which makes transformers' regression head .* "
                                             r"pass num_labels=2 for a binary task"):
        classifier_from_masked_lm(masked_lm, num_labels=1)
    assert classifier_from_masked_lm(masked_lm, num_labels=2).config.num_labels == 2


def test_a_b_warmup_built_for_another_model_is_refused_when_training_begins(tmp_path):
    """BWarmupCallback(model_a) in Trainer(model=model_b) annealed model_a's B while model_b trained at its full B
    (2.0 at every step), without a word."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from bcos_plugins import bcos_loss
    from bcos_plugins.train import BWarmupCallback

    built_for, trained = _classifier(True, seed=0), _classifier(True, seed=1)
    texts = [[2, 5 + i, 6 + i, 3] for i in range(4)]
    data = Dataset.from_dict({"input_ids": texts, "labels": [0, 1, 0, 1]})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=trained, args=args, train_dataset=data, compute_loss_func=bcos_loss,
                      callbacks=[BWarmupCallback(built_for, fraction=0.5)])
    with pytest.raises(BcosValueError, match=r"^model: BWarmupCallback was built for another model than the one the "
                                             r"Trainer trains"):
        trainer.train()
    assert trainer.state.global_step == 0
    # built for the trained model, the same run warms up
    trainer = Trainer(model=trained, args=args, train_dataset=data, compute_loss_func=bcos_loss,
                      callbacks=[BWarmupCallback(trained, fraction=0.5)])
    assert trainer.train().global_step == 2


@pytest.mark.parametrize("kind", ["bce", "kl", "mse"])
def test_the_losses_of_bfloat16_logits_are_the_losses_of_those_logits(kind):
    """bcos_loss and DistillationLoss computed in the logits' bfloat16: the loss of a bfloat16 model was 1.2e-3
    (bcos_loss) to 2.4e-3 (the KL term) off the loss of its own logits, about 400 times the logits' rounding."""
    from bcos_plugins import bcos_loss

    torch.manual_seed(0)
    logits = (torch.randn(256, 5) * 4).to(torch.bfloat16)
    labels, teacher = torch.randint(0, 5, (256,)), torch.randn(256, 5, dtype=torch.float64) * 4
    if kind == "bce":
        got, exact = bcos_loss(logits, labels), bcos_loss(logits.double(), labels)
    else:
        loss = DistillationLoss(True, 1.0, kind, 2.0)
        loss.trainer = type("Trainer", (), {"teacher_batch": teacher.float()})()
        got, exact = loss(logits, labels), loss(logits.double(), labels)
    assert got.item() == pytest.approx(exact.item(), rel=1e-5)


@pytest.mark.parametrize("resume", [True, "some/checkpoint-2"])
def test_task_then_bcos_refuses_resume_from_checkpoint_before_its_first_stage(resume):
    """resume_from_checkpoint went to both stages: the conventional one trains in a temporary folder (True failed
    with transformers' "No valid checkpoint found in output directory (/tmp/bcos_finetune_...)") and loaded a B-cos
    stage checkpoint into the stock model (the B-cos weights without their biases, then "loaded state dict contains a
    parameter group that doesn't match the size of optimizer's group")."""
    texts, labels = corpus(4)
    model = _classifier(False)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BcosValueError, match=r"^resume_from_checkpoint: is .*, but fine_tune_task_then_bcos runs two "
                                             r"stages .* resume the B-cos stage itself: bcosify\(model, b=1\.1, "
                                             r"bcos_query_key=False\)"):
        fine_tune_task_then_bcos(model, word_tokenizer(), texts, labels, max_length=16, resume_from_checkpoint=resume,
                                 **QUIET)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("problem_type", ["multi_label_classification", "regression"])
def test_fine_tune_classifier_refuses_a_problem_type_its_class_ids_cannot_train(problem_type):
    """The model's own loss reads config.problem_type (BCE on multi-hot targets, MSE), which one class id per text
    cannot feed: it failed at the first step inside the model; the cross-entropy must not train it silently as a
    single-label classifier either."""
    texts, labels = corpus(4)
    model = _classifier(False)
    model.config.problem_type = problem_type
    with pytest.raises(BcosValueError, match=rf"^model: has config\.problem_type '{problem_type}', but "
                                             r"fine_tune_classifier trains one class id per text"):
        fine_tune_classifier(model, word_tokenizer(), texts, labels, max_length=16, **QUIET)


def test_a_keyword_no_training_helper_takes_is_refused_naming_the_closest_valid_one(tmp_path):
    """A misspelt keyword (or a Trainer argument such as callbacks=) failed with Python's bare
    "TrainingArguments.__init__() got an unexpected keyword argument 'learning_rat'", naming neither the helper nor
    the fix."""
    from bcos_plugins.errors import BcosKeywordError
    from bcos_plugins.train_decoder import train_causal_lm

    texts, labels = corpus(4)
    with pytest.raises(BcosKeywordError, match=r"^learning_rat: is neither an argument of fine_tune_classifier nor a "
                                               r"field of transformers' TrainingArguments.*Pass learning_rate= if"):
        fine_tune_classifier(_classifier(True), word_tokenizer(), texts, labels, max_length=16, learning_rat=1e-3,
                             **QUIET)
    with pytest.raises(BcosKeywordError, match=r"^callbacks: is neither an argument of pretrain_masked_lm .* build a "
                                               r"transformers Trainer yourself"):
        pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), word_tokenizer(), runs_of_words(4), max_length=12,
                           callbacks=[], **QUIET)
    model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.1, verbose=False)
    with pytest.raises(BcosKeywordError, match=r"^max_step: is neither an argument of train_causal_lm .*Pass "
                                               r"max_steps= if"):
        train_causal_lm(model, [{"input_ids": [5, 6, 7]}], str(tmp_path), pad_token_id=0, max_step=1)


def test_a_diverging_run_logs_its_loss_as_nan_not_as_zero():
    """transformers' logging_nan_inf_filter logs a NaN step loss as the average of the window's finite ones: a run
    that diverged at its second step logged losses [0.39, 0.0, 0.0, 0.0], a perfect fit, for a model whose every
    weight was NaN."""
    texts, labels = corpus(8)
    model = _classifier(True)
    trainer = fine_tune_classifier(model, word_tokenizer(), texts, labels, max_length=16, batch_size=4, logging_steps=1,
                                   learning_rate=1e38, max_steps=4, max_grad_norm=0, **QUIET)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert not all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isnan(losses[-1]) and math.isnan(trainer.state.log_history[-1]["train_loss"])


def test_the_training_helpers_refuse_a_model_with_a_nan_weight_before_training(tmp_path):
    """A NaN weight made every loss NaN, which the Trainer logged as 0.0, and every weight NaN after the first step,
    without a word."""
    from bcos_plugins.train_decoder import train_causal_lm

    texts, labels = corpus(4)
    classifier = _classifier(True)
    masked_lm = T.BertForMaskedLM(tiny_config("bert"))
    causal_lm = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.1, verbose=False)
    with torch.no_grad():
        classifier.bert.encoder.layer[0].output.dense.weight[0, 0] = float("nan")
        masked_lm.bert.embeddings.word_embeddings.weight[7, 0] = float("inf")
        causal_lm.transformer.h[1].mlp.c_fc.weight[0, 0] = float("nan")
    match = r"^model: has NaN or infinite values in 1 parameter\(s\) \({}\)"
    with pytest.raises(BcosValueError, match=match.format(r"bert\.encoder\.layer\.0\.output\.dense\.weight")):
        fine_tune_classifier(classifier, word_tokenizer(), texts, labels, max_length=16, **QUIET)
    with pytest.raises(BcosValueError, match=match.format(r"bert\.embeddings\.word_embeddings\.weight")):
        pretrain_masked_lm(masked_lm, word_tokenizer(), runs_of_words(4), max_length=12, **QUIET)
    with pytest.raises(BcosValueError, match=match.format(r"transformer\.h\.1\.mlp\.c_fc\.weight")):
        train_causal_lm(causal_lm, [{"input_ids": [5, 6, 7]}], str(tmp_path), pad_token_id=0, max_steps=1)


def test_cross_entropy_loss_refuses_ids_outside_the_logits_and_a_count_below_its_own_labels():
    """Ids outside the classes failed with torch's bare IndexError ("Target 3 is out of bounds"; a device-side assert
    on a GPU), and a count below the batch's own labelled positions (0, -1) scaled the loss up without a word."""
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(BcosValueError, match=r"^labels: must be ids in \[0, 3\) or -100 \(no loss\), got 0 to 3"):
        cross_entropy_loss(logits, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(BcosValueError, match=r"^labels: must be ids in \[0, 3\) or -100 \(no loss\), got -5 to 1"):
        cross_entropy_loss(logits, torch.tensor([0, 1, -5, 0]))
    for count in (0, -1, 2.0, float("inf"), True):
        with pytest.raises(BcosValueError, match=r"^num_items_in_batch: must be a count of the labelled positions over "
                                                 r"every accumulated batch, at least this batch's 4"):
            cross_entropy_loss(logits, labels, count)
    torch.testing.assert_close(cross_entropy_loss(logits, labels, 8), F.cross_entropy(logits, labels) / 2)


def test_the_demo_stops_when_the_reloaded_model_explains_differently(tmp_path):
    """`make demo` printed "(reloaded explanations identical: False)" and exited 0: its save/reload check could not
    fail the job."""
    from examples.demo_sst2 import require_identical_after_reload

    saved = torch.tensor([[0.5, -1.0, 2.0]])
    require_identical_after_reload(saved, saved.clone(), tmp_path)
    with pytest.raises(SystemExit, match=r"^demo: the model reloaded from .* explains differently from the one saved "
                                         r"\(largest difference 0\.001\)"):
        require_identical_after_reload(saved, saved + torch.tensor([[0.0, 0.0, 1e-3]]), tmp_path)


def test_distillation_refuses_a_teacher_whose_classes_are_in_another_order():
    """The distillation term pairs the teacher's logit i with the model's logit i: a teacher with id2label
    {0: 'pos', 1: 'neg'} for a model with {0: 'neg', 1: 'pos'} trained the student towards the other class."""
    texts, labels = corpus(4)
    model, teacher = _classifier(True), _classifier(False, seed=2)
    model.config.id2label, teacher.config.id2label = {0: "neg", 1: "pos"}, {0: "pos", 1: "neg"}
    with pytest.raises(BcosValueError, match=r"^teacher: names its classes \['pos', 'neg'\] \(config\.id2label\), the "
                                             r"model \['neg', 'pos'\]"):
        fine_tune_classifier(model, word_tokenizer(), texts, labels, max_length=16, teacher=teacher, **QUIET)
    # transformers' default names (LABEL_0, ...) name no class: a teacher with them is taken as it is
    teacher.config.id2label = {0: "LABEL_0", 1: "LABEL_1"}
    assert fine_tune_classifier(model, word_tokenizer(), texts, labels, max_length=16, teacher=teacher, max_steps=1,
                                **QUIET).state.global_step == 1


def test_train_causal_lm_refuses_a_padding_id_outside_the_vocabulary_before_training(tmp_path):
    """Padding is masked out of the loss but still embedded: pad_token_id=100 for a 60-token vocabulary failed inside
    the embedding at the first padded batch (IndexError: index out of range in self)."""
    from bcos_plugins.train_decoder import train_causal_lm

    model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.1, verbose=False)
    rows = [{"input_ids": [5, 6, 7]}, {"input_ids": [5, 6, 7, 8, 9]}]
    with pytest.raises(BcosValueError, match=r"^pad_token_id: is 100, outside the model's vocabulary \[0, 60\)"):
        train_causal_lm(model, rows, str(tmp_path), pad_token_id=100, max_steps=1, per_device_train_batch_size=2)


def test_a_b_stored_in_float32_loads_at_the_recorded_b_without_a_warning(tmp_path):
    """On MPS (no float64) every bcos_b buffer is float32: a model run at B = 1.1 saved 1.100000023841858, which
    loaded every layer at that B with a warning that the layers ran "at the B stored with them (1.1), not at
    config.bcos['b'] = 1.1". The float32 rounding of the recorded B is the recorded B."""
    import warnings

    from safetensors.torch import load_file, save_file

    from bcos_plugins import load_bcos_model
    from bcos_plugins.nn.linear import AlignmentPressure

    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval(), b=1.1, verbose=False)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v.float() if k.endswith(".bcos_b") else v for k, v in weights.items()},
              tmp_path / "model.safetensors", metadata={"format": "pt"})  # as a save on MPS writes them
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_bcos_model(tmp_path)
    assert {layer.b for layer in loaded.modules() if isinstance(layer, AlignmentPressure)} == {1.1}
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
