"""Trust pass 23, TransformerLens and sae-lens (helper-157): hooks that change activations (``model.hooks``,
``run_with_hooks``-style patches) under the adapter's explanations and TransformerLens' own cache decompositions,
each checked against an independent computation (the SAE's own encode of the cached activation, the cached
residual stream the components claim to sum to)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import random_standard_sae
from sae_lens import HookedSAETransformer
from test_conformance import B, _stock

from bcos_plugins import bcosify

warnings.filterwarnings("ignore", category=DeprecationWarning)

_BUILT: dict = {}
TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10]])


def _hooked(name: str = "GPT2LMHeadModel"):
    """(B-cos HF model, its HookedSAETransformer), built once."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    if name not in _BUILT:
        hf = bcosify(_stock(name), b=B, verbose=False).eval()
        _BUILT[name] = hf, hooked_transformer_from_hf(hf, model_class=HookedSAETransformer)
    return _BUILT[name]


def _own_pre_activation(model, sae, feature: int) -> torch.Tensor:
    """sae-lens' own hook_sae_acts_pre of the activation run_with_cache records (the hooks in place)."""
    _, cache = model.run_with_cache(TOKENS)
    grabbed = []
    with sae.hooks(fwd_hooks=[("hook_sae_acts_pre", lambda t, hook: grabbed.append(t))]):
        sae.encode(cache[sae.cfg.metadata.hook_name])
    return grabbed[0][:, -1, feature].detach()


