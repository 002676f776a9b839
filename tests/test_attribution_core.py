"""The attribution core: one parser, one input x gradient step, one result family, the corpus entry point."""

from __future__ import annotations

import threading

import pytest
import torch
import transformers as T
from conftest import VOCAB, padded_batch, tiny_config, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from bcos_plugins import bcosify, explain, explain_dataset, explanation_mode
from bcos_plugins.attribution import (
    Direction,
    Explanation,
    TokenExplanation,
    capture_point,
    parse_ids,
    resolve_positions,
)
from bcos_plugins.errors import BcosError, BcosRuntimeError, BcosTypeError, BcosValueError
from bcos_plugins.nn.dynamic import dynamic_weights_used
from bcos_plugins.pretrained import minilm_path


def _bcos(name: str, seed: int = 0):
    return bcosify(tiny_model(name, seed), b=1.5, verbose=False)


# ------------------------------------------------------------------ parsing: one meaning everywhere


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 6), n=st.integers(1, 6))
def test_float_ids_are_refused_whatever_the_batch_size(batch, n):
    """A float tensor is never guessed to be a direction (the issue's case: batch == number of classes)."""
    with pytest.raises(BcosTypeError, match=r"target: got a float.*Direction\(vector\)"):
        parse_ids(torch.zeros(batch), batch, "target", n_outputs=n)
    direction = Direction(torch.randn(n))
    assert parse_ids(direction, batch, "target", n_outputs=n) is direction


def test_the_direction_hint_appears_only_where_a_direction_is_taken():
    mask = torch.ones(2, 4, dtype=torch.long)
    for bad in (1.5, torch.tensor([1.0, 2.0])):
        with pytest.raises(BcosTypeError, match="position: got a float") as refused:
            resolve_positions(bad, mask)
        assert "Direction" not in str(refused.value)
    with pytest.raises(BcosTypeError, match=r"position: ids must be integers, got torch\.complex64\. Pass an int "
                                             r"for every row, or one integer id per row \(a list of ints or an "
                                             r"integer tensor of shape \(2,\)\)\.$"):
        resolve_positions(torch.tensor([1j, 2j]), mask)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 8), min_size=1, max_size=4), left=st.booleans(),
       position=st.integers(-10, 10))
def test_positions_negative_per_row_and_padding_raises(lengths, left, position):
    width = max(lengths)
    cols = torch.arange(width)[None]
    n = torch.tensor(lengths)[:, None]
    mask = (cols >= width - n) if left else (cols < n)
    mask = mask.long()
    first = (width - n.squeeze(1)) if left else torch.zeros(len(lengths), dtype=torch.long)
    last = first + n.squeeze(1) - 1
    expected = last + 1 + position if position < 0 else torch.full_like(last, position)
    ok = (expected >= first) & (expected <= last)
    if ok.all():
        assert resolve_positions(position, mask).tolist() == expected.tolist()
    else:
        with pytest.raises(BcosValueError, match="position: "):
            resolve_positions(position, mask)
    assert resolve_positions(None, mask).tolist() == last.tolist()
    assert resolve_positions(None, mask, default="first").tolist() == first.tolist()


def test_direction_is_explicit_and_checked():
    with pytest.raises(BcosTypeError, match="Direction"):
        Direction(torch.tensor([1, 2]))
    with pytest.raises(BcosValueError, match="NaN or inf"):
        Direction(torch.tensor([1.0, float("nan")]))
    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    d = torch.tensor([1.0, -1.0, 0.0])
    by_direction = explain(model, ids, mask, target=Direction(d))
    contrastive = explain(model, ids, mask, target=0, foil=1)
    torch.testing.assert_close(by_direction.explained, contrastive.explained)
    torch.testing.assert_close(by_direction.contributions, contrastive.contributions)


# ------------------------------------------------------------------ the result family


def test_one_result_family_with_delta_and_relative_error():
    model = _bcos("GPT2LMHeadModel")
    ids, mask = padded_batch(side="left")
    expl = explain(model, ids, mask, target=5, foil=7)
    assert isinstance(expl, TokenExplanation) and isinstance(expl, Explanation)
    torch.testing.assert_close(expl.delta, expl.input_contributions.sum((1, 2)) - expl.explained)
    torch.testing.assert_close(expl.completeness_error, expl.delta.abs() / expl.explained.abs())
    assert expl.completeness_error.max() < 1e-4
    assert expl.logits is expl.explained
    # the 0.1 name of input_contributions is refused by name, not kept as a second spelling
    assert not hasattr(expl, "embedding_contributions")
    with pytest.raises(AttributeError, match="embedding_contributions: renamed input_contributions"):
        _ = expl.embedding_contributions
    assert "combined embedding" in expl.attribution_point


