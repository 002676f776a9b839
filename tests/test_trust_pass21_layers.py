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
