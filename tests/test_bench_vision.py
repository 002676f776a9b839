"""The vision benchmark's functions on tiny random ViTs: data, the metrics' wiring, the written tables.

The methods' maths is tested in tests/test_vision_posthoc.py.

The benchmark trains two ViTs for minutes; here the same functions run on 2-layer random models, so a change
in Captum, in the models or in the metrics that breaks the script (or silently changes a method) fails a test.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from bcos_plugins.adapters.captum_vision import ImageAttributionMethod, image_attribution_methods

from bcos_plugins.vision.data import make_grids

# Captum's note that it set requires_grad on the inputs itself: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")



@pytest.fixture(scope="module")
def bench():
    from benchmarks import bench_vision

    return bench_vision


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
    assert bench.model_shape("digits16")["num_hidden_layers"] == 3
    assert bench.model_shape("digits16", layers=6)["num_hidden_layers"] == 6


def test_perturbation_scores_and_the_written_table(bench, tiny_vits, vit_images, tmp_path):
    x, target = vit_images
    rows = []
    for kind, name in (("bcos", "B-cos ViT"), ("conventional", "conventional ViT")):
        methods = image_attribution_methods(tiny_vits[kind], ig_steps=4)
        results = bench.perturbation_scores(tiny_vits[kind], methods, x, target)
        assert set(results) == set(methods)
        for method_name, (abc, seconds, curves, agreement, removal) in results.items():
            assert math.isfinite(abc) and seconds > 0
            assert len(curves["most_first"]) == len(curves["least_first"]) == len(curves["fractions"]) == 9
            # correlation with W(x)x: for the B-cos ViT's post-hoc rows only
            assert (agreement is not None) == (kind == "bcos" and methods[method_name].post_hoc)
            for a in filter(None, (agreement, removal)):  # NaN where every map is constant (a random GradCAM)
                assert all(math.isnan(v) or -1 <= v <= 1 for v in a.values())
            assert removal is not None
            rows.append(bench.Row(name, method_name, methods[method_name].point, methods[method_name].post_hoc,
                                  0.5, abc, seconds, curves, agreement, removal))
    cfg = bench.Config(out=tmp_path, n_perturb=3)
    info = {n: {"accuracy": 0.5, "grids": 1, "perturbed": 3, "train_seconds": 1.0}
            for n in ("B-cos ViT", "conventional ViT")}
    table = bench.write_outputs(rows, info, cfg)
    assert table == (tmp_path / "results.md").read_text().strip()
    method_lines = [line for line in table.splitlines() if line.count("|") == 11 and line.startswith("| B-cos ViT |")]
    assert len(method_lines) == 9  # one per method (the accuracy table has its own rows)
    assert "encoded image [x, 1-x] (exact)" in table and "last block's output tokens" in table
    assert "The paper's comparison, Rollout on the same B-cos ViT" in table
    assert "{" not in table  # every placeholder filled
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["rows"]) == 15 and (tmp_path / "results.csv").exists()


def test_perturbation_score_removal_and_normalisation_follow_the_arguments(bench, tiny_vits, vit_images):
    x, target = vit_images
    bcos, conventional = tiny_vits["bcos"], tiny_vits["conventional"]
    one = {"IxG": image_attribution_methods(bcos)["IxG"]}
    # "confidence" on the B-cos ViT: the sigmoid of the logit minus the training logit bias log(C - 1)
    forward, metric = bench.curve_forward(bcos, lambda e: bcos(encoded_pixel_values=e).logits, "confidence")
    encoded = bcos.encode(x)
    with torch.no_grad():
        torch.testing.assert_close(forward(encoded), bcos(encoded_pixel_values=encoded).logits
                                   - math.log(bcos.config.num_labels - 1))
    assert metric == "sigmoid" and bench.curve_forward(conventional, None, "confidence")[1] == "softmax"
    assert bench.curve_forward(bcos, None, "softmax")[1] == "softmax"
    # normalised ABC = unnormalised ABC / the mean unperturbed score, the same curves either way
    plain = bench.perturbation_scores(bcos, one, x, target, "softmax", 0.0, normalise=False)["IxG"]
    scaled = bench.perturbation_scores(bcos, one, x, target, "softmax", 0.0, normalise=True)["IxG"]
    assert scaled[2] == plain[2] and scaled[4] == plain[4]
    assert scaled[0] == pytest.approx(plain[0] / plain[2]["most_first"][0], rel=1e-5)
    # the removed value reaches the perturbed pixels: a different value, different curves
    conv_one = {"IxG": image_attribution_methods(conventional)["IxG"]}
    black = bench.perturbation_scores(conventional, conv_one, x, target, "softmax", 0.0)["IxG"][2]
    grey = bench.perturbation_scores(conventional, conv_one, x, target, "softmax", 0.5)["IxG"][2]
    assert black["most_first"][0] == grey["most_first"][0] and black["most_first"][1:] != grey["most_first"][1:]
    with pytest.raises(ValueError, match="score: 'prob' is not one of"):
        bench.curve_forward(bcos, None, "prob")


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("BENCH_VISION_SCORE", "prob", "BENCH_VISION_SCORE='prob': not one of 'confidence' or 'softmax' or 'logit'"),
    ("BENCH_VISION_REMOVAL", "grey", "BENCH_VISION_REMOVAL='grey': not one of 'mean' or 'black'"),
    ("BENCH_VISION_DATA", "digits64", "BENCH_VISION_DATA='digits64': not one of 'digits16' or 'digits32'"),
    ("BENCH_VISION_NORMALISE", "yes", "BENCH_VISION_NORMALISE='yes': not a switch. Set BENCH_VISION_NORMALISE to "
                                      "1 (on) or 0 (off), or unset it for the default 1."),
    # before, anything but 1 silently kept the cached models
    ("BENCH_VISION_RETRAIN", "yes", "BENCH_VISION_RETRAIN='yes': not a switch. Set BENCH_VISION_RETRAIN to "
                                    "1 (on) or 0 (off), or unset it for the default 0."),
    ("BENCH_VISION_LAYERS", "0", "BENCH_VISION_LAYERS='0': out of range (must be >= 1). Set BENCH_VISION_LAYERS to "
                                 "a whole number >= 1, e.g. BENCH_VISION_LAYERS=3, or unset it for the default 3."),
    ("BENCH_VISION_LAYERS", "two", "BENCH_VISION_LAYERS='two': not a whole number"),
    ("BENCH_VISION_EPOCHS", "12.5", "BENCH_VISION_EPOCHS='12.5': not a whole number"),
    ("BENCH_VISION_THREADS", "-1", "BENCH_VISION_THREADS='-1': out of range (must be >= 0)"),
    ("BENCH_VISION_FULL_FRACTION", "25%", "BENCH_VISION_FULL_FRACTION='25%': not a number"),
    ("BENCH_VISION_FULL_FRACTION", "1.5", "BENCH_VISION_FULL_FRACTION='1.5': out of range (must be >= 0 and <= 1)"),
])
def test_bad_variables_stop_with_the_variable_value_and_fix(bench, monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as excinfo:
        bench.Config.from_env()
    assert str(excinfo.value).startswith(message)


def test_default_protocol_is_the_papers_and_the_earlier_one_stays_reachable(bench, monkeypatch):
    for name in ("BENCH_VISION_SCORE", "BENCH_VISION_REMOVAL", "BENCH_VISION_NORMALISE"):
        monkeypatch.delenv(name, raising=False)
    cfg = bench.Config.from_env()
    assert (cfg.score, cfg.removal, cfg.normalise) == ("confidence", "mean", True)
    for name, value in (("BENCH_VISION_SCORE", "softmax"), ("BENCH_VISION_REMOVAL", "black"),
                        ("BENCH_VISION_NORMALISE", "0")):
        monkeypatch.setenv(name, value)
    cfg = bench.Config.from_env()
    assert (cfg.score, cfg.removal, cfg.normalise) == ("softmax", "black", False)


def test_unset_variables_give_the_config_defaults_and_set_ones_reach_the_config(bench, monkeypatch):
    for name in [n for n in os.environ if n.startswith("BENCH_VISION_")]:
        monkeypatch.delenv(name)
    assert bench.Config.from_env() == bench.Config()
    values = {"DATA": "digits32", "EPOCHS": "2", "BASELINE_EPOCHS": "3", "GRIDS": "4", "PERTURB": "5",
              "IG_STEPS": "6", "LAYERS": "2", "SCORE": "logit", "REMOVAL": "black", "NORMALISE": "0", "VIEWS": "1",
              "FULL_FRACTION": "1", "THREADS": "0", "SEED": "7", "OUT": "elsewhere", "RETRAIN": "1"}
    for name, value in values.items():
        monkeypatch.setenv(f"BENCH_VISION_{name}", value)
    assert bench.Config.from_env() == bench.Config(
        data="digits32", epochs=2, baseline_epochs=3, n_grids=4, n_perturb=5, ig_steps=6, layers=2, score="logit",
        removal="black", normalise=False, views=1, full_fraction=1.0, threads=0, seed=7, out=Path("elsewhere"),
        retrain=True)


def test_removal_effects_are_each_pixels_exact_contribution_on_a_linear_model(bench):
    torch.manual_seed(0)
    w = torch.randn(2, 3, 4, 4)  # 2 classes, 3 channels

    def forward(x):
        return torch.einsum("bchw,kchw->bk", x, w)

    x, labels = torch.rand(5, 3, 4, 4), torch.tensor([0, 1, 1, 0, 1])
    # removing pixel p (every channel to 0) drops the logit by sum_c w_c x_c at p: input x gradient, exactly
    torch.testing.assert_close(bench.removal_effects(forward, x, labels), (w[labels] * x).sum(dim=1))
    # with another removed value the drop is sum_c w_c (x_c - v)
    torch.testing.assert_close(bench.removal_effects(forward, x, labels, 0.5), (w[labels] * (x - 0.5)).sum(dim=1))


def test_map_agreement_is_one_for_the_same_ranking_and_undefined_for_a_constant_map(bench):
    torch.manual_seed(0)
    reference = torch.randn(3, 4, 4)
    same = bench.map_agreement(2 * reference + 1, reference)
    assert same["pearson"] == pytest.approx(1.0) and same["spearman"] == pytest.approx(1.0)
    # a monotone but non-linear transform keeps the ranking (Spearman 1) but not the values (Pearson < 1)
    cubed = bench.map_agreement(reference**3, reference)
    assert cubed["spearman"] == pytest.approx(1.0) and cubed["pearson"] < 0.99
    flipped = bench.map_agreement(-reference, reference)
    assert flipped["pearson"] == pytest.approx(-1.0) and flipped["spearman"] == pytest.approx(-1.0)
    # one constant image is left out of the mean; an all-constant batch has no correlation at all
    partly = torch.cat([reference[:2], torch.zeros(1, 4, 4)])
    assert bench.map_agreement(partly, reference)["pearson"] == pytest.approx(1.0)
    assert math.isnan(bench.map_agreement(torch.zeros(3, 4, 4), reference)["spearman"])


def test_confidence_ranking_does_not_tie_where_the_confidence_rounds_to_one(bench, tiny_vits):
    logits = torch.tensor([[40.0, 0.0, -5.0], [30.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    bcos, conventional = tiny_vits["bcos"], tiny_vits["conventional"]
    # softmax of the first two rows is 1.0 in float32: the earlier protocol ties them ...
    assert bench.confidence_ranking(bcos, logits, "softmax")[:2].tolist() == [1.0, 1.0]
    # ... the paper's confidence orders them (logit for the B-cos ViT, softmax margin for the conventional ViT)
    for model in (bcos, conventional):
        key = bench.confidence_ranking(model, logits, "confidence")
        assert key[0] > key[1] > key[2]
    # the margin is the softmax's logit: sigmoid(margin) = softmax of the predicted class
    margin = bench.confidence_ranking(conventional, logits[2:], "confidence")
    torch.testing.assert_close(margin.sigmoid(), logits[2:].softmax(-1).max(-1).values)


def test_summary_and_ratios_against_the_best_post_hoc_method(bench):
    rows = [bench.Row("B-cos ViT", "B-cos W(x)x", "p", False, 0.6, 0.8, 0.1),
            bench.Row("B-cos ViT", "IxG", "p", True, 0.3, 0.2, 0.1),
            bench.Row("B-cos ViT", "Rollout", "p", True, 0.2, 0.4, 0.1),
            bench.Row("conventional ViT", "IxG", "p", True, 0.4, -0.1, 0.1)]
    s = bench.summary(rows)
    assert s["pointing"] == {"bcos": 0.6, "best_post_hoc_same_model": 0.3, "best_post_hoc_other_model": 0.4,
                             "best_post_hoc_any_model": 0.4, "rollout_same_model": 0.2}
    assert s["abc"] == {"bcos": 0.8, "best_post_hoc_same_model": 0.4, "best_post_hoc_other_model": -0.1,
                        "best_post_hoc_any_model": 0.4, "rollout_same_model": 0.4}
    assert bench.best_method(rows, "pointing", same_model=True) == "IxG"
    assert bench.best_method(rows, "abc", same_model=True) == "Rollout"
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


def test_a_not_measured_score_is_never_the_best_post_hoc_method(bench):
    nan = float("nan")
    rows = [bench.Row("B-cos ViT", "B-cos W(x)x", "p", False, 0.6, 0.8, 0.1),
            bench.Row("B-cos ViT", "GradCAM", "p", True, nan, nan, 0.1),  # first in line, as max met it
            bench.Row("B-cos ViT", "IxG", "p", True, 0.3, 0.2, 0.1),
            bench.Row("B-cos ViT", "Rollout", "p", True, 0.2, 0.4, 0.1),
            bench.Row("conventional ViT", "IxG", "p", True, 0.4, -0.1, 0.1)]
    assert bench.best_method(rows, "pointing", same_model=True) == "IxG"
    assert bench.best_method(rows, "abc", same_model=True) == "Rollout"
    assert bench.summary(rows)["pointing"]["best_post_hoc_same_model"] == 0.3
    nothing_measured = bench.best_post_hoc([rows[0], rows[1]], "pointing", lambda r: True)
    assert nothing_measured.method == "GradCAM" and math.isnan(nothing_measured.pointing)  # NaN, not made up
