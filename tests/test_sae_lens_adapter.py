"""sae-lens adapter: SAEs built from config + tensors (no hub) on a bilinear layer's input and output."""

from __future__ import annotations

import pytest
import torch
from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions, expected_hook_names
from sae_lens import StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata

from bcos_plugins import BcosError
from bcos_plugins.bilinear import BilinearMLP, bilinear_tensor, bilinear_weights

D_MODEL, D_HIDDEN, D_SAE = 8, 16, 24


def topk_sae(d_in, d_sae=D_SAE, k=6, hook_name=None, seed=0, rescale=False):
    torch.manual_seed(seed)
    cfg = TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=k, rescale_acts_by_decoder_norm=rescale,
                        metadata=SAEMetadata(hook_name=hook_name))
    sae = TopKSAE(cfg)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # weights from tensors, as a user loading their own checkpoint would
        sae.W_enc.copy_(torch.randn(d_in, d_sae, generator=g))
        sae.W_dec.copy_(torch.randn(d_sae, d_in, generator=g))
        sae.b_enc.copy_(0.1 * torch.randn(d_sae, generator=g))
        sae.b_dec.copy_(0.1 * torch.randn(d_in, generator=g))
    return sae


def layer_and_inputs(bias=False, seed=0):
    torch.manual_seed(seed)
    return BilinearMLP(D_MODEL, D_HIDDEN, bias=bias), torch.randn(200, D_MODEL)


def test_feature_interactions_equal_brute_force_in_feature_basis():
    layer, _ = layer_and_inputs()
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL, seed=1), topk_sae(D_MODEL, seed=2))
    e = analysis.output_sae.W_enc[:, 5].detach()
    D = analysis.input_sae.W_dec.detach()
    expected = D @ torch.einsum("o,oij->ij", e, bilinear_tensor(layer)) @ D.T
    torch.testing.assert_close(analysis.feature_interactions(5), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(analysis.feature_interactions(5, input_features=[3, 7]), expected[[3, 7]][:, [3, 7]],
                               rtol=1e-4, atol=1e-4)
    # top pairs, streamed over row blocks, equal the sorted upper triangle
    i, j = torch.triu_indices(D_SAE, D_SAE)
    values = expected[i, j]
    order = values.abs().argsort(descending=True)[:10]
    top = analysis.top_interactions(5, k=10, block_size=7)
    assert [(t.first, t.second) for t in top] == list(zip(i[order].tolist(), j[order].tolist(), strict=True))
    torch.testing.assert_close(torch.tensor([t.value for t in top]), values[order], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rescale", [False, True])
def test_spectrum_is_the_output_feature_preactivation(rescale):
    layer, x = layer_and_inputs(seed=3)
    output_sae = topk_sae(D_MODEL, seed=4, rescale=rescale)
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL, seed=5), output_sae)
    eig = analysis.spectrum(2)
    quadratic = (eig.eigenvalues * (x @ eig.eigenvectors).square()).sum(-1)
    with torch.no_grad():
        pre = (output_sae.process_sae_in(layer(x)) @ output_sae.W_enc + output_sae.b_enc)[:, 2]
        if rescale:
            pre = pre * output_sae.W_dec[2].norm()
        constant = pre - quadratic
    torch.testing.assert_close(constant, constant.mean().expand_as(constant), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_low_rank_correlation_is_one_at_full_rank_on_active_tokens(bias):
    layer, x = layer_and_inputs(bias=bias, seed=6)
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL, seed=7), topk_sae(D_MODEL, seed=8, k=8))
    assert analysis.augmented == bias
    features = [0, 1, 2, 3]
    result = analysis.low_rank_correlation(x, features, ranks=[1, D_MODEL + int(bias)])
    assert (result.active_tokens >= 2).all()
    torch.testing.assert_close(result.correlations[-1], torch.ones(4), rtol=0, atol=1e-4)
    assert (result.correlations[0] < 0.9999).any(), "rank 1 should not be exact for random weights"
    # on all tokens, the full-rank approximation is the pre-activation up to a constant
    full = analysis.low_rank_approximation(x, features, rank=D_MODEL + int(bias))
    sae = analysis.output_sae
    with torch.no_grad():
        pre = (sae.process_sae_in(layer(x)) @ sae.W_enc + sae.b_enc)[:, features]
    offset = pre - full
    torch.testing.assert_close(offset, offset.mean(0, keepdim=True).expand_as(offset), rtol=1e-4, atol=1e-4)


def test_any_sae_architecture_with_w_enc_w_dec_is_accepted():
    layer, x = layer_and_inputs(seed=9)
    standard = StandardSAE(StandardSAEConfig(d_in=D_MODEL, d_sae=D_SAE))
    analysis = BilinearSAEInteractions(layer, standard, topk_sae(D_MODEL))
    assert analysis.feature_interactions(0).shape == (D_SAE, D_SAE)


