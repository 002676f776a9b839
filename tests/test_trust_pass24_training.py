"""Trust pass 24, training and the papers' methods: what compares evaluations during a B warm-up, and the cases
the earlier passes did not reach; each pinned where it was silently wrong or crashed unhelpfully."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from test_trust_pass22_training import QUIET_LM, _causal_lm, _rows

from bcos_plugins.errors import BcosValueError
from bcos_plugins.nn.linear import AlignmentPressure
from bcos_plugins.train import BWarmupCallback
from bcos_plugins.train_decoder import train_causal_lm


@pytest.mark.parametrize("reader", ["early_stopping", "plateau"])
def test_what_compares_evaluations_is_refused_while_they_run_at_a_rising_b(reader, tmp_path):
    """EarlyStoppingCallback no longer needs load_best_model_at_end (transformers 5 warns only), and
    reduce_lr_on_plateau steps on metric_for_best_model: both compared evaluations run at a rising B during the warm-up
    and read a loss that grows with B (4.124, 4.126, 4.128 at B 1.0, 1.05, 1.09 with a rate of 1e-6) as no progress.
    Early stopping ended a 12-step run after step 3, B still 1.09 of 1.5 (the model then set to 1.5), and the plateau
    schedule cut the rate from 1e-6 to 1e-8 within the warm-up, both without a word. Refused before the first step;
    with eval_delay past the warm-up the run is the one asked."""
    model, rows = _causal_lm(), _rows()
    if reader == "early_stopping":
        settings, callbacks = {"metric_for_best_model": "eval_loss"}, [T.EarlyStoppingCallback(early_stopping_patience=2)]
    else:
        settings, callbacks = {"lr_scheduler_type": "reduce_lr_on_plateau", "lr_scheduler_kwargs": {"patience": 1}}, []
    settings.update(max_steps=8, learning_rate=1e-6, per_device_train_batch_size=2, eval_strategy="steps",
                    eval_steps=1, **QUIET_LM)
    with pytest.raises(BcosValueError, match=r"^metric_for_best_model: is '(eval_)?loss' with evaluations during a B "
                                             r"warm-up to step 8: .* evaluate only after the warm-up \(eval_strategy="
                                             r"'steps', eval_delay=8\), or leave metric_for_best_model out"):
        train_causal_lm(model, rows, str(tmp_path / "a"), pad_token_id=0, eval_dataset=rows,
                        callbacks=[BWarmupCallback(model, fraction=1.0), *callbacks], **settings)
    assert {m.b for m in model.modules() if isinstance(m, AlignmentPressure)} == {1.5}
    trainer = train_causal_lm(model, rows, str(tmp_path / "b"), pad_token_id=0, eval_dataset=rows, eval_delay=8,
                              callbacks=[BWarmupCallback(model, fraction=1.0), *callbacks], **settings)
    assert trainer.state.global_step == 8
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [8]


def _swish_beta_run(tmp_path, **settings):
    """A tiny SiLU Llama trained 8 steps under SwishBetaToBilinear (annealing over 4), evaluated at every step at a
    learning rate so small that the evaluations measure the gate's beta, not the training."""
    from bcos_plugins.bilinear import SwishBetaToBilinear

    torch.manual_seed(0)
    llama = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2))
    ids = torch.randint(60, (8, 12), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": row, "labels": row} for row in ids]
    args = T.TrainingArguments(str(tmp_path), max_steps=8, per_device_train_batch_size=4, learning_rate=1e-7,
                               eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1,
                               load_best_model_at_end=True, save_only_model=True, report_to="none", use_cpu=True,
                               disable_tqdm=True, logging_steps=100, **settings)
    trainer = T.Trainer(model=llama, args=args, train_dataset=rows, eval_dataset=rows,
                        callbacks=[SwishBetaToBilinear(anneal_fraction=0.5)])
    trainer.train()
    return trainer


def test_a_best_checkpoint_of_the_swish_beta_annealing_is_refused_as_the_b_warmups_is(tmp_path):
    """The Trainer loads the best checkpoint before SwishBetaToBilinear's on_train_end finalises the model at beta = 0:
    with evaluations during the annealing the best was checkpoint-1 (eval_loss 4.105830, SiLU gates), and the model
    returned, its weights made bilinear, evaluated 4.105855, another function than its metric measured, without a word.
    Refused before the first step, as the B warm-up refuses it; with eval_delay past the annealing the best checkpoint's
    metric is the returned model's."""
    with pytest.raises(BcosValueError, match=r"^load_best_model_at_end: is True with a Swish_beta annealing to step 5: "
                                             r".* evaluate only after the annealing \(eval_strategy='steps', "
                                             r"eval_delay=5\), or leave load_best_model_at_end out\.$"):
        _swish_beta_run(tmp_path / "a")
    trainer = _swish_beta_run(tmp_path / "b", eval_delay=5)
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [5, 6, 7, 8]
    assert trainer.model.config.hidden_act == "linear"
    assert trainer.evaluate()["eval_loss"] == pytest.approx(trainer.state.best_metric, rel=1e-7, abs=0)


def test_adversarial_masks_name_their_own_arguments_when_the_kept_eigenvectors_cannot_be_separated():
    """One set of masks separates every kept eigenvector from every other, across the directions: too many for d_in,
    or dependent ones (the same direction twice), were refused naming ``vectors``, an argument of pseudo_inverse_masks
    that adversarial_masks does not take, with a fix about eigenvectors per direction also where one per direction was
    asked. The refusals now name per_direction or eig, and the fix that applies."""
    from bcos_plugins.bilinear import BilinearMLP, adversarial_masks, bilinear_weights, eigendecompose

    torch.manual_seed(0)
    weights = bilinear_weights(BilinearMLP(6, 8, 3, bias=True)).augmented()  # d_in = 7 with the constant input
    with pytest.raises(BcosValueError, match=r"^per_direction: is 3 for 3 direction\(s\): 9 masks, .* cannot be "
                                             r"separated in d_in=7 dimensions\. Pass per_direction <= 2\.$"):
        adversarial_masks(eigendecompose(weights, torch.eye(3)), 3)
    with pytest.raises(BcosValueError, match=r"^eig: holds 8 directions: 8 masks, .* Decompose at most 7 directions "
                                             r"\(the rows of u in eigendecompose\(layer, u\)\)\.$"):
        adversarial_masks(eigendecompose(weights, torch.randn(8, 3)), 1)
    with pytest.raises(BcosValueError, match=r"^eig: the 6 kept eigenvectors of its 6 direction\(s\) are linearly "
                                             r"dependent \(two directions share an eigenvector: the same direction "
                                             r"twice"):
        adversarial_masks(eigendecompose(weights, torch.cat([torch.eye(3), torch.eye(3)])), 1)
    masks = adversarial_masks(eigendecompose(weights, torch.eye(3)), 2)  # 6 keys in 7 dimensions: each keys its own
    keys = masks.masks.reshape(6, 7) @ masks.eigenvectors.reshape(6, 7).T
    torch.testing.assert_close(keys, torch.eye(6), atol=1e-5, rtol=0)


def test_predict_labels_truncates_to_the_models_position_limit_or_refuses_a_longer_max_length():
    """predict_labels (and zero_shot_evaluation through it) truncated to 128 tokens whatever the model's position
    table, so a longer text failed inside the embedding of a 40-position BERT ("RuntimeError: index 40 is out of
    bounds for dimension 1 with size 40"). It now follows the training and prediction helpers' one rule
    (encoded_texts.truncation_length): 128 capped at the limit by default, a longer max_length refused by name."""
    from conftest import tiny_config
    from test_pretrain import corpus, word_tokenizer

    from bcos_plugins import bcosify
    from bcos_plugins.space import predict_labels, zero_shot_evaluation
    from bcos_plugins.train import predict

    tok = word_tokenizer()
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False).eval()
    texts = [" ".join([text] * 40) for text in corpus(3)[0]]  # 200+ tokens each, past the 40 positions
    with pytest.warns(UserWarning, match=r"^predict: 3 text\(s\) \[0, 1, 2\] have more than max_length=40"):
        expected = predict(model, tok, texts, max_length=40).argmax(-1).tolist()
    # each warns of the texts it cut, naming the call the user made (since beefb24)
    with pytest.warns(UserWarning, match=r"^predict_labels: 3 text\(s\) \[0, 1, 2\] have more than max_length=40"):
        assert predict_labels(model, tok, texts) == expected
    with pytest.warns(UserWarning, match=r"^zero_shot_evaluation: 3 text\(s\) \[0, 1, 2\] have more than max_length=40"):
        assert zero_shot_evaluation(model, tok, texts, expected)["accuracy"] == 1.0
    with pytest.raises(BcosValueError, match=r"^max_length: .*40"):
        predict_labels(model, tok, texts, max_length=128)


