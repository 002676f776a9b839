"""Trust pass 20, the host-library adapters (adapters/): each test fails on the behaviour before its fix, which
returned a wrong number without a word or raised from deep inside torch / TransformerLens / Captum.

Written through the host libraries' own calls: TransformerLens' ``set_tokenizer`` / ``HookedTransformer(cfg,
tokenizer=)`` and sae-lens' ``HookedSAETransformer`` built on them, the bridge's ``tokenizer`` reassignment,
``run_with_cache(remove_batch_dim=True)``, ``.double()`` / ``.half()``, sae-lens SAEs on the hooks TransformerLens
records around a bilinear MLP, and Captum's methods as ``image_attribution_methods`` runs them."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from conftest import TINY_VIT_SHAPE, VOCAB, hooked_transformer_from_hf_or_none, tiny_model

from bcos_plugins import bcosify
from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def ids(seed: int = 0, batch: int = 2, length: int = 6) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------- TransformerLens' own tokenizer attach (note20's leftover)


def _gpt2_tokenizer():
    return T.GPT2TokenizerFast.from_pretrained(SHIPPED_DATA / "gpt2_tokenizer")  # 50257 tokens, the model has 60


def _fitting_tokenizer(folder):
    """A word-level tokenizer of exactly the tiny models' VOCAB tokens, loaded from a folder as TransformerLens
    reloads it (by its name_or_path, to add a BOS token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    T.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                              eos_token="</s>").save_pretrained(folder)
    return T.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("bcos", [True, False])
@pytest.mark.parametrize("how", ["set_tokenizer", "constructor"])
@pytest.mark.parametrize("model_class", ["HookedTransformer", "HookedSAETransformer"])
def test_transformer_lens_own_tokenizer_attach_refuses_a_tokenizer_larger_than_the_vocabulary(how, model_class, bcos,
                                                                                             tmp_path):
    """hooked_transformer_from_hf(tokenizer=) refused a tokenizer with more tokens than the model's embedding rows,
    but TransformerLens' own attach did not: model.set_tokenizer(tok), HookedTransformer(cfg, tokenizer=tok) and
    sae-lens' HookedSAETransformer, which goes through both, attached it, and model("text") then failed in the
    embedding (IndexError; a device-side assert on a GPU), or read ids that happened to fit as this model's tokens."""
    to_lens = hooked_transformer_from_hf_or_none()
    if to_lens is None:  # TransformerLens 4 has no HookedTransformer: the helper checked the refusal there
        return
    from sae_lens import HookedSAETransformer
    from transformer_lens import HookedTransformer

    cls = HookedTransformer if model_class == "HookedTransformer" else HookedSAETransformer
    hf = tiny_model("GPT2LMHeadModel")
    model = to_lens(bcosify(hf, b=1.5, verbose=False) if bcos else hf, model_class=cls)
    assert isinstance(model, cls)
    refusal = r"tokenizer: GPT2Tokenizer\w*\(.*\) has 50257 tokens, but \w+ has 60 embedding rows"
    with pytest.raises(BcosValueError, match=refusal):
        if how == "set_tokenizer":
            model.set_tokenizer(_gpt2_tokenizer())
        else:
            type(model)(model.cfg, tokenizer=_gpt2_tokenizer())
    assert model.tokenizer is None  # nothing was attached
    # the model's own tokenizer is attached as before, and TransformerLens' text path runs on it
    fitting = _fitting_tokenizer(tmp_path / "tokenizer")
    if how == "set_tokenizer":
        model.set_tokenizer(fitting)
    else:
        # a model built from the config alone holds uninitialised memory (the converted config skips TransformerLens'
        # initialisation; NaN as often as not, which the B-cos HookedTransformer's forward now refuses): TransformerLens'
        # own init_weights gives it finite weights before it runs
        model = type(model)(model.cfg, tokenizer=fitting)
        model.init_weights()
    assert model.to_tokens("w5 w7", prepend_bos=False).tolist() == [[8, 10]]
    assert model("w5 w7").shape == (1, 3, VOCAB)


