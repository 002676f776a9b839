"""Fifth trust pass: the host adapters (Captum, inseq, sae-lens), the vision tools and the bilinear tools under
unusual inputs, each checked against a number computed another way (the model's own logits, a float64 copy, a
brute-force reference) or against a refusal that names the argument, the problem and the fix."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import tiny_model
from test_captum_adapter import _word_tokenizer

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosError

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ inseq: load_classifier's labels and probabilities


@pytest.fixture(scope="module")
def bcos_bert_classifier():
    model = tiny_model("BertForSequenceClassification")
    return bcosify(model, b=1.5, verbose=False)


TEXTS = ["w5 w7 w9 w11 w12", "w3", "w8 w9"]


def _own_logits(model, tokenizer) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([model(**tokenizer([t], return_tensors="pt")).logits[0] for t in TEXTS])


@pytest.mark.parametrize("target", [[2, 0], [2, 1, 0], [1]])
def test_classifier_generated_texts_name_the_models_prediction_whatever_the_target(bcos_bert_classifier, target):
    """``info["generated_texts"]`` took the argmax over the *attributed columns* and read it as a class id: with
    target=[2, 0] a text predicted as class 2 got the name of class 0, and a subset's best column is not the
    prediction either. It is now the model's own argmax over every class."""
    from bcos_plugins.adapters.inseq import load_classifier

    tokenizer = _word_tokenizer()
    names = ["neg", "neutral", "pos"]
    logits = _own_logits(bcos_bert_classifier, tokenizer)
    assert len(set(logits.argmax(-1).tolist())) == 3  # the three texts are predicted as three different classes
    out = load_classifier(bcos_bert_classifier, tokenizer, label_names=names).attribute(TEXTS, target=target)
    assert out.info["generated_texts"] == [names[c] for c in logits.argmax(-1).tolist()]
    bcos_bert_classifier.train()  # set back to training after load_classifier: still the model's eval-mode prediction
    try:
        again = load_classifier(bcos_bert_classifier, tokenizer, label_names=names)
        bcos_bert_classifier.train()
        for _ in range(3):
            assert again.attribute(TEXTS, target=target).info["generated_texts"] == out.info["generated_texts"]
        assert bcos_bert_classifier.training
    finally:
        bcos_bert_classifier.eval()
    for seq, row in zip(out.sequence_attributions, logits, strict=True):  # the attributions themselves were right
        torch.testing.assert_close(seq.source_attributions.sum(dim=(0, 2)), row[target], rtol=1e-5, atol=1e-6)


def test_classifier_probabilities_come_from_every_class_logit(bcos_bert_classifier):
    """With a repeated class among the targets (target=[1, 1, 0] of 3 classes: as many columns as classes) the
    ``probability`` step score was a softmax over the attributed columns, counting class 1 twice and leaving class 2
    out. Probabilities now come from all of the model's logits, given when every class is attributed, in the
    attributed order."""
    from bcos_plugins.adapters.inseq import load_classifier

    tokenizer = _word_tokenizer()
    logits = _own_logits(bcos_bert_classifier, tokenizer)
    classifier = load_classifier(bcos_bert_classifier, tokenizer)
    repeated = classifier.attribute(TEXTS, target=[1, 1, 0])
    assert all("probability" not in seq.step_scores for seq in repeated.sequence_attributions)  # class 2 missing
    reordered = classifier.attribute(TEXTS, target=[2, 1, 0, 2])
    for seq, row in zip(reordered.sequence_attributions, logits, strict=True):
        torch.testing.assert_close(seq.step_scores["probability"], row.softmax(-1)[[2, 1, 0, 2]], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5])
def test_classifier_batch_size_is_validated(bcos_bert_classifier, batch_size):
    """batch_size=0 failed inside range() ("arg 3 must not be zero"), a negative one with an IndexError."""
    from bcos_plugins.adapters.inseq import load_classifier

    classifier = load_classifier(bcos_bert_classifier, _word_tokenizer())
    with pytest.raises(BcosError, match="batch_size"):
        classifier.attribute(TEXTS, batch_size=batch_size)


