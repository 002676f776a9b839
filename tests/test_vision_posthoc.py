"""The post-hoc image explanations the B-cos ViT paper compares with (bcos_plugins.adapters.captum_vision), on tiny ViTs.

Each method's maths is checked by hand (IxG at the encoding and at the pixels, last-layer attention, GradCAM
on the token grid and on the last attention layer), the inherent map's completeness, and the argument checks; the vision benchmark and
examples/vit_digits.py explain with this set.
"""

from __future__ import annotations

import pytest
import torch
from bcos_plugins.adapters.captum_vision import _token_grid_layer, image_attribution_methods

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.vision import attribution_input

# Captum's note that it set requires_grad on the inputs itself: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")



EXPECTED = {"bcos": {"B-cos W(x)x", "Attention (last layer)", "Rollout", "IntGrad (4 steps)", "IxG",
                     "GradCAM (attention)", "GradCAM (tokens)", "IntGrad (4 steps), pixels", "IxG, pixels"},
            "conventional": {"Attention (last layer)", "Rollout", "IntGrad (4 steps)", "IxG", "GradCAM (attention)",
                             "GradCAM (tokens)"}}


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_every_method_gives_finite_pixel_maps_and_names_its_attribution_point(tiny_vits, vit_images, kind):
    methods = image_attribution_methods(tiny_vits[kind], ig_steps=4)
    assert set(methods) == EXPECTED[kind]
    x, target = vit_images
    for name, method in methods.items():
        maps = method.explain(x, target)
        assert maps.shape == (3, 16, 16), name
        assert torch.isfinite(maps).all(), name
        assert maps.abs().sum() > 0, name  # not a degenerate all-zero map
        assert method.point, name
        assert method.post_hoc == (name != "B-cos W(x)x")
    # gradient methods attribute where the perturbation edits: the encoding for B-cos, the pixels otherwise
    expected_point = "encoded image [x, 1-x]" if kind == "bcos" else "pixels"
    assert methods["IxG"].point == expected_point


def test_bcos_map_is_complete_it_sums_to_the_explained_logit(tiny_vits, vit_images):
    model = tiny_vits["bcos"]
    x, target = vit_images
    maps = image_attribution_methods(model)["B-cos W(x)x"].explain(x, target)
    with torch.no_grad():
        logits = model(pixel_values=x).logits
    torch.testing.assert_close(maps.sum(dim=(1, 2)), logits.gather(1, target[:, None]).squeeze(1), rtol=1e-4, atol=1e-5)


def test_input_x_gradient_at_the_encoding_and_at_the_pixels(tiny_vits, vit_images):
    model = tiny_vits["bcos"]
    x, target = vit_images
    methods = image_attribution_methods(model)
    encoded = model.encode(x).requires_grad_(True)
    logit = model(encoded_pixel_values=encoded).logits.gather(1, target[:, None]).sum()
    (grad,) = torch.autograd.grad(logit, encoded)
    torch.testing.assert_close(methods["IxG"].explain(x, target), (encoded * grad).sum(dim=1).detach())
    pixels = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(pixel_values=pixels).logits.gather(1, target[:, None]).sum(), pixels)
    torch.testing.assert_close(methods["IxG, pixels"].explain(x, target), (x * grad).sum(dim=1))