@pytest.mark.parametrize("family", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_a_plain_hooked_transformer_from_hf_follows_its_dtype_methods(family):
    """note20's leftover: a plain model from hooked_transformer_from_hf failed after .double() / .half() /
    .bfloat16() ("mat1 and mat2 must have the same dtype, but got Float and Double"): its weightless final norm casts
    to cfg.dtype, which only TransformerLens' own .to(dtype) updated. It now computes the transformers model's logits
    in each dtype, as the B-cos models did."""
    to_lens = hooked_transformer_from_hf_or_none()
    if to_lens is None:
        return
    hf = tiny_model(family)
    model = to_lens(hf)
    tokens = ids()
    for method, atol in (("double", 1e-7), ("half", 2e-3), ("bfloat16", 1e-2), ("float", 1e-5)):
        getattr(model, method)()
        getattr(hf, method)()
        assert model.cfg.dtype == next(model.parameters()).dtype == next(hf.parameters()).dtype
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=0, atol=atol)


def test_a_config_that_sizes_its_vocabulary_from_the_tokenizer_still_takes_it(tmp_path):
    """d_vocab=-1: TransformerLens sizes the vocabulary from the tokenizer it attaches, so it fits by construction."""
    if hooked_transformer_from_hf_or_none() is None:
        return
    from bcos_plugins.adapters.transformer_lens import BcosHookedTransformer, BcosTransformerConfig

    cfg = BcosTransformerConfig(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, d_vocab=-1, n_ctx=16,
                                act_fn="gelu", normalization_type="LN", bcos_b=1.5)
    model = BcosHookedTransformer(cfg, tokenizer=_fitting_tokenizer(tmp_path / "tokenizer"))
    assert model.cfg.d_vocab == VOCAB and model.W_E.shape[0] == VOCAB


