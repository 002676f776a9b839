"""A tokenizer larger than the model's embedding, where a model is built with it: TransformerLens'
``hooked_transformer_from_hf(..., tokenizer=)`` and ``transformer_bridge_from_hf(..., tokenizer=)`` attached it, and
TransformerLens' own ``model("text")`` then failed inside the embedding (IndexError; a device-side assert on a GPU);
``pretrain_masked_lm`` refused it with a message of its own. All now use ``corpus.require_tokenizer_fits``, the
check ``explain_dataset`` and ``inseq.load_model`` use. And ``fine_tune_classifier``'s up-front check of every
text's ids reads their running extremes instead of one flat tensor of every id, with the same refusal."""

from __future__ import annotations

import tempfile

import pytest
import torch
import transformers as T
from conftest import VOCAB, tiny_model

from bcos_plugins import bcosify
from bcos_plugins.data import shipped_data
from bcos_plugins.errors import BcosValueError
from bcos_plugins.fine_tuning import _id_bounds, fine_tune_classifier
from bcos_plugins.pretrain import pretrain_masked_lm
from bcos_plugins.pretrained import minilm_path

SIZE_REFUSAL = (r"^tokenizer: {tokenizer}\w*\('.*'\) has {tokens} tokens, but {model} has {rows} embedding rows: "
                r"the tokenizer is another model's\. Pass the tokenizer saved with the model")


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))  # 50257 tokens


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return T.AutoTokenizer.from_pretrained(minilm_path())  # 30522 tokens


@pytest.mark.parametrize("convert", ["hooked_transformer_from_hf", "transformer_bridge_from_hf"])
def test_lens_models_refuse_a_tokenizer_larger_than_the_embedding(convert, gpt2_tokenizer):
    lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")
    small = bcosify(tiny_model("GPT2LMHeadModel"), b=1.1, verbose=False)  # 60 embedding rows
    assert int(gpt2_tokenizer("some text", return_tensors="pt")["input_ids"].max()) >= VOCAB
    # was: built, and model("some text") raised IndexError: index out of range in self
    with pytest.raises(BcosValueError, match=SIZE_REFUSAL.format(tokenizer="GPT2Tokenizer", tokens=50257,
                                                                 model="GPT2LMHeadModel", rows=VOCAB)):
        getattr(lens, convert)(small, tokenizer=gpt2_tokenizer)


@pytest.mark.parametrize("convert", ["hooked_transformer_from_hf", "transformer_bridge_from_hf"])
def test_lens_models_attach_the_shipped_gpt2_tokenizer_to_a_model_of_its_size(convert, gpt2_tokenizer):
    lens = pytest.importorskip("bcos_plugins.adapters.transformer_lens")
    torch.manual_seed(0)
    fitting = bcosify(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(gpt2_tokenizer), n_embd=16, n_layer=1, n_head=2,
                                                     n_positions=64)).eval(), b=1.1, verbose=False)
    model = getattr(lens, convert)(fitting, tokenizer=gpt2_tokenizer)
    tokens = model.to_tokens("some text", prepend_bos=False)
    assert tokens.tolist() == [gpt2_tokenizer("some text")["input_ids"]]
    with torch.no_grad():
        assert model("some text", prepend_bos=False).shape == (1, tokens.shape[1], len(gpt2_tokenizer))


def test_pretrain_masked_lm_refuses_a_larger_tokenizer_with_the_shared_message(minilm_tokenizer):
    with pytest.raises(BcosValueError, match=SIZE_REFUSAL.format(tokenizer="BertTokenizer", tokens=30522,
                                                                 model="BertForMaskedLM", rows=VOCAB)):
        pretrain_masked_lm(tiny_model("BertForMaskedLM"), minilm_tokenizer, ["a film"], b=1.25, progress=False)


def test_fine_tune_classifier_reports_the_largest_id_of_every_batch(minilm_tokenizer):
    """The offending ids sit in the last text (its own batch, batch_size=1): the refusal names the largest id of all
    the texts, as the flat tensor's check did."""
    texts = ["a", "a film", "a gorgeous, witty, unforgettable film"]
    rows = minilm_tokenizer(texts)["input_ids"]
    largest = max(max(row) for row in rows)
    assert max(rows[-1]) == largest > max(max(row) for row in rows[:-1])
    model = bcosify(T.BertForSequenceClassification(T.BertConfig(
        vocab_size=max(max(row) for row in rows[:-1]) + 1, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, num_labels=2)).eval(), verbose=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as folder, pytest.raises(
            BcosValueError, match=rf"^tokenizer: BertTokenizer\w*\('.*'\) gives token ids up to {largest}, but "
                                  r"BertForSequenceClassification\('\?'\) has \d+ embedding rows: the tokenizer is "
                                  r"not the model's\. Pass the tokenizer saved with the model"):
        fine_tune_classifier(model, minilm_tokenizer, texts, [0, 1, 0], batch_size=1, output_dir=folder,
                             progress=False)
    for k, v in model.state_dict().items():  # refused before any training step
        assert torch.equal(v, before[k]), k


def test_id_bounds_are_the_extremes_of_every_row():
    rows = [[5, 2, 9], [], [1], [7, 30, 4]]
    assert _id_bounds(rows).tolist() == [1, 30]
    flat = torch.tensor([i for row in rows for i in row])
    assert _id_bounds(rows).tolist() == [int(flat.min()), int(flat.max())]
    assert _id_bounds([[], []]).numel() == 0
    assert _id_bounds([]).dtype == torch.long
