"""Parameter gradients under bfloat16 autocast against float64 (issue 30, mixed precision): a B-cos model's are within
3x of a stock model's with the same weight scale, the fused training layer is as accurate as the reference path on the
same inputs, and the weight normalisation's gradient does not cancel. The measurement and what it showed:
benchmarks/bench_bf16_gradients.py, docs/benchmarks.md#bf16-gradients."""

from __future__ import annotations

import copy
import statistics
from contextlib import nullcontext

import pytest
import torch

from bcos_plugins.nn import BcosLinear, reference_path
from benchmarks import bench_bf16_gradients as bench

SEEDS = range(1, 9)


def _mean_median_error(family: str, name: str) -> float:
    """The median over parameters of ``||g - g64|| / ||g64||``, averaged over the batches of :data:`SEEDS` (one
    batch's value is dominated by its few units with ``|cos|`` near 0: single batches of the B-cos BERT ranged
    0.8-6.3x the stock model's, the mean of eight 1.7-2.2x)."""
    model, reference = bench.models(family, 32)[name]
    wide = copy.deepcopy(model).double()
    medians = []
    for seed in SEEDS:
        ids, mask, labels = bench.batch(4, 16, seed)
        expected = bench.gradients(wide, ids, mask, labels, bf16=False, reference=True)
        actual = bench.gradients(model, ids, mask, labels, bf16=True, reference=reference)
        medians.append(bench.median_rel(bench.errors(actual, expected)))
    return statistics.fmean(medians)


@pytest.mark.parametrize("family", ["qwen3", "bert"])
def test_bcos_bf16_gradients_stay_within_3x_of_a_stock_model_with_unit_weight_rows(family):
    # Measured (2026-11-28, CPU): B-cos / stock-with-unit-rows 2.06x (Qwen3), 1.96x (BERT); fused / reference 0.98x,
    # 1.16x. The stock model as initialised is no yardstick: its weights (std 0.02) make each block add little to the
    # residual stream, and its error is 0.4x the unit-row model's on both (the "10x" of the first report).
    # The float64 truth is the reference path's (independent of the fused kernels): a fused backward without the
    # normalisation's radial term failed all three bounds (B-cos 0.15-0.18 against 3 x 0.013-0.017), tried once.
    stock_unit = _mean_median_error(family, "stock unit rows")
    fused = _mean_median_error(family, "bcos")
    step_by_step = _mean_median_error(family, "bcos reference")
    assert 0.005 < stock_unit < 0.05, stock_unit  # (bfloat16's reach: a broken yardstick would pass anything)
    assert fused <= 3 * stock_unit, (fused, stock_unit)
    assert step_by_step <= 3 * stock_unit, (step_by_step, stock_unit)
    assert fused <= 1.5 * step_by_step, (fused, step_by_step)


def _layer_gradients(layer: BcosLinear, x: torch.Tensor, grad_out: torch.Tensor, *, bf16: bool,
                     reference: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(input gradient, weight gradient) of ``layer`` at ``x`` for the output gradient ``grad_out``, float64."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    with (reference_path() if reference else nullcontext()), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = layer(x)
    out.backward(grad_out.to(out.dtype))
    return x.grad.double(), layer.weight.grad.double()


def test_the_fused_layers_bf16_gradients_are_as_accurate_as_the_reference_paths_on_the_same_inputs():
    # Inputs with units nearly orthogonal to some rows (|cos| ~ 1e-3), where dyn = |cos| ** (B - 1) is steepest and
    # bfloat16's rounding of the unit-norm weight moves the gradient most: the fused backward (dyn recovered from the
    # output, G and the normalisation's gradient computed once) must not add error to what the step-by-step maths
    # loses. Measured: fused 0.0078, reference 0.0081 (input and weight gradients alike).
    torch.manual_seed(0)
    layer = BcosLinear(64, 48, b=1.25)
    x = torch.randn(256, 64)
    unit = layer.weight.detach() / layer.weight.detach().norm(dim=1, keepdim=True)
    x[:48] -= (x[:48] * unit).sum(1, keepdim=True) * unit * 0.999  # row t nearly orthogonal to unit t
    grad_out = torch.randn(256, 48)
    exact = _layer_gradients(layer.double(), x.double(), grad_out.double(), bf16=False, reference=True)
    layer.float()
    fused = _layer_gradients(layer, x, grad_out, bf16=True, reference=False)
    step_by_step = _layer_gradients(layer, x, grad_out, bf16=True, reference=True)
    for what, e, f, s in zip(("input", "weight"), exact, fused, step_by_step, strict=True):
        fused_error = ((f - e).norm() / e.norm()).item()
        step_error = ((s - e).norm() / e.norm()).item()
        assert 1e-4 < step_error < 0.05, (what, step_error)  # (bfloat16 rounded something, and not the whole)
        assert fused_error <= 1.1 * step_error, (what, fused_error, step_error)


@pytest.mark.parametrize("family", ["qwen3", "bert"])
def test_the_weight_normalisations_gradient_is_mostly_tangential(family):
    # The suspected cause of the larger B-cos error was cancellation in d/dw = (G - ŵ <G, ŵ>) / ||w||, G mostly
    # radial. Measured: ||G|| / ||G - ŵ <G, ŵ>|| is 1.00-1.04 in every layer, so the subtraction cancels nothing
    # and G's bfloat16 rounding is not amplified (keeping G in float32 changed no error by more than 1 %).
    shares = bench.radial_shares(family, 32)
    assert len(shares) >= 12, shares  # (every B-cos layer of two blocks and the head was seen)
    assert max(shares) < 1.1, shares
