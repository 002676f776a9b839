"""Trust pass 22, conversion and persistence under unusual configurations (``bcosify``, its report, the B-cos
classes it swaps in, ``save_pretrained`` / ``load_bcos_model`` round trips).

- An activation with a gate kind set by hand before ``bcosify`` (a ReLU in a SiLU Llama, the tanh GELU in a BERT,
  quick GELU in a GPT-2, a ReLU as ModernBERT's head activation) was rebuilt as the config's on load, since
  ``save_pretrained`` writes only the config's activation name: another model, logits 0.002-0.33 off, silently.
  ``bcosify`` records every detachable activation's kind in ``config.bcos["activations"]`` and the load refuses a
  rebuild that differs (the mechanism of trust pass 21's gate-branch record, one helper for both). The same for a
  norm's epsilon set by hand (``config.bcos["norm_eps"]``: 0.02 off on BERT).
- A module whose class ``bcosify`` swaps for a B-cos class restating the stock forward (a gated MLP, Gemma 2's
  norms, ModernBERT's attention, RoBERTa's classification head, BERT's masked-LM head) was swapped whatever its class:
  a subclass's own forward was dropped (an MLP scaling its output: 0.2 off), torch's ``nn.RMSNorm`` in a Gemma 2 got
  Gemma's ``1 + weight`` gain (2.8 off), silently; Llama's RMSNorm there failed at the first forward after conversion.
- The B-cos DistilBERT classifier ignored ``return_dict=False``: the output object came back, and unpacking it
  (``loss, logits = model(..., return_dict=False)``) gave the strings "loss" and "logits".
- ``load_bcos_model`` of a save whose LM head was tied to the embeddings by hand under ``tie_word_embeddings=False``
  (save_pretrained writes the shared tensor once) said "restore the folder from the original save_pretrained", which
  it was; ``tie_word_embeddings=True`` given to an untied save was refused with bcosify's fix for the model's config.
- torch's ``nn.RMSNorm(eps=None)`` was refused as "eps: must be a finite number > 0, got None" (it adds the machine
  epsilon); one without a gain failed with "'NoneType' object has no attribute 'shape'".
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import padded_batch
from test_conformance import B, _stock
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.bert.modeling_bert import BertLMPredictionHead
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
from transformers.models.roberta.modeling_roberta import RobertaClassificationHead

from bcos_plugins import UnsupportedModuleError, bcosify, explain, load_bcos_model
from bcos_plugins.errors import BcosKeywordError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _model_output(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _put(model, path, module):
    parent, _, attr = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)
    return module


# ------------------------------------------------------------------ activations set by hand: refused on load


_HAND_SET = [
    ("LlamaForCausalLM", "model.layers.0.mlp.act_fn", lambda: nn.ReLU(), "relu", "silu"),
    ("Qwen2ForSequenceClassification", "model.layers.1.mlp.act_fn", lambda: nn.GELU(), "gelu", "silu"),
    ("BertForSequenceClassification", "bert.encoder.layer.0.intermediate.intermediate_act_fn",
     lambda: nn.GELU(approximate="tanh"), "gelu_tanh", "gelu"),
    ("GPT2LMHeadModel", "transformer.h.1.mlp.act", lambda: ACT2FN["quick_gelu"], "quick_gelu", "gelu_tanh"),
    ("ModernBertForSequenceClassification", "head.act", lambda: nn.ReLU(), "relu", "gelu"),
    ("DistilBertModel", "transformer.layer.0.ffn.activation", lambda: nn.SiLU(), "silu", "gelu"),
    # an identity put in by hand: nothing to record at that path, the config rebuilds a GELU there
    ("RobertaModel", "encoder.layer.1.intermediate.intermediate_act_fn", lambda: nn.Identity(),
     "no detachable activation", "gelu"),
]


@pytest.mark.parametrize("name, path, make, hand, config", _HAND_SET, ids=[c[0] for c in _HAND_SET])
def test_an_activation_set_by_hand_is_refused_on_load_not_rebuilt_as_the_configs(tmp_path, name, path, make, hand,
                                                                                  config):
    stock = _stock(name)
    _put(stock, path, make())
    model = bcosify(stock, b=B, verbose=False)
    assert model.bcos_report.activations.get(path, "no detachable activation") == hand
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosValueError, match=rf"^config\.bcos\['activations'\]: .* was saved with activations \(gate "
                                             rf"kinds\) that its config does not rebuild \(1 differ: '{path}' saved as "
                                             rf"{hand}, rebuilt as {config}\): an activation set by hand"):
        load_bcos_model(tmp_path)


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "BertForMaskedLM", "Gemma2ForCausalLM"])
def test_config_built_activations_are_recorded_and_reload_bit_identical(tmp_path, name):
    model = bcosify(_stock(name), b=B, verbose=False)
    assert model.config.bcos["activations"] == model.bcos_report.activations and model.bcos_report.activations
    assert model.config.bcos["norm_eps"] and set(model.bcos_report.norms) <= set(model.config.bcos["norm_eps"])
    model.save_pretrained(tmp_path)
    loaded = load_bcos_model(tmp_path)
    assert loaded.config.bcos == model.config.bcos
    ids, mask = padded_batch()
    assert torch.equal(_model_output(loaded, ids, mask), _model_output(model, ids, mask))


def test_a_save_without_the_activation_and_epsilon_records_still_loads(tmp_path):
    """Saves made before the records cannot be checked: they load as before (the config's settings)."""
    model = bcosify(_stock("BertForSequenceClassification"), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["bcos"]["activations"], config["bcos"]["norm_eps"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    ids, mask = padded_batch()
    assert torch.equal(_model_output(load_bcos_model(tmp_path), ids, mask), _model_output(model, ids, mask))


def test_an_activation_keyword_of_the_load_is_refused_as_another_model(tmp_path):
    """Refused by name before the load (helper-172: every config keyword that changes the maths), and still a
    BcosValueError, which the rebuilt-activation check raised here before."""
    model = bcosify(_stock("BertForSequenceClassification"), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosValueError, match=r"^hidden_act: is 'relu', but .* was saved with hidden_act='gelu': the "
                                             r"saved weights would load into another model"):
        load_bcos_model(tmp_path, hidden_act="relu")
    config = json.loads((tmp_path / "config.json").read_text())
    config["hidden_act"] = "relu"  # the same change made in config.json: the rebuilt-activation check names it
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['activations'\]: .*saved as gelu, rebuilt as relu.*"
                                             r"or a config\.json edited"):
        load_bcos_model(tmp_path)


_HAND_EPS = [
    ("BertForSequenceClassification", "bert.encoder.layer.0.output.LayerNorm", "eps", "1e-12"),
    ("LlamaForCausalLM", "model.layers.1.post_attention_layernorm", "variance_epsilon", "1e-06"),
    ("Gemma2ForCausalLM", "model.norm", "eps", "1e-06"),
    ("GPT2Model", "ln_f", "eps", "1e-05"),  # a norm of the model itself (no parent module)
]


@pytest.mark.parametrize("name, path, attribute, config", _HAND_EPS, ids=[c[0] for c in _HAND_EPS])
def test_a_norm_epsilon_set_by_hand_is_refused_on_load_not_rebuilt_as_the_configs(tmp_path, name, path, attribute,
                                                                                   config):
    """bcosify builds each norm with the module's own epsilon; the reload took the config's (0.02 off on BERT)."""
    stock = _stock(name)
    setattr(stock.get_submodule(path), attribute, 0.5)
    model = bcosify(stock, b=B, verbose=False)
    assert model.config.bcos["norm_eps"][path] == 0.5
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosValueError, match=rf"^config\.bcos\['norm_eps'\]: .* was saved with norm epsilons that its "
                                             rf"config does not rebuild \(1 differ: '{path}' saved as 0\.5, rebuilt as "
                                             rf"{config}\): a norm epsilon set by hand.*layer_norm_eps / rms_norm_eps"):
        load_bcos_model(tmp_path)


def test_an_epsilon_keyword_of_the_load_is_refused_as_another_model(tmp_path):
    model = bcosify(_stock("BertForSequenceClassification"), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosValueError, match=r"^layer_norm_eps: is 0\.5, but .* was saved with layer_norm_eps=1e-12"):
        load_bcos_model(tmp_path, layer_norm_eps=0.5)
    config = json.loads((tmp_path / "config.json").read_text())
    config["layer_norm_eps"] = 0.5  # the same change made in config.json: the rebuilt-epsilon check names it
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BcosValueError, match=r"^config\.bcos\['norm_eps'\]: .*saved as 1e-12, rebuilt as 0\.5"):
        load_bcos_model(tmp_path)


