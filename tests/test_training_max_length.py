"""Training and prediction check ``max_length`` against the model's position limit up front (issue 31).

``fine_tune_classifier`` (``max_length=64``), ``pretrain_masked_lm`` (``max_length=128``), ``fine_tune_task_then_bcos``
and ``predict`` / ``accuracy`` (``max_length=64``) truncate texts at ``max_length``; ``train_causal_lm`` truncates
token rows at it or keeps them whole. Before, a model with fewer
positions (a tiny BERT of 40, a RoBERTa of 514 rows and 512 usable) took the setting, default included, and the
first text longer than its table failed inside the embedding with an opaque error (an ``IndexError``, or a shape
error from BERT's token type buffer; a device-side assert on a GPU), in the middle of training. Now, through
:func:`~bcos_plugins.convert.architectures.position_limit`: the default is capped at the limit, and a longer
``max_length`` is refused before anything trains, with the limit, where the model keeps it and the fix.
"""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import MAX_POS, tiny_config, tiny_model
from test_conformance import CONFIGS
from test_pretrain import WORDS, word_tokenizer

from bcos_plugins import bcosify, encoded_texts
from bcos_plugins.convert import architectures
from bcos_plugins.convert.architectures import PositionLimit, position_limit
from bcos_plugins.errors import BcosValueError
from bcos_plugins.nn.dynamic import has_dynamic_weights
from bcos_plugins.pretrain import fine_tune_task_then_bcos, pretrain_masked_lm
from bcos_plugins.train import accuracy, fine_tune_classifier, predict
from bcos_plugins.train_decoder import train_causal_lm

QUIET = {"progress": False, "use_cpu": True}
LONG_TEXT = " ".join(WORDS[i % len(WORDS)] for i in range(MAX_POS + 10))  # 50 words: past a 40-row table


def refusal(n: int, model: str, limit: int, source: str) -> str:
    return (rf"^max_length: is {n} but {model} takes at most {limit} positions \({source}, its position table\)\. "
            rf"Pass max_length={limit} or less")


@pytest.fixture
def training_runs(monkeypatch):
    """Record what Trainer.train would train on instead of training: a refusal must come before the first call."""
    runs = []
    monkeypatch.setattr(T.Trainer, "train", lambda self, *a, **k: runs.append(
        (self.model, max(len(row["input_ids"]) for row in self.train_dataset))))
    return runs


def test_fine_tuning_checks_max_length_against_the_position_table_before_training(training_runs, tmp_path):
    tok = word_tokenizer()
    texts, labels = [LONG_TEXT, "w1 w2"], [0, 1]
    for model, limit, source in (
            (bcosify(tiny_model("BertForSequenceClassification"), verbose=False), MAX_POS,
             "config.max_position_embeddings"),
            (T.RobertaForSequenceClassification(tiny_config("roberta")), MAX_POS,  # 42 rows, positions from pad + 1
             "config.max_position_embeddings - pad_token_id - 1")):
        name = type(model).__name__
        for n in (64, limit + 1):
            with pytest.raises(BcosValueError, match=refusal(n, name, limit, source)):
                fine_tune_classifier(model, tok, texts, labels, max_length=n, output_dir=tmp_path, **QUIET)
        assert not training_runs, name
        fine_tune_classifier(model, tok, texts, labels, max_length=limit, output_dir=tmp_path, **QUIET)
        fine_tune_classifier(model, tok, texts, labels, output_dir=tmp_path, **QUIET)  # default 64, capped
        assert training_runs == [(model, limit), (model, limit)], name
        training_runs.clear()


def test_task_then_bcos_refuses_before_its_first_stage(training_runs, tmp_path):
    model = tiny_model("BertForSequenceClassification")
    with pytest.raises(BcosValueError, match=refusal(64, "BertForSequenceClassification", MAX_POS,
                                                     "config.max_position_embeddings")):
        fine_tune_task_then_bcos(model, word_tokenizer(), [LONG_TEXT, "w1"], [0, 1], max_length=64,
                                 output_dir=tmp_path, **QUIET)
    assert not training_runs and not has_dynamic_weights(model)
    fine_tune_task_then_bcos(model, word_tokenizer(), [LONG_TEXT, "w1"], [0, 1], output_dir=tmp_path, **QUIET)
    assert [length for _, length in training_runs] == [MAX_POS, MAX_POS]  # both stages, default capped


