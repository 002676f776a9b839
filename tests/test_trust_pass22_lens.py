"""Trust pass 22, TransformerLens and sae-lens (helper-138): unusual inputs through the hosts' own calls on the models
``transformer_bridge_from_hf`` and ``hooked_transformer_from_hf`` build, each checked against an independent
computation (the HF model on each text alone, the float64 reference, completeness)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_conformance import B, _stock
from transformer_lens import utils as lens_utils

from bcos_plugins import bcosify
from bcos_plugins.errors import UnmaskedPaddingWarning

warnings.filterwarnings("ignore", category=DeprecationWarning)

_BUILT: dict = {}


def _bridge(name: str):
    """(B-cos HF model, its bridge without a tokenizer: the placeholder's pad id is the cfg's)."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    if name not in _BUILT:
        hf = bcosify(_stock(name), b=B, verbose=False).eval()
        _BUILT[name] = hf, transformer_bridge_from_hf(hf)
    return _BUILT[name]


def _padded(side: str, pad: int) -> torch.Tensor:
    rows = [[5, 6, 7, 8, 9], [10, 11, 12]]
    width = max(map(len, rows))
    fill = [[pad] * (width - len(r)) for r in rows]
    return torch.tensor([f + r if side == "left" else r + f for r, f in zip(rows, fill, strict=True)])


@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_bridges_own_forward_warns_about_a_padded_token_batch_without_its_mask(name, side):
    """run_with_cache(tokens) / run_with_hooks / bridge(tokens) of a padded batch without a mask: TransformerLens derives
    no mask for a token tensor, so the shorter row's values differ from the row alone (left: at every real token; right:
    position -1 is a pad token), which passed without a word (only explain_logits and token_component_decomposition
    warned). The bridge's forward, the one place all of them go through, now warns, naming attention_mask and
    get_attention_mask; with the mask, or one row, nothing is said."""
    hf, bridge = _bridge(name)
    pad = bridge.tokenizer.pad_token_id
    tokens = _padded(side, pad)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UnmaskedPaddingWarning)
        alone = hf(tokens[1:, (2 if side == "left" else 0):(None if side == "left" else 3)]).logits[0, -1]
        unmasked = bridge(tokens)[1, -1]
    assert (unmasked - alone).abs().max() > 1e-3  # what the warning is about: the shorter row's last position differs
    for call in (lambda: bridge.run_with_cache(tokens), lambda: bridge(tokens),
                 lambda: bridge.run_with_hooks(tokens, fwd_hooks=[])):
        with pytest.warns(UnmaskedPaddingWarning, match=r"attention_mask.*get_attention_mask") as record:
            call()
        assert [w.filename for w in record if w.category is UnmaskedPaddingWarning] == [__file__]  # the caller's line
    mask = lens_utils.get_attention_mask(bridge.tokenizer, tokens, prepend_bos=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmaskedPaddingWarning)
        bridge.run_with_cache(tokens, attention_mask=mask)
        bridge.run_with_cache(tokens[:1])


