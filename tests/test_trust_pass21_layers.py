"""Trust pass 21 (layers and vision): the B-cos layers under autocast, float64, torch.compile, train / eval and
explanation mode, and the vision models; each test failed before its fix."""

import copy

import torch

from bcos_plugins.nn import BcosConv2d, explanation_mode

# ---------------------------------------------------------------- 1. BcosConv2d's patch norm under autocast


def test_a_conv_layers_patch_norm_is_float32_under_float16_and_bfloat16_autocast():
    """autocast cast the patch norm's convolution of squares to the autocast dtype: under float16 a float32 input whose
    patch norm passed 256 made every output of the layer exactly 0 (the squares overflowed), and patches below 1e-4
    underflowed (2 % off); the linear layer's norm was float32 all along."""
    torch.manual_seed(0)
    layer = BcosConv2d(3, 4, 3, padding=1, b=2.0).eval()
    reference = copy.deepcopy(layer).double()
    for scale in (1e3, 1e-4, 1.0):
        x = torch.randn(2, 3, 5, 5) * scale
        expected = reference(x.double())
        for dtype, tolerance in ((torch.float16, 3e-3), (torch.bfloat16, 2e-2)):
            with torch.autocast("cpu", dtype=dtype):
                with torch.no_grad():
                    out = layer(x)
                assert out.dtype == dtype
                assert torch.allclose(out.double(), expected, rtol=0, atol=tolerance * expected.abs().max().item()), scale
                assert torch.allclose(layer.patch_norm(x).double(), reference.patch_norm(x.double()), rtol=1e-6)
                # explained under autocast: complete to the dtype's rounding
                encoded = x.clone().requires_grad_()
                with explanation_mode(layer):
                    y = layer(encoded)[:, 1].sum()
                (grad,) = torch.autograd.grad(y, encoded)
                assert abs((grad * encoded).sum().item() - y.item()) <= tolerance * expected.abs().sum().item()


# ---------------------------------------------------------------- 2. attention_rollout's dtype and refusals


def test_attention_rollout_of_half_precision_attention_is_computed_in_float32():
    """The rollout of bfloat16 attention was computed in bfloat16: six layers' mixing matrices multiplied in it put the
    map 0.3 % off the rollout of the same attention values and tied tokens that it tells apart."""
    from bcos_plugins.vision import attention_rollout

    torch.manual_seed(0)
    attention = [torch.softmax(torch.randn(2, 3, 16, 16) * 2, -1) for _ in range(6)]
    for dtype in (torch.bfloat16, torch.float16):
        given = [a.to(dtype) for a in attention]
        rolled = attention_rollout(given, 1)
        exact = attention_rollout([a.double() for a in given], 1)
        assert rolled.dtype == torch.float32
        torch.testing.assert_close(rolled.double(), exact, rtol=1e-5, atol=1e-8)
    # layers of two dtypes: the wider one (a bare "expected scalar type Float but found Double" before)
    mixed = attention_rollout([attention[0], attention[1].double()], 1)
    assert mixed.dtype == torch.float64
    torch.testing.assert_close(mixed, attention_rollout([attention[0].double(), attention[1].double()], 1))


def test_attention_rollout_refuses_empty_and_negative_attention_naming_the_problem():
    """An empty batch was refused as "layer 0 has shape (0, 2, 4, 4); every layer must be like layer 0 (0, 2, 4, 4)";
    negative "attention" (scores, differences) gave a map of zeros, silently."""
    import pytest

    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision import attention_rollout

    with pytest.raises(BcosValueError, match="layer 0 is empty"):
        attention_rollout([torch.rand(0, 2, 4, 4)], 1)
    with pytest.raises(BcosValueError, match="negative values"):
        attention_rollout([torch.softmax(torch.randn(1, 1, 4, 4), -1), -torch.ones(1, 1, 4, 4) / 4], 1)


# ---------------------------------------------------------------- 3. the vision models' inputs and the digit data


def test_encode_image_refuses_an_unbatched_image_it_encoded_along_its_rows():
    """encode_image of a (C, H, W) image concatenated [x, 1 - x] along H, silently: (1, 4, 4) became (1, 8, 4)."""
    import pytest

    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision import encode_image

    with pytest.raises(BcosValueError, match=r"pixel_values\[None\]"):
        encode_image(torch.rand(1, 4, 4))
    with pytest.raises(BcosValueError, match="batch, C, H, W"):
        encode_image(torch.rand(2, 4))
    assert encode_image(torch.rand(2, 3, 4, 4)).shape == (2, 6, 4, 4)


