"""``explain``'s forward computes no output that is not explained (``attribution.text.explained_outputs_only``): a
causal LM's head runs on the explained columns only (``logits_to_keep``, one per row) and a decoder builds no key/value
cache; the same explanation as before, for every registry decoder, every padding side and position."""

from __future__ import annotations

import pytest
import torch
from conftest import padded_rows
from test_conformance import _stock

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import text
from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.errors import BcosRuntimeError

CAUSAL_LMS = sorted(name for name, spec in SPECS.items() if spec.head == "causal_lm")


def _explain_with_every_column(monkeypatch, *args, **kwargs):
    """explain as before explained_outputs_only: the head runs on every column, the cache is built."""
    import sys

    with monkeypatch.context() as patch:
        patch.setattr(sys.modules["bcos_plugins.explain"], "explained_outputs_only", lambda spec, call, *rest: call)
        return explain(*args, **kwargs)


def _head_columns(model) -> list[int]:
    """The number of columns the LM head computes, per call, recorded by a hook."""
    columns: list[int] = []
    model.get_output_embeddings().register_forward_hook(lambda m, args, out: columns.append(out.shape[1]))
    return columns


@pytest.mark.parametrize("name", CAUSAL_LMS)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("position", [None, 5, -2, [6, 5, 7]])
def test_explain_keeps_only_the_explained_columns_logits_with_the_same_explanation(monkeypatch, name, side, position):
    model = bcosify(_stock(name), b=1.25, verbose=False).eval()
    ids, mask = padded_rows([9, 7, 9], 9, side, seed=1)
    columns = _head_columns(model)
    kept = explain(model, ids, mask, target=[4, 9, 11], foil=3, position=position)
    every = _explain_with_every_column(monkeypatch, model, ids, mask, target=[4, 9, 11], foil=3, position=position)
    positions = kept.position
    assert torch.equal(positions, every.position)
    assert columns == [3, 9]  # the head ran on the 3 explained columns, then (as before) on all 9
    for field in ("explained", "input_contributions", "contributions"):
        torch.testing.assert_close(getattr(kept, field), getattr(every, field), rtol=1e-6, atol=1e-7)
    assert float(kept.completeness_error.max()) < 1e-4
    with torch.no_grad():  # the explained value is the logit difference at each row's explained column
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits
    expected = logits[torch.arange(3), positions, torch.tensor([4, 9, 11])] - logits[torch.arange(3), positions, 3]
    torch.testing.assert_close(kept.explained, expected, rtol=1e-5, atol=1e-6)


def test_only_a_causal_lm_batch_of_fewer_rows_than_columns_keeps_its_explained_logits():
    only = text.explained_outputs_only
    call = {"input_ids": None}
    positions = torch.tensor([4, 5])
    kept = only(SPECS["LlamaForCausalLM"], call, positions, 9)
    assert kept.keys() == {"input_ids", "use_cache", "logits_to_keep"} and kept["logits_to_keep"] is positions
    no_cache = {"input_ids": None, "use_cache": False}
    assert only(SPECS["LlamaForCausalLM"], call, positions, 2) == no_cache  # 2 rows, 2 columns
    assert only(SPECS["LlamaModel"], call, positions, 9) == no_cache
    assert only(SPECS["LlamaForSequenceClassification"], call, None, 9) == no_cache
    assert only(SPECS["BertForMaskedLM"], call, positions, 9) is call  # an encoder: neither
    assert only(SPECS["BertForSequenceClassification"], call, None, 9) is call
    with_labels = {"input_ids": None, "labels": None}  # the loss reads every column's logits
    assert only(SPECS["LlamaForCausalLM"], with_labels, positions, 9) == {**with_labels, "use_cache": False}
    own_cache = {"input_ids": None, "use_cache": True}  # the caller's use_cache is kept
    assert only(SPECS["LlamaForCausalLM"], own_cache, positions, 9) == {**own_cache, "logits_to_keep": positions}


DECODERS = sorted(name for name, spec in SPECS.items() if spec.kind == "decoder")


@pytest.mark.parametrize("name", DECODERS)
def test_explaining_a_decoder_builds_no_cache_and_gives_the_same_bits(monkeypatch, name):
    model = bcosify(_stock(name), b=1.25, verbose=False).eval()
    ids, mask = padded_rows([9, 7, 9], 9, "right", seed=2)
    calls = []
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(kwargs.get("use_cache")), with_kwargs=True)
    caches = []
    model.register_forward_hook(lambda m, args, out: caches.append(getattr(out, "past_key_values", None)))
    target = None if SPECS[name].is_classifier else [4, 9, 11]
    now = explain(model, ids, mask, target=target)
    before = _explain_with_every_column(monkeypatch, model, ids, mask, target=target)
    assert calls == [False, None] and caches[0] is None
    for field in ("explained", "input_contributions", "delta"):
        torch.testing.assert_close(getattr(now, field), getattr(before, field), rtol=1e-6, atol=1e-7)


def test_explain_with_labels_still_runs_the_head_on_every_column_for_the_models_loss():
    model = bcosify(_stock("LlamaForCausalLM"), b=1.25, verbose=False).eval()
    ids = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    columns = _head_columns(model)
    with_labels = explain(model, ids, target=4, labels=ids)  # crashed in the loss when only the kept logits came
    plain = explain(model, ids, target=4)
    assert columns == [9, 2]
    for field in ("explained", "input_contributions"):
        torch.testing.assert_close(getattr(with_labels, field), getattr(plain, field), rtol=1e-6, atol=1e-7)


def test_outputs_of_every_column_or_the_kept_ones_are_read_at_the_explained_columns_and_others_refused():
    outputs = torch.arange(2 * 9 * 3).reshape(2, 9, 3)
    positions = torch.tensor([4, 7])
    expected = outputs[torch.arange(2), positions]
    assert torch.equal(text.logits_at_positions(outputs, positions, 9), expected)  # a forward that ignored it
    assert torch.equal(text.logits_at_positions(outputs[:, positions], positions, 9), expected)
    for columns in (3, 10):
        with pytest.raises(BcosRuntimeError, match=f"returned {columns} columns of outputs for 9 input columns"):
            text.logits_at_positions(torch.zeros(2, columns, 3), positions, 9)