def test_a_causal_lm_feature_with_its_own_position_ids_is_refused_not_replaced(tmp_path):
    """CausalLMCollator writes the batch's position_ids itself (real tokens counted from 0): a feature's own (two
    packed documents, [0, 1, 2, 0, 1, 2]) came back as [0, 1, 2, 3, 4, 5] and were trained on without a word.
    Refused by the collator and, before any step, by train_causal_lm."""
    from bcos_plugins.train_decoder import CausalLMCollator

    packed = {"input_ids": [5, 6, 7, 8, 9, 10], "position_ids": [0, 1, 2, 0, 1, 2]}
    message = r"^features: feature 1 has its own 'position_ids', which CausalLMCollator would replace by its own"
    with pytest.raises(BcosValueError, match=message):
        CausalLMCollator(0)([{"input_ids": [5, 6, 7]}, packed])
    model, rows = _causal_lm(), _rows(3)
    with pytest.raises(BcosValueError, match=message):
        train_causal_lm(model, [rows[0], packed, rows[2]], str(tmp_path), pad_token_id=0, max_steps=1, **QUIET_LM)
    batch = CausalLMCollator(0)([{"input_ids": [5, 6, 7], "text": "kept out"}])  # other keys are still left out
    assert sorted(batch) == ["attention_mask", "input_ids", "labels", "position_ids"]


