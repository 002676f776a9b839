"""Exact per-pixel contributions ``W(x~) x~`` of a B-cos ViT, batched.

Inside :func:`~bcos_plugins.nn.explanation_mode` the logits are ``y = W(x~) x~`` with ``W`` a constant for
autograd, so the gradient of the explained logit w.r.t. the encoded input ``x~ = [x, 1 - x]`` is the row
``W_c(x~)`` and ``x~ * W_c(x~)`` sums to ``y_c`` (paper Eq. 7). Per-pixel contributions sum that over the
``2C`` encoded channels. Rows of a batch are independent (attention and pooling act within one image), so
one backward pass of the summed explained logits explains the whole batch.

With ``config.position_embedding=True`` (the baseline the attention priors replace) the tokens carry an
input-independent constant; its share of the logit is ``position_contributions`` and the pixel
contributions alone then miss it (``completeness_error`` > 0). With attention priors (or none) the share
is zero and pixel contributions are complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..attribution import Direction, Explanation, as_leaf, input_x_gradient, resolve_explained
from ..errors import BcosTypeError, BcosValueError, argument_error
from ..nn.functional import at_least_float32
from .conventional import ConventionalViT
from .model import BcosViT

__all__ = ["ImageExplanation", "attribution_input", "explain_image", "require_vit"]


@dataclass
class ImageExplanation(Explanation):
    """:class:`~bcos_plugins.attribution.Explanation` of a B-cos ViT (returned by :func:`explain_image`).

    Attributes:
        contributions: per-pixel contributions, summed over the ``2C`` encoded channels ``(batch, H, W)``, in at
            least float32 (float32 for a float16 / bfloat16 model), as ``total`` and ``position_contributions``.
        input_contributions: ``W(x~) * x~`` per encoded channel ``(batch, 2C, H, W)``.
        explained: the explained values (a logit, or ``target - foil``).
        weights: the explained row ``W_c(x~)`` of the dynamic linear map ``(batch, 2C, H, W)`` (for the
            colour visualisation of :func:`~bcos_plugins.vision.visualize.weight_colour_image`).
        encoded: the explained input ``x~ = [x, 1 - x]``.
        position_contributions: share of the additive position embedding (0 without one); it is not part of
            ``input_contributions``, so ``completeness_error`` is that share's relative size.
    """

    weights: Float[Tensor, "batch two_c h w"] | None = None
    encoded: Float[Tensor, "batch two_c h w"] | None = None
    position_contributions: Float[Tensor, " batch"] | None = None


def explain_image(model: BcosViT, pixel_values: Float[Tensor, "batch c h w"], *,
                  target: int | Tensor | Direction | None = None,
                  foil: int | Tensor | Direction | None = None) -> ImageExplanation:
    """Explain the logit of ``target`` (default: the predicted class), or ``target - foil``, per image.

    Args:
        model: a :class:`~bcos_plugins.vision.BcosViT`.
        pixel_values: images ``(batch, C, H, W)`` in [0, 1] (any batch size).
        target: class per image (int or one per image), or ``Direction(vector)`` over the classes; defaults
            to the predicted class.
        foil: optional contrast (same forms); the explained value becomes ``target - foil``.

    Returns:
        An :class:`ImageExplanation`: ``contributions`` per pixel ``(batch, H, W)``, ``input_contributions`` and
        ``weights`` per encoded channel ``(batch, 2C, H, W)``, ``explained`` ``(batch,)``, ``target`` / ``foil`` as
        resolved, ``position_contributions`` (the position embedding's share, left out of the pixels' sum) and
        ``completeness_error`` ``(batch,)``.
    """
    if not isinstance(model, BcosViT):
        raise BcosTypeError(f"model: explain_image explains a BcosViT; got {type(model).__name__}. For other "
                            "models use a post-hoc method (e.g. Captum) on the model's forward.")
    if not isinstance(pixel_values, Tensor) or not pixel_values.is_floating_point():
        got = pixel_values.dtype if isinstance(pixel_values, Tensor) else type(pixel_values).__name__
        raise argument_error("pixel_values", f"expected a float tensor (batch, C, H, W) with values in [0, 1], got {got}",
                             "Scale 8-bit images to [0, 1]: pixel_values.float() / 255" if isinstance(pixel_values, Tensor)
                             else "Convert the images to a tensor, e.g. torch.as_tensor(images).float() / 255",
                             kind=BcosTypeError)
    if pixel_values.ndim != 4 or pixel_values.shape[0] == 0:
        # an empty batch was told to add a batch dimension, which it has
        fix = ("Pass at least one image" if pixel_values.ndim == 4
               else "Add a batch dimension with images[None]" if pixel_values.ndim == 3
               else "Add the batch and channel dimensions with images[None, None]" if pixel_values.ndim == 2
               else "Pass images (batch, C, H, W)")
        raise BcosValueError(f"pixel_values: expected a non-empty (batch, C, H, W) tensor, got shape "
                             f"{tuple(pixel_values.shape)}. {fix}.")
    encoded = as_leaf(model.encode(pixel_values))
    batch = encoded.shape[0]
    parsed: dict = {}
    position: list[Tensor] = []

    def compute():
        if model.position_embedding is not None:
            position.append(as_leaf(model.position_embedding.expand(batch, -1, -1)))
        logits, _ = model.forward_encoded(encoded, position_embedding=position[0] if position else None)
        parsed["resolved"] = resolve_explained(logits, target, foil)
        return parsed["resolved"].explained, [encoded, *position]

    step = input_x_gradient(compute, model)
    contributions = step.contributions[0]
    # summed in at least float32, as Explanation.total is: a half-precision sum keeps 3 significant digits
    summed = at_least_float32(contributions.dtype)
    position_share = (torch.zeros(batch, dtype=summed, device=encoded.device) if not position
                      else step.contributions[1].sum(dim=(1, 2), dtype=summed))
    return ImageExplanation(
        contributions=contributions.sum(dim=1, dtype=summed),
        input_contributions=contributions,
        explained=step.explained,
        target=parsed["resolved"].target,
        foil=parsed["resolved"].foil,
        attribution_point="encoded image x~ = [x, 1 - x] (per pixel and encoded channel)",
        weights=step.gradients[0].detach(),
        encoded=encoded.detach(),
        position_contributions=position_share,
    )


def require_vit(model) -> nn.Module:
    """``model`` if it is a :class:`BcosViT` or a :class:`ConventionalViT`, else the error naming it."""
    if not isinstance(model, BcosViT | ConventionalViT):
        raise argument_error("model", f"expected a BcosViT or ConventionalViT, got {type(model).__name__}",
                             "Build the model with bcos_plugins.vision", kind=BcosTypeError)
    return model


def attribution_input(model: BcosViT | ConventionalViT, images: Tensor) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """``(inputs, forward)`` at the model's attribution point: the ``[x, 1 - x]`` encoding for a B-cos ViT.

    ``forward(inputs)`` returns the logits; pixel perturbation edits ``inputs`` (a removed pixel is zero in both
    channels of the encoding, black for a conventional ViT). Captum's methods for images
    (``bcos_plugins.adapters.captum_vision``) attribute here.
    """
    model = require_vit(model)
    if isinstance(model, BcosViT):
        return model.encode(images), lambda encoded: model(encoded_pixel_values=encoded).logits
    return images, lambda pixels: model(pixel_values=pixels).logits
