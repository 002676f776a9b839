"""Host adapters refuse what they cannot answer exactly (issue 29): each test fails on the earlier behaviour,
which returned a number that was wrong or raised from deep inside torch / TransformerLens / Captum / inseq.

Written through the host libraries' own calls (TransformerLens' HookedTransformer and TransformerBridge, sae-lens'
HookedSAETransformer, Captum's NoiseTunnel, inseq's load_model / attribute)."""

from __future__ import annotations

import warnings

import pytest
import torch
from bcos_plugins.adapters.transformer_lens import (
    explain_logits,
    token_component_decomposition,
    transformer_bridge_from_hf,
)
from conftest import MAX_POS, VOCAB, hooked_transformer_from_hf_or_none, tiny_model

from bcos_plugins import BcosError, bcosify

warnings.filterwarnings("ignore", category=DeprecationWarning)


def ids(seed: int = 0, batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _plain_gpt2_with_biases():
    hf = tiny_model("GPT2LMHeadModel")
    with torch.no_grad():  # a pretrained GPT-2 has non-zero biases; a fresh one starts them at 0
        for name, parameter in hf.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    return hf


# ------------------------------------------------------------------ token x component decomposition (item 1)


@pytest.mark.parametrize("kind", ["bridge", "hooked"])
def test_decomposition_refuses_a_model_whose_biases_the_table_cannot_hold(kind):
    to_lens = transformer_bridge_from_hf if kind == "bridge" else hooked_transformer_from_hf_or_none()
    if to_lens is None:  # refused under TransformerLens 4, naming transformer_bridge_from_hf (the helper checks)
        return
    model = to_lens(_plain_gpt2_with_biases())
    # the explanation at the embeddings runs (and its completeness error shows the biases' share) ...
    assert explain_logits(model, ids(), target=5).completeness_error.min() > 1e-2
    # ... the decomposition, whose table is promised to sum to the logit, refuses instead of a table that does not
    with pytest.raises(BcosError, match=r"model: the token x component table sums to .* non-zero biases .*bcosify"):
        token_component_decomposition(model, ids(), target=5)


def test_decomposition_refuses_tokens_longer_than_the_context_and_reads_narrow_ids_exactly():
    model = transformer_bridge_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False))
    with pytest.raises(BcosError, match=rf"tokens: has {MAX_POS + 5} positions but the model has only {MAX_POS} "
                                       r"\(cfg\.n_ctx, its position table\)\. Truncate"):
        token_component_decomposition(model, ids(length=MAX_POS + 5))
    # uint8 ids used to be read as a mask by W_E[tokens] (an IndexError); any integer width is read as the ids
    reference = token_component_decomposition(model, ids(), target=5)
    for dtype in (torch.uint8, torch.int16, torch.int32):
        torch.testing.assert_close(token_component_decomposition(model, ids().to(dtype), target=5).table,
                                   reference.table)
        torch.testing.assert_close(explain_logits(model, ids().to(dtype), target=5).contributions,
                                   explain_logits(model, ids(), target=5).contributions)


def _bcos_sae_model(hooked_transformer_from_hf, hook_name: str):
    from sae_lens import HookedSAETransformer, StandardSAE, StandardSAEConfig

    model = hooked_transformer_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False),
                                       model_class=HookedSAETransformer)
    d_model = model.cfg.d_model
    cfg = StandardSAEConfig(d_in=d_model, d_sae=4 * d_model, device="cpu")
    cfg.metadata.hook_name = hook_name
    torch.manual_seed(0)
    sae = StandardSAE(cfg)
    with torch.no_grad():  # bias-free: what the tokens miss is then the error term's share alone
        sae.W_enc.copy_(torch.randn_like(sae.W_enc))
        sae.W_dec.copy_(torch.randn_like(sae.W_dec) / d_model)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    model.add_sae(sae, use_error_term=True)
    return model


