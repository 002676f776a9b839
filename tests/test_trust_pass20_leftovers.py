"""Trust pass 20, leftovers of the adapters pass (helper-109's notes), each pinned here:

1. bcos_plugins.bilinear on a TransformerLens bilinear MLP fed ``blocks.L.ln2.hook_normalized`` (recorded before ln2
   multiplies by its weight and adds a LayerNorm's bias): ``bilinear_weights(mlp, input_norm=ln2)`` folds the norm
   in, the same mechanism ``BilinearSAEInteractions(input_norm=)`` uses; a TransformerBridge's MLP (whose hook is
   recorded before the norm's weight too) is refused naming the module it wraps and its exact input hook.
2. ``SAEErrorShare.error_fraction`` of a row whose explained value is exactly 0: NaN, not a share over a 1e-12 floor.
3. inseq's ``attribute(..., step_scores=["deltas"])`` on a model loaded with "bcos": the completeness deltas the
   method always stores, not inseq's "register a step function" error.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from bcos_plugins.adapters.sae_lens import SAEErrorShare, sae_error_share
from conftest import VOCAB
from test_sae_lens_adapter import _bcos_sae_model
from test_trust_pass20_adapters import _bilinear_lens_model

from bcos_plugins.bilinear import (
    augment_input,
    bilinear_weights,
    eigendecompose,
    eigenvector_activations,
    truncated_outputs,
    truncation_curve,
)
from bcos_plugins.errors import BcosTypeError, BcosValueError

# ------------------------------------------------------------- 1. bcos_plugins.bilinear on ln2.hook_normalized


def _layer_on_hook_normalized(normalization_type: str):
    """A bilinear TransformerLens model whose ln2 has a trained model's weight (and LayerNorm bias), the activations
    a TransformerLens user takes as block 1's MLP input (ln2.hook_normalized) and the MLP's output there."""
    model = _bilinear_lens_model(normalization_type)
    tokens = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    return model, cache["blocks.1.ln2.hook_normalized"].reshape(-1, 8), cache["blocks.1.hook_mlp_out"].reshape(-1, 8)


@pytest.mark.parametrize("normalization_type", ["RMS", "LN"])
def test_bilinear_analyses_of_a_lens_mlp_read_ln2_hook_normalized_through_input_norm(normalization_type):
    """TransformerLens records ln2.hook_normalized before ln2 multiplies by its weight (a LayerNorm also adds its bias),
    and no hook records the MLP's input in a plain HookedTransformer: eigenvector activations, truncated outputs and
    truncation curves of model.blocks[L].mlp on those activations were another layer's (their sum missed the MLP's
    output), with no way to analyse the layer on them but to fold the norm by hand. bilinear_weights(mlp,
    input_norm=ln2) folds it in, exactly (BilinearSAEInteractions' input_norm is the same function)."""
    model, x, mlp_out = _layer_on_hook_normalized(normalization_type)
    mlp, ln2 = model.blocks[1].mlp, model.blocks[1].ln2
    directions = torch.eye(8)[:5]
    # the trap: the MLP's own weights on hook_normalized are not the MLP
    assert (bilinear_weights(mlp).forward(x) - mlp_out).abs().max() > 0.1
    folded = bilinear_weights(mlp, input_norm=ln2)
    torch.testing.assert_close(folded.forward(x), mlp_out, rtol=1e-4, atol=1e-4)
    assert folded.has_bias == (normalization_type == "LN")  # a LayerNorm's bias enters both branches
    analysed, inputs = (folded.augmented(), augment_input(x)) if folded.has_bias else (folded, x)
    eig = eigendecompose(analysed, directions)
    torch.testing.assert_close(eigenvector_activations(eig, inputs).sum(-1), mlp_out[:, :5], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(truncated_outputs(eig, inputs, analysed.d_in), mlp_out[:, :5], rtol=1e-4, atol=1e-4)
    labels = mlp_out[:, :5].argmax(-1)
    assert truncation_curve(analysed, inputs, labels, ks=[1, 2], directions=directions).full_accuracy == 1.0


def test_bilinear_weights_input_norm_refuses_another_blocks_norm_and_other_modules_naming_input_norm():
    model, _, _ = _layer_on_hook_normalized("LN")
    mlp = model.blocks[1].mlp
    with pytest.raises(BcosValueError, match=r"input_norm: it is blocks\.0\.ln2, not the norm in front of blocks\.1"
                                             r"\.mlp\. Pass model\.blocks\[1\]\.ln2"):
        bilinear_weights(mlp, input_norm=model.blocks[0].ln2)
    # torch's own LayerNorm is applied whole (no hook between normalising and its weight): nothing to fold
    for other in (model.blocks[1].ln2.w, torch.nn.LayerNorm(8)):
        with pytest.raises(BcosTypeError, match=r"input_norm: expected the TransformerLens LayerNorm / RMSNorm"):
            bilinear_weights(mlp, input_norm=other)
    with pytest.raises(BcosValueError, match=r"input_norm: its weight has shape \(8,\), but the layer reads vectors "
                                             r"of width 6"):
        bilinear_weights((torch.randn(4, 6), torch.randn(4, 6), torch.randn(3, 4)), input_norm=model.blocks[1].ln2)


# ------------------------------------------------------------------------------- 2. error_fraction of a zero logit


def test_error_fraction_is_nan_where_the_explained_value_is_exactly_zero_and_exact_elsewhere():
    """A 1e-12 floor divided a rounding-sized error share of a zero logit into a fraction of 1e5 (and a zero share
    into 0, "the SAEs reconstruct everything", for a logit that is 0 whatever they do)."""
    explained = torch.tensor([2.0, 0.0, -4.0])
    share = SAEErrorShare(explanation=SimpleNamespace(explained=explained),
                          error_shares={"a": torch.tensor([0.5, 1e-7, 1.0]), "b": torch.tensor([0.5, 0.0, 1.0])})
    fraction = share.error_fraction
    assert torch.isnan(fraction[1])
    torch.testing.assert_close(fraction[[0, 2]], torch.tensor([0.5, -0.5]), rtol=0, atol=0)


def test_error_fraction_through_sae_error_share_with_one_row_explaining_a_zero_logit():
    model = _bcos_sae_model(True)
    with torch.no_grad():  # token 5's unembedding column is zero: its logit is exactly 0 on every input
        model.unembed.W_U[:, 5] = 0
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(0))
    result = sae_error_share(model, tokens, target=torch.tensor([4, 5, 4]))
    explained = result.explanation.explained
    assert explained[1] == 0 and bool((explained[[0, 2]] != 0).all())
    fraction = result.error_fraction
    assert torch.isnan(fraction[1])  # it read 0.0, as if the SAEs reconstructed what the model needs
    torch.testing.assert_close(fraction[[0, 2]], result.error_share[[0, 2]] / explained[[0, 2]], rtol=0, atol=0)
    assert bool(torch.isfinite(fraction[[0, 2]]).all())


# ------------------------------------------------------------------------------- 3. inseq step_scores=["deltas"]


def test_inseq_step_scores_deltas_on_a_bcos_model_returns_the_stored_completeness_deltas():
    """inseq looked "deltas" up in its step-function registry and failed ("Step score deltas not found ... register a
    custom step score"), although "bcos" stores them at every step."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    import transformers as T
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    attribution_model = inseq.load_model(_tiny_lm("gpt2", len(tokenizer)), "bcos", tokenizer=tokenizer)
    kwargs = {"generation_args": {"max_new_tokens": 2, "do_sample": False}, "show_progress": False}
    plain = attribution_model.attribute("The cat sat", **kwargs).sequence_attributions[0]
    asked = attribution_model.attribute("The cat sat", step_scores=["logit", "deltas"], **kwargs)
    seq = asked.sequence_attributions[0]
    assert set(seq.step_scores) == {"logit", "deltas"}
    torch.testing.assert_close(seq.step_scores["deltas"], plain.step_scores["deltas"], rtol=0, atol=0)
    # they are the completeness gap: the column sums minus the attributed logits
    total = seq.target_attributions.nan_to_num().sum((0, 2))
    torch.testing.assert_close(total - seq.step_scores["logit"], seq.step_scores["deltas"].to(total.dtype),
                               rtol=0, atol=1e-5)
    alone = attribution_model.attribute("The cat sat", step_scores=["deltas"], **kwargs).sequence_attributions[0]
    torch.testing.assert_close(alone.step_scores["deltas"], plain.step_scores["deltas"], rtol=0, atol=0)
    # another method on the same model keeps inseq's own answer: it stores no deltas to return
    with pytest.raises(AttributeError, match="Step score deltas not found"):
        attribution_model.attribute("The cat sat", method="saliency", step_scores=["deltas"], **kwargs)


def test_bilinear_weights_refuse_a_transformer_bridge_mlp_naming_the_module_it_wraps():
    """A TransformerBridge's GatedMLPBridge has W_gate / W_in / W_out, so it was read as a HookedTransformer MLP and
    failed with AttributeError ('NoneType' object has no attribute 'detach': it has no b_in / b_out)."""
    import transformers as T
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, intermediate_size=16, hidden_act="linear", max_position_embeddings=32)
    hf = T.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # a trained model's norm weights: ln2.hook_normalized is not the MLP's input
        for layer in hf.model.layers:
            layer.post_attention_layernorm.weight.uniform_(0.2, 2.2)
    bridge = transformer_bridge_from_hf(hf)
    with pytest.raises(BcosTypeError, match=r"source: this is a TransformerBridge component \(GatedMLPBridge\).*"
                                            r"bridge\.blocks\[L\]\.mlp\.original_component.*blocks\.L\.mlp\.hook_in"):
        bilinear_weights(bridge.blocks[1].mlp)
    # the named route is the bridge's MLP, exactly, on the named hook
    _, cache = bridge.run_with_cache(torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0)))
    weights = bilinear_weights(bridge.blocks[1].mlp.original_component)
    torch.testing.assert_close(weights.forward(cache["blocks.1.mlp.hook_in"]), cache["blocks.1.hook_mlp_out"],
                               rtol=1e-5, atol=1e-6)