@pytest.mark.parametrize("layers", [1, 3])
def test_a_layer_count_keyword_is_refused_by_the_weight_check_not_as_an_activation_rebuilt_otherwise(tmp_path, layers):
    """The activations of layers the keyword removed or added are no activation rebuilt otherwise: the weights name it."""
    model = bcosify(_stock("BertForSequenceClassification"), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    # the keyword itself is refused by name (helper-172); the layer count edited in config.json reaches the checks
    with pytest.raises(BcosKeywordError, match=rf"^num_hidden_layers: is {layers}, but .* was saved with "
                                               r"num_hidden_layers=2"):
        load_bcos_model(tmp_path, num_hidden_layers=layers)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BcosValueError, match=r"^path: .* does not match a B-cos BertForSequenceClassification: "
                                             + (r"missing \[\], unexpected \['bert\.encoder\.layer\.1\." if layers == 1
                                                else r"missing \['bert\.encoder\.layer\.2\.")):
        load_bcos_model(tmp_path)


# ------------------------------------------------------------------ modules of another class where bcosify swaps


class _ScaledMLP(LlamaMLP):
    def forward(self, x):
        return 2.0 * super().forward(x)


class _HalfHead(RobertaClassificationHead):
    def forward(self, features, **kwargs):
        return 0.5 * super().forward(features, **kwargs)


