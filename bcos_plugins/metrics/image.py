"""Image explanation metrics of the B-cos ViT paper (§4, §C.4): grid pointing game and pixel perturbation.

Grid pointing game (Böhle et al. 2021): a grid of ``rows x cols`` images of different classes is
explained for the class of one cell; the score is the share of *positive* attribution that falls inside
that cell::

    score = sum_{p in cell} max(a_p, 0) / sum_p max(a_p, 0)          (0 when nothing is positive)

Pixel perturbation (Chefer et al. 2021 as used in the paper): pixels are ranked by attribution and the
top fraction ``r`` removed (all channels of the pixel set to ``removed_value``, 0 by default: "zeroing the
pixel encoding") for ``r`` in ``fractions`` (default 9 points in [0, 0.25]); the model's confidence in the
target class is measured after each step, once removing the most important pixels first and once the
least important first. A faithful explanation gives a fast drop for the first and a flat curve for the
second. The curves of a contrastive explanation (``explain_image(..., foil=)``) track the target's confidence minus
the foil's, the contrast it explains. Summary: the *area between the curves* (ABC)::

    ABC = trapezoid(least_first - most_first, r) / (r_max - r_min)        (normalised: the mean gap)

reported per image; higher is better. The paper (§C.4.2) instead averages the curves over the images and
divides them by the mean unperturbed confidence, so that each starts at 1:
:meth:`PixelPerturbation.mean_area_between_normalised` gives that number for a batch (the mean of the
per-image ABC divided by the mean unperturbed score). Within one model it only rescales every method by the
same factor; it matters when two models are compared. ``k = max(1, floor(r * H * W))`` pixels are removed at fraction
``r > 0`` (none at ``r = 0``), the rule the text metrics take k from a fraction by (``metrics.attributions.share_counts``:
float64 with a margin of 1e-9, so a fraction written as a decimal gives the count it means; until 2026-11-29 Python's
``round``, which rounds halves to even: 2.5 pixels gave 2, 3.5 gave 4, 0.5 gave none). Ties
in the ranking (e.g. token-level maps such as attention rollout) are broken at random with a fixed seed,
not by pixel position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from .._checks import (
    bad_rows,
    require_bool,
    require_deterministic,
    require_float,
    require_int,
    require_row_ids,
    require_seed,
    require_tensor,
)
from ..errors import BcosTypeError, argument_error
from ..nn.dynamic import evaluating
from ..nn.functional import at_least_float32
from .attributions import share_counts
from .perturbation import (
    aopc,
    check_fractions,
    explained_foil,
    refuse_explanation_of_another_model,
    refuse_target_unlike_explained,
)

__all__ = ["IMAGE_FRACTIONS", "PixelPerturbation", "grid_pointing_game", "pixel_perturbation", "pixel_ranking"]

IMAGE_FRACTIONS: tuple[float, ...] = tuple(round(0.25 * i / 8, 6) for i in range(9))


def _spatial(attributions: Tensor, name: str = "attributions") -> Tensor:
    if hasattr(attributions, "contributions") and not isinstance(attributions, Tensor):
        attributions = attributions.contributions  # an ImageExplanation
    attributions = require_tensor(name, attributions, ndim=(3, 4), kind="real",
                                  shape_hint="(batch, H, W) or (batch, C, H, W)")
    if 0 in attributions.shape:
        raise argument_error(name, f"are empty (shape {tuple(attributions.shape)})", "Pass at least one map")
    if attributions.dtype == torch.bool:
        # a mask ranked and shared as maps of 1 and 0 (its ties broken at random), silently; the text metrics refuse
        # boolean scores too
        raise argument_error(name, "are a boolean tensor, not attribution maps", "Pass the explanation's maps "
                             "(explanation.contributions), or a mask's float() if it is meant as scores",
                             kind=BcosTypeError)
    if not attributions.is_floating_point():
        attributions = attributions.double()
    # ranked, summed over channels and shared out in at least float32: in half precision a channel sum keeps 3
    # significant digits (tying pixels float32 tells apart) and a pointing-game share was off by 7e-4
    attributions = attributions.to(at_least_float32(attributions.dtype))
    if attributions.ndim == 4:  # (batch, channels, H, W): per-pixel score = sum over channels
        _refuse_channels_last(attributions, name)
        return attributions.sum(dim=1)
    return attributions


# channel counts of an image map: grey, RGB, RGBA, and the B-cos encodings [x, 1 - x] of grey and RGB (2C)
_CHANNEL_COUNTS = (1, 2, 3, 4, 6)


def _refuse_channels_last(maps: Tensor, name: str) -> None:
    """Refuse a 4-d map that looks channels-last ``(batch, H, W, C)``: its last side is a channel count (1, 3 or 4) and
    its second is not. Read as ``(batch, C, H, W)`` it was summed over its rows and its columns taken for channels;
    where the sides divided by the grid, a pointing-game share of 1.0 read 0.5, silently."""
    if maps.shape[-1] in (1, 3, 4) and maps.shape[1] not in _CHANNEL_COUNTS:
        raise argument_error(name, f"look channels-last: shape {tuple(maps.shape)} is read as (batch, C, H, W), which "
                             f"would take its {maps.shape[1]} rows for channels and its {maps.shape[-1]} channels for "
                             "columns", f"Pass {name}.permute(0, 3, 1, 2) for a (batch, H, W, C) map, or a "
                             "(batch, H, W) map (summed over channels) if it really is (batch, C, H, W)")


def grid_pointing_game(attributions: Float[Tensor, "batch h w"], cell: Int[Tensor, " batch"] | int,
                       grid: tuple[int, int] = (2, 2)) -> Float[Tensor, " batch"]:
    """Share of positive attribution inside the explained cell (row-major index) of each grid image.

    ``attributions``: maps ``(batch, H, W)``, channels-first ``(batch, C, H, W)`` (summed over channels) or an image
    explanation. A 4-d map is always read channels-first; one that looks channels-last ``(batch, H, W, C)`` (last
    side 1, 3 or 4, second side not a channel count) is refused: pass ``maps.permute(0, 3, 1, 2)``."""
    maps = _spatial(attributions).detach()
    batch, height, width = maps.shape
    if not isinstance(grid, tuple | list) or len(grid) != 2:
        raise argument_error("grid", f"must be (rows, cols), got {grid!r}", "Pass e.g. (2, 2)", kind=BcosTypeError)
    rows, cols = (require_int("grid", g, minimum=1) for g in grid)
    if height % rows or width % cols:
        raise argument_error("grid", f"a {height}x{width} map cannot be split into a {rows}x{cols} grid of equal "
                             "cells", "Pass the grid the images were built with")
    cell_t = require_row_ids("cell", cell, batch, n_ids=rows * cols, device=maps.device,
                             what=f"cells in the {rows}x{cols} grid, numbered row by row from 0")
    positive = maps.clamp_min(0)
    # the share does not depend on the scale, so each map is divided by its largest value first: a float32 map of
    # subnormal values (1e-40) summed below the floor under the total (finfo.tiny) and read 0.10 for 0.75
    largest = positive.flatten(1).amax(1)[:, None, None]
    positive = positive / torch.where(largest > 0, largest, torch.ones_like(largest))
    per_cell = positive.reshape(batch, rows, height // rows, cols, width // cols).sum(dim=(2, 4)).flatten(1)
    total = per_cell.sum(dim=1)
    inside = per_cell.gather(1, cell_t[:, None]).squeeze(1)
    return torch.where(total > 0, inside / total.clamp_min(torch.finfo(total.dtype).tiny), torch.zeros_like(total))


def pixel_ranking(attributions: Float[Tensor, "batch h w"], most_important_first: bool = True,
                  seed: int = 0) -> Int[Tensor, "batch hw"]:
    """Flat pixel indices in removal order; ties broken at random (fixed ``seed``), the same way for every image,
    so an image ranks the same alone and anywhere in a batch. ``attributions`` are read as in
    :func:`grid_pointing_game`: ``(batch, H, W)`` or channels-first ``(batch, C, H, W)``; a channels-last map is
    refused."""
    # checked here, naming them: a float or bool seed failed inside torch's manual_seed (RuntimeError), a
    # most_important_first of another type inside argsort (TypeError)
    seed = _require_generator_seed(seed)
    require_bool("most_important_first", most_important_first,
                 fix="Pass True (most important pixels first) or False (least important first)")
    maps = _spatial(attributions)
    _require_finite_maps(maps)
    return _ranking(maps, most_important_first, seed)


def _require_generator_seed(seed) -> int:
    """``seed`` as an int in the range ``torch.Generator().manual_seed`` takes: beyond it manual_seed failed with
    "Overflow when unpacking long long", a ValueError that named no argument."""
    return require_seed("seed", seed, minimum=-2**63, maximum=2**64 - 1)


def _ranking(maps: Tensor, most_important_first: bool, seed: int) -> Tensor:
    """:func:`pixel_ranking` of checked ``(batch, H, W)`` maps (``pixel_perturbation`` checks its maps and seed once
    for both orders)."""
    maps = maps.detach().flatten(1)
    g = torch.Generator().manual_seed(seed)
    # one permutation for all images: a generator drawn from row after row gave an image with tied scores another
    # order (and other perturbation curves) depending on the images before it in the batch
    shuffle = torch.randperm(maps.shape[1], generator=g).to(maps.device).expand(maps.shape[0], -1)
    shuffled = maps.gather(1, shuffle)
    order = torch.argsort(shuffled, dim=1, descending=most_important_first, stable=True)
    return shuffle.gather(1, order)


@dataclass
class PixelPerturbation:
    """Confidence curves ``(batch, n_fractions)`` and their summaries (see module docstring).

    ``foil``: the foil class per image of a contrastive explanation (its curves track the target's score minus the
    foil's), else ``None``, as :class:`~bcos_plugins.metrics.PerturbationCurves` says which kind a result is.
    """

    fractions: tuple[float, ...]
    most_first: Float[Tensor, "batch n_fractions"]
    least_first: Float[Tensor, "batch n_fractions"]
    foil: Int[Tensor, " batch"] | None = None

    @property
    def area_between(self) -> Float[Tensor, " batch"]:
        """Normalised area between the least-first and most-first curves (higher = more faithful)."""
        return aopc(self.least_first - self.most_first, self.fractions, normalise=True)

    def mean_area_between_normalised(self) -> float:
        """The paper's ABC for the batch: area between the mean curves, each divided by the mean unperturbed score.

        Raises if that mean score is not positive (e.g. logits below zero): dividing by it would flip or blow
        up the area without a word.
        """
        initial = self.most_first[:, 0].double().mean()
        if self.fractions[0] != 0 or not initial > 0:
            raise argument_error("score", f"the normalised area needs curves that start unperturbed (fraction 0, "
                                 f"got {self.fractions[0]}) at a positive mean score (got {initial.item():.4g})",
                                 "Use fractions starting at 0 and score='softmax' or 'sigmoid', or report "
                                 "area_between unnormalised")
        return (self.area_between.double().mean() / initial).item()

    @property
    def area_most_first(self) -> Float[Tensor, " batch"]:
        """Normalised area under the most-important-first curve (lower = more faithful)."""
        return aopc(self.most_first, self.fractions, normalise=True)

    @property
    def area_least_first(self) -> Float[Tensor, " batch"]:
        """Normalised area under the least-important-first curve (higher = more faithful)."""
        return aopc(self.least_first, self.fractions, normalise=True)


def _require_finite_maps(maps: Tensor) -> None:
    finite = torch.isfinite(maps)
    if not finite.all():
        # NaN sorts as the largest value: the ranking (and every curve after it) would be silently arbitrary.
        raise argument_error("attributions", f"contain NaN or inf in {bad_rows(~finite)}",
                             "Fix the attribution method for those images")


def _scores(forward: Callable, inputs: Tensor, target: Tensor, score: str, foil: Tensor | None = None) -> Tensor:
    """The target's ``score`` per image, minus the foil's where ``foil`` (a contrastive explanation's) is given."""
    out = forward(inputs)
    logits = out.logits if hasattr(out, "logits") else out
    if not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[0] != inputs.shape[0]:
        raise argument_error("forward", f"must return logits (batch, classes), got "
                             f"{tuple(getattr(logits, 'shape', ()))}", "Return the model's logits")
    if not torch.isfinite(logits).all():
        # NaN confidences would make the curves and the area between them NaN without a word.
        raise argument_error("forward", "returned NaN or inf logits on the perturbed inputs",
                             "Check removed_value (it is written into removed pixels) and the model")
    target = require_row_ids("target", target, inputs.shape[0], n_ids=logits.shape[1], what="classes")
    # scored in at least float32 (exact widening), as the text metrics' probabilities: a half-precision softmax keeps 3
    # significant digits, so a bfloat16 ViT's curves were off by up to 5e-4 and its area between them rounded
    logits = logits.to(at_least_float32(logits.dtype))
    if score == "softmax" and logits.shape[1] == 1:
        # the softmax of one logit is 1 whatever the image: both curves of a one-logit model were flat at 1 and every
        # map's area between them 0, silently
        raise argument_error("score", "is 'softmax', but forward returns one logit per image, whose softmax is 1 "
                             "whatever the image (both curves would be flat)",
                             "Pass score='sigmoid' (a binary classifier with one logit) or score='logit'")
    if score == "softmax":
        values = torch.softmax(logits, dim=-1)
    elif score == "sigmoid":
        values = torch.sigmoid(logits)
    else:
        values = logits
    tracked = values.gather(1, target[:, None]).squeeze(1)
    if foil is None:
        return tracked
    foil = require_row_ids("foil", foil, inputs.shape[0], n_ids=logits.shape[1], what="classes (the explanation's "
                           "foil)")
    return tracked - values.gather(1, foil.to(values.device)[:, None]).squeeze(1)


def pixel_perturbation(forward: Callable[[Tensor], Tensor], inputs: Float[Tensor, "batch c h w"],
                       attributions: Float[Tensor, "batch h w"], target: Int[Tensor, " batch"] | int,
                       fractions: Sequence[float] = IMAGE_FRACTIONS, removed_value: float = 0.0,
                       score: Literal["softmax", "sigmoid", "logit"] = "softmax", seed: int = 0) -> PixelPerturbation:
    """Confidence curves when removing pixels most / least important first.

    Args:
        forward: maps a batch of ``inputs`` to logits (or an output with ``.logits``); called without grad. A module
            runs in eval mode (its training flags are put back); a function that scores the same images differently
            (one around a model in training mode: dropout) is refused.
        inputs: the model's input, in the space where pixels are removed. For a B-cos ViT pass the encoded
            ``[x, 1 - x]`` images and ``lambda e: model(encoded_pixel_values=e)``: removal then zeroes the whole
            pixel encoding, as in the paper.
        attributions: per-pixel maps ``(batch, H, W)`` (or channels-first ``(batch, C, H, W)``, summed over channels;
            a channels-last map is refused), or an image explanation (its
            ``contributions``; a ``target`` other than the class it explains is refused, and so is an explanation
            of other images than ``inputs`` or of another model than ``forward``'s). The curves of a contrastive
            explanation (``explain_image(..., foil=)``, evidence for ``target - foil``) track the contrast it explains,
            the target's ``score`` minus the foil's.
        target: class whose confidence is tracked (int or ``(batch,)``).
        fractions: increasing removal fractions in [0, 1] (default 9 points in [0, 0.25]).
        removed_value: value written to every channel of a removed pixel.
        score: ``"softmax"`` probability (default), ``"sigmoid"`` or raw ``"logit"`` of the target.
    """
    if not callable(forward):
        raise argument_error("forward", f"must be callable, got {type(forward).__name__}",
                             "Pass e.g. lambda e: model(encoded_pixel_values=e)", kind=BcosTypeError)
    inputs = require_tensor("inputs", inputs, ndim=4, kind="float", shape_hint="(batch, C, H, W)",
                            list_dtype=torch.get_default_dtype())  # fed to forward's model
    if 0 in inputs.shape:
        raise argument_error("inputs", f"are empty (shape {tuple(inputs.shape)})", "Pass at least one image")
    maps = _spatial(attributions)
    _require_finite_maps(maps)
    batch, _, height, width = inputs.shape
    if maps.shape != (batch, height, width):
        raise argument_error("attributions", f"attributions {tuple(maps.shape)} do not match the inputs' "
                             f"(batch, H, W) = {(batch, height, width)}", "Explain the same images")
    if score not in ("softmax", "sigmoid", "logit"):
        raise argument_error("score", f"score must be 'softmax', 'sigmoid' or 'logit', got {score!r}",
                             "Pick one of those")
    removed_value = require_float("removed_value", removed_value)
    # one float failed with "'float' object is not iterable"; a dict's keys or a set's (unordered) values were taken
    fractions = check_fractions(fractions, zero=True, example="IMAGE_FRACTIONS")
    if len(fractions) < 2 or any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)) \
            or fractions[0] < 0 or fractions[-1] > 1:
        raise argument_error("fractions", f"fractions must be at least two increasing values in [0, 1], got "
                             f"{list(fractions)}", "Pass e.g. IMAGE_FRACTIONS")
    target_t = require_row_ids("target", target, batch, device=inputs.device)  # range: once the logits are known
    explained = getattr(attributions, "target", None) if not isinstance(attributions, Tensor) else None
    if not (isinstance(explained, Tensor) and explained.ndim == 1 and not explained.is_floating_point()
            and explained.dtype != torch.bool and explained.shape == target_t.shape):
        explained = None  # the attributions do not say which class they explain
    # the maps of one class were scored on another class's confidence, silently
    refuse_target_unlike_explained(target_t, explained, "confidence", "Pass target=explanation.target, or explain the "
                                   "class you score")
    seed = _require_generator_seed(seed)
    _refuse_explanation_of_other_images(attributions, inputs)
    # a contrastive explanation ranks evidence for target - foil: its curves track the target's score minus the foil's
    # (its ranking was scored on the target's alone, silently); the foil's range is checked with the logits
    foil = explained_foil(attributions, batch, None, "confidence")
    foil = foil.to(inputs.device) if foil is not None else None
    n_pixels = height * width
    curves = {}
    # in eval mode, as the text metrics: a model left in training mode scored every perturbed image with dropout on
    with torch.no_grad(), evaluating(forward) if isinstance(forward, nn.Module) else nullcontext():
        for most_first in (True, False):
            ranking = _ranking(maps, most_first, seed)
            rank_of_pixel = torch.empty_like(ranking).scatter_(1, ranking, torch.arange(n_pixels, device=ranking.device)
                                                               .expand(batch, -1).contiguous())
            points = []
            for fraction in fractions:
                k = _pixel_count(fraction, n_pixels)
                removed = (rank_of_pixel < k).reshape(batch, 1, height, width)
                perturbed = torch.where(removed, torch.full_like(inputs, removed_value), inputs)
                points.append(_scores(forward, perturbed, target_t, score, foil))
            curves[most_first] = torch.stack(points, dim=1)
        _require_same_image_scores(forward, inputs, target_t, score, curves, fractions, n_pixels, foil)
        if explained is not None:
            # the maps of another model (other weights) were ranked and scored on this one's confidences, silently
            logits = forward(inputs)
            logits = logits.logits if hasattr(logits, "logits") else logits
            refuse_explanation_of_another_model(attributions, logits.detach().to(at_least_float32(logits.dtype)),
                                                explained.to(logits.device), "attributions", "Pass the forward of "
                                                "the model the explanation was made with (or explain this model)",
                                                computed_in=logits.dtype)
    return PixelPerturbation(fractions=fractions, most_first=curves[True], least_first=curves[False],
                             foil=foil.cpu() if foil is not None else None)


