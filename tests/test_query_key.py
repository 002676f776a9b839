"""``bcosify(..., bcos_query_key=False)``: query/key projections kept as the stock affine maps.

Completeness on every supported family (BERT, DistilBERT, RoBERTa, GPT-2, Llama), with the query/key biases
set to non-zero values first (the stock initialisation zeroes them, which would hide a bias leaking into the
explanation); the kept weights and biases are the stock ones; values, attention output, MLP and norms are still
B-cos; the outputs of query and key are constants in explanation mode; save / load round trips; errors.
"""

from __future__ import annotations

import pytest
import torch
from conftest import padded_batch, tiny_model

from bcos_plugins import bcosify, explain, explanation_mode, load_bcos_model
from bcos_plugins.convert.query_key import ConstantQueryKeyProjection, StockQueryKeyConv1D
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosConv1D, BcosLinear

ENCODERS = ["BertForSequenceClassification", "DistilBertForSequenceClassification",
            "RobertaForSequenceClassification", "BertModel"]
DECODERS = ["GPT2LMHeadModel", "LlamaForCausalLM", "GPT2ForSequenceClassification", "LlamaForSequenceClassification"]
QUERY_KEY_SUFFIXES = ("self.query", "self.key", "q_lin", "k_lin", "q_proj", "k_proj")


def _stock(name: str):
    """A tiny stock model whose query/key maps have non-zero biases (Llama gets attention biases)."""
    if name.startswith("Llama"):
        import transformers as T
        from conftest import tiny_config

        config = tiny_config("llama")
        config.attention_bias = True
        torch.manual_seed(0)
        model = getattr(T, name)(config).eval()
    else:
        model = tiny_model(name)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g))
    return model


def _query_keys(model):
    return {n: m for n, m in model.named_modules() if n.endswith(QUERY_KEY_SUFFIXES) or n.endswith("attn.c_attn")}


def _kwargs(name: str, batch: int = 3) -> dict:
    if "Sequence" in name:
        return {}
    return {"target": torch.tensor([5, 17, 42][:batch])} if name.startswith(("GPT2", "Llama")) else {"target": 3}


def _batch(name: str):
    return padded_batch(pad_id=1 if name.startswith("Roberta") else 0,
                        side="left" if name.startswith(("GPT2", "Llama")) else "right")


def _assert_complete(expl, rtol=1e-4):
    err = expl.completeness_error
    assert torch.isfinite(expl.input_contributions).all()
    assert (err <= rtol).all(), f"completeness error {err.tolist()} for logits {expl.logits.tolist()}"


@pytest.mark.parametrize("name", ENCODERS + DECODERS)
@pytest.mark.parametrize("b", [1.0, 1.25, 2.0])
def test_stock_query_key_explanations_are_complete(name, b):
    stock = _stock(name)
    expected = {n: {k: v.clone() for k, v in m.state_dict().items()} for n, m in _query_keys(stock).items()}
    assert all("bias" in state and state["bias"].abs().sum() > 0 for state in expected.values())
    model = bcosify(stock, b=b, bcos_query_key=False, verbose=False)
    ids, mask = _batch(name)
    expl = explain(model, ids, mask, **_kwargs(name))
    _assert_complete(expl)
    if "Sequence" in name:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        for target in range(logits.shape[-1]):  # every class, not only the predicted one
            _assert_complete(explain(model, ids, mask, target=target))
    for module_name, module in _query_keys(model).items():
        state = module.state_dict()
        for key, value in expected[module_name].items():
            assert torch.equal(state[key], value), f"{module_name}.{key} changed"
        if module_name.endswith("c_attn"):
            assert isinstance(module, StockQueryKeyConv1D) and not isinstance(module, BcosConv1D)
        else:
            assert isinstance(module, ConstantQueryKeyProjection) and not isinstance(module, BcosLinear)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2LMHeadModel", "LlamaForCausalLM"])
def test_everything_but_query_key_is_converted_as_before(name):
    """The option changes the query/key maps only: the other layers, biases and report entries are the same."""
    default = bcosify(_stock(name), b=1.25, verbose=False)
    stock_qk = bcosify(_stock(name), b=1.25, bcos_query_key=False, verbose=False)
    qk = set(_query_keys(default))
    kinds = {n: type(m) for n, m in default.named_modules() if n not in qk}
    assert kinds == {n: type(m) for n, m in stock_qk.named_modules() if n not in qk}
    report, kept = default.bcos_report, stock_qk.bcos_report
    assert kept.constant_outputs == report.constant_outputs
    assert set(kept.kept) - set(report.kept) == qk
    assert all("bcos_query_key=False" in kept.kept[n] for n in qk)
    not_qk_biases = {n for n in report.dropped_biases if n.rpartition(".")[0] not in qk}
    assert not_qk_biases <= set(kept.dropped_biases)
    kept_params = {n for n, _ in stock_qk.named_parameters() if n.endswith(".bias")}
    assert kept_params == {f"{n}.bias" for n in qk}
    assert "kept stock" in kept.summary() and "kept stock" not in report.summary()
    assert stock_qk.config.bcos["query_key"] == "stock" and stock_qk.config.bcos["format_version"] == 3
    assert "query_key" not in default.config.bcos and default.config.bcos["format_version"] == 2