def test_width_mismatches_and_wrong_types_raise():
    layer, _ = layer_and_inputs()
    with pytest.raises(ValueError, match="input SAE has d_in=9"):
        BilinearSAEInteractions(layer, topk_sae(D_MODEL + 1), topk_sae(D_MODEL))
    with pytest.raises(ValueError, match="output SAE has d_in=9"):
        BilinearSAEInteractions(layer, topk_sae(D_MODEL), topk_sae(D_MODEL + 1))
    with pytest.raises(TypeError, match="sae_lens.SAE"):
        BilinearSAEInteractions(layer, torch.nn.Linear(D_MODEL, D_SAE), topk_sae(D_MODEL))
    normalised = topk_sae(D_MODEL)
    normalised.cfg.normalize_activations = "expected_average_only_in"
    with pytest.raises(ValueError, match="normalises its inputs"):
        BilinearSAEInteractions(layer, normalised, topk_sae(D_MODEL))
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL), topk_sae(D_MODEL))
    with pytest.raises(ValueError, match=r"output_feature: ids \[24\] are outside \[0, 24\)"):
        analysis.spectrum(D_SAE)


def test_low_rank_correlation_refuses_inputs_of_another_width():
    # (moved from tests/test_trust_adapters.py, whose other tests run without sae-lens)
    layer, inputs = layer_and_inputs()
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL), topk_sae(D_MODEL, seed=1))
    analysis.low_rank_correlation(inputs, [0, 1])
    # 16 = twice the width: a reshape to (-1, 8) used to split each row into two made-up tokens, silently
    for wrong in (torch.randn(200, 2 * D_MODEL), torch.randn(200, 5)):
        for call in (lambda x: analysis.low_rank_correlation(x, [0, 1]),
                     lambda x: analysis.low_rank_approximation(x, [0, 1], rank=2),
                     analysis.output_activations):
            with pytest.raises(BcosError, match=rf"mlp_inputs: shape \(200, \d+\), but the bilinear layer reads "
                                                rf"vectors of width {D_MODEL}"):
                call(wrong)


def test_explicit_hook_names_are_checked_for_plain_layers():
    layer, _ = layer_and_inputs()
    good_in, good_out = topk_sae(D_MODEL, hook_name="mlp.in"), topk_sae(D_MODEL, hook_name="mlp.out")
    BilinearSAEInteractions(layer, good_in, good_out, input_hook="mlp.in", output_hook="mlp.out")
    with pytest.raises(ValueError, match="trained on 'mlp.out'"):
        BilinearSAEInteractions(layer, good_out, good_out, input_hook="mlp.in", output_hook="mlp.out")


def tiny_bilinear_transformer(normalization_type="RMS"):
    from bcos_plugins.adapters.transformer_lens import bilinear_config
    from transformer_lens import HookedTransformer

    torch.manual_seed(0)
    cfg = bilinear_config(d_model=D_MODEL, n_layers=2, n_heads=2, d_mlp=D_HIDDEN, d_vocab=30, n_ctx=16,
                          normalization_type=normalization_type)
    return HookedTransformer(cfg)


def test_transformer_lens_hooks_checked_and_correlation_exact_on_real_activations():
    model = tiny_bilinear_transformer()
    mlp = model.blocks[1].mlp
    assert expected_hook_names(mlp) == ({"blocks.1.ln2.hook_normalized"}, {"blocks.1.hook_mlp_out"})
    input_sae = topk_sae(D_MODEL, hook_name="blocks.1.ln2.hook_normalized", seed=1)
    output_sae = topk_sae(D_MODEL, hook_name="blocks.1.hook_mlp_out", seed=2, k=8)
    # ln2.hook_normalized is recorded before ln2's weight: input_norm folds it in (tests/test_trust_pass20_adapters.py)
    analysis = BilinearSAEInteractions(mlp, input_sae, output_sae, input_norm=model.blocks[1].ln2)
    tokens = torch.randint(0, 30, (4, 16), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens, names_filter=["blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"])
    x = cache["blocks.1.ln2.hook_normalized"]
    # the weights reproduce the model's own MLP output, so the SAE activations are the real ones
    torch.testing.assert_close(bilinear_weights(mlp).forward(x), cache["blocks.1.hook_mlp_out"], rtol=1e-4, atol=1e-5)
    result = analysis.low_rank_correlation(x, [0, 1, 2], ranks=[D_MODEL])
    torch.testing.assert_close(result.correlations[0], torch.ones(3), rtol=0, atol=1e-4)

    wrong_layer = topk_sae(D_MODEL, hook_name="blocks.0.ln2.hook_normalized")
    with pytest.raises(ValueError, match="blocks.0.ln2.hook_normalized"):
        BilinearSAEInteractions(mlp, wrong_layer, output_sae)
    resid_mid = topk_sae(D_MODEL, hook_name="blocks.1.hook_resid_mid")
    with pytest.raises(ValueError, match="normalised residual stream"):
        BilinearSAEInteractions(mlp, resid_mid, output_sae)
    with pytest.raises(ValueError, match="no hook name"):
        BilinearSAEInteractions(mlp, topk_sae(D_MODEL), output_sae)
    with pytest.raises(ValueError, match="blocks.1.hook_mlp_out"):
        BilinearSAEInteractions(mlp, input_sae, topk_sae(D_MODEL, hook_name="blocks.1.hook_resid_post"))


