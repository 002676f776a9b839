"""Trust pass 21 leftovers (layers): items the trust-pass helpers noticed and left; each test failed before its fix."""

from __future__ import annotations

import re

import pytest
import torch
from bcos_plugins.adapters.captum import BcosAttribution, LayerBcos
from bcos_plugins.adapters.transformer_lens import token_component_decomposition, transformer_bridge_from_hf
from conftest import VOCAB, tiny_model
from torch import nn

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn import BcosLinear
from bcos_plugins.nn.functional import (
    bcos_linear,
    bcos_product,
    bcos_scale,
    explaining_linear,
    explaining_scale,
    inference_linear,
    input_norm,
    max_out,
    unit_norm,
)
from bcos_plugins.vision import BcosConvTokenizer, BcosPatchEmbedding, BcosViTConfig

# ---------------------------------------------------------------- 1. the tokenisers refuse images they do not tile


@pytest.mark.parametrize("make", [
    lambda: BcosPatchEmbedding(2, 4, 8, b=2.0, max_out=1),
    lambda: BcosConvTokenizer(2, 4, 8, channels=(3,), b=2.0, max_out=1),
], ids=["patch_embedding", "conv_tokenizer"])
def test_a_tokeniser_refuses_an_image_that_is_not_a_multiple_of_the_patch_size(make):
    """Used directly (BcosViT checks its image size), both tokenisers silently left out the last rows and columns of
    a 10x12 image with 4x4 patches: the 2 border rows got no token and no contribution, and the output had the shape
    of an 8x12 image's."""
    layer = make().eval()
    for height, width, size in ((10, 12, "image size 10x12 (height x width)"), (9, 9, "image_size=9")):
        with pytest.raises(BcosValueError, match=rf"encoded: {re.escape(size)} must be a multiple of patch_size=4 "
                           r".*crop or pad the image to a multiple of patch_size=4 \(e\.g\. 12x12"):
            layer(torch.rand(1, 2, height, width))
    # an image the patches tile is still served: 3 x 2 patches
    assert layer(torch.rand(1, 2, 12, 8)).shape == (1, 6, 8)


def test_the_config_refuses_an_image_size_with_the_same_check():
    with pytest.raises(BcosValueError, match="patch_size: image_size=10 must be a multiple of patch_size=4 "
                       r"\(the patches would leave out the last 2 rows and 2 columns\)"):
        BcosViTConfig(image_size=10, patch_size=4)


# ---------------------------------------------------------------- 2. the adapters' flags must be bools


def _bcos_classifier():
    torch.manual_seed(0)
    return nn.Sequential(BcosLinear(4, 6, b=2.0), BcosLinear(6, 3, b=2.0)).eval()


@pytest.mark.parametrize("make", [
    lambda model: BcosAttribution(model),
    lambda model: LayerBcos(model, model[1]),
], ids=["BcosAttribution", "LayerBcos"])
@pytest.mark.parametrize("flag", ["yes", "no", 1, None])
def test_captums_return_convergence_delta_must_be_a_bool(make, flag):
    """return_convergence_delta="no" was read as True: the caller got an (attributions, delta) tuple instead of the
    attributions (and a tuple where a tensor was expected downstream)."""
    model = _bcos_classifier()
    method = make(model)
    x = torch.rand(2, 4)
    with pytest.raises(BcosTypeError, match=rf"return_convergence_delta: must be True or False, got "
                       rf"{type(flag).__name__} {re.escape(repr(flag))}\. Pass return_convergence_delta=True or "
                       r"return_convergence_delta=False"):
        method.attribute(x, target=0, return_convergence_delta=flag)
    attributions, delta = method.attribute(x, target=0, return_convergence_delta=True)
    assert delta.abs().max().item() < 1e-5
    assert isinstance(method.attribute(x, target=0, return_convergence_delta=False), torch.Tensor)


@pytest.mark.parametrize("flag", ["no", 0, 1])
def test_layer_bcos_attribute_to_layer_input_must_be_a_bool(flag):
    """attribute_to_layer_input="no" (to LayerBcos or its attribute) was read as True: the attributions were to the
    layer's input when its output was asked for, silently."""
    model = _bcos_classifier()
    x = torch.rand(2, 4)
    pattern = rf"attribute_to_layer_input: must be True or False, got {type(flag).__name__} {re.escape(repr(flag))}"
    with pytest.raises(BcosTypeError, match=pattern):
        LayerBcos(model, model[1], attribute_to_layer_input=flag)
    with pytest.raises(BcosTypeError, match=pattern):
        LayerBcos(model, model[1]).attribute(x, target=0, attribute_to_layer_input=flag)
    to_output = LayerBcos(model, model[1]).attribute(x, target=0, attribute_to_layer_input=False)
    assert to_output.shape == (2, 3)


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_token_component_decomposition_batched_must_be_a_bool(flag):
    """batched="no" was read as True (the batched sweep ran when the caller asked for the reference loop)."""
    model = transformer_bridge_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False))
    tokens = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    with pytest.raises(BcosTypeError, match=rf"batched: must be True or False, got {type(flag).__name__} "
                       rf"{re.escape(repr(flag))}\. Pass batched=True or batched=False"):
        token_component_decomposition(model, tokens, batched=flag)


