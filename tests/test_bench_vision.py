"""The vision benchmark's functions on tiny random ViTs: every method, its attribution maths, the metrics' wiring.

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

from bcos_plugins.vision import BcosViT, BcosViTConfig, ConventionalViT
from bcos_plugins.vision.data import make_grids

ROOT = Path(__file__).resolve().parents[1]
# Captum's note that it set requires_grad on the inputs itself: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")

SHAPE = dict(image_size=16, num_channels=1, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=32, tokenizer="conv", conv_channels=[4], num_labels=5)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vision", ROOT / "benchmarks" / "bench_vision.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_vision"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_vision", None)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    bcos = BcosViT(BcosViTConfig(**SHAPE, b=2.0, max_out=2, logit_scale=10.0)).eval()
    conventional = ConventionalViT(BcosViTConfig(**SHAPE)).eval()
    return {"bcos": bcos, "conventional": conventional}


@pytest.fixture(scope="module")
def images():
    torch.manual_seed(1)
    return torch.rand(3, 1, 16, 16), torch.tensor([0, 3, 4])


EXPECTED = {"bcos": {"B-cos W(x)x", "Attention (last layer)", "Rollout", "IntGrad (4 steps)", "IxG", "GradCAM",
                     "IntGrad (4 steps), pixels", "IxG, pixels"},
            "conventional": {"Attention (last layer)", "Rollout", "IntGrad (4 steps)", "IxG", "GradCAM"}}


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_every_method_gives_finite_pixel_maps_and_names_its_attribution_point(bench, models, images, kind):
    methods = bench.make_methods(models[kind], ig_steps=4)
    assert set(methods) == EXPECTED[kind]
    x, target = images
    for name, method in methods.items():
        maps = method.explain(x, target)
        assert maps.shape == (3, 16, 16), name
        assert torch.isfinite(maps).all(), name
        assert maps.abs().sum() > 0, name  # not a degenerate all-zero map
        assert method.point, name
        assert method.post_hoc == (name != "B-cos W(x)x")
    # gradient methods attribute where the perturbation edits: the encoding for B-cos, the pixels otherwise
    expected_point = "encoded image [x, 1-x]" if kind == "bcos" else "pixels"
    assert methods["IxG"].point == expected_point


def test_bcos_map_is_complete_it_sums_to_the_explained_logit(bench, models, images):
    model = models["bcos"]
    x, target = images
    maps = bench.make_methods(model)["B-cos W(x)x"].explain(x, target)
    with torch.no_grad():
        logits = model(pixel_values=x).logits
    torch.testing.assert_close(maps.sum(dim=(1, 2)), logits.gather(1, target[:, None]).squeeze(1), rtol=1e-4, atol=1e-5)


def test_input_x_gradient_at_the_encoding_and_at_the_pixels(bench, models, images):
    model = models["bcos"]
    x, target = images
    methods = bench.make_methods(model)
    encoded = model.encode(x).requires_grad_(True)
    logit = model(encoded_pixel_values=encoded).logits.gather(1, target[:, None]).sum()
    (grad,) = torch.autograd.grad(logit, encoded)
    torch.testing.assert_close(methods["IxG"].explain(x, target), (encoded * grad).sum(dim=1).detach())
    pixels = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(pixel_values=pixels).logits.gather(1, target[:, None]).sum(), pixels)
    torch.testing.assert_close(methods["IxG, pixels"].explain(x, target), (x * grad).sum(dim=1))


def test_integrated_gradients_on_the_bcos_vit_equals_input_x_gradient_it_is_homogeneous(bench, models, images):
    """B-cos layers are positively homogeneous (y(a x) = a y(x)), so IG from the zero encoding is exact IxG."""
    model = models["bcos"]
    x, target = images
    methods = bench.make_methods(model, ig_steps=4)
    encoded = model.encode(x)
    with torch.no_grad():
        logits = model(encoded_pixel_values=encoded).logits
        halved = model(encoded_pixel_values=0.5 * encoded).logits
    # up to the norm epsilons of the B-cos and LayerNorm layers
    assert (halved - 0.5 * logits).abs().max() < 1e-3 * logits.abs().max()
    ig, ixg = methods["IntGrad (4 steps)"].explain(x, target), methods["IxG"].explain(x, target)
    assert (ig - ixg).abs().max() < 1e-2 * ixg.abs().max()


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_last_layer_attention_is_the_mean_over_heads_and_queries_spread_over_patches(bench, models, images, kind):
    model = models[kind]
    x, target = images
    with torch.no_grad():
        last = model(pixel_values=x, output_attentions=True).attentions[-1]
    per_token = last.mean(dim=1)
    per_token = (per_token / per_token.sum(dim=-1, keepdim=True)).mean(dim=1).reshape(3, 4, 4)
    expected = per_token.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2)
    torch.testing.assert_close(bench.make_methods(model)["Attention (last layer)"].explain(x, target), expected)


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_gradcam_weights_each_token_feature_by_its_mean_gradient_over_tokens(bench, models, images, kind):
    """GradCAM by hand on the last block's tokens (batch, N, D): relu(sum_d mean_n(dy/dA_nd) * A_nd)."""
    model = models[kind]
    x, target = images
    inputs, forward = bench.model_input(model, x)
    captured = {}

    def keep(module, args, output):
        output[0].retain_grad()
        captured["tokens"] = output[0]

    handle = model.blocks[-1].register_forward_hook(keep)
    try:
        forward(inputs).gather(1, target[:, None]).sum().backward()
    finally:
        handle.remove()
    tokens = captured["tokens"]
    weights = tokens.grad.mean(dim=1, keepdim=True)
    cam = (weights * tokens).sum(dim=-1).clamp_min(0).detach().reshape(3, 4, 4)
    expected = cam.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2)
    torch.testing.assert_close(bench.make_methods(model)["GradCAM"].explain(x, target), expected)
    # the hook only reshapes: the model's output is unchanged while it is in place
    with torch.no_grad(), bench.token_grid_layer(model):
        inside = forward(inputs)
    with torch.no_grad():
        torch.testing.assert_close(inside, forward(inputs))


def test_pointing_scores_wire_each_cell_to_its_class(bench):
    # cell k of grid g holds the value (class + 1) / 10; an oracle method marks exactly those pixels
    digits = torch.stack([torch.full((1, 8, 8), (c + 1) / 10) for c in range(5)])
    grids, cells = make_grids(digits, torch.arange(5), torch.ones(5), n_grids=1, seed=0)
    oracle = bench.Method(lambda img, t: (img[:, 0] - ((t[:, None, None] + 1) / 10)).abs().lt(1e-6).double(), "test")
    uniform = bench.Method(lambda img, t: torch.ones_like(img[:, 0]), "test")
    wrong = bench.Method(lambda img, t: -oracle.explain(img, t), "test")
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


def test_perturbation_scores_and_the_written_table(bench, models, images, tmp_path):
    x, target = images
    rows = []
    for kind, name in (("bcos", "B-cos ViT"), ("conventional", "conventional ViT")):
        methods = bench.make_methods(models[kind], ig_steps=4)
        results = bench.perturbation_scores(models[kind], methods, x, target)
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
