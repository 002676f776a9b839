"""Small mends from the review of session 23 (helper-150): behaviour-preserving, pinned where the change is observable."""

from __future__ import annotations

import pytest

from bcos_plugins._checks import require_row_ids


class _CountingList(list):
    """A list that counts how often it is iterated (``list(value)`` and generator scans iterate a subclass)."""

    iterations = 0

    def __iter__(self):
        type(self).iterations += 1
        return super().__iter__()


def test_require_row_ids_copies_the_ids_only_for_arguments_that_take_class_or_token_names():
    # "positions" is never checked for names: its ids are scanned once (for booleans), not copied into a list too
    _CountingList.iterations = 0
    ids = require_row_ids("positions", _CountingList([0, 1]), 2)
    unchecked = _CountingList.iterations
    _CountingList.iterations = 0
    assert require_row_ids("target", _CountingList([0, 1]), 2).tolist() == ids.tolist() == [0, 1]
    checked = _CountingList.iterations
    assert unchecked < checked, (unchecked, checked)
    # the refusal of a class name where its id is meant is unchanged, and reaches only the checked arguments
    with pytest.raises(TypeError, match="label2id"):
        require_row_ids("target", ["positive", "negative"], 2)
    with pytest.raises(TypeError, match="cannot read"):
        require_row_ids("positions", ["positive", "negative"], 2)
