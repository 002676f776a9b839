"""Trust pass 20, conversion and the architecture registry (``bcosify``, its report, ``save_pretrained`` /
``load_bcos_model`` round trips) on unusual configurations and models.

- Gemma 2's final-logit soft-cap was copied into the B-cos LM head once, at conversion: a later edit of
  ``model.config.final_logit_softcapping`` (which the stock model follows at its next call) was ignored by the
  converted model, but ``save_pretrained`` wrote it and ``load_bcos_model`` applied it, so the reloaded model computed
  other logits than the one saved, silently. The head now reads the cap from the model's own config at each call.
- Hooks registered on a module ``bcosify`` replaces (a projection, a norm, an activation, a removed pooler tanh) were
  dropped with it: a probe stopped recording and an intervention stopped applying, without a word. Now refused before
  the model is touched, naming each module and hook; hooks on the modules whose class is swapped stay and run.
- A frozen parameter (``requires_grad=False``, e.g. an encoder frozen to train the head alone) came back trainable in
  every B-cos layer and norm: each new parameter now takes the flag of the one it is built from.
- A module held at two places (a projection shared by two layers) was converted at its first path only: the second
  kept the stock module, bias included, so the forward mixed B-cos and stock layers and ``explain`` refused it saying
  only that some module was not exact; the report did not name it. Now converted once and put at every path (still
  shared); one held where two different conversions would apply is refused naming both paths.
- The report said "LM head tied to the input embeddings" of every GPT-2 / BERT masked-LM / Gemma 2 head, untied ones
  too: it now says which.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import padded_batch
from test_conformance import B, _stock

from bcos_plugins import UnsupportedModuleError, bcosify, explain, load_bcos_model
from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


# ------------------------------------------------------------------ Gemma 2's soft-cap follows the model's config


@pytest.mark.parametrize("cap", [None, 2.0])
def test_a_soft_cap_set_on_the_config_after_conversion_is_the_one_run_saved_and_reloaded(tmp_path, cap):
    ids, mask = padded_batch()
    stock = _stock("Gemma2ForCausalLM")
    stock_before_edit = _logits(stock, ids, mask)
    stock.config.final_logit_softcapping = cap
    stock_after_edit = _logits(stock, ids, mask)
    model = bcosify(_stock("Gemma2ForCausalLM"), b=B, verbose=False)
    assert model.lm_head.soft_cap == 0.5  # the suite's config
    model.config.final_logit_softcapping = cap
    logits = _logits(model, ids, mask)
    with torch.no_grad():
        raw = torch.nn.functional.linear(model.model(input_ids=ids, attention_mask=mask).last_hidden_state,
                                         model.lm_head.weight)
    expected = raw if cap is None else cap * torch.tanh(raw / cap)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(stock_after_edit, stock_before_edit)  # the stock model follows the edit as well
    explanation = explain(model, ids, mask, target=5, position=-1)
    assert explanation.delta.abs().max() < 1e-4 * explanation.explained.abs().max()
    model.save_pretrained(tmp_path)
    loaded = load_bcos_model(tmp_path)
    assert loaded.lm_head.soft_cap == cap
    torch.testing.assert_close(_logits(loaded, ids, mask), logits, rtol=0, atol=0)


def test_a_soft_capped_head_reads_the_converted_models_own_config_not_the_shared_stock_one():
    """bcosify gives the model its own copy of its config; the head reads that copy, so a stock model built from the
    same config object and edited later does not change the converted one."""
    stock = _stock("Gemma2ForCausalLM")
    shared = stock.config
    model = bcosify(stock, b=B, verbose=False)
    shared.final_logit_softcapping = 3.0
    assert model.config is not shared and model.lm_head.soft_cap == 0.5


# ------------------------------------------------------------------ hooks on modules bcosify replaces


_REPLACED = [
    ("BertForSequenceClassification", "bert.encoder.layer.0.attention.output.dense"),  # nn.Linear -> BcosLinear
    ("BertForSequenceClassification", "bert.pooler.activation"),  # the pooler's tanh, removed
    ("GPT2LMHeadModel", "transformer.h.1.ln_2"),  # LayerNorm -> BcosLayerNorm
    ("GPT2LMHeadModel", "transformer.h.0.attn.c_attn"),  # Conv1D, query/key outputs constant
    ("LlamaForCausalLM", "model.layers.0.mlp.act_fn"),  # SiLU -> DetachableActivation
    ("LlamaForCausalLM", "model.norm"),  # RMSNorm -> DetachableRMSNorm
    ("ModernBertForSequenceClassification", "model.layers.1.mlp.Wi"),
]


def _register(module, kind):
    if kind == "forward":
        return module.register_forward_hook(lambda m, args, out: out)
    if kind == "forward_pre":
        return module.register_forward_pre_hook(lambda m, args: None)
    return module.register_full_backward_hook(lambda m, grad_in, grad_out: None)


@pytest.mark.parametrize("name, path", _REPLACED)
@pytest.mark.parametrize("kind", ["forward", "forward_pre", "full_backward"])
def test_a_hook_on_a_module_bcosify_replaces_is_refused_before_anything_is_touched(name, path, kind):
    model = _stock(name)
    module = model.get_submodule(path)
    handle = _register(module, kind)
    with pytest.raises(BcosValueError, match=rf"model: holds hooks on 1 module.*'{path}' \({type(module).__name__}: "
                                             r".*hook.*Remove them \(handle\.remove\(\)\)"):
        bcosify(model, b=B, verbose=False)
    assert model.get_submodule(path) is module and not hasattr(model.config, "bcos")  # untouched
    handle.remove()
    converted = bcosify(model, b=B, verbose=False)
    assert converted.get_submodule(path) is not module


@pytest.mark.parametrize("name, path", [("LlamaForCausalLM", "model.layers.0.mlp"),
                                        ("LlamaForCausalLM", "model.layers.1.self_attn.q_proj"),
                                        ("RobertaForSequenceClassification", "classifier"),
                                        ("Gemma2ForCausalLM", "lm_head")])
def test_a_hook_on_a_module_whose_class_bcosify_swaps_stays_and_runs(name, path):
    """Swapped-class modules (gated MLPs, stock query/key projections, heads) are the same objects after conversion:
    their hooks are kept, so they are not refused."""
    model = _stock(name)
    calls = []
    model.get_submodule(path).register_forward_hook(lambda m, args, out: calls.append(type(m).__name__))
    bcosify(model, b=B, bcos_query_key=False, verbose=False)
    ids, mask = padded_batch()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert calls and calls[0].startswith("Bcos")


# ------------------------------------------------------------------ frozen parameters stay frozen


@pytest.mark.parametrize("name, query_key", [("BertForSequenceClassification", True), ("GPT2LMHeadModel", False),
                                             ("LlamaForCausalLM", True), ("Gemma2ForSequenceClassification", True),
                                             ("ModernBertForSequenceClassification", True)])
def test_parameters_frozen_before_conversion_stay_frozen(name, query_key):
    model = _stock(name)
    head = {"BertForSequenceClassification": "classifier.", "GPT2LMHeadModel": "transformer.h.1.",
            "LlamaForCausalLM": "model.layers.1.", "Gemma2ForSequenceClassification": "score.",
            "ModernBertForSequenceClassification": "classifier."}[name]
    for param_name, param in model.named_parameters():
        param.requires_grad_(param_name.startswith(head))
    bcosify(model, b=B, bcos_query_key=query_key, verbose=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters() if n.startswith(head)}, sorted(trainable)[:5]


# ------------------------------------------------------------------ a module held at two paths


def test_a_projection_shared_by_two_layers_is_converted_at_both_and_stays_shared():
    model = _stock("BertForSequenceClassification")
    layers = model.bert.encoder.layer
    layers[1].output.dense = layers[0].output.dense
    layers[1].output.LayerNorm = layers[0].output.LayerNorm
    bcosify(model, b=B, verbose=False)
    assert layers[1].output.dense is layers[0].output.dense
    assert type(layers[1].output.dense).__name__ == "BcosLinear"
    assert type(layers[1].output.LayerNorm).__name__ == "BcosLayerNorm"
    report = model.bcos_report
    assert {"bert.encoder.layer.0.output.dense", "bert.encoder.layer.1.output.dense"} <= set(report.bcos_layers)
    assert "bert.encoder.layer.1.output.dense.bias" in report.dropped_biases
    assert not any(type(m) in (torch.nn.Linear, torch.nn.LayerNorm) for m in model.modules())
    ids, mask = padded_batch()
    explanation = explain(model, ids, mask)  # complete (it refused the half-converted model)
    logits = _logits(model, ids, mask)
    torch.testing.assert_close(explanation.explained, logits.gather(1, explanation.target[:, None])[:, 0])


def test_a_module_shared_by_two_paths_that_convert_differently_is_refused_naming_both():
    model = _stock("BertForSequenceClassification")
    attention = model.bert.encoder.layer[0].attention
    attention.output.dense = attention.self.query  # a query projection (constant outputs) and a plain one
    with pytest.raises(UnsupportedModuleError, match=r"'bert\.encoder\.layer\.0\.attention\.self\.query' is also "
                                                     r"held at 'bert\.encoder\.layer\.0\.attention\.output\.dense'"):
        bcosify(model, b=B, verbose=False)
    assert type(attention.self.query) is torch.nn.Linear


# ------------------------------------------------------------------ the report says whether a head is tied


@pytest.mark.parametrize("name, path, where", [("GPT2LMHeadModel", "lm_head", "kept"),
                                               ("BertForMaskedLM", "cls.predictions.decoder", "kept"),
                                               ("LlamaForCausalLM", "lm_head", "kept"),
                                               ("Gemma2ForCausalLM", "lm_head", "patched_modules")])
@pytest.mark.parametrize("tied", [True, False])
def test_the_report_says_whether_the_lm_head_is_tied(name, path, where, tied):
    stock = _stock(name)
    config = copy.deepcopy(stock.config)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    model = bcosify(type(stock)(config).eval(), b=B, verbose=False)
    assert (model.get_submodule(path).weight is model.get_input_embeddings().weight) is tied
    text = getattr(model.bcos_report, where)[path]
    assert ("not tied" in text) is not tied and "tied to the input embeddings" in text and "{tied}" not in text


# ------------------------------------------------------------------ subclasses of the layers bcosify rebuilds


class _ScaledLinear(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 3.0


class _OffsetLayerNorm(torch.nn.LayerNorm):
    def forward(self, x):
        return super().forward(x) + 1.0


def _swap_in(model, path, cls):
    old = model.get_submodule(path)
    parent, _, attr = path.rpartition(".")
    if cls is _ScaledLinear:
        new = cls(old.in_features, old.out_features, bias=old.bias is not None)
    elif cls is _OffsetLayerNorm:
        new = cls(old.normalized_shape, eps=old.eps)
    else:  # another family's RMSNorm (Gemma's gain is 1 + weight)
        new = cls(old.weight.shape[0], eps=old.variance_epsilon)
    new.load_state_dict(old.state_dict(), strict=False)
    setattr(model.get_submodule(parent), attr, new)
    return new


def _weight_normed(model, path):
    module = model.get_submodule(path)
    torch.nn.utils.parametrizations.weight_norm(module)
    return module


@pytest.mark.parametrize("name, path, make", [
    ("BertForSequenceClassification", "bert.encoder.layer.0.output.dense", lambda m, p: _swap_in(m, p, _ScaledLinear)),
    ("GPT2LMHeadModel", "transformer.h.0.ln_1", lambda m, p: _swap_in(m, p, _OffsetLayerNorm)),
    ("LlamaForCausalLM", "model.layers.0.post_attention_layernorm",
     lambda m, p: _swap_in(m, p, __import__("transformers").models.gemma2.modeling_gemma2.Gemma2RMSNorm)),
    ("LlamaForCausalLM", "model.layers.1.mlp.down_proj", _weight_normed),
])
def test_a_layer_of_another_class_than_the_one_bcosify_rebuilds_is_refused_naming_it(name, path, make):
    """A B-cos layer is built from the weights alone: the scale, offset or parametrisation of a subclass (or another
    family's norm, whose gain is 1 + weight) was dropped, and the report listed the layer as converted."""
    model = _stock(name)
    module = make(model, path)
    with pytest.raises(UnsupportedModuleError, match=rf"model: bcosify cannot convert module '{path}' of class "
                                                     rf".*{type(module).__qualname__}.*would drop"):
        bcosify(model, b=B, verbose=False)
    assert model.get_submodule(path) is module and not hasattr(model.config, "bcos")


def test_dynamic_linear_copy_refuses_a_layer_norm_subclass_it_would_rebuild_without_its_forward():
    from bcos_plugins.convert import dynamic_linear_copy

    model = _stock("BertModel")
    _swap_in(model, "encoder.layer.1.output.LayerNorm", _OffsetLayerNorm)
    with pytest.raises(UnsupportedModuleError, match=r"model: dynamic_linear_copy cannot convert module "
                                                     r"'encoder\.layer\.1\.output\.LayerNorm'.*_OffsetLayerNorm"):
        dynamic_linear_copy(model)


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Qwen3ForCausalLM", "MistralModel", "Qwen2ForSequenceClassification"])
def test_each_familys_own_rms_norm_still_converts(name):
    model = bcosify(_stock(name), b=B, verbose=False)
    assert model.bcos_report.norms and all(type(model.get_submodule(n)).__name__ == "DetachableRMSNorm"
                                           for n in model.bcos_report.norms)


def test_a_copy_or_an_unpickled_soft_capped_model_follows_its_own_config():
    import io
    import pickle

    model = bcosify(_stock("Gemma2ForCausalLM"), b=B, verbose=False)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin.lm_head.soft_cap == 0.5
        twin.config.final_logit_softcapping = None
        assert twin.lm_head.soft_cap is None and model.lm_head.soft_cap == 0.5
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded.config.final_logit_softcapping = 1.0
    assert loaded.lm_head.soft_cap == 1.0


# ------------------------------------------------------------------ unusual configurations: complete, and reloaded as saved


_UNUSUAL = [
    ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True, head_dim=16, num_key_value_heads=1,
                              tie_word_embeddings=True)),
    ("LlamaForSequenceClassification", dict(num_key_value_heads=4, num_labels=5, hidden_act="gelu",
                                            rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4,
                                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                             "original_max_position_embeddings": 20})),
    ("MistralForCausalLM", dict(sliding_window=2, head_dim=16, tie_word_embeddings=True)),
    ("Qwen2ForCausalLM", dict(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True,
                              sliding_window=3, rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                                                                 "original_max_position_embeddings": 20})),
    ("Qwen3Model", dict(attention_bias=True, head_dim=16, num_key_value_heads=1)),
    ("Gemma2ForCausalLM", dict(tie_word_embeddings=False, final_logit_softcapping=30.0, query_pre_attn_scalar=3,
                               hidden_activation="silu", layer_types=["full_attention", "full_attention"])),
    ("Gemma2ForSequenceClassification", dict(attn_logit_softcapping=None, attention_bias=True, num_labels=2)),
    # every layer global: layer_types itself (global_attn_every_n_layers=1 set after the config is built left
    # layer 1 local: the config derives layer_types when it is built; tests/test_leftovers_s25_c.py)
    ("ModernBertForSequenceClassification", dict(classifier_pooling="cls",
                                                 layer_types=["full_attention", "full_attention"],
                                                 attention_bias=True, mlp_bias=True, norm_bias=True,
                                                 classifier_bias=True, hidden_activation="silu", num_labels=6)),
    ("GPT2LMHeadModel", dict(activation_function="relu", tie_word_embeddings=False, scale_attn_by_inverse_layer_idx=True,
                             reorder_and_upcast_attn=True)),
    ("BertForMaskedLM", dict(hidden_act="gelu_new", tie_word_embeddings=False)),
    ("RobertaForSequenceClassification", dict(hidden_act="silu", num_labels=1)),
    ("DistilBertForSequenceClassification", dict(activation="relu", sinusoidal_pos_embds=True, num_labels=4)),
]


