"""The speed paths of ModernBERT's explanation (issues 28 and 30) against the paths they shortcut: values and
gradients the same bits where the same kernels run in the same order, the reference path within rounding."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins.nn import BcosLayerNorm, explanation_mode
from bcos_plugins.nn.dynamic import no_parameter_gradients
from bcos_plugins.nn.functional import reference_path


def _layer_norm(dtype: torch.dtype, affine: bool = True) -> BcosLayerNorm:
    torch.manual_seed(0)
    norm = BcosLayerNorm(16, elementwise_affine=affine).to(dtype)
    if affine:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_explaining_layer_norm_input_gradient_only_path_equals_the_general_backward_and_the_reference(dtype, affine):
    # explain's layer norm (no gain gradient) saves only gamma and rsqrt(var + eps) and runs the input gradient
    # alone; with the gain's gradient taken the general backward runs: the input gradients are the same bits
    norm = _layer_norm(dtype, affine)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    upstream = torch.randn(3, 5, 16, dtype=dtype)
    with explanation_mode(norm), no_parameter_gradients():
        out = norm(x)
        (fast,) = torch.autograd.grad(out, x, upstream)
    with explanation_mode(norm):
        general_out = norm(x)
        inputs = [x, norm.weight] if affine else [x]
        general = torch.autograd.grad(general_out, inputs, upstream)
    assert torch.equal(out, general_out) and torch.equal(fast, general[0])
    with explanation_mode(norm), reference_path():
        (reference,) = torch.autograd.grad(norm(x), x, upstream)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(fast, reference, **tolerance)


def test_explaining_layer_norm_input_gradient_only_path_is_differentiable_again_with_the_scale_constant():
    # a loss on an explanation differentiates the backward: rsqrt(var + eps) stays a constant there too
    norm = _layer_norm(torch.float64)
    x0 = torch.randn(3, 16, dtype=torch.float64)
    readout = torch.linspace(-1, 2, 16, dtype=torch.float64)

    def second(reference: bool):
        x = x0.clone().requires_grad_()
        with explanation_mode(norm), no_parameter_gradients(), reference_path(reference):
            (grad,) = torch.autograd.grad((norm(x) * readout).sum(), x, create_graph=True)
            return torch.autograd.grad((x * grad).square().sum(), x)[0]

    torch.testing.assert_close(second(False), second(True), rtol=1e-12, atol=1e-13)