# ------------------------------------------------------------------ bilinear tools


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eigendecompose_of_a_half_precision_layer_is_exact_to_float32(dtype):
    """eigendecompose / interaction_spectra returned float32 eigenvalues of a Q computed in half precision (3
    significant digits: 0.25% of the largest eigenvalue off on this layer). Q is now computed from the weights widened
    to float32 (exact), so the eigenvalues match a float64 copy of the same weights to float32 rounding."""
    from bcos_plugins.bilinear import BilinearMLP, eigendecompose, interaction_spectra

    torch.manual_seed(0)
    layer = BilinearMLP(7, 13, 5).to(dtype)  # d_hidden a prime, not a multiple of anything
    reference = BilinearMLP(7, 13, 5).double()
    reference.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    u = torch.randn(3, 5).to(dtype)
    expected = eigendecompose(reference, u.double()).eigenvalues
    scale = expected.abs().max().item()
    for eigenvalues in (eigendecompose(layer, u).eigenvalues, interaction_spectra(layer, u)):
        assert eigenvalues.dtype == torch.float32
        assert (eigenvalues.double() - expected).abs().max().item() < 1e-5 * scale
    x = torch.randn(11, 7, dtype=torch.float64)  # and they still decompose the layer's own quadratic form
    from bcos_plugins.bilinear import eigenvector_activations

    activations = eigenvector_activations(eigendecompose(layer, u), x.float()).sum(-1).double()
    torch.testing.assert_close(activations, reference(x) @ u.double().T, rtol=1e-5, atol=1e-5 * scale)


def test_bilinear_weights_of_mixed_dtypes_are_refused_naming_them():
    """(W float64, V float32, P float32) failed inside a matrix product ("expected m1 and m2 to have the same
    dtype") with no argument named."""
    from bcos_plugins.bilinear import hosvd, interaction_matrix

    W, V, P = torch.randn(3, 4).double(), torch.randn(3, 4), torch.randn(2, 3)
    for call in (lambda: interaction_matrix((W, V, P), torch.randn(2)), lambda: hosvd((W, V, P))):
        with pytest.raises(BcosError, match=r"source: .*mix dtypes.*W: torch.float64.*Cast them"):
            call()


# ------------------------------------------------------------------ sae-lens: one output feature means one


@pytest.mark.parametrize("method", ["interaction_matrix", "feature_interactions", "top_interactions"])
def test_single_feature_methods_refuse_several_features(method):
    """BilinearSAEInteractions.interaction_matrix / feature_interactions / top_interactions read row 0 of the
    encoder directions: given [4, 5] they silently answered for feature 4 alone."""
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from test_sae_lens_adapter import topk_sae

    from bcos_plugins.bilinear import BilinearMLP

    torch.manual_seed(0)
    analysis = BilinearSAEInteractions(BilinearMLP(7, 13, bias=True), topk_sae(7, 20), topk_sae(7, 20, seed=3))
    call = getattr(analysis, method)
    with pytest.raises(BcosError, match=r"output_feature: one feature id, got \[4, 5\]"):
        call([4, 5])
    one = call([4])  # one id in a list is still one feature
    assert type(one) is type(call(4))


# ------------------------------------------------------------------ Captum: targets and other methods' keywords


def _bert_at_embeddings(model):
    from bcos_plugins.adapters.captum import EmbeddingForward
    from conftest import padded_batch

    ids, mask = padded_batch()
    forward = EmbeddingForward(model)
    return ids, mask, forward, forward.embed(ids, mask)


