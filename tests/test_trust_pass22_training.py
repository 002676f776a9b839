"""Trust pass 22, training (a second look): evaluation during training, resumed and best-checkpoint runs under a B
warm-up, the training helpers' TrainingArguments and the recipes' flags, each pinned where it was silently wrong or
crashed unhelpfully."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as T
from conftest import tiny_config, write_seed_reports
from test_pretrain import QUIET, corpus, word_tokenizer

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn.linear import AlignmentPressure
from bcos_plugins.pretrain import fine_tune_task_then_bcos, pretrain_masked_lm
from bcos_plugins.train import BWarmupCallback
from bcos_plugins.train_decoder import train_causal_lm

QUIET_LM = {"disable_tqdm": True, "logging_steps": 100}


def _causal_lm(seed: int = 0) -> torch.nn.Module:
    """A tiny B-cos GPT-2 (B = 1.5) without dropout."""
    torch.manual_seed(seed)
    config = tiny_config("gpt2")
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    return bcosify(T.GPT2LMHeadModel(config), b=1.5, verbose=False)


def _rows(n: int = 7) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(5, 40, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()}
            for _ in range(n)]


class _RecordB(T.TrainerCallback):
    """The B of every B-cos layer during each optimiser step (read when the step ends)."""

    def __init__(self, model):
        self.model, self.b = model, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.b[state.global_step] = {m.b for m in self.model.modules() if isinstance(m, AlignmentPressure)}


def test_a_warmup_over_every_step_trains_and_evaluates_the_last_step_at_the_models_b(tmp_path):
    """With fraction=1 the ramp reached the model's B one step after training ended: the last step ran at 1.4167 (of
    1.5), the evaluation after it reported an eval_loss of that model, and on_train_end then set B = 1.5, so the model
    returned (and saved) evaluated 3.8689 where the last logged evaluation said 3.86674, without a word."""
    model, rows = _causal_lm(), _rows()
    recorder = _RecordB(model)
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, eval_dataset=rows, max_steps=6,
                              learning_rate=5e-3, per_device_train_batch_size=2, eval_strategy="steps", eval_steps=1,
                              callbacks=[BWarmupCallback(model, fraction=1.0), recorder], **QUIET_LM)
    assert recorder.b[1] == {1.0}
    assert recorder.b[6] == {1.5}  # the last step trains at the model's B
    assert all(next(iter(recorder.b[s])) < next(iter(recorder.b[s + 1])) for s in range(1, 6))  # still a ramp
    last_logged = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h][-1]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(last_logged, rel=1e-6, abs=0)


def test_load_best_model_at_end_is_refused_while_checkpoints_of_the_warmup_can_be_chosen(tmp_path):
    """The Trainer loads the best checkpoint before on_train_end, which set the model's B on it: a checkpoint chosen
    from the warm-up (evaluated at a smaller B) came back at B = 1.5, with logits its best_metric was not measured
    on, without a word. Refused before the first step; with eval_delay past the warm-up the run is the one asked."""
    model, rows = _causal_lm(), _rows()
    settings = {"max_steps": 6, "per_device_train_batch_size": 2, "eval_strategy": "steps", "eval_steps": 1,
                "save_strategy": "steps", "save_steps": 1, "load_best_model_at_end": True,
                "metric_for_best_model": "eval_loss", "save_only_model": True, **QUIET_LM}
    with pytest.raises(BcosValueError, match=r"^load_best_model_at_end: is True with a B warm-up to step 4: .* "
                                             r"evaluate only after the warm-up \(eval_strategy='steps', "
                                             r"eval_delay=4\), or leave load_best_model_at_end out\.$"):
        train_causal_lm(model, rows, str(tmp_path / "a"), pad_token_id=0, eval_dataset=rows,
                        callbacks=[BWarmupCallback(model, fraction=0.5)], **settings)
    assert {m.b for m in model.modules() if isinstance(m, AlignmentPressure)} == {1.5}
    trainer = train_causal_lm(model, rows, str(tmp_path / "b"), pad_token_id=0, eval_dataset=rows, eval_delay=4,
                              callbacks=[BWarmupCallback(model, fraction=0.5)], **settings)
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [4, 5, 6]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(trainer.state.best_metric, rel=1e-6, abs=0)


def test_the_recipes_flags_are_checked_by_the_packages_one_bool_check():
    """pretrain_masked_lm's bcos_query_key takes None too, but its hand-written check said "must be True or False";
    fine_tune_task_then_bcos's distill_from_task_stage named no type. Both are _checks.require_bool's refusal now."""
    texts, labels = corpus(8)
    with pytest.raises(BcosTypeError, match=r"^bcos_query_key: must be True, False or None, got str 'no'\. Pass True "
                                            r"\(B-cos query/key layers\), False \(keep the pretrained query/key maps\) "
                                            r"or None \(True for a stock model, a B-cos model's own setting\)\.$"):
        pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), word_tokenizer(), texts, bcos_query_key="no",
                           **QUIET)
    stock = T.BertForSequenceClassification(tiny_config("bert", num_labels=2))
    with pytest.raises(BcosTypeError, match=r"^distill_from_task_stage: must be True, False or None, got str 'yes'\. "
                                            r"Pass True to distil the B-cos stage from the task-stage model, False "
                                            r"not to, or leave it out \(the preset's choice\)\.$"):
        fine_tune_task_then_bcos(stock, word_tokenizer(), texts, labels, distill_from_task_stage="yes", **QUIET)
    with pytest.raises(BcosTypeError, match=r"^bcos_query_key: must be True or False, got NoneType None\. Pass True "
                                            r"\(B-cos query/key layers\) or False"):
        fine_tune_task_then_bcos(stock, word_tokenizer(), texts, labels, bcos_query_key=None, **QUIET)


def test_the_frontier_and_paired_reports_stop_on_an_input_error_and_show_only_no_spread_as_no_interval(tmp_path):
    """bench_frontier._accuracy_columns and paired_report caught every BcosValueError of paired_accuracy_difference
    as its "no spread over seeds" refusal: a label of -1 (an unlabelled split) showed as "–" / "no interval" and the
    run went on. Only NoSpreadError is caught now; the refusal of the input stops the run."""
    from bcos_plugins.metrics.paired import NoSpreadError, paired_accuracy_difference
    from benchmarks import bench_frontier
    from benchmarks.common.paired_report import paired_report

    base = {0: [0, 1, 0, 0], 1: [0, 0, 1, 0]}
    other = {0: [0, 1, 1, 0], 1: [0, 1, 1, 0]}  # +0.25 on both seeds: no spread
    with pytest.raises(NoSpreadError, match=r"^predictions_b: differ from predictions_a by \+0\.25 on each of the 2"):
        paired_accuracy_difference([base[0], base[1]], [other[0], other[1]], [0, 1, 1, 0])
    with pytest.raises(NoSpreadError, match=r"^predictions_a: hold one seed on one example"):
        paired_accuracy_difference([1], [1], [1])
    for labels in ([0, 1, 1, 0], [0, 1, -1, 0]):
        pairs = [({"predictions": base[s], "labels": labels}, {"predictions": other[s]}) for s in (0, 1)]
        files = write_seed_reports(tmp_path, labels, {"stock-vanilla": base, "stock-supervised": other})
        if labels[2] == 1:  # no spread over seeds: the accuracy without an interval, as before
            assert bench_frontier._interval(bench_frontier._accuracy_columns(pairs, "sst2"), "sst2_accuracy") == "–"
            assert "no spread" in paired_report(files, "stock-vanilla", 0.01)["default/stock-supervised"]["no_interval"]
            continue
        with pytest.raises(BcosValueError, match=r"^labels: holds -1 at examples \[2\], not a class id") as refused:
            bench_frontier._accuracy_columns(pairs, "sst2")
        assert not isinstance(refused.value, NoSpreadError)
        with pytest.raises(BcosValueError, match=r"^labels: holds -1 at examples \[2\], not a class id"):
            paired_report(files, "stock-vanilla", 0.01)


def _bcos_classifier(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return bcosify(T.BertForSequenceClassification(config).eval(), b=1.5, verbose=False)


@pytest.mark.parametrize("setting", [{"eval_strategy": "steps", "eval_steps": 1}, {"eval_strategy": "epoch"},
                                     {"eval_on_start": True}])
def test_an_evaluation_schedule_is_refused_by_the_helpers_that_take_no_evaluation_data(setting):
    """fine_tune_classifier and pretrain_masked_lm take no evaluation data: the Trainer refused eval_strategy telling to
    "pass an eval_dataset" (which they do not take), and eval_on_start failed with "evaluation requires an
    eval_dataset"."""
    from bcos_plugins.train import fine_tune_classifier

    key = next(iter(setting)) if "eval_on_start" in setting else "eval_strategy"
    texts, labels = corpus(8)
    pattern = (rf"^{key}: is {setting[key]!r}, but {{}} takes no evaluation data\. leave {key} out and evaluate the "
               r"model it returns \(for a classifier bcos_plugins\.train\.accuracy\), or build a transformers Trainer "
               r"with an eval_dataset\.$")
    with pytest.raises(BcosValueError, match=pattern.format("fine_tune_classifier")):
        fine_tune_classifier(_bcos_classifier(), word_tokenizer(), texts, labels, max_steps=1, **setting, **QUIET)
    with pytest.raises(BcosValueError, match=pattern.format("pretrain_masked_lm")):
        pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), word_tokenizer(), texts, max_steps=1, **setting,
                           **QUIET)


