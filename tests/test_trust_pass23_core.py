"""Trust pass 23, the explanation core (``explain``, ``explain_dataset``, the attribution package, ``predict``): unusual
inputs aimed where pass 22 did not look (every batching path, caller-given position / segment ids, the result objects'
whole surface, real tokenizers slow and fast, state between calls), each checked against an independent computation
(the text alone, the model's own forward). The cases that were silently wrong or crashed unhelpfully, one test each
(the tally is in the CHANGELOG and the session's report).

- ``explanation == other`` (two results of one call) and ``Direction(v) == Direction(v.clone())`` raised "Boolean value
  of Tensor with more than one value is ambiguous": the dataclasses' generated ``__eq__`` compared tensors with ``==``.
  Results and Directions now compare by value (one shape, dtype and device, equal elements), and equal Directions hash
  equal.
- A tokenizer whose ``model_input_names`` leave out the attention mask (``["input_ids"]``) pads without one: ``predict``
  returned a padded BERT row's logits with its padding attended to as tokens (-0.129 against -0.150 alone), silently,
  and ``explain_dataset`` failed with ``KeyError: 'attention_mask'``. Both ask the tokenizer for the mask, and so does
  ``predict_labels`` (zero-shot evaluation's ``predict``), which had the same silent defect.
- RoBERTa (a position table counted from the padding index): a token of id ``pad_token_id`` that the mask calls real (a
  ``"<pad>"`` in the text, or unmasked padding) was counted by the position ids ``explain`` passes, while the model's
  own forward gives it the padding row and does not count it: the explained logit was 0.722 against ``model(ids,
  mask)``'s 0.624, complete and silent (and ``predict`` / ``explain_dataset`` went the same way, and a Space Model over
  a RoBERTa encoder, which gives its encoder the same ids: -0.131 against its encoder's own -0.235).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import VOCAB
from test_conformance import _word_tokenizer

# one cache of the families' B-cos models, shared with pass 22 (tests copy one to change it)
from test_trust_pass22_core import _bcos

from bcos_plugins import Direction, explain, explain_dataset
from bcos_plugins.prediction import accuracy, predict

warnings.filterwarnings("ignore", category=DeprecationWarning)



# ------------------------------------------------------------------ equality of results and Directions


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "LlamaForCausalLM"])
def test_two_results_of_one_call_are_equal_and_results_of_other_calls_or_dtypes_are_not(name):
    """The generated __eq__ raised "Boolean value of Tensor with more than one value is ambiguous" for two results of the
    same call (and for any two results whose tensors were not the same objects)."""
    model = _bcos(name)
    ids, mask = torch.tensor([[5, 7, 9, 11], [3, 4, 8, 0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    target = None if "Classification" in name else 4
    first, again = explain(model, ids, mask, target=target), explain(model, ids, mask, target=target)
    assert first is not again and first.contributions is not again.contributions
    assert first == again and not (first != again)
    assert first == first.to("cpu") and first.to(torch.float64) == again.to(torch.float64)
    assert first != first.to(torch.float64)  # the same numbers in another dtype are another result
    assert first != explain(model, ids, mask, target=1 if target is None else 5)  # another target
    assert first != explain(model, ids, mask, target=target, reduce="mean")
    assert first != first.contributions and (first == None) is False  # noqa: E711 (== is what is tested)
    with pytest.raises(TypeError, match="unhashable"):
        hash(first)


def test_directions_of_one_vector_are_equal_and_hash_equal():
    """Direction's generated __eq__ raised the same "ambiguous" error, and its generated hash was the vector's id, so two
    Directions of one vector (and two results explaining them) could not be compared."""
    vector = torch.randn(60, generator=torch.Generator().manual_seed(0))
    one, other = Direction(vector), Direction(vector.clone())
    assert one == other and hash(one) == hash(other) and len({one, other}) == 1
    assert one != Direction(vector.double()) and one != Direction(vector + 1) and one != Direction(vector[None])
    model = _bcos("LlamaForCausalLM")
    ids = torch.tensor([[5, 7, 9], [3, 4, 8]])
    assert explain(model, ids, target=one) == explain(model, ids, target=other)
    assert explain(model, ids, target=one) != explain(model, ids, target=Direction(vector + 1))


# ------------------------------------------------------------------ tokenizers that return no attention mask


def _maskless_tokenizer():
    tokenizer = _word_tokenizer()
    tokenizer.model_input_names = ["input_ids"]  # tokenizer(...) then returns no attention_mask, padded or not
    assert "attention_mask" not in tokenizer(["w5 w6", "w7"], padding=True)
    return tokenizer


_TEXTS = ["w5 w7 w9", "w3", "w10 w11 w12 w13"]


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "LlamaForSequenceClassification"])
def test_predict_with_a_tokenizer_that_returns_no_mask_gives_each_texts_logits_alone(name):
    """The batch was padded without a mask, so a padded BERT row's logits were of its padding attended to as tokens
    (-0.129 against -0.150 alone), silently; accuracy counted those predictions."""
    model, tokenizer = _bcos(name), _maskless_tokenizer()
    with torch.no_grad():
        alone = torch.stack([model(input_ids=torch.tensor([tokenizer(t)["input_ids"]])).logits[0] for t in _TEXTS])
    torch.testing.assert_close(predict(model, tokenizer, _TEXTS), alone, rtol=1e-5, atol=1e-6)
    labels = alone.argmax(-1).tolist()
    assert accuracy(model, tokenizer, _TEXTS, labels) == 1.0


def test_predict_labels_with_a_tokenizer_that_returns_no_mask_gives_each_texts_class_alone():
    """predict_labels (zero-shot evaluation's predict) padded without a mask too: a padded BERT row's class was of its
    padding attended to as tokens, silently (texts chosen so that the padding flips the arg-max)."""
    from bcos_plugins.space.zero_shot import predict_labels

    model, tokenizer = _bcos("BertForSequenceClassification"), _maskless_tokenizer()
    texts = ["w5 w7 w9 w11 w13 w15 w17 w19", *[f"w{i}" for i in range(3, VOCAB)]]
    with torch.no_grad():
        alone = [int(model(input_ids=torch.tensor([tokenizer(t)["input_ids"]])).logits[0].argmax()) for t in texts]
        padded = torch.tensor([tokenizer(t)["input_ids"] + [0] * 7 for t in texts[1:]])
        unmasked = model(input_ids=padded).logits.argmax(-1).tolist()
    assert unmasked != alone[1:]  # the padding attended to changes some rows' class: the case is a real one
    assert predict_labels(model, tokenizer, texts, batch_size=len(texts)) == alone


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "LlamaForCausalLM"])
def test_explain_dataset_with_a_tokenizer_that_returns_no_mask_explains_each_text_alone(name):
    """explain_dataset read enc["attention_mask"] and failed with KeyError: 'attention_mask'."""
    model, tokenizer = _bcos(name), _maskless_tokenizer()
    target = None if "Classification" in name else 4
    rows = explain_dataset(model, tokenizer, _TEXTS, target=target, batch_size=2, progress=False)
    for i, text in enumerate(_TEXTS):
        alone = explain(model, torch.tensor([tokenizer(text)["input_ids"]]), target=target)
        assert rows[i]["tokens"] == text.split()
        torch.testing.assert_close(torch.tensor(rows[i]["scores"]), alone.contributions[0], rtol=1e-5, atol=1e-6)
        assert rows[i]["explained"] == pytest.approx(float(alone.explained[0]), rel=1e-5, abs=1e-6)


# ------------------------------------------------------------------ RoBERTa: a real token of the padding id


@pytest.mark.parametrize("name", ["RobertaForSequenceClassification", "RobertaModel"])
@pytest.mark.parametrize("row", [[0, 5, 1, 7, 2], [0, 5, 7, 2, 1]], ids=["pad-id-inside", "unmasked-padding"])
def test_roberta_explains_a_real_token_of_the_padding_id_where_the_model_places_it(name, row):
    """The position ids explain passes counted a token of id pad_token_id (1) that the mask calls real, so it and every
    later token sat one table row further than in the model's own forward (0.722 against model(ids, mask)'s 0.624)."""
    model = _bcos(name)
    assert model.config.pad_token_id == 1
    ids = torch.tensor([row])
    target = None if "Classification" in name else 4
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    own = out.logits[0] if target is None else out.last_hidden_state[0, 0]  # a base encoder: its first token
    # alone (with and without the mask), and in a batch whose other row is padded (on the right: the classifier reads
    # the first column)
    batch = torch.cat([ids, torch.tensor([[0, 9, 2, 1, 1]])])
    batch_mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    for explanation in (explain(model, ids, torch.ones_like(ids), target=target), explain(model, ids, target=target),
                        explain(model, batch, batch_mask, target=target)):
        chosen = int(explanation.target[0])
        assert float(explanation.explained[0]) == pytest.approx(float(own[chosen]), rel=1e-5, abs=1e-6)
        assert float(explanation.completeness_error[0]) < 1e-5


def test_a_space_model_over_roberta_places_a_real_token_of_the_padding_id_as_its_encoder_does():
    """The Space Model gives a registry encoder the position ids explain gives it: a RoBERTa encoder's real token of the
    padding id was counted there too (logit -0.131 against the head over the encoder's own forward, -0.235)."""
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins import SpaceModelForSequenceClassification

    torch.manual_seed(0)
    model = SpaceModelForSequenceClassification.from_encoder(T.RobertaModel(tiny_config("roberta")).eval(),
                                                             num_labels=2, n_latent=4).eval()
    ids = torch.tensor([[0, 5, 1, 7, 2], [0, 9, 2, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        for row in range(2):
            real = ids[row:row + 1, : int(mask[row].sum())]  # each row alone, as the encoder's own forward places it
            own = model.head(model.encoder(input_ids=real).last_hidden_state, torch.ones_like(real))[0]
            torch.testing.assert_close(got[row:row + 1], own, rtol=1e-5, atol=1e-6)