@pytest.mark.parametrize("hook_name", ["blocks.0.ln2.hook_normalized", "blocks.1.ln1.hook_normalized"])
def test_decomposition_reports_the_spliced_sae_error_terms_share(hook_name):
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4 (sae-lens needs 3.x)
        return
    model = _bcos_sae_model(hooked_transformer_from_hf, hook_name)
    tokens = ids(seed=3)
    result = token_component_decomposition(model, tokens, target=4)
    reference = explain_logits(model, tokens, target=4)
    assert set(result.sae_error_shares) == {hook_name}
    torch.testing.assert_close(result.sae_error_shares[hook_name], reference.sae_error_shares[hook_name])
    assert result.sae_error_share.abs().min() > 1e-3  # the error term carries a visible share ...
    assert result.completeness_error.min() > 1e-3  # ... which the table alone (tokens) does not hold
    torch.testing.assert_close(result.table.sum((1, 2)) + result.sae_error_share, result.explained,
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(result.token_totals, reference.contributions, rtol=1e-4, atol=1e-5)


def test_decomposition_refuses_an_sae_on_the_residual_stream():
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4 (sae-lens needs 3.x)
        return
    model = _bcos_sae_model(hooked_transformer_from_hf, "blocks.0.hook_resid_post")
    with pytest.raises(BcosError, match=r"SAEs spliced in at \['blocks.0.hook_resid_post'\].*residual stream"):
        token_component_decomposition(model, ids(seed=3), target=4)


# ------------------------------------------------------------------ sae-lens (items 5 and 7)


def _topk_sae(d_in, hook_name, d_sae=24, seed=0):
    from sae_lens import TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    torch.manual_seed(seed)
    sae = TopKSAE(TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=6, metadata=SAEMetadata(hook_name=hook_name)))
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn_like(sae.W_enc))
        sae.W_dec.copy_(torch.randn_like(sae.W_dec))
    return sae


def _bilinear_llama():
    import transformers as T
    from conftest import tiny_config

    config = tiny_config("llama")
    config.hidden_act = "linear"
    torch.manual_seed(0)
    return T.LlamaForCausalLM(config).eval()


def test_bilinear_sae_interactions_on_a_bcos_gpt2_block_says_which_layers_are_bilinear():
    """The README's sae-lens line ran on the B-cos GPT-2 of the line above and raised a bare TypeError."""
    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4 (sae-lens needs 3.x)
        return
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions

    lens = hooked_transformer_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False))
    d_model = lens.cfg.d_model
    with pytest.raises(BcosError, match=r"layer: \w+ is not a bilinear layer .*bilinear_config.*hidden_act='linear'"):
        BilinearSAEInteractions(lens.blocks[1].mlp, _topk_sae(d_model, "blocks.1.ln2.hook_normalized"),
                                _topk_sae(d_model, "blocks.1.hook_mlp_out", seed=1))
    # the README's corrected line: the MLP of a bilinear model (a Llama with hidden_act="linear"), whose ln2 weight
    # TransformerLens applies after ln2.hook_normalized (folded in by input_norm)
    bilinear = hooked_transformer_from_hf(_bilinear_llama())
    analysis = BilinearSAEInteractions(bilinear.blocks[1].mlp, _topk_sae(d_model, "blocks.1.ln2.hook_normalized"),
                                       _topk_sae(d_model, "blocks.1.hook_mlp_out", seed=1),
                                       input_norm=bilinear.blocks[1].ln2)
    top = analysis.top_interactions(3, k=10)
    assert len(top) == 10 and abs(top[0].value) >= abs(top[-1].value)


# ------------------------------------------------------------------ Captum (items 5 and 6)


@pytest.fixture(scope="module")
def bcos_bert():
    return bcosify(tiny_model("BertForSequenceClassification"), b=1.5, verbose=False)


def _bert_inputs():
    from conftest import padded_batch

    return padded_batch()


def test_captum_out_of_range_and_negative_targets_are_refused_naming_target(bcos_bert):
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos

    ids, mask = _bert_inputs()
    fwd = EmbeddingForward(bcos_bert)
    emb = fwd.embed(ids, mask)
    for target in (7, -1, [0, 1, 3], torch.tensor([0, 5, 1])):
        with pytest.raises(BcosError, match=r"target: -?\d+ is outside the 3 entries of the output \(shape \(3, 3\)\)"):
            BcosAttribution(fwd).attribute(emb, target=target, additional_forward_args=(mask,))
        with pytest.raises(BcosError, match=r"target: -?\d+ is outside the 3 entries"):
            LayerBcos(bcos_bert).attribute(ids, target=target, additional_forward_args=(mask,))
    ok = BcosAttribution(fwd).attribute(emb, target=[0, 1, 2], additional_forward_args=(mask,))  # in range: runs
    assert ok.shape == emb.shape