def test_masked_lm_pretraining_caps_its_default_and_refuses_a_longer_max_length(training_runs, tmp_path):
    tok = word_tokenizer()
    with pytest.raises(BcosValueError, match=refusal(128, "BertForMaskedLM", MAX_POS,
                                                     "config.max_position_embeddings")):
        pretrain_masked_lm(tiny_model("BertForMaskedLM"), tok, [LONG_TEXT], b=1.25, max_length=128,
                           output_dir=tmp_path, **QUIET)
    assert not training_runs
    pretrain_masked_lm(tiny_model("BertForMaskedLM"), tok, [LONG_TEXT], b=1.25, output_dir=tmp_path, **QUIET)
    assert [length for _, length in training_runs] == [MAX_POS]


def test_prediction_caps_its_default_and_refuses_a_longer_max_length():
    model, tok = bcosify(tiny_model("BertForSequenceClassification"), verbose=False), word_tokenizer()
    for call in (lambda **k: predict(model, tok, [LONG_TEXT], **k),
                 lambda **k: accuracy(model, tok, [LONG_TEXT], [0], **k)):
        with pytest.raises(BcosValueError, match=refusal(64, "BertForSequenceClassification", MAX_POS,
                                                         "config.max_position_embeddings")):
            call(max_length=64)
        call()  # the default: the longest text is truncated to the table and runs (was a shape error)
    torch.testing.assert_close(predict(model, tok, [LONG_TEXT]), predict(model, tok, [LONG_TEXT], max_length=MAX_POS))


def test_a_rotary_model_has_no_table_to_run_off(training_runs, tmp_path):
    model = T.ModernBertForSequenceClassification(CONFIGS["ModernBert"]())
    assert position_limit(model).max_length is None
    fine_tune_classifier(model, word_tokenizer(), [LONG_TEXT, "w1"], [0, 1], max_length=4 * MAX_POS,
                         output_dir=tmp_path, **QUIET)
    fine_tune_classifier(model, word_tokenizer(), [LONG_TEXT, "w1"], [0, 1], output_dir=tmp_path, **QUIET)
    assert training_runs == [(model, MAX_POS + 10), (model, MAX_POS + 10)]  # the whole text, both times
    predict(model, word_tokenizer(), [LONG_TEXT], max_length=4 * MAX_POS)


def test_the_check_follows_the_one_position_limit(monkeypatch, training_runs, tmp_path):
    assert encoded_texts.position_limit is position_limit, "the training check reads the limit with its own function"

    def patched(model):
        return PositionLimit(6, 6, "patched.limit")

    # read where the default length is decided (encoded_texts) and where a given one is checked (require_max_length_fits,
    # beside position_limit in convert.architectures)
    monkeypatch.setattr(encoded_texts, "position_limit", patched)
    monkeypatch.setattr(architectures, "position_limit", patched)
    model, tok = tiny_model("BertForSequenceClassification"), word_tokenizer()
    with pytest.raises(BcosValueError, match=refusal(7, "BertForSequenceClassification", 6, "patched.limit")):
        fine_tune_classifier(model, tok, [LONG_TEXT, "w1"], [0, 1], max_length=7, output_dir=tmp_path, **QUIET)
    with pytest.raises(BcosValueError, match=refusal(7, "BertForSequenceClassification", 6, "patched.limit")):
        predict(model, tok, [LONG_TEXT], max_length=7)
    fine_tune_classifier(model, tok, [LONG_TEXT, "w1"], [0, 1], output_dir=tmp_path, **QUIET)
    assert training_runs == [(model, 6)]


def test_causal_lm_training_refuses_a_max_length_or_a_row_past_the_position_table(training_runs, tmp_path):
    model = bcosify(tiny_model("GPT2LMHeadModel"), b=1.1, verbose=False)  # n_positions 40
    rows = [{"input_ids": [3 + i % 50 for i in range(MAX_POS + 10)]}, {"input_ids": [5, 6, 7]}]
    with pytest.raises(BcosValueError, match=refusal(64, "GPT2LMHeadModel", MAX_POS, "config.n_positions")):
        train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_length=64)
    with pytest.raises(BcosValueError, match=r"^train_dataset: feature 0 has 50 tokens but the model takes at most "
                                             r"40 positions \(config\.n_positions, its position table\)\. Pass "
                                             r"max_length=40"):
        train_causal_lm(model, rows, str(tmp_path), pad_token_id=0)
    with pytest.raises(BcosValueError, match=r"^eval_dataset: feature 0 has 50 tokens"):
        train_causal_lm(model, rows[1:], str(tmp_path), pad_token_id=0, eval_dataset=rows)
    assert not training_runs
    train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_length=MAX_POS)
    assert len(training_runs) == 1
