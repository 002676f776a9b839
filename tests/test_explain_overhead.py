"""``explain``'s own work outside the model (issue 30's speed goal) without a changed answer or refusal.

The token-batch check decides a passing batch from the ids' and the mask's extremes in one sync
(``_checks._token_batch_passes``); any failure falls through to the step-by-step checks. These tests hold the two
routes to the same result: the same tensors returned, the same exception and message, for every kind of bad batch.
"""

from __future__ import annotations

import pytest
import torch

from bcos_plugins import _checks
from bcos_plugins._checks import require_token_batch

VOCAB, MAX_LENGTH = 50, 8


def _outcome(ids, mask, **limits):
    """What require_token_batch returns (the tensors and their dtypes) or raises (the class and message)."""
    try:
        out_ids, out_mask = require_token_batch(ids, mask, **limits)
    except Exception as error:  # noqa: BLE001 - the refusal itself is the outcome compared
        return type(error), str(error)
    return out_ids.tolist(), out_ids.dtype, None if out_mask is None else (out_mask.tolist(), out_mask.dtype)


def _batches():
    ids = torch.arange(12).reshape(3, 4) % VOCAB
    ones = torch.ones_like(ids)
    padded = ones.clone()
    padded[1, 2:] = 0
    empty_row = ones.clone()
    empty_row[2] = 0
    yield "valid", ids, ones
    yield "valid, no mask", ids, None
    yield "right padding", ids, padded
    yield "boolean mask", ids, padded.bool()
    yield "uint8 mask", ids, padded.to(torch.uint8)
    yield "int32 ids and mask", ids.int(), padded.int()
    yield "uint8 ids", ids.to(torch.uint8), padded
    yield "float mask of 0/1", ids, padded.float()
    yield "float mask of 0.5", ids, ones.float() / 2
    yield "mask of 2", ids, ones * 2
    yield "mask of -1 and 1", ids, torch.where(padded.bool(), 1, -1)
    yield "row of padding", ids, empty_row
    yield "boolean row of padding", ids, empty_row.bool()
    yield "id = vocabulary size", torch.where(ids == 5, VOCAB, ids), padded
    yield "negative id", torch.where(ids == 5, -1, ids), None
    yield "bad id and bad mask", torch.where(ids == 5, VOCAB, ids), ones * 2
    yield "too long", torch.zeros(2, MAX_LENGTH + 1, dtype=torch.long), torch.ones(2, MAX_LENGTH + 1, dtype=torch.long)
    yield "too long and a bad id", torch.full((2, MAX_LENGTH + 1), VOCAB), None
    yield "mask of another shape", ids, ones[:, :3]
    yield "mask of another shape and a bad id", torch.where(ids == 5, VOCAB, ids), ones[:, :3]
    yield "mask not a tensor", ids, ones.tolist()
    yield "complex mask", ids, ones.to(torch.complex64)


@pytest.mark.parametrize("limits", [dict(vocab_size=VOCAB, max_length=MAX_LENGTH), dict(vocab_size=VOCAB), {}])
@pytest.mark.parametrize("case", [c[0] for c in _batches()])
def test_the_one_sync_token_check_returns_and_refuses_as_the_step_by_step_checks(monkeypatch, case, limits):
    _, ids, mask = next(b for b in _batches() if b[0] == case)
    fast = _outcome(ids, mask, **limits)
    monkeypatch.setattr(_checks, "_token_batch_passes", lambda *args: None)
    step_by_step = _outcome(ids, mask, **limits)
    assert fast == step_by_step


def test_the_one_sync_token_check_decides_the_common_batches_itself():
    # it must not fall through on a valid batch (then it would only add work)
    ids = torch.arange(12).reshape(3, 4)
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0
    for given_mask in (mask, mask.bool(), mask.int(), None):
        passed = _checks._token_batch_passes(ids, given_mask, VOCAB, MAX_LENGTH)
        assert passed is not None
        assert passed[0] is ids
        assert (passed[1] is None) == (given_mask is None)