# ---------------------------------------------------------------- 3. the low-level functions check b and m


def _lin(x, w):
    """``x @ ŵ.T``, the product the layer scales (for the functions that take ``lin``)."""
    return torch.nn.functional.linear(x, unit_norm(w, 1))


_LINEAR_FUNCTIONS = {
    "inference_linear": lambda x, w, b: inference_linear(x, w, b),
    "bcos_linear": lambda x, w, b: bcos_linear(x, w, None, b, own_norm=True),
    "explaining_linear": lambda x, w, b: explaining_linear(x, w, b),
    "bcos_product": lambda x, w, b: bcos_product(_lin(x, w), input_norm(x), b, False),
    "bcos_product_explaining": lambda x, w, b: bcos_product(_lin(x, w), input_norm(x), b, True),
    "bcos_scale": lambda x, w, b: _lin(x, w) * bcos_scale(_lin(x, w), input_norm(x), b),
    "explaining_scale": lambda x, w, b: _lin(x, w) * explaining_scale(_lin(x, w), input_norm(x), b),
}


@pytest.mark.parametrize("call", list(_LINEAR_FUNCTIONS.values()), ids=list(_LINEAR_FUNCTIONS))
@pytest.mark.parametrize(("b", "kind", "problem"), [
    (0.5, BcosValueError, "must be a finite number in [1, 10], got 0.5"),
    (float("nan"), BcosValueError, "must be a finite number in [1, 10], got nan"),
    (float("inf"), BcosValueError, "must be a finite number in [1, 10], got inf"),
    (11.0, BcosValueError, "must be a finite number in [1, 10], got 11.0"),
    ("2", BcosTypeError, "must be a real number, got str '2'"),
    (True, BcosTypeError, "must be a real number, got bool True"),
])
def test_the_low_level_linear_functions_refuse_a_b_the_layers_refuse(call, b, kind, problem):
    """The layers check B (check_b) but the functions they call did not: B = 0.5 gave |cos|^-0.5 (an output growing
    as the input and weight disagree), NaN gave NaN outputs, without a word (explaining_linear, bcos_product,
    bcos_scale and explaining_scale still did after inference_linear and bcos_linear checked it)."""
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with pytest.raises(kind, match=rf"^b: {re.escape(problem)}\. b must be >= 1"):
        call(x, w, b)
    with pytest.raises(kind, match=rf"^b: {re.escape(problem)}\."):
        BcosLinear(4, 3, b=b)  # the layers' own message, from the same validator
    # a B the layers accept is served as before: a Python float, an int, and bcos_linear's 0-d tensor
    layer = BcosLinear(4, 3, b=2.0).eval()
    with torch.no_grad():
        layer.weight.copy_(w)
        expected = layer(x)
    for good in (2.0, 2):
        torch.testing.assert_close(call(x, w, good), expected)
    torch.testing.assert_close(bcos_linear(x, w, None, torch.tensor(2.0), own_norm=True), expected)
    for explaining in (False, True):  # bcos_product's 0-d tensor (a compiled layer's bcos_b), unread
        torch.testing.assert_close(bcos_product(_lin(x, w), input_norm(x), torch.tensor(2.0), explaining), expected)


@pytest.mark.parametrize(("m", "kind"), [(0, BcosValueError), (-2, BcosValueError), (2.0, BcosTypeError),
                                         (True, BcosValueError)])
def test_max_out_refuses_a_group_size_the_layers_refuse(m, kind):
    """max_out(lin, True) returned lin (True == 1: no MaxOut, for a flag), silently; 0, -2 and 2.0 failed inside
    torch's unflatten, naming its sizes instead of m."""
    lin = torch.randn(2, 4)
    with pytest.raises(kind, match=rf"^m: must be a positive integer, got {re.escape(repr(m))}\."):
        max_out(lin, m)
    with pytest.raises(kind, match=rf"^max_out: must be a positive integer, got {re.escape(repr(m))}\."):
        BcosLinear(4, 2, max_out=m)  # the layers' own message, from the same validator
    torch.testing.assert_close(max_out(lin, 2), lin.unflatten(-1, (2, 2)).amax(-1))
    assert max_out(lin, 1) is lin