def test_vit_inputs_of_another_dtype_than_the_model_are_named(tiny_vits):
    """A float64 encoded_pixel_values into a float32 BcosViT, and float64 images into a ConventionalViT (or float32
    images into a bfloat16 one), failed deep inside torch ("expected scalar type Double but found Float")."""
    import pytest

    from bcos_plugins.errors import BcosTypeError

    images = torch.rand(2, 1, 16, 16)
    bcos, conventional = tiny_vits["bcos"], tiny_vits["conventional"]
    with pytest.raises(BcosTypeError, match=r"encoded_pixel_values: are torch.float64 .* encoded_pixel_values.to"):
        bcos(encoded_pixel_values=bcos.encode(images).double())
    with pytest.raises(BcosTypeError, match=r"pixel_values: are torch.float64 but the model's weights are torch.float32"):
        conventional(pixel_values=images.double())
    with pytest.raises(BcosTypeError, match="torch.bfloat16"):
        copy.deepcopy(conventional).bfloat16()(pixel_values=images)
    # under autocast the dtypes may differ, as for BcosViT
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert conventional(pixel_values=images).logits.shape == (2, 5)


def test_make_grids_refuses_confidences_it_could_not_rank_by():
    """(n, 1) confidences ranked nothing (each class's digits were taken in their given order) and NaN ones ranked
    arbitrarily, both silently; list labels failed inside the grouping; float64 digits became float32 grids."""
    import pytest

    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision.data import make_grids

    torch.manual_seed(0)
    digits, labels = torch.rand(8, 1, 4, 4), torch.arange(8) % 4
    confidence = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.9, 0.8, 0.7, 0.6])
    with pytest.raises(BcosValueError, match=r"confidence: must have 1 dimension"):
        make_grids(digits, labels, confidence[:, None], 1)
    with pytest.raises(BcosValueError, match="confidence: contains NaN"):
        make_grids(digits, labels, torch.full((8,), float("nan")), 1)
    grids, cells = make_grids(digits.double(), labels.tolist(), confidence, 1)
    assert grids.dtype == torch.float64
    # the most confident digit of each class (the second four) fills its cell
    for cell, c in enumerate(cells[0].tolist()):
        r, col = divmod(cell, 2)
        assert torch.equal(grids[0, :, r * 4:(r + 1) * 4, col * 4:(col + 1) * 4], digits[4 + c].double())