# ------------------------------------------------------------------ explanation mode without a model


def test_thread_wide_mode_explains_a_plain_function_and_stays_in_its_thread():
    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    with torch.no_grad():  # then the word embeddings are the combined embedding explain attributes to
        model.bert.embeddings.position_embeddings.weight.zero_()
        model.bert.embeddings.token_type_embeddings.weight.zero_()
    reference = explain(model, ids, mask, target=1)
    emb = model.bert.embeddings.word_embeddings(ids)

    def f(e):
        return model(inputs_embeds=e, attention_mask=mask).logits[:, 1]

    seen_in_other_thread = []
    before = dynamic_weights_used()
    with explanation_mode():
        worker = threading.Thread(target=lambda: seen_in_other_thread.append(
            model.bert.encoder.layer[0].attention.self.query.explaining))
        worker.start()
        worker.join()
        leaf = emb.detach().requires_grad_(True)
        out = f(leaf)
        (grad,) = torch.autograd.grad(out.sum(), leaf)
    assert dynamic_weights_used() > before
    assert seen_in_other_thread == [False]
    assert not model.bert.encoder.layer[0].attention.self.query.explaining
    torch.testing.assert_close((leaf * grad).sum(-1) * mask, reference.contributions * mask, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ inputs that used to be silently wrong


def test_stock_bert_family_is_explained_after_the_embedding_layernorm():
    """Input x gradient before a LayerNorm is ~0 for any model; the stock model's point is after it."""
    for name in ("BertForSequenceClassification", "DistilBertForSequenceClassification",
                 "RobertaForSequenceClassification"):
        model = tiny_model(name)
        ids, mask = padded_batch(pad_id=1 if name.startswith("Roberta") else 0)
        expl = explain(model, ids, mask, target=0)
        assert "after the embedding LayerNorm" in expl.attribution_point
        # before the LayerNorm the same input x gradient is float noise
        with capture_point(model.base_model.embeddings.LayerNorm, "input") as leaves:
            logit = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        (grad,) = torch.autograd.grad(logit.sum(), leaves[0])
        before = (leaves[0] * grad).sum(-1).detach()
        assert expl.contributions.abs().max() > 100 * before.abs().max(), name


def test_explain_under_inference_mode_and_no_grad():
    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    reference = explain(model, ids, mask)
    with torch.inference_mode():
        ids_inf, mask_inf = ids.clone(), mask.clone()
        inside = explain(model, ids_inf, mask_inf)
    with torch.no_grad():
        in_no_grad = explain(model, ids, mask)
    torch.testing.assert_close(inside.contributions, reference.contributions)
    torch.testing.assert_close(in_no_grad.contributions, reference.contributions)


def test_decoder_classifier_padded_with_another_id_gives_the_logit_it_gives_alone():
    config = tiny_config("gpt2")
    torch.manual_seed(0)
    model = bcosify(T.GPT2ForSequenceClassification(config).eval(), verbose=False)
    ids, mask = padded_batch(pad_id=7, side="right")  # config.pad_token_id is 0
    batched = explain(model, ids, mask, target=1)
    for row in range(ids.shape[0]):
        real = ids[row][mask[row].bool()][None]
        alone = explain(model, real, target=1)
        torch.testing.assert_close(batched.explained[row], alone.explained[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batched.scores()[row], alone.scores()[0], rtol=1e-4, atol=1e-6)


def test_bcos_checkpoint_loaded_as_the_stock_model_is_refused(tmp_path):
    model = _bcos("BertForSequenceClassification")
    model.save_pretrained(tmp_path)
    stock = T.BertForSequenceClassification.from_pretrained(tmp_path)
    ids, mask = padded_batch()
    with pytest.raises(BcosTypeError, match="load_bcos_model"):
        explain(stock, ids, mask)


@pytest.mark.parametrize("case", ["empty_batch", "zero_length", "vocab", "too_long", "no_real_token",
                                  "mask_values", "rank", "not_tensor"])
def test_bad_text_inputs_name_the_argument(case):
    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    args = {
        "empty_batch": (ids[:0], mask[:0], "input_ids: empty"),
        "zero_length": (ids[:, :0], mask[:, :0], "input_ids: empty"),
        "vocab": (ids.clone().fill_(VOCAB), mask, "outside the vocabulary"),
        "too_long": (torch.randint(3, VOCAB, (1, 60)), None, "positions"),
        "no_real_token": (ids, torch.cat([mask[:1], torch.zeros_like(mask[1:])]), "no real token"),
        "mask_values": (ids, mask * 2, "attention_mask: must hold 0"),
        "rank": (ids[0], None, "input_ids: expected shape"),
        "not_tensor": (ids.tolist(), None, "input_ids: expected a tensor"),
    }[case]
    with pytest.raises(BcosError, match=args[2]):
        explain(model, args[0], args[1])


def test_non_finite_outputs_raise_instead_of_returning_nan():
    model = _bcos("BertForSequenceClassification")
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[5] = float("nan")
    ids, mask = padded_batch()
    ids[0, 1] = 5
    with pytest.raises(BcosValueError, match="NaN or infinite"):
        explain(model, ids, mask)


def test_function_ignoring_its_input_is_refused():
    from bcos_plugins.attribution import as_leaf, input_x_gradient
    x = as_leaf(torch.randn(2, 3))
    with pytest.raises(BcosRuntimeError, match="does not depend"):
        input_x_gradient(lambda: (torch.ones(2), [x]))


# ------------------------------------------------------------------ a corpus


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return T.AutoTokenizer.from_pretrained(minilm_path())


def test_explain_dataset_matches_explain_and_saves(minilm_tokenizer, tmp_path):
    import datasets

    tok = minilm_tokenizer
    config = T.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=64, num_labels=2)
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(config).eval(), verbose=False)
    texts = ["a gorgeous, witty film", "dull", "not bad at all, really quite good", "bad", "fine"]
    data = datasets.Dataset.from_dict({"sentence": texts, "label": [1, 0, 1, 0, 1]})
    out = explain_dataset(model, tok, data, text_column="sentence", target_column="label", batch_size=2,
                          progress=False)
    assert out.column_names[:2] == ["sentence", "label"]
    assert out["target"] == [1, 0, 1, 0, 1]
    enc = tok(texts[2:4], padding=True, return_tensors="pt")
    ref = explain(model, enc["input_ids"], enc["attention_mask"], target=torch.tensor([1, 0]))
    for got, want in zip(out["scores"][2:4], ref.scores(), strict=True):
        torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)
    assert out["tokens"][1] == ["[CLS]", "dull", "[SEP]"]
    assert max(out["completeness_error"]) < 1e-4
    out.save_to_disk(tmp_path / "expl")
    back = datasets.load_from_disk(tmp_path / "expl")
    assert back["scores"] == out["scores"]
    plain = explain_dataset(model, tok, texts, progress=False)
    assert plain.column_names[0] == "text" and len(plain) == 5


