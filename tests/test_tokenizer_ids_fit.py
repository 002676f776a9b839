"""Token ids past the model's vocabulary from a tokenizer the entry point calls itself: ``predict`` / ``accuracy``,
``predict_labels`` / ``zero_shot_evaluation`` and ``fine_tune_classifier`` passed them on, and the embedding
lookup failed deep in torch (IndexError on the CPU, a device-side assert on a GPU; inside Trainer, mid-epoch).
Each now refuses them with ``explain_dataset``'s one check (``corpus.require_tokenizer_ids_fit``), naming the
tokenizer, the ids, the model's rows and the fix."""

from __future__ import annotations

import importlib
import tempfile

import pytest
import torch
import transformers as T
from conftest import tiny_model

from bcos_plugins import bcosify
from bcos_plugins.corpus import require_tokenizer_ids_fit
from bcos_plugins.errors import BcosValueError
from bcos_plugins.fine_tuning import fine_tune_classifier
from bcos_plugins.prediction import accuracy, predict
from bcos_plugins.pretrained import minilm_path
from bcos_plugins.space import predict_labels, zero_shot_evaluation

TEXTS = ["a gorgeous, witty film", "dull"]
IDS_REFUSAL = (r"^tokenizer: BertTokenizer\w*\('.*'\) gives token ids up to \d+, but BertForSequenceClassification"
               r"\('\?'\) has 60 embedding rows: the tokenizer is not the model's\. Pass the tokenizer saved with the "
               r"model")


@pytest.fixture(scope="module")
def tokenizer():
    return T.AutoTokenizer.from_pretrained(minilm_path())  # 30522 tokens


@pytest.fixture(scope="module")
def small_bert():
    """A B-cos BERT classifier whose embedding has 60 rows: the MiniLM tokenizer's ids of TEXTS lie past them."""
    return bcosify(tiny_model("BertForSequenceClassification"), verbose=False)


def _paths(model, tokenizer):
    with tempfile.TemporaryDirectory() as folder:
        yield "predict", lambda: predict(model, tokenizer, TEXTS)
        yield "accuracy", lambda: accuracy(model, tokenizer, TEXTS, [0, 1])
        yield "predict_labels", lambda: predict_labels(model, tokenizer, TEXTS)
        yield "zero_shot_evaluation", lambda: zero_shot_evaluation(model, tokenizer, TEXTS, [0, 1])
        yield "fine_tune_classifier", lambda: fine_tune_classifier(model, tokenizer, TEXTS, [0, 1], batch_size=2,
                                                                   output_dir=folder, progress=False)


def test_ids_past_the_embedding_are_refused_naming_the_tokenizer(small_bert, tokenizer):
    assert int(tokenizer(TEXTS, padding=True, return_tensors="pt")["input_ids"].max()) >= 60
    before = {k: v.clone() for k, v in small_bert.state_dict().items()}
    refused = []
    for name, call in _paths(small_bert, tokenizer):
        with pytest.raises(BcosValueError, match=IDS_REFUSAL):  # was IndexError: index out of range in self
            call()
        refused.append(name)
    assert refused == ["predict", "accuracy", "predict_labels", "zero_shot_evaluation", "fine_tune_classifier"]
    for k, v in small_bert.state_dict().items():  # refused before any training step
        assert torch.equal(v, before[k]), k


def test_the_same_calls_run_on_a_model_with_the_tokenizers_rows(tokenizer):
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=64, num_labels=2)
    model = bcosify(T.BertForSequenceClassification(config).eval(), verbose=False)
    assert predict(model, tokenizer, TEXTS).shape == (2, 2)
    assert len(predict_labels(model, tokenizer, TEXTS)) == 2


def test_token_type_ids_past_the_segment_embedding_are_refused(tokenizer):
    """A BERT tokenizer's sentence pairs (token type 1) on a RoBERTa with one segment row (roberta-base's)."""
    torch.manual_seed(0)
    roberta = bcosify(T.RobertaForSequenceClassification(T.RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=66, num_labels=2, pad_token_id=1, type_vocab_size=1)).eval(), verbose=False)
    with pytest.raises(BcosValueError, match=r"^tokenizer: BertTokenizer\w*\('.*'\) gives token type ids up to 1 "
                                             r"\(the segments of text pairs\), but RobertaForSequenceClassification"
                                             r"\('\?'\) has type_vocab_size 1: the tokenizer is not the model's"):
        predict(roberta, tokenizer, TEXTS, text_pairs=["a man sleeps", "nobody sleeps"])  # was IndexError
    assert predict(roberta, tokenizer, TEXTS).shape == (2, 2)  # single texts: type 0 only


def test_inseq_load_model_refuses_a_tokenizer_larger_than_the_embedding():
    """inseq.load_model(model, "bcos", tokenizer=...) loaded a GPT-2 tokenizer onto a 60-row GPT-2 and the first
    attribute call failed inside the embedding (IndexError), as load_classifier refuses it already."""
    import bcos_plugins.adapters.inseq  # noqa: F401 (registers "bcos")
    import inseq

    from bcos_plugins.data import shipped_data

    gpt2_tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    torch.manual_seed(0)
    small = bcosify(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=64,
                                                   bos_token_id=0, eos_token_id=0)).eval(), b=1.1, verbose=False)
    with pytest.raises(BcosValueError, match=r"^tokenizer: GPT2Tokenizer\w*\('.*'\) has 50257 tokens, but "
                                             r"GPT2LMHeadModel has 60 embedding rows: the tokenizer is another "
                                             r"model's\. Pass the tokenizer saved with the model"):
        inseq.load_model(small, "bcos", tokenizer=gpt2_tokenizer)
    fitting = bcosify(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(gpt2_tokenizer), n_embd=16, n_layer=1, n_head=2,
                                                     n_positions=64)).eval(), b=1.1, verbose=False)
    out = inseq.load_model(fitting, "bcos", tokenizer=gpt2_tokenizer).attribute(
        "a fine film", generation_args={"max_new_tokens": 1}, show_progress=False)
    assert len(out.sequence_attributions) == 1


def test_each_entry_point_uses_the_one_check():
    for name in ("bcos_plugins.prediction", "bcos_plugins.fine_tuning"):
        assert importlib.import_module(name).require_tokenizer_ids_fit is require_tokenizer_ids_fit, name
    # predict_labels runs predict's loop (session 26, tests/test_leftovers_s26_small.py)
    zero_shot, prediction = (importlib.import_module(f"bcos_plugins.{m}") for m in ("space.zero_shot", "prediction"))
    assert zero_shot.batched_logits is prediction.batched_logits