def test_noise_tunnel_refuses_zero_samples_and_token_ids(bcos_bert):
    from bcos_plugins.adapters.captum import (
        NOISE_TUNNEL_PARAMETERS,
        BcosAttribution,
        EmbeddingForward,
        LayerBcos,
    )
    from captum.attr import NoiseTunnel, Saliency

    ids, mask = _bert_inputs()
    fwd = EmbeddingForward(bcos_bert)
    emb = fwd.embed(ids, mask)
    for bad in (0, -2, 1.5):
        with pytest.raises(BcosError, match=rf"nt_samples: must be an int >= 1, got {bad}"):  # was ZeroDivisionError
            NoiseTunnel(BcosAttribution(fwd)).attribute(emb, nt_samples=bad, target=1, additional_forward_args=(mask,))
    with pytest.raises(BcosError, match="nt_samples_batch_size: must be an int >= 1, got 0"):
        NoiseTunnel(BcosAttribution(fwd)).attribute(emb, nt_samples=2, nt_samples_batch_size=0, target=1,
                                                    additional_forward_args=(mask,))
    # noise on token ids used to fail inside torch's embedding (float indices)
    with pytest.raises(BcosError, match=r"inputs: NoiseTunnel adds Gaussian noise .* token ids .*EmbeddingForward"):
        NoiseTunnel(LayerBcos(bcos_bert)).attribute(ids, nt_samples=2, target=1, additional_forward_args=(mask,))
    smooth = NoiseTunnel(BcosAttribution(fwd)).attribute(emb, nt_samples=2, target=1, additional_forward_args=(mask,))
    assert smooth.shape == emb.shape
    # other methods go through NoiseTunnel unchanged, and the parameters the checks read are still there
    assert NoiseTunnel(Saliency(fwd)).attribute(emb, nt_samples=2, target=1, additional_forward_args=(mask,)).shape \
        == emb.shape
    import inspect

    assert set(NOISE_TUNNEL_PARAMETERS) <= set(inspect.signature(NoiseTunnel.attribute).parameters)


def test_layer_bcos_refuses_a_layer_of_another_model(bcos_bert):
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos

    ids, mask = _bert_inputs()
    other = bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False).transformer.h[0]
    for forward in (bcos_bert, EmbeddingForward(bcos_bert)):
        with pytest.raises(BcosError, match="layer: GPT2Block is not a module of BertForSequenceClassification"):
            LayerBcos(forward, other)
    # a plain function (no model to check against): found when the forward did not run through the layer
    plain = LayerBcos(lambda i, m: bcos_bert(input_ids=i, attention_mask=m).logits, other)
    with pytest.raises(BcosError, match="layer: GPT2Block did not run in forward_func's forward"):
        plain.attribute(ids, target=1, additional_forward_args=(mask,))


def test_captum_adapter_reads_uint8_ids_as_the_ids(bcos_bert):
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos

    ids, mask = _bert_inputs()  # used to fail inside torch's embedding ("indices ... ByteTensor")
    fwd = EmbeddingForward(bcos_bert)
    torch.testing.assert_close(fwd.embed(ids.to(torch.uint8), mask), fwd.embed(ids, mask))
    torch.testing.assert_close(
        LayerBcos(bcos_bert).attribute(ids.to(torch.uint8), target=1, additional_forward_args=(mask,)),
        LayerBcos(bcos_bert).attribute(ids, target=1, additional_forward_args=(mask,)))


def test_the_readme_captum_one_liner_on_bert_warns_and_its_fix_is_complete(bcos_bert):
    """BERT adds position and token-type embeddings after inputs_embeds: the README's one-liner explained only the
    word embeddings' share, silently. It now warns with the fix; the fix (EmbeddingForward) is complete."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward

    ids, mask = _bert_inputs()
    embeds = bcos_bert.bert.embeddings.word_embeddings(ids).detach()
    with pytest.warns(UserWarning, match=r"do not sum to the explained output.*inputs_embeds=.*EmbeddingForward"):
        attr, delta = BcosAttribution(lambda e: bcos_bert(inputs_embeds=e).logits).attribute(
            embeds, target=1, return_convergence_delta=True)
    assert delta.abs().max() > 1e-3
    # the README's line as it now reads
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fwd = EmbeddingForward(bcos_bert)
        attr, delta = BcosAttribution(fwd).attribute(fwd.embed(ids, mask), target=1, additional_forward_args=(mask,),
                                                     return_convergence_delta=True)
    with torch.no_grad():
        logits = bcos_bert(input_ids=ids, attention_mask=mask).logits[:, 1]
    torch.testing.assert_close(attr.sum((1, 2)), logits, rtol=1e-4, atol=1e-5)
    assert delta.abs().max() < 1e-4