@pytest.mark.parametrize("name, overrides", _UNUSUAL, ids=[n for n, _ in _UNUSUAL])
def test_an_unusual_configuration_converts_explains_completely_and_reloads_as_saved(tmp_path, name, overrides):
    from test_conformance import _stock

    from bcos_plugins.convert.architectures import SPECS

    stock = _stock(name, **overrides)
    layers = getattr(stock.base_model, "layers", ())
    if "layer_types" in overrides and layers and hasattr(layers[0], "attention_type"):
        # the layout the case claims is the one the model runs (each layer's attention kind)
        assert [layer.attention_type for layer in layers] == overrides["layer_types"]
    model = bcosify(stock, b=B, verbose=False)
    ids, mask = padded_batch()
    spec = SPECS[name]
    kwargs = {} if spec.is_classifier else dict(target=7, position=1 if spec.head == "masked_lm" else -1)
    explanation = explain(model, ids, mask, **kwargs)
    assert (explanation.delta.abs() <= 1e-4 * explanation.explained.abs().clamp_min(1e-2)).all()
    model.save_pretrained(tmp_path)
    loaded = load_bcos_model(tmp_path)
    again = explain(loaded, ids, mask, **kwargs)
    assert torch.equal(again.explained, explanation.explained)  # the same model: its logits bit for bit
    # the backward may round another way on weights read back into other memory (one float64 ulp seen on DistilBERT)
    torch.testing.assert_close(again.input_contributions, explanation.input_contributions, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("allow_hub", ["no", 0, None])
def test_minilm_path_refuses_an_allow_hub_that_is_not_a_bool(allow_hub):
    """A string such as "no" is truthy: without the offline package it returned the hub name, allowing the hub."""
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.pretrained import minilm_path

    with pytest.raises(BcosTypeError, match=r"^allow_hub: must be True or False, got .*\. Pass allow_hub=True to fall "
                                            r"back to the hub name"):
        minilm_path(allow_hub=allow_hub)
    assert minilm_path() == minilm_path(allow_hub=True)


# ------------------------------------------------------------------ weights of another model under a B-cos record


def _edit_record(folder, **changes):
    import json

    path = folder / "config.json"
    config = json.loads(path.read_text())
    record = config.setdefault("bcos", {})
    for key, value in changes.items():
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value
    path.write_text(json.dumps(config))


def test_a_stock_query_key_gpt2_save_whose_record_was_edited_is_refused_not_loaded_as_another_model(tmp_path):
    """A bcos_query_key=False GPT-2 keeps c_attn's bias (its query/key part is used): with format_version 3 -> 2 and
    query_key removed, the stock class loaded that bias and bcosify dropped it, so the B-cos query/key model loaded
    (logits 0.12 off the saved model's) without a word."""
    model = bcosify(_stock("GPT2LMHeadModel"), b=B, bcos_query_key=False, verbose=False)
    model.save_pretrained(tmp_path)
    _edit_record(tmp_path, format_version=2, query_key=None)
    with pytest.raises(BcosValueError, match=r"holds 2 bias\(es\) that the B-cos GPT2LMHeadModel its config\.bcos "
                                             r"describes has no place for \(transformer\.h\.0\.attn\.c_attn\.bias"):
        load_bcos_model(tmp_path)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "Qwen2ForCausalLM", "GPT2Model"])
