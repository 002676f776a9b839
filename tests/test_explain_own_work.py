"""``explain``'s own work outside the model (issues 28 and 30): fewer kernels per call, the same answers and refusals."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bcos_plugins._checks import require_row_ids
from bcos_plugins.attribution import Direction
from bcos_plugins.errors import BcosValueError


class _CountKernels(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("value", [3, [1, 0, 4], torch.tensor([1, 0, 4]), torch.tensor([1, 0, 4], dtype=torch.int32)])
def test_passing_row_ids_are_checked_against_the_range_without_a_kernel(value):
    # the range is read from the ids on the host (was: 4 kernels and a sync); an int32 tensor still becomes int64
    expected = torch.tensor([3, 3, 3]) if isinstance(value, int) else torch.tensor([1, 0, 4])
    with _CountKernels() as counter:
        ids = require_row_ids("target", value, 3, n_ids=5)
    # only the conversion to an int64 tensor runs (was: lt, ge, bitwise_or and any before the sync)
    assert set(counter.ops) <= {"aten.lift_fresh.default", "aten._to_copy.default", "aten.expand.default"}, counter.ops
    assert torch.equal(ids, expected) and ids.dtype == torch.long


@pytest.mark.parametrize("bad", [[1, 5, 4], [-1, 0, 4], torch.tensor([7, -2, 1]), 5])
def test_row_ids_outside_the_range_are_refused_naming_them_and_their_rows(bad):
    with pytest.raises(BcosValueError, match=r"^target: ids must lie in \[0, 5\), got \[.*\] at row") as error:
        require_row_ids("target", bad, 3, n_ids=5)
    assert "negative ids are not counted from the end" in str(error.value)
    assert require_row_ids("target", [0, 4, 2], 3, n_ids=None).tolist() == [0, 4, 2]
    assert require_row_ids("target", torch.zeros(0, dtype=torch.long), 0, n_ids=5).shape == (0,)


@pytest.mark.parametrize("foil", [None, torch.tensor([2, 0]), Direction(torch.tensor([0.5, -1.0, 0.0]))])
@pytest.mark.parametrize("target", [torch.tensor([1, 2]), Direction(torch.tensor([1.0, 2.0, -3.0]))])
def test_the_output_scale_is_the_picked_outputs_size_whichever_route_computes_it(target, foil):
    from bcos_plugins.attribution.targets import resolve_explained

    explain_module = sys.modules["bcos_plugins.explain"]
    values = torch.tensor([[1.5, -2.0, 0.25], [-3.0, 0.5, 4.0]])
    resolved = resolve_explained(values, target, foil)
    scale = explain_module._output_scale(values, resolved.target, resolved.foil, resolved.explained)

    def size(which):
        if isinstance(which, Direction):
            return (values.abs() * which.vector.abs()).sum(-1)
        return values.gather(-1, which[:, None]).squeeze(-1).abs()

    expected = size(target) + (0.0 if foil is None else size(foil))
    assert torch.equal(scale, expected)


def test_the_first_column_check_of_a_classifier_runs_no_kernel_on_a_batch_it_passes_and_still_refuses():
    # a first-column classifier (BERT, ModernBERT "cls") checks the first column on every explain call: read on the host
    from conftest import padded_batch, tiny_model

    from bcos_plugins.attribution.text import check_first_column_is_real
    from bcos_plugins.convert.architectures import SPECS

    model = tiny_model("BertForSequenceClassification")
    spec = SPECS["BertForSequenceClassification"]
    _, right = padded_batch(side="right")
    with _CountKernels() as counter:
        check_first_column_is_real(model, right, spec)
    assert set(counter.ops) <= {"aten.select.int"}, counter.ops  # was: eq and any on the column
    for mask in (padded_batch(side="left")[1], padded_batch(side="left")[1].bool()):
        with pytest.raises(BcosValueError, match=r"^attention_mask: rows? .* with padding, and BertForSequence"):
            check_first_column_is_real(model, mask, spec)


@pytest.mark.parametrize("default, column", [("last", 6), ("first", 0)])
def test_the_default_position_of_an_unpadded_batch_is_made_without_reading_the_mask(default, column):
    # explain knows from its token check that no row is padded (padded=False): every row's last (first) real token is
    # then the last (first) column, one kernel instead of the mask's flip, argmax and subtraction; the same ids
    from bcos_plugins.attribution.targets import resolve_positions

    mask = torch.ones(3, 7, dtype=torch.long)
    with _CountKernels() as counter:
        known = resolve_positions(None, mask, default=default, mask_checked=True, padded=False)
    assert counter.ops == ["aten.full.default"], counter.ops
    read = resolve_positions(None, mask, default=default, mask_checked=True)
    assert torch.equal(known, read) and known.dtype == read.dtype == torch.long
    assert known.tolist() == [column] * 3
    # a padded batch, or one not known to be unpadded, reads its mask as before
    padded = mask.clone()
    padded[1, 4:] = 0
    assert resolve_positions(None, padded, default="last", mask_checked=True, padded=True).tolist() == [6, 3, 6]
