"""Trust pass 23, the layers researchers build their own B-cos models from (``bcos_plugins.nn``: the B-cos linear /
convolution / MaxOut layers, the norms, explanation mode, the functional API), used directly, not through bcosify:
unusual inputs aimed where earlier passes did not look (second derivatives, ``torch.func`` transforms, magnitudes near
the dtype's range), each checked against an independent computation (the reference path's step-by-step maths,
autograd's own Jacobian, the layer at a scaled input). The cases that were silently wrong or crashed unhelpfully, one
test each (the tally is in the CHANGELOG and the session's report).

- A second derivative (``create_graph=True``, then a backward through the gradient: a gradient penalty) through a
  training ``BcosConv2d`` or a MaxOut ``BcosLinear`` (B != 1) failed in the second backward pass inside torch with
  "one of the variables needed for gradient computation has been modified by an inplace operation": their product
  node writes the gradient in place. It is refused where the first backward pass is recorded, naming
  ``reference_path()``, as the fused linear node's already was (one helper for both).
- ``torch.func`` transforms of a training call (``jacrev(layer)``, ``vmap(layer)`` with grad mode on, per-sample
  gradients ``vmap(grad(loss))``) of a ``BcosLinear`` / ``BcosConv1D`` (any B), a MaxOut layer or a ``BcosConv2d`` (B
  != 1) failed with torch's "In order to use an autograd.Function with functorch transforms ... it must override the
  setup_context staticmethod": the training nodes leave ``setup_context`` out for its per-call cost. Under a
  transform they take the step-by-step maths instead (the reference path's), checked against autograd's own Jacobian
  and per-sample loops.
- ``explanation_mode("model")``, ``is_explaining(3)`` and ``has_dynamic_weights(3)`` failed with "'str' object has no
  attribute 'training'" (``'modules'``, ``'_modules'``); they name the argument and what to pass.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from bcos_plugins.errors import BcosRuntimeError, BcosTypeError
from bcos_plugins.nn import (
    BcosConv1D,
    BcosConv2d,
    BcosLayerNorm,
    BcosLinear,
    DetachableActivation,
    explanation_mode,
    has_dynamic_weights,
    is_explaining,
    reference_path,
)
from bcos_plugins.nn.dynamic import no_parameter_gradients


def _conv():
    return BcosConv2d(2, 3, 3, b=1.5).double(), torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)


def _max_out():
    return BcosLinear(8, 4, b=2.0, max_out=2).double(), torch.randn(2, 8, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("make", [_conv, _max_out], ids=["conv", "max_out"])
def test_a_second_derivative_through_a_training_product_node_is_refused_naming_the_reference_path(make):
    torch.manual_seed(0)
    layer, x = make()

    def penalty():
        (grad,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
        return grad.square().sum()

    with pytest.raises(BcosRuntimeError, match=r"^create_graph: .* inside bcos_plugins.nn.reference_path\(\)"):
        penalty().backward()
    with reference_path():  # the path the message names gives it, checked against finite differences
        assert torch.autograd.gradgradcheck(layer, (x,))
        penalty().backward()
    assert torch.isfinite(layer.weight.grad).all()


@pytest.mark.parametrize("b", [1.0, 1.5, 2.5])
@pytest.mark.parametrize("kind", ["linear", "conv1d", "max_out", "conv"])
def test_torch_func_transforms_of_a_training_layer_match_autograd(kind, b):
    torch.manual_seed(0)
    layer, x = {"linear": (BcosLinear(8, 4, b=b), torch.randn(3, 8)), "conv1d": (BcosConv1D(8, 4, b=b), torch.randn(3, 8)),
                "max_out": (BcosLinear(8, 4, b=b, max_out=2), torch.randn(3, 8)),
                "conv": (BcosConv2d(2, 3, 3, b=b), torch.randn(3, 2, 4, 4))}[kind]
    layer, x = layer.double(), x.double()
    jacobian = torch.func.jacrev(layer)(x)
    torch.testing.assert_close(jacobian, torch.autograd.functional.jacobian(layer, x), rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.func.vmap(layer)(x[:, None])[:, 0], layer(x))

    def loss(params, row):
        return torch.func.functional_call(layer, params, (row[None],)).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(dict(layer.named_parameters()), x)
    loop = torch.stack([torch.autograd.grad(layer(x[i:i + 1]).square().sum(), layer.weight)[0] for i in range(3)])
    torch.testing.assert_close(per_sample["weight"], loop, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call, name", [(lambda v: explanation_mode(v).__enter__(), "model"),
                                        (is_explaining, "module"), (has_dynamic_weights, "model")],
                         ids=["explanation_mode", "is_explaining", "has_dynamic_weights"])
def test_the_mode_functions_name_a_model_that_is_no_module(call, name):
    for value in ("model", 3, torch.zeros(2)):
        with pytest.raises(BcosTypeError, match=rf"^{name}: must be a torch.nn.Module, got {type(value).__name__}\."):
            call(value)
    layer = BcosLinear(4, 2)
    with explanation_mode(layer):  # a module still works, and the thread-wide form takes none
        assert is_explaining(layer) and has_dynamic_weights(layer)
    with explanation_mode():
        assert is_explaining(layer)
    assert not is_explaining(layer)


@pytest.mark.parametrize("parameter_gradients", [True, False], ids=["own_mode", "as_explain_runs"])
@pytest.mark.parametrize("kind", ["linear", "query_key", "stepped_query_key", "layer_norm", "gelu", "conv"])
def test_torch_func_explanations_match_autograd_in_explanation_mode(kind, parameter_gradients):
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    layer = {"linear": BcosLinear(8, 6, b=1.5), "query_key": BcosLinear(8, 6, b=1.5, constant_outputs=slice(0, 4)),
             "stepped_query_key": BcosLinear(8, 6, b=1.5, constant_outputs=slice(0, 4, 2)),
             "layer_norm": BcosLayerNorm(8), "gelu": DetachableActivation("gelu"), "conv": BcosConv2d(2, 3, 2, b=1.5)}[kind]
    if kind == "conv":
        x = torch.randn(3, 2, 2, 2)  # one output unit per image and channel
    with torch.no_grad():
        if kind == "layer_norm":
            layer.weight.uniform_(0.5, 1.5)

    def last(row):
        return layer(row[None] if kind == "conv" else row).flatten()[-1]

    with explanation_mode(layer), (nullcontext() if parameter_gradients else no_parameter_gradients()):
        per_row = torch.func.vmap(torch.func.grad(last))(x)
        jacobian = torch.func.jacrev(lambda row: layer(row[None] if kind == "conv" else row).flatten())(x[0])
    rows = x.clone().requires_grad_()
    with explanation_mode(layer):
        out = layer(rows).flatten(1)
        (expected,) = torch.autograd.grad(out[:, -1].sum(), rows)
        (expected_jacobian,) = [torch.autograd.functional.jacobian(lambda row: layer(row[None] if kind == "conv" else
                                                                                   row).flatten(), x[0])]
    torch.testing.assert_close(per_row, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close((per_row * x).flatten(1).sum(-1), out[:, -1].detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(jacobian, expected_jacobian, rtol=1e-6, atol=1e-7)
    if kind.endswith("query_key"):  # the constant units have no gradient, as detached
        constant = layer.constant_outputs
        assert not jacobian[constant].any() and jacobian[4:].any()


def test_an_explained_layer_norm_takes_an_unbatched_input_with_its_weight_gradient():
    torch.manual_seed(0)
    layer = BcosLayerNorm(8)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
    x = torch.randn(8, requires_grad=True)
    grads = []
    for reference in (False, True):
        with reference_path(reference), explanation_mode(layer):
            out = layer(x)
            grads.append(torch.autograd.grad(out[3], [x, layer.weight]))
    for fused, step_by_step in zip(*grads, strict=True):
        torch.testing.assert_close(fused, step_by_step, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close((grads[0][0] * x).sum(), out[3].detach(), rtol=1e-5, atol=1e-6)
