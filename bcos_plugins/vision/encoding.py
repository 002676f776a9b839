"""Input encoding of B-cos vision models: every channel ``x`` in [0, 1] becomes the pair ``[x, 1 - x]``.

``encode_image(x) = concat([x, 1 - x], dim=channels)``: C channels become 2C, channels ``c`` and ``C + c``
belong together. Two reasons (B-cos networks, Böhle et al. 2022; B-cos ViT paper §C.1.1):

- a black pixel is not the zero vector, so dark evidence can still align with a weight and contribute;
- every pixel vector has the same norm-independent angle for the same colour, so the rows of ``W(x)`` can
  be shown in colour (:mod:`bcos_plugins.vision.visualize`).

The encoding is affine (``1 - x`` has a constant part), so exact contributions are taken at the encoded
input: the attribution point of :func:`~bcos_plugins.vision.explain_image` is ``encode_image(x)``.
"""

from __future__ import annotations

import warnings

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .._checks import bad_rows, caller_stacklevel, require_tensor
from ..errors import BcosTypeError, BcosValueError, argument_error

__all__ = ["InputEncoding", "check_pixel_values", "encode_image"]

# Images are allowed a little float noise around [0, 1] (resizing, normalising by 255 in float32).
_RANGE_TOLERANCE = 1e-4


def check_pixel_values(pixel_values: Tensor, num_channels: int, image_size: int, what: str = "pixel_values",
                       dtype: torch.dtype | None = None) -> None:
    """Raise a :class:`~bcos_plugins.errors.BcosValueError` naming the problem and the fix if ``pixel_values``
    does not fit the model: not a float tensor, wrong shape, an empty batch, or NaN / inf values; with ``dtype`` (the
    model's weights'), a :class:`~bcos_plugins.errors.BcosTypeError` for another dtype (under ``torch.autocast`` for one
    other than float32 and the autocast dtype): images from NumPy arrive as float64, and torch's own refusal came from
    deep inside the tokeniser."""
    if not isinstance(pixel_values, Tensor) or not pixel_values.is_floating_point():
        raise BcosValueError(f"{what}: must be a float tensor of shape (batch, {num_channels}, {image_size}, "
                         f"{image_size}) with values in [0, 1]; got {type(pixel_values).__name__} "
                         f"{getattr(pixel_values, 'dtype', '')}. Scale 8-bit images to [0, 1]: "
                         "pixel_values.float() / 255")
    expected = (num_channels, image_size, image_size)
    if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
        hint = ""
        if pixel_values.ndim == 3:
            hint = " (add the batch dimension: pixel_values[None])"
        elif pixel_values.ndim == 4 and pixel_values.shape[-1] == num_channels:
            hint = " (channels last? use pixel_values.permute(0, 3, 1, 2))"
        elif pixel_values.ndim == 4 and pixel_values.shape[1] == 2 * num_channels and what == "pixel_values":
            hint = (f" (2 * num_channels = {2 * num_channels} channels: already encoded as [x, 1 - x]? Pass the images "
                    "themselves, or the encoding as encoded_pixel_values=)")
        elif pixel_values.ndim == 4 and pixel_values.shape[1] != num_channels and what == "encoded_pixel_values":
            hint = f" (the [x, 1 - x] encoding has 2 * num_channels = {num_channels} channels; see encode_image)"
        elif pixel_values.ndim == 4 and pixel_values.shape[1] != num_channels:
            # the usual mismatches named with their conversion (the hint named only the configured channels)
            convert = {(4, 3): "RGBA? drop the alpha channel: pixel_values[:, :3]",
                       (3, 1): "RGB? convert to grey, e.g. pixel_values.mean(dim=1, keepdim=True)",
                       (1, 3): "grey? repeat it: pixel_values.expand(-1, 3, -1, -1)"}.get(
                           (pixel_values.shape[1], num_channels))
            hint = f" (the model was configured with num_channels={num_channels}{'; ' + convert if convert else ''})"
        elif pixel_values.ndim == 4:
            hint = (f" (the model was configured with image_size={image_size}; resize the images, e.g. "
                    f"torch.nn.functional.interpolate)")
        raise BcosValueError(f"{what}: must have shape (batch, {num_channels}, {image_size}, {image_size}); got "
                             f"{tuple(pixel_values.shape)}{hint}.")
    if pixel_values.shape[0] == 0:
        raise argument_error(what, f"is an empty batch (shape {tuple(pixel_values.shape)})",
                             "Pass at least one image")
    finite = torch.isfinite(pixel_values)
    if not finite.all():
        raise argument_error(what, f"contains NaN or inf in {bad_rows(~finite)}",
                             "Pass finite values (check the image loading / resizing)")
    if dtype is not None and pixel_values.dtype != dtype:
        device = pixel_values.device.type
        # under autocast also float32 and the autocast dtype, which it casts or computes in; float64 it never casts
        # (images from NumPy), and the other half-precision dtype failed inside its cast ("Unexpected floating
        # ScalarType in at::autocast::prioritize")
        if not (torch.is_autocast_enabled(device)
                and pixel_values.dtype in (torch.float32, torch.get_autocast_dtype(device))):
            raise argument_error(what, f"are {pixel_values.dtype} but the model's weights are {dtype}",
                                 f"Cast them: {what}.to({dtype})", kind=BcosTypeError)


def encode_image(pixel_values: Float[Tensor, "batch c h w"]) -> Float[Tensor, "batch two_c h w"]:
    """``[x, 1 - x]`` along the channel axis; values must lie in [0, 1]. A batch whose every value is at most 1/255
    (images divided by 255 twice) warns, at the caller's line."""
    pixel_values = require_tensor("pixel_values", pixel_values, kind="float", shape_hint="(batch, C, H, W)",
                                  list_dtype=torch.get_default_dtype())  # feeds a model, none known here
    # (batch, C, H, W) only: an unbatched (C, H, W) image was encoded along its rows (H became 2H), silently
    if pixel_values.ndim != 4 or pixel_values.numel() == 0:
        raise argument_error("pixel_values", f"must be a non-empty (batch, C, H, W) tensor, got shape "
                             f"{tuple(pixel_values.shape)}", "Add the batch dimension to one image (pixel_values[None]), "
                             "and pass at least one image")
    lo, hi = pixel_values.min().item(), pixel_values.max().item()
    if lo < -_RANGE_TOLERANCE or hi > 1 + _RANGE_TOLERANCE:
        raise BcosValueError(f"pixel_values: B-cos image inputs must lie in [0, 1] (they are encoded as [x, 1 - x]); "
                             f"got values in [{lo:.4g}, {hi:.4g}]. Scale the images to [0, 1] instead of "
                             "standardising them.")
    if 0 < hi <= 1 / 255 + _RANGE_TOLERANCE:
        # 8-bit images divided by 255 twice (torchvision's ToTensor already scales to [0, 1]) lie in [0, 1/255]: the
        # model saw almost black images and explained them without a word
        warnings.warn(f"pixel_values: every value is at most {hi:.3g} (<= 1/255): images scaled to [0, 1] twice (e.g. "
                      "ToTensor() then / 255)? The model sees them as almost black. Divide 8-bit images by 255 once",
                      UserWarning, stacklevel=caller_stacklevel())
    return torch.cat([pixel_values, 1.0 - pixel_values], dim=1)


class InputEncoding(nn.Module):
    """Module form of :func:`encode_image` (kept as a module so that hooks can see the encoded input)."""

    def forward(self, pixel_values: Float[Tensor, "batch c h w"]) -> Float[Tensor, "batch two_c h w"]:
        return encode_image(pixel_values)
