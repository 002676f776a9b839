"""Trust pass 21, methods leftovers (helper-122): the Space model's output, masked_mean, the e-SNLI example's plateau
watch, SwishBetaToBilinear's schedule and gold_mask_from_words.

Each test pins one fix: before it, the case gave a silently wrong (or missing) answer or a misleading refusal.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from conftest import tiny_config

from bcos_plugins.errors import BcosValueError, TruncatedRationaleWarning

# ---------------------------------------------------------------- 1. SpaceModelOutput keeps what the caller asked for


def _space_model(attn_implementation: str):
    from bcos_plugins.space import SpaceModelForSequenceClassification

    torch.manual_seed(0)
    encoder = T.AutoModel.from_config(tiny_config("bert"), attn_implementation=attn_implementation).eval()
    return SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2, n_latent=3).eval()


def test_space_model_returns_the_encoders_hidden_states_and_attentions_when_asked():
    # output_hidden_states=True / output_attentions=True reached the encoder, whose answer was dropped: the output
    # had no field for them, so out.hidden_states failed and out.get("attentions") was silently None
    model = _space_model("eager")
    ids = torch.randint(5, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 6, dtype=torch.long)  # no padding: the model gives a padded row its own position ids
    out = model(ids, mask, output_hidden_states=True, output_attentions=True)
    reference = model.encoder(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2  # embeddings + 2 layers; 2 layers
    for got, expected in zip(out.hidden_states + out.attentions, reference.hidden_states + reference.attentions,
                             strict=True):
        assert torch.equal(got, expected)
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    # the fields come last: to_tuple() keeps the others' places
    assert torch.equal(out.to_tuple()[0], out.logits) and torch.equal(out.to_tuple()[2], out.last_hidden_state)
    plain = model(ids, mask)
    assert plain.hidden_states is None and plain.attentions is None
    # asked for by the model's config (the encoder's own config did not see it: nothing came back)
    model.config.output_hidden_states = True
    assert len(model(ids, mask).hidden_states) == 3


def test_space_model_refuses_attentions_its_encoder_does_not_return_by_name():
    # sdpa attention returns no weights (transformers logs a line and gives an empty tuple)
    model = _space_model("sdpa")
    ids = torch.randint(5, 50, (1, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(BcosValueError, match=r"^output_attentions: asks for the encoder's attentions, but BertModel "
                                             r"returned none\. Load the encoder with attn_implementation='eager'"):
        model(ids, output_attentions=True)


# ---------------------------------------------------------------- 2. guided_esnli feeds the watch once per step


@pytest.fixture(scope="module")
def guided_esnli():
    from examples import guided_esnli

    return guided_esnli


def _tiny_classifier():
    torch.manual_seed(0)
    return T.BertForSequenceClassification(T.BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1,
                                                        num_attention_heads=2, intermediate_size=16, num_labels=2))


def _rows(n: int = 16) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (n, 5), generator=generator)
    return [{"input_ids": row, "attention_mask": torch.ones(5, dtype=torch.long), "labels": torch.tensor(i % 2)}
            for i, row in enumerate(ids)]


def test_guided_esnli_feeds_the_plateau_watch_once_per_optimiser_step_under_accumulation(guided_esnli, tmp_path):
    # Under gradient accumulation compute_loss runs once per micro-batch: the watch was fed each micro-batch (its
    # running mean moved twice per step) and stopped the attempt at the check step's first micro-batch, so training
    # stopped before that step's update (global_step 1, not 2)
    from bcos_plugins.guided import PlateauRestart, PlateauWatch

    class RecordingWatch(PlateauWatch):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fed = []

        def update(self, step, task_loss):
            self.fed.append((step, task_loss))
            return super().update(step, task_loss)

    class Rule(PlateauRestart):
        def watch(self, restart, total_steps):
            return RecordingWatch(self.threshold, self.smoothing, self.check_step(total_steps),
                                  final=restart == self.max_restarts)

    class Spy(guided_esnli.PlateauWatchedTrainer):
        micro: list = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
            if model.training:
                self.micro.append((self.state.global_step, loss.item()))
            return (loss, outputs) if return_outputs else loss

    args = T.TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2,
                               gradient_accumulation_steps=2, learning_rate=1e-3, report_to=[], save_strategy="no",
                               use_cpu=True, logging_steps=100, disable_tqdm=True)
    # a threshold no loss reaches: the attempt stays on the plateau and is stopped at its check step, 2 of 4 steps
    rule = Rule(1e-9, check_fraction=0.5, max_restarts=1)
    trainer = Spy(model=_tiny_classifier(), args=args, train_dataset=_rows(), restart_rule=rule, restart=0)
    trainer.train()
    watch = trainer.plateau_watch
    assert [step for step, _ in watch.fed] == [0, 1]
    for step, fed in watch.fed:  # the mean of the step's micro-batches (equal rows)
        micro = [loss for s, loss in Spy.micro if s == step]
        assert len(micro) == 2 and fed == pytest.approx(sum(micro) / 2, rel=1e-12)
    assert watch.stopped_at == 1 and trainer.state.global_step == 2  # the check step's update was made


def test_guided_esnli_refuses_a_loss_function_with_the_restart_rule_under_accumulation(guided_esnli, tmp_path):
    # bcos_loss divides by the step's num_items_in_batch: each micro-batch's loss is a share of the step's, which
    # the watch would have read as a task loss k times smaller (a plateau left at once)
    from bcos_plugins.guided import PlateauRestart
    from bcos_plugins.train import bcos_loss

    args = T.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                               gradient_accumulation_steps=2, report_to=[], save_strategy="no", use_cpu=True)
    with pytest.raises(ValueError, match="^restart_rule: with gradient accumulation the watch needs"):
        guided_esnli.PlateauWatchedTrainer(model=_tiny_classifier(), args=args, train_dataset=_rows(),
                                           compute_loss_func=bcos_loss, restart_rule=PlateauRestart(0.5))


# ---------------------------------------------------------------- 3. masked_mean: padding never enters


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_masked_mean_ignores_nan_and_inf_at_padding(bad):
    # weights of 0 times a NaN or inf at a padding position gave NaN: the whole row's mean was NaN
    from bcos_plugins.space import SpaceHead, masked_mean

    torch.manual_seed(0)
    values = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    padded = values.clone()
    padded[1, 2:] = bad
    got = masked_mean(padded, mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[1], values[1, :2].mean(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(got[0], values[0].mean(0), rtol=0, atol=1e-6)
    # the head's bias-free logits read the concepts through it (its forward refuses non-finite hidden states)
    head = SpaceHead(d_model=5, n_spaces=2, n_latent=2)
    concepts = torch.rand(2, 4, 2, 2) * 2 - 1
    bad_concepts = concepts.clone()
    bad_concepts[1, 2:] = bad
    logits = head.bias_free_logits(bad_concepts, mask)
    torch.testing.assert_close(logits[1:], head.bias_free_logits(concepts[1:, :2]), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- 4. SwishBetaToBilinear leaves a bilinear phase


def _tiny_llama():
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))


def test_swish_beta_schedule_without_a_step_at_beta_zero_is_refused_naming_the_range():
    # anneal_fraction=1 trained every step at beta > 0 (the last at start_beta / max_steps) and then finalised the
    # model at beta=0: the bilinear model it became was one no step had trained
    from bcos_plugins.bilinear import SwishBetaToBilinear

    with pytest.raises(BcosValueError, match=r"^anneal_fraction: anneal_fraction=1.0 must lie in \(0, 1\)"):
        SwishBetaToBilinear(anneal_fraction=1.0)
    state = T.TrainerState()
    state.max_steps, state.global_step = 10, 0
    # 0.95 of 10 steps anneals over 9.5: step 9 still ran at beta = 0.05
    with pytest.raises(BcosValueError, match=r"^anneal_fraction: anneal_fraction=0.95 anneals over 9.5 of the 10 "
                                             r"training steps, so no step trains at beta=0.*anneal_fraction <= 0.9 "):
        SwishBetaToBilinear(anneal_fraction=0.95).on_train_begin(None, state, None, model=_tiny_llama())
    fits = SwishBetaToBilinear(anneal_fraction=0.9)
    fits.on_train_begin(None, state, None, model=_tiny_llama())
    assert fits.beta_at(9, 10) == 0.0 and fits.beta_at(8, 10) > 0.0  # the last step trains the bilinear model
    state.max_steps = 1
    with pytest.raises(BcosValueError, match=r"Train for at least 2 steps"):
        SwishBetaToBilinear(anneal_fraction=0.5).on_train_begin(None, state, None, model=_tiny_llama())


def test_swish_beta_refusal_surfaces_from_the_trainer_before_any_step(tmp_path):
    from datasets import Dataset

    from bcos_plugins.bilinear import SwishBetaToBilinear

    model = _tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 40, (8, 6), generator=torch.Generator().manual_seed(0)).tolist()
    args = T.TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, report_to=[],
                               save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = T.Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}),
                        callbacks=[SwishBetaToBilinear(anneal_fraction=0.8)])  # 3.2 of 4 steps
    with pytest.raises(BcosValueError, match=r"anneal_fraction <= 0.75 for 4 steps"):
        trainer.train()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.config.hidden_act == "silu"


# ---------------------------------------------------------------- 5. gold_mask_from_words names a too-long list


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from bcos_plugins.pretrained import minilm_path

    return T.AutoTokenizer.from_pretrained(minilm_path())


WORDS = [["I", "hate", "this", "thing"], ["ok", "fine"]]


def test_gold_mask_from_words_names_a_rationale_list_longer_than_its_words_not_truncation(minilm_tokenizer):
    from bcos_plugins.guided import gold_mask_from_words

    encoding = minilm_tokenizer(WORDS, is_split_into_words=True, padding=True)  # nothing truncated
    # row 1's third highlight has no word: it was refused as "highlight only words that truncation cut off"
    with pytest.raises(BcosValueError, match=r"^word_rationales: row 1: 3 word rationales for a text of 2 words "
                                             r"\(truncated or not\), and words \[2\] past its end are highlighted: "
                                             r"the rationale list is longer than the word list"):
        gold_mask_from_words(encoding, [[0, 1, 0, 0], [0, 0, 1]])
    # ... and one that kept another highlight was warned about as partly truncated
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedRationaleWarning)
        with pytest.raises(BcosValueError, match=r"^word_rationales: row 0: 5 word rationales for a text of 4 words"):
            gold_mask_from_words(encoding, [[0, 1, 0, 0, 1], [0, 1]])
    # unhighlighted extra entries change no mask and stay accepted
    assert gold_mask_from_words(encoding, [[0, 1, 0, 0, 0], [0, 1]]).sum(1).tolist() == [1.0, 1.0]


def test_gold_mask_from_words_still_reports_real_truncation(minilm_tokenizer):
    from bcos_plugins.guided import gold_mask_from_words

    encoding = minilm_tokenizer(WORDS, is_split_into_words=True, padding=True, truncation=True, max_length=4)
    with pytest.warns(TruncatedRationaleWarning, match="1 of 2 words"):
        mask = gold_mask_from_words(encoding, [[0, 1, 0, 1], [0, 1]])
    assert mask.sum(1).tolist() == [1.0, 1.0]


def test_gold_mask_from_words_counts_no_word_a_sibling_row_holds_as_truncated(minilm_tokenizer):
    # with return_overflowing_tokens a text's words are spread over rows: a row whose window holds no rationale was
    # refused as highlighting "only words that truncation cut off" (its sibling row held them), and a row that held
    # part of it was warned about as truncated
    from bcos_plugins.guided import gold_mask_from_words

    pieces = minilm_tokenizer(WORDS, is_split_into_words=True, padding=True, truncation=True, max_length=4,
                              return_overflowing_tokens=True)
    assert [int(s) for s in pieces["overflow_to_sample_mapping"]] == [0, 0, 1]  # "I hate" | "this thing" | "ok fine"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedRationaleWarning)
        assert gold_mask_from_words(pieces, [[0, 0, 0, 1], [0, 0, 0, 1], [0, 1]]).sum(1).tolist() == [0.0, 1.0, 1.0]
        assert gold_mask_from_words(pieces, [[0, 1, 0, 1], [0, 1, 0, 1], [0, 1]]).sum(1).tolist() == [1.0, 1.0, 1.0]
    # a list longer than the text's words is still named, counting the words of every row of the text
    with pytest.raises(BcosValueError, match=r"^word_rationales: row 0: 5 word rationales for a text of 4 words"):
        gold_mask_from_words(pieces, [[0, 0, 0, 0, 1], [0, 0, 0, 1, 0], [0, 1]])