def test_dataloader_drop_last_with_fewer_texts_than_a_batch_is_refused_by_name():
    """Every row dropped: the Trainer failed with "args.max_steps must be set to a positive value if dataloader does not
    have a length, was -1"."""
    from bcos_plugins.train import fine_tune_classifier

    texts, labels = corpus(3)
    with pytest.raises(BcosValueError, match=r"^dataloader_drop_last: is True with 3 text\(s\) and batches of 4 on "
                                             r"each of 1 process\(es\): every text would be dropped"):
        fine_tune_classifier(_bcos_classifier(), word_tokenizer(), texts, labels, batch_size=4,
                             dataloader_drop_last=True, **QUIET)
    trainer = fine_tune_classifier(_bcos_classifier(), word_tokenizer(), texts, labels, batch_size=2,
                                   dataloader_drop_last=True, **QUIET)
    assert trainer.state.global_step == 1  # the one full batch


def test_the_training_helpers_refuse_a_model_without_a_trainable_parameter_before_training(tmp_path):
    """All parameters frozen: the first backward pass failed with torch's "element 0 of tensors does not require grad
    and does not have a grad_fn", naming neither the model nor the fix."""
    from bcos_plugins.train import fine_tune_classifier

    pattern = r"^model: has no trainable parameters \(all have requires_grad=False\)\. unfreeze the parameters to train"
    texts, labels = corpus(4)
    classifier, masked_lm, causal_lm = _bcos_classifier(), T.BertForMaskedLM(tiny_config("bert")), _causal_lm()
    for model in (classifier, masked_lm, causal_lm):
        model.requires_grad_(False)
    with pytest.raises(BcosValueError, match=pattern):
        fine_tune_classifier(classifier, word_tokenizer(), texts, labels, **QUIET)
    with pytest.raises(BcosValueError, match=pattern):
        pretrain_masked_lm(masked_lm, word_tokenizer(), texts, **QUIET)
    with pytest.raises(BcosValueError, match=pattern):
        train_causal_lm(causal_lm, _rows(), str(tmp_path), pad_token_id=0, **QUIET_LM)


