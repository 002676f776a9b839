"""Third trust pass: the cases the second pass left alone (half-precision token scores, NaN gradients at padding,
batch-dependent tie breaking in pixel rankings, Captum on a compiled model, the row-id message), and a hunt for
silently wrong numbers with unusual inputs on public entry points. Tiny random models; each check is against a number
computed another way.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import padded_rows
from test_trust_pass2 import _bcos_llama

from bcos_plugins import explain

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ half-precision token scores


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_models_token_scores_are_reduced_in_float32(dtype, reduce):
    """explain summed a float16 / bfloat16 model's contributions over d_model in the model's dtype: each token's score
    kept 3 significant digits (off by up to 3e-3 of itself in bfloat16, 4e-4 in float16, tiny B-cos Llama) while
    Explanation.total, summed in float32, looked right. The token scores are now reduced in float32 and equal the
    float64 reduction of the same half-precision contributions."""
    model = copy.deepcopy(_bcos_llama()).to(dtype)
    ids, mask = padded_rows([30, 17, 5], 30, "left", seed=2)
    expl = explain(model, ids, mask, target=5, position=-1, reduce=reduce)
    assert expl.input_contributions.dtype == dtype
    assert expl.contributions.dtype == torch.float32
    exact = getattr(expl.input_contributions.double(), reduce)(-1)
    torch.testing.assert_close(expl.contributions.double(), exact, rtol=1e-6, atol=1e-9)
    if reduce == "sum":  # the token scores add up to the total, which is summed in float32 too
        torch.testing.assert_close(expl.contributions.double().sum(-1), expl.total.double(), rtol=1e-6, atol=1e-7)


def test_float64_token_scores_stay_float64():
    model = copy.deepcopy(_bcos_llama()).double()
    ids, mask = padded_rows([9, 4], 9, "left", seed=1)
    expl = explain(model, ids, mask, target=5, position=-1)
    assert expl.contributions.dtype == torch.float64
    torch.testing.assert_close(expl.contributions, expl.input_contributions.sum(-1), rtol=0, atol=0)


# ------------------------------------------------------------------ a NaN gradient at padding


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_nan_gradient_at_padding_only_is_refused(side):
    """explain's completeness check tests the gradients' finiteness only where delta is not finite. The
    contributions are taken at every position, padding included, and delta sums all of them, so a NaN gradient at a
    padding position alone (here put there by a hook on the first layer's input gradient) makes that row's delta NaN
    and is refused, naming the cause: no returned number carries it silently."""
    from bcos_plugins.errors import BcosValueError

    model = _bcos_llama()
    ids, mask = padded_rows([9, 5], 9, side, seed=2)
    padding = (mask == 0)[..., None]

    def nan_at_padding(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: grad.masked_fill(padding, float("nan")))

    handle = model.model.layers[0].register_forward_pre_hook(nan_at_padding, with_kwargs=True)
    try:
        with pytest.raises(BcosValueError, match="gradient at the attribution point is NaN or infinite"):
            explain(model, ids, mask, target=5, position=-1)
    finally:
        handle.remove()
    explain(model, ids, mask, target=5, position=-1)  # the same call without the hook is fine


# ------------------------------------------------------------------ pixel rankings with ties


def _patch_maps(batch: int, seed: int) -> torch.Tensor:
    """Token-level maps (4x4 patches of one value each on an 8x8 image, as attention rollout gives): every pixel
    ties with 15 others."""
    patches = torch.randn(batch, 2, 2, generator=torch.Generator().manual_seed(seed))
    return patches.repeat_interleave(4, 1).repeat_interleave(4, 2)


@pytest.mark.parametrize("most_first", [True, False])
def test_an_images_pixel_ranking_and_curves_are_the_same_alone_and_in_a_batch(most_first):
    """pixel_ranking broke ties with one generator drawn from image after image, so an image with tied scores was
    ranked (and its pixel_perturbation curves computed) differently alone than as the third image of a batch. Each
    image's ties are now broken by the same permutation of the seed, wherever it stands."""
    from test_metrics_image import linear_model

    from bcos_plugins.metrics import pixel_perturbation, pixel_ranking

    maps = _patch_maps(4, seed=0)
    batched = pixel_ranking(maps, most_important_first=most_first, seed=3)
    for row in range(4):
        alone = pixel_ranking(maps[row:row + 1], most_important_first=most_first, seed=3)
        assert torch.equal(alone[0], batched[row]), f"image {row}"
        scores = maps[row].flatten()[batched[row]]
        assert (scores.diff() <= 0).all() if most_first else (scores.diff() >= 0).all()

    inputs = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    forward = linear_model(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(2)))
    together = pixel_perturbation(forward, inputs, maps, 0, fractions=(0.0, 0.1, 0.3), score="logit", seed=3)
    for row in range(4):
        alone = pixel_perturbation(forward, inputs[row:row + 1], maps[row:row + 1], 0, fractions=(0.0, 0.1, 0.3),
                                   score="logit", seed=3)
        torch.testing.assert_close(alone.most_first[0], together.most_first[row], rtol=0, atol=0)
        torch.testing.assert_close(alone.least_first[0], together.least_first[row], rtol=0, atol=0)