@pytest.mark.parametrize("bcos", [True, False])
def test_a_bridge_refuses_a_tokenizer_reassigned_larger_than_the_vocabulary(bcos, tmp_path):
    """transformer_bridge_from_hf(tokenizer=) refuses a tokenizer larger than the model's embedding, but TransformerLens'
    reassignment (bridge.tokenizer = tok) took it, resizing cfg.d_vocab to 50257 for a 60-row embedding, and
    bridge("text") then failed in the embedding (IndexError; a device-side assert on a GPU)."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    hf = tiny_model("GPT2LMHeadModel")
    bridge = transformer_bridge_from_hf(bcosify(hf, b=1.5, verbose=False) if bcos else hf)
    with pytest.raises(BcosValueError, match=r"tokenizer: GPT2Tokenizer\w*\(.*\) has 50257 tokens, but "
                                             r"TransformerBridge has 60 embedding rows"):
        bridge.tokenizer = _gpt2_tokenizer()
    assert bridge.cfg.d_vocab == VOCAB  # untouched
    bridge.tokenizer = _fitting_tokenizer(tmp_path / "tokenizer")  # the model's own is taken, and reads text
    assert bridge.to_tokens("w5 w7", prepend_bos=False).tolist() == [[8, 10]]
    torch.testing.assert_close(bridge("w5 w7"), bridge(torch.tensor([[bridge.tokenizer.bos_token_id, 8, 10]])))


# --------------------------------------------------------------- effective_weight on a cache without batch axis


@pytest.mark.parametrize("projection", ["W_Q", "W_K", "W_V", "W_O", "W_in", "W_out"])
def test_effective_weight_reads_a_cache_without_its_batch_dimension(projection):
    """run_with_cache(..., remove_batch_dim=True) gives a cache of (pos, ...) activations; effective_weight read
    (batch, pos) from its first two axes and failed with IndexError 'too many indices for tensor of dimension 2'."""
    to_lens = hooked_transformer_from_hf_or_none()
    if to_lens is None:
        return
    from bcos_plugins.adapters.transformer_lens import effective_weight

    model = to_lens(bcosify(tiny_model("LlamaForCausalLM"), b=1.5, verbose=False).double())
    tokens = ids(batch=1)
    _, batched = model.run_with_cache(tokens)
    _, single = model.run_with_cache(tokens, remove_batch_dim=True)
    want = effective_weight(batched, 1, projection)[0]
    got = effective_weight(single, 1, projection)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if projection == "W_in":  # the MLP's input @ effective weight is the cached projection, position by position
        x = single["blocks.1.ln2.hook_normalized"] * model.blocks[1].ln2.w
        torch.testing.assert_close(torch.einsum("pd,pdm->pm", x, got), single["blocks.1.mlp.hook_pre_linear"])


# ------------------------------------------------------------- Captum's image methods: one reading of target


@pytest.fixture(scope="module")
def vit_methods():
    from bcos_plugins.adapters.captum_vision import image_attribution_methods

    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    return image_attribution_methods(BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2)).eval(), ig_steps=2)


_CAPTUM_RUN = ["IntGrad (2 steps)", "IxG", "GradCAM (tokens)", "IntGrad (2 steps), pixels", "IxG, pixels"]


@pytest.mark.parametrize("name", _CAPTUM_RUN)
def test_image_methods_refuse_a_negative_target_instead_of_explaining_the_last_class(name, vit_methods):
    """The Captum-run maps read target=-1 as Captum does, from the end: the last class's map, while the B-cos map
    and attention GradCAM beside them in one comparison refuse -1 (negative ids are not counted from the end)."""
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    with pytest.raises(BcosValueError, match=r"target: ids must lie in \[0, 5\), got \[-1, -1, -1\] at rows \[0, 1, 2\]"
                                             r".*negative ids are not counted from the end"):
        vit_methods[name].explain(images, -1)
    for name_beside in ("B-cos W(x)x", "GradCAM (attention)"):  # as the maps beside them refuse it
        with pytest.raises(BcosValueError, match=r"target: ids must lie in \[0, 5\)"):
            vit_methods[name_beside].explain(images, -1)


@pytest.mark.parametrize("name", _CAPTUM_RUN)
@pytest.mark.parametrize(("target", "error", "words"), [
    (5, BcosValueError, r"target: ids must lie in \[0, 5\), got \[5, 5, 5\]"),  # was IndexError inside torch
    (torch.tensor([0, 1]), BcosValueError, r"target: expected an int or one id per row, shape \(3,\); got shape "
                                           r"\(2,\)"),  # was Captum's bare AssertionError
    (2.0, BcosTypeError, r"target: got a float \(2\.0\); ids must be integers"),  # was Captum's AssertionError
])
def test_image_methods_refuse_bad_targets_naming_target(name, target, error, words, vit_methods):
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    with pytest.raises(error, match=words):
        vit_methods[name].explain(images, target)


@pytest.mark.parametrize("name", _CAPTUM_RUN)
def test_image_methods_give_the_same_maps_for_every_form_of_the_same_targets(name, vit_methods):
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    per_row = vit_methods[name].explain(images, torch.tensor([4, 0, 2]))
    torch.testing.assert_close(vit_methods[name].explain(images, [4, 0, 2]), per_row, rtol=0, atol=0)
    one = vit_methods[name].explain(images, 3)
    torch.testing.assert_close(vit_methods[name].explain(images, torch.tensor(3)), one, rtol=0, atol=0)
    torch.testing.assert_close(vit_methods[name].explain(images, [3, 3, 3]), one, rtol=0, atol=0)
    assert per_row.shape == (3, 16, 16)


# ------------------------------------------------- sae-lens SAEs on a bilinear MLP behind a norm with a weight


def _bilinear_lens_model(normalization_type: str, model_class=None):
    """A bilinear TransformerLens model whose ln2 has the weight (and LayerNorm bias) a trained model has, not the
    fresh model's ones and zeros."""
    from bcos_plugins.adapters.transformer_lens import bilinear_config
    from transformer_lens import HookedTransformer

    torch.manual_seed(0)
    cfg = bilinear_config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=VOCAB, n_ctx=16,
                          normalization_type=normalization_type)
    model = (model_class or HookedTransformer)(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for block in model.blocks:
            block.ln2.w.copy_(0.2 + 2 * torch.rand(8, generator=g))
            if normalization_type == "LN":
                block.ln2.b.copy_(0.5 * torch.randn(8, generator=g))
    return model


def _topk_sae(hook_name: str, seed: int, k: int = 6):
    from sae_lens import TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    sae = TopKSAE(TopKSAEConfig(d_in=8, d_sae=24, k=k, metadata=SAEMetadata(hook_name=hook_name)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            param.copy_(torch.randn(param.shape, generator=g))
    return sae


def _assert_the_models_own_layer(analysis, cache, input_hook: str) -> None:
    """The analysed layer is the model's: from the activations at the input SAE's hook, its output SAE activations
    are sae-lens' own on the model's hook_mlp_out, and D Q(e) D^T is the brute-force form in the SAE's coordinates."""
    from bcos_plugins.bilinear import bilinear_tensor

    x = cache[input_hook].reshape(-1, 8)
    mlp_out = cache["blocks.1.hook_mlp_out"].reshape(-1, 8)
    torch.testing.assert_close(analysis.output_activations(x), analysis.output_sae.encode(mlp_out),
                               rtol=1e-4, atol=1e-4)
    weights = analysis.weights.augmented() if analysis.augmented else analysis.weights
    e = analysis.output_sae.W_enc[:, 5].detach()
    q = torch.einsum("o,oij->ij", e, bilinear_tensor(weights))[:8, :8]
    decoder = analysis.input_sae.W_dec.detach()
    torch.testing.assert_close(analysis.feature_interactions(5), decoder @ q @ decoder.T, rtol=1e-4, atol=1e-4)
    # and the quadratic form of the SAE's coordinates reproduces the output feature's pre-activation exactly
    correlation = analysis.low_rank_correlation(x, [0, 1, 2, 3], ranks=[9 if analysis.augmented else 8])
    active = correlation.active_tokens >= 2
    torch.testing.assert_close(correlation.correlations[0][active], torch.ones(int(active.sum())), rtol=0, atol=1e-4)


@pytest.mark.parametrize("normalization_type", ["RMS", "LN"])
def test_bilinear_sae_interactions_refuse_ln2_hook_normalized_of_a_weighted_norm_and_fold_it_when_given(
        normalization_type):
    """TransformerLens records blocks.L.ln2.hook_normalized before ln2 multiplies by its weight (a LayerNorm also adds
    its bias), but BilinearSAEInteractions took an SAE there as the MLP's input: on a model whose ln2 weight is not 1
    (any trained bilinear_config model, a bilinear Llama from hooked_transformer_from_hf), its output activations
    missed the model's by up to 8 and its interactions were another layer's, silently."""
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions

    model = _bilinear_lens_model(normalization_type)
    sae_in, sae_out = _topk_sae("blocks.1.ln2.hook_normalized", 1), _topk_sae("blocks.1.hook_mlp_out", 2, k=8)
    mlp = model.blocks[1].mlp
    bias = r" and adds its bias" if normalization_type == "LN" else ""
    with pytest.raises(BcosValueError, match=r"input_sae: it reads 'blocks\.1\.ln2\.hook_normalized', which "
                                             rf"TransformerLens records before ln2 multiplies by its weight{bias}: .*"
                                             r"Pass input_norm=model\.blocks\[1\]\.ln2 .*blocks\.1\.mlp\.hook_in"):
        BilinearSAEInteractions(mlp, sae_in, sae_out)
    analysis = BilinearSAEInteractions(mlp, sae_in, sae_out, input_norm=model.blocks[1].ln2)
    assert analysis.augmented == (normalization_type == "LN")  # a LayerNorm's bias enters both branches
    _, cache = model.run_with_cache(torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0)))
    _assert_the_models_own_layer(analysis, cache, "blocks.1.ln2.hook_normalized")
    # the norm of another block, or something else, is refused naming input_norm
    with pytest.raises(BcosValueError, match=r"input_norm: it is blocks\.0\.ln2, not the norm in front of blocks\.1"
                                             r"\.mlp\. Pass model\.blocks\[1\]\.ln2"):
        BilinearSAEInteractions(mlp, sae_in, sae_out, input_norm=model.blocks[0].ln2)
    with pytest.raises(BcosTypeError, match=r"input_norm: expected the TransformerLens LayerNorm / RMSNorm"):
        BilinearSAEInteractions(mlp, sae_in, sae_out, input_norm=model.blocks[1].ln2.w)


def test_bilinear_sae_interactions_take_sae_lens_own_mlp_input_hook_as_it_is():
    """sae-lens' HookedSAETransformer records each MLP's exact input at blocks.L.mlp.hook_in: an SAE there needs no
    norm folded (it was refused: the only input name was ln2.hook_normalized), and one folded in would count ln2's
    weight twice, so input_norm with it is refused."""
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions, expected_hook_names
    from sae_lens import HookedSAETransformer

    model = _bilinear_lens_model("RMS", HookedSAETransformer)
    mlp = model.blocks[1].mlp
    assert expected_hook_names(mlp) == ({"blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_in"},
                                        {"blocks.1.hook_mlp_out"})
    sae_in, sae_out = _topk_sae("blocks.1.mlp.hook_in", 1), _topk_sae("blocks.1.hook_mlp_out", 2, k=8)
    analysis = BilinearSAEInteractions(mlp, sae_in, sae_out)
    _, cache = model.run_with_cache(torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0)))
    _assert_the_models_own_layer(analysis, cache, "blocks.1.mlp.hook_in")
    with pytest.raises(BcosValueError, match=r"the input SAE was trained on 'blocks\.1\.mlp\.hook_in' but the bilinear "
                                             r"layer's input is \['blocks\.1\.ln2\.hook_normalized'\]"):
        BilinearSAEInteractions(mlp, sae_in, sae_out, input_norm=model.blocks[1].ln2)


