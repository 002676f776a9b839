"""Every public entry point, driven with generated invalid and edge inputs: the package's error naming the
argument, or a finite correct result (complete where completeness is promised).

One section per area; each section owns its strategies and helpers.
"""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, padded_batch, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import Direction
from bcos_plugins.errors import BcosError

EDGE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ============================================================== explanation core: explain (text)

_MODELS: dict[str, torch.nn.Module] = {}


def _model(name: str):
    if name not in _MODELS:
        _MODELS[name] = bcosify(tiny_model(name), b=1.5, verbose=False)
    return _MODELS[name]


_NAMES = ["BertForSequenceClassification", "GPT2LMHeadModel", "LlamaForCausalLM", "BertModel"]
_any_value = st.one_of(
    st.none(), st.integers(-100, 100), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
    st.lists(st.integers(-5, 70), max_size=5), st.booleans(),
    st.builds(lambda n, k: torch.randint(-3, 70, (n,)), st.integers(0, 5), st.just(0)),
    st.builds(lambda n: torch.rand(n), st.integers(0, 5)),
    st.builds(lambda n: Direction(torch.randn(n)), st.sampled_from([3, 32, 60])),
)


def _check_text_result(expl, model):
    assert torch.isfinite(expl.input_contributions).all() and torch.isfinite(expl.explained).all()
    assert expl.completeness_error.max() < 1e-3 or expl.explained.abs().min() < 1e-4


@EDGE
@given(name=st.sampled_from(_NAMES), target=_any_value, foil=_any_value, position=_any_value,
       side=st.sampled_from(["left", "right"]), reduce=st.sampled_from(["sum", "mean", "max", 1]))
def test_explain_answers_any_argument_correctly_or_names_it(name, target, foil, position, side, reduce):
    model = _model(name)
    ids, mask = padded_batch(side=side)
    try:
        expl = explain(model, ids, mask, target=target, foil=foil, position=position, reduce=reduce)
    except BcosError as err:
        named = [arg for arg in ("target", "foil", "position", "reduce", "attention_mask") if f"{arg}:" in str(err)]
        assert named, f"error does not name the argument: {err}"
        return
    _check_text_result(expl, model)


@EDGE
@given(batch=st.integers(0, 3), length=st.integers(0, 50), low=st.integers(-5, VOCAB + 5),
       mask_kind=st.sampled_from(["none", "ones", "zeros_row", "twos", "float", "short"]))
def test_explain_token_inputs_any_shape_or_range(batch, length, low, mask_kind):
    model = _model("BertForSequenceClassification")
    ids = torch.full((batch, length), low, dtype=torch.long)
    mask = {"none": None, "ones": torch.ones_like(ids), "twos": 2 * torch.ones_like(ids),
            "float": torch.ones(batch, length), "short": torch.ones(batch, max(length - 1, 0), dtype=torch.long),
            "zeros_row": torch.ones_like(ids).index_fill_(0, torch.tensor([0]), 0) if batch else torch.ones_like(ids)
            }[mask_kind]
    try:
        expl = explain(model, ids, mask)
    except BcosError as err:
        assert any(f"{arg}:" in str(err) for arg in ("input_ids", "attention_mask")), str(err)
        return
    _check_text_result(expl, model)
    assert 0 < length <= 40 and 0 <= low < VOCAB and batch > 0


@pytest.mark.parametrize("value", [None, "model", 3, torch.nn.Linear(2, 2)])
def test_explain_refuses_what_is_not_a_supported_model(value):
    ids, mask = padded_batch()
    with pytest.raises(BcosError, match="not supported|model"):
        explain(value, ids, mask)
