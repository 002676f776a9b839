"""A B-cos unit whose weights are finite but whose squared norm overflows float32 gives NaN, on every path.

``||w|| = inf`` made ``ŵ = w / inf = 0``, so the unit gave 0 in every row, silently (float64 gives about ``x_k``), on
every layer and path: inference (the fused inline path, the cached unit weights of ``reuse_unit_weights``), the
reference path, training and explaining. The unit norms now pass through ``overflowed_norm_as_nan``, as an input row's
norm does (commit 742010f): that unit's outputs are NaN in every row, and the gradients through it are NaN. Finite
values keep their bits: tests/test_leftovers_s25.py's MiniLM logits / explanation with and without
``overflowed_norm_as_nan`` (which now removes the weight's too) are bit-identical, and below each layer's other units
are compared with ``torch.equal``. The opt-in Triton kernel's checks are in tests/triton_linear_checks.py.
(helper-201, session 26)
"""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, tiny_bcos_model

from bcos_plugins import BcosError, explain
from bcos_plugins.nn import (
    BcosConv1D,
    BcosConv2d,
    BcosLinear,
    explanation_mode,
    reference_path,
    reuse_unit_weights,
)
from bcos_plugins.nn.dynamic import no_parameter_gradients

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

HUGE = {  # a unit's weights as written: finite, with ||w||^2 beyond float32's 3.4e38
    "one element 3e19": {2: 3e19},
    "two elements +-2e19": {2: 2e19, 3: -2e19},
    "every element 1e19": dict.fromkeys(range(6), 1e19),
}
UNIT = 1


def _layer(kind: str, dtype=torch.float32):
    torch.manual_seed(0)
    if kind == "linear":
        return BcosLinear(6, 4, b=1.5).to(dtype)
    if kind == "conv1d":  # GPT-2's Conv1D layout: units are columns
        return BcosConv1D(6, 4, b=1.5).to(dtype)
    return BcosConv2d(6, 4, kernel_size=1, b=1.5).to(dtype)  # (in_channels x 1 x 1: the unit's 6 weights)


def _set_unit(layer, values: dict[int, float]) -> None:
    with torch.no_grad():
        for k, value in values.items():
            if isinstance(layer, BcosConv1D):
                layer.weight[k, UNIT] = value
            elif isinstance(layer, BcosConv2d):
                layer.weight[UNIT, k, 0, 0] = value
            else:
                layer.weight[UNIT, k] = value


def _input(kind: str, dtype=torch.float32):
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    return x[:, :, None, None] if kind == "conv2d" else x


def _unit_axis(kind: str) -> int:
    return 1 if kind == "conv2d" else -1


def _units(out: torch.Tensor, kind: str, unit: int | slice) -> torch.Tensor:
    return out[:, unit] if kind == "conv2d" else out[..., unit]


def _others(out: torch.Tensor, kind: str) -> torch.Tensor:
    keep = [u for u in range(out.shape[_unit_axis(kind)]) if u != UNIT]
    return out[:, keep] if kind == "conv2d" else out[..., keep]


def _inference(layer, x):
    with torch.no_grad():
        return layer(x)


def _inference_reused(layer, x):
    with reuse_unit_weights(), torch.no_grad():
        first = layer(x)  # (a cache miss: normalised and stored)
        second = layer(x)  # (the cached copy)
    assert torch.equal(first, second) or (torch.isnan(first) == torch.isnan(second)).all()
    return second


def _inference_reference(layer, x):
    with reference_path(), torch.no_grad():
        return layer(x)


PATHS = {"inference": _inference, "reuse_unit_weights": _inference_reused, "reference path": _inference_reference}


@pytest.mark.parametrize("kind", ["linear", "conv1d", "conv2d"])
@pytest.mark.parametrize("case", list(HUGE))
@pytest.mark.parametrize("path", list(PATHS))
def test_a_unit_whose_norm_overflows_gives_nan_in_every_row_the_other_units_unchanged(kind, case, path):
    layer = _layer(kind)
    x = _input(kind)
    before = PATHS[path](layer, x)
    _set_unit(layer, HUGE[case])
    out = PATHS[path](layer, x)
    assert torch.isnan(_units(out, kind, UNIT)).all(), f"{path}: the unit gave {_units(out, kind, UNIT)}, not NaN"
    assert torch.equal(_others(out, kind), _others(before, kind)), "the other units' values changed"
    # float64 (the independent reference) holds the norm: the unit's outputs are finite and not all 0 there
    wide = layer.double()
    reference = PATHS[path](wide, x.double())
    assert torch.isfinite(_units(reference, kind, UNIT)).all() and (_units(reference, kind, UNIT) != 0).any()


def _gradients(layer, x, mode: str):
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    if mode == "explaining":
        with explanation_mode(layer), no_parameter_gradients():
            out = layer(x)
    else:
        out = layer(x)
    out.backward(torch.ones_like(out))
    return out, x.grad, None if layer.weight.grad is None else layer.weight.grad.clone()