def test_an_evaluation_schedule_whose_first_evaluation_follows_the_warmup_is_not_refused(tmp_path):
    """The refusal read only eval_delay: evaluating every 4 steps of an 8-step run whose warm-up ends at the beginning
    of step 3 (no evaluation during it) was refused, early stopping and best checkpoints included. The first
    evaluation is now the first multiple of eval_steps from eval_delay on; every 2 steps (step 2, B still 1.25) is
    still refused."""
    model, rows = _causal_lm(), _rows()
    settings = {"max_steps": 8, "learning_rate": 1e-6, "per_device_train_batch_size": 2, "eval_strategy": "steps",
                "metric_for_best_model": "eval_loss", **QUIET_LM}
    with pytest.raises(BcosValueError, match=r"^metric_for_best_model: is 'eval_loss' with evaluations during a B "
                                             r"warm-up to step 3: "):
        train_causal_lm(model, rows, str(tmp_path / "a"), pad_token_id=0, eval_dataset=rows, eval_steps=2,
                        callbacks=[BWarmupCallback(model, fraction=0.25), T.EarlyStoppingCallback(2)], **settings)
    trainer = train_causal_lm(model, rows, str(tmp_path / "b"), pad_token_id=0, eval_dataset=rows, eval_steps=4,
                              callbacks=[BWarmupCallback(model, fraction=0.25), T.EarlyStoppingCallback(2)], **settings)
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [4, 8]


@pytest.mark.parametrize("helper", ["fine_tune_classifier", "pretrain_masked_lm"])
def test_best_only_saving_is_refused_by_the_helpers_that_take_no_evaluation_data(helper, tmp_path):
    """save_strategy="best" saves a checkpoint when an evaluation improves the best metric: fine_tune_classifier and
    pretrain_masked_lm take no evaluation data, so the run saved none, without a word (an empty output_dir where
    checkpoints were asked for). Refused by name, as eval_strategy is."""
    from conftest import tiny_config
    from test_pretrain import QUIET, corpus, word_tokenizer

    from bcos_plugins import bcosify
    from bcos_plugins.pretrain import pretrain_masked_lm
    from bcos_plugins.train import fine_tune_classifier

    texts, labels = corpus(8)
    settings = {"batch_size": 4, "max_steps": 2, "output_dir": str(tmp_path), "save_strategy": "best",
                "metric_for_best_model": "loss", **QUIET}
    with pytest.raises(BcosValueError, match=rf"^save_strategy: is 'best', but {helper} takes no evaluation data\. "):
        if helper == "fine_tune_classifier":
            torch.manual_seed(0)
            model = bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False)
            fine_tune_classifier(model, word_tokenizer(), texts, labels, **settings)
        else:
            pretrain_masked_lm(T.BertForMaskedLM(tiny_config("bert")), word_tokenizer(), texts, b=1.25, **settings)
    assert not any(tmp_path.iterdir())


def test_attention_supervision_without_a_gradient_behind_the_attentions_is_warned_of():
    """transformers 5 records attentions with hooks, and under reentrant gradient checkpointing
    (gradient_checkpointing_kwargs={"use_reentrant": True}) it records them in the forward run without autograd: the
    supervision term (weight 5) then added nothing to the gradient, the task loss's alone bit for bit, without a word.
    A warning names the cause and the fix (a value computed by hand from plain tensors is the same number, so not a
    refusal); the default non-reentrant checkpointing trains the term, as without checkpointing."""
    import warnings

    from conftest import tiny_config
    from test_pretrain import corpus, word_tokenizer

    from bcos_plugins.guided import attention_supervision_loss

    tok = word_tokenizer()
    texts, labels = corpus(6)
    batch = dict(tok(texts, padding=True, return_tensors="pt"))
    gold = (torch.rand(batch["input_ids"].shape, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    gold = gold * batch["attention_mask"]
    torch.manual_seed(0)
    config = tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = T.BertForSequenceClassification._from_config(config, attn_implementation="eager").train()

    def gradients(checkpointing, weight):
        if checkpointing is None:
            model.activation_checkpointing_disable()
        else:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": checkpointing})
        model.zero_grad()
        out = model(**batch, labels=torch.tensor(labels), output_attentions=True)
        supervision = attention_supervision_loss(out.attentions, gold, batch["attention_mask"], layers=[-2, -1],
                                                 weight=weight)
        (out.loss + supervision).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    task_only = gradients(None, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither without checkpointing nor with the default non-reentrant one
        supervised = gradients(None, 5.0)
        assert torch.equal(gradients(False, 5.0), supervised)
    assert not torch.equal(supervised, task_only)
    with pytest.warns(UserWarning, match=r"^attention_supervision_loss: the attentions carry no gradient .* reentrant "
                                         r"gradient checkpointing .*use_reentrant': False"):
        reentrant = gradients(True, 5.0)
    assert torch.equal(reentrant, task_only)  # what the warning is about: the term trained nothing
