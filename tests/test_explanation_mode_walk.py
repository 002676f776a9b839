"""``explanation_mode(model)`` finds the model's dynamic-weight modules afresh at every call.

It walks the ``_modules`` dicts itself (cheaper than ``model.modules()``) and keeps nothing between calls, so a model
whose modules change between two explanations (a submodule replaced, a layer added or removed, including through
``ModuleList.insert`` and ``del``, which bypass ``Module.__setattr__``) is explained exactly, and a module taken out
of the model is left alone.
"""

from __future__ import annotations

import torch
from torch import nn

from bcos_plugins.nn import BcosLinear, DynamicWeightModule, explanation_mode
from bcos_plugins.nn.dynamic import _dynamic_modules_and_training


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = BcosLinear(6, 6, b=2.0)
        self.layers = nn.ModuleList([BcosLinear(6, 6, b=2.0), BcosLinear(6, 6, b=2.0)])
        self.head = BcosLinear(6, 2, b=2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _input_gradient(model: nn.Module, x: torch.Tensor, mode) -> torch.Tensor:
    """d logit / d x inside ``mode`` (a context manager factory taking the model)."""
    x = x.clone().requires_grad_()
    with mode(model):
        (grad,) = torch.autograd.grad(model(x)[0, 1], x)
    return grad


def _model_form(model):
    return explanation_mode(model)


def _thread_form(model):  # every dynamic-weight module running in this thread explains: no walk over the model
    return explanation_mode()


def _plain(model):
    return torch.enable_grad()


def _explaining_flags(model: nn.Module) -> list[bool]:
    return [m.explaining for m in model.modules() if isinstance(m, DynamicWeightModule)]


def test_a_model_whose_modules_change_between_calls_is_explained_exactly_each_time():
    torch.manual_seed(0)
    model = _Stack().double().eval()
    x = torch.randn(1, 6, dtype=torch.float64)
    # B-cos layers are homogeneous in x, so completeness holds with or without the mode; what the mode changes is the
    # gradient (W(x) held constant): the model form must give the thread form's gradient bit for bit
    assert torch.equal(_input_gradient(model, x, _model_form), _input_gradient(model, x, _thread_form))

    replaced = model.first
    model.first = BcosLinear(6, 6, b=2.0).double()  # replaced through __setattr__
    model.layers.insert(1, BcosLinear(6, 6, b=2.0).double())  # inserted into _modules directly
    model.layers.append(BcosLinear(6, 6, b=2.0).double())
    del model.layers[0]  # deleted from _modules directly
    model.head = nn.Sequential(BcosLinear(6, 6, b=2.0), BcosLinear(6, 2, b=2.0)).double()  # a new subtree
    with explanation_mode(model):
        assert all(_explaining_flags(model)) and len(_explaining_flags(model)) == 6
        assert not replaced.explaining  # no longer part of the model: left alone
    assert not any(_explaining_flags(model))
    explained = _input_gradient(model, x, _model_form)
    assert torch.equal(explained, _input_gradient(model, x, _thread_form))
    assert not torch.allclose(explained, _input_gradient(model, x, _plain))  # the mode changed the new modules


def test_the_walk_finds_what_model_modules_finds_each_once_and_the_training_flag():
    shared = BcosLinear(4, 4)
    model = nn.Sequential(shared, nn.Sequential(shared, nn.ReLU()), BcosLinear(4, 4))
    model.register_module("absent", None)
    model.eval()
    dynamic, training = _dynamic_modules_and_training(model)
    expected = [m for m in model.modules() if isinstance(m, DynamicWeightModule)]
    assert len(dynamic) == len(expected) == 2 and set(dynamic) == set(expected)
    assert not training
    model[1][1].train()  # one module deep down in training mode: the model is put in eval for the block
    assert _dynamic_modules_and_training(model)[1]
    with explanation_mode(model):
        assert not model[1][1].training
    assert not model.training  # the model's own flag restored (train(False): a mixed state is not kept)


def test_nested_use_restores_each_modules_previous_state():
    model = _Stack().eval()
    with explanation_mode(model.layers):
        with explanation_mode(model):
            assert all(_explaining_flags(model))
        assert _explaining_flags(model) == [False, True, True, False]
    assert not any(_explaining_flags(model))