@pytest.mark.parametrize("kind", ["linear", "conv1d", "conv2d"])
@pytest.mark.parametrize("mode", ["training", "explaining"])
def test_gradients_through_an_overflowed_unit_are_nan_on_the_fused_and_the_reference_path(kind, mode):
    """The input gradient takes every unit's weights, so it is NaN in every row; training's weight gradient is NaN on
    that unit's weights only, the others' the values of a layer without the huge unit (same bits). The fused training
    node (BcosLinearNode) and the reference path (autograd through the steps) agree on where the NaN is."""
    layer = _layer(kind)
    x = _input(kind)
    _, _, clean_grad_w = _gradients(layer, x, mode)
    _set_unit(layer, HUGE["one element 3e19"])
    fused = _gradients(layer, x, mode)
    with reference_path():
        reference = _gradients(layer, x, mode)
    for got in (fused, reference):
        out, grad_x, grad_w = got
        assert torch.isnan(_units(out, kind, UNIT)).all()
        assert torch.isnan(grad_x).all(), "the input gradient passes through the overflowed unit"
        if mode == "training":
            unit_rows = grad_w[:, UNIT] if kind == "conv1d" else grad_w[UNIT]
            assert torch.isnan(unit_rows).all()
            other = torch.ones_like(grad_w, dtype=torch.bool)
            if kind == "conv1d":
                other[:, UNIT] = False
            else:
                other[UNIT] = False
            assert not torch.isnan(grad_w[other]).any()
            torch.testing.assert_close(grad_w[other], clean_grad_w[other])
    assert torch.equal(torch.isnan(fused[1]), torch.isnan(reference[1]))
    if mode == "training":
        assert torch.equal(torch.isnan(fused[2]), torch.isnan(reference[2]))


def test_bfloat16_weights_overflow_as_float32_and_float16_weights_keep_their_float32_norm():
    """bfloat16 has float32's range, so a bfloat16 unit can overflow (NaN now, 0 before); float16's largest value,
    65504, cannot (its norm is taken in float32), so a float16 unit of 60000s keeps its float64 value."""
    layer = _layer("linear", torch.bfloat16)
    _set_unit(layer, HUGE["one element 3e19"])
    out = _inference(layer, _input("linear", torch.bfloat16))
    assert torch.isnan(out[:, UNIT]).all()
    half = _layer("linear", torch.float16)
    _set_unit(half, dict.fromkeys(range(6), 60000.0))
    x = _input("linear", torch.float16)
    got = _inference(half, x)
    want = _inference(half.double(), x.double())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=4e-3, atol=4e-3)


def test_an_overflowed_unit_under_bfloat16_autocast_gives_nan():
    layer = _layer("linear")
    _set_unit(layer, HUGE["one element 3e19"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _inference(layer, _input("linear"))
        trained = _gradients(layer, _input("linear"), "training")
    assert torch.isnan(out[:, UNIT]).all() and torch.isnan(trained[0][:, UNIT]).all()


def test_float64_weights_whose_norm_overflows_float64_give_nan():
    layer = _layer("linear", torch.float64)
    _set_unit(layer, {2: 1e160})
    assert torch.isnan(_inference(layer, _input("linear", torch.float64))[:, UNIT]).all()


@pytest.mark.parametrize("projection", ["value", "query"])
def test_an_overflowed_attention_projection_unit_gives_nan_and_explain_refuses_the_logits(projection):
    """GPT-2's fused q|k|v projection (a BcosConv1D, units as columns, the query / key units constant outputs): a unit
    of 3e19 gave 0 in every row, so the logits were finite and wrong, silently; now that unit is NaN, with and without
    reuse_unit_weights, and (a value unit) the logits are NaN, which explain refuses. (A NaN query unit does not reach
    the logits: torch's CPU scaled_dot_product_attention returns finite outputs for a NaN query, torch 2.13.)"""
    model = tiny_bcos_model("GPT2LMHeadModel")
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    attn = model.transformer.h[0].attn.c_attn
    d = model.config.n_embd
    unit = {"query": 1, "value": 2 * d + 1}[projection]
    hidden = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = attn(hidden)
        attn.weight[3, unit] = 3e19
        after = attn(hidden)
        with reuse_unit_weights():
            attn(hidden)
            reused = attn(hidden)
    assert torch.isnan(after[..., unit]).all() and torch.isnan(reused[..., unit]).all()
    others = [u for u in range(3 * d) if u != unit]
    assert torch.equal(after[..., others], before[..., others]) and torch.equal(reused[..., others], before[..., others])
    if projection == "value":
        with torch.no_grad():
            assert torch.isnan(model(input_ids=ids).logits).any()
        with pytest.raises(BcosError, match="NaN"):
            explain(model, ids, target=7, position=-1)


@pytest.mark.parametrize("reuse", [False, True])
def test_an_overflowed_unit_of_a_transformer_lens_component_gives_nan(reuse):
    """TransformerLens' W_V (head, d_model, d_head): the B-cos component normalises each unit over d_model through the
    same unit norms (and the same cache under reuse_unit_weights)."""
    from bcos_plugins.adapters.transformer_lens import HAS_HOOKED_TRANSFORMER, hooked_transformer_from_hf

    assert HAS_HOOKED_TRANSFORMER, "the .venv's TransformerLens 3 has HookedTransformer"
    model = hooked_transformer_from_hf(tiny_bcos_model("GPT2LMHeadModel"))
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), reuse_unit_weights(reuse):
        before = model(ids)
        model.blocks[0].attn.W_V[0, 3, 1] = 3e19
        after = model(ids)
    assert torch.isfinite(before).all() and torch.isnan(after).all()