def test_bilinear_sae_interactions_on_a_bilinear_llama_from_hf_fold_its_rms_norm_weight():
    """The README's route (hooked_transformer_from_hf of a Llama with hidden_act='linear'): its ln2 keeps the
    transformers RMSNorm weight, so an SAE on ln2.hook_normalized needs input_norm."""
    to_lens = hooked_transformer_from_hf_or_none()
    if to_lens is None:
        return
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions

    torch.manual_seed(0)
    hf = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=2, intermediate_size=16, max_position_embeddings=16,
                                          hidden_act="linear")).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.post_attention_layernorm.weight.copy_(0.2 + 2 * torch.rand(8))
    model = to_lens(hf)
    sae_in, sae_out = _topk_sae("blocks.1.ln2.hook_normalized", 1), _topk_sae("blocks.1.hook_mlp_out", 2, k=8)
    with pytest.raises(BcosValueError, match=r"Pass input_norm=model\.blocks\[1\]\.ln2"):
        BilinearSAEInteractions(model.blocks[1].mlp, sae_in, sae_out)
    analysis = BilinearSAEInteractions(model.blocks[1].mlp, sae_in, sae_out, input_norm=model.blocks[1].ln2)
    _, cache = model.run_with_cache(torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0)))
    _assert_the_models_own_layer(analysis, cache, "blocks.1.ln2.hook_normalized")