@pytest.mark.parametrize("target", [torch.tensor([[0], [2], [1]]), torch.tensor([0, 2]), [0, 2], [0, 2, 1, 1]])
def test_captum_targets_of_another_length_are_refused_naming_target(bcos_bert_classifier, target):
    """A (batch, 1) tensor or a list / tensor with another number of targets than examples reached Captum's bare
    AssertionError ("Tensor target dimension torch.Size([3, 1]) is not valid", "Target list length does not match
    output!"), naming neither the argument nor the fix; both B-cos methods now refuse them before Captum."""
    from bcos_plugins.adapters.captum import BcosAttribution, LayerBcos

    ids, mask, forward, embeddings = _bert_at_embeddings(bcos_bert_classifier)
    with pytest.raises(BcosError, match=r"target: a (tensor|list) of targets holds one .*per example.*Pass"):
        BcosAttribution(forward).attribute(embeddings, target=target, additional_forward_args=(mask,))
    with pytest.raises(BcosError, match=r"target: a (tensor|list) of targets holds one .*per example.*Pass"):
        LayerBcos(bcos_bert_classifier).attribute(ids, target=target, additional_forward_args=(mask,))


def test_captum_targets_of_the_right_forms_still_work(bcos_bert_classifier):
    """The forms Captum takes (an int, a 0-d tensor, one per example as a list or a 1-d tensor, a one-element tensor
    for every example) give the same attributions as explain."""
    from bcos_plugins.adapters.captum import BcosAttribution

    from bcos_plugins import explain

    ids, mask, forward, embeddings = _bert_at_embeddings(bcos_bert_classifier)
    per_row = explain(bcos_bert_classifier, ids, mask, target=torch.tensor([0, 2, 1])).input_contributions
    for target in ([0, 2, 1], torch.tensor([0, 2, 1]), [(0,), (2,), (1,)]):
        attributions = BcosAttribution(forward).attribute(embeddings, target=target, additional_forward_args=(mask,))
        torch.testing.assert_close(attributions, per_row, rtol=1e-5, atol=1e-7)
    every = explain(bcos_bert_classifier, ids, mask, target=2).input_contributions
    for target in (2, torch.tensor(2), torch.tensor([2])):
        attributions = BcosAttribution(forward).attribute(embeddings, target=target, additional_forward_args=(mask,))
        torch.testing.assert_close(attributions, every, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("keyword", ["baselines", "internal_batch_size", "n_steps"])
def test_other_captum_methods_keywords_are_refused_with_the_reason(bcos_bert_classifier, keyword):
    """``baselines=`` / ``internal_batch_size=`` (IntegratedGradients' keywords) raised Python's "unexpected keyword
    argument" (BcosAttribution) or Captum's LayerGradientXActivation's (LayerBcos, naming another class); the refusal
    now says why a B-cos explanation takes none and what to do instead."""
    from bcos_plugins.adapters.captum import BcosAttribution, LayerBcos

    ids, mask, forward, embeddings = _bert_at_embeddings(bcos_bert_classifier)
    value = torch.zeros_like(embeddings) if keyword == "baselines" else 2
    with pytest.raises(TypeError, match=rf"{keyword}: BcosAttribution.attribute takes no {keyword}: .*\. Leave"):
        BcosAttribution(forward).attribute(embeddings, target=1, additional_forward_args=(mask,), **{keyword: value})
    with pytest.raises(TypeError, match=rf"{keyword}: LayerBcos.attribute takes no {keyword}: .*\. Leave"):
        LayerBcos(bcos_bert_classifier).attribute(ids, target=1, additional_forward_args=(mask,), **{keyword: value})
    with pytest.raises(TypeError, match="not_an_argument: is not an argument of BcosAttribution.attribute"):
        BcosAttribution(forward).attribute(embeddings, target=1, additional_forward_args=(mask,), not_an_argument=1)


# ------------------------------------------------------------------ vision


@pytest.fixture(scope="module")
def rgb_bcos_vit():
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    config = BcosViTConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, num_labels=5, num_channels=3, b=1.5)
    return BcosViT(config).eval()