def test_digit_datasets_refuse_labels_and_flags_of_the_wrong_kind():
    """DigitImages served float labels as floats and failed inside repeat on lists and (n, 1) labels; place_digits read
    a float scale_up of 0.4 as True (the digit scaled up, silently); load_digits_split let scikit-learn refuse a float
    seed and a fraction that leaves a class out, naming its own arguments."""
    import pytest

    from bcos_plugins.errors import BcosTypeError, BcosValueError
    from bcos_plugins.vision.data import DigitImages, load_digits_split, place_digits

    digits = torch.rand(3, 1, 8, 8)
    with pytest.raises(BcosTypeError, match="labels: must be an integer tensor"):
        DigitImages(digits, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(BcosValueError, match="labels: must have 1 dimension"):
        DigitImages(digits, torch.tensor([[1], [2], [3]]))
    assert DigitImages(digits, [1, 2, 3], views=1)[2]["labels"].item() == 3
    with pytest.raises(BcosTypeError, match="scale_up: must be a boolean tensor"):
        place_digits(digits[:2], 16, torch.tensor([0.4, 0.6]), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(BcosTypeError, match="seed"):
        load_digits_split(0.25, seed=1.5)
    with pytest.raises(BcosValueError, match="test_fraction: 0.999 leaves"):
        load_digits_split(0.999)


# ---------------------------------------------------------------- 4. constant_outputs and detach_units


def test_a_stepped_slice_of_constant_outputs_holds_only_its_own_units_constant():
    """detach_units read slice(0, n, 2) as 0:n and detached every unit: B = 1 layers, the reference path and compiled
    explanations held all units constant where the fused explaining product held every other one, silently."""
    from bcos_plugins.nn import BcosLinear, reference_path
    from bcos_plugins.nn.functional import detach_units

    t = torch.randn(3, 6, requires_grad=True)
    (grad,) = torch.autograd.grad(detach_units(t, slice(0, 6, 2)).sum(), t)
    assert grad[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    (grad,) = torch.autograd.grad(detach_units(t, slice(None, None, -3)).sum(), t)  # units 5 and 2
    assert grad[0].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]

    torch.manual_seed(0)
    x = torch.randn(4, 5, dtype=torch.float64)
    weights = torch.randn(4, 6, dtype=torch.float64)
    kept = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    for b in (1.0, 2.0):
        layer = BcosLinear(5, 6, b=b, constant_outputs=slice(0, 6, 2)).double()
        with torch.no_grad():
            lin = x @ layer.unit_weight().T
            dyn = (lin / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()).abs() ** (b - 1)  # (the norm carries 1e-6)
        # the explaining gradient: the constant dyn times the unit weights of the kept units only
        expected = (weights * dyn * kept) @ layer.unit_weight().detach()
        for reference in (False, True):
            with reference_path(reference), explanation_mode(layer):
                given = x.clone().requires_grad_()
                (grad,) = torch.autograd.grad((layer(given) * weights).sum(), given)
            torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)


def test_constant_outputs_that_are_no_slice_are_refused_naming_the_argument():
    """A list, an int or a float bound was accepted and failed at the first explaining forward pass with an
    AttributeError or TypeError from inside the layer."""
    import pytest

    from bcos_plugins.errors import BcosTypeError, BcosValueError
    from bcos_plugins.nn import BcosConv1D, BcosLinear

    for value in ([0, 1], 3, "q", slice(0, 2.5)):
        with pytest.raises(BcosTypeError, match="constant_outputs"):
            BcosLinear(4, 5, constant_outputs=value)
    with pytest.raises(BcosValueError, match="constant_outputs.*step cannot be zero"):
        BcosConv1D(4, 5, constant_outputs=slice(None, None, 0))
    assert BcosLinear(4, 5, constant_outputs=slice(-3, None)).constant_outputs == slice(-3, None)


def test_vit_images_that_autocast_would_not_cast_are_named_under_autocast(tiny_vits):
    """Under torch.autocast the dtype check was skipped whole: float64 images (NumPy's) failed inside the tokeniser
    ("expected scalar type Double but found BFloat16"), and float16 images under bfloat16 autocast inside autocast's
    own cast ("Unexpected floating ScalarType in at::autocast::prioritize")."""
    import pytest

    from bcos_plugins.errors import BcosTypeError

    images = torch.rand(2, 1, 16, 16)
    for model in tiny_vits.values():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for dtype in (torch.float64, torch.float16):
                with pytest.raises(BcosTypeError, match=f"pixel_values: are {dtype}"):
                    model(pixel_values=images.to(dtype))
            for dtype in (torch.float32, torch.bfloat16):  # what autocast casts or computes in
                assert model(pixel_values=images.to(dtype)).logits.dtype == torch.bfloat16


def test_bcos_vit_attention_names_tokens_of_the_wrong_shape():
    """BcosViTAttention given more tokens than its prior was built for, a wrong width or unbatched tokens failed inside
    torch ("The size of tensor a (5) must match the size of tensor b (4) at non-singleton dimension 3")."""
    import pytest

    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision import BcosViTAttention

    for prior in ("additive", "multiplicative", "none"):
        attention = BcosViTAttention(8, 2, 4, b=2.0, max_out=2, prior=prior)
        if prior != "none":
            with pytest.raises(BcosValueError, match="x: has 5 tokens, but the attention prior was built for 4"):
                attention(torch.randn(1, 5, 8))
        for shape in ((1, 4, 6), (4, 8)):
            with pytest.raises(BcosValueError, match=r"x: must be tokens of shape \(batch, tokens, 8\)"):
                attention(torch.randn(*shape))
        assert attention(torch.randn(2, 4, 8))[0].shape == (2, 4, 8)


def test_b_cos_layers_built_under_inference_mode_run_there_as_torchs_layers_do():
    """Building any B-cos layer under torch.inference_mode() (a BcosViT, a BcosConv2d) failed at once with torch's
    "Inference tensors do not track version counter" (its B buffer), where torch's own layers are built there and run
    inference."""
    from bcos_plugins.nn import BcosLinear
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    config = BcosViTConfig(image_size=8, num_channels=1, patch_size=4, hidden_size=8, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=16, conv_channels=[4], num_labels=3)
    images = torch.rand(2, 1, 8, 8)
    torch.manual_seed(0)
    normal = BcosViT(config).eval()
    with torch.inference_mode():
        torch.manual_seed(0)
        built_there = BcosViT(config).eval()
        assert torch.equal(built_there(pixel_values=images).logits, normal(pixel_values=images).logits)
        layer = BcosLinear(4, 3, b=1.5)
        assert layer(torch.randn(2, 4)).shape == (2, 3)
    assert layer.b == 1.5 and not layer.bcos_b.is_inference()
    layer.b = 2.0
    assert layer.bcos_b.item() == 2.0
