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


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_token_component_decomposition_batched_must_be_a_bool(flag):
    """batched="no" was read as True (the batched sweep ran when the caller asked for the reference loop)."""
    model = transformer_bridge_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False))
    tokens = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    with pytest.raises(BcosTypeError, match=rf"batched: must be True or False, got {type(flag).__name__} "
                       rf"{re.escape(repr(flag))}\. Pass batched=True or batched=False"):
        token_component_decomposition(model, tokens, batched=flag)