def test_train_causal_lm_refuses_rows_without_a_labelled_token_before_training(tmp_path):
    """A prompt whose answer max_length cut off (labels all -100) was silently unused among other rows, and alone in a
    batch failed mid-training (or mid-evaluation) with the collator's NaN-loss refusal, naming no row."""
    rows = _rows(4)
    prompted = [{"input_ids": r["input_ids"], "labels": [-100] * (len(r["input_ids"]) - 1) + r["input_ids"][-1:]}
                for r in rows]
    unlabelled = [*prompted[:3], {"input_ids": rows[3]["input_ids"], "labels": [-100] * len(rows[3]["input_ids"])}]
    with pytest.raises(BcosValueError, match=r"^train_dataset: 1 example\(s\) have no labelled token after a real one "
                                             r"\(labels all -100 there\), so they have no loss to train or evaluate "
                                             r"on \(features \[3\]\)\. Drop them, or label their answer tokens"):
        train_causal_lm(_causal_lm(), unlabelled, str(tmp_path), pad_token_id=0, per_device_train_batch_size=4,
                        **QUIET_LM)
    cut = [{"input_ids": list(range(5, 15)), "labels": [-100] * 6 + list(range(11, 15))}] * 2
    with pytest.raises(BcosValueError, match=r"^train_dataset: 2 example\(s\) have no labelled token after a real one "
                                             r"once cut to max_length=6 .* \(features \[0, 1\]\)"):
        train_causal_lm(_causal_lm(), cut, str(tmp_path), pad_token_id=0, max_length=6, **QUIET_LM)
    with pytest.raises(BcosValueError, match=r"^eval_dataset: 1 example\(s\) have no labelled token after a real one"):
        train_causal_lm(_causal_lm(), prompted, str(tmp_path), pad_token_id=0, eval_dataset=unlabelled, **QUIET_LM)
    # a row whose one labelled token is its last trains (the rule is the collator's: one labelled next token suffices)
    assert train_causal_lm(_causal_lm(), prompted, str(tmp_path), pad_token_id=0, per_device_train_batch_size=4,
                           **QUIET_LM).state.global_step == 3