# ------------------------------------------------------------------ Captum on a compiled model


def _compiled_pair(stock: bool = False):
    import transformers as T
    from conftest import tiny_config
    from test_compiled_registry_models import _RecordingBackend

    from bcos_plugins import bcosify

    torch.manual_seed(0)
    model = T.GPT2ForSequenceClassification(tiny_config("gpt2")).eval()
    if not stock:
        model = bcosify(model, verbose=False)
    backend = _RecordingBackend()
    return model, torch.compile(model, backend=backend), backend


def test_captum_attributes_a_compiled_b_cos_model_as_the_model_itself():
    """LayerBcos(torch.compile(model)) crashed ('Tensor' object has no attribute 'get_seq_length': the wrapper was not
    recognised as a transformers model, so the mask was passed as its second positional argument, the cache), and
    BcosAttribution of a function running a compiled B-cos model was refused as running 'through no B-cos
    (dynamic-weight) module' (modules inside a compiled graph are not counted). All three forms now give the model's
    own attributions on a left-padded batch: LayerBcos and EmbeddingForward run the compiled model's own module
    (tests/test_captum_adapter.py), and a plain function calls the compiled wrapper, whose backend is given a graph
    traced in explanation mode after one traced outside it."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos
    from conftest import padded_batch

    model, compiled, backend = _compiled_pair()
    ids, mask = padded_batch(side="left")
    with torch.no_grad():
        compiled(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))
    traced_outside_explanation = backend.graphs

    def layer_bcos(m):
        return LayerBcos(m).attribute(ids, target=1, additional_forward_args=(mask,), return_convergence_delta=True)

    def embedding_forward(m):
        forward = EmbeddingForward(m)
        return BcosAttribution(forward).attribute(forward.embed(ids, mask), target=1, additional_forward_args=(mask,),
                                                  return_convergence_delta=True)

    embeds = torch.randn(3, 9, 32, generator=torch.Generator().manual_seed(1))

    def plain_function(m):  # no model= given: what ran is only seen while the call runs
        return BcosAttribution(lambda e: m(inputs_embeds=e).logits).attribute(embeds, target=1,
                                                                              return_convergence_delta=True)

    for attribute in (layer_bcos, embedding_forward, plain_function):
        expected, expected_delta = attribute(model)
        got, delta = attribute(compiled)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7, msg=lambda m, a=attribute: f"{a.__name__}: {m}")
        torch.testing.assert_close(delta, expected_delta, rtol=0, atol=1e-5)
    assert backend.graphs > traced_outside_explanation  # the calls ran through the compiled wrapper
    assert expected_delta.abs().max() > 1e-4  # inputs_embeds misses the position embeddings: the delta says so


def test_captum_still_refuses_a_compiled_stock_model():
    from bcos_plugins.adapters.captum import BcosAttribution, LayerBcos

    from bcos_plugins.errors import BcosTypeError

    _, compiled, _ = _compiled_pair(stock=True)
    with pytest.raises(BcosTypeError, match="has no B-cos"):
        LayerBcos(compiled)
    embeds = torch.randn(2, 5, 32)
    with pytest.raises(BcosTypeError, match="ran through no B-cos"):
        BcosAttribution(lambda e: compiled(inputs_embeds=e).logits).attribute(embeds, target=1)


# ------------------------------------------------------------------ the words of an id refusal


def test_inseq_classifier_target_refusals_ask_for_class_ids_not_one_id_per_row():
    """BcosClassifier.attribute(target=[1.7]) was refused asking for 'one integer id per row (... of shape (1,))': its
    target is a list of classes, each attributed for every text, with no rows and no fixed length. The refusals now
    ask for what it takes; the per-row parsers elsewhere keep their words (tests/test_row_ids.py)."""
    from bcos_plugins.adapters.inseq import load_classifier
    from test_conformance import _stock, _word_tokenizer

    from bcos_plugins import bcosify
    from bcos_plugins.errors import BcosError

    classifier = load_classifier(bcosify(_stock("BertForSequenceClassification"), b=1.25, verbose=False),
                                 _word_tokenizer())
    fix = "Pass class ids as an int, a list of ints or a 1-d integer tensor."
    for bad, problem in (([1.7], "got a float (torch.float32); ids must be integers (floats are refused, not "
                                 "truncated)"),
                         ([0, True], "got a boolean; ids must be integers"),
                         (torch.tensor([True, False]), "got a boolean; ids must be integers"),
                         (["a"], "got names (['a']), not ids. Map a class name to its id with "
                                 "model.config.label2id['a'], a token with tokenizer.convert_tokens_to_ids(token) (a "
                                 "text's: tokenizer(text, add_special_tokens=False).input_ids)"),
                         ([[0, 1]], "expected class ids as an int, a list of ints or a 1-d integer tensor; got shape "
                                    "(1, 2)")):
        with pytest.raises(BcosError) as info:
            classifier.attribute("w3 w7", target=bad)
        assert str(info.value) == f"target: {problem}. {fix}", str(info.value)


# ------------------------------------------------------------------ half-precision sums elsewhere


@pytest.mark.parametrize("position_embedding", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_vits_pixel_scores_are_summed_in_float32(dtype, position_embedding):
    """explain_image summed a float16 / bfloat16 ViT's contributions over the encoded channels, and the position
    embedding's share over tokens and features, in the model's dtype: each pixel's score was off by up to 3e-3 of the
    largest (bfloat16; 4e-4 in float16). Both are now summed in float32 (the float64 sums of the same contributions,
    to float32 rounding) and the pixel scores plus the position share add up to the total."""
    from test_vision import images, tiny_vit

    from bcos_plugins import explain_image

    model = tiny_vit(position_embedding=position_embedding, num_channels=3).to(dtype)
    expl = explain_image(model, images(batch=3, channels=3).to(dtype), target=1)
    assert expl.input_contributions.dtype == dtype
    assert expl.contributions.dtype == expl.position_contributions.dtype == torch.float32
    torch.testing.assert_close(expl.contributions.double(), expl.input_contributions.double().sum(1), rtol=1e-6,
                               atol=1e-9)
    torch.testing.assert_close(expl.contributions.double().sum((1, 2)), expl.total.double(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_lens_explanations_token_scores_are_summed_in_float32(dtype):
    """TransformerLens' explain_logits added the embedding hooks' contributions and summed them over d_model in the
    model's dtype: a token's score was off by up to 4e-3 of the largest in bfloat16 (3e-4 in float16). The scores
    are now each hook's float32 sum, added: the float64 sums of the same contributions, to float32 rounding."""
    from bcos_plugins.adapters.transformer_lens import explain_logits
    from test_transformer_lens_adapter import GPT2_LIKE, tiny_bcos, tokens

    model = tiny_bcos(GPT2_LIKE).to(dtype)
    result = explain_logits(model, tokens(), target=5)
    assert set(result.hook_contributions) == {"hook_embed", "hook_pos_embed"}
    assert result.input_contributions.dtype == dtype and result.contributions.dtype == torch.float32
    exact = sum(c.double().sum(-1) for c in result.hook_contributions.values())
    torch.testing.assert_close(result.contributions.double(), exact, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_models_attributions_that_miss_the_logit_are_warned_about(dtype):
    """The adapters' completeness warning allowed 100 eps of the dtype (0.78 of the scale in bfloat16) and summed in
    the model's dtype: LayerBcos at a bfloat16 GPT-2's MLP, whose attributions miss up to 99 % of the logit (the
    residual stream passes beside it), returned them without the warning float32 and float16 give. It now allows the
    dtype's rounding as explain does (sqrt(eps)); the complete attributions at the default point still pass quietly."""
    import transformers as T
    from bcos_plugins.adapters.captum import LayerBcos
    from conftest import padded_batch, tiny_config

    from bcos_plugins import bcosify

    torch.manual_seed(0)
    model = bcosify(T.GPT2ForSequenceClassification(tiny_config("gpt2")).eval(), verbose=False).to(dtype)
    ids, mask = padded_batch(side="right")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # complete: no warning
        _, delta = LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,),
                                              return_convergence_delta=True)
    for layer in (model.transformer.h[0].mlp, model.transformer.h[1].mlp):
        with pytest.warns(UserWarning, match="the attributions do not sum to the explained output"):
            _, delta = LayerBcos(model, layer=layer).attribute(ids, target=1, additional_forward_args=(mask,),
                                                               return_convergence_delta=True)
        assert delta.abs().max() > 0.1  # what the warning is about


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_image_maps_are_summed_ranked_and_shared_in_float32(dtype):
    """The image metrics summed a float16 / bfloat16 (batch, C, H, W) map over its channels, and took grid pointing
    game shares, in the map's dtype: pixels whose channel sums differ tied (and were ordered by the seed instead) and a
    share was off by 7e-4 (bfloat16). They now work in float32: the ranking and shares are those of the float64 map
    of the same values."""
    from bcos_plugins.metrics import grid_pointing_game, pixel_ranking

    maps = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert torch.equal(pixel_ranking(maps), pixel_ranking(maps.double()))
    share = grid_pointing_game(maps, 1)
    assert share.dtype == torch.float32
    torch.testing.assert_close(share.double(), grid_pointing_game(maps.double(), 1), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_space_models_token_scores_are_summed_in_float32(dtype):
    """context_attribution summed a float16 / bfloat16 Space model's concept-unit shares per token in the model's
    dtype (off by 3e-3 of the largest score in bfloat16); it now sums them in float32, as explain does."""
    from conftest import padded_batch
    from test_space import space_model

    from bcos_plugins.space import context_attribution

    model = space_model(n_latent=16).to(dtype)
    ids, mask = padded_batch()
    expl = context_attribution(model, ids, mask)
    assert expl.input_contributions.dtype == dtype and expl.contributions.dtype == torch.float32
    torch.testing.assert_close(expl.contributions.double(), expl.input_contributions.double().sum(-1), rtol=1e-6,
                               atol=1e-9)
    assert (expl.contributions[mask == 0] == 0).all()


# ------------------------------------------------------------------ explain_dataset


def test_explain_dataset_keeps_a_float64_models_numbers():
    """explain_dataset cast each text's scores, explained value and delta to float32 before storing them: a float64
    model's scores were rounded by 1e-9 (ties where explain tells tokens apart). They are now stored as explain
    returns them, equal to explain on each text alone."""
    from test_conformance import _word_tokenizer

    from bcos_plugins.corpus import explain_dataset

    model = copy.deepcopy(_bcos_llama()).double()
    tokenizer = _word_tokenizer()
    tokenizer.padding_side = "left"
    texts = ["w3 w7 w11 w5", "w9 w4", "w20 w21 w22 w23 w24 w25", "w8"]
    rows = explain_dataset(model, tokenizer, texts, target=5, foil=7, batch_size=3, progress=False)
    for i, text in enumerate(texts):
        alone = explain(model, torch.tensor([tokenizer(text)["input_ids"]]), target=5, foil=7)
        torch.testing.assert_close(torch.tensor(rows[i]["scores"], dtype=torch.float64), alone.contributions[0],
                                   rtol=1e-12, atol=1e-14)
        assert rows[i]["explained"] == pytest.approx(float(alone.explained[0]), rel=1e-12, abs=1e-14)


# ------------------------------------------------------------------ visualize


def test_visualize_names_a_direction_target_in_words():
    """explanations_to_html captioned an explanation of Direction(vector) with the Direction's repr: the vector's
    first hundred entries printed into the page. It now says 'a direction', as for a float tensor."""
    import re

    from test_conformance import _word_tokenizer

    from bcos_plugins import Direction
    from bcos_plugins.visualize import explanations_to_html

    vector = torch.zeros(60)
    vector[5], vector[7] = 1.0, -1.0
    expl = explain(_bcos_llama(), torch.tensor([[5, 6, 7, 8]]), target=Direction(vector), position=-1)
    page = explanations_to_html(expl, _word_tokenizer())
    (caption,) = re.findall(r"explained: [^<]*", page)
    # the explained position (the last token) is named since trust pass 14
    assert caption.startswith("explained: a direction at token 3 (w8) — value ") and "tensor" not in page


# ------------------------------------------------------------------ Captum's image methods


def test_the_inherent_image_method_reports_a_position_embedded_vits_pixel_map():
    """image_attribution_methods' 'B-cos W(x)x' refused every ViT with a position embedding ('its W(x) x explanation
    is incomplete (relative error 1.01e+00); explain_image's completeness check failed'): the embedding's constant
    share is by design beside the pixel map (position_contributions), and the check counted it as missing. The map is
    now explain_image's pixel map whenever the pixels and that share add up to the logit."""
    from bcos_plugins.adapters.captum_vision import image_attribution_methods
    from test_vision import images, tiny_vit

    from bcos_plugins import explain_image

    model = tiny_vit(position_embedding=True, num_channels=3)
    x, target = images(batch=4, channels=3), torch.tensor([0, 1, 2, 1])
    expected = explain_image(model, x, target=target)
    assert expected.position_contributions.abs().min() > 0.01  # the share the check used to count as missing
    got = image_attribution_methods(model)["B-cos W(x)x"].explain(x, target)
    torch.testing.assert_close(got, expected.contributions, rtol=0, atol=0)


# ------------------------------------------------------------------ sae-lens


def test_top_interactions_refuses_a_feature_given_twice():
    """BilinearSAEInteractions.top_interactions(input_features=[3, 3, 9]) paired every copy with every other: the pair
    (3, 3) filled three of the top four places and (3, 9) two, pushing (9, 9) out, silently. A repeated id is now
    refused, and the same features given once give the brute-force top pairs."""
    import itertools

    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from test_sae_lens_adapter import D_MODEL, layer_and_inputs, topk_sae

    from bcos_plugins.errors import BcosValueError

    layer, _ = layer_and_inputs(seed=3)
    analysis = BilinearSAEInteractions(layer, topk_sae(D_MODEL, seed=1), topk_sae(D_MODEL, seed=2))
    with pytest.raises(BcosValueError, match=r"^input_features: ids \[3\] are given more than once.*Pass each "
                                             r"feature once"):
        analysis.top_interactions(5, k=4, input_features=[3, 3, 9])
    full = analysis.feature_interactions(5)
    top = analysis.top_interactions(5, k=3, input_features=[3, 9], block_size=1)
    pairs = sorted(itertools.combinations_with_replacement([3, 9], 2), key=lambda p: -abs(float(full[p])))
    assert [(t.first, t.second) for t in top] == pairs


def test_weight_colour_image_names_weights_of_two_channels():
    """weight_colour_image raised a bare ValueError ('colour images need 1 or 3 input channels; got 2') for the
    weights of a two-channel image; it now names the argument and the fix, as every public entry point does."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision.visualize import weight_colour_image

    with pytest.raises(BcosValueError, match=r"^weights: encode 2 input channels \(2C = 4\); a colour image needs 1 "
                                             r"or 3\. Pass the weights of a grey or RGB image"):
        weight_colour_image(torch.rand(4, 4, 4), torch.rand(4, 4))


# ------------------------------------------------------------------ bilinear analysis


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_bilinear_layer_is_eigendecomposed_in_float32(dtype):
    """eigendecompose and interaction_spectra of a float16 / bfloat16 layer raised torch's NotImplementedError
    ('linalg_eigh_cpu' not implemented for 'BFloat16') from inside; hosvd already worked. Q is now decomposed in
    float32: the eigenvalues are the float32 layer's to the half weights' rounding, and the eigenvectors rebuild the
    half layer's output direction u . P g(x)."""
    from bcos_plugins.bilinear import BilinearMLP, bilinear_weights, eigendecompose, interaction_spectra

    torch.manual_seed(0)
    layer = BilinearMLP(8, 16, bias=False)
    half = copy.deepcopy(layer).to(dtype)
    u = torch.randn(2, 8)
    eig = eigendecompose(bilinear_weights(half), u.to(dtype))
    assert eig.eigenvalues.dtype == eig.eigenvectors.dtype == torch.float32
    reference = eigendecompose(bilinear_weights(layer), u)
    allowed = 0.02 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(eig.eigenvalues, reference.eigenvalues, rtol=0,
                               atol=allowed * float(reference.eigenvalues.abs().max()))
    torch.testing.assert_close(interaction_spectra(bilinear_weights(half), u.to(dtype)), eig.eigenvalues)
    x = torch.randn(20, 8).to(dtype)
    with torch.no_grad():
        out = half(x).float() @ u.T  # (20, 2)
    rebuilt = (eig.eigenvalues[None] * torch.einsum("bi,nik->bnk", x.float(), eig.eigenvectors).square()).sum(-1)
    torch.testing.assert_close(rebuilt, out, rtol=0, atol=allowed * float(out.abs().max()))


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_token_component_table_is_summed_in_float32(dtype, batched):
    """token_component_decomposition summed each table entry over d_model, and the table over tokens, components or
    both (token_totals, component_totals, delta), in the model's dtype: a bfloat16 row's delta read 0.0 where the
    table missed the logit by 3e-4, and entries carried 3 significant digits. The entries are now summed in float32
    (the table is float32) and so are its totals: delta is the float64 sum of the table minus the logit."""
    from bcos_plugins.adapters.transformer_lens import token_component_decomposition
    from test_transformer_lens_adapter import LLAMA_LIKE, tiny_bcos, tokens

    model = tiny_bcos(LLAMA_LIKE).to(dtype)
    decomposition = token_component_decomposition(model, tokens(), target=5, foil=7, batched=batched)
    table = decomposition.table
    assert table.dtype == torch.float32 and decomposition.explained.dtype == dtype
    exact = table.double()
    torch.testing.assert_close(decomposition.token_totals.double(), exact.sum(2), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(decomposition.component_totals.double(), exact.sum(1), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(decomposition.delta.double(), exact.sum((1, 2)) - decomposition.explained.double(),
                               rtol=1e-5, atol=1e-7)


def test_captums_llm_gradient_attribution_takes_a_compiled_b_cos_causal_lm():
    """Captum's own LLM workflow (LLMGradientAttribution around LayerBcos) on torch.compile(model) gives the
    uncompiled model's token attributions (a guard beside the fix above: this path replaces LayerBcos' forward
    with its own)."""
    from bcos_plugins.adapters.captum import LayerBcos
    from captum.attr import LLMGradientAttribution, TextTokenInput
    from test_compiled_registry_models import _RecordingBackend
    from test_conformance import _converted, _word_tokenizer

    model, tokenizer = _converted("LlamaForCausalLM"), _word_tokenizer()

    def token_attributions(m):
        return LLMGradientAttribution(LayerBcos(m), tokenizer).attribute(
            TextTokenInput("w5 w7 w9 w11", tokenizer), target="w3 w4").token_attr

    expected = token_attributions(model)
    torch.testing.assert_close(token_attributions(torch.compile(model, backend=_RecordingBackend())), expected,
                               rtol=1e-5, atol=1e-7)


def test_captum_visualization_records_of_a_direction_explanation():
    """visualization_records of an explanation of Direction(vector) (as target, or as foil) raised AttributeError
    ('Direction' object has no attribute 'tolist' / 'is_floating_point'); it now labels the record 'a direction'
    (or 'target − a direction') with the row's scores, whose sum is the explained value."""
    from bcos_plugins.adapters.captum import visualization_records
    from test_conformance import _word_tokenizer

    from bcos_plugins import Direction

    model, tokenizer = _bcos_llama(), _word_tokenizer()
    vector = torch.zeros(60)
    vector[5], vector[7] = 1.0, -1.0
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9]])
    for asked, label in ((dict(target=Direction(vector)), "a direction"),
                         (dict(target=5, foil=Direction(vector)), "5 − a direction")):
        expl = explain(model, ids, position=-1, **asked)
        records = visualization_records(expl, tokenizer)
        # the explained position (each row's last token) is named since trust pass 14
        assert [r.attr_class for r in records] == [f"{label} at token 3 ({r.raw_input_ids[3]})" for r in records]
        for record, value in zip(records, expl.explained.tolist(), strict=True):
            assert record.attr_score == pytest.approx(value, rel=1e-5, abs=1e-6)
