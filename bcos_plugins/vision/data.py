"""Digit images and 2x2 digit grids made from scikit-learn's bundled 8x8 digits (no download).

- :func:`load_digits_split`: the 1797 digits of ``sklearn.datasets.load_digits`` as float images in [0, 1]
  ``(n, 1, 8, 8)``, split into train / test with a fixed seed (stratified).
- :class:`DigitImages`: a ``torch.utils.data.Dataset`` of ``size x size`` canvases (default 16) returning
  ``{"pixel_values", "labels"}`` (what transformers ``Trainer`` and its default collator expect). Each
  digit appears in ``views`` versions: scaled up to the whole canvas (a share ``scaled_up_fraction`` of
  them, half by default), or at its own size at a random position (so that a digit in one cell of a 2x2
  grid is an input the model has seen).
- :func:`make_grids`: 2x2 grids of four digits of different classes for the grid pointing game (paper
  §C.4.1): per class, images sorted by the model's confidence; each grid draws four distinct classes and
  takes, per class, the most confident image not used yet.

Digits are square images of any side ``s`` (8 for the originals; e.g. 16 after upsampling them): they sit
at their own size on a canvas and fill one cell of a ``2s x 2s`` grid.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from torch.utils.data import Dataset

from .._checks import require_bool, require_float, require_int, require_seed, require_tensor
from ..errors import argument_error

__all__ = ["DigitImages", "load_digits_split", "make_grids", "place_digits"]


def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(train_images, train_labels, test_images, test_labels)``; images ``(n, 1, 8, 8)`` in [0, 1]."""
    test_fraction = require_float("test_fraction", test_fraction, minimum=0.0, open_minimum=True)
    if test_fraction >= 1:
        raise argument_error("test_fraction", f"must lie in (0, 1), got {test_fraction}", "Pass e.g. 0.25")
    seed = require_seed("seed", seed, minimum=0, maximum=None)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # a stratified split needs every class on both sides: scikit-learn's refusal named its own train_size / test_size
    n, classes = len(digits.target), len(set(digits.target.tolist()))
    n_test = math.ceil(test_fraction * n)
    if n_test < classes or n - n_test < classes:
        raise argument_error("test_fraction", f"{test_fraction} leaves {n_test} test and {n - n_test} training digits; "
                             f"a stratified split needs at least one of each of the {classes} classes on both sides",
                             f"Pass a fraction in [{classes / n:.3f}, {1 - classes / n:.3f}], e.g. 0.25")
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32)[:, None]
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=test_fraction, random_state=seed,
                                           stratify=digits.target)
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]


def _checked_digits(digits: Tensor) -> Tensor:
    """``digits`` as the checked tensor the callers go on with (a list failed on ``.repeat`` after passing the check);
    a list is read in torch's default dtype, as the images feed a model."""
    digits = require_tensor("digits", digits, ndim=4, kind="float", shape_hint="(n, 1, s, s)",
                            list_dtype=torch.get_default_dtype())
    if digits.shape[-1] != digits.shape[-2] or digits.shape[-1] == 0:
        raise argument_error("digits", f"must be square images (n, 1, s, s), got shape {tuple(digits.shape)}",
                             "Pass load_digits_split()'s images (8x8) or a square resize of them")
    # a canvas has one channel: three failed inside the copy (a torch size mismatch)
    if digits.shape[1] != 1:
        raise argument_error("digits", f"have {digits.shape[1]} channels; digits are grey images (n, 1, s, s)",
                             "Pass one channel, e.g. digits.mean(1, keepdim=True)")
    # values outside [0, 1] were clipped in the scaled-up views only (bilinear resize, then clamp): one dataset of two
    # scales; the models refuse them anyway
    if digits.numel() and (float(digits.min()) < 0 or float(digits.max()) > 1):
        raise argument_error("digits", f"have values in [{float(digits.min()):.4g}, {float(digits.max()):.4g}]; digits "
                             "are images in [0, 1]", "Scale them, e.g. sklearn's digits.images / 16 (load_digits_split)")
    return digits


