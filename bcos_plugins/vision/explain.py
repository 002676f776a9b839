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

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..metrics.summary import completeness_error as _completeness_error
from ..nn.dynamic import explanation_mode
from .model import BcosViT

__all__ = ["ImageExplanation", "explain_image"]


@dataclass
class ImageExplanation:
    """Result of :func:`explain_image`.

    Attributes:
        contributions: per-pixel contributions, summed over the ``2C`` encoded channels ``(batch, H, W)``.
        input_contributions: ``W(x~) * x~`` per encoded channel ``(batch, 2C, H, W)``.
        weights: the explained row ``W_c(x~)`` of the dynamic linear map ``(batch, 2C, H, W)`` (for the
            colour visualisation of :func:`~bcos_plugins.vision.visualize.weight_colour_image`).
        encoded: the explained input ``x~ = [x, 1 - x]``.
        logits: the explained values (a logit, or ``target - foil``).
        position_contributions: share of the additive position embedding (0 without one).
        target, foil: explained class per row; contrast class per row or ``None``.
    """

    contributions: Float[Tensor, "batch h w"]
    input_contributions: Float[Tensor, "batch two_c h w"]
    weights: Float[Tensor, "batch two_c h w"]
    encoded: Float[Tensor, "batch two_c h w"]
    logits: Float[Tensor, " batch"]
    position_contributions: Float[Tensor, " batch"]
    target: Int[Tensor, " batch"]
    foil: Int[Tensor, " batch"] | None

    @property
    def total(self) -> Float[Tensor, " batch"]:
        """Sum of the pixel contributions per image (equals ``logits`` without position embedding)."""
        return self.contributions.sum(dim=(1, 2))

    @property
    def completeness_error(self) -> Float[Tensor, " batch"]:
        """``|sum of pixel contributions - explained logit| / |explained logit|`` per image."""
        return _completeness_error(self.contributions, self.logits)


def _class_ids(value, batch: int, n_classes: int, name: str, device) -> Tensor:
    t = torch.as_tensor(value, device=device)
    if t.is_floating_point():
        raise ValueError(f"{name} must be integer class ids (an int or shape (batch,)); got {t.dtype}")
    t = t.to(torch.long)
    if t.ndim == 0:
        t = t.expand(batch)
    if t.shape != (batch,):
        raise ValueError(f"{name} must be an int or have shape (batch,) = ({batch},); got {tuple(t.shape)}")
    if (t < 0).any() or (t >= n_classes).any():
        raise ValueError(f"{name} ids must lie in [0, {n_classes}); got {t.tolist()}")
    return t


def explain_image(model: BcosViT, pixel_values: Float[Tensor, "batch c h w"], *, target: int | Tensor | None = None,
                  foil: int | Tensor | None = None) -> ImageExplanation:
    """Explain the logit of ``target`` (default: the predicted class), or ``target - foil``, per image.

    Args:
        model: a :class:`~bcos_plugins.vision.BcosViT`.
        pixel_values: images ``(batch, C, H, W)`` in [0, 1] (any batch size).
        target: class per image (int or ``(batch,)``); defaults to the predicted class.
        foil: optional contrast class; the explained value becomes ``logit[target] - logit[foil]``.
    """
    if not isinstance(model, BcosViT):
        raise TypeError(f"explain_image explains a BcosViT; got {type(model).__name__}. For other models use "
                        "a post-hoc method (e.g. Captum) on the model's forward.")
    encoded = model.encode(pixel_values).detach().requires_grad_(True)
    batch = encoded.shape[0]
    n_classes = model.config.num_labels
    with torch.enable_grad(), explanation_mode(model):
        position = None
        if model.position_embedding is not None:
            position = model.position_embedding.detach().expand(batch, -1, -1).clone().requires_grad_(True)
        logits, _ = model.forward_encoded(encoded, position_embedding=position)
        target_t = logits.argmax(-1) if target is None else _class_ids(target, batch, n_classes, "target",
                                                                           encoded.device)
        explained = logits.gather(1, target_t[:, None]).squeeze(1)
        foil_t = None
        if foil is not None:
            foil_t = _class_ids(foil, batch, n_classes, "foil", encoded.device)
            explained = explained - logits.gather(1, foil_t[:, None]).squeeze(1)
        leaves = [encoded] if position is None else [encoded, position]
        grads = torch.autograd.grad(explained.sum(), leaves)
    weights = grads[0].detach()
    contributions = encoded.detach() * weights
    position_share = (torch.zeros(batch, device=encoded.device) if position is None
                      else (position.detach() * grads[1]).sum(dim=(1, 2)))
    return ImageExplanation(
        contributions=contributions.sum(dim=1),
        input_contributions=contributions,
        weights=weights,
        encoded=encoded.detach(),
        logits=explained.detach(),
        position_contributions=position_share,
        target=target_t,
        foil=foil_t,
    )
