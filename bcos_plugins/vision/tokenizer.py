"""Tokenisers of the B-cos ViT (paper §3.2, Eq. 9): dynamic linear maps from the encoded image to tokens.

- :class:`BcosPatchEmbedding`: the ViT patch embedding as one B-cos linear layer applied to every
  non-overlapping ``p x p`` patch (its flattened ``2C p p`` values); the patch norm is the norm of the patch.
- :class:`BcosConvTokenizer`: a small B-cos CNN (3x3 B-cos convolutions, padding 1, each with the patch
  norm over its own receptive field, MaxOut) followed by a ``p x p`` B-cos convolution of stride ``p``.

Both give ``p_i(x) = W_i^Tokens(x) x`` with tokens in row-major order of the patch grid, shape
``(batch, (H / p) * (W / p), d_model)``. There is no additive position embedding here (paper §3.2): the
position information enters through attention priors (:mod:`bcos_plugins.vision.attention`).
"""

from __future__ import annotations

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from .._checks import require_int
from ..errors import argument_error
from ..nn.conv import BcosConv2d
from ..nn.linear import BcosLinear

__all__ = ["BcosConvTokenizer", "BcosPatchEmbedding"]


def require_whole_patches(name: str, height: int, width: int, patch_size: int, fix: str) -> None:
    """Refuse an image whose sides are not multiples of ``patch_size``: the one check of :class:`BcosViTConfig`'s
    ``image_size`` and of the tokenisers' inputs. ``F.unfold`` and a stride-``p`` convolution silently leave out the
    last ``height % p`` rows and ``width % p`` columns, so their pixels got no contribution and the explanation
    was not of the image passed (there is no padding convention here)."""
    if height % patch_size or width % patch_size:
        size = f"image_size={height}" if height == width else f"image size {height}x{width} (height x width)"
        raise argument_error(name, f"{size} must be a multiple of patch_size={patch_size} (the patches would leave "
                             f"out the last {height % patch_size} rows and {width % patch_size} columns)", fix)


def _require_tiled_input(layer: str, encoded: Tensor, patch_size: int) -> None:
    height, width = encoded.shape[-2:]
    if height % patch_size or width % patch_size:  # (the fix text is built only for an image that fails: every forward)
        require_whole_patches("encoded", height, width, patch_size,
                              f"{layer} has no padding convention: crop or pad the image to a multiple of "
                              f"patch_size={patch_size} (e.g. {-(-height // patch_size) * patch_size}x"
                              f"{-(-width // patch_size) * patch_size} by padding), or resize it")


class BcosPatchEmbedding(nn.Module):
    """B-cos linear embedding of non-overlapping patches: ``(batch, 2C, H, W) -> (batch, n_patches, d)``."""

    def __init__(self, in_channels: int, patch_size: int, hidden_size: int, b: float, max_out: int) -> None:
        super().__init__()
        self.patch_size = require_int("patch_size", patch_size, minimum=1)
        self.projection = BcosLinear(in_channels * patch_size * patch_size, hidden_size, b=b, max_out=max_out)

    def forward(self, encoded: Float[Tensor, "batch c h w"]) -> Float[Tensor, "batch n_patches d_model"]:
        _require_tiled_input("BcosPatchEmbedding", encoded, self.patch_size)
        patches = F.unfold(encoded, kernel_size=self.patch_size, stride=self.patch_size)
        return self.projection(patches.transpose(1, 2))


class BcosConvTokenizer(nn.Module):
    """B-cos CNN tokeniser: ``len(channels)`` 3x3 B-cos convolutions, then a ``p x p`` stride-``p`` one."""

    def __init__(self, in_channels: int, patch_size: int, hidden_size: int, channels: tuple[int, ...],
                 b: float, max_out: int, kernel_size: int = 3) -> None:
        super().__init__()
        patch_size = require_int("patch_size", patch_size, minimum=1)
        kernel_size = require_int("kernel_size", kernel_size, minimum=1)
        if kernel_size % 2 != 1:
            raise argument_error("kernel_size", f"conv tokeniser kernel_size must be odd (same-size padding), got "
                                 f"{kernel_size}", "Use 3 (the paper) or another odd size")
        layers = []
        previous = in_channels
        for width in channels:
            layers.append(BcosConv2d(previous, width, kernel_size, padding=kernel_size // 2, b=b, max_out=max_out))
            previous = width
        self.patch_size = patch_size
        self.convs = nn.Sequential(*layers)
        self.patchify = BcosConv2d(previous, hidden_size, patch_size, stride=patch_size, b=b, max_out=max_out)

    def forward(self, encoded: Float[Tensor, "batch c h w"]) -> Float[Tensor, "batch n_patches d_model"]:
        _require_tiled_input("BcosConvTokenizer", encoded, self.patch_size)
        features = self.patchify(self.convs(encoded))
        return features.flatten(2).transpose(1, 2)
