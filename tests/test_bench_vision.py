"""The vision benchmark's functions on tiny random ViTs: data, the metrics' wiring, the written tables.

The methods' maths is tested in tests/test_vision_posthoc.py.

The benchmark trains two ViTs for minutes; here the same functions run on 2-layer random models, so a change
in Captum, in the models or in the metrics that breaks the script (or silently changes a method) fails a test.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from bcos_plugins.vision.data import make_grids
from bcos_plugins.vision.posthoc import ImageAttributionMethod, image_attribution_methods

ROOT = Path(__file__).resolve().parents[1]
# Captum's note that it set requires_grad on the inputs itself: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")



@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vision", ROOT / "benchmarks" / "bench_vision.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_vision"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_vision", None)


def test_pointing_scores_wire_each_cell_to_its_class(bench):
    # cell k of grid g holds the value (class + 1) / 10; an oracle method marks exactly those pixels
    digits = torch.stack([torch.full((1, 8, 8), (c + 1) / 10) for c in range(5)])
    grids, cells = make_grids(digits, torch.arange(5), torch.ones(5), n_grids=1, seed=0)
    oracle = ImageAttributionMethod(lambda img, t: (img[:, 0] - ((t[:, None, None] + 1) / 10)).abs().lt(1e-6).double(), "test")
    uniform = ImageAttributionMethod(lambda img, t: torch.ones_like(img[:, 0]), "test")
    wrong = ImageAttributionMethod(lambda img, t: -oracle.explain(img, t), "test")
    scores = bench.pointing_scores({"oracle": oracle, "uniform": uniform, "negative": wrong}, grids, cells)
    assert scores == {"oracle": 1.0, "uniform": 0.25, "negative": 0.0}


def test_grids_of_larger_digits_put_each_digit_in_its_own_cell(bench):
    digits = torch.stack([torch.full((1, 16, 16), (c + 1) / 10) for c in range(4)])
    grids, cells = make_grids(digits, torch.arange(4), torch.ones(4), n_grids=1, seed=0)
    assert grids.shape == (1, 1, 32, 32)
    for k in range(4):
        r, c = divmod(k, 2)
        assert torch.all(grids[0, 0, 16 * r:16 * (r + 1), 16 * c:16 * (c + 1)] == (cells[0, k] + 1) / 10)


def test_load_data_digits32_makes_32_pixel_canvases_of_16_pixel_digits(bench):
    data = bench.load_data("digits32")
    assert data.train.pixel_values.shape[1:] == (1, 32, 32)
    assert data.test.pixel_values.shape[1:] == (1, 32, 32)
    assert data.test_cells.shape[1:] == (1, 16, 16)
    assert len(data.test_cells) == len(data.test_labels) == len(data.test)
    assert 0 <= data.train.pixel_values.min() and data.train.pixel_values.max() <= 1
    assert bench.model_shape("digits32")["image_size"] == 32


def test_perturbation_scores_and_the_written_table(bench, tiny_vits, vit_images, tmp_path):
    x, target = vit_images
    rows = []
    for kind, name in (("bcos", "B-cos ViT"), ("conventional", "conventional ViT")):
        methods = image_attribution_methods(tiny_vits[kind], ig_steps=4)
        results = bench.perturbation_scores(tiny_vits[kind], methods, x, target)
        assert set(results) == set(methods)
        for method_name, (abc, seconds, curves) in results.items():
            assert math.isfinite(abc) and seconds > 0
            assert len(curves["most_first"]) == len(curves["least_first"]) == len(curves["fractions"]) == 9
            rows.append(bench.Row(name, method_name, methods[method_name].point, methods[method_name].post_hoc,
                                  0.5, abc, seconds, curves))
    cfg = bench.Config(out=tmp_path, n_perturb=3)
    info = {n: {"accuracy": 0.5, "grids": 1, "perturbed": 3, "train_seconds": 1.0}
            for n in ("B-cos ViT", "conventional ViT")}
    table = bench.write_outputs(rows, info, cfg)
    assert table == (tmp_path / "results.md").read_text().strip()
    method_lines = [line for line in table.splitlines() if line.count("|") == 9 and line.startswith("| B-cos ViT |")]
    assert len(method_lines) == 8  # one per method (the accuracy table has its own rows)
    assert "encoded image [x, 1-x] (exact)" in table and "last block's output tokens" in table
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["rows"]) == 13 and (tmp_path / "results.csv").exists()


def test_summary_and_ratios_against_the_best_post_hoc_method(bench):
    rows = [bench.Row("B-cos ViT", "B-cos W(x)x", "p", False, 0.6, 0.8, 0.1),
            bench.Row("B-cos ViT", "IxG", "p", True, 0.3, 0.2, 0.1),
            bench.Row("B-cos ViT", "Rollout", "p", True, 0.2, 0.4, 0.1),
            bench.Row("conventional ViT", "IxG", "p", True, 0.4, -0.1, 0.1)]
    s = bench.summary(rows)
    assert s["pointing"] == {"bcos": 0.6, "best_post_hoc_same_model": 0.3, "best_post_hoc_other_model": 0.4,
                             "best_post_hoc_any_model": 0.4}
    assert s["abc"] == {"bcos": 0.8, "best_post_hoc_same_model": 0.4, "best_post_hoc_other_model": -0.1,
                        "best_post_hoc_any_model": 0.4}
    assert bench.ratio(0.6, 0.3) == "2.00x"
    assert bench.ratio(0.8, -0.1) == "n/a" and bench.ratio(0.8, 0.0) == "n/a"  # no ratio to a non-positive score


def test_logit_bias_is_applied_in_the_loss_only(bench):
    # logits of log(C - 1) become 0 after the bias: every sigmoid is 1/2, so the BCE is log 2 for any label
    logits = torch.full((2, 5), math.log(4.0))
    loss = bench.bcos_loss_with_logit_bias(logits, torch.tensor([0, 3]))
    torch.testing.assert_close(loss, torch.tensor(math.log(2.0)))
    # an output object works as with bcos_loss (Trainer passes the model output)
    outputs = type("Out", (), {"logits": logits})()
    torch.testing.assert_close(bench.bcos_loss_with_logit_bias(outputs, torch.tensor([0, 3])), loss)


def test_digit_views_follow_the_scaled_up_fraction():
    from bcos_plugins.vision.data import DigitImages

    digits = torch.ones(6, 1, 8, 8)
    small = DigitImages(digits, torch.arange(6), size=16, views=2, scaled_up_fraction=0.0)
    full = DigitImages(digits, torch.arange(6), size=16, views=2, scaled_up_fraction=1.0)
    assert torch.all(small.pixel_values.sum(dim=(1, 2, 3)) == 64)  # one 8x8 digit of ones per canvas
    assert torch.all(full.pixel_values == 1)
    with pytest.raises(ValueError, match="scaled_up_fraction"):
        DigitImages(digits, torch.arange(6), scaled_up_fraction=1.5)