def test_a_stock_save_given_a_bcos_record_is_refused_naming_the_biases(tmp_path, name):
    """A format-1 record (no per-layer B to miss) on a stock model's weights loaded them as a B-cos model with every
    bias dropped, silently; a B-cos save never holds a bias its conversion drops."""
    _stock(name).save_pretrained(tmp_path)
    _edit_record(tmp_path, b=1.5, architecture=name, format_version=1)
    with pytest.raises(BcosValueError, match=rf"holds \d+ bias\(es\) that the B-cos {name} .*from another model"):
        load_bcos_model(tmp_path)


def test_dynamic_linear_copy_refuses_a_hook_its_copy_would_lose_and_keeps_the_others():
    """The copy is a deepcopy, hooks included, but a LayerNorm or activation it rebuilds is a new module without them:
    the copy computed another function than the hooked model, which its docstring says it equals."""
    from bcos_plugins.convert import dynamic_linear_copy

    model = _stock("BertModel")
    handle = model.encoder.layer[0].output.LayerNorm.register_forward_hook(lambda m, args, out: out * 2)
    with pytest.raises(BcosValueError, match=r"model: holds hooks on 1 module\(s\) that dynamic_linear_copy replaces "
                                             r".*'encoder\.layer\.0\.output\.LayerNorm' \(LayerNorm: forward hook\)"):
        dynamic_linear_copy(model)
    handle.remove()
    model.encoder.layer[0].attention.self.value.register_forward_hook(lambda m, args, out: out * 2)
    copy_ = dynamic_linear_copy(model)  # a kept module: its hook is copied with it and still runs
    ids, mask = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(copy_(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ torch.inference_mode()


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "LlamaForCausalLM", "Gemma2ForCausalLM"])
def test_bcosify_and_load_bcos_model_under_inference_mode_give_a_model_that_explains(tmp_path, name):
    """Under the caller's inference_mode the new layers' B buffers were inference tensors: bcosify failed with torch's
    "Inference tensors do not track version counter", and so did load_bcos_model (which converts)."""
    ids, mask = padded_batch()
    kwargs = {} if name.startswith("Bert") else dict(target=5, position=-1)
    reference = bcosify(_stock(name), b=B, verbose=False)
    stock = _stock(name)  # built outside; converted inside
    with torch.inference_mode():
        model = bcosify(stock, b=B, verbose=False)
    assert not any(t.is_inference() for t in [*model.parameters(), *model.buffers()])
    explanation = explain(model, ids, mask, **kwargs)
    close = dict(rtol=1e-6, atol=1e-9)  # the same model in other memory: its backward may round another way
    torch.testing.assert_close(explanation.input_contributions,
                               explain(reference, ids, mask, **kwargs).input_contributions, **close)
    reference.save_pretrained(tmp_path)
    with torch.inference_mode():
        loaded = load_bcos_model(tmp_path)
    torch.testing.assert_close(explain(loaded, ids, mask, **kwargs).input_contributions,
                               explanation.input_contributions, **close)


