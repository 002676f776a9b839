"""TransformerLens' own decomposition calls are exact on B-cos and bilinear models (issue 16).

Every check goes through TransformerLens' API (``logit_attrs``, ``decompose_resid``, ``accumulated_resid``,
``get_full_resid_decomposition``, ``stack_head_results``, ``stack_neuron_results``) on the cache the model's
``run_with_cache`` returns, and compares with the forward's own values: completeness <= 1e-4 relative.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.transformer_lens import (
    BcosActivationCache,
    BcosHookedTransformer,
    BcosTransformerConfig,
    bilinear_config,
    effective_weight,
    hooked_transformer_from_hf,
    make_explainable,
)
from conftest import VOCAB, tiny_config, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformer_lens import ActivationCache, HookedTransformer, HookedTransformerConfig

from bcos_plugins import BcosError, bcosify

warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)

SIZE = dict(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24, d_vocab=VOCAB, n_ctx=16, device="cpu")
GPT2_LIKE = dict(act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard")
LLAMA_LIKE = dict(act_fn="silu", gated_mlp=True, normalization_type="RMS", positional_embedding_type="rotary",
                  n_key_value_heads=2)


def _bilinear_llama():
    config = tiny_config("llama")
    config.hidden_act = "linear"
    torch.manual_seed(0)
    return T.LlamaForCausalLM(config).eval()


def _with_trained_final_norm(hf):
    # a pretrained model's final norm weight is not all ones; make it so, so the fold is exercised
    norm = hf.transformer.ln_f if hasattr(hf, "transformer") else hf.model.norm
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, norm.weight.numel()))
    return hf


MODELS = {
    "bcos_gpt2": lambda: hooked_transformer_from_hf(
        bcosify(_with_trained_final_norm(tiny_model("GPT2LMHeadModel")), b=1.5, verbose=False)),
    "bcos_llama": lambda: hooked_transformer_from_hf(
        bcosify(_with_trained_final_norm(tiny_model("LlamaForCausalLM")), b=1.1, verbose=False)),
    "bilinear_llama": lambda: hooked_transformer_from_hf(_with_trained_final_norm(_bilinear_llama())),
    "bcos_bilinear_llama": lambda: hooked_transformer_from_hf(bcosify(_bilinear_llama(), b=2.0, verbose=False)),
    "native_bcos_gpt2_like": lambda: BcosHookedTransformer(
        BcosTransformerConfig(**SIZE, **GPT2_LIKE, seed=0, bcos_b=1.5)).eval(),
    "native_bilinear": lambda: make_explainable(HookedTransformer(bilinear_config(
        **{k: v for k, v in SIZE.items() if k != "d_head"}, seed=0)).eval()),
}
_BUILT: dict[str, HookedTransformer] = {}


def model_named(name: str) -> HookedTransformer:
    if name not in _BUILT:  # built once per module: the checks below only read the models
        _BUILT[name] = MODELS[name]()
    return _BUILT[name]


def ids(seed: int = 1, batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach(), want.detach()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def run(name: str, tokens: torch.Tensor):
    model = model_named(name)
    logits, cache = model.run_with_cache(tokens)
    target = logits.argmax(-1)  # the top prediction at every position
    foil = (target + 1) % model.cfg.d_vocab
    return model, logits, cache, target, foil


def picked(logits, target, foil=None):
    out = logits.gather(-1, target[..., None])[..., 0]
    return out if foil is None else out - logits.gather(-1, foil[..., None])[..., 0]


@pytest.mark.parametrize("name", list(MODELS))
def test_logit_attrs_of_every_residual_decomposition_sum_to_the_logit(name):
    model, logits, cache, target, foil = run(name, ids())
    logit, diff = picked(logits, target), picked(logits, target, foil)
    assert isinstance(model.ln_final.hook_scale, torch.nn.Module) and not list(model.ln_final.parameters())
    stacks = {
        "decompose_resid": cache.decompose_resid(),
        "decompose_resid(mode=mlp)+(mode=attn)+embeds": torch.cat([
            cache.decompose_resid(mode="mlp", incl_embeds=False), cache.decompose_resid(mode="attn")]),
        "get_full_resid_decomposition": cache.get_full_resid_decomposition(expand_neurons=False),
        "get_full_resid_decomposition(expand_neurons)": cache.get_full_resid_decomposition(expand_neurons=True),
    }
    for label, stack in stacks.items():
        assert rel(cache.logit_attrs(stack, target).sum(0), logit) <= 1e-4, label
        assert rel(cache.logit_attrs(stack, target, incorrect_tokens=foil).sum(0), diff) <= 1e-4, label
    accumulated = cache.accumulated_resid(layer=-1, incl_mid=True)
    assert rel(cache.logit_attrs(accumulated[-1:], target)[0], logit) <= 1e-4
    # with the final norm applied per component and the unembedding direction projected in (TL's fused path)
    for expand in (False, True):
        for row in range(2):
            direction = model.W_U[:, target[row, -1]]
            fused = cache.get_full_resid_decomposition(expand_neurons=expand, apply_ln=True,
                                                       project_output_onto=direction, pos_slice=-1)
            assert rel(fused.sum(0)[row], logit[row, -1]) <= 1e-4


@pytest.mark.parametrize("name", list(MODELS))
def test_head_and_neuron_results_sum_to_each_layers_output(name):
    model, _, cache, _, _ = run(name, ids(seed=2))
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    heads, labels = cache.stack_head_results(layer=-1, return_labels=True)
    assert labels == [f"L{layer}H{h}" for layer in range(n_layers) for h in range(n_heads)]
    for layer in range(n_layers):
        attn_out = cache[f"blocks.{layer}.hook_attn_out"]
        assert rel(heads[layer * n_heads:(layer + 1) * n_heads].sum(0), attn_out) <= 1e-4
        neurons = cache.stack_neuron_results(layer + 1)[layer * model.cfg.d_mlp:]
        mlp_out = cache[f"blocks.{layer}.hook_mlp_out"]
        assert rel(neurons.sum(0), mlp_out) <= 1e-4
        # one neuron (an int slice drops the neuron axis, as TransformerLens' own does)
        one = cache.get_neuron_results(layer, neuron_slice=3)
        assert one.shape == mlp_out.shape
        torch.testing.assert_close(one, neurons[3])
        projected = cache.get_neuron_results(layer, project_output_onto=model.W_U[:, 5])
        torch.testing.assert_close(projected, neurons.movedim(0, -2) @ model.W_U[:, 5], rtol=1e-4, atol=1e-6)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), length=st.integers(1, 12), name=st.sampled_from(["bcos_gpt2", "bcos_llama"]))
def test_decomposition_is_exact_for_any_input(seed, length, name):
    model, logits, cache, target, _ = run(name, ids(seed=seed, batch=1, length=length))
    full = cache.get_full_resid_decomposition(expand_neurons=True)
    assert rel(cache.logit_attrs(full, target).sum(0), picked(logits, target)) <= 1e-4


def test_raw_weights_are_what_plain_activation_cache_reads_and_they_are_wrong_for_bcos():
    # why BcosActivationCache exists: TransformerLens' own cache multiplies z by the raw W_O
    model, _, cache, _, _ = run("bcos_gpt2", ids())
    assert isinstance(cache, BcosActivationCache)
    plain = ActivationCache(dict(cache.cache_dict), model)
    plain.cache_dict.pop("blocks.0.attn.hook_result", None)
    for layer in range(model.cfg.n_layers):
        plain.cache_dict.pop(f"blocks.{layer}.attn.hook_result", None)
    wrong = plain.stack_head_results(layer=1).sum(0)
    assert rel(wrong, cache["blocks.0.hook_attn_out"]) > 0.1


def test_use_attn_result_and_our_head_results_agree():
    cfg = BcosTransformerConfig(**SIZE, **GPT2_LIKE, seed=0, bcos_b=1.5, use_attn_result=True)
    with_result = BcosHookedTransformer(cfg).eval()
    without = model_named("native_bcos_gpt2_like")
    with_result.load_state_dict(without.state_dict())
    tokens = ids()
    _, a = with_result.run_with_cache(tokens)
    _, b = without.run_with_cache(tokens)
    torch.testing.assert_close(a.stack_head_results(), b.stack_head_results(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["bcos_gpt2", "bcos_llama"])
def test_effective_weights_reproduce_the_forward(name):
    model, _, cache, _, _ = run(name, ids())
    for layer in range(model.cfg.n_layers):
        x = cache[f"blocks.{layer}.ln1.hook_normalized"]
        w_q = effective_weight(cache, layer, "W_Q")  # (b, p, head, d_model, d_head)
        torch.testing.assert_close(torch.einsum("bpm,bphmd->bphd", x, w_q), cache[f"blocks.{layer}.attn.hook_q"],
                                   rtol=1e-4, atol=1e-6)
        w_v = effective_weight(cache, layer, "W_V")
        torch.testing.assert_close(torch.einsum("bpm,bphmd->bphd", x, w_v), cache[f"blocks.{layer}.attn.hook_v"],
                                   rtol=1e-4, atol=1e-6)
        w_o = effective_weight(cache, layer, "W_O")  # (b, p, head, d_head, d_model)
        z = cache[f"blocks.{layer}.attn.hook_z"]
        torch.testing.assert_close(torch.einsum("bphd,bphdm->bpm", z, w_o), cache[f"blocks.{layer}.hook_attn_out"],
                                   rtol=1e-4, atol=1e-6)
        post = cache[f"blocks.{layer}.mlp.hook_post"]
        w_out = effective_weight(cache, layer, "W_out")
        torch.testing.assert_close(torch.einsum("bpn,bpnm->bpm", post, w_out), cache[f"blocks.{layer}.hook_mlp_out"],
                                   rtol=1e-4, atol=1e-6)


def test_effective_weight_and_cache_errors():
    model, _, cache, _, _ = run("bcos_gpt2", ids())
    with pytest.raises(BcosError, match="projection: 'W_X' is not a projection"):
        effective_weight(cache, 0, "W_X")
    with pytest.raises(BcosError, match="layer: 5 is not a block index"):
        effective_weight(cache, 5, "W_O")
    with pytest.raises(BcosError, match="W_gate exists only in gated MLPs"):
        effective_weight(cache, 0, "W_gate")
    _, partial = model.run_with_cache(ids(), names_filter=lambda n: not n.endswith("hook_bcos_scale_o"))
    with pytest.raises(BcosError, match="blocks.0.attn.hook_bcos_scale_o is not in the cache"):
        partial.stack_head_results()


def test_state_dict_with_a_final_norm_weight_is_folded_on_loading():
    model = model_named("native_bcos_gpt2_like")
    state = dict(model.state_dict())
    weight = torch.linspace(0.5, 2.0, SIZE["d_model"])
    state["ln_final.w"] = weight
    state["unembed.W_U"] = state["unembed.W_U"] / weight[:, None]  # an unfolded checkpoint of the same model
    other = BcosHookedTransformer(BcosTransformerConfig(**SIZE, **GPT2_LIKE, seed=1, bcos_b=1.5)).eval()
    other.load_state_dict(state)
    tokens = ids()
    torch.testing.assert_close(other(tokens), model(tokens), rtol=1e-5, atol=1e-6)
    state["ln_final.b"] = torch.full((SIZE["d_model"],), 0.1)
    with pytest.raises(BcosError, match=r"ln_final.b'\] is not zero"):
        other.load_state_dict(state)


def test_shortformer_is_refused_with_a_reason():
    with pytest.raises(BcosError, match="shortformer.*enter only the queries and keys"):
        BcosTransformerConfig(**SIZE, act_fn="gelu", normalization_type="LN", positional_embedding_type="shortformer")
    plain = HookedTransformer(HookedTransformerConfig(**SIZE, act_fn="gelu", normalization_type="LN",
                                                      positional_embedding_type="shortformer"))
    with pytest.raises(BcosError, match="shortformer"):
        make_explainable(plain)


def test_cache_internals_check_fails_loudly_when_transformer_lens_changes(monkeypatch):
    from bcos_plugins.adapters._lens import decomposition

    decomposition.check_cache_internals()  # the installed TransformerLens routes results through our overrides
    monkeypatch.delattr(ActivationCache, "_stack_neuron_results_apply_ln_projected")
    with pytest.raises(BcosError, match="no longer has \\['_stack_neuron_results_apply_ln_projected'\\]"):
        model_named("bcos_gpt2").run_with_cache(ids())


@pytest.mark.parametrize("arch", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_stock_query_key_models_are_refused_not_rebuilt_wrong(arch):
    # a HookedTransformer would rebuild B-cos query/key layers from these stock weights: different logits
    hf = bcosify(tiny_model(arch), b=1.25, bcos_query_key=False, verbose=False)
    with pytest.raises(BcosError, match="bcos_query_key=False.*transformer_bridge_from_hf"):
        hooked_transformer_from_hf(hf)
