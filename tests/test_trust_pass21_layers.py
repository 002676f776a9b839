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
