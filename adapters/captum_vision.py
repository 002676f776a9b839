"""Captum for images: the post-hoc explanations the B-cos ViT paper compares ``W(x) x`` with, as one set of
per-pixel map functions (``bcos_plugins.adapters.captum_vision``; was ``bcos_plugins.vision.posthoc``).

:func:`image_attribution_methods` returns, for a :class:`~bcos_plugins.vision.BcosViT` or a
:class:`~bcos_plugins.vision.ConventionalViT`,
``{name: ImageAttributionMethod}``; each method maps ``(images, target) -> (batch, H, W)`` (summed over
channels) and states where it attributes:

- ``"B-cos W(x)x"`` (B-cos ViT only): the inherent explanation (:func:`~bcos_plugins.vision.explain_image`), checked
  complete on every call;
- ``"Attention (last layer)"``: the last layer's attention, mean over heads and over query tokens (the
  classifier mean-pools the tokens), i.e. :func:`~bcos_plugins.vision.attention_rollout` of that layer alone without the
  residual term; ``"Rollout"``: attention rollout over every layer; both spread each token's value over its patch;
- ``"IntGrad (n steps)"`` (zero baseline), ``"IxG"``: Captum's ``IntegratedGradients`` / ``InputXGradient`` at
  :func:`~bcos_plugins.vision.attribution_input`: the ``[x, 1 - x]`` encoding for a B-cos ViT (where ``W(x) x`` is exact and where
  pixel perturbation removes pixels), the pixels for a conventional ViT. On a B-cos ViT they use its ordinary
  gradient (outside explanation mode), as a Captum user gets it;
- ``"GradCAM (attention)"``: GradCAM as Chefer et al. (2021) adapt it to ViTs, whose implementation the B-cos ViT
  paper uses: the last layer's attention rows weighted per head by the mean gradient of the target logit with
  respect to that head's attention, averaged over heads, with ReLU. The classifier mean-pools the tokens, so
  the query-mean row stands where Chefer et al. read the [CLS] row (and the mean over every query and key
  where they average the [CLS] row's gradient); no min-max rescaling (it would move the positive share the
  grid pointing game measures);
- ``"GradCAM (tokens)"``: Captum's ``LayerGradCam`` on the last block's output tokens laid out as a ``(D, h, w)``
  grid (the reshape pytorch-grad-cam applies to ViTs), with ReLU, upsampled to the image;
- B-cos ViT only, ``"IntGrad (n steps), pixels"`` and ``"IxG, pixels"``: the same at the pixels, through the
  encoding (black pixels, ``x = 0``, then get no attribution, which favours them on black-background images).

``benchmarks/bench_vision.py`` (``make bench-vision``) and ``examples/vit_digits.py`` both explain with this set.
Needs Captum (the ``captum`` extra), as every adapter needs its host library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import captum.attr as attr
import torch
from jaxtyping import Float
from torch import Tensor, nn

from bcos_plugins._checks import require_int, require_row_ids
from bcos_plugins.attribution import relative_completeness_error
from bcos_plugins.errors import BcosRuntimeError
from bcos_plugins.explain import completeness_tolerance
from bcos_plugins.vision.conventional import ConventionalViT
from bcos_plugins.vision.explain import attribution_input, explain_image, require_vit
from bcos_plugins.vision.model import BcosViT
from bcos_plugins.vision.rollout import attention_rollout, spread_over_patches

__all__ = ["ImageAttributionMethod", "image_attribution_methods"]

# explain_image's relative completeness error is float rounding (about 1e-7 in float32); far above it, the
# model is not in the state explain_image expects, and the map must not be reported as W(x) x
_COMPLETENESS_TOLERANCE = 1e-4


@dataclass
class ImageAttributionMethod:
    """``explain(images, target) -> (batch, H, W)`` per-pixel map; ``point``: where it attributes."""

    explain: Callable[[Tensor, Tensor], Float[Tensor, "batch h w"]]
    point: str
    post_hoc: bool = True


def _attentions(model: nn.Module, images: Tensor) -> tuple[Tensor, ...]:
    with torch.no_grad():
        return model(pixel_values=images, output_attentions=True).attentions


@contextmanager
def _token_grid_layer(model: nn.Module) -> Iterator[nn.Module]:
    """A module whose output is the last block's tokens as ``(batch, D, h, w)``, for Captum's LayerGradCam.

    The last block returns ``(tokens, attention)`` with tokens ``(batch, N, D)``; GradCAM averages gradients
    over the spatial axes after the channel axis, so the tokens pass through an identity module in grid layout
    (a forward hook on the block reshapes there and back; the model's output is unchanged).
    """
    view = nn.Identity()
    grid = model.config.grid_size

    def hook(module, args, output):
        tokens, pattern = output
        spatial = view(tokens.transpose(1, 2).unflatten(2, (grid, grid)))
        return spatial.flatten(2).transpose(1, 2), pattern

    handle = model.blocks[-1].register_forward_hook(hook)
    try:
        yield view
    finally:
        handle.remove()


def image_attribution_methods(model: BcosViT | ConventionalViT, ig_steps: int = 32,
                              internal_batch_size: int = 512) -> dict[str, ImageAttributionMethod]:
    """Every method of the module docstring for ``model`` (a :class:`BcosViT` also gets ``W(x) x``)."""
    model = require_vit(model)
    ig_steps = require_int("ig_steps", ig_steps, minimum=1)
    internal_batch_size = require_int("internal_batch_size", internal_batch_size, minimum=1)
    patch = model.config.patch_size
    bcos = isinstance(model, BcosViT)
    gradient_point = "encoded image [x, 1-x]" if bcos else "pixels"

    def inherent(images, target):
        explanation = explain_image(model, images, target=target)
        # a position embedding's share is a constant beside the pixels' (position_contributions, by design not in
        # the map): the pixels and it add up to the logit
        missed = explanation.delta + explanation.position_contributions
        worst = relative_completeness_error(missed, explanation.explained).max().item()
        # under torch.autocast the forward ran in bfloat16 / float16, whose rounding (sqrt(eps), as explain allows
        # it) the map is complete to: 1e-4 refused a bfloat16 autocast's 1e-2 as a broken model
        rounding, precision = completeness_tolerance(explanation.input_contributions)
        if worst > max(_COMPLETENESS_TOLERANCE, rounding):
            raise BcosRuntimeError(f"model: its W(x) x explanation misses the explained logit by {worst:.2e} of its "
                                   f"size, beyond {precision} rounding, so the map is not reported. A module of the "
                                   "model is not exact in explanation mode (a custom one that is no "
                                   "DynamicWeightModule?), or the weights or images hold huge values")
        return explanation.contributions

    def last_attention(images, target):
        return attention_rollout(_attentions(model, images)[-1:], patch, residual_weight=0.0)

    def rollout(images, target):
        return attention_rollout(_attentions(model, images), patch)

    def pixels(images):
        return images, lambda x: model(pixel_values=x).logits

    def model_point(images):
        return attribution_input(model, images)

    def classes(target, inputs: Tensor) -> Tensor:
        # one class per image, read as the package reads every per-row id (an int, a list or a (batch,) tensor, as
        # Captum's methods accept them) by every map that reads target: Captum counted target=-1 from the end (the
        # last class's map, beside the B-cos map's refusal of -1 in one comparison) and refused the rest with a bare
        # IndexError / AssertionError from inside torch
        return require_row_ids("target", target, len(inputs), n_ids=model.config.num_labels, what="classes",
                               device=inputs.device)

    def integrated_gradients(point):
        def explain(images, target):
            inputs, forward = point(images)
            return attr.IntegratedGradients(forward).attribute(
                inputs, baselines=0.0, target=classes(target, inputs), n_steps=ig_steps,
                internal_batch_size=internal_batch_size).sum(dim=1)
        return explain

    def input_x_gradient(point):
        def explain(images, target):
            inputs, forward = point(images)
            return attr.InputXGradient(forward).attribute(inputs, target=classes(target, inputs)).sum(dim=1)
        return explain

    def attention_grad_cam(images, target):
        inputs = attribution_input(model, images)[0].detach()
        target = classes(target, inputs)
        with torch.enable_grad():
            out = model(**{"encoded_pixel_values" if bcos else "pixel_values": inputs}, output_attentions=True)
            last = out.attentions[-1]
            (grad,) = torch.autograd.grad(out.logits.gather(1, target[:, None]).sum(), last)
        head_weights = grad.mean(dim=(2, 3), keepdim=True)[..., 0]  # (batch, heads, 1)
        cam = (head_weights * last.detach().mean(dim=2)).mean(dim=1).clamp_min(0)  # (batch, N)
        return spread_over_patches(cam, patch)

    def grad_cam(images, target):
        inputs, forward = attribution_input(model, images)
        with _token_grid_layer(model) as layer:
            cam = attr.LayerGradCam(forward, layer).attribute(inputs, target=classes(target, inputs),
                                                              relu_attributions=True)
        return attr.LayerAttribution.interpolate(cam, tuple(images.shape[-2:])).squeeze(1)

    methods = ({"B-cos W(x)x": ImageAttributionMethod(inherent, "encoded image [x, 1-x] (exact)", post_hoc=False)}
               if bcos else {})
    methods |= {
        "Attention (last layer)": ImageAttributionMethod(last_attention, "last layer's attention, per token"),
        "Rollout": ImageAttributionMethod(rollout, "attention of every layer, per token"),
        f"IntGrad ({ig_steps} steps)": ImageAttributionMethod(integrated_gradients(model_point), gradient_point),
        "IxG": ImageAttributionMethod(input_x_gradient(model_point), gradient_point),
        "GradCAM (attention)": ImageAttributionMethod(attention_grad_cam, "last layer's attention x its gradient, "
                                                      "per token"),
        "GradCAM (tokens)": ImageAttributionMethod(grad_cam, "last block's output tokens"),
    }
    if bcos:
        methods |= {
            f"IntGrad ({ig_steps} steps), pixels": ImageAttributionMethod(
                integrated_gradients(pixels), "pixels x (through the encoding; black baseline)"),
            "IxG, pixels": ImageAttributionMethod(input_x_gradient(pixels), "pixels x (through the encoding)"),
        }
    return methods
