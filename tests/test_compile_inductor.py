"""torch.compile's default backend, inductor (C++ code generated and built on CPU), on B-cos BERT, GPT-2 and Llama:
the forward, a training step's gradients and ``explain`` equal eager, with ``fullgraph=True``, statically and with
``dynamic=True`` (another batch size and length run on the graphs compiled for the first). tests/test_compile_dynamic.py
checks the same on aot_eager, which traces as inductor does without building code; these check inductor's lowering
and code. Slow (marked, run by the full suite): the four cases took 1263 s of wall time, 314 s of CPU, with an
empty inductor cache on the loaded 2-core machine (docs/api/nn.md)."""

from __future__ import annotations

import pytest
import torch
from conftest import padded_batch
from test_compile_dynamic import _one_layer_model, _training_step
from torch._dynamo.utils import counters

from bcos_plugins import explain

pytestmark = pytest.mark.slow


def _runs(model, batches):
    """The no-grad logits, a training step (logits and gradients) and the explanation for each batch."""
    out = []
    for ids, mask in batches:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        step = _training_step(model, ids, mask, torch.tensor([0, 2, 1])[:len(ids)])
        out.append((logits, step, explain(model, ids, mask)))
    return out


def _assert_equal_eager(compiled, eager):
    for (logits, step, explained), (eager_logits, eager_step, eager_explained) in zip(compiled, eager, strict=True):
        torch.testing.assert_close(logits, eager_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(step[0], eager_step[0], rtol=1e-5, atol=1e-6)
        assert step[1].keys() == eager_step[1].keys() and len(eager_step[1]) > 0
        for key, grad in eager_step[1].items():
            # float32 rounding of reordered sums (inductor fuses and reorders): measured at most 9e-6 of the largest
            # gradient of the tensor (Llama); the tolerance scales with it as in test_compile_dynamic.py
            torch.testing.assert_close(step[1][key], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(), msg=key)
        torch.testing.assert_close(explained.explained, eager_explained.explained, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(explained.input_contributions, eager_explained.input_contributions,
                                   rtol=1e-4, atol=1e-6)
        assert explained.completeness_error.max() < 1e-5


@pytest.mark.parametrize(("name", "dynamic"), [("BertForSequenceClassification", True),
                                               ("GPT2ForSequenceClassification", True),
                                               ("LlamaForSequenceClassification", True),
                                               ("LlamaForSequenceClassification", False)])
def test_inductor_forward_training_and_explain_equal_eager(name, dynamic):
    torch._dynamo.reset()
    model = _one_layer_model(name)
    # dynamic=False compiles each new shape again (and then dynamo marks it dynamic itself): one shape there
    batches = [padded_batch(), padded_batch(batch=2, length=11)][:2 if dynamic else 1]
    eager = _runs(model, batches)
    model.compile(dynamic=dynamic, fullgraph=True)
    try:
        first = counters["stats"]["unique_graphs"]
        compiled = _runs(model, batches[:1])
        graphs = counters["stats"]["unique_graphs"] - first
        compiled += _runs(model, batches[1:])
        again = counters["stats"]["unique_graphs"] - first - graphs
    finally:
        model._compiled_call_impl = None
        torch._dynamo.reset()
    assert graphs == 3  # the no-grad forward, the training step and explain's forward (grad mode and arguments)
    assert again == 0, "another batch size and length were compiled again under dynamic=True"
    _assert_equal_eager(compiled, eager)
