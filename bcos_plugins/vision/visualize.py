"""Pictures of B-cos explanations (paper §3.1 and §C.3), with matplotlib.

- :func:`weight_colour_image`: the explained row ``W_c(x~)`` shown in colour. The input encoding
  ``[x, 1 - x]`` makes a pixel's colour a function of the angle of its 2C-vector alone, so a weight vector
  that aligns with pixels can be read back as a colour: per pixel, scale the 2C weights by their largest
  magnitude, keep the positive part, and take ``w_c / (w_c + w_{C+c})`` as colour channel ``c``. Opacity is
  the weight norm (relative to a high percentile over the image), and only pixels whose contribution is
  positive are shown. Grey-scale models (C = 1) give grey colours.
- :func:`contribution_map`: contributions clipped to ``[-v, v]`` with ``v`` the 99.9th percentile of their
  absolute values (paper §C.3), for a blue-white-red colour map.
- :func:`save_explanation_figure`: image / contributions / colour row of ``W(x)``, per example, as a PNG (or the
  format of the path's suffix).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_float, require_same_shape, require_tensor
from ..errors import BcosTypeError, argument_error

__all__ = ["contribution_map", "save_explanation_figure", "weight_colour_image"]


def weight_colour_image(weights: Float[Tensor, "two_c h w"], contributions: Float[Tensor, "h w"],
                        alpha_percentile: float = 99.5) -> np.ndarray:
    """RGBA image ``(H, W, 4)`` in [0, 1] of one ``W(x)`` row; see the module docstring."""
    weights = require_tensor("weights", weights, ndim=3, kind="float", shape_hint="(2C, H, W)")
    if weights.shape[0] % 2 != 0:
        raise argument_error("weights", f"weights must have shape (2C, H, W) (the encoded channels), got "
                             f"{tuple(weights.shape)}", "Pass ImageExplanation.weights[i]")
    contributions = require_tensor("contributions", contributions, ndim=2, kind="float", shape_hint="(H, W)")
    require_same_shape("contributions", contributions, "each channel of weights", weights[0],
                       "Pass the same image's map")
    alpha_percentile = require_float("alpha_percentile", alpha_percentile, minimum=0.0, maximum=100.0)
    w = weights.detach().double().cpu()
    c = w.shape[0] // 2
    # each pixel over its own largest magnitude, whatever it is: floored at 1e-12, weights below it (a float64 B-cos
    # model at a large B, float32 ones too) were drawn in other colours (black where the hue was full); after it the
    # floor below is relative to the pixel's largest weight (1), as it always was for weights above 1e-12
    largest = w.abs().amax(dim=0, keepdim=True)
    scaled = (w / torch.where(largest > 0, largest, torch.ones_like(largest))).clamp_min(0)
    colour = scaled[:c] / (scaled[:c] + scaled[c:]).clamp_min(1e-12)
    if c == 1:
        colour = colour.expand(3, -1, -1)
    elif c != 3:
        raise argument_error("weights", f"encode {c} input channels (2C = {2 * c}); a colour image needs 1 or 3",
                             "Pass the weights of a grey or RGB image, or show its map with contribution_map")
    # the opacity is relative too: the norm's squares underflowed for weights of 1e-200 (a transparent picture)
    overall = w.abs().max()
    strength = (w / overall if overall > 0 else w).norm(dim=0)
    strength = torch.where(contributions.detach().double().cpu() > 0, strength, torch.zeros_like(strength))
    top = float(np.percentile(strength.numpy(), alpha_percentile))
    alpha = (strength / top).clamp(0, 1) if top > 0 else torch.zeros_like(strength)
    return torch.cat([colour, alpha[None]], dim=0).permute(1, 2, 0).numpy()


def contribution_map(contributions: Float[Tensor, "h w"], percentile: float = 99.9) -> tuple[np.ndarray, float]:
    """``(clipped map, v)`` with the map clipped to ``[-v, v]``, ``v`` the percentile of ``|contributions|``."""
    # one map: a batch (n, H, W) was clipped at one v for all its maps (the paper clips each map at its own), and a
    # boolean mask was drawn as contributions 0 and 1, silently
    contributions = require_tensor("contributions", contributions, ndim=2, kind="real", shape_hint="(H, W)")
    if contributions.dtype == torch.bool:
        raise argument_error("contributions", "is a boolean tensor, not contributions",
                             "Pass an explanation's map, e.g. explanation.contributions[i]", kind=BcosTypeError)
    percentile = require_float("percentile", percentile, minimum=0.0, maximum=100.0)
    values = contributions.detach().double().cpu().numpy()
    v = float(np.percentile(np.abs(values), percentile))
    v = v if v > 0 else 1.0
    return np.clip(values, -v, v), v


def _check_figure_inputs(images, columns, colour_rows, row_titles) -> None:
    """Refuse what :func:`save_explanation_figure` would draw wrongly, naming it: it checked nothing, so four channels
    were drawn as RGBA (the fourth as transparency), NaN maps as blank panels and images in [0, 255] saturated, each
    saved without a word, and two channels or a missing map failed inside matplotlib or torch."""
    images = require_tensor("images", images, ndim=4, kind="float", shape_hint="(n, C, H, W)")
    n, channels = images.shape[:2]
    if n == 0:
        raise argument_error("images", "is an empty batch", "Pass at least one image")
    if channels not in (1, 3):
        # channels-last images and an explanation's [x, 1 - x] encoding were told to keep one channel or three
        fix = ("Channels last? Pass images.permute(0, 3, 1, 2)" if images.shape[-1] in (1, 3)
               else f"The [x, 1 - x] encoding (explanation.encoded)? Pass the images, encoded[:, :{channels // 2}]"
               if channels in (2, 6) else "Pass one channel (images[:, :1]) or three")
        raise argument_error("images", f"has {channels} channels; the figure draws grey (1) or RGB (3) images", fix)
    low, high = float(images.min()), float(images.max())
    if low < -1e-4 or high > 1 + 1e-4:  # the tolerance of the models' own input check (vision.encoding)
        raise argument_error("images", f"has values in [{low:.4g}, {high:.4g}], drawn on [0, 1]",
                             "Pass the images in [0, 1] (as the model takes them), e.g. images / 255")
    if not isinstance(columns, Mapping):
        raise argument_error("columns", f"must map a method name to its maps, got {type(columns).__name__}",
                             "Pass e.g. {'W(x)x': explanation.contributions}", kind=BcosTypeError)
    for name, maps in columns.items():
        where = f"columns[{name!r}]"
        if hasattr(maps, "contributions") and not isinstance(maps, Tensor):  # an ImageExplanation: "has no maps"
            raise argument_error(where, f"is an explanation ({type(maps).__name__}), not its maps",
                                 f"Pass its per-pixel maps: {{{name!r}: explanation.contributions}}", kind=BcosTypeError)
        if not hasattr(maps, "__len__") or len(maps) != n:
            raise argument_error(where, f"has {len(maps) if hasattr(maps, '__len__') else 'no'} maps for {n} images",
                                 "Pass one (H, W) map per image")
        for i in range(n):
            m = require_tensor(where, maps[i], ndim=2, kind="real", shape_hint="(H, W) per image")
            # imshow stretches a map over its panel: one of another size (a rollout spread with another patch_size)
            # was drawn over the image as if its pixels were the image's, silently
            require_same_shape(f"{where}[{i}]", m, f"image {i}'s (H, W)", images[i, 0],
                               "Pass maps of the images' size (for attention_rollout, the model's patch_size)")
    if isinstance(row_titles, str):  # one title per character: "ab" titled two rows "a" and "b"
        raise argument_error("row_titles", f"got one string ({row_titles[:40]!r}); each character would title a row",
                             "Pass a list of titles, one per image", kind=BcosTypeError)
    for name, rows in (("colour_rows", colour_rows), ("row_titles", row_titles)):
        if rows is not None and len(rows) != n:
            what = "titles" if name == "row_titles" else "colour images"
            raise argument_error(name, f"has {len(rows)} {what} for {n} images", "Pass one per image, or none")
    for i in range(n if colour_rows is not None else 0):
        # imshow stretches a colour image over its panel, as a map: one of another image (another size) was drawn
        # beside this one as its W(x) row, silently
        shape = tuple(np.shape(colour_rows[i]))
        if len(shape) != 3 or shape[2] not in (3, 4) or shape[:2] != tuple(images.shape[2:]):
            raise argument_error(f"colour_rows[{i}]", f"has shape {shape}; image {i} needs an (H, W, 4) colour image "
                                 f"of its size {tuple(images.shape[2:])}",
                                 "Pass weight_colour_image(explanation.weights[i], explanation.contributions[i]) of "
                                 "the same images")
        # a NaN colour drew as a transparent (blank) panel and values beyond [0, 1] were clipped by imshow with a log
        # line alone; weight_colour_image's colours and opacities lie in [0, 1]
        values = np.asarray(colour_rows[i], dtype=np.float64)
        if not (np.isfinite(values).all() and values.min() >= 0 and values.max() <= 1):
            raise argument_error(f"colour_rows[{i}]", f"has values in [{np.nanmin(values):.4g}, {np.nanmax(values):.4g}]"
                                 f"{' and NaN' if np.isnan(values).any() else ''}; a colour image is drawn on [0, 1]",
                                 "Pass weight_colour_image(explanation.weights[i], explanation.contributions[i]) (its "
                                 "values lie in [0, 1])")


def _figure_file(path) -> tuple[Path, str]:
    """The file :func:`save_explanation_figure` writes and its format, checked before the figure is drawn: matplotlib
    wrote ``<path>.png`` for a path without a suffix (an existing folder's too, beside it) while the path itself was
    returned, and refused an unknown suffix, or pathlib a path of another type, only after the figure was drawn,
    naming no argument."""
    from matplotlib.backend_bases import FigureCanvasBase

    if not isinstance(path, str | os.PathLike):
        raise argument_error("path", f"must be a file path (str or pathlib.Path), got {type(path).__name__} {path!r}",
                             "Pass e.g. 'explanations.png'", kind=BcosTypeError)
    path = Path(path)
    if path.is_dir():
        raise argument_error("path", f"{path} is a folder", f"Pass a file path, e.g. {path / 'explanations.png'}")
    if not path.suffix:  # matplotlib's default, written to the name returned
        path = path.with_name(path.name + ".png")
    file_format = path.suffix[1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if file_format not in formats:
        raise argument_error("path", f"{path.name} ends in {path.suffix!r}, not a format matplotlib writes",
                             f"End it in one of {sorted(formats)} (e.g. .png)")
    return path, file_format


def save_explanation_figure(path: str | Path, images: Float[Tensor, "n c h w"],
                            columns: dict[str, Sequence[Tensor] | Tensor],
                            colour_rows: Sequence[np.ndarray] | None = None,
                            row_titles: Sequence[str] | None = None) -> Path:
    """Save a grid: one row per image; the image, then one column per named attribution map.

    ``columns`` maps a method name to ``(n, H, W)`` maps (a column with a negative value in any of its maps uses
    blue-white-red in every row, clipped per map; columns that are never negative, e.g. rollout, use a sequential
    colour map). ``colour_rows`` adds the
    :func:`weight_colour_image` of each row as the last column.

    The format is the suffix of ``path`` (PNG for a path without one, written to ``<path>.png``); an existing file is
    overwritten and missing folders are made. Returns the path of the file written.
    """
    _check_figure_inputs(images, columns, colour_rows, row_titles)
    path, file_format = _figure_file(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = images.shape[0]
    # signed or not per column, not per map: a signed method's map that happens to have no negative pixel was drawn
    # in jet, whose blue (the smallest positive share there) is "opposes" in the same column's other rows (bwr)
    signed = {name: any(bool((torch.as_tensor(maps[i]) < 0).any()) for i in range(n)) for name, maps in columns.items()}
    n_cols = 1 + len(columns) + (colour_rows is not None)
    fig, axes = plt.subplots(n, n_cols, figsize=(1.6 * n_cols, 1.6 * n), squeeze=False)
    for i in range(n):
        # drawn from float64 values (NumPy has no bfloat16: a bfloat16 image or map failed inside .numpy())
        img = images[i].detach().cpu().double()
        img = (img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)).numpy()
        axes[i, 0].imshow(img, cmap="gray", vmin=0, vmax=1)
        for j, (name, maps) in enumerate(columns.items(), start=1):
            m = torch.as_tensor(maps[i]).detach().cpu().double()
            if signed[name]:
                clipped, v = contribution_map(m)
                axes[i, j].imshow(clipped, cmap="bwr", vmin=-v, vmax=v)
            else:
                axes[i, j].imshow(m.numpy(), cmap="jet")
            if i == 0:
                axes[i, j].set_title(name, fontsize=8)
        if colour_rows is not None:
            axes[i, -1].imshow(np.zeros(colour_rows[i].shape[:2]), cmap="gray", vmin=0, vmax=1)
            axes[i, -1].imshow(colour_rows[i])
            if i == 0:
                axes[i, -1].set_title("W(x) row", fontsize=8)
        if row_titles is not None:
            axes[i, 0].set_ylabel(row_titles[i], fontsize=8)
        if i == 0:
            axes[i, 0].set_title("image", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, format=file_format)
    finally:  # (a figure left open on an error stays in pyplot's list for the rest of the process)
        plt.close(fig)
    return path
