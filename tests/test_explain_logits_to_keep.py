"""``explain`` runs a causal LM's head on the explained columns only (``logits_to_keep``, one per row): the same
explanation as with every column's logits, for every registry causal LM, every padding side and position."""

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
    """explain as before logits_to_keep: the head runs on every column."""
    import sys

    with monkeypatch.context() as patch:
        patch.setattr(sys.modules["bcos_plugins.explain"], "keep_explained_logits", lambda spec, call, *rest: call)
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
    call = {"input_ids": None}
    positions = torch.tensor([4, 5])
    kept = text.keep_explained_logits(SPECS["LlamaForCausalLM"], call, positions, 9)
    assert kept.keys() == {"input_ids", "logits_to_keep"} and kept["logits_to_keep"] is positions
    assert text.keep_explained_logits(SPECS["LlamaForCausalLM"], call, positions, 2) is call  # 2 rows, 2 columns
    assert text.keep_explained_logits(SPECS["LlamaModel"], call, positions, 9) is call
    assert text.keep_explained_logits(SPECS["BertForMaskedLM"], call, positions, 9) is call
    assert text.keep_explained_logits(SPECS["LlamaForSequenceClassification"], call, positions, 9) is call
    with_labels = {"input_ids": None, "labels": None}  # the loss reads every column's logits
    assert text.keep_explained_logits(SPECS["LlamaForCausalLM"], with_labels, positions, 9) is with_labels


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