def test_integrated_gradients_on_the_bcos_vit_equals_input_x_gradient_it_is_homogeneous(tiny_vits, vit_images):
    """B-cos layers are positively homogeneous (y(a x) = a y(x)), so IG from the zero encoding is exact IxG."""
    model = tiny_vits["bcos"]
    x, target = vit_images
    methods = image_attribution_methods(model, ig_steps=4)
    encoded = model.encode(x)
    with torch.no_grad():
        logits = model(encoded_pixel_values=encoded).logits
        halved = model(encoded_pixel_values=0.5 * encoded).logits
    # up to the norm epsilons of the B-cos and LayerNorm layers
    assert (halved - 0.5 * logits).abs().max() < 1e-3 * logits.abs().max()
    ig, ixg = methods["IntGrad (4 steps)"].explain(x, target), methods["IxG"].explain(x, target)
    assert (ig - ixg).abs().max() < 1e-2 * ixg.abs().max()


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_last_layer_attention_is_the_mean_over_heads_and_queries_spread_over_patches(tiny_vits, vit_images, kind):
    model = tiny_vits[kind]
    x, target = vit_images
    with torch.no_grad():
        last = model(pixel_values=x, output_attentions=True).attentions[-1]
    per_token = last.mean(dim=1)
    per_token = (per_token / per_token.sum(dim=-1, keepdim=True)).mean(dim=1).reshape(3, 4, 4)
    expected = per_token.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2)
    torch.testing.assert_close(image_attribution_methods(model)["Attention (last layer)"].explain(x, target), expected)


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_gradcam_weights_each_token_feature_by_its_mean_gradient_over_tokens(tiny_vits, vit_images, kind):
    """GradCAM by hand on the last block's tokens (batch, N, D): relu(sum_d mean_n(dy/dA_nd) * A_nd)."""
    model = tiny_vits[kind]
    x, target = vit_images
    inputs, forward = attribution_input(model, x)
    captured = {}

    def keep(module, args, output):
        output[0].retain_grad()
        captured["tokens"] = output[0]

    handle = model.blocks[-1].register_forward_hook(keep)
    try:
        forward(inputs).gather(1, target[:, None]).sum().backward()
    finally:
        handle.remove()
    tokens = captured["tokens"]
    weights = tokens.grad.mean(dim=1, keepdim=True)
    cam = (weights * tokens).sum(dim=-1).clamp_min(0).detach().reshape(3, 4, 4)
    expected = cam.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2)
    torch.testing.assert_close(image_attribution_methods(model)["GradCAM (tokens)"].explain(x, target), expected)
    # the hook only reshapes: the model's output is unchanged while it is in place
    with torch.no_grad(), _token_grid_layer(model):
        inside = forward(inputs)
    with torch.no_grad():
        torch.testing.assert_close(inside, forward(inputs))


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_attention_gradcam_weights_each_heads_query_mean_attention_by_its_mean_gradient(tiny_vits, vit_images, kind):
    """Chefer et al.'s ViT GradCAM with the query-mean row for the [CLS] row: relu(mean_h mean(dy/dA_h) mean_q A_h)."""
    model = tiny_vits[kind]
    x, target = vit_images
    inputs, _ = attribution_input(model, x)
    keyword = "encoded_pixel_values" if kind == "bcos" else "pixel_values"
    out = model(**{keyword: inputs}, output_attentions=True)
    last = out.attentions[-1]  # (batch, heads, N, N)
    (grad,) = torch.autograd.grad(out.logits.gather(1, target[:, None]).sum(), last)
    per_head = [grad[:, h].mean(dim=(1, 2))[:, None] * last[:, h].mean(dim=1) for h in range(last.shape[1])]
    cam = torch.stack(per_head).mean(dim=0).clamp_min(0).detach().reshape(3, 4, 4)
    expected = cam.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2)
    method = image_attribution_methods(model)["GradCAM (attention)"]
    torch.testing.assert_close(method.explain(x, target), expected)
    # class-specific through the gradient only: another class reweights the heads, the attention stays
    other = (target + 1) % model.config.num_labels
    assert not torch.allclose(method.explain(x, other), expected)
    # an int target explains that class for every image, as Captum's methods accept it
    torch.testing.assert_close(method.explain(x, 2), method.explain(x, torch.full_like(target, 2)))


def test_arguments_are_checked_with_the_fix_named(tiny_vits):
    with pytest.raises(BcosTypeError, match="model: expected a BcosViT or ConventionalViT"):
        image_attribution_methods(torch.nn.Linear(2, 2))
    with pytest.raises(BcosTypeError, match="model: expected a BcosViT or ConventionalViT"):
        attribution_input(torch.nn.Linear(2, 2), torch.zeros(1, 1, 16, 16))
    with pytest.raises(BcosValueError, match="ig_steps"):
        image_attribution_methods(tiny_vits["bcos"], ig_steps=0)
    with pytest.raises(BcosTypeError, match="ig_steps"):
        image_attribution_methods(tiny_vits["bcos"], ig_steps=2.0)