def test_gpt2_fused_projection_keeps_stock_query_key_and_bcos_values():
    stock = _stock("GPT2Model")
    conv = stock.h[0].attn.c_attn
    x = torch.randn(4, 32)
    with torch.no_grad():
        reference = conv(x)
    layer = bcosify(stock, b=1.25, bcos_query_key=False, verbose=False).h[0].attn.c_attn
    with torch.no_grad():
        out = layer(x)
        default = bcosify(_stock("GPT2Model"), b=1.25, verbose=False).h[0].attn.c_attn(x)
    torch.testing.assert_close(out[:, :64], reference[:, :64])  # query | key: the stock affine map
    torch.testing.assert_close(out[:, 64:], default[:, 64:])  # values: the B-cos units, no bias
    x.requires_grad_()
    with explanation_mode(layer):
        out = layer(x)
    for third, expect_grad in ((0, False), (1, False), (2, True)):
        part = out[:, third * 32 : (third + 1) * 32].sum()
        (grad,) = torch.autograd.grad(part, x, retain_graph=True, allow_unused=True)
        assert (grad is not None and bool((grad != 0).any())) == expect_grad, f"third {third} of c_attn"


def test_stock_query_key_outputs_are_constants_only_in_explanation_mode():
    model = bcosify(_stock("BertModel"), b=1.25, bcos_query_key=False, verbose=False)
    query = model.encoder.layer[0].attention.self.query
    x = torch.randn(2, 32, requires_grad=True)
    assert query(x).requires_grad, "training must reach the query/key weights"
    with explanation_mode(model):
        out = query(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, torch.nn.functional.linear(x, query.weight, query.bias))


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "DistilBertForSequenceClassification",
                                  "GPT2LMHeadModel", "LlamaForCausalLM"])
def test_stock_query_key_save_load_round_trip(name, tmp_path):
    model = bcosify(_stock(name), b=1.25, bcos_query_key=False, verbose=False)
    ids, mask = _batch(name)
    before = explain(model, ids, mask, **_kwargs(name))
    model.save_pretrained(tmp_path)
    loaded = load_bcos_model(tmp_path)
    assert loaded.config.bcos == model.config.bcos
    after = explain(loaded, ids, mask, **_kwargs(name))
    assert torch.equal(after.logits, before.logits)
    assert torch.equal(after.input_contributions, before.input_contributions)


def test_query_key_setting_tampered_in_config_is_refused(tmp_path):
    import json

    bcosify(_stock("BertModel"), b=1.25, bcos_query_key=False, verbose=False).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["bcos"]["query_key"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['query_key'\]: .* says None with format 3"):
        load_bcos_model(tmp_path)


def test_bcos_query_key_must_be_a_bool():
    with pytest.raises(BcosTypeError, match=r"^bcos_query_key: must be True or False, got str 'no'\. Pass True \(B-cos "
                                            r"query/key layers\) or False \(keep the pretrained query/key maps\)\.$"):
        bcosify(tiny_model("BertModel"), bcos_query_key="no", verbose=False)


def test_recipes_carry_the_query_key_setting(tmp_path):
    """B-cos then task keeps stock query/key from the masked LM into the classifier; task then B-cos converts
    with the setting; conflicting or non-bool settings are refused before any training."""
    from test_pretrain import QUIET, assert_complete, corpus, word_tokenizer

    from bcos_plugins.pretrain import classifier_from_masked_lm, fine_tune_task_then_bcos, pretrain_masked_lm

    tok = word_tokenizer()
    texts, labels = corpus(16)
    trainer = pretrain_masked_lm(_stock("BertForMaskedLM"), tok, texts, b=1.25, bcos_query_key=False, epochs=1,
                                 batch_size=8, learning_rate=1e-3, max_length=16, **QUIET)
    mlm = trainer.model
    assert mlm.config.bcos["query_key"] == "stock"
    trainer.save_model(str(tmp_path / "mlm"))
    classifier = classifier_from_masked_lm(tmp_path / "mlm", num_labels=2)
    query = classifier.bert.encoder.layer[0].attention.self.query
    assert isinstance(query, ConstantQueryKeyProjection)
    torch.testing.assert_close(query.bias, mlm.bert.encoder.layer[0].attention.self.query.bias)
    assert_complete(classifier)
    with pytest.raises(BcosValueError, match=r"^bcos_query_key: is True but the model is already B-cos with "
                                             r"bcos_query_key=False"):
        pretrain_masked_lm(mlm, tok, texts, bcos_query_key=True, **QUIET)
    with pytest.raises(BcosTypeError, match=r"^bcos_query_key: must be True, False or None, got int 1"):
        pretrain_masked_lm(_stock("BertForMaskedLM"), tok, texts, bcos_query_key=1, **QUIET)

    model = _stock("BertForSequenceClassification")
    with pytest.raises(BcosTypeError, match=r"^bcos_query_key: must be True or False, got None"):
        fine_tune_task_then_bcos(model, tok, texts, [y % 3 for y in labels], bcos_query_key=None, **QUIET)
    fine_tune_task_then_bcos(model, tok, texts, labels, bcos_query_key=False, task_epochs=1, epochs=1,
                             batch_size=8, learning_rate=1e-3, max_length=16, **QUIET)
    assert model.config.bcos["query_key"] == "stock"
    assert isinstance(model.bert.encoder.layer[1].attention.self.key, ConstantQueryKeyProjection)
    assert_complete(model)
