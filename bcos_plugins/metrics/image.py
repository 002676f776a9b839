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
second. Summary: the *area between the curves* (ABC)::

    ABC = trapezoid(least_first - most_first, r) / (r_max - r_min)        (normalised: the mean gap)

reported per image; higher is better. ``k = round(r * H * W)`` pixels are removed at fraction ``r``. Ties
in the ranking (e.g. token-level maps such as attention rollout) are broken at random with a fixed seed,
not by pixel position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .perturbation import aopc

__all__ = ["IMAGE_FRACTIONS", "PixelPerturbation", "grid_pointing_game", "pixel_perturbation", "pixel_ranking"]

IMAGE_FRACTIONS: tuple[float, ...] = tuple(round(0.25 * i / 8, 6) for i in range(9))


def _spatial(attributions: Tensor, name: str = "attributions") -> Tensor:
    if attributions.ndim == 4:  # (batch, channels, H, W): per-pixel score = sum over channels
        return attributions.sum(dim=1)
    if attributions.ndim != 3:
        raise ValueError(f"{name} must be per-pixel maps (batch, H, W) or per-channel (batch, C, H, W); got "
                         f"{tuple(attributions.shape)}")
    return attributions


def grid_pointing_game(attributions: Float[Tensor, "batch h w"], cell: Int[Tensor, " batch"] | int,
                       grid: tuple[int, int] = (2, 2)) -> Float[Tensor, " batch"]:
    """Share of positive attribution inside the explained cell (row-major index) of each grid image."""
    maps = _spatial(attributions).detach()
    batch, height, width = maps.shape
    rows, cols = grid
    if height % rows or width % cols:
        raise ValueError(f"a {height}x{width} map cannot be split into a {rows}x{cols} grid of equal cells")
    cell_t = torch.as_tensor(cell, device=maps.device).to(torch.long)
    if cell_t.ndim == 0:
        cell_t = cell_t.expand(batch)
    if cell_t.shape != (batch,) or (cell_t < 0).any() or (cell_t >= rows * cols).any():
        raise ValueError(f"cell must be an int or (batch,) = ({batch},) indices in [0, {rows * cols}); got "
                         f"{cell_t.tolist()}")
    positive = maps.clamp_min(0)
    per_cell = positive.reshape(batch, rows, height // rows, cols, width // cols).sum(dim=(2, 4)).flatten(1)
    total = per_cell.sum(dim=1)
    inside = per_cell.gather(1, cell_t[:, None]).squeeze(1)
    return torch.where(total > 0, inside / total.clamp_min(torch.finfo(total.dtype).tiny), torch.zeros_like(total))


def pixel_ranking(attributions: Float[Tensor, "batch h w"], most_important_first: bool = True,
                  seed: int = 0) -> Int[Tensor, "batch hw"]:
    """Flat pixel indices in removal order; ties broken at random (fixed ``seed``)."""
    maps = _spatial(attributions).detach().flatten(1)
    g = torch.Generator().manual_seed(seed)
    shuffle = torch.stack([torch.randperm(maps.shape[1], generator=g) for _ in range(maps.shape[0])]).to(maps.device)
    shuffled = maps.gather(1, shuffle)
    order = torch.argsort(shuffled, dim=1, descending=most_important_first, stable=True)
    return shuffle.gather(1, order)


@dataclass
class PixelPerturbation:
    """Confidence curves ``(batch, n_fractions)`` and their summaries (see module docstring)."""

    fractions: tuple[float, ...]
    most_first: Float[Tensor, "batch n_fractions"]
    least_first: Float[Tensor, "batch n_fractions"]

    @property
    def area_between(self) -> Float[Tensor, " batch"]:
        """Normalised area between the least-first and most-first curves (higher = more faithful)."""
        return aopc(self.least_first - self.most_first, self.fractions, normalise=True)

    @property
    def area_most_first(self) -> Float[Tensor, " batch"]:
        """Normalised area under the most-important-first curve (lower = more faithful)."""
        return aopc(self.most_first, self.fractions, normalise=True)

    @property
    def area_least_first(self) -> Float[Tensor, " batch"]:
        """Normalised area under the least-important-first curve (higher = more faithful)."""
        return aopc(self.least_first, self.fractions, normalise=True)


def _scores(forward: Callable, inputs: Tensor, target: Tensor, score: str) -> Tensor:
    out = forward(inputs)
    logits = out.logits if hasattr(out, "logits") else out
    if score == "softmax":
        values = torch.softmax(logits, dim=-1)
    elif score == "sigmoid":
        values = torch.sigmoid(logits)
    else:
        values = logits
    return values.gather(1, target[:, None]).squeeze(1)


def pixel_perturbation(forward: Callable[[Tensor], Tensor], inputs: Float[Tensor, "batch c h w"],
                       attributions: Float[Tensor, "batch h w"], target: Int[Tensor, " batch"] | int,
                       fractions: Sequence[float] = IMAGE_FRACTIONS, removed_value: float = 0.0,
                       score: Literal["softmax", "sigmoid", "logit"] = "softmax", seed: int = 0) -> PixelPerturbation:
    """Confidence curves when removing pixels most / least important first.

    Args:
        forward: maps a batch of ``inputs`` to logits (or an output with ``.logits``); called without grad.
        inputs: the model's input, in the space where pixels are removed. For a B-cos ViT pass the encoded
            ``[x, 1 - x]`` images and ``lambda e: model(encoded_pixel_values=e)``: removal then zeroes the whole
            pixel encoding, as in the paper.
        attributions: per-pixel maps ``(batch, H, W)`` (or per channel, summed).
        target: class whose confidence is tracked (int or ``(batch,)``).
        fractions: increasing removal fractions in [0, 1] (default 9 points in [0, 0.25]).
        removed_value: value written to every channel of a removed pixel.
        score: ``"softmax"`` probability (default), ``"sigmoid"`` or raw ``"logit"`` of the target.
    """
    if inputs.ndim != 4:
        raise ValueError(f"inputs must be images (batch, C, H, W); got {tuple(inputs.shape)}")
    maps = _spatial(attributions)
    batch, _, height, width = inputs.shape
    if maps.shape != (batch, height, width):
        raise ValueError(f"attributions {tuple(maps.shape)} do not match the inputs' (batch, H, W) = "
                         f"{(batch, height, width)}")
    if score not in ("softmax", "sigmoid", "logit"):
        raise ValueError(f"score must be 'softmax', 'sigmoid' or 'logit'; got {score!r}")
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) < 2 or any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)) \
            or fractions[0] < 0 or fractions[-1] > 1:
        raise ValueError(f"fractions must be at least two increasing values in [0, 1]; got {list(fractions)}")
    target_t = torch.as_tensor(target, device=inputs.device).to(torch.long)
    if target_t.ndim == 0:
        target_t = target_t.expand(batch)
    if target_t.shape != (batch,):
        raise ValueError(f"target must be an int or have shape (batch,) = ({batch},); got {tuple(target_t.shape)}")
    n_pixels = height * width
    curves = {}
    with torch.no_grad():
        for most_first in (True, False):
            ranking = pixel_ranking(maps, most_important_first=most_first, seed=seed)
            rank_of_pixel = torch.empty_like(ranking).scatter_(1, ranking, torch.arange(n_pixels, device=ranking.device)
                                                               .expand(batch, -1).contiguous())
            points = []
            for fraction in fractions:
                k = int(round(fraction * n_pixels))
                removed = (rank_of_pixel < k).reshape(batch, 1, height, width)
                perturbed = torch.where(removed, torch.full_like(inputs, removed_value), inputs)
                points.append(_scores(forward, perturbed, target_t, score))
            curves[most_first] = torch.stack(points, dim=1)
    return PixelPerturbation(fractions=fractions, most_first=curves[True], least_first=curves[False])