class _ShiftedMaskedLMHead(BertLMPredictionHead):
    def forward(self, hidden_states):
        return super().forward(hidden_states) + 1.0


_FOREIGN = [
    ("LlamaForCausalLM", "model.layers.0.mlp", lambda m: _ScaledMLP(m.config), "BcosGatedMLP"),
    ("Gemma2ForCausalLM", "model.norm", lambda m: nn.RMSNorm(32, eps=1e-6), "BcosGemmaRMSNorm"),
    ("Gemma2Model", "layers.1.post_feedforward_layernorm", lambda m: LlamaRMSNorm(32), "BcosGemmaRMSNorm"),
    ("RobertaForSequenceClassification", "classifier", lambda m: _HalfHead(m.config), "BcosRobertaClassificationHead"),
    ("BertForMaskedLM", "cls.predictions", lambda m: _ShiftedMaskedLMHead(m.config), "BcosBertLMPredictionHead"),
]


@pytest.mark.parametrize("name, path, make, swapped", _FOREIGN, ids=[f"{c[0]}-{c[1]}" for c in _FOREIGN])
def test_a_module_of_another_class_where_bcosify_swaps_in_a_bcos_forward_is_refused_naming_it(name, path, make,
                                                                                             swapped):
    model = _stock(name)
    module = _put(model, path, make(model))
    if name == "BertForMaskedLM":
        model.tie_weights()
    with pytest.raises(UnsupportedModuleError, match=rf"^model: bcosify cannot convert module '{path}' of class "
                                                     rf".*{type(module).__qualname__}: it swaps in a B-cos forward "
                                                     rf"\({swapped}\) written for the {name} family's own class"):
        bcosify(model, b=B, verbose=False)
    assert model.get_submodule(path) is module and type(module).__module__ != "bcos_plugins.convert.bcosify"
    assert not hasattr(model.config, "bcos")


