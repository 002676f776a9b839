"""Trust pass 21, the host-library adapters (adapters/) on the newer families as their users call them: each test
fails on the behaviour before its fix, which returned a wrong number without a word or raised an unhelpful error.

Written through the host libraries' own calls: sae-lens SAEs read at a TransformerBridge's hooks (explain_sae_feature
against sae-lens' own ``hook_sae_acts_pre`` on the bridge's cache), TransformerLens' ``ActivationCache``
decompositions (``stack_head_results``, ``stack_neuron_results``, ``get_full_resid_decomposition``, ``logit_attrs``)
against the cached ``hook_attn_out`` / ``hook_mlp_out`` / residual and logits they split."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch
from test_conformance import B, _stock

from bcos_plugins import bcosify

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bridge(name: str, bcos: bool, **config_overrides):
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    model = _stock(name, **config_overrides)
    return transformer_bridge_from_hf(bcosify(model, b=B, verbose=False) if bcos else model)


def _sae(d_in: int, hook_name: str, seed: int = 0):
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=3 * d_in, metadata=SAEMetadata(hook_name=hook_name)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-zero biases, so that a lost bias term shows
        for param in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            param.copy_(torch.randn(param.shape, generator=generator))
    return sae


# ------------------------------------------------------- explain_sae_feature at a bridge norm's hook_normalized


@pytest.mark.parametrize(("name", "bcos"), [("Qwen3ForCausalLM", True), ("Gemma2ForCausalLM", False)])
@pytest.mark.parametrize("hook", ["blocks.0.ln2.hook_normalized", "blocks.1.ln1.hook_normalized",
                                  "ln_final.hook_normalized"])
def test_explain_sae_feature_at_a_bridge_norms_hook_normalized_is_complete(name, bcos, hook):
    """The bridge runs RMSNorms natively and computes hook_normalized beside them with a scale that explanation mode
    did not hold constant: the contributions summed to about 0 (completeness error 1.0), without a warning."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    bridge = _bridge(name, bcos)
    sae = _sae(32, hook)
    ids, mask = padded_batch(side="left")
    explanation = explain_sae_feature(bridge, ids, sae, 3, attention_mask=mask)
    _, cache = bridge.run_with_cache(ids, attention_mask=mask)
    _, sae_cache = sae.run_with_cache(cache[hook])
    want = sae_cache["hook_sae_acts_pre"][torch.arange(3), explanation.position, 3]
    torch.testing.assert_close(explanation.pre_activation, want, rtol=1e-5, atol=1e-5)
    scale = torch.stack([explanation.pre_activation, explanation.bias_terms, explanation.explained]).abs().amax(0)
    assert ((explanation.total + explanation.bias_terms - explanation.pre_activation).abs() / scale).max() < 1e-5
    assert explanation.completeness_error.max() < 1e-4


# ------------------------------------------------------- TransformerLens' cache decompositions on a plain Gemma 2 bridge


def _cache(bridge):
    tokens = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens)
    return logits, cache


@pytest.mark.parametrize("method", ["stack_head_results", "stack_neuron_results", "get_full_resid_decomposition"])
def test_a_plain_gemma2_bridges_per_head_and_per_neuron_results_are_refused_naming_the_exact_split(method):
    """Gemma 2 normalises each attention / MLP output again; TransformerLens' per-head (per-neuron) results are taken
    before that norm: on a plain Gemma 2 bridge they missed hook_attn_out (hook_mlp_out) by 4.3 (2.8), silently."""
    from bcos_plugins.errors import BcosTypeError

    _, cache = _cache(_bridge("Gemma2ForCausalLM", False, final_logit_softcapping=None))
    call = {"stack_head_results": lambda: cache.stack_head_results(layer=-1),
            "stack_neuron_results": lambda: cache.stack_neuron_results(layer=-1),
            "get_full_resid_decomposition": lambda: cache.get_full_resid_decomposition(expand_neurons=True)}[method]
    with pytest.raises(BcosTypeError, match=r"normalises each (attention|MLP) output again \(blocks\.0\.ln[12]_post\)"
                                            r".*token_component_decomposition.*hooked_transformer_from_hf"):
        call()


def test_a_plain_soft_capped_gemma2_bridges_logit_attrs_is_refused_and_an_uncapped_ones_sums_to_the_logit():
    """A plain Gemma 2's head is a plain linear layer, so its final norm's gain was folded, but the soft-cap still
    bends each logit: logit_attrs' terms summed to the uncapped z (0.065 off), silently."""
    from bcos_plugins.errors import BcosTypeError

    _, cache = _cache(_bridge("Gemma2ForCausalLM", False, final_logit_softcapping=0.5))
    resid = cache.decompose_resid(layer=-1, pos_slice=-1)
    with pytest.raises(BcosTypeError, match=r"logit_attrs: .* model whose LM head soft-caps the logits \(0\.5 \* "
                                            r"tanh.*token_component_decomposition"):
        cache.logit_attrs(resid, tokens=torch.tensor([5, 6]), pos_slice=-1)
    logits, cache = _cache(_bridge("Gemma2ForCausalLM", False, final_logit_softcapping=None))
    resid = cache.decompose_resid(layer=-1, pos_slice=-1)
    target = torch.tensor([5, 6])
    attrs = cache.logit_attrs(resid, tokens=target, pos_slice=-1).sum(0)
    torch.testing.assert_close(attrs, logits[torch.arange(2), -1, target], rtol=1e-4, atol=1e-5)


