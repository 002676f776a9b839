"""Grid pointing game and pixel perturbation on hand-built cases with known answers."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.metrics.image import IMAGE_FRACTIONS, grid_pointing_game, pixel_perturbation, pixel_ranking


def test_grid_pointing_game_counts_positive_attribution_in_the_explained_cell():
    maps = torch.zeros(4, 4, 4)
    maps[0, 0:2, 2:4] = 1.0  # everything positive in the top-right cell (index 1)
    maps[1] = 1.0  # uniform: a quarter in every cell
    maps[2, 2:4, 0:2] = 3.0  # bottom-left (index 2) positive ...
    maps[2, 0:2, 0:2] = -10.0  # ... negative evidence elsewhere does not count
    maps[2, 2:4, 2:4] = 1.0  # ... positive evidence elsewhere does: 12 of 16
    maps[3] = -1.0  # nothing positive at all
    scores = grid_pointing_game(maps, torch.tensor([1, 3, 2, 0]))
    torch.testing.assert_close(scores, torch.tensor([1.0, 0.25, 0.75, 0.0]))
    assert grid_pointing_game(maps[:1], 0).item() == 0.0  # the wrong cell of example 0
    # per-channel maps are summed over channels first
    per_channel = torch.stack([maps, maps], dim=1)
    torch.testing.assert_close(grid_pointing_game(per_channel, torch.tensor([1, 3, 2, 0])), scores)
    # other grids: 1 x 4 cells of a 2 x 8 map
    strip = torch.zeros(1, 2, 8)
    strip[0, :, 6:] = 2.0
    strip[0, :, 0:2] = 2.0
    assert grid_pointing_game(strip, 3, grid=(1, 4)).item() == 0.5


def test_grid_pointing_game_errors():
    with pytest.raises(ValueError, match="cannot be split into a 2x2 grid"):
        grid_pointing_game(torch.ones(1, 5, 4), 0)
    with pytest.raises(ValueError, match=r"cell: ids must lie in \[0, 4\), got \[4\] at row \[1\]\. Pass ids in "
                                         r"\[0, 4\) \(there are 4 cells in the 2x2 grid"):
        grid_pointing_game(torch.ones(2, 4, 4), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"attributions: must have 3 or 4 dimensions \(batch, H, W\)"):
        grid_pointing_game(torch.ones(4, 4), 0)


def test_pixel_ranking_orders_by_score_and_breaks_ties_at_random_but_reproducibly():
    maps = torch.tensor([[[0.1, 0.9], [-0.5, 0.3]]])
    assert pixel_ranking(maps).tolist() == [[1, 3, 0, 2]]
    assert pixel_ranking(maps, most_important_first=False).tolist() == [[2, 0, 3, 1]]
    flat = torch.zeros(1, 8, 8)
    a, b = pixel_ranking(flat, seed=1), pixel_ranking(flat, seed=1)
    assert torch.equal(a, b) and not torch.equal(a[0], torch.arange(64))  # not positional order
    assert sorted(a[0].tolist()) == list(range(64))


def linear_model(weights: torch.Tensor):
    """logit 0 = sum(w * x), logit 1 = 0: input x gradient is exact, so the curves are known in closed form."""
    def forward(x):
        first = (x * weights).sum(dim=(1, 2, 3))
        return torch.stack([first, torch.zeros_like(first)], dim=1)
    return forward


def test_pixel_perturbation_curves_and_area_between_them_on_a_linear_model():
    w = torch.tensor([[[[4.0, 3.0], [2.0, 1.0]]]])
    x = torch.ones(1, 1, 2, 2)
    fractions = (0.0, 0.25, 0.5, 0.75, 1.0)
    exact = (w * x)[:, 0]
    result = pixel_perturbation(linear_model(w), x, exact, target=0, fractions=fractions, score="logit")
    torch.testing.assert_close(result.most_first, torch.tensor([[10.0, 6.0, 3.0, 1.0, 0.0]]))
    torch.testing.assert_close(result.least_first, torch.tensor([[10.0, 9.0, 7.0, 4.0, 0.0]]))
    # gaps 0, 3, 4, 3, 0 at steps of 0.25 over a width of 1: trapezoid area 2.5
    torch.testing.assert_close(result.area_between, torch.tensor([2.5]))
    torch.testing.assert_close(result.area_most_first, torch.tensor([3.75]))
    torch.testing.assert_close(result.area_least_first, torch.tensor([6.25]))
    # the reversed ranking is maximally unfaithful: the curves swap and the area changes sign
    reversed_ = pixel_perturbation(linear_model(w), x, -exact, target=0, fractions=fractions, score="logit")
    torch.testing.assert_close(reversed_.area_between, torch.tensor([-2.5]))


def test_normalised_area_is_the_area_between_mean_curves_that_start_at_one():
    # two images, logits 10 and 30 before removal: the paper divides the mean curves by the mean start, 20
    w = torch.tensor([[[[4.0, 3.0], [2.0, 1.0]]]])
    x = torch.cat([torch.ones(1, 1, 2, 2), 3 * torch.ones(1, 1, 2, 2)])
    result = pixel_perturbation(linear_model(w), x, (w * x)[:, 0], target=0, fractions=(0.0, 0.25, 0.5, 0.75, 1.0),
                                score="logit")
    torch.testing.assert_close(result.area_between, torch.tensor([2.5, 7.5]))
    mean_curves = (result.least_first.mean(0) - result.most_first.mean(0)) / result.most_first[:, 0].mean()
    by_hand = torch.trapezoid(mean_curves, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])).item()
    assert result.mean_area_between_normalised() == pytest.approx(by_hand) == pytest.approx(5.0 / 20.0)
    # a negative start would flip the sign of every area: refused, with the fix named
    negative = pixel_perturbation(linear_model(-w), x, (w * x)[:, 0], target=0, fractions=(0.0, 0.5), score="logit")
    with pytest.raises(BcosValueError, match="score: the normalised area needs .* positive mean score"):
        negative.mean_area_between_normalised()
    late = pixel_perturbation(linear_model(w), x, (w * x)[:, 0], target=0, fractions=(0.25, 0.5), score="logit")
    with pytest.raises(BcosValueError, match="start unperturbed"):
        late.mean_area_between_normalised()


def test_pixel_perturbation_removes_every_channel_of_a_pixel_and_uses_the_requested_score():
    torch.manual_seed(0)
    w = torch.randn(3, 2, 4, 4)
    x = torch.rand(3, 2, 4, 4)
    seen = []

    def forward(batch):
        seen.append(batch.clone())
        return linear_model(w[:1])(batch)

    maps = torch.arange(16.0).reshape(1, 4, 4).expand(3, -1, -1)
    result = pixel_perturbation(forward, x, maps, target=torch.tensor([0, 0, 1]), removed_value=-1.0,
                                fractions=(0.0, 0.5), score="softmax")
    most_first_half = seen[1]  # second call: most important half removed (values 8..15 = the bottom rows)
    assert (most_first_half[:, :, 2:, :] == -1.0).all() and torch.equal(most_first_half[:, :, :2, :], x[:, :, :2, :])
    probs = torch.softmax(linear_model(w[:1])(x), dim=-1)
    torch.testing.assert_close(result.most_first[:, 0], probs[torch.arange(3), torch.tensor([0, 0, 1])])
    assert result.most_first.shape == (3, 2)
    assert len(IMAGE_FRACTIONS) == 9 and IMAGE_FRACTIONS[0] == 0.0 and IMAGE_FRACTIONS[-1] == 0.25


def test_pixel_perturbation_errors():
    forward = linear_model(torch.ones(1, 1, 2, 2))
    x = torch.ones(2, 1, 2, 2)
    with pytest.raises(ValueError, match="do not match the inputs"):
        pixel_perturbation(forward, x, torch.ones(2, 3, 3), target=0)
    with pytest.raises(ValueError, match="increasing values"):
        pixel_perturbation(forward, x, torch.ones(2, 2, 2), target=0, fractions=(0.2, 0.1))
    with pytest.raises(ValueError, match="score must be"):
        pixel_perturbation(forward, x, torch.ones(2, 2, 2), target=0, score="prob")
    with pytest.raises(ValueError, match=r"target: expected an int or one id per row, shape \(2,\); got "
                                         r"shape \(3,\)"):
        pixel_perturbation(forward, x, torch.ones(2, 2, 2), target=torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match=r"inputs: must have 4 dimensions \(batch, C, H, W\)"):
        pixel_perturbation(forward, x[0], torch.ones(2, 2, 2), target=0)


# --- issue 15: unusual input gets a correct answer or a clear error -------------------------------------------

def test_nan_maps_float_cells_empty_batches_and_out_of_range_targets_are_named():
    nan = torch.rand(2, 4, 4)
    nan[1, 0, 0] = float("nan")
    with pytest.raises(BcosValueError, match=r"attributions: contains? NaN or inf in row \[1\]"):
        pixel_ranking(nan)
    forward = linear_model(torch.ones(1, 1, 4, 4))
    with pytest.raises(BcosValueError, match=r"attributions: contains? NaN or inf in row \[1\]"):
        pixel_perturbation(forward, torch.rand(2, 1, 4, 4), nan, target=0)
    with pytest.raises(BcosValueError, match=r"target: ids must lie in \[0, 2\)"):
        pixel_perturbation(forward, torch.rand(2, 1, 4, 4), torch.rand(2, 4, 4), target=5)
    with pytest.raises(BcosValueError, match="inputs: are empty"):
        pixel_perturbation(forward, torch.rand(0, 1, 4, 4), torch.rand(0, 4, 4), target=0)
    with pytest.raises(BcosTypeError, match=r"cell: got a float \(1\.7\); ids must be integers \(floats are "
                                          r"refused, not truncated\)"):
        grid_pointing_game(torch.rand(1, 4, 4), 1.7)  # used to be truncated to cell 1
    with pytest.raises(BcosValueError, match="grid: must be >= 1"):
        grid_pointing_game(torch.rand(1, 4, 4), 0, grid=(0, 2))
    with pytest.raises(BcosValueError, match="attributions: are empty"):
        grid_pointing_game(torch.rand(0, 4, 4), 0)
    # a map with no positive attribution scores 0 (documented), not NaN
    assert grid_pointing_game(-torch.rand(1, 4, 4), 0).item() == 0.0
