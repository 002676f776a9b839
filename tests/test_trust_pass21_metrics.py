"""Trust pass 21, evaluation and data: unusual inputs to the metrics (perturbation, image, pointing, decoder, summary),
the HTML pictures and the data helpers, each checked against an independent computation written here (the formula by
hand in float64, the model in eval mode, the row alone). The cases that were silently wrong or crashed unhelpfully,
one test each (the tally is in the CHANGELOG and the session's report).
"""

from __future__ import annotations

import warnings

import pytest
import torch

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ aopc: half-precision curves


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("normalise", [False, True])
def test_aopc_of_a_half_precision_curve_is_integrated_in_float32(dtype, normalise):
    from bcos_plugins.metrics import DEFAULT_FRACTIONS, aopc

    curve = torch.tensor([[0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 0.5, 0.25]], dtype=dtype)
    x = torch.tensor(DEFAULT_FRACTIONS, dtype=torch.float64)
    exact = torch.trapezoid(curve.double(), x, dim=-1)  # the curve's values are exact in every dtype
    if normalise:
        exact = exact / 0.8
    got = aopc(curve, DEFAULT_FRACTIONS, normalise=normalise)
    # the fractions and the sum were in the curve's dtype: 0.1 is 0.10009765625 in bfloat16, the width 0.7983
    assert got.dtype == torch.float32
    assert got.double().item() == pytest.approx(exact.item(), rel=1e-6)