def test_a_plain_qwen3_bridges_per_head_and_per_neuron_results_still_sum_to_the_layer_outputs():
    """The refusal is for blocks that normalise their outputs again: a plain Qwen3 bridge keeps TransformerLens'
    results, which sum to each layer's attention and MLP output."""
    bridge = _bridge("Qwen3ForCausalLM", False)
    _, cache = _cache(bridge)
    heads = cache.stack_head_results(layer=-1)  # (layers * heads, batch, pos, d_model)
    neurons = cache.stack_neuron_results(layer=-1)  # (layers * d_mlp, batch, pos, d_model)
    n_heads, d_mlp = bridge.cfg.n_heads, bridge.cfg.d_mlp
    for layer in range(bridge.cfg.n_layers):
        torch.testing.assert_close(heads[layer * n_heads:(layer + 1) * n_heads].sum(0),
                                   cache[f"blocks.{layer}.hook_attn_out"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(neurons[layer * d_mlp:(layer + 1) * d_mlp].sum(0),
                                   cache[f"blocks.{layer}.hook_mlp_out"], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------- sae-lens: SAEs spliced at the hooks the decomposition reads


def _hooked_sae_model(name: str):
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from sae_lens import HookedSAETransformer

    return hooked_transformer_from_hf(bcosify(_stock(name), b=B, verbose=False), model_class=HookedSAETransformer)


@pytest.mark.parametrize("hook", ["blocks.0.hook_mlp_out", "blocks.1.hook_attn_out", "blocks.0.attn.hook_z"])
def test_token_component_decomposition_names_an_sae_spliced_at_a_hook_it_reads(hook):
    """sae-lens' add_sae replaces the hook point by the SAE, so its name leaves hook_dict: the decomposition said the
    model "lacks the standard hook points", as if it were no TransformerLens model, and named no fix."""
    from bcos_plugins.adapters.transformer_lens import token_component_decomposition

    from bcos_plugins.errors import BcosValueError

    model = _hooked_sae_model("Qwen2ForCausalLM")
    model.add_sae(_sae(32, hook), use_error_term=True)
    ids, mask = padded_batch(side="left")
    with pytest.raises(BcosValueError, match=rf"SAEs are spliced in at \['{hook}'\].*Splice SAEs inside a component.*"
                                             r"sae_error_share"):
        token_component_decomposition(model, ids, attention_mask=mask, target=[5, 6, 7])


@pytest.mark.parametrize("where", ["b_enc", "W_enc"])
def test_explain_sae_feature_names_a_non_finite_encoder_of_the_explained_feature(where):
    """A NaN bias or an inf encoder weight of the explained feature was reported as the model's NaN output, sending
    the user to check the tokens' inputs and embedding rows; another feature's NaN bias does not matter."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    from bcos_plugins.errors import BcosValueError

    model = _hooked_sae_model("Qwen3ForCausalLM")
    ids, mask = padded_batch(side="left")
    sae = _sae(32, "blocks.0.hook_resid_post")
    with torch.no_grad():
        if where == "b_enc":
            sae.b_enc[3] = float("nan")
        else:
            sae.W_enc[5, 3] = float("inf")
    with pytest.raises(BcosValueError, match=r"sae: feature 3's encoder weights .* NaN or infinite"):
        explain_sae_feature(model, ids, sae, 3, attention_mask=mask)
    if where == "b_enc":  # (an inf weight reaches every feature's gradient through the encoder's matrix product)
        explanation = explain_sae_feature(model, ids, sae, 4, attention_mask=mask)
        assert explanation.completeness_error.max() < 1e-4


# ------------------------------------------------------- a plain soft-capped Gemma 2 through the bridge


def test_a_plain_soft_capped_gemma2_bridge_explains_its_capped_logits_completely():
    """The stock forward soft-caps the logits inline, and its tanh was in the gradient: explain_logits' contributions
    missed 0.2-0.8 % of the logit without a word, and token_component_decomposition blamed non-zero biases. The copy
    now caps in its LM head as a dynamic weight (bcosify's Gemma 2 head), the same logits."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    model = _stock("Gemma2ForCausalLM", final_logit_softcapping=0.5)
    bridge = _bridge("Gemma2ForCausalLM", False, final_logit_softcapping=0.5)
    ids, mask = padded_batch(side="right")
    with torch.no_grad():
        torch.testing.assert_close(bridge(ids, attention_mask=mask) * mask[..., None],
                                   model(ids, attention_mask=mask).logits * mask[..., None], rtol=1e-5, atol=1e-6)
    for explanation in (explain_logits(bridge, ids, attention_mask=mask, target=[5, 6, 7]),
                        token_component_decomposition(bridge, ids, attention_mask=mask, target=[5, 6, 7])):
        total = explanation.total if hasattr(explanation, "total") else explanation.table.sum((1, 2))
        size = explanation.explained.abs() + (explanation.contributions.abs().sum(1) if hasattr(explanation, "total")
                                              else explanation.table.abs().sum((1, 2)))
        assert ((total - explanation.explained).abs() <= 1e-5 * size).all()


# ------------------------------------------------------- Captum's visualization records


@pytest.mark.parametrize("tokenizer", [[["t1", "t2"]], "gpt2"])
def test_visualization_records_name_tokens_or_a_name_given_as_the_tokenizer(tokenizer):
    """Token strings (or a hub name) in the tokenizer's place failed with "'list' object has no attribute
    'convert_ids_to_tokens'"."""
    from bcos_plugins.adapters.captum import visualization_records

    from bcos_plugins import explain
    from bcos_plugins.errors import BcosTypeError

    model = bcosify(_stock("Qwen2ForSequenceClassification"), b=B, verbose=False)
    ids, mask = padded_batch(side="left")
    with pytest.raises(BcosTypeError, match=r"tokenizer: expected the tokenizer of the explained model.*"
                                            r"scores=\.\.\., tokens=\.\.\."):
        visualization_records(explain(model, ids, attention_mask=mask), tokenizer)


@pytest.mark.parametrize(("how", "hook", "width"), [("hooked", "blocks.0.mlp.hook_pre", 64),
                                                    ("hooked", "blocks.0.attn.hook_bcos_scale_o", 32),
                                                    ("bridge", "blocks.0.mlp.gate.hook_out", 64)])
def test_explain_sae_feature_refuses_an_sae_at_a_dynamic_weight_hook(how, hook, width):
    """Explanation mode holds the value at a dynamic-weight hook constant: on a HookedTransformer the feature read
    there was explained as nothing at all (completeness error 1.0), silently; on a bridge it failed with "no
    gradient path", naming neither the hook nor the fix."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    from bcos_plugins.errors import BcosValueError

    model = _hooked_sae_model("Qwen3ForCausalLM") if how == "hooked" else _bridge("Qwen3ForCausalLM", True)
    ids, mask = padded_batch(side="right")
    with pytest.raises(BcosValueError, match=rf"sae: its hook '{hook}' carries a dynamic weight.*mlp\.hook_post"):
        explain_sae_feature(model, ids, _sae(width, hook), 3, attention_mask=mask)


# ------------------------------------------------------- inseq: load_classifier's arguments


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"max_length": 1.5}, "BcosTypeError", r"max_length: must be an integer, got float 1\.5"),
    ({"max_length": 0}, "BcosValueError", r"max_length: must be >= 1, got 0"),
    ({"label_names": "abc"}, "BcosTypeError", r"label_names: must be a list of class names; it is one string, "
                                               r"'abc'.*one name per class"),
])
def test_load_classifier_names_a_max_length_or_label_names_of_the_wrong_kind(kwargs, error, words):
    """max_length=1.5 failed inside the tokenizer (TypeError), 0 as an "empty input" of input_ids; one string of
    label names was split into its characters, one per class, silently."""
    from bcos_plugins.adapters.inseq import load_classifier
    from test_conformance import _word_tokenizer

    from bcos_plugins import errors

    model = bcosify(_stock("Qwen3ForSequenceClassification"), b=B, verbose=False)
    with pytest.raises(getattr(errors, error), match=words):
        load_classifier(model, _word_tokenizer(), **kwargs).attribute("w5 w6")


def test_visualization_records_refuse_one_string_of_label_names():
    """The names were indexed by class id, so one string named the classes by its characters ("abc": a, b, c)."""
    from bcos_plugins.adapters.captum import visualization_records

    from bcos_plugins import explain
    from bcos_plugins.errors import BcosTypeError

    model = bcosify(_stock("Qwen2ForSequenceClassification"), b=B, verbose=False)
    ids, mask = padded_batch(side="left")
    explanation = explain(model, ids, attention_mask=mask)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    with pytest.raises(BcosTypeError, match=r"label_names: must be a list of class names; it is one string, 'abc'.*"
                                            r"one name per class"):
        visualization_records(explanation, _Tokens(), logits=logits, label_names="abc")


class _Tokens:
    def convert_ids_to_tokens(self, ids):
        return [f"w{i}" for i in ids]
