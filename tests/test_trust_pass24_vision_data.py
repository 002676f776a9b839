"""Trust pass 24, vision, data, the corpus and the renderings (helper-178): unusual inputs that earlier passes did not
try, each pinned where it was silently wrong or an unhelpful crash (every test here failed before its fix)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.vision.visualize import save_explanation_figure


def _figure_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.rand(2, 1, 8, 8, dtype=dtype), {"W(x)x": torch.randn(2, 8, 8, dtype=dtype)}


def test_save_explanation_figure_returns_the_file_it_wrote_for_a_path_without_a_suffix(tmp_path):
    # matplotlib writes "figure.png" for the path "figure": the returned path named a file that does not exist
    images, columns = _figure_inputs()
    written = save_explanation_figure(tmp_path / "figure", images, columns)
    assert written == tmp_path / "figure.png"
    assert written.is_file() and not (tmp_path / "figure").exists()


def test_save_explanation_figure_refuses_a_folder_an_unknown_format_or_a_path_of_another_type(tmp_path):
    images, columns = _figure_inputs()
    # an existing folder: matplotlib wrote "<folder>.png" beside it and the folder's own path was returned
    with pytest.raises(BcosValueError, match=r"path: .*is a folder.*Pass a file path"):
        save_explanation_figure(tmp_path, images, columns)
    assert not tmp_path.with_name(tmp_path.name + ".png").exists()
    # refused before the figure is drawn, naming the argument (was matplotlib's ValueError after drawing it)
    with pytest.raises(BcosValueError, match=r"path: .*'\.txt'.*png"):
        save_explanation_figure(tmp_path / "figure.txt", images, columns)
    # was TypeError "expected str, bytes or os.PathLike object, not int" from pathlib, after drawing
    with pytest.raises(BcosTypeError, match=r"path: must be a file path"):
        save_explanation_figure(3, images, columns)
    assert list(tmp_path.iterdir()) == []


def test_save_explanation_figure_draws_half_precision_images_and_maps_as_their_float32_values(tmp_path):
    # bfloat16 images and maps failed inside NumPy ("Got unsupported ScalarType BFloat16"); float16 ones drew
    for dtype in (torch.bfloat16, torch.float16):
        images, columns = _figure_inputs(dtype)
        unsigned = {"rollout": torch.rand(2, 8, 8, dtype=dtype)}
        for cols in (columns, unsigned):
            written = save_explanation_figure(tmp_path / f"{dtype}.png", images, cols)
            reference = save_explanation_figure(tmp_path / "float32.png", images.float(),
                                                {k: v.float() for k, v in cols.items()})
            assert written.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("value", [float("nan"), 2.0, -0.5])
def test_save_explanation_figure_refuses_colour_rows_outside_0_1(tmp_path, value):
    # a NaN colour row drew as a blank (transparent) panel, values beyond [0, 1] were clipped by imshow (a log line);
    # weight_colour_image's rows lie in [0, 1]
    images, columns = _figure_inputs()
    rows = [np.full((8, 8, 4), 0.5), np.full((8, 8, 4), 0.5)]
    rows[1][3, 4, 0] = value
    with pytest.raises(BcosValueError, match=r"colour_rows\[1\]: .*\[0, 1\].*weight_colour_image"):
        save_explanation_figure(tmp_path / "f.png", images, columns, colour_rows=rows)