def test_a_model_built_under_inference_mode_is_refused_naming_the_cause():
    """Its parameters are inference tensors, which autograd cannot record: the B-cos Llama converted, then every
    explanation failed inside torch ("Inference tensors cannot be saved for backward")."""
    with torch.inference_mode():
        stock = _stock("LlamaForCausalLM")
    with pytest.raises(BcosValueError, match=r"model: holds parameters made under torch\.inference_mode\(\) "
                                             r"\(inference tensors, e\.g\. 'model\.embed_tokens\.weight'\).*Build or "
                                             r"load the model outside torch\.inference_mode\(\)"):
        bcosify(stock, b=B, verbose=False)


# ------------------------------------------------------------------ a B-cos checkpoint loaded with plain transformers


@pytest.mark.parametrize("query_key", [True, False])
def test_bcosify_refuses_a_bcos_checkpoint_loaded_as_the_stock_class(tmp_path, query_key):
    """Stock modules with the record kept: bcosify converted it again at the b given (1.5 by default), another model
    than the one saved (logits 0.11 off at B = 1.25; stock query/key layers made B-cos), where predict, the metrics
    and explain refuse it naming load_bcos_model. Deleting the record converts it as a new stock model."""
    import transformers as T

    saved = bcosify(_stock("BertForSequenceClassification"), b=1.25, bcos_query_key=query_key, verbose=False)
    saved.save_pretrained(tmp_path)
    plain = T.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    with pytest.raises(BcosTypeError, match=r"model: is a stock BertForSequenceClassification whose config holds B-cos "
                                            r"settings .*'b': 1\.25.*Load it with bcos_plugins\.load_bcos_model\(path\)"):
        bcosify(plain, verbose=False)
    assert not any(type(m).__name__.startswith("Bcos") for m in plain.modules())
    ids, mask = padded_batch()
    torch.testing.assert_close(_logits(load_bcos_model(tmp_path), ids, mask), _logits(saved, ids, mask), rtol=0, atol=0)
    del plain.config.bcos
    assert bcosify(plain, b=1.5, verbose=False).config.bcos["b"] == 1.5