def test_train_causal_lm_checks_and_evaluates_a_dict_of_evaluation_sets(tmp_path):
    """The Trainer takes a dict of evaluation sets (metrics prefixed with each key); train_causal_lm's row check
    indexed it as one dataset and failed with KeyError: 0. Each set's eval loss is the token-weighted one."""
    rows = _rows()
    with pytest.raises(BcosValueError, match=r"^eval_dataset\['short'\]: 1 example\(s\) have fewer than 2 real tokens"):
        train_causal_lm(_causal_lm(), rows, str(tmp_path), pad_token_id=0,
                        eval_dataset={"all": rows, "short": [{"input_ids": [7]}]}, **QUIET_LM)
    model = _causal_lm()
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, eval_dataset={"all": rows, "few": rows[:3]},
                              max_steps=1, learning_rate=0.0, per_device_eval_batch_size=2, **QUIET_LM)
    metrics = trainer.evaluate()
    with torch.no_grad():
        for key, part in (("all", rows), ("few", rows[:3])):
            summed = count = 0
            for row in part:
                ids = torch.tensor([row["input_ids"]])
                summed += float(torch.nn.functional.cross_entropy(model(ids).logits[0, :-1].double(), ids[0, 1:],
                                                                  reduction="sum"))
                count += ids.shape[1] - 1
            assert metrics[f"eval_{key}_loss"] == pytest.approx(summed / count, rel=1e-6, abs=0)


