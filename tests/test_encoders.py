"""bcosify + explain on BERT, DistilBERT and RoBERTa (base and classifier): completeness, padding,
round trips, reports and errors."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import padded_batch, tiny_model

from bcos_plugins import (
    UnsupportedModuleError,
    bcosify,
    explain,
    explanation_mode,
    load_bcos_model,
    supported_architectures,
)
from bcos_plugins.attribution import Direction
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosLayerNorm, BcosLinear

CLASSIFIERS = ["BertForSequenceClassification", "DistilBertForSequenceClassification",
               "RobertaForSequenceClassification"]
BASES = ["BertModel", "DistilBertModel", "RobertaModel"]
B_VALUES = [1.0, 1.25, 1.5, 2.0, 2.5]


def _pad_id(name: str) -> int:
    return 1 if name.startswith("Roberta") else 0


def _assert_complete(expl, rtol=1e-4):
    err = expl.completeness_error
    assert torch.isfinite(expl.input_contributions).all()
    assert (err <= rtol).all(), f"completeness error {err.tolist()} for logits {expl.logits.tolist()}"


@pytest.mark.parametrize("name", CLASSIFIERS)
@pytest.mark.parametrize("b", B_VALUES)
def test_classifier_completeness_with_padding(name, b):
    model = bcosify(tiny_model(name), b=b, verbose=False)
    ids, mask = padded_batch(pad_id=_pad_id(name))
    expl = explain(model, ids, mask)
    _assert_complete(expl)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(expl.logits, logits.max(-1).values)
    assert (expl.contributions[mask == 0] == 0).all(), "padding must get exactly zero contribution"
    for target in range(3):  # every class, not only the predicted one
        _assert_complete(explain(model, ids, mask, target=target))


@pytest.mark.parametrize("name", BASES)
@pytest.mark.parametrize("b", [1.0, 1.5, 2.25])
def test_base_model_completeness(name, b):
    model = bcosify(tiny_model(name), b=b, verbose=False)
    ids, mask = padded_batch(pad_id=_pad_id(name))
    _assert_complete(explain(model, ids, mask, target=5))
    direction = torch.randn(32)
    _assert_complete(explain(model, ids, mask, target=Direction(direction), position=2))


def test_contrastive_and_mean_reduction():
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    ids, mask = padded_batch()
    e = explain(model, ids, mask, target=0, foil=2, reduce="mean")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(e.logits, logits[:, 0] - logits[:, 2])
    _assert_complete(e)
    torch.testing.assert_close(e.contributions * 32, e.input_contributions.sum(-1))


def test_batched_equals_single_rows():
    model = bcosify(tiny_model("RobertaForSequenceClassification"), b=1.5, verbose=False)
    ids, mask = padded_batch(pad_id=1)
    full = explain(model, ids, mask, target=1)
    for row in range(ids.shape[0]):
        n = int(mask[row].sum())
        single = explain(model, ids[row : row + 1, :n], mask[row : row + 1, :n], target=1)
        torch.testing.assert_close(single.contributions[0], full.contributions[row, :n], rtol=1e-5, atol=1e-6)


def test_token_type_embeddings_are_part_of_the_attribution_point():
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)
    ids, mask = padded_batch()
    tt = torch.zeros_like(ids)
    tt[:, 4:] = 1
    _assert_complete(explain(model, ids, mask, token_type_ids=tt))


def test_stock_model_is_plain_input_x_gradient_and_not_complete():
    """On a conventional model the same call is the W(x)x baseline; it does not sum to the logit."""
    model = tiny_model("BertForSequenceClassification")
    ids, mask = padded_batch()
    e = explain(model, ids, mask, target=0)
    assert (e.completeness_error > 1e-3).any()


def test_forward_identical_in_and_out_of_explanation_mode():
    model = bcosify(tiny_model("DistilBertForSequenceClassification"), b=1.5, verbose=False)
    ids, mask = padded_batch()
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).logits
        with explanation_mode(model):
            b = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_zero_and_padded_inputs_are_finite(name):
    model = bcosify(tiny_model(name), b=1.5, verbose=False)
    ids, mask = padded_batch(pad_id=_pad_id(name))
    mask[2, 1:] = 0  # a row with a single real token
    e = explain(model, ids, mask)
    assert torch.isfinite(e.input_contributions).all() and torch.isfinite(e.logits).all()
    with torch.no_grad():  # all-zero word embeddings (a zeroed vocabulary)
        emb = model.base_model.embeddings.word_embeddings.weight
        emb.zero_()
        if hasattr(model.base_model.embeddings, "position_embeddings"):
            model.base_model.embeddings.position_embeddings.weight.zero_()
    e = explain(model, ids, mask)
    assert torch.isfinite(e.input_contributions).all() and torch.isfinite(e.logits).all()


@pytest.mark.parametrize("name", CLASSIFIERS + ["BertModel"])
def test_save_load_round_trip(name, tmp_path):
    model = bcosify(tiny_model(name), b=1.25, verbose=False)
    ids, mask = padded_batch(pad_id=_pad_id(name))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = load_bcos_model(tmp_path)
    kw = {} if name.endswith("Classification") else {"target": 3}
    a, b = explain(model, ids, mask, **kw), explain(loaded, ids, mask, **kw)
    assert torch.equal(a.logits, b.logits)
    assert torch.equal(a.input_contributions, b.input_contributions)
    assert loaded.config.bcos == model.config.bcos


def test_load_rejects_stock_checkpoint(tmp_path):
    tiny_model("BertModel").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no B-cos settings"):
        load_bcos_model(tmp_path)


def test_report_lists_every_dropped_bias_and_change():
    stock = tiny_model("BertForSequenceClassification")
    expected_biases = {n for n, _ in stock.named_parameters() if n.endswith(".bias")}
    model = bcosify(stock, b=1.5, verbose=False)
    report = model.bcos_report
    assert set(report.dropped_biases) == expected_biases
    assert not any(n.endswith(".bias") for n, _ in model.named_parameters())
    assert "bert.pooler.activation (Tanh)" in report.removed_activations
    assert "bert.encoder.layer.0.attention.self.query" in report.constant_outputs
    assert set(report.activations.values()) == {"gelu"}
    assert isinstance(model.classifier, BcosLinear) and isinstance(model.bert.embeddings.LayerNorm, BcosLayerNorm)
    assert "biases dropped" in report.summary() and model.config.bcos["b"] == 1.5


def test_roberta_and_distilbert_heads_lose_their_activations():
    rob = bcosify(tiny_model("RobertaForSequenceClassification"), b=1.5, verbose=False)
    assert "classifier" in rob.bcos_report.patched_modules
    dis = bcosify(tiny_model("DistilBertForSequenceClassification"), b=1.5, verbose=False)
    assert "<model>" in dis.bcos_report.patched_modules
    ids, mask = padded_batch()
    x = torch.randn(3, 32)
    with torch.no_grad():  # the head is dense -> out_proj with nothing in between
        torch.testing.assert_close(rob.classifier(x[:, None, :]), rob.classifier.out_proj(rob.classifier.dense(x)))
        out = dis(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 2]))
    assert out.loss is not None and torch.isfinite(out.loss)


def test_unsupported_model_class_raises_with_supported_list():
    cfg = T.AlbertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, embedding_size=8)
    with pytest.raises(TypeError, match="AlbertModel is not supported.*BertModel"):
        bcosify(T.AlbertModel(cfg))
    assert "BertForSequenceClassification" in supported_architectures()


def test_unsupported_module_raises_with_path_and_class():
    model = tiny_model("BertModel")
    model.encoder.layer[1].intermediate.intermediate_act_fn = torch.nn.Tanh()
    with pytest.raises(UnsupportedModuleError, match=r"'encoder\.layer\.1\.intermediate\.intermediate_act_fn'.*Tanh"):
        bcosify(model)
    assert not hasattr(model, "bcos_report")
    assert isinstance(model.encoder.layer[0].attention.self.query, torch.nn.Linear), "model must stay untouched"


def test_bad_b_and_double_conversion_rejected():
    with pytest.raises(ValueError, match="b must be >= 1"):
        bcosify(tiny_model("BertModel"), b=0.9)
    model = bcosify(tiny_model("BertModel"), verbose=False)
    with pytest.raises(ValueError, match="already B-cosified"):
        bcosify(model)


def test_explain_input_errors():
    model = bcosify(tiny_model("BertForSequenceClassification"), verbose=False)
    ids, mask = padded_batch()
    with pytest.raises(BcosValueError, match=r"target: ids must lie in \[0, 3\)"):
        explain(model, ids, mask, target=7)
    with pytest.raises(BcosValueError, match="attention_mask: shape"):
        explain(model, ids, mask[:, :3])
    with pytest.raises(BcosValueError, match="reduce: must be"):
        explain(model, ids, mask, reduce="max")
    with pytest.raises(BcosTypeError, match="input_ids: token ids must be integers"):
        explain(model, ids.float(), mask)
    with pytest.raises(BcosValueError, match="target: expected an int or one id per row"):
        explain(model, ids, mask, target=torch.tensor([0, 1]))
    with pytest.raises(BcosTypeError, match=r"target: got a float.*Direction\(vector\)"):
        explain(model, ids, mask, target=torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(BcosValueError, match="position: a sequence classifier"):
        explain(model, ids, mask, position=0)
    base = bcosify(tiny_model("BertModel"), verbose=False)
    with pytest.raises(BcosValueError, match="target: required"):
        explain(base, ids, mask)
    with pytest.raises(BcosValueError, match="target: Direction has 5 entries"):
        explain(base, ids, mask, target=Direction(torch.randn(5)))