@pytest.mark.parametrize("hook", ["blocks.0.hook_resid_mid", "blocks.0.hook_resid_post"])
def test_explain_sae_feature_warns_when_the_callers_hook_patches_an_activation(hook):
    """explain_sae_feature under the caller's hook that adds a vector (activation patching, mean ablation) upstream of
    or at the SAE's hook: the pre-activation is right (sae-lens' own encode of the cached activation), but the tokens'
    contributions miss the patched share (95 % of the explained value here), and nothing was said: explain_logits
    warned in the same case, explain_sae_feature did not. It now warns the same way, naming the hook; a hook that
    scales (zero / half ablation) keeps the explanation exact and is not warned about."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature

    _, model = _hooked()
    sae = random_standard_sae(model.cfg.d_model, "blocks.0.hook_resid_post")
    shift = torch.linspace(0, 1, model.cfg.d_model)
    with model.hooks(fwd_hooks=[(hook, lambda x, hook: x + shift)]):
        with pytest.warns(UserWarning, match=rf"explain_sae_feature: .*forward hooks on {hook}.*model.reset_hooks") \
                as record:
            explanation = explain_sae_feature(model, TOKENS, sae, 3)
        own = _own_pre_activation(model, sae, 3)
    assert [w.filename for w in record if "forward hooks" in str(w.message)] == [__file__]  # the caller's line
    torch.testing.assert_close(explanation.pre_activation, own, rtol=1e-5, atol=1e-5)
    gap = (explanation.total - explanation.explained).abs() / explanation.explained.abs()
    assert gap.item() > 0.1  # what the warning is about
    with model.hooks(fwd_hooks=[(hook, lambda x, hook: x * 0.5)]), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        halved = explain_sae_feature(model, TOKENS, sae, 3)
        own = _own_pre_activation(model, sae, 3)
    torch.testing.assert_close(halved.pre_activation, own, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(halved.total + halved.bias_terms, halved.pre_activation, rtol=1e-5, atol=1e-5)


def _d_model_shift(model) -> torch.Tensor:
    return torch.linspace(-1, 1, model.cfg.d_model)


# (hook, what it does, the cache call that read past it, what the components are checked against independently)
_CHANGING_HOOKS = [
    ("blocks.1.hook_resid_pre", lambda x, hook: x * 0.5,
     lambda cache: cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=3, pos_slice=-1), "stream"),
    ("blocks.0.hook_resid_mid", lambda x, hook: x + torch.linspace(-1, 1, x.shape[-1]),
     lambda cache: cache.get_full_resid_decomposition(expand_neurons=False), "stream"),
    ("blocks.0.hook_attn_out", lambda x, hook: x * 0, lambda cache: cache.stack_head_results(layer=-1), "heads"),
    ("blocks.0.hook_mlp_out", lambda x, hook: x + torch.linspace(-1, 1, x.shape[-1]),
     lambda cache: cache.stack_neuron_results(layer=-1), "neurons"),
    ("ln_final.hook_normalized", lambda x, hook: x + torch.linspace(-1, 1, x.shape[-1]),
     lambda cache: cache.logit_attrs(cache.accumulated_resid(pos_slice=-1), tokens=3, pos_slice=-1), "final"),
]


def _components_miss(cache, clean, model, check: str) -> float:
    """How far the cached value a decomposition splits is from what its components sum to, by hand from the caches
    (``clean``: the same forward without the hook): the stream against embeddings + attention + MLP outputs, a block's
    output against the one its heads / neurons computed (the clean run's: the hook sits after them), the final norm's
    output against the centred stream over its cached scale."""
    last = model.cfg.n_layers - 1
    if check == "stream":
        total = cache["hook_embed"] + cache["hook_pos_embed"]
        for layer in range(model.cfg.n_layers):
            total = total + cache[f"blocks.{layer}.hook_attn_out"] + cache[f"blocks.{layer}.hook_mlp_out"]
        return float((total - cache[f"blocks.{last}.hook_resid_post"]).abs().max())
    if check in ("heads", "neurons"):
        name = "blocks.0.hook_attn_out" if check == "heads" else "blocks.0.hook_mlp_out"
        return float((cache[name] - clean[name]).abs().max())
    resid = cache[f"blocks.{last}.hook_resid_post"]
    centred = resid - resid.mean(-1, keepdim=True)
    return float((centred / cache["ln_final.hook_scale"] - cache["ln_final.hook_normalized"]).abs().max())


@pytest.mark.parametrize(("hook", "change", "call", "check"), _CHANGING_HOOKS, ids=[h[0] for h in _CHANGING_HOOKS])
def test_a_cache_run_under_a_hook_that_changed_what_it_decomposes_is_refused(hook, change, call, check):
    """run_with_cache under the caller's hook that patches or ablates the residual stream, an attention / MLP output or
    the final norm's output: TransformerLens' decompositions split the cache into components computed before the hook
    (embeddings, attention and MLP outputs; per-head / per-neuron results from z / post; the stack over the cached
    norm scale), which no longer sum to the patched value. decompose_resid + logit_attrs missed a logit by 0.014,
    stack_head_results kept a zero-ablated attn_out's heads (0.67 off), logit_attrs under a patched ln_final output
    missed 0.087, all without a word. The cache now refuses, naming the hook."""
    from bcos_plugins.errors import BcosValueError

    _, model = _hooked()
    _, clean = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[(hook, change)]):
        _, cache = model.run_with_cache(TOKENS)
    assert _components_miss(cache, clean, model, check) > 1e-2  # what the refusal is about
    with pytest.raises(BcosValueError, match=rf"cache: .*hook at {hook} that changed the value there.*reset_hooks"):
        call(cache)


def test_a_cache_run_under_hooks_that_keep_the_sums_decomposes_as_without_them():
    """Hooks that only read (at every hook point), or change what the components are computed from (a head's z
    zero-ablated, a scale, the embeddings), keep the decompositions exact: nothing is refused, the read-only run's
    decompositions are bit-identical to the unhooked ones, and a zero-ablated head's results sum to hook_attn_out."""
    _, model = _hooked()
    calls = [lambda c: c.decompose_resid(apply_ln=True), lambda c: c.get_full_resid_decomposition(apply_ln=True),
             lambda c: c.get_full_resid_decomposition(layer=1, mlp_input=True), lambda c: c.stack_head_results(),
             lambda c: c.stack_neuron_results(layer=-1, apply_ln=True),
             lambda c: c.logit_attrs(c.decompose_resid(pos_slice=-1), tokens=3, pos_slice=-1)]
    _, clean = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[(name, lambda x, hook: x) for name in model.hook_dict]):
        _, read_only = model.run_with_cache(TOKENS)
    assert read_only.hooked_at_run  # the hooks were there
    for call in calls:
        assert torch.equal(call(read_only), call(clean))

    def ablate_head_0(z, hook):
        z[:, :, 0] = 0
        return z

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", ablate_head_0), ("hook_embed", lambda x, hook: x * 0.5),
                                ("blocks.1.attn.hook_bcos_scale_o", lambda x, hook: x * 3)]):
        logits, cache = model.run_with_cache(TOKENS)
    heads = cache.stack_head_results(layer=-1)
    attn_out = cache["blocks.0.hook_attn_out"] + cache["blocks.1.hook_attn_out"]
    torch.testing.assert_close(heads.sum(0), attn_out, rtol=1e-5, atol=1e-6)
    assert heads[0].abs().max() == 0  # L0H0, ablated
    attrs = cache.logit_attrs(cache.get_full_resid_decomposition(pos_slice=-1), tokens=3, pos_slice=-1)
    torch.testing.assert_close(attrs.sum(0), logits[:, -1, 3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
def test_token_component_decomposition_under_a_patching_hook_names_the_hook_not_biases(kind):
    """token_component_decomposition under the caller's hook that adds a vector to the residual stream refused (right:
    the table misses the patched share), but blamed "e.g. non-zero biases" of a bias-free B-cos model and told the user
    to B-cosify it. It now names the hook and the fix."""
    from bcos_plugins.adapters.transformer_lens import (
        token_component_decomposition,
        transformer_bridge_from_hf,
    )

    from bcos_plugins.errors import BcosValueError

    hf, model = _hooked()
    if kind == "bridge":
        model = transformer_bridge_from_hf(hf)
    shift = _d_model_shift(model)
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, hook: x + shift)]):
        # (a bridge lists the hook point under its aliases too: blocks.0.ln2.hook_in)
        with pytest.raises(BcosValueError, match=r"forward hooks on .*blocks\.0\.hook_resid_mid .*reset_hooks") \
                as error:
            token_component_decomposition(model, TOKENS, target=3)
    assert "biases" not in str(error.value) and "bcosify" not in str(error.value)

    def ablate_head_0(z, hook):
        z[:, :, 0] = 0
        return z

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", ablate_head_0)]):
        table = token_component_decomposition(model, TOKENS, target=3)
    torch.testing.assert_close(table.table.sum((1, 2)), table.explained, rtol=1e-4, atol=1e-5)
    assert table.table[..., table.labels.index("L0H0")].abs().max() == 0