def _pixel_count(fraction: float, n_pixels: int) -> int:
    """The pixels removed at ``fraction``: the text metrics' rule (:func:`share_counts`, at least one) for a fraction
    above 0, none at 0 (the unperturbed image every curve starts from)."""
    return 0 if fraction == 0 else int(share_counts(torch.tensor(n_pixels), fraction))


def _refuse_explanation_of_other_images(explanation, inputs: Tensor) -> None:
    """Refuse an image explanation of the package (its ``encoded`` images ``[x, 1 - x]``) made of other images than
    ``inputs``, given encoded (as ``attribution_input`` gives them) or as the pixels ``x`` themselves: the maps of
    one batch were ranked over another's pixels and its curves reported, silently."""
    encoded = getattr(explanation, "encoded", None) if not isinstance(explanation, Tensor) else None
    if not isinstance(encoded, Tensor) or encoded.ndim != 4 or encoded.shape[0] != inputs.shape[0] \
            or encoded.shape[2:] != inputs.shape[2:]:
        return
    if inputs.shape[1] == encoded.shape[1]:
        explained_images = encoded
    elif 2 * inputs.shape[1] == encoded.shape[1]:
        explained_images = encoded[:, :inputs.shape[1]]
    else:
        return  # another input space (e.g. a conventional model's): nothing to compare
    # within two units of the coarser dtype's rounding: the same images given in bfloat16 (a bfloat16 ViT's inputs, the
    # explanation made in float32) differ by one unit where the encoding's 1 - x rounds, and were refused as others
    coarse = max(torch.finfo(inputs.dtype).eps, torch.finfo(explained_images.dtype).eps) \
        if explained_images.is_floating_point() else 0.0
    other = ~torch.isclose(explained_images.to(inputs.device, inputs.dtype), inputs, rtol=max(1e-5, 2 * coarse),
                           atol=max(1e-6, 2 * coarse))
    if other.any():
        raise argument_error("inputs", f"are not the images the explanation was made of ({bad_rows(other)} differ)",
                             "Pass the explained images (attribution_input(model, images) of the same images)")


def _require_same_image_scores(forward: Callable, inputs: Tensor, target: Tensor, score: str, curves: dict[bool, Tensor],
                               fractions: tuple[float, ...], n_pixels: int, foil: Tensor | None = None) -> None:
    """Refuse a ``forward`` that scores the same images differently: a function around a model in training mode
    (``lambda e: model(encoded_pixel_values=e)``, which eval mode cannot reach) scores every perturbed image with
    dropout on, so the curves are noise. Where no pixel or every pixel is removed, both curves scored the same images;
    without such a fraction the unperturbed images are scored twice more."""
    same = [j for j, f in enumerate(fractions) if _pixel_count(f, n_pixels) in (0, n_pixels)]
    if same:
        first, second = curves[True][:, same], curves[False][:, same]
    else:
        first, second = (_scores(forward, inputs, target, score, foil) for _ in range(2))
    require_deterministic("forward", first, second, "images",
                          "Put the model in eval mode (model.eval()) before pixel_perturbation")
