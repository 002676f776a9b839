"""``explain``'s own checks bring their conditions to the host in as few device-to-host syncs as they need.

On a GPU every ``if tensor.any()``, ``.item()``, ``.tolist()``, ``int(tensor)`` or ``float(tensor)`` waits for the
stream to finish (issue 30: ``explain`` <= 1.25x Captum IxG on an H100). The package's checks compute their
conditions as tensors and bring them to the host together; only a failing check builds its message (which may
sync freely). These tests count the syncs the package's own code makes in one ``explain`` call (transformers'
own are not counted), so that a change that adds one fails here, naming where it is.
"""

from __future__ import annotations

import collections
import sys
import traceback
from pathlib import Path

import pytest
import torch
import transformers as T

import bcos_plugins
from bcos_plugins import bcosify, explain

PACKAGE = str(Path(bcos_plugins.__file__).resolve().parent)
# the Tensor methods that bring a value to the host (on CUDA: wait for the stream)
SYNCING_METHODS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")

# the syncs of one explain call, per model: which checks they are (so that a change that removes one updates this)
# - token batch (_checks.require_token_batch): ids inside the vocabulary, mask of 0/1, a real token per row, together: 1
# - ModernBERT classifies from the first column: a left-padded row is refused (check_first_column_is_real): 1, none
#   where the token batch's sync found no padding
# - a causal LM's target ids inside the vocabulary (_checks.require_row_ids): 1
# - a given position outside the row or on padding (resolve_positions, both in one): 1
# - the step's finiteness and the completeness, together (explain._require_complete): 1
EXPECTED_SYNCS = {"classifier": 3, "classifier, unpadded": 2, "causal LM": 3, "causal LM, position": 4}


def _tiny(kind: str):
    common = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    if kind == "classifier":
        model = T.ModernBertForSequenceClassification(
            T.ModernBertConfig(**common, cls_token_id=1, sep_token_id=2, num_labels=2))
    else:
        model = T.Qwen2ForCausalLM(T.Qwen2Config(**common, num_key_value_heads=2))
    return bcosify(model, b=1.25, verbose=False).eval()


def _count_package_syncs(monkeypatch, call) -> collections.Counter:
    """Run ``call`` and count, per line of the package, the syncing Tensor methods the package's code calls."""
    counts: collections.Counter = collections.Counter()

    def counting(name):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(PACKAGE):
                where = traceback.extract_stack(caller, limit=1)[0]
                counts[f"{name} at {Path(where.filename).relative_to(PACKAGE)}:{where.lineno} ({where.name})"] += 1
            return original(self, *args, **kwargs)
        return method

    for name in SYNCING_METHODS:
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    call()
    monkeypatch.undo()
    return counts


@pytest.mark.parametrize("case", list(EXPECTED_SYNCS))
def test_one_explain_call_syncs_with_the_host_no_more_than_its_checks_need(monkeypatch, case):
    model = _tiny("classifier" if case.startswith("classifier") else "causal LM")
    ids = torch.randint(3, 100, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if case != "classifier, unpadded":
        mask[1, 7:] = 0  # right padding: allowed for both models
    kwargs = {} if case.startswith("classifier") else {"target": torch.tensor([5, 6, 7])}
    if case == "causal LM, position":
        kwargs["position"] = -2
    expected = explain(model, ids, mask, **kwargs)
    counts = _count_package_syncs(monkeypatch, lambda: explain(model, ids, mask, **kwargs))
    listing = "\n".join(f"{n} x {site}" for site, n in sorted(counts.items()))
    assert sum(counts.values()) <= EXPECTED_SYNCS[case], f"explain syncs with the host more often:\n{listing}"
    # the counter saw the package's checks (it did not miss them all), and the call gave the same numbers
    assert sum(counts.values()) == EXPECTED_SYNCS[case], f"fewer syncs: update EXPECTED_SYNCS\n{listing}"
    again = explain(model, ids, mask, **kwargs)
    assert torch.equal(again.contributions, expected.contributions)


def test_the_sync_counter_sees_a_check_that_syncs(monkeypatch):
    # the counter counts a sync of the package's code (a failing check's message path syncs freely)
    from bcos_plugins._checks import named_rows

    counts = _count_package_syncs(monkeypatch, lambda: named_rows(torch.tensor([False, True])))
    assert sum(counts.values()) >= 1
    assert all("_checks.py" in site for site in counts)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_one_sync_finiteness_condition_sees_every_non_finite_value_and_no_finite_one(dtype):
    # non_finite_step replaces isfinite(x).all() per tensor by one sum of zero products: it must flag NaN, inf and
    # -inf anywhere (output or gradient), and not flag the largest finite values (a sum of them would overflow)
    from bcos_plugins.attribution.gradient import GradientStep, non_finite_step

    def step(explained, gradient):
        return GradientStep(explained=explained, leaves=(gradient,), gradients=(gradient,), contributions=(gradient,))

    explained, gradient = torch.randn(3, dtype=dtype), torch.randn(3, 5, 4, dtype=dtype)
    largest = torch.full_like(gradient, torch.finfo(dtype).max)
    assert not bool(non_finite_step(step(explained, gradient)))
    assert not bool(non_finite_step(step(torch.full_like(explained, -torch.finfo(dtype).max), largest)))
    for bad in (float("nan"), float("inf"), -float("inf")):
        for broken in ("explained", "gradient"):
            e, g = explained.clone(), gradient.clone()
            (e if broken == "explained" else g.view(-1))[2] = bad
            assert bool(non_finite_step(step(e, g))), (bad, broken)