@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
@pytest.mark.parametrize("options", [{}, {"fold_ln": False, "center_writing_weights": False, "center_unembed": False,
                                          "fold_value_biases": False}], ids=["defaults", "every-option-off"])
def test_the_bridges_compatibility_mode_refuses_to_process_a_bcos_models_weights(name, options):
    """bridge.enable_compatibility_mode() (TransformerLens' HookedTransformer-style weight processing, on by default)
    rewrote a B-cos bridge into another model: logits 0.04 (GPT-2) / 0.16 (Llama) off the transformers model's, 0.15
    on Llama with every option off (the processed-weights forward; GPT-2 stays exact then), and explain_logits then
    explained that model,
    exactly and without a word. It is refused now, before anything changes (the bridge still computes the model's
    logits); no_processing=True (the legacy hook names, the weights as they are) stays exact."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf

    from bcos_plugins.errors import BcosValueError

    hf = bcosify(_stock(name), b=B, verbose=False).eval()
    with torch.no_grad():
        reference = hf(TOKENS).logits
    processed = transformer_bridge_from_hf(hf)
    processed.__class__ = type(processed).__mro__[1]  # TransformerLens' own TransformerBridge
    processed.enable_compatibility_mode(disable_warnings=True, **options)
    with torch.no_grad():
        moved = float((processed(TOKENS) - reference).abs().max())
    # what the refusal is about (GPT-2 with every option off happens to stay exact: refused all the same, as the one
    # rule for B-cos bridges, with no_processing=True as the way to the same bridge)
    assert moved > 1e-2 if (options == {} or name == "LlamaForCausalLM") else moved < 1e-5
    bridge = transformer_bridge_from_hf(hf)
    with pytest.raises(BcosValueError, match=r"enable_compatibility_mode: .*B-cos .*no_processing=True"):
        bridge.enable_compatibility_mode(disable_warnings=True, **options)
    with pytest.raises(BcosValueError, match=r"bridge\.process_weights: "):
        bridge.process_weights(**options)
    with torch.no_grad():
        torch.testing.assert_close(bridge(TOKENS), reference, rtol=1e-5, atol=1e-5)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    explained = explain_logits(bridge, TOKENS, target=3)
    torch.testing.assert_close(explained.explained, reference[:, -1, 3], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(explained.total, explained.explained, rtol=1e-5, atol=1e-5)


# on a bridge hook_resid_mid is an alias of ln2.hook_in: a hook there feeds the MLP without changing the stream
_BRIDGE_CHANGING_HOOKS = [h for h in _CHANGING_HOOKS if h[3] != "neurons" and h[0] != "blocks.0.hook_resid_mid"]


@pytest.mark.parametrize(("hook", "change", "call", "check"), _BRIDGE_CHANGING_HOOKS,
                         ids=[h[0] for h in _BRIDGE_CHANGING_HOOKS])
def test_a_bridge_cache_run_under_a_hook_that_changed_what_it_decomposes_is_refused(hook, change, call, check):
    """The same on a TransformerBridge from transformer_bridge_from_hf (TransformerLens' own ActivationCache):
    decompose_resid + logit_attrs under a halved resid_pre missed the logit by 0.041 on a tiny B-cos Llama bridge,
    silently. The bridge's run_with_cache records the hooked points and its cache refuses, naming the hook (a patched
    hook_attn_out was refused already, as "a norm follows it": the hook is named now too); a read-only hook at every
    hook point leaves every decomposition bit-identical."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    from bcos_plugins import BcosError

    hf = bcosify(_stock("LlamaForCausalLM"), b=B, verbose=False).eval()
    bridge = transformer_bridge_from_hf(hf)
    _, clean = bridge.run_with_cache(TOKENS)
    with bridge.hooks(fwd_hooks=[(hook, change)]):
        _, cache = bridge.run_with_cache(TOKENS)
    if check == "stream":  # rotary: no hook_pos_embed
        total = cache["hook_embed"] + sum(cache[f"blocks.{layer}.hook_attn_out"] + cache[f"blocks.{layer}.hook_mlp_out"]
                                          for layer in range(bridge.cfg.n_layers))
        miss = float((total - cache[f"blocks.{bridge.cfg.n_layers - 1}.hook_resid_post"]).abs().max())
    elif check == "heads":
        miss = float((cache[hook] - clean[hook]).abs().max())
    else:  # RMSNorm: the stream over its cached scale
        resid = cache[f"blocks.{bridge.cfg.n_layers - 1}.hook_resid_post"]
        miss = float((resid / cache["ln_final.hook_scale"] - cache["ln_final.hook_normalized"]).abs().max())
    assert miss > 1e-2  # what the refusal is about
    with pytest.raises(BcosError, match=rf"hook at {hook} that changed the value there|forward hook changed "
                       rf"{hook.rpartition('.')[2]}"):
        call(cache)
    reads = [n for n in bridge.hook_dict if not any(k in n for k in ("attn_in", "_input", "mlp_in", "hook_result"))]
    with bridge.hooks(fwd_hooks=[(name, lambda x, hook: x) for name in reads]):  # (those need set_use_* first)
        _, read_only = bridge.run_with_cache(TOKENS)
    assert torch.equal(call(read_only), call(clean))


