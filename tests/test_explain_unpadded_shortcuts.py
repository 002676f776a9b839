"""``explain`` on a batch without padding skips work only padding needs, with the same bits (issue 28's speed goal).

The token-batch check reads the mask's minimum in its one sync (``_checks.token_batch_and_padding``), so ``explain``
knows whether any row is padded at no cost. Without padding a model is given no position ids where its forward's own
count the columns from 0, as the real tokens' would (every registry class but RoBERTa's), and the refusal of left
padding is not asked (no sync). Every registry class, with and without padding (either side), against the call that
does not know (``padded=None``, the general path): the same bits.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import padded_rows
from test_conformance import _converted

from bcos_plugins import explain
from bcos_plugins._checks import token_batch_and_padding
from bcos_plugins.attribution import text
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosValueError

NAMES = sorted(SPECS)
FIELDS = ("explained", "input_contributions", "contributions", "delta", "position")


def _explain_not_knowing_padding(monkeypatch, *args, **kwargs):
    """explain as it was before it knew whether the batch is padded (the general path)."""
    module = sys.modules["bcos_plugins.explain"]
    with monkeypatch.context() as patch:
        patch.setattr(module, "token_inputs_and_padding",
                      lambda *a: (*text.token_inputs_and_padding(*a)[:2], None))
        return explain(*args, **kwargs)


def _forward_calls(model) -> list[dict]:
    """The keyword arguments of each call of ``model``, recorded by a hook."""
    calls: list[dict] = []
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    return calls


def _padding_sides(name: str) -> list[str]:
    # a classifier that reads the first column refuses left padding (tests/test_conformance.py)
    reads_first = SPECS[name].classifies_from_first_column(_converted(name).config)
    return ["none", "right"] if reads_first else ["none", "left", "right"]


def _rows(side: str, n_rows: int, width: int = 9, seed: int = 0):
    lengths = [width] * n_rows if side == "none" else [width - 1 - (2 * i) % 6 for i in range(n_rows)]
    return padded_rows(lengths, width, "right" if side == "none" else side, seed=seed)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n_rows", [1, 3, 12])
def test_explain_knowing_the_batch_is_unpadded_or_padded_gives_the_same_bits(monkeypatch, name, n_rows):
    model = _converted(name)
    spec = SPECS[name]
    positions = [None] if spec.is_classifier else [None, -1, -2]
    if spec.head == "masked_lm":
        positions = [-1, -3]  # a masked LM has no default position
    for side in _padding_sides(name):
        ids, mask = _rows(side, n_rows)
        for position in positions:
            target = None if spec.is_classifier else torch.arange(4, 4 + n_rows)
            kwargs = dict(target=target) if position is None else dict(target=target, position=position)
            calls = _forward_calls(model)
            known = explain(model, ids, mask, **kwargs)
            general = _explain_not_knowing_padding(monkeypatch, model, ids, mask, **kwargs)
            model._forward_pre_hooks.clear()
            for field in FIELDS:
                got, want = getattr(known, field), getattr(general, field)
                assert (got is None and want is None) or torch.equal(got, want), (side, position, field)
            counts_from_first_column = spec.position_table is None or not spec.position_table.after_padding
            given = text.gets_real_token_position_ids(model, spec) and not (side == "none" and counts_from_first_column)
            assert ("position_ids" in calls[0]) == given, (side, position)
            assert ("position_ids" in calls[1]) == text.gets_real_token_position_ids(model, spec)


def test_the_check_reports_padding_from_its_one_sync_and_not_knowing_on_the_step_by_step_route():
    ids = torch.arange(12).reshape(3, 4)
    ones = torch.ones_like(ids)
    padded = ones.clone()
    padded[1, 3:] = 0
    for mask, expected in ((None, False), (ones, False), (ones.bool(), False), (ones.int(), False),
                           (padded, True), (padded.bool(), True), (padded.to(torch.uint8), True),
                           (ones.float(), None), (padded.float(), None)):  # a float mask: the step-by-step route
        out_ids, out_mask, got = token_batch_and_padding(ids, mask, vocab_size=50)
        assert got is expected, (mask, got)
        assert torch.equal(out_ids, ids) and (out_mask is None) == (mask is None)


def test_an_unpadded_batch_skips_the_left_padding_check_and_a_padded_one_is_still_refused(monkeypatch):
    model = _converted("BertForSequenceClassification")  # classifies from the first column
    asked = []
    original = text.check_first_column_is_real
    monkeypatch.setattr(text, "check_first_column_is_real", lambda *a: asked.append(1) or original(*a))
    ids, mask = _rows("none", 3)
    explain(model, ids, mask)
    assert asked == []
    ids, mask = _rows("left", 3)
    with pytest.raises(BcosValueError, match=r"attention_mask: rows \[0, 1, 2\] start with padding"):
        explain(model, ids, mask)
    assert asked == [1]