def test_the_inherent_image_map_under_bfloat16_autocast_is_returned_to_its_rounding(rgb_bcos_vit):
    """image_attribution_methods' "B-cos W(x)x" held the map to 1e-4 of the logit, so under a bfloat16 autocast
    (complete to 1e-2 there, as explain_image's completeness_error says) it refused the model as broken, blaming
    "explain_image's completeness check" (there is none). It now allows the autocast dtype's rounding, as explain
    does, and the map is explain_image's."""
    from bcos_plugins.adapters.captum_vision import image_attribution_methods

    from bcos_plugins.vision import explain_image

    torch.manual_seed(1)
    images, target = torch.rand(3, 3, 16, 16), torch.tensor([0, 4, 2])
    method = image_attribution_methods(rgb_bcos_vit)["B-cos W(x)x"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = explain_image(rgb_bcos_vit, images, target=target)
        assert reference.completeness_error.abs().max() > 1e-3  # the case: bfloat16 rounding, beyond 1e-4
        torch.testing.assert_close(method.explain(images, target), reference.contributions)
    # in float32 the map is still held to 1e-4
    torch.testing.assert_close(method.explain(images, target), explain_image(rgb_bcos_vit, images, target=target)
                               .contributions)


def test_8_bit_images_are_refused_with_the_scaling_fix(rgb_bcos_vit):
    """uint8 images (what an image loader returns) were refused without the fix ("expected a float tensor ... with
    values in [0, 1]", not naming the dtype got); the refusal now names it and how to scale them."""
    from bcos_plugins.vision import explain_image

    images = (torch.rand(2, 3, 16, 16) * 255).to(torch.uint8)
    with pytest.raises(TypeError, match=r"pixel_values: .*got torch\.uint8.*pixel_values\.float\(\) / 255"):
        explain_image(rgb_bcos_vit, images)
    with pytest.raises(BcosError, match=r"pixel_values: .*uint8.*pixel_values\.float\(\) / 255"):
        rgb_bcos_vit(pixel_values=images)
    scaled = explain_image(rgb_bcos_vit, images.float() / 255, target=1)  # the fix it names works
    assert scaled.completeness_error.abs().max() < 1e-5


@pytest.mark.parametrize("family", ["BertForSequenceClassification", "GPT2LMHeadModel"])
def test_layer_bcos_at_a_block_input_called_with_none_names_the_fix(family):
    """LayerBcos(model, layer=<a transformers block>, attribute_to_layer_input=True) failed with Captum's bare
    "AssertionError: Given input is not a torch.Tensor" (BertLayer is called with (hidden_states, mask, None), GPT2Block
    with a None too); the refusal names the argument and the fix, and the fix it names (the previous module's output)
    is complete."""
    from bcos_plugins.adapters.captum import LayerBcos
    from conftest import padded_batch

    model = bcosify(tiny_model(family), b=1.5, verbose=False)
    blocks = model.bert.encoder.layer if family.startswith("Bert") else model.transformer.h
    ids, mask = padded_batch()
    with pytest.raises(BcosError, match=r"attribute_to_layer_input: .* called with a None .*attribute_to_layer_input="
                                        r"False"):
        LayerBcos(model, layer=blocks[1], attribute_to_layer_input=True).attribute(ids, target=1,
                                                                                   additional_forward_args=(mask,))
    _, delta = LayerBcos(model, layer=blocks[0], attribute_to_layer_input=False).attribute(
        ids, target=1, additional_forward_args=(mask,), return_convergence_delta=True)
    assert delta.abs().max() < 1e-5


def test_inseq_bcos_generates_and_scores_in_eval_mode_when_the_model_was_set_to_train():
    """inseq's load_model puts the model in eval mode once; a model set back to training mode afterwards (a training
    loop between attributions) generated with dropout and took its step scores with dropout, while LayerBcos explained
    it in eval mode: a GPT-2's ``logit`` step score missed the attributions' total by 0.28, and the generated tokens
    differed from the model's own. Everything now runs in eval mode, and the model's training flags come back."""
    import bcos_plugins.adapters.inseq  # noqa: F401  registers "bcos"
    import inseq
    import transformers as T
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    model = _tiny_lm("gpt2", len(tokenizer))
    attribution_model = inseq.load_model(model, "bcos", tokenizer=tokenizer)
    arguments = dict(generation_args={"max_new_tokens": 3, "do_sample": False}, step_scores=["logit"],
                     show_progress=False)
    reference = attribution_model.attribute(["The cat sat on the", "Hello"], **arguments)
    model.train()
    torch.manual_seed(0)
    out = attribution_model.attribute(["The cat sat on the", "Hello"], **arguments)
    assert model.training and model.transformer.h[0].attn.attn_dropout.training  # flags back as they were
    for seq, ref in zip(out.sequence_attributions, reference.sequence_attributions, strict=True):
        assert [t.id for t in seq.target] == [t.id for t in ref.target]
        totals = torch.nansum(seq.target_attributions, dim=(0, 2))
        torch.testing.assert_close(totals, seq.step_scores["logit"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(seq.step_scores["logit"], ref.step_scores["logit"])


def test_layer_bcos_given_token_type_ids_names_the_route_that_takes_them(bcos_bert_classifier):
    """LayerBcos(model) calls the model with (input_ids, attention_mask, position); token_type_ids passed as the next
    argument were refused as a position ("a sequence classifier gives one logit vector per sequence. Leave position
    out"), which says nothing about token types. The refusal now names them and the route that takes them, and that
    route explains the model with its token types."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos
    from conftest import padded_batch

    from bcos_plugins import explain

    ids, mask = padded_batch()
    token_types = torch.zeros_like(ids)
    token_types[:, 4:] = 1
    for forward_args in ((mask, token_types), (mask, None, token_types)):
        with pytest.raises(TypeError, match=r"additional_forward_args: .*token_type_ids.*EmbeddingForward\(model\)"):
            LayerBcos(bcos_bert_classifier).attribute(ids, target=1, additional_forward_args=forward_args)
    forward = EmbeddingForward(bcos_bert_classifier)
    attributions = BcosAttribution(forward).attribute(forward.embed(ids, mask, token_type_ids=token_types), target=1,
                                                      additional_forward_args=(mask,))
    reference = explain(bcos_bert_classifier, ids, mask, target=1, token_type_ids=token_types)
    torch.testing.assert_close(attributions, reference.input_contributions, rtol=1e-5, atol=1e-7)


def test_top_interactions_of_chosen_input_features_list_each_pair_in_id_order():
    """FeatureInteraction promises first <= second; with input_features=[5, 2, 9] the pair of 5 and 2 came as (5, 2)
    (ordered by position in the given list). Pairs are now in id order, with the brute-force values of D Q(e) D^T."""
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions
    from test_sae_lens_adapter import topk_sae

    from bcos_plugins.bilinear import BilinearMLP

    torch.manual_seed(0)
    layer = BilinearMLP(7, 13, bias=True)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.5)
    analysis = BilinearSAEInteractions(layer, topk_sae(7, 20), topk_sae(7, 20, seed=3))
    chosen = [5, 2, 9]
    top = analysis.top_interactions(3, k=6, input_features=chosen)
    table = analysis.feature_interactions(3)
    expected = sorted(((min(a, b), max(a, b)) for i, a in enumerate(chosen) for b in chosen[i:]),
                      key=lambda pair: -abs(float(table[pair])))
    assert [(t.first, t.second) for t in top] == expected
    assert all(t.first <= t.second and t.value == pytest.approx(float(table[t.first, t.second]), rel=1e-5) for t in top)


def test_images_given_already_encoded_are_refused_naming_the_encoding(rgb_bcos_vit):
    """[x, 1 - x]-encoded images (6 channels) passed as pixel_values of a 3-channel B-cos ViT were refused as "the model
    was configured with num_channels=3", with no word of the encoding; the refusal now names it and both fixes, and the
    fix it names (encoded_pixel_values=) gives the images' logits."""
    from bcos_plugins.vision import explain_image

    images = torch.rand(2, 3, 16, 16)
    encoded = rgb_bcos_vit.encode(images)
    for call in (lambda: explain_image(rgb_bcos_vit, encoded), lambda: rgb_bcos_vit(pixel_values=encoded)):
        with pytest.raises(BcosError, match=r"pixel_values: .*already encoded as \[x, 1 - x\]\? .*encoded_pixel_values="):
            call()
    with torch.no_grad():
        torch.testing.assert_close(rgb_bcos_vit(encoded_pixel_values=encoded).logits,
                                   rgb_bcos_vit(pixel_values=images).logits)
