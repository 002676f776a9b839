"""The Python around an explaining B-cos linear layer and around ``explanation_mode`` (issue 28's CPU goal): less
work per call, the same values, and a changed model still seen."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import bcos_plugins.nn.dynamic as dynamic
from bcos_plugins.nn import BcosConv1D, BcosLinear, explanation_mode
from bcos_plugins.nn.dynamic import dynamic_weights_used, no_parameter_gradients
from bcos_plugins.nn.functional import explaining_linear


class _CountedWeightReads(BcosLinear):
    """A BcosLinear that counts the reads of ``weight`` that miss the instance (nn.Module.__getattr__)."""

    weight_reads = 0

    def __getattr__(self, name):
        if name == "weight":
            type(self).weight_reads += 1
        return super().__getattr__(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("constant", [None, slice(0, 3)])
def test_the_explaining_branch_asks_once_whether_it_explains_and_reads_the_weight_from_parameters(
        monkeypatch, dtype, constant):
    # every explain call's projections take this branch: it asked `explaining` and then holds_constant (two
    # thread-local tests), and read the weight through nn.Module.__getattr__ (1.6 us a layer alone); now one test,
    # which also counts the dynamic weight, and _parameters; the output is explaining_linear's, bit for bit
    torch.manual_seed(0)
    layer = _CountedWeightReads(6, 5, b=1.25, constant_outputs=constant).to(dtype)
    x = torch.randn(2, 3, 6, dtype=dtype, requires_grad=True)
    asked = []
    original = dynamic._explaining_here
    monkeypatch.setattr(dynamic, "_explaining_here", lambda module: asked.append(module) or original(module))
    _CountedWeightReads.weight_reads = 0
    with explanation_mode(layer), no_parameter_gradients():
        used = dynamic_weights_used()
        out = layer(x)
        assert dynamic_weights_used() == used + 1  # (still counted once)
        reads, questions = _CountedWeightReads.weight_reads, len(asked)
        expected = explaining_linear(x, layer._parameters["weight"], 1.25, constant_units=constant)
    assert questions == 1
    assert reads == 0
    assert torch.equal(out, expected)
    (grad,) = torch.autograd.grad(out.sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    assert torch.equal(grad, expected_grad)


class _Doubled(nn.Module):
    def forward(self, weight):
        return 2 * weight


@pytest.mark.parametrize("kind", [BcosLinear, BcosConv1D])
def test_the_explaining_branch_reads_a_parametrized_weight_as_an_attribute(kind):
    # a parametrization moves the weight out of _parameters: the branch reads the attribute (the doubled weight),
    # which explains what the model computes
    torch.manual_seed(0)
    layer = kind(6, 5, b=1.5).double()
    parametrize.register_parametrization(layer, "weight", _Doubled())
    assert "weight" not in layer._parameters
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    with explanation_mode(layer), no_parameter_gradients():
        out = layer(x)
        expected = explaining_linear(x, layer.weight, 1.5, units_are_columns=kind is BcosConv1D)
    assert torch.equal(out, expected)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.allclose((grad * x).sum(), out.sum(), rtol=1e-12, atol=1e-12)  # complete: the mode applied


def test_explanation_mode_walks_the_modules_in_one_loop(monkeypatch):
    # the dynamic modules and the training flags come from one loop over the _modules dicts, not from _each_module's
    # generator and two passes over its list (18 against 23 us entering and leaving a 2-layer ModernBERT's mode)
    def refuse(model):
        raise AssertionError("explanation_mode walked the model through _each_module")

    monkeypatch.setattr(dynamic, "_each_module", refuse)
    shared = BcosLinear(4, 4)
    model = nn.Sequential(shared, nn.Sequential(BcosLinear(4, 4), shared, nn.Dropout(0.1)), nn.ReLU())
    model.train()
    model[1].eval()
    flags = [(m, m.training) for m in model.modules()]
    with explanation_mode(model):
        assert [m.explaining for m in model.modules() if isinstance(m, BcosLinear)] == [True, True]
        assert not any(m.training for m in model.modules())
    assert [(m, m.training) for m in model.modules()] == flags  # each module's own flag restored
    modules, training = dynamic._dynamic_modules_and_training(model)
    assert modules == [m for m in model.modules() if isinstance(m, dynamic.DynamicWeightModule)]
    assert training[0] == (model, True)  # the model's flag first (the restore sets it with model.train)
    assert len(training) == len(flags) and dict(training) == dict(flags)  # each module once, with its flag


@pytest.mark.parametrize("change", ["setattr", "insert", "modules dict"])
def test_a_module_added_after_a_call_is_switched_at_the_next(change):
    # the walk runs at every call (no cache): a B-cos layer added or replaced between two calls, also through a path
    # that fires no registration hook (ModuleList.insert and a direct _modules write), is in explanation mode at the
    # next call, and the one replaced is not
    layers = nn.ModuleList([BcosLinear(4, 4), BcosLinear(4, 4)])
    model = nn.Sequential(layers)
    with explanation_mode(model):
        assert all(layer.explaining for layer in layers)
    added = BcosLinear(4, 4)
    replaced = layers[1]
    if change == "setattr":
        layers[1] = added
    elif change == "insert":
        layers.insert(1, added)
        del layers[2]
    else:
        layers._modules["1"] = added
    with explanation_mode(model):
        assert added.explaining
        assert not replaced.explaining
        assert layers[0].explaining
    assert not added.explaining
