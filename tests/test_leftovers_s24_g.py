"""Session 24 leftovers (helper-172): MRR's random baseline on the MRR's rows; load_bcos_model refuses config
overrides that change the model's maths. Each test fails before its fix."""

from __future__ import annotations

import pytest
import torch

# ------------------------------------------------ 1. MRR and its random baseline cover one selection of rows


def test_mrr_random_baseline_is_averaged_over_the_rows_the_mrr_counts():
    """A tied row (and a row of one candidate) has no rank and is left out of the MRR, but its random baseline was
    still averaged in: the baseline of 3 rows against the MRR of 1, biased towards the short prefixes' high chance."""
    from bcos_plugins.metrics import expected_random_reciprocal_rank, mean_reciprocal_rank

    scores = torch.tensor([[0.5, 0.5, 0.0, 0.0],  # tied over its 2 candidates: no rank (chance 3/4)
                           [0.1, 0.4, 0.3, 0.2],  # ranked: evidence at rank 4 among 4 (chance 25/48)
                           [0.7, 0.0, 0.0, 0.0]])  # one candidate: rank 1 for every method, no rank (chance 1)
    evidence = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    candidates = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    result = mean_reciprocal_rank(scores, evidence, candidates)
    assert (result.n, result.n_skipped) == (1, 2)
    assert result.mrr == pytest.approx(1 / 4)
    # before: (3/4 + 25/48 + 1) / 3 = 0.757 against the MRR of row 1 alone
    assert result.random == pytest.approx(expected_random_reciprocal_rank(4, 1))
    assert result.random == pytest.approx(25 / 48)


def test_mrr_random_baseline_equals_the_mean_of_the_counted_rows_baselines():
    from bcos_plugins.metrics import mean_reciprocal_rank, random_reciprocal_rank

    g = torch.Generator().manual_seed(3)
    scores = torch.rand(40, 7, generator=g)
    scores[::4] = 1.0  # every fourth row tied: all of them rows of 7 candidates
    evidence = torch.zeros(40, 7, dtype=torch.bool)
    evidence[:, 2] = True
    candidates = torch.ones(40, 7, dtype=torch.bool)
    candidates[1::2, 4:] = False  # odd rows: 4 candidates, even rows: 7 (different chance ranks)
    result = mean_reciprocal_rank(scores, evidence, candidates)
    counted = ~result.reciprocal_ranks.isnan()
    assert int(counted.sum()) == result.n == 40 - 10
    per_row = random_reciprocal_rank(evidence, candidates)
    assert result.random == pytest.approx(float(per_row[counted].mean()), abs=1e-12)