@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "Gemma2ForCausalLM", "BertForMaskedLM"])
def test_an_lm_head_untied_by_hand_under_a_tied_config_is_refused_and_keeps_its_weights_once_the_config_says_so(
        tmp_path, name):
    """bcosify re-tied every head (transformers' tie_weights under a config that says tied): a head given weights of
    its own after building (a separately trained head) was overwritten with the embeddings, silently (and every reload
    of a save would tie it again). Refused before anything is touched; with the config saying untied, the head keeps
    its weights through conversion (and, where nothing else shares a weight with it, through a reload)."""
    stock = _stock(name)
    head = stock.get_output_embeddings()
    assert head.weight is stock.get_input_embeddings().weight and stock.config.tie_word_embeddings
    head.weight = torch.nn.Parameter(head.weight.detach() * 2)
    own = head.weight.detach().clone()
    with pytest.raises(BcosValueError, match=r"model: its LM head holds weights of its own, but "
                                             r"config\.tie_word_embeddings is True.*Set model\.config\."
                                             r"tie_word_embeddings = False"):
        bcosify(stock, b=B, verbose=False)
    assert torch.equal(stock.get_output_embeddings().weight, own) and not hasattr(stock.config, "bcos")
    stock.config.tie_word_embeddings = False
    model = bcosify(stock, b=B, verbose=False)
    assert torch.equal(model.get_output_embeddings().weight, own)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    if name != "BertForMaskedLM":  # its decoder's (unused) bias is still shared with cls.predictions.bias
        ids, mask = padded_batch()
        model.save_pretrained(tmp_path)
        loaded = load_bcos_model(tmp_path)
        assert torch.equal(loaded.get_output_embeddings().weight, own)
        torch.testing.assert_close(_logits(loaded, ids, mask), _logits(model, ids, mask), rtol=0, atol=0)