def test_transformer_lens_without_normalisation_reads_resid_mid():
    model = tiny_bilinear_transformer(normalization_type=None)
    inputs, outputs = expected_hook_names(model.blocks[0].mlp)
    assert inputs == {"blocks.0.hook_resid_mid", "blocks.0.hook_mlp_in"}
    BilinearSAEInteractions(model.blocks[0].mlp, topk_sae(D_MODEL, hook_name="blocks.0.hook_resid_mid"),
                            topk_sae(D_MODEL, hook_name="blocks.0.hook_mlp_out"))


def test_feature_ids_and_counts_are_validated():
    layer, x = layer_and_inputs()
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL), topk_sae(D_MODEL))
    with pytest.raises(BcosError, match=r"output_feature: ids \[-1\] are outside \[0, 24\)"):
        analysis.interaction_matrix(-1)  # would silently be the last feature
    with pytest.raises(BcosError, match=r"input_features: ids \[-2, 24\] are outside"):
        analysis.feature_interactions(0, input_features=[3, -2, 24])
    with pytest.raises(BcosError, match=r"input_features: ids \[30\]"):
        analysis.top_interactions(0, input_features=[30])
    with pytest.raises(BcosError, match="k: .*-1"):
        analysis.top_interactions(0, k=-1)
    assert analysis.top_interactions(0, k=0) == []
    with pytest.raises(BcosError, match="block_size"):
        analysis.top_interactions(0, block_size=0)
    with pytest.raises(BcosError, match="rank"):
        analysis.low_rank_approximation(x, [0], rank=0)
    with pytest.raises(BcosError, match="feature ids must be ints"):
        analysis.spectrum([0.5])
    with pytest.raises(BcosError, match="output_features: no feature ids"):
        analysis.low_rank_correlation(x, [])


def test_bcos_gated_mlps_are_refused_by_bilinear_analyses():
    from bcos_plugins.adapters.transformer_lens import (
        BcosHookedTransformer,
        BcosTransformerConfig,
        bilinear_config,
    )
    from conftest import tiny_config

    from bcos_plugins import bcosify

    size = dict(d_model=D_MODEL, n_layers=1, n_heads=2, d_mlp=D_HIDDEN, d_vocab=30, n_ctx=16)
    cfg = bilinear_config(**size).to_dict()
    bcos = BcosHookedTransformer(BcosTransformerConfig(**{k: v for k, v in cfg.items() if k in {
        "d_model", "n_layers", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn", "gated_mlp",
        "normalization_type", "positional_embedding_type"}}, bcos_b=1.5))
    mlp = bcos.blocks[0].mlp
    with pytest.raises(BcosError, match="W_gate, W_in, W_out are B-cos projections.*depends on the input"):
        bilinear_weights(mlp)
    with pytest.raises(BcosError, match="not bilinear"):
        BilinearSAEInteractions(mlp, topk_sae(D_MODEL), topk_sae(D_MODEL))
    config = tiny_config("llama")
    config.hidden_act = "linear"
    import transformers as T

    hf = bcosify(T.LlamaForCausalLM(config), b=2.0, verbose=False)
    with pytest.raises(BcosError, match="gate_proj, up_proj, down_proj are B-cos projections"):
        bilinear_weights(hf.model.layers[0].mlp)


def _bcos_sae_model(zero_sae_biases: bool):
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from conftest import tiny_model
    from sae_lens import HookedSAETransformer

    from bcos_plugins import bcosify

    model = hooked_transformer_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False),
                                       model_class=HookedSAETransformer)
    d_model = model.cfg.d_model
    sae_cfg = StandardSAEConfig(d_in=d_model, d_sae=4 * d_model, device="cpu")
    sae_cfg.metadata.hook_name = "blocks.0.hook_resid_post"
    torch.manual_seed(0)
    sae = StandardSAE(sae_cfg)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn_like(sae.W_enc))
        sae.W_dec.copy_(torch.randn_like(sae.W_dec) / d_model)
        if zero_sae_biases:
            sae.b_enc.zero_()
            sae.b_dec.zero_()
        else:
            sae.b_enc.copy_(0.1 * torch.randn_like(sae.b_enc))
            sae.b_dec.copy_(0.1 * torch.randn_like(sae.b_dec))
    model.add_sae(sae, use_error_term=True)
    return model