def place_digits(digits: Float[Tensor, "n 1 s s"], size: int, scale_up: Tensor,
                 offsets: Int[Tensor, "n 2"]) -> Float[Tensor, "n 1 size size"]:
    """Canvases ``size x size``: digit ``i`` fills it (bilinear) where ``scale_up[i]``, else sits at ``offsets[i]``."""
    size = require_int("size", size)
    digits = _checked_digits(digits)
    side = digits.shape[-1]
    if size < side:
        raise argument_error("size", f"canvas size {size} is smaller than the {side}x{side} digits",
                             f"Use size >= {side}")
    offsets = require_tensor("offsets", offsets, ndim=2, kind="int", shape_hint="(n, 2)")
    # flags, not probabilities: a float 0.4 read as True scaled the digit up
    scale_up = require_tensor("scale_up", scale_up, ndim=1, kind="bool", shape_hint="(n,)")
    if offsets.shape != (len(digits), 2) or len(scale_up) != len(digits):
        raise argument_error("offsets", f"need one (row, col) offset and one scale_up flag per digit ({len(digits)})",
                             "Pass them for every digit")
    if ((offsets < 0) | (offsets > size - side)).any():
        raise argument_error("offsets", f"must lie in [0, {size - side}] so that the digit fits the canvas",
                             f"Draw offsets with torch.randint(0, size - {side} + 1, ...)")
    canvas = torch.zeros(len(digits), 1, size, size, dtype=digits.dtype, device=digits.device)
    big = F.interpolate(digits, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    for i in range(len(digits)):
        if bool(scale_up[i]):
            canvas[i] = big[i]
        else:
            r, c = int(offsets[i, 0]), int(offsets[i, 1])
            canvas[i, :, r:r + side, c:c + side] = digits[i]
    return canvas


class DigitImages(Dataset):
    """``views`` canvases per digit (see module docstring); ``scaled_up_only`` gives one full-canvas view.

    ``scaled_up_fraction``: probability that a view fills the canvas (else the digit sits at its own size).
    """

    def __init__(self, digits: Float[Tensor, "n 1 s s"], labels: Int[Tensor, " n"], size: int = 16,
                 views: int = 2, scaled_up_only: bool = False, seed: int = 0,
                 scaled_up_fraction: float = 0.5) -> None:
        n = len(digits)
        # one integer class per digit: a list failed inside repeat, (n, 1) labels too, and float labels were served
        # as floats (the ViTs' losses refuse them only at the first training step)
        labels = require_tensor("labels", labels, ndim=1, kind="int", shape_hint="(n,)")
        if len(labels) != n:
            raise argument_error("labels", f"has {len(labels)} entries for {n} digits", "Pass one label per digit")
        views = require_int("views", views, minimum=1)
        scaled_up_fraction = require_float("scaled_up_fraction", scaled_up_fraction, minimum=0.0, maximum=1.0)
        digits = _checked_digits(digits)
        side = digits.shape[-1]
        size = require_int("size", size, minimum=side)
        seed = require_seed("seed", seed, minimum=0, maximum=None)  # (as load_digits_split: torch failed on a float, took -1)
        # a truthy string ("no") scaled every view up, silently
        scaled_up_only = require_bool("scaled_up_only", scaled_up_only)
        g = torch.Generator().manual_seed(seed)
        if scaled_up_only:
            views = 1
        repeated = digits.repeat(views, 1, 1, 1)
        scale_up = (torch.ones(n * views, dtype=torch.bool) if scaled_up_only
                    else torch.rand(n * views, generator=g) < scaled_up_fraction)
        offsets = torch.randint(0, size - side + 1, (n * views, 2), generator=g)
        self.pixel_values = place_digits(repeated, size, scale_up, offsets)
        self.labels = labels.repeat(views)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"pixel_values": self.pixel_values[i], "labels": self.labels[i]}


def make_grids(digits: Float[Tensor, "n 1 s s"], labels: Int[Tensor, " n"], confidence: Float[Tensor, " n"],
               n_grids: int, seed: int = 0, strict: bool = True) -> tuple[Float[Tensor, "g 1 2s 2s"], Int[Tensor, "g 4"]]:
    """2x2 grids of ``s x s`` digits of four different classes; returns grids and the class of each cell.

    Cells are in row-major order (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right). Only pass
    digits the model classifies correctly (and confidently); ``confidence`` ranks them within a class.
    If fewer than four classes still have unused images before ``n_grids`` grids are made, raises
    (``strict=True``) or returns the grids made so far (``strict=False``).
    """
    # one class and one finite confidence per digit: (n, 1) confidences ranked nothing (each class's digits were taken
    # in their order, silently), NaN ones ranked arbitrarily, and list labels failed inside the grouping
    labels = require_tensor("labels", labels, ndim=1, kind="int", shape_hint="(n,)")
    confidence = require_tensor("confidence", confidence, ndim=1, kind="real", shape_hint="(n,)")
    if not (len(digits) == len(labels) == len(confidence)):
        raise argument_error("labels", f"digits, labels and confidence must have the same length, got "
                             f"{len(digits)}, {len(labels)}, {len(confidence)}", "Pass one of each per digit")
    n_grids = require_int("n_grids", n_grids, minimum=1)
    # strict="False" read as True: refused on a shortage with a fix that said to pass strict=False
    strict = require_bool("strict", strict)
    digits = _checked_digits(digits)
    side = digits.shape[-1]
    rng = np.random.default_rng(require_seed("seed", seed, minimum=0, maximum=None))  # NumPy's refusal named no argument
    queues = {int(c): [int(i) for i in (labels == c).nonzero().flatten()[confidence[labels == c].argsort(descending=True)]]
              for c in labels.unique()}
    grids, cell_labels = [], []
    for _ in range(n_grids):
        available = [c for c, q in queues.items() if q]
        if len(available) < 4:
            if not strict and grids:
                break
            raise argument_error("n_grids", f"only {len(grids)} grids could be made: fewer than four classes have "
                                 "unused images", "Pass a smaller n_grids or more digits, or strict=False")
        classes = rng.choice(available, size=4, replace=False)
        # the digits' dtype and device (float64 digits were rounded to float32 grids)
        grid = torch.zeros(1, 2 * side, 2 * side, dtype=digits.dtype, device=digits.device)
        for cell, c in enumerate(classes):
            i = queues[int(c)].pop(0)
            r, col = divmod(cell, 2)
            grid[:, r * side:(r + 1) * side, col * side:(col + 1) * side] = digits[i]
        grids.append(grid)
        cell_labels.append(torch.as_tensor(classes, dtype=torch.long))
    return torch.stack(grids), torch.stack(cell_labels)