def test_an_rms_norm_of_the_same_form_from_another_transformers_family_still_converts():
    """A transformers version may give a family another family's RMSNorm of the same form (x * rsqrt(...) * weight):
    it converts; a Gemma RMSNorm (gain 1 + weight) in a Llama does not (above)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    model = _stock("MistralForCausalLM")
    old = model.model.layers[0].input_layernorm
    new = LlamaRMSNorm(old.weight.shape[0], eps=old.variance_epsilon)
    new.load_state_dict(old.state_dict())
    model.model.layers[0].input_layernorm = new
    bcosify(model, b=B, verbose=False)
    assert type(model.model.layers[0].input_layernorm).__name__ == "DetachableRMSNorm"


@pytest.mark.parametrize("key, value, says", [("b", 2.0, r"set \.b on each B-cos layer"),
                                              ("bcos_query_key", False, r"bcosify\(model, bcos_query_key=\.\.\.\)")])
def test_load_bcos_model_refuses_bcosifys_own_keywords_saying_where_the_setting_comes_from(tmp_path, key, value, says):
    """b= and bcos_query_key= were refused as unknown keywords ("neither an attribute of the saved configuration nor a
    from_pretrained option"), without the way to run the loaded model at another B."""
    from bcos_plugins.errors import BcosKeywordError

    bcosify(_stock("BertModel"), b=1.25, verbose=False).save_pretrained(tmp_path)
    with pytest.raises(BcosKeywordError, match=rf"^{key}: .*(stored with each|part of the saved model).*{says}"):
        load_bcos_model(tmp_path, **{key: value})
