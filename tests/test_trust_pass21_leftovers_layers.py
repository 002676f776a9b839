"""Trust pass 21 leftovers (layers): items the trust-pass helpers noticed and left; each test failed before its fix."""

from __future__ import annotations

import re

import pytest
import torch

from bcos_plugins.errors import BcosValueError
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