@pytest.mark.parametrize("zero_sae_biases", [True, False])
def test_sae_error_share_accounts_for_the_error_term(zero_sae_biases):
    from bcos_plugins.adapters.sae_lens import sae_error_share

    model = _bcos_sae_model(zero_sae_biases)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(0))
    result = sae_error_share(model, tokens, target=4)
    explained = result.explanation.explained
    assert set(result.error_shares) == {"blocks.0.hook_resid_post"}
    # the explanation alone is incomplete by a lot (what the error term carries) ...
    assert result.explanation.completeness_error.max() > 1e-2
    assert result.error_fraction.abs().max() > 1e-2
    assert torch.isfinite(result.error_fraction).all()
    total = result.explanation.total + result.error_share
    if zero_sae_biases:
        # ... and with a linear SAE, tokens + error term account for the whole logit
        assert ((total - explained).abs() / explained.abs()).max() <= 1e-4
        assert (result.other_share.abs() / explained.abs()).max() <= 1e-4
    else:
        assert (result.other_share.abs() / explained.abs()).max() > 1e-4  # the SAE biases' share is reported


def test_sae_error_share_needs_attached_saes():
    from bcos_plugins.adapters.sae_lens import sae_error_share

    model = _bcos_sae_model(True)
    model.reset_saes()
    with pytest.raises(BcosError, match="no SAEs are attached"):
        sae_error_share(model, torch.zeros(1, 4, dtype=torch.long))


def test_sae_error_capture_wraps_any_explanation():
    from bcos_plugins.adapters._lens.sae_error import sae_error_capture
    from bcos_plugins.adapters.transformer_lens import explain_logits

    model = _bcos_sae_model(True)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    with sae_error_capture(model) as capture:
        explanation = explain_logits(model, tokens, target=3)
    shares = capture.shares()
    total = explanation.total + shares["blocks.0.hook_resid_post"]
    assert ((total - explanation.explained).abs() / explanation.explained.abs()).max() <= 1e-4
    model.reset_saes()
    with sae_error_capture(model) as capture:  # no SAEs: nothing captured, nothing hooked
        explain_logits(model, tokens, target=3)
    assert capture.shares() == {} and not any(h.fwd_hooks for h in model.hook_dict.values())


def test_explain_logits_reports_the_sae_error_terms_share():
    """With SAEs spliced in, explain_logits itself says what the error terms carry (never silently incomplete)."""
    from bcos_plugins.adapters.transformer_lens import explain_logits

    model = _bcos_sae_model(zero_sae_biases=True)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(0))
    expl = explain_logits(model, tokens, target=4)
    assert set(expl.sae_error_shares) == {"blocks.0.hook_resid_post"}
    assert expl.completeness_error.max() > 1e-2  # the tokens alone miss the error term ...
    torch.testing.assert_close(expl.total + expl.sae_error_share, expl.explained, rtol=1e-4, atol=1e-5)
    model.reset_saes()
    plain = explain_logits(model, tokens, target=4)
    assert plain.sae_error_shares == {} and (plain.sae_error_share == 0).all()
    assert plain.completeness_error.max() < 1e-4


def test_low_rank_correlation_of_a_bfloat16_layer_counts_and_correlates_in_float32():
    """A bfloat16 layer's active-token counts were bfloat16 (257 -> 256: counts past 256 rounded) and its correlations
    kept 3 significant digits."""
    layer, _ = layer_and_inputs(seed=9)
    x = torch.randn(1500, D_MODEL, generator=torch.Generator().manual_seed(9))
    analysis = BilinearSAEInteractions(layer.to(torch.bfloat16), topk_sae(D_MODEL, seed=10).to(torch.bfloat16),
                                       topk_sae(D_MODEL, seed=11, k=8).to(torch.bfloat16))
    features = list(range(D_SAE))
    result = analysis.low_rank_correlation(x, features, ranks=[1, 2])
    counts = (analysis.output_activations(x.to(torch.bfloat16))[:, features] > 0).sum(0)
    assert counts.max() > 256  # where bfloat16 cannot hold every integer
    assert result.active_tokens.dtype == torch.float32 and result.correlations.dtype == torch.float32
    assert result.active_tokens.tolist() == counts.tolist()
