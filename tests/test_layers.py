"""B-cos and detachable layers: maths, completeness, finiteness, error messages."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from transformers.pytorch_utils import Conv1D

from bcos_plugins.errors import BcosValueError
from bcos_plugins.nn import (
    BcosConv1D,
    BcosLayerNorm,
    BcosLinear,
    DetachableActivation,
    DetachableRMSNorm,
    explanation_mode,
)


def _x_dot_grad(module: nn.Module, x: torch.Tensor, out_index=(0, 0)) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_(True)
    with explanation_mode(module):
        y = module(x)[out_index]
        (g,) = torch.autograd.grad(y, x)
    return (x * g).sum(), y.detach()


def test_bcos_linear_matches_formula():
    torch.manual_seed(0)
    layer = BcosLinear(5, 3, b=2.5)
    x = torch.randn(4, 5)
    w_hat = layer.weight / layer.weight.norm(dim=1, keepdim=True)
    lin = x @ w_hat.T
    cos = lin / x.norm(dim=1, keepdim=True)
    torch.testing.assert_close(layer(x), cos.abs().pow(1.5) * lin)


def test_bcos_linear_b1_is_normalised_linear_and_b2_fast_path():
    torch.manual_seed(0)
    lin = nn.Linear(6, 4)
    x = torch.randn(3, 6)
    b1 = BcosLinear.from_linear(lin, b=1.0)
    torch.testing.assert_close(b1(x), x @ (lin.weight / lin.weight.norm(dim=1, keepdim=True)).T)
    b2 = BcosLinear.from_linear(lin, b=2.0)
    b2_general = BcosLinear.from_linear(lin, b=2.0 + 1e-9)
    torch.testing.assert_close(b2(x), b2_general(x), rtol=1e-6, atol=1e-7)


def test_maxout_takes_max_of_groups():
    torch.manual_seed(0)
    layer = BcosLinear(4, 2, b=1.0, max_out=3)
    x = torch.randn(5, 4)
    lin = x @ layer.unit_weight().T
    torch.testing.assert_close(layer(x), lin.view(5, 2, 3).amax(-1))


def test_conv1d_variant_equals_linear_on_transposed_weight():
    torch.manual_seed(0)
    conv = Conv1D(7, 5)  # nf=7 outputs, nx=5 inputs; weight (5, 7)
    nn.init.normal_(conv.weight)
    lin = nn.Linear(5, 7)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.T)
    x = torch.randn(2, 3, 5)
    torch.testing.assert_close(BcosConv1D.from_conv1d(conv, b=1.5)(x), BcosLinear.from_linear(lin, b=1.5)(x))
    assert BcosConv1D.from_conv1d(conv, b=1.5).weight.shape == conv.weight.shape


@settings(max_examples=40, deadline=None)
@given(
    d_in=st.integers(1, 12),
    d_out=st.integers(1, 8),
    max_out=st.integers(1, 3),
    b=st.floats(1.0, 3.0),
    seed=st.integers(0, 10_000),
)
def test_bcos_linear_completeness_hypothesis(d_in, d_out, max_out, b, seed):
    torch.manual_seed(seed)
    layer = BcosLinear(d_in, d_out, b=b, max_out=max_out).double()
    x = torch.randn(2, d_in, dtype=torch.float64)
    total, y = _x_dot_grad(layer, x)
    assert torch.isclose(total, y, rtol=1e-9, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(2, 16), seed=st.integers(0, 10_000), kind=st.sampled_from(["gelu", "gelu_tanh", "quick_gelu", "silu", "relu"]))
def test_norms_and_activations_completeness_hypothesis(d, seed, kind):
    torch.manual_seed(seed)
    ln = BcosLayerNorm(d).double()
    nn.init.normal_(ln.weight)
    rms = DetachableRMSNorm(d).double()
    act = DetachableActivation(kind)
    x = torch.randn(3, d, dtype=torch.float64)
    for module in (ln, rms, act, nn.Sequential(ln, act, rms)):
        total, y = _x_dot_grad(module, x, (1, d - 1))
        assert torch.isclose(total, y, rtol=1e-9, atol=1e-12), module


def test_activations_match_torch():
    x = torch.linspace(-4, 4, 101)
    torch.testing.assert_close(DetachableActivation("gelu")(x), nn.functional.gelu(x))
    torch.testing.assert_close(DetachableActivation("gelu_tanh")(x), nn.functional.gelu(x, approximate="tanh"))
    torch.testing.assert_close(DetachableActivation("silu")(x), nn.functional.silu(x))
    torch.testing.assert_close(DetachableActivation("relu")(x), nn.functional.relu(x))


def test_layer_norm_matches_torch_without_bias():
    torch.manual_seed(0)
    ref = nn.LayerNorm(8)
    nn.init.normal_(ref.weight)
    nn.init.normal_(ref.bias)
    ours = BcosLayerNorm.from_layer_norm(ref)
    x = torch.randn(4, 8)
    expected = nn.functional.layer_norm(x, (8,), ref.weight, None, ref.eps)
    torch.testing.assert_close(ours(x), expected)
    assert "bias" not in dict(ours.named_parameters())


def test_explanation_mode_keeps_forward_values_and_restores_state():
    torch.manual_seed(0)
    model = nn.Sequential(BcosLinear(6, 6, b=1.7), BcosLayerNorm(6), DetachableActivation("gelu"), BcosLinear(6, 2))
    model.train()
    x = torch.randn(5, 6)
    model.eval()
    before = model(x)
    model.train()
    with explanation_mode(model):
        assert not model.training
        assert all(m.explaining for m in model)
        inside = model(x)
    assert model.training and not any(m.explaining for m in model)
    assert torch.equal(before, inside)
    with pytest.raises(RuntimeError):
        with explanation_mode(model):
            raise RuntimeError("boom")
    assert not any(m.explaining for m in model)


def test_training_gradient_flows_through_both_factors():
    """Outside explanation mode the full gradient (through dyn too) is taken: it passes gradcheck, and it
    differs from the explanation-mode gradient, where dyn is a constant."""
    torch.manual_seed(0)
    layer = BcosLinear(4, 2, b=2.5).double()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: layer(t), (x,))
    (g_train,) = torch.autograd.grad(layer(x)[0, 0], x)
    with explanation_mode(layer):
        (g_explain,) = torch.autograd.grad(layer(x)[0, 0], x)
    assert not torch.allclose(g_train, g_explain)


@pytest.mark.parametrize("b", [1.0, 1.25, 1.5, 2.0, 2.5])
def test_zero_input_gives_finite_output_and_gradients(b):
    layer = BcosLinear(4, 3, b=b)
    seq = nn.Sequential(layer, BcosLayerNorm(3), DetachableRMSNorm(3))
    x = torch.zeros(2, 4, requires_grad=True)
    y = seq(x)
    assert torch.isfinite(y).all() and (y == 0).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in seq.parameters())
    with explanation_mode(seq):
        x2 = torch.zeros(2, 4, requires_grad=True)
        seq(x2).sum().backward()
        assert torch.isfinite(x2.grad).all()


@pytest.mark.parametrize("bad", [0.5, 0.0, -1.0, math.nan, math.inf, 1e6, 10.5])
def test_b_outside_range_rejected(bad):
    with pytest.raises(BcosValueError, match=r"^b: must be a finite number in \[1, 10\], got .*b must be >= 1 .*use 1\.25-1\.5"):
        BcosLinear(3, 3, b=bad)


def test_bad_maxout_and_gate_rejected():
    with pytest.raises(ValueError, match="max_out"):
        BcosLinear(3, 3, max_out=0)
    with pytest.raises(ValueError, match="unknown gate"):
        DetachableActivation("tanh")


@pytest.mark.parametrize("max_out", [1, 2])
def test_from_pretrained_layers_copy_weights_without_random_initialisation(monkeypatch, max_out):
    # bcosify on a billion-parameter model spent most of its time drawing random weights it then overwrote
    def refuse(tensor, *args, **kwargs):
        if not tensor.is_meta:  # a layer built on the meta device allocates nothing to initialise
            raise AssertionError("from_linear / from_conv1d must not initialise randomly")
        return tensor

    torch.manual_seed(0)
    lin, conv = nn.Linear(6, 4).half(), Conv1D(4, 6)
    monkeypatch.setattr(nn.init, "kaiming_uniform_", refuse)
    bcos_lin = BcosLinear.from_linear(lin, b=1.25, max_out=max_out)
    bcos_conv = BcosConv1D.from_conv1d(conv, b=1.5, max_out=max_out)
    assert torch.equal(bcos_lin.weight, lin.weight.repeat_interleave(max_out, dim=0))
    assert torch.equal(bcos_conv.weight, conv.weight.repeat_interleave(max_out, dim=1))
    assert bcos_lin.weight.dtype == torch.float16 and bcos_lin.weight.data_ptr() != lin.weight.data_ptr()
    assert bcos_lin.weight.requires_grad and bcos_conv.weight.requires_grad
    assert (bcos_lin.b, bcos_conv.b) == (1.25, 1.5)
    assert bcos_lin.bcos_b.dtype == torch.float64 and bcos_lin.bcos_b.item() == 1.25