class _HalvedHead(nn.Linear):
    def forward(self, x):
        return 0.5 * super().forward(x)


def test_a_soft_capped_head_of_a_linear_subclass_still_converts_and_runs_its_own_forward():
    """The soft-capped head calls the head's own forward and caps its output: any class is right there."""
    stock = _stock("Gemma2ForCausalLM", tie_word_embeddings=False)
    head = _put(stock, "lm_head", _HalvedHead(32, stock.config.vocab_size, bias=False))
    with torch.no_grad():
        head.weight.normal_()
    model = bcosify(stock, b=B, verbose=False)
    ids, mask = padded_batch()
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        raw = 0.5 * torch.nn.functional.linear(hidden, model.lm_head.weight)
    cap = model.config.final_logit_softcapping
    torch.testing.assert_close(_model_output(model, ids, mask), cap * torch.tanh(raw / cap), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ B-cos DistilBERT classifier: return_dict=False


@pytest.mark.parametrize("where", ["call", "config"])
def test_the_bcos_distilbert_classifier_returns_transformers_tuple_for_return_dict_false(where):
    stock = _stock("DistilBertForSequenceClassification")
    model = bcosify(_stock("DistilBertForSequenceClassification"), b=B, verbose=False)
    ids, mask = padded_batch()
    labels = torch.tensor([0, 1, 2])
    kwargs = dict(input_ids=ids, attention_mask=mask, labels=labels)
    if where == "call":
        kwargs["return_dict"] = False
    else:
        stock.config.return_dict = model.config.return_dict = False
    expected, got = stock(**kwargs), model(**kwargs)
    assert isinstance(expected, tuple) and isinstance(got, tuple) and len(got) == len(expected) == 2
    loss, logits = got
    assert isinstance(loss, torch.Tensor) and logits.shape == (3, 3)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, labels))


# ------------------------------------------------------------------ the LM head's tying on load


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "BertForMaskedLM"])
def test_a_head_tied_by_hand_under_an_untied_config_is_refused_naming_the_keyword_that_loads_it(tmp_path, name):
    stock = _stock(name, tie_word_embeddings=False)
    stock.get_output_embeddings().weight = stock.get_input_embeddings().weight
    model = bcosify(stock, b=B, verbose=False)
    model.save_pretrained(tmp_path)
    head = "lm_head" if name.startswith("Llama") else r"cls\.predictions\.decoder"
    with pytest.raises(BcosValueError, match=rf"^path: .* holds no weights for the LM head \('{head}\.weight'\) while "
                                             r"its config\.json says tie_word_embeddings=False.*Load it with "
                                             r"load_bcos_model\(path, tie_word_embeddings=True\)"):
        load_bcos_model(tmp_path)
    loaded = load_bcos_model(tmp_path, tie_word_embeddings=True)
    ids, mask = padded_batch()
    assert torch.equal(_model_output(loaded, ids, mask), _model_output(model, ids, mask))


def test_tie_word_embeddings_given_to_a_save_with_its_own_head_is_refused_by_name(tmp_path):
    model = bcosify(_stock("LlamaForCausalLM", tie_word_embeddings=False), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosKeywordError, match=r"^tie_word_embeddings: is True, but .* was saved with an LM head of "
                                               r"its own \('lm_head\.weight'.*leave tie_word_embeddings out"):
        load_bcos_model(tmp_path, tie_word_embeddings=True)
    load_bcos_model(tmp_path, tie_word_embeddings=False)  # the saved setting: loads


# ------------------------------------------------------------------ torch's nn.RMSNorm put in by hand


def test_a_torch_rms_norm_without_eps_converts_with_the_epsilon_it_adds():
    stock = _stock("LlamaForCausalLM")
    norm = _put(stock, "model.norm", nn.RMSNorm(32))
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 32) * 1e-3  # small enough for the epsilon to matter
    with torch.no_grad():
        expected = norm(x)
    model = bcosify(stock, b=B, verbose=False)
    with torch.no_grad():
        torch.testing.assert_close(model.model.norm(x), expected, rtol=1e-6, atol=0)
    explanation = explain(model, *padded_batch(), target=5, position=-1)
    assert (explanation.delta.abs() <= 1e-4 * explanation.explained.abs().clamp_min(1e-2)).all()


