"""B-cos ViT: exact per-pixel contributions for every tokeniser and attention prior, batching,
explanation mode, B-cos convolution, save / load, and clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bcos_plugins.errors import BcosError, BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosLinear, explanation_mode
from bcos_plugins.vision import BcosConv2d, BcosViT, BcosViTConfig, encode_image, explain_image

PRIORS = ["none", "additive", "multiplicative"]
TOKENIZERS = ["linear", "conv"]


def tiny_vit(tokenizer="conv", prior="additive", position_embedding=False, seed=0, **overrides) -> BcosViT:
    """8x8 single-channel images, 2x2 tokens, width 8: milliseconds per call.

    Priors and position embedding get random values (they start at 0), so they change the attention.
    """
    torch.manual_seed(seed)
    settings = dict(image_size=8, num_channels=1, patch_size=4, hidden_size=8, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=16, num_labels=3, tokenizer=tokenizer,
                    conv_channels=[4], attention_prior=prior, position_embedding=position_embedding, b=2.0,
                    logit_scale=5.0)
    settings.update(overrides)
    model = BcosViT(BcosViTConfig(**settings)).double().eval()
    with torch.no_grad():
        for block in model.blocks:
            if block.attention.prior is not None:
                block.attention.prior.normal_(0, 2.0)
        if model.position_embedding is not None:
            model.position_embedding.normal_(0, 1.0)
    return model


def images(batch=3, size=8, channels=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, channels, size, size, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("prior", PRIORS)
def test_pixel_contributions_sum_to_the_logit(tokenizer, prior):
    model = tiny_vit(tokenizer, prior)
    x = images(batch=4)
    logits = model(pixel_values=x).logits
    for target in (None, 2):
        exp = explain_image(model, x, target=target)
        expected_target = logits.argmax(-1) if target is None else torch.full((4,), 2)
        assert torch.equal(exp.target, expected_target)
        torch.testing.assert_close(exp.logits, logits.gather(1, expected_target[:, None]).squeeze(1))
        torch.testing.assert_close(exp.total, exp.logits, rtol=1e-10, atol=1e-12)
        assert exp.completeness_error.max() < 1e-9
        assert torch.equal(exp.position_contributions, torch.zeros(4, dtype=torch.float64))
        # per-pixel map = channel sum of W(x~) * x~, and x~ is the [x, 1 - x] encoding
        torch.testing.assert_close(exp.encoded, torch.cat([x, 1 - x], dim=1))
        torch.testing.assert_close(exp.input_contributions, exp.weights * exp.encoded)
        torch.testing.assert_close(exp.contributions, exp.input_contributions.sum(1))
        assert exp.contributions.shape == (4, 8, 8)


@pytest.mark.parametrize("prior", PRIORS)
def test_contrastive_explanation_sums_to_the_logit_difference(prior):
    model = tiny_vit("conv", prior)
    x = images(batch=3)
    logits = model(pixel_values=x).logits
    exp = explain_image(model, x, target=torch.tensor([0, 1, 2]), foil=torch.tensor([1, 2, 0]))
    diff = logits[torch.arange(3), [0, 1, 2]] - logits[torch.arange(3), [1, 2, 0]]
    torch.testing.assert_close(exp.logits, diff)
    torch.testing.assert_close(exp.total, diff, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_position_embedding_baseline_breaks_pixel_completeness_and_its_share_is_reported(tokenizer):
    model = tiny_vit(tokenizer, "none", position_embedding=True)
    x = images(batch=3)
    exp = explain_image(model, x)
    # the constant embedding takes a share that no pixel accounts for ...
    assert exp.completeness_error.min() > 1e-3
    assert exp.position_contributions.abs().min() > 1e-6
    # ... and pixels + that share are the logit exactly
    torch.testing.assert_close(exp.total + exp.position_contributions, exp.logits, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("prior", PRIORS)
def test_batched_explanations_equal_one_image_at_a_time(prior):
    model = tiny_vit("conv", prior)
    x = images(batch=3)
    batched = explain_image(model, x, target=1)
    for i in range(3):
        single = explain_image(model, x[i:i + 1], target=1)
        torch.testing.assert_close(single.contributions[0], batched.contributions[i], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(single.logits[0], batched.logits[i])


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("prior", PRIORS)
def test_forward_is_identical_in_and_out_of_explanation_mode(tokenizer, prior):
    model = tiny_vit(tokenizer, prior).train()
    x = images(batch=3)
    outside = model(pixel_values=x, output_attentions=True)
    with explanation_mode(model):
        assert not model.training
        inside = model(pixel_values=x, output_attentions=True)
    assert model.training  # restored
    assert torch.equal(outside.logits, inside.logits)
    for a, b in zip(outside.attentions, inside.attentions, strict=True):
        assert torch.equal(a, b)


def test_explanation_mode_changes_the_pixel_map_not_just_the_bookkeeping():
    """B-cos layers (|cos| is scale-free) and LayerNorm-inside-softmax make the ViT positively homogeneous
    of degree 1 in x~, so even plain input x gradient sums to the logit (up to the norm epsilons); but its
    pixel map differs from W(x~) x~, because gradients through the dynamic weights are spread over pixels."""
    model = tiny_vit("conv", "additive")
    x = images(batch=2)
    encoded = encode_image(x).requires_grad_(True)
    logit = model(encoded_pixel_values=encoded).logits[:, 0]
    (grad,) = torch.autograd.grad(logit.sum(), encoded)
    plain = (encoded * grad).sum(1).detach()
    exact = explain_image(model, x, target=0).contributions
    torch.testing.assert_close(plain.sum((1, 2)), exact.sum((1, 2)), rtol=1e-2, atol=1e-4)
    assert ((plain - exact).abs().amax((1, 2)) / exact.abs().amax((1, 2))).min() > 0.05


def test_attention_priors_are_learnable_per_head_and_layer_and_change_the_output():
    for prior in ("additive", "multiplicative"):
        model = tiny_vit("linear", prior)
        shapes = [tuple(block.attention.prior.shape) for block in model.blocks]
        assert shapes == [(2, 4, 4)] * 2  # (heads, tokens, tokens) in each layer
        x = images(batch=2)
        model(pixel_values=x, labels=torch.tensor([0, 1])).loss.backward()
        for block in model.blocks:
            grad = block.attention.prior.grad
            assert grad is not None and grad.abs().sum(dim=(1, 2)).min() > 0  # every head gets a gradient
        before = model(pixel_values=x).logits
        with torch.no_grad():
            model.blocks[0].attention.prior.add_(torch.randn(2, 4, 4, dtype=torch.float64))
        assert not torch.allclose(before, model(pixel_values=x).logits)


def test_zero_priors_reduce_to_plain_and_uniform_scaled_attention():
    plain = tiny_vit("linear", "none", seed=3)
    x = images(batch=2)
    a_plain = plain(pixel_values=x, output_attentions=True).attentions[0]
    for prior, expected in (("additive", a_plain), ("multiplicative", a_plain / 4)):
        model = tiny_vit("linear", prior, seed=3)
        with torch.no_grad():
            for block in model.blocks:
                block.attention.prior.zero_()
        torch.testing.assert_close(model(pixel_values=x, output_attentions=True).attentions[0], expected)


def test_attention_layer_norm_only_shapes_the_attention_matrix():
    """Scaling the input scales the logits (no normalisation on the value path), the pattern is unchanged."""
    model = tiny_vit("linear", "additive", b=1.0)  # b=1: every B-cos layer is linear, so y(2x~) = 2y(x~)
    encoded = encode_image(images(batch=2))
    out1 = model(encoded_pixel_values=encoded, output_attentions=True)
    out2 = model(encoded_pixel_values=2 * encoded, output_attentions=True)
    torch.testing.assert_close(out2.logits, 2 * out1.logits)
    torch.testing.assert_close(out2.attentions[1], out1.attentions[1], rtol=1e-3, atol=1e-3)


def test_bcos_conv2d_is_a_bcos_linear_layer_on_every_receptive_field():
    torch.manual_seed(0)
    conv = BcosConv2d(2, 3, kernel_size=3, stride=2, padding=1, b=1.7, max_out=2).double()
    linear = BcosLinear(2 * 9, 3, b=1.7, max_out=2).double()
    with torch.no_grad():
        linear.weight.copy_(conv.weight.flatten(1))
    x = torch.rand(2, 2, 7, 7, dtype=torch.float64)
    out = conv(x)
    patches = F.unfold(x, 3, padding=1, stride=2).transpose(1, 2)  # (batch, locations, 2*3*3)
    expected = linear(patches).transpose(1, 2).reshape(2, 3, 4, 4)
    torch.testing.assert_close(out, expected)
    # completeness of the layer itself, and a zero input gives 0, never NaN
    x.requires_grad_(True)
    with explanation_mode(conv):
        y = conv(x)[:, 1, 2, 3]
        (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close((x * g).sum((1, 2, 3)), y)
    zero = torch.zeros(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    conv(zero).sum().backward()
    assert torch.equal(conv(zero), torch.zeros(1, 3, 3, 3, dtype=torch.float64))
    assert torch.isfinite(zero.grad).all()


def test_save_and_load_round_trip(tmp_path):
    model = tiny_vit("conv", "multiplicative")
    x = images(batch=2)
    model.save_pretrained(tmp_path)
    loaded = BcosViT.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert loaded.config.attention_prior == "multiplicative" and loaded.config.tokenizer == "conv"
    assert torch.equal(loaded(pixel_values=x).logits, model(pixel_values=x).logits)


def test_wrong_inputs_give_clear_errors():
    model = tiny_vit("conv", "additive")
    with pytest.raises(ValueError, match=r"shape \(batch, 1, 8, 8\).*num_channels=1"):
        model(pixel_values=images(channels=3))
    with pytest.raises(ValueError, match=r"image_size=8; resize"):
        model(pixel_values=images(size=16))
    with pytest.raises(ValueError, match="add the batch dimension"):
        model(pixel_values=images()[0])
    with pytest.raises(ValueError, match="channels last"):
        model(pixel_values=images().permute(0, 2, 3, 1).repeat(1, 8, 1, 1)[:, :8])
    with pytest.raises(ValueError, match=r"\[0, 1\].*instead of standardising"):
        model(pixel_values=images() * 2 - 1)
    with pytest.raises(ValueError, match="float tensor"):
        model(pixel_values=(images() * 255).to(torch.uint8))
    with pytest.raises(ValueError, match="exactly one of pixel_values"):
        model(pixel_values=images(), encoded_pixel_values=encode_image(images()))
    with pytest.raises(ValueError, match=r"encoded_pixel_values: must have shape \(batch, 2, 8, 8\).*2 \* num_channels"):
        model(encoded_pixel_values=images())
    with pytest.raises(ValueError, match=r"target: ids must lie in \[0, 3\)"):
        explain_image(model, images(), target=3)
    with pytest.raises(ValueError, match=r"target: expected an int or one id per row, shape \(3,\)"):
        explain_image(model, images(), target=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="explains a BcosViT"):
        explain_image(torch.nn.Linear(2, 2), images())


def test_bad_configs_give_clear_errors():
    with pytest.raises(ValueError, match="multiple of patch_size"):
        BcosViTConfig(image_size=10, patch_size=4)
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):
        BcosViTConfig(hidden_size=10, num_attention_heads=4)
    with pytest.raises(ValueError, match="attention_prior='relative' is not one of"):
        BcosViTConfig(attention_prior="relative")
    with pytest.raises(ValueError, match="tokenizer='cnn' is not one of"):
        BcosViTConfig(tokenizer="cnn")
    with pytest.raises(ValueError, match="b=0.5 must be >= 1"):
        BcosViTConfig(b=0.5)


def test_attention_hook_points_see_the_pattern_and_values():
    model = tiny_vit("linear", "multiplicative")
    x = images(batch=2)
    seen = {}
    handles = [model.blocks[1].attention.hook_pattern.register_forward_hook(
                   lambda m, args, out: seen.__setitem__("pattern", out)),
               model.blocks[1].attention.hook_values.register_forward_hook(
                   lambda m, args, out: seen.__setitem__("values", out))]
    out = model(pixel_values=x, output_attentions=True)
    for h in handles:
        h.remove()
    assert torch.equal(seen["pattern"], out.attentions[1])
    assert seen["values"].shape == (2, 2, 4, 4)  # (batch, heads, tokens, head size)


# --- issue 15: unusual input gets a correct answer or a clear error -------------------------------------------

@pytest.mark.parametrize(("overrides", "match"), [
    ({"patch_size": 0}, "patch_size: must be >= 1"),
    ({"patch_size": -4}, "patch_size: must be >= 1"),
    ({"image_size": 10, "patch_size": 4}, "patch_size: image_size=10 must be a multiple of patch_size=4"),
    ({"num_channels": 0}, "num_channels: must be >= 1"),
    ({"hidden_size": 8.0}, "hidden_size: must be an int"),
    ({"b": float("inf")}, "b: must be finite"),
    ({"b": 1e6}, r"b: b=1000000.0 must be >= 1 and <= 10"),
    ({"logit_scale": 0.0}, "logit_scale: must be > 0"),
    ({"conv_channels": [4, 0]}, "conv_channels: must be >= 1"),
    ({"num_labels": 0}, "num_labels: must be >= 1"),
])
def test_bad_config_values_are_named(overrides, match):
    with pytest.raises(BcosError, match=match):
        BcosViTConfig(**overrides)


def test_bad_images_are_named_by_the_model_and_explain_image():
    model = tiny_vit()
    with pytest.raises(BcosValueError, match="pixel_values: is an empty batch"):
        model(pixel_values=images()[:0])
    with pytest.raises(BcosValueError, match=r"pixel_values: must have shape \(batch, 1, 8, 8\).*num_channels=1"):
        model(pixel_values=images(channels=3))
    nan = images()
    nan[1, 0, 2, 3] = float("nan")
    with pytest.raises(BcosValueError, match=r"pixel_values: contains NaN or inf in row \[1\]"):
        model(pixel_values=nan)
    with pytest.raises(BcosValueError, match=r"pixel_values: contains NaN or inf in row \[1\]"):
        explain_image(model, nan)
    with pytest.raises(BcosValueError, match=r"encoded_pixel_values: contains NaN"):
        model(encoded_pixel_values=encode_image(nan.nan_to_num(0.5)) * float("inf"))
    # values outside [0, 1] are refused, not clipped (documented on BcosViTConfig)
    with pytest.raises(BcosValueError, match=r"pixel_values: B-cos image inputs must lie in \[0, 1\]"):
        model(pixel_values=images() + 0.01)
    with pytest.raises(BcosValueError, match=r"labels: ids must lie in \[0, 3\), got \[3\] at row \[2\]\. "
                                             r"Pass ids in \[0, 3\) \(there are 3 classes\)"):
        model(pixel_values=images(), labels=torch.tensor([0, 1, 3]))
    with pytest.raises(BcosTypeError, match=r"labels: got a float \(torch\.float32\); ids must be integers"):
        model(pixel_values=images(), labels=torch.tensor([0.0, 1.0, 2.0]))
    # the edges of the valid range are explained exactly
    edges = torch.zeros(2, 1, 8, 8, dtype=torch.float64)
    edges[1] = 1.0
    e = explain_image(model, edges, target=1)
    assert torch.isfinite(e.contributions).all()
    torch.testing.assert_close(e.total, e.logits)