def test_explain_logits_on_a_bridge_warns_once_about_a_padded_batch_without_its_mask():
    """The adapter's entry points leave the warning to the bridge's forward (the same detection), so one call warns
    once, not once in the token check and again in the forward."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    _, bridge = _bridge("LlamaForCausalLM")
    tokens = _padded("left", bridge.tokenizer.pad_token_id)
    for call in (explain_logits, token_component_decomposition):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            call(bridge, tokens, target=3, position=-1)
        assert [w.category for w in record if w.category is UnmaskedPaddingWarning] == [UnmaskedPaddingWarning]


def _eager(hf):
    import copy

    eager = copy.deepcopy(hf)
    eager.config._attn_implementation = "eager"
    return eager


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel"])
def test_what_stays_float32_in_a_float64_bridge_is_the_eager_attention_softmax(name):
    """A float64 bridge was 3e-8 off the float64 HF model (docs/hosts/transformer-lens.md says why, pinned here): the
    one float32 step is TransformerLens' rotary attention bridge's softmax (``softmax(scores, dtype=torch.float32)``, as
    transformers' eager attention computes it), so a float64 B-cos bridge is the float64 HF model run with eager
    attention bit for bit, 1e-8-ish off the default sdpa one (float64 throughout); GPT-2's bridge keeps the dtype. Its
    explanation is complete to float64's rounding on that forward."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf

    hf = bcosify(_stock(name), b=B, verbose=False).eval().double()
    bridge = transformer_bridge_from_hf(hf)
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        logits, sdpa, eager = bridge(tokens), hf(tokens).logits, _eager(hf)(tokens).logits
    assert logits.dtype == torch.float64 and hf.config._attn_implementation == "sdpa"
    if name == "GPT2LMHeadModel":
        assert (logits - sdpa).abs().max() < 1e-13
    else:
        assert torch.equal(logits, eager)
        assert 1e-12 < (logits - sdpa).abs().max() < 1e-6  # the float32 softmax: not float64's rounding, not more
    assert float(explain_logits(bridge, tokens, target=3).completeness_error.max()) < 1e-12


def test_a_plain_float64_llama_bridge_differs_from_the_hf_model_by_its_float32_rms_norm_only(monkeypatch):
    """On a plain float64 Llama the bridge also differs from the eager HF model: transformers' LlamaRMSNorm normalises
    in float32 even in a float64 model, while the bridge's detachable RMSNorm stays in float64. With that norm in float64
    the two are bit-identical (the bridge is the more precise side)."""
    import transformers.models.llama.modeling_llama as llama
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    hf = _stock("LlamaForCausalLM").double()
    bridge = transformer_bridge_from_hf(hf)
    eager = _eager(hf)
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        logits, stock = bridge(tokens), eager(tokens).logits
        assert 1e-12 < (logits - stock).abs().max() < 1e-6

        def float64_norm(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

        monkeypatch.setattr(llama.LlamaRMSNorm, "forward", float64_norm)
        assert torch.equal(logits, eager(tokens).logits)


@pytest.mark.parametrize("attached", [False, True])
def test_explain_sae_feature_names_another_features_non_finite_encoder_column(attached):
    """A NaN in another feature's encoder column (a dead or diverged feature) made every feature's explanation fail
    with "the gradient at the attribution point is NaN ... Check the inputs" (the backward of sae_in @ W_enc multiplies
    that column by zero): now refused naming the SAE, the broken features and the fix, which then explains the
    feature exactly (its pre-activation is unchanged by the other column)."""
    from bcos_plugins.adapters.sae_lens import explain_sae_feature
    from test_sae_feature import _lens_model, _sae, _sae_lens_pre_activations

    from bcos_plugins import BcosError

    model = _lens_model("LlamaForCausalLM")
    sae = _sae(model.cfg.d_model)
    if attached:
        model.add_sae(sae)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        sae.W_enc[0, 5] = float("nan")
    with pytest.raises(BcosError, match=r"^sae: W_enc holds NaN or infinite values in the encoder column\(s\) of "
                                        r"feature\(s\) \[5\].*sae\.W_enc\[:, bad\] = 0"):
        explain_sae_feature(model, tokens, sae, 3)
    with torch.no_grad():
        sae.W_enc[:, 5] = 0
    explanation = explain_sae_feature(model, tokens, sae, 3)
    want = _sae_lens_pre_activations(model, sae, tokens)[:, -1, 3]
    torch.testing.assert_close(explanation.total + explanation.bias_terms, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bcos", [False, True])
def test_run_with_cache_without_the_batch_dimension_on_a_qk_norm_model(bcos):
    """``run_with_cache(tokens, remove_batch_dim=True)`` of a Qwen3 from ``hooked_transformer_from_hf`` failed with an
    IndexError inside TransformerLens (its QK-norm hooks are cached as (batch * pos * heads, ...) rows, which lose a
    dimension to the batch removal); now every entry is the batched cache's row 0 (the QK-norm rows as they are), and
    the exact per-head results still sum to attn_out."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    hf = _stock("Qwen3ForCausalLM")
    model = hooked_transformer_from_hf(bcosify(hf, b=B, verbose=False).eval() if bcos else hf)
    tokens = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        _, batched = model.run_with_cache(tokens)
        _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
        _, last = model.run_with_cache(tokens, remove_batch_dim=True, pos_slice=-1)
    assert set(cache.keys()) == set(batched.keys())
    for name in batched.keys():
        flattened = ".q_norm." in name or ".k_norm." in name
        assert torch.equal(cache[name], batched[name] if flattened else batched[name][0]), name
    assert torch.equal(last["blocks.1.hook_resid_post"], batched["blocks.1.hook_resid_post"][0, -1:])
    heads = cache.stack_head_results(layer=-1)
    attn_out = sum(cache[f"blocks.{layer}.hook_attn_out"] for layer in range(model.cfg.n_layers))
    b_o = sum(model.blocks[layer].attn.b_O for layer in range(model.cfg.n_layers))
    torch.testing.assert_close(heads.sum(0) + b_o, attn_out, rtol=1e-5, atol=1e-5)


def _spliced_cache(hook: str, use_error_term: bool):
    import copy

    from test_sae_feature import _lens_model, _sae

    if "model" not in _BUILT:
        _BUILT["model"] = _lens_model("LlamaForCausalLM")
    model = copy.deepcopy(_BUILT["model"])
    sae = _sae(model.cfg.d_model, hook)
    with torch.no_grad():
        sae.W_dec.div_(model.cfg.d_model)  # a reconstruction of the stream's size
    model.add_sae(sae, use_error_term=use_error_term)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return logits[:, -1, 3], cache


def _summed_logit_attrs(cache, stack) -> torch.Tensor:
    return cache.logit_attrs(stack, tokens=torch.tensor([3, 3]), pos_slice=-1).sum(0)


@pytest.mark.parametrize("hook", ["blocks.1.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out"])
def test_a_spliced_saes_cache_decomposes_the_stream_it_ran_or_refuses(hook):
    """HookedSAETransformer (B-cos) with an SAE spliced in, through TransformerLens' own cache calls. Without its error
    term an SAE on the residual stream replaces it by a reconstruction that no component carries: decompose_resid and
    get_full_resid_decomposition summed to a number 0.31 off a 0.31 logit, silently; now refused, naming cache and
    use_error_term. An SAE on hook_attn_out / hook_mlp_out replaced the hook, so decompose_resid and accumulated_resid
    failed with a KeyError on it; the SAE's output (what the stream carried on with) stands for it now, so the stack's
    logit_attrs sum to the logit (per-head / per-neuron results, taken before that SAE, refuse it without its error
    term). With the error term every decomposition sums to the logit."""
    from bcos_plugins import BcosError

    want, cache = _spliced_cache(hook, use_error_term=False)
    accumulated = cache.logit_attrs(cache.accumulated_resid(pos_slice=-1), tokens=torch.tensor([3, 3]), pos_slice=-1)
    torch.testing.assert_close(accumulated[-1], want, rtol=1e-5, atol=1e-6)
    refusal = rf"^cache: {{}}: it comes from a model with SAEs spliced in without their error terms at \['{hook}'\]" \
              r".*use_error_term=True"
    with pytest.raises(BcosError, match=refusal.format("get_full_resid_decomposition")):
        cache.get_full_resid_decomposition(pos_slice=-1)
    if hook.endswith("hook_resid_pre"):
        with pytest.raises(BcosError, match=refusal.format("decompose_resid")):
            cache.decompose_resid(pos_slice=-1)
    else:
        torch.testing.assert_close(_summed_logit_attrs(cache, cache.decompose_resid(pos_slice=-1)), want,
                                   rtol=1e-5, atol=1e-6)
    want, cache = _spliced_cache(hook, use_error_term=True)
    for stack in (cache.decompose_resid(pos_slice=-1), cache.get_full_resid_decomposition(pos_slice=-1)):
        torch.testing.assert_close(_summed_logit_attrs(cache, stack), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_the_lens_builders_refuse_a_model_on_the_meta_device_and_a_bridge(name):
    """A model on the meta device failed deep inside (transformer_bridge_from_hf: "NotImplementedError: aten::equal",
    hooked_transformer_from_hf: "Tensor.item() cannot be called on meta tensors"); a bridge passed as the model booted a
    bridge over the bridge (GPT-2: refused as an MLP activation "HookPoint (hook_in)" without a detachable form). Both
    are refused naming hf_model and the fix."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf, transformer_bridge_from_hf

    from bcos_plugins import BcosError

    meta = bcosify(_stock(name), b=B, verbose=False).eval().to("meta")
    for build in (transformer_bridge_from_hf, hooked_transformer_from_hf):
        with pytest.raises(BcosError, match=r"^hf_model: its parameters are on the meta device.*Load the weights"):
            build(meta)
    _, bridge = _bridge(name)
    with pytest.raises(BcosError, match=r"^hf_model: is a TransformerBridge already.*Use the bridge as it is"):
        transformer_bridge_from_hf(bridge)


def test_bilinear_sae_interactions_name_their_own_arguments_and_take_float64_activations():
    """BilinearSAEInteractions: float64 activations of a float32 layer failed in output_activations' matmul ("expected
    m1 and m2 to have the same dtype"; the other methods cast them); a rank above the number of eigenvalues was refused
    as "k: k=100 must lie in [0, 8]" (an argument the caller never passed); an empty batch as a width mismatch naming
    the very width it had. Now: the layer's dtype, and refusals naming rank / mlp_inputs with the real problem."""
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from test_sae_lens_adapter import D_MODEL, layer_and_inputs, topk_sae

    from bcos_plugins import BcosError

    layer, x = layer_and_inputs(seed=3)
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL, seed=5), topk_sae(D_MODEL, seed=4))
    torch.testing.assert_close(analysis.output_activations(x.double()), analysis.output_activations(x))
    with pytest.raises(BcosError, match=r"^rank: must be <= 8, got 100\. Pass a rank in \[1, 8\]"):
        analysis.low_rank_approximation(x, [2], rank=100)
    empty = torch.zeros(0, D_MODEL)
    for call in (lambda: analysis.low_rank_approximation(empty, [2], rank=2),
                 lambda: analysis.low_rank_correlation(empty, [2]), lambda: analysis.output_activations(empty)):
        with pytest.raises(BcosError, match=r"^mlp_inputs: shape \(0, 8\) holds no tokens"):
            call()


def test_bilinear_sae_interactions_spectrum_of_one_feature_given_as_a_numpy_or_tensor_integer():
    """spectrum(feature) returns one feature's eigendecomposition for an int, but for a NumPy integer or a 0-d tensor
    (an argmax) it returned the batched form, (1, d_in): eig.eigenvalues[-1], the largest eigenvalue, was then the whole
    row, silently. Every integer scalar is one feature now."""
    import numpy as np
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from test_sae_lens_adapter import D_MODEL, layer_and_inputs, topk_sae

    layer, _ = layer_and_inputs(seed=3)
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL, seed=5), topk_sae(D_MODEL, seed=4))
    want = analysis.spectrum(2)
    assert want.eigenvalues.shape == (D_MODEL,)
    for feature in (np.int64(2), torch.tensor(2), torch.tensor(2, dtype=torch.int32)):
        got = analysis.spectrum(feature)
        assert got.eigenvalues.shape == (D_MODEL,)
        torch.testing.assert_close(got.eigenvalues, want.eigenvalues)
    assert analysis.spectrum([2]).eigenvalues.shape == (1, D_MODEL)  # a list stays a batch


