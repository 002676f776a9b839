"""Small mends from the review of session 23 (helper-150): behaviour-preserving, pinned where the change is observable."""

from __future__ import annotations

import importlib

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


@pytest.mark.parametrize(("module", "old", "new"), [
    ("bcos_plugins._checks", "_warn_unmasked_padding", "_emit_unmasked_padding_warning"),
    ("bcos_plugins.adapters._lens.bridge", "_warn_about_unmasked_padding", "_check_bridge_input_for_unmasked_padding"),
])
def test_the_two_unmasked_padding_helpers_have_names_that_say_how_they_differ(module, old, new):
    # one emits the warning (its callers detected the padding), the other checks a bridge forward's input: the old
    # names (_warn_unmasked_padding, _warn_about_unmasked_padding) said the same thing twice
    mod = importlib.import_module(module)
    assert callable(getattr(mod, new))
    assert not hasattr(mod, old)