def test_bilinear_sae_interactions_refuse_an_output_sae_after_the_mlps_post_norm():
    """With use_normalization_before_and_after (Gemma 2's layout) TransformerLens records hook_mlp_out after ln2_post
    normalises the MLP's output again, a per-token scale: an output SAE there is not on the layer's output, and the
    output activations computed from the weights missed sae-lens' own on the model's hook_mlp_out by up to 5.5."""
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from bcos_plugins.adapters.transformer_lens import bilinear_config
    from transformer_lens import HookedTransformer

    torch.manual_seed(0)
    model = HookedTransformer(bilinear_config(d_model=8, n_layers=2, n_heads=2, d_mlp=16, d_vocab=VOCAB, n_ctx=16,
                                              normalization_type="RMSPre", use_normalization_before_and_after=True))
    sae_in, sae_out = _topk_sae("blocks.1.ln2.hook_normalized", 1), _topk_sae("blocks.1.hook_mlp_out", 2, k=8)
    words = (r"output_sae: it reads 'blocks\.1\.hook_mlp_out', which this model records after blocks\.1\.ln2_post "
             r"normalises the MLP's output again \(use_normalization_before_and_after\).* pass output_hook=")
    with pytest.raises(BcosValueError, match=words):
        BilinearSAEInteractions(model.blocks[1].mlp, sae_in, sae_out)
    with pytest.raises(BcosValueError, match=words):  # naming the hook does not make it the layer's output
        BilinearSAEInteractions(model.blocks[1].mlp, sae_in, sae_out, output_hook="blocks.1.hook_mlp_out")
    # an SAE on the MLP's own output, recorded by a hook of the user's, is taken and is the layer's
    own_out = _topk_sae("blocks.1.mlp.my_out", 2, k=8)
    analysis = BilinearSAEInteractions(model.blocks[1].mlp, sae_in, own_out, output_hook="blocks.1.mlp.my_out")
    outputs = []
    handle = model.blocks[1].mlp.register_forward_hook(lambda module, args, out: outputs.append(out))
    _, cache = model.run_with_cache(torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0)))
    handle.remove()
    torch.testing.assert_close(analysis.output_activations(cache["blocks.1.ln2.hook_normalized"].reshape(-1, 8)),
                               own_out.encode(outputs[0].reshape(-1, 8)), rtol=1e-4, atol=1e-4)
