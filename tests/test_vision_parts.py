"""B-cos ViT surroundings: digits data and grids, conventional baseline, attention rollout, colour
visualisation, and training with transformers' Trainer."""

from __future__ import annotations

import numpy as np
import torch
from test_vision import images, tiny_vit
from transformers import Trainer, TrainingArguments

from bcos_plugins.train import bcos_loss
from bcos_plugins.vision import BcosViTConfig, ConventionalViT, attention_rollout, explain_image
from bcos_plugins.vision.data import DigitImages, load_digits_split, make_grids, place_digits
from bcos_plugins.vision.visualize import contribution_map, save_explanation_figure, weight_colour_image


def test_digits_split_and_views():
    train, train_y, test, test_y = load_digits_split()
    assert train.shape[1:] == (1, 8, 8) and len(train) + len(test) == 1797
    assert 0.0 <= float(train.min()) and float(train.max()) <= 1.0
    assert set(test_y.tolist()) == set(range(10))
    data = DigitImages(train[:20], train_y[:20], size=16, views=3, seed=0)
    assert len(data) == 60
    item = data[21]
    assert item["pixel_values"].shape == (1, 16, 16) and int(item["labels"]) == int(train_y[1])
    full = DigitImages(train[:5], train_y[:5], scaled_up_only=True)
    assert len(full) == 5 and (full.pixel_values.flatten(1).amax(1) > 0).all()
    # a digit placed at its own size sits unchanged at its offset, the rest of the canvas is black
    placed = place_digits(train[:1], 16, torch.tensor([False]), torch.tensor([[3, 5]]))
    assert torch.equal(placed[0, :, 3:11, 5:13], train[0]) and placed.sum() == train[0].sum()


def test_make_grids_takes_the_most_confident_unused_digit_of_four_distinct_classes():
    digits = torch.arange(40, dtype=torch.float32).reshape(40, 1, 1, 1).expand(40, 1, 8, 8) / 40
    labels = torch.arange(40) % 5
    confidence = torch.linspace(0, 1, 40)  # later digits are more confident
    grids, cells = make_grids(digits, labels, confidence, n_grids=3, seed=0)
    assert grids.shape == (3, 1, 16, 16) and cells.shape == (3, 4)
    used = []
    for g in range(3):
        assert len(set(cells[g].tolist())) == 4
        for cell in range(4):
            r, c = divmod(cell, 2)
            value = grids[g, 0, r * 8, c * 8].item()
            index = round(value * 40)
            assert labels[index] == cells[g, cell]
            assert torch.equal(grids[g, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8], digits[index])
            used.append(index)
    assert len(set(used)) == len(used)
    # the first time a class is drawn, its most confident digit is used
    first = {}
    for g in range(3):
        for cell in range(4):
            first.setdefault(int(cells[g, cell]), used[4 * g + cell])
    for cls, index in first.items():
        assert index == max(i for i in range(40) if labels[i] == cls)


def test_make_grids_errors():
    digits = torch.zeros(6, 1, 8, 8)
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    import pytest

    with pytest.raises(ValueError, match="only 1 grids could be made"):
        make_grids(digits, labels, torch.ones(6), n_grids=2)
    with pytest.raises(ValueError, match="same length"):
        make_grids(digits, labels[:5], torch.ones(6), n_grids=1)


def test_conventional_vit_has_the_same_shape():
    config = BcosViTConfig(image_size=8, num_channels=1, patch_size=4, hidden_size=8, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=16, num_labels=3, conv_channels=[4])
    torch.manual_seed(0)
    model = ConventionalViT(config).eval()
    bcos = tiny_vit("conv", "additive")
    x = images(batch=2).float()
    out = model(pixel_values=x, labels=torch.tensor([0, 2]), output_attentions=True)
    reference = bcos(pixel_values=x.double(), output_attentions=True)
    assert out.logits.shape == reference.logits.shape == (2, 3)
    assert [a.shape for a in out.attentions] == [a.shape for a in reference.attentions]
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 2])))
    for a in out.attentions:
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))


def test_attention_rollout_on_hand_built_attention():
    n = 4
    # attention that only looks at itself: every token equally relevant, spread over its 2x2 patch
    identity = torch.eye(n).expand(1, 2, n, n)
    torch.testing.assert_close(attention_rollout([identity, identity], patch_size=2), torch.full((1, 4, 4), 0.25))
    # every query attends to token 0: token 0 collects the most relevance; 0.5 attention + 0.5 residual
    to_first = torch.zeros(1, 1, n, n)
    to_first[..., 0] = 1.0
    one_layer = attention_rollout([to_first], patch_size=1)
    torch.testing.assert_close(one_layer.flatten(), torch.tensor([0.625, 0.125, 0.125, 0.125]))
    # rows that do not sum to one (multiplicative prior) are renormalised first
    torch.testing.assert_close(attention_rollout([to_first * 0.3], patch_size=1), one_layer)


def test_weight_colour_image_shows_positive_pixels_in_the_colour_they_align_with():
    weights = torch.zeros(2, 2, 2)
    weights[:, 0, 0] = torch.tensor([1.0, 0.0])  # aligned with a white pixel [1, 0]
    weights[:, 0, 1] = torch.tensor([0.0, 2.0])  # aligned with a black pixel [0, 1]
    weights[:, 1, 0] = torch.tensor([1.0, 1.0])  # mid grey
    weights[:, 1, 1] = torch.tensor([3.0, 0.0])  # strong, but contributes negatively: hidden
    contributions = torch.tensor([[1.0, 1.0], [0.5, -1.0]])
    rgba = weight_colour_image(weights, contributions, alpha_percentile=100)
    assert rgba.shape == (2, 2, 4)
    np.testing.assert_allclose(rgba[0, 0, :3], 1.0)
    np.testing.assert_allclose(rgba[0, 1, :3], 0.0)
    np.testing.assert_allclose(rgba[1, 0, :3], 0.5)
    np.testing.assert_allclose(rgba[..., 3], [[1 / 2, 1.0], [2**0.5 / 2, 0.0]])
    clipped, v = contribution_map(torch.tensor([[-100.0, 1.0], [2.0, 3.0]]), percentile=50)
    assert v == 2.5 and clipped.min() == -2.5 and clipped.max() == 2.5


def test_figure_of_an_explanation_is_written(tmp_path):
    model = tiny_vit("conv", "additive")
    x = images(batch=2)
    exp = explain_image(model, x)
    colour = [weight_colour_image(exp.weights[i], exp.contributions[i]) for i in range(2)]
    path = save_explanation_figure(tmp_path / "fig.png", x, {"W(x)x": exp.contributions}, colour_rows=colour)
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_trainer_with_bcos_loss_trains_the_vit(tmp_path):
    train, train_y, _, _ = load_digits_split()
    data = DigitImages(train[:64], train_y[:64], size=8, views=1, scaled_up_only=True)
    model = tiny_vit("conv", "additive", num_labels=10).float().train()
    before = bcos_loss(model(pixel_values=data.pixel_values), data.labels).item()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=32, num_train_epochs=4,
                             learning_rate=1e-2, report_to=[], logging_steps=1, save_strategy="no", use_cpu=True,
                             disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data, compute_loss_func=bcos_loss).train()
    model.eval()
    after = bcos_loss(model(pixel_values=data.pixel_values), data.labels).item()
    assert after < before
    exp = explain_image(model, data.pixel_values[:4])
    assert exp.completeness_error.max() < 1e-4  # float32