@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_a_hooked_transformer_with_a_left_padding_tokenizer_is_explained_without_a_false_padding_warning(name):
    """A HookedTransformer whose tokenizer pads on the left derives the batch's mask in its own forward, so
    explain_logits(model, model.to_tokens(texts)) without a mask equals each text alone, but the adapter warned that
    the padding was attended to as tokens (it was not), and read positions as if there were no padding. The mask the
    forward derives goes on explicitly now: no warning, the same values, and a padding position is refused."""
    from bcos_plugins.adapters.transformer_lens import (
        explain_logits,
        hooked_transformer_from_hf,
        token_component_decomposition,
    )
    from test_trust_pass21_bridge_padding import TEXTS, _tokenizer

    from bcos_plugins import BcosError

    hf = bcosify(_stock(name), b=B, verbose=False).eval()
    model = hooked_transformer_from_hf(hf, tokenizer=_tokenizer("left"))
    tokens = model.to_tokens(TEXTS)
    assert bool((tokens[1] == model.tokenizer.pad_token_id).any())  # the short row is padded on the left
    with torch.no_grad():
        alone = torch.stack([hf(model.to_tokens(text)).logits[0, -1, 5] for text in TEXTS])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmaskedPaddingWarning)
        explained = explain_logits(model, tokens, target=5)
        shares = token_component_decomposition(model, tokens, target=5)
    torch.testing.assert_close(explained.explained, alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shares.explained, alone, rtol=1e-5, atol=1e-6)
    with pytest.raises(BcosError, match="position: .*padding"):
        explain_logits(model, tokens, target=5, position=0)