def test_resume_from_checkpoint_true_without_an_output_dir_is_refused_by_name():
    """Without output_dir the helpers train in a new temporary folder, whose last checkpoint cannot exist: transformers
    said "No valid checkpoint found in output directory (/tmp/bcos_finetune_...)", a folder the caller never chose."""
    from bcos_plugins.train import fine_tune_classifier

    texts, labels = corpus(4)
    pattern = (r"^resume_from_checkpoint: is True, which resumes from the last checkpoint in output_dir, but no "
               r"output_dir was given")
    with pytest.raises(BcosValueError, match=pattern):
        fine_tune_classifier(_bcos_classifier(), word_tokenizer(), texts, labels, resume_from_checkpoint=True, **QUIET)
    with pytest.raises(BcosValueError, match=pattern):
        pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), word_tokenizer(), texts,
                           resume_from_checkpoint=True, **QUIET)


def test_bcos_loss_refuses_a_count_below_its_own_rows_as_the_cross_entropy_does():
    """num_items_in_batch counts the rows of every accumulated batch, this one among them: 2 for a batch of 4 rows
    passed bcos_loss's ">= 1" and doubled the loss (and the gradients) without a word; cross_entropy_loss refused it."""
    from bcos_plugins.losses import bcos_loss

    torch.manual_seed(0)
    logits, labels = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 2, 1, 2])
    with pytest.raises(BcosValueError, match=r"^num_items_in_batch: is 2, below this batch's 4 rows: it counts the "
                                             r"rows of every accumulated batch, this one among them\. pass the number "
                                             r"of rows over all accumulated batches, or None\.$"):
        bcos_loss(logits, labels, 2)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.eye(3, dtype=torch.float64)[labels],
                                                                    reduction="none").mean(-1).sum()
    torch.testing.assert_close(bcos_loss(logits, labels, 4), expected / 4, rtol=1e-15, atol=0)
    torch.testing.assert_close(bcos_loss(logits, labels, torch.tensor(8)), expected / 8, rtol=1e-15, atol=0)


def test_evaluating_a_distilling_trainer_on_rows_without_teacher_logits_is_refused_by_name():
    """fine_tune_classifier(teacher=...) returns a trainer whose collator and loss read each row's teacher logits:
    trainer.evaluate(eval_dataset=...) failed with KeyError: 'teacher_logits'. Refused naming the fix; with the
    teacher's logits given, the evaluation runs."""
    from bcos_plugins.encoded_texts import EncodedTexts
    from bcos_plugins.train import fine_tune_classifier, predict

    texts, labels = corpus(6)
    teacher = T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval()
    trainer = fine_tune_classifier(_bcos_classifier(), word_tokenizer(), texts, labels, batch_size=3, max_steps=1,
                                   max_length=16, teacher=teacher, **QUIET)
    rows = EncodedTexts(word_tokenizer(), texts[:4], labels[:4], 16)
    with pytest.raises(BcosValueError, match=r"^eval_dataset / test_dataset: has rows without 'teacher_logits' \(rows "
                                             r"\[0, 1, 2, 3\] of the batch\): .* evaluate the trained model with "
                                             r"bcos_plugins\.train\.accuracy / predict, or give each row"):
        trainer.evaluate(eval_dataset=rows)
    rows.teacher_logits = predict(teacher, word_tokenizer(), texts[:4], max_length=16).tolist()
    assert math.isfinite(trainer.evaluate(eval_dataset=rows)["eval_loss"])


def test_a_teacher_with_a_nan_weight_is_refused_naming_the_teacher():
    """The teacher's NaN weight surfaced as predict's "the model's logits are NaN", which read as the model being
    trained; refused before training, naming the teacher and its parameter."""
    from bcos_plugins.train import fine_tune_classifier

    texts, labels = corpus(4)
    teacher = T.BertForSequenceClassification(tiny_config("bert", num_labels=2)).eval()
    with torch.no_grad():
        teacher.classifier.weight[0, 0] = float("nan")
    with pytest.raises(BcosValueError, match=r"^teacher: has NaN or infinite values in 1 parameter\(s\) "
                                             r"\(classifier\.weight\)"):
        fine_tune_classifier(_bcos_classifier(), word_tokenizer(), texts, labels, max_length=16, teacher=teacher,
                             **QUIET)
