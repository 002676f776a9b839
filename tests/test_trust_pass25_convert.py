"""Trust pass 25, conversion, persistence and the registry families (BERT, DistilBERT, RoBERTa, GPT-2, Llama next to
Mistral, Qwen2, Qwen3, Gemma 2, ModernBERT) under options that change the maths (tied embeddings, attention / MLP /
norm biases, head_dim unlike hidden / heads, GQA with one key-value head, bilinear ``hidden_act="linear"``, rope
scaling kinds), ``explain`` with a key-value cache, and a B-cos save loaded with plain transformers as another class.

Unhelpful before:

- ``explain(lm, ids, past_key_values=cache)`` was refused as "not an argument of LlamaForCausalLM.forward, which would
  silently ignore it", though transformers 5 reads ``past_key_values`` as its deprecated name for ``cache``: the
  refusal named no cause and no fix. It is now refused as ``cache=`` is (the earlier tokens' share would be missing).
- A B-cos save loaded with plain transformers as another class than the one saved (a B-cos ``LlamaForCausalLM`` as a
  ``LlamaModel`` or a ``LlamaForSequenceClassification``, a B-cos BERT classifier as a ``BertForMaskedLM``) was refused
  by ``explain`` as "a bare LlamaModel ... Pass the LlamaForCausalLM itself" or "not transformers' LlamaForCausalLM ...
  Build transformers.LlamaForCausalLM itself": neither is the cause. It is now named as a B-cos checkpoint loaded with
  plain transformers, with ``load_bcos_model`` as the fix, as for the class it was saved as.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as T
from conftest import MAX_POS, VOCAB, padded_rows
from test_trust_pass24_convert import _build, _modernbert, _outputs, _rotary, stock_on_the_bcos_weights

from bcos_plugins import bcosify, explain, load_bcos_model
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import (
    BcosFileError,
    BcosKeywordError,
    BcosRuntimeError,
    BcosTypeError,
    BcosValueError,
)

warnings.filterwarnings("ignore", category=DeprecationWarning)

B = 1.25


def _asked(spec) -> dict:
    return {"target": 1} if spec.is_classifier else {"target": 7, "position": -1}


# ------------------------------------------------------------------ a key-value cache passed under its old name


@pytest.mark.parametrize("name, make", [
    ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig)),
    ("Gemma2ForCausalLM", lambda: _rotary(T.Gemma2Config, head_dim=8, final_logit_softcapping=2.0)),
    ("GPT2LMHeadModel", lambda: T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=MAX_POS)),
])
@pytest.mark.parametrize("keyword", ["past_key_values", "cache"])
def test_a_key_value_cache_is_refused_as_a_cache_under_either_name(name, make, keyword):
    model = bcosify(_build(name, make()), b=B, verbose=False)
    ids = torch.arange(5, 15)[None]
    with torch.no_grad():
        cache = model(input_ids=ids[:, :6], use_cache=True).cache
    # transformers reads past_key_values (its old name for cache): the continuation's logits are the whole text's
    with torch.no_grad():
        continued = model(input_ids=ids[:, 6:], **{keyword: copy.deepcopy(cache)}).logits[0, -1]
    torch.testing.assert_close(continued, _outputs(model, ids, None)[0, -1], rtol=1e-5, atol=1e-6)
    # it was refused as "not an argument of ...forward, which would silently ignore it", naming neither cause nor fix
    with pytest.raises(BcosValueError, match=rf"^{keyword}: holds keys and values of earlier tokens computed outside "
                                             r"the explanation.*Pass the whole sequence \(the earlier tokens "
                                             r"included\) as input_ids, without a cache"):
        explain(model, ids[:, 6:], target=7, position=-1, **{keyword: copy.deepcopy(cache)})
    # the fix: the whole text, explained completely, at the value the cached call computed
    whole = explain(model, ids, target=7, position=-1)
    torch.testing.assert_close(whole.explained[0], continued[7], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ a B-cos save loaded as another stock class


@pytest.mark.parametrize("saved, make, loaded_as", [
    ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig), "LlamaModel"),
    ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig), "LlamaForSequenceClassification"),
    ("ModernBertForSequenceClassification", lambda: _modernbert(classifier_pooling="mean"), "ModernBertModel"),
    ("BertForSequenceClassification", lambda: T.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=MAX_POS, num_labels=3), "BertForMaskedLM"),
])
def test_a_bcos_save_loaded_as_another_stock_class_is_named_as_such_with_load_bcos_model_as_the_fix(
        tmp_path, saved, make, loaded_as):
    model = bcosify(_build(saved, make()), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = getattr(T, loaded_as).from_pretrained(tmp_path).eval()
    ids, mask = padded_rows([9, 5], 9, "right", seed=3)
    asked = _asked(SPECS[loaded_as])
    # it said "a bare LlamaModel ... Pass the LlamaForCausalLM itself" or "not transformers' LlamaForCausalLM ... Build
    # transformers.LlamaForCausalLM itself": the model was a stock one either way, loaded from a B-cos save
    with pytest.raises(BcosTypeError, match=rf"^model: {loaded_as} has B-cos settings in its config \(config\.bcos, "
                                            rf"of a B-cos {saved}\) but no B-cos modules: it was saved from a B-cos "
                                            r"model and loaded with plain transformers.*Load it with "
                                            r"bcos_plugins\.load_bcos_model\(path\)"):
        explain(stock, ids, mask, **asked)
    loaded = load_bcos_model(tmp_path)
    assert torch.equal(_outputs(loaded, ids, mask), _outputs(model, ids, mask))


# ------------------------------------------------------------------ options that change the maths, at B = 1


B1_CASES = {
    "llama-tied-bilinear": ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig, tie_word_embeddings=True,
                                                                hidden_act="linear")),
    "llama-attention-and-mlp-bias": ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig, attention_bias=True,
                                                                         mlp_bias=True)),
    "llama-head-dim-16-one-kv-head": ("LlamaForSequenceClassification", lambda: _rotary(
        T.LlamaConfig, head_dim=16, num_key_value_heads=1)),
    "llama-llama3-rope": ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8})),
    "mistral-one-kv-head-window-3": ("MistralForCausalLM", lambda: _rotary(T.MistralConfig, num_key_value_heads=1,
                                                                          head_dim=16, sliding_window=3)),
    "qwen2-tied-one-kv-head": ("Qwen2ForCausalLM", lambda: _rotary(T.Qwen2Config, tie_word_embeddings=True,
                                                                   num_key_value_heads=1)),
    "qwen3-head-dim-16-bias": ("Qwen3ForCausalLM", lambda: _rotary(T.Qwen3Config, head_dim=16, attention_bias=True,
                                                                   num_key_value_heads=1)),
    "gemma2-head-dim-16-one-kv-head": ("Gemma2ForCausalLM", lambda: _rotary(
        T.Gemma2Config, head_dim=16, num_key_value_heads=1, query_pre_attn_scalar=16, sliding_window=3)),
    "gemma2-bilinear-classifier": ("Gemma2ForSequenceClassification", lambda: _rotary(
        T.Gemma2Config, head_dim=8, hidden_activation="linear")),
    "modernbert-norm-attention-mlp-bias": ("ModernBertForSequenceClassification", lambda: _modernbert(
        norm_bias=True, attention_bias=True, mlp_bias=True, classifier_pooling="mean")),
    "modernbert-three-heads-of-16": ("ModernBertModel", lambda: _modernbert(hidden_size=48, num_attention_heads=3)),
    "gpt2-layer-scaled-upcast": ("GPT2LMHeadModel", lambda: T.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=MAX_POS, scale_attn_by_inverse_layer_idx=True,
        reorder_and_upcast_attn=True)),
}


@pytest.mark.parametrize("case", sorted(B1_CASES))
def test_at_b_1_each_familys_option_computes_the_stock_maths_on_unit_rows(case):
    """The B-cos model at B = 1 is the stock model on the weights a B-cos layer uses (unit rows, the reported biases
    at 0), whatever option of the configuration changes the maths; pins the registry families' swapped-in forwards
    under options pass 24 did not cover."""
    name, make = B1_CASES[case]
    stock = _build(name, make())
    model = bcosify(copy.deepcopy(stock), b=1.0, verbose=False)
    stock_on_the_bcos_weights(stock, model)
    ids, mask = padded_rows([12, 8, 3], 12, "right", seed=7)
    got, want = _outputs(model, ids, mask), _outputs(stock, ids, mask)
    if got.dim() == 3:
        got, want = got[mask.bool()], want[mask.bool()]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ a B-cos state dict saved with torch.save


@pytest.mark.parametrize("name, make", [
    ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig, tie_word_embeddings=True)),
    ("BertForSequenceClassification", lambda: T.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=MAX_POS, num_labels=3)),
])
def test_a_bcos_pytorch_model_bin_is_refused_with_a_fix_that_loads_it_as_saved(tmp_path, name, make):
    from safetensors.torch import save_file

    model = bcosify(_build(name, make()), b=B, verbose=False)
    model.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    bin_file = str(tmp_path / "pytorch_model.bin")
    # it said "load it with transformers and save it again with save_pretrained(folder)": that loads the stock class,
    # which drops every layer's bcos_b and starts the removed biases afresh, a folder the load refuses
    with pytest.raises(BcosFileError, match=r"It holds pytorch_model\.bin: write its tensors as safetensors, each "
                                            r"layer's bcos_b entry included: safetensors\.torch\.save_file\("):
        load_bcos_model(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = getattr(T, name).from_pretrained(tmp_path)
    stock.save_pretrained(tmp_path / "resaved")
    with pytest.raises(BcosValueError, match=r"B-cos layers without a stored B|holds \d+ bias\(es\)"):
        load_bcos_model(tmp_path / "resaved")
    # the fix the message names, as written there
    save_file({k: v.clone() for k, v in torch.load(bin_file).items()}, str(tmp_path / "model.safetensors"),
              metadata={"format": "pt"})
    ids, mask = padded_rows([9, 5], 9, "right", seed=3)
    assert torch.equal(_outputs(load_bcos_model(tmp_path), ids, mask), _outputs(model, ids, mask))


# ------------------------------------------------------------------ a B-cos model saved after its record was lost


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_bcos_save_without_its_record_is_named_as_such_not_as_a_stock_model(tmp_path, how):
    make = lambda: _rotary(T.LlamaConfig)  # noqa: E731
    model = bcosify(_build("LlamaForCausalLM", make()), b=B, verbose=False)
    if how == "deleted":
        del model.config.bcos
    else:
        model.config = make()
    model.save_pretrained(tmp_path)
    # it said "it was not saved from a model converted with bcosify. Load it with transformers and call bcosify
    # instead": a stock load drops each layer's stored B
    with pytest.raises(BcosValueError, match=r"^path: .*config\.json has no B-cos settings \(config\.bcos\), but its "
                                             r"weights hold the B of 14 B-cos layer\(s\) \(bcos_b entries\): a B-cos "
                                             r"model saved after its record was lost"):
        load_bcos_model(tmp_path)
    # a stock save is still told to load with transformers and call bcosify
    _build("LlamaForCausalLM", make()).save_pretrained(tmp_path / "stock")
    with pytest.raises(BcosValueError, match=r"has no B-cos settings in config\.json \(config\.bcos\); it was not "
                                             r"saved from a model converted with bcosify"):
        load_bcos_model(tmp_path / "stock")


# ------------------------------------------------------------------ a device_map naming a device the machine lacks


@pytest.fixture(scope="module")
def qwen2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    bcosify(_build("Qwen2ForCausalLM", _rotary(T.Qwen2Config)), b=B, verbose=False).save_pretrained(folder)
    return folder


# an int is an accelerator index: on a machine with one (CUDA hidden below) it reads as 'cuda:0'
_INDEX = r"(0, an accelerator index|'cuda:0', which this machine does not have)"


@pytest.mark.parametrize("device_map, named", [
    ("cuda", "device_map: is 'cuda'"), ("cuda:0", "device_map: is 'cuda:0'"), ("mps", "device_map: is 'mps'"),
    (torch.device("cuda"), "device_map: is 'cuda'"), (0, f"device_map: is {_INDEX}"),
    ({"": 0}, rf"device_map\[''\]: is {_INDEX}"),
    ({"model": "cpu", "lm_head": "cuda"}, r"device_map\['lm_head'\]: is 'cuda'"),
])
def test_a_device_map_naming_a_device_this_machine_lacks_is_refused_naming_it(qwen2_folder, monkeypatch, device_map,
                                                                                named):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA or MPS, as the CI's
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    # "cuda" failed with torch's bare "AssertionError: Torch not compiled with CUDA enabled"; 0 and "mps" with
    # "path: transformers could not load ... Check the from_pretrained keyword arguments, or re-save the model"
    with pytest.raises(BcosKeywordError, match=rf"^{named}.*\(available: cpu\)\. Pass an available device, e\.g\. "):
        load_bcos_model(qwen2_folder, device_map=device_map)
    ids = torch.tensor([[5, 6, 7, 8]])
    on_cpu = load_bcos_model(qwen2_folder, device_map={"model": "cpu", "lm_head": "cpu"})
    assert torch.equal(_outputs(on_cpu, ids, None), _outputs(load_bcos_model(qwen2_folder), ids, None))


# ------------------------------------------------------------------ FlexAttention on the CPU


@pytest.mark.parametrize("name, make", [
    ("LlamaForCausalLM", lambda: _rotary(T.LlamaConfig)),
    ("ModernBertForSequenceClassification", lambda: _modernbert(classifier_pooling="mean")),
])
def test_flex_attention_on_the_cpu_is_named_with_the_switch_that_explains_it(name, make):
    model = bcosify(_build(name, make()), b=B, verbose=False)
    ids, mask = padded_rows([9, 5], 9, "right", seed=3)
    asked = _asked(SPECS[name])
    reference = explain(model, ids, mask, **asked)
    model.set_attn_implementation("flex_attention")
    # torch's "FlexAttention does not support backward on CPU. Please set the input requires_grad to False or use
    # another device": no explanation can do the first, and neither names the model's setting
    with pytest.raises(BcosRuntimeError, match=r"^model: runs FlexAttention \(attn_implementation='flex_attention'\), "
                                               r"for which torch has no backward pass on the CPU.*model\."
                                               r"set_attn_implementation\('eager'\)"):
        explain(model, ids, mask, **asked)
    model.set_attn_implementation("eager")
    torch.testing.assert_close(explain(model, ids, mask, **asked).contributions, reference.contributions,
                               rtol=1e-5, atol=1e-6)
