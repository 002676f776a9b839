"""explain_sae_feature: an SAE feature's pre-activation split exactly into token contributions + bias terms."""

from __future__ import annotations

import pytest
import torch
from bcos_plugins.adapters.sae_lens import SAEFeatureExplanation, explain_sae_feature
from conftest import tiny_model
from sae_lens import HookedSAETransformer, StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata

from bcos_plugins import BcosError, bcosify

RTOL = 1e-4
HOOK = "blocks.1.hook_resid_pre"


def _rel(got, want) -> float:
    return float(((got - want).abs() / want.abs().clamp_min(1e-6)).max())


def _lens_model(class_name: str):
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    return hooked_transformer_from_hf(bcosify(tiny_model(class_name), b=1.5, verbose=False),
                                      model_class=HookedSAETransformer)


def _sae(d_in: int, hook_name: str = HOOK, *, kind: str = "standard", apply_b_dec_to_input: bool = True, seed=0):
    metadata = SAEMetadata(hook_name=hook_name)
    if kind == "topk":
        sae = TopKSAE(TopKSAEConfig(d_in=d_in, d_sae=3 * d_in, k=4, rescale_acts_by_decoder_norm=True,
                                    apply_b_dec_to_input=apply_b_dec_to_input, metadata=metadata))
    else:
        sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=3 * d_in, apply_b_dec_to_input=apply_b_dec_to_input,
                                            metadata=metadata))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-zero biases of both kinds, so that a lost bias term shows
        for param in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            param.copy_(torch.randn(param.shape, generator=g))
    return sae


def _sae_lens_pre_activations(model, sae, tokens, attention_mask=None):
    """sae-lens' own hook_sae_acts_pre, (batch, pos, d_sae): through the spliced model when attached."""
    hook = sae.cfg.metadata.hook_name
    if hook in model.acts_to_saes:
        _, cache = model.run_with_cache(tokens, attention_mask=attention_mask)
        return cache[f"{hook}.hook_sae_acts_pre"]
    _, cache = model.run_with_cache(tokens, attention_mask=attention_mask)
    _, sae_cache = sae.run_with_cache(cache[hook])
    return sae_cache["hook_sae_acts_pre"]


def _assert_exact(expl: SAEFeatureExplanation, want_pre):
    assert isinstance(expl, SAEFeatureExplanation)
    torch.testing.assert_close(expl.pre_activation, want_pre, rtol=1e-5, atol=1e-5)
    # relative to the largest of the summed terms: a pre-activation near 0 is a cancellation of the tokens' part
    # and the biases, and float32 rounds each of them (float64 gives about 1e-13 here)
    scale = torch.stack([expl.pre_activation, expl.bias_terms, expl.explained]).abs().amax(0)
    assert float(((expl.total + expl.bias_terms - expl.pre_activation).abs() / scale).max()) <= RTOL
    assert float(((expl.total - expl.explained).abs() / scale).max()) <= RTOL
    torch.testing.assert_close(expl.contributions.sum(-1), expl.total)


@pytest.mark.parametrize("class_name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
@pytest.mark.parametrize("attached", [False, True])
@pytest.mark.parametrize("kind", ["standard", "topk"])
def test_contributions_plus_bias_terms_are_the_pre_activation(class_name, attached, kind):
    model = _lens_model(class_name)
    sae = _sae(model.cfg.d_model, kind=kind)
    if attached:
        model.add_sae(sae, use_error_term=True)
    tokens = torch.randint(3, model.cfg.d_vocab, (3, 7), generator=torch.Generator().manual_seed(1))
    want = _sae_lens_pre_activations(model, sae, tokens)
    feature = 5
    last = explain_sae_feature(model, tokens, sae, feature)  # position=None: the last token
    _assert_exact(last, want[:, -1, feature])
    assert last.position.tolist() == [6, 6, 6] and last.feature == feature and last.hook_name == HOOK
    assert last.sae_error_shares == {}  # the forward stops at the SAE: its own error term plays no part
    explicit = explain_sae_feature(model, tokens, sae, feature, position=[2, 4, 0])
    _assert_exact(explicit, want[torch.arange(3), torch.tensor([2, 4, 0]), feature])
    # causal model: tokens after the explained position contribute nothing
    assert explicit.contributions[0, 3:].abs().max() == 0
    assert explicit.bias_terms.abs().min() > 1e-3  # the biases are really there, and reported


@pytest.mark.parametrize("apply_b_dec_to_input", [True, False])
def test_bias_terms_are_b_enc_and_b_decs_projection_when_subtracted(apply_b_dec_to_input):
    model = _lens_model("GPT2LMHeadModel")
    sae = _sae(model.cfg.d_model, apply_b_dec_to_input=apply_b_dec_to_input)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(2))
    expl = explain_sae_feature(model, tokens, sae, 7)
    want = sae.b_enc[7] - (sae.b_dec @ sae.W_enc[:, 7] if apply_b_dec_to_input else 0.0)
    torch.testing.assert_close(expl.bias_terms, want.detach().expand(2))
    _assert_exact(expl, _sae_lens_pre_activations(model, sae, tokens)[:, -1, 7])