def test_a_torch_rms_norm_without_a_gain_is_refused_naming_it():
    stock = _stock("LlamaForCausalLM")
    _put(stock, "model.layers.1.input_layernorm", nn.RMSNorm(32, elementwise_affine=False))
    with pytest.raises(UnsupportedModuleError, match=r"^model: bcosify cannot convert module "
                                                     r"'model\.layers\.1\.input_layernorm' \(RMSNorm\): an RMSNorm "
                                                     r"without a gain.*elementwise_affine=True"):
        bcosify(stock, b=B, verbose=False)


# ------------------------------------------------------------------ wrappers whose forward bcosify has not read


class _LowRankAdapter(nn.Module):
    """A LoRA-like wrapper: the base projection plus a low-rank update (peft's ``lora.Linear`` in shape)."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, 4, bias=False)
        self.lora_B = nn.Linear(4, base.out_features, bias=False)
        nn.init.normal_(self.lora_B.weight, std=0.1)

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


_WRAPPED = [
    ("LlamaForCausalLM", "model.layers.0.self_attn.k_proj", "at this path LlamaForCausalLM holds a linear projection "
                                                            "whose outputs"),
    ("BertForSequenceClassification", "bert.encoder.layer.1.attention.self.query", "at this path "
                                                                                   "BertForSequenceClassification"),
    ("ModernBertModel", "layers.0.mlp.Wi", r"at this path ModernBertModel holds a linear projection whose outputs "
                                           r"\(queries and keys, or a gated MLP's activated units\)"),
    ("Qwen2ForCausalLM", "model.layers.1.self_attn.v_proj", "it holds other modules, and its forward, which bcosify "
                                                            "has not read"),
]


@pytest.mark.parametrize("name, path, why", _WRAPPED, ids=[f"{c[0]}-{c[1]}" for c in _WRAPPED])
def test_a_wrapper_whose_forward_bcosify_has_not_read_is_refused_naming_it(name, path, why):
    """At a query/key path the wrapped projection was converted without constant outputs (the report named none), so
    ``explain`` refused the model as "not exact" naming no module; elsewhere the wrapper's forward stayed unread."""
    model = _stock(name)
    _put(model, path, _LowRankAdapter(model.get_submodule(path)))
    with pytest.raises(UnsupportedModuleError, match=rf"^model: bcosify cannot convert module '{path}' of class "
                                                     rf".*_LowRankAdapter: {why}.*merge_and_unload"):
        bcosify(model, b=B, verbose=False)
    assert not hasattr(model.config, "bcos")


def test_dynamic_linear_copy_refuses_a_wrapped_query_projection():
    """Its query output would not be held constant, so the copy's token shares took in the attention pattern's
    gradient, and its delta was no longer the biases' share alone, without a word."""
    from bcos_plugins.convert import dynamic_linear_copy

    model = _stock("BertModel")
    _put(model, "encoder.layer.0.attention.self.query",
         _LowRankAdapter(model.get_submodule("encoder.layer.0.attention.self.query")))
    with pytest.raises(UnsupportedModuleError, match=r"^model: dynamic_linear_copy cannot convert module "
                                                     r"'encoder\.layer\.0\.attention\.self\.query'"):
        dynamic_linear_copy(model)


def test_a_torch_sequential_of_supported_layers_still_converts_and_explains_exactly():
    stock = _stock("BertForSequenceClassification")
    _put(stock, "classifier", nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3)))
    model = bcosify(stock, b=B, verbose=False)
    assert {"classifier.0", "classifier.2"} <= set(model.bcos_report.bcos_layers)
    explanation = explain(model, *padded_batch())
    assert (explanation.delta.abs() <= 1e-4 * explanation.explained.abs().clamp_min(1e-2)).all()