def test_explain_dataset_input_errors(minilm_tokenizer):
    import datasets

    model = bcosify(T.BertForSequenceClassification(T.BertConfig(
        vocab_size=minilm_tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=2)).eval(), verbose=False)
    data = datasets.Dataset.from_dict({"sentence": ["a", "b"]})
    with pytest.raises(BcosValueError, match="text_column: 'text' is not a column"):
        explain_dataset(model, minilm_tokenizer, data, progress=False)
    with pytest.raises(BcosValueError, match="target: 3 values for 2 texts"):
        explain_dataset(model, minilm_tokenizer, ["a", "b"], target=[0, 1, 1], progress=False)
    with pytest.raises(BcosValueError, match="data: no texts"):
        explain_dataset(model, minilm_tokenizer, [], progress=False)
    with pytest.raises(BcosTypeError, match="data: got one string"):
        explain_dataset(model, minilm_tokenizer, "one text", progress=False)


def test_explain_reads_the_forward_signature_only_to_check_keywords_it_was_given(monkeypatch):
    # inspect.signature of a transformers forward costs about as much as a small layer; without keywords there is
    # nothing to check (before: read on every explain call)
    import bcos_plugins.attribution.text as text

    reads = []
    forward_keywords = text.forward_keywords
    monkeypatch.setattr(text, "forward_keywords", lambda model: reads.append(model) or forward_keywords(model))
    model = bcosify(tiny_model("BertForSequenceClassification"), b=2.0, verbose=False)
    ids, mask = padded_batch()
    explain(model, ids, mask)
    assert reads == []
    with_types = explain(model, ids, mask, token_type_ids=torch.zeros_like(ids))
    assert reads == [model] and with_types.completeness_error.max() < 1e-5
    with pytest.raises(BcosTypeError, match="^token_type_id: is not an argument of"):
        explain(model, ids, mask, token_type_id=torch.zeros_like(ids))