def test_position_none_is_each_rows_last_real_token_with_left_padding():
    model = _lens_model("LlamaForCausalLM")
    sae = _sae(model.cfg.d_model)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0  # row 1 left-padded
    expl = explain_sae_feature(model, tokens, sae, 2, attention_mask=mask)
    assert expl.position.tolist() == [5, 5]
    _assert_exact(expl, _sae_lens_pre_activations(model, sae, tokens, mask)[:, -1, 2])
    expl = explain_sae_feature(model, tokens, sae, 2, position=-2, attention_mask=mask)
    assert expl.position.tolist() == [4, 4]


def test_every_decoder_family_with_a_transformer_lens_converter():
    from bcos_plugins.adapters import transformer_lens as lens
    from test_conformance import CONFIGS, LENS_NAMES, VOCAB

    from bcos_plugins.convert.architectures import SPECS, stock_class

    names = [n for n in LENS_NAMES if SPECS[n].head == "causal_lm"]
    assert {"GPT2LMHeadModel", "LlamaForCausalLM", "Gemma2ForCausalLM"} <= set(names)  # Gemma Scope's family
    for name in names:
        family = max((p for p in CONFIGS if name.startswith(p)), key=len)
        torch.manual_seed(0)
        hf = bcosify(stock_class(name)(CONFIGS[family]()).eval(), b=1.25, verbose=False)
        model = lens.hooked_transformer_from_hf(hf, model_class=HookedSAETransformer)
        sae = _sae(model.cfg.d_model)
        tokens = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(9))
        for attached in (False, True):
            if attached:
                model.add_sae(sae, use_error_term=True)
            expl = explain_sae_feature(model, tokens, sae, 4, position=5)
            _assert_exact(expl, _sae_lens_pre_activations(model, sae, tokens)[:, 5, 4])


def test_bad_inputs_are_refused_naming_the_argument():
    from sae_lens import GatedSAE, GatedSAEConfig

    model = _lens_model("GPT2LMHeadModel")
    d = model.cfg.d_model
    sae = _sae(d)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(4))
    with pytest.raises(BcosError, match=r"feature: 99 is outside \[0, 96\)"):
        explain_sae_feature(model, tokens, sae, 99)
    with pytest.raises(BcosError, match="feature: .*int"):
        explain_sae_feature(model, tokens, sae, 1.0)
    with pytest.raises(BcosError, match="feature"):
        explain_sae_feature(model, tokens, sae, -1)
    with pytest.raises(BcosError, match="position: .*outside"):
        explain_sae_feature(model, tokens, sae, 1, position=5)
    with pytest.raises(BcosError, match=r"tokens: token ids must be integers, got torch\.float32\. Pass the "
                                       r"tokenizer's ids \(TransformerLens: model\.to_tokens"):
        explain_sae_feature(model, tokens.float(), sae, 1)
    padded = torch.ones_like(tokens)
    padded[1, -2:] = 0
    with pytest.raises(BcosError, match="position: .*padding token"):
        explain_sae_feature(model, tokens, sae, 1, position=4, attention_mask=padded)
    with pytest.raises(BcosError, match="sae: its hook 'blocks.9.hook_resid_pre' is not a hook of the model"):
        explain_sae_feature(model, tokens, _sae(d, "blocks.9.hook_resid_pre"), 1)
    with pytest.raises(BcosError, match="sae: it has no hook name"):
        explain_sae_feature(model, tokens, _sae(d, None), 1)
    with pytest.raises(BcosError, match="sae: must be a sae_lens.SAE"):
        explain_sae_feature(model, tokens, object(), 1)
    with pytest.raises(BcosError, match="sae: it reads vectors of width d_in=16"):
        explain_sae_feature(model, tokens, _sae(16), 1)
    gated = GatedSAE(GatedSAEConfig(d_in=d, d_sae=2 * d, metadata=SAEMetadata(hook_name=HOOK)))
    with pytest.raises(BcosError, match="sae: a 'gated' SAE has no pre-activation"):
        explain_sae_feature(model, tokens, gated, 1)
    normalising = _sae(d)
    normalising.cfg.normalize_activations = "layer_norm"
    with pytest.raises(BcosError, match="sae: it normalises each input at run time"):
        explain_sae_feature(model, tokens, normalising, 1)
    other = _sae(d, seed=1)
    model.add_sae(other)
    with pytest.raises(BcosError, match="sae: another SAE is attached"):
        explain_sae_feature(model, tokens, sae, 1)