def test_a_bridge_cache_under_a_hook_at_its_resid_mid_alias_decomposes_the_unchanged_stream():
    """On a bridge blocks.L.hook_resid_mid is ln2's input hook: a hook there changes what the MLP reads, not the
    residual stream (the decoder layer adds the attention output to its own copy), so the components still sum to the
    stream and the decompositions stay exact: not refused, and logit_attrs sums to the patched run's logit."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    hf = bcosify(_stock("LlamaForCausalLM"), b=B, verbose=False).eval()
    bridge = transformer_bridge_from_hf(hf)
    with bridge.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, hook: x + _d_model_shift(bridge))]):
        logits, cache = bridge.run_with_cache(TOKENS)
    assert (cache["blocks.0.hook_resid_mid"] - cache["blocks.0.hook_resid_pre"] - cache["blocks.0.hook_attn_out"]
            ).abs().max() > 0.5  # the hook did change what it hooked
    attrs = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=3, pos_slice=-1)
    torch.testing.assert_close(attrs.sum(0), logits[:, -1, 3], rtol=1e-5, atol=1e-5)


def test_an_saes_biases_carry_the_share_the_lens_explanations_docstring_now_names():
    """LensExplanation said ``total + sum(sae_error_shares.values()) == explained`` with SAEs spliced in; with an SAE's
    biases (every trained SAE has b_enc / b_dec) that misses their share, 0.29 of a logit here. The docstring now says
    so and points at sae_error_share(...).other_share, which closes the sum; with the biases zeroed the two agree."""
    from bcos_plugins.adapters.sae_lens import sae_error_share

    _, model = _hooked()
    sae = random_standard_sae(model.cfg.d_model, "blocks.0.hook_resid_post")
    model.add_sae(sae, use_error_term=True)
    try:
        shares = sae_error_share(model, TOKENS, target=3)
        explanation = shares.explanation
        assert (explanation.total + explanation.sae_error_share - explanation.explained).abs().item() > 0.1
        torch.testing.assert_close(explanation.total + shares.error_share + shares.other_share, explanation.explained)
        with torch.no_grad():
            sae.b_enc.zero_()
            sae.b_dec.zero_()
        unbiased = sae_error_share(model, TOKENS, target=3)
        torch.testing.assert_close(unbiased.explanation.total + unbiased.explanation.sae_error_share,
                                   unbiased.explanation.explained, rtol=1e-5, atol=1e-6)
    finally:
        model.reset_saes()


def _greedy(hf, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """The transformers model's own greedy continuation, one full forward per token (no cache)."""
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, hf(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@pytest.mark.parametrize(("name", "bcos"), [("GPT2LMHeadModel", True), ("LlamaForCausalLM", True),
                                            ("LlamaForCausalLM", False)])
def test_a_bridge_generates_the_models_own_tokens_without_the_kv_cache_path(name, bcos):
    """bridge.generate (TransformerLens' default use_past_kv_cache=True) left the transformers model's own greedy
    tokens from the second new token on, on a tiny B-cos GPT-2 bridge (a token outside the model's top 3) and on B-cos
    and plain Llama-family bridges, without a word. The bridges from transformer_bridge_from_hf generate without the
    cache by default now (the model's tokens, generate and generate_stream) and refuse use_past_kv_cache=True."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    from bcos_plugins.errors import BcosValueError

    hf = _stock(name)
    hf = (bcosify(hf, b=B, verbose=False) if bcos else hf).eval()
    ids = torch.tensor([[1, 9, 10]])
    reference = _greedy(hf, ids, 4)
    cached = transformer_bridge_from_hf(hf)
    cached.__class__ = type(cached).__mro__[1]  # TransformerLens' own TransformerBridge
    own = cached.generate(ids, max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False)
    assert own.tolist() != reference.tolist()  # what the change is about
    bridge = transformer_bridge_from_hf(hf)
    generated = bridge.generate(ids, max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False)
    assert generated.tolist() == reference.tolist()
    streamed = list(bridge.generate_stream(ids, max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False))
    assert streamed[-1].tolist() == reference.tolist()
    with pytest.raises(BcosValueError, match=r"use_past_kv_cache: bridge\.generate .*key-value cache"):
        bridge.generate(ids, max_new_tokens=4, do_sample=False, verbose=False, use_past_kv_cache=True)


@pytest.mark.parametrize(("hook", "call"), [
    ("blocks.0.hook_attn_out", lambda cache: cache.stack_head_results(layer=-1)),
    ("blocks.0.hook_mlp_out", lambda cache: cache.stack_neuron_results(layer=-1))], ids=["heads", "neurons"])
def test_per_head_and_neuron_stacks_refuse_an_sae_spliced_at_the_output_without_its_error_term(hook, call):
    """An SAE spliced at hook_attn_out / hook_mlp_out without its error term puts its reconstruction in the residual
    stream; stack_head_results / stack_neuron_results (TransformerLens: "residual stream contributions") kept the
    heads' / neurons' shares of the block's own output, which miss the SAE's error, without a word
    (get_full_resid_decomposition refused already). They refuse now; with the error term they sum to the output."""
    from bcos_plugins.errors import BcosError

    _, model = _hooked()
    _, clean = model.run_with_cache(TOKENS)
    sae = random_standard_sae(model.cfg.d_model, hook)
    try:
        model.add_sae(sae, use_error_term=False)
        _, cache = model.run_with_cache(TOKENS)
        assert (cache[hook] - clean[hook]).abs().max() > 1e-2  # the stream holds the reconstruction, not the output
        with pytest.raises(BcosError, match=r"cache: stack_(head|neuron)_results: .*without their error terms"):
            call(cache)
        model.reset_saes()
        model.add_sae(sae, use_error_term=True)
        _, cache = model.run_with_cache(TOKENS)
        torch.testing.assert_close(call(cache).sum(0), cache[hook] + (cache["blocks.1.hook_attn_out"] if "attn" in hook
                                   else cache["blocks.1.hook_mlp_out"]), rtol=1e-5, atol=1e-5)
    finally:
        model.reset_saes()