def test_an_earlier_spliced_saes_error_term_share_is_reported():
    """An SAE attached before the feature's hook with its error term: the tokens miss the error term's share,
    which the result reports (bias-free earlier SAE: tokens + its error share + bias terms = pre-activation)."""
    model = _lens_model("GPT2LMHeadModel")
    d = model.cfg.d_model
    earlier = _sae(d, "blocks.0.hook_resid_post", seed=3)
    with torch.no_grad():
        earlier.W_dec.div_(d)
        earlier.b_enc.zero_()
        earlier.b_dec.zero_()
    model.add_sae(earlier, use_error_term=True)
    sae = _sae(d)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(5))
    expl = explain_sae_feature(model, tokens, sae, 3)
    assert set(expl.sae_error_shares) == {"blocks.0.hook_resid_post"}
    torch.testing.assert_close(expl.pre_activation, _sae_lens_pre_activations(model, sae, tokens)[:, -1, 3])
    assert (expl.sae_error_share.abs() / expl.explained.abs()).max() > 1e-3  # the error term carries a share
    rebuilt = expl.total + expl.sae_error_share + expl.bias_terms
    scale = torch.stack([expl.pre_activation, expl.bias_terms, expl.explained]).abs().amax(0)
    assert float(((rebuilt - expl.pre_activation).abs() / scale).max()) <= RTOL


def test_a_plain_hooked_transformer_and_a_transcoders_input_hook():
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from sae_lens import Transcoder, TranscoderConfig

    model = hooked_transformer_from_hf(bcosify(tiny_model("LlamaForCausalLM"), b=1.5, verbose=False))
    d = model.cfg.d_model
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(6))
    _, cache = model.run_with_cache(tokens)
    sae = _sae(d)
    expl = explain_sae_feature(model, tokens, sae, 1, position=3)
    _assert_exact(expl, sae.run_with_cache(cache[HOOK])[1]["hook_sae_acts_pre"][:, 3, 1])

    transcoder = Transcoder(TranscoderConfig(d_in=d, d_sae=2 * d, d_out=d, apply_b_dec_to_input=False, metadata=SAEMetadata(
        hook_name="blocks.0.ln2.hook_normalized", hook_name_out="blocks.0.hook_mlp_out")))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in (transcoder.W_enc, transcoder.b_enc, transcoder.b_dec):
            param.copy_(torch.randn(param.shape, generator=g))
    expl = explain_sae_feature(model, tokens, transcoder, 2)
    # a transcoder does not subtract b_dec (it lives in the output space): its bias term is b_enc alone
    torch.testing.assert_close(expl.bias_terms, transcoder.b_enc[2].detach().expand(2))
    want = cache["blocks.0.ln2.hook_normalized"][:, -1] @ transcoder.W_enc[:, 2] + transcoder.b_enc[2]
    _assert_exact(expl, want.detach())


def test_every_family_through_transformer_lens_bridge_gemma_2_included():
    """The Gemma Scope workflow through the bridge: a B-cos Gemma 2 with an SAE on its residual stream (the
    HookedTransformer route is the test above)."""
    from bcos_plugins.adapters import transformer_lens as lens
    from test_conformance import BRIDGE_NAMES, CONFIGS, VOCAB

    from bcos_plugins.convert.architectures import stock_class

    assert "Gemma2ForCausalLM" in BRIDGE_NAMES
    for name in BRIDGE_NAMES:
        family = max((p for p in CONFIGS if name.startswith(p)), key=len)
        torch.manual_seed(0)
        model = lens.transformer_bridge_from_hf(bcosify(stock_class(name)(CONFIGS[family]()).eval(), b=1.25,
                                                        verbose=False))
        sae = _sae(model.cfg.d_model)
        tokens = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(9))
        _, cache = model.run_with_cache(tokens)
        want = (cache[HOOK][:, 5] - sae.b_dec) @ sae.W_enc[:, 4] + sae.b_enc[4]
        _assert_exact(explain_sae_feature(model, tokens, sae, 4, position=5), want.detach())


def test_a_model_whose_dynamic_weights_are_not_constants_is_refused():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    model = HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_head=4, d_vocab=20,
                                                      act_fn="gelu"))
    with pytest.raises(BcosError, match="model: its dynamic weights are not detachable"):
        explain_sae_feature(model, torch.randint(0, 20, (1, 5)), _sae(16), 1)
