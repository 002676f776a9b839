"""torch.compile(model, dynamic=True) on B-cos BERT, GPT-2 and Llama: the forward, a training step and ``explain``
trace (fullgraph) and equal eager. With dynamic=True, dynamo (torch 2.13) turns every float it reads from a
module, class or default argument into a graph input, and fails at the second ``autograd.Function`` that reads one
(``AssertionError: lift_tracked_freevar_to_input should not be called on root SubgraphTracer``), so the fused
layers' Functions read their constants as literals (see bcos_plugins/nn/functional.py, "Constants")."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import padded_batch, tiny_config

from bcos_plugins import bcosify, explain


def _one_layer_model(name: str) -> torch.nn.Module:
    import transformers as T

    config = tiny_config({"Bert": "bert", "GPT2": "gpt2", "Llam": "llama"}[name[:4]])
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(config, key):
            setattr(config, key, 1)
    torch.manual_seed(0)
    return bcosify(getattr(T, name)(config).eval(), b=1.25, verbose=False)


def _training_step(model, ids, mask, labels):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask).logits
    torch.nn.functional.cross_entropy(logits, labels).backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2ForSequenceClassification",
                                  "LlamaForSequenceClassification"])
def test_compiled_dynamic_forward_training_and_explain_equal_eager(name):
    # "aot_eager" traces the forward and the fused layers' backward as inductor would (inductor would add minutes
    # of C++ compilation on CPU); fullgraph=True makes any graph break fail instead of falling back to eager
    torch._dynamo.reset()
    model = _one_layer_model(name)
    ids, mask = padded_batch()
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    eager_explained = explain(model, ids, mask)
    eager_step = _training_step(model, ids, mask, labels)
    model.compile(dynamic=True, fullgraph=True, backend="aot_eager")
    try:
        with torch.no_grad():
            compiled_logits = model(input_ids=ids, attention_mask=mask).logits
        compiled_step = _training_step(model, ids, mask, labels)
        compiled_explained = explain(model, ids, mask)
        # a shorter batch runs on the same dynamic graph
        short_ids, short_mask = padded_batch(length=7)
        short = explain(model, short_ids, short_mask)
    finally:
        model._compiled_call_impl = None
        torch._dynamo.reset()
    torch.testing.assert_close(compiled_logits, logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_step[0], eager_step[0], rtol=1e-5, atol=1e-6)
    assert compiled_step[1].keys() == eager_step[1].keys() and len(eager_step[1]) > 0
    for key, grad in eager_step[1].items():
        # float32 rounding of a reordered sum: Llama's v_proj gradient (largest 5.2) is 4e-6 off, the same off
        # under fullgraph=True without dynamic (aot_eager's decompositions), so the tolerance scales with it
        torch.testing.assert_close(compiled_step[1][key], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(),
                                   msg=key)
    torch.testing.assert_close(compiled_explained.explained, eager_explained.explained, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_explained.input_contributions, eager_explained.input_contributions,
                               rtol=1e-4, atol=1e-6)
    assert compiled_explained.completeness_error.max() < 1e-5
    eager_short = explain(model, short_ids, short_mask)
    torch.testing.assert_close(short.input_contributions, eager_short.input_contributions, rtol=1e-4, atol=1e-6)


def test_compiled_dynamic_layers_called_twice_equal_eager():
    # a module's float attribute (the layer norm's eps) is a graph input under dynamic=True too: read first
    # inside the Function, the second call of the same layer failed (lift_tracked_freevar_to_input)
    from bcos_plugins.nn import BcosLayerNorm, BcosLinear
    from bcos_plugins.nn.dynamic import explanation_mode

    torch._dynamo.reset()
    torch.manual_seed(0)
    norm, linear = BcosLayerNorm(8, eps=1e-5), BcosLinear(8, 8, b=1.5)

    def twice(x):
        return norm(linear(norm(linear(x))))

    compiled = torch.compile(twice, dynamic=True, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 8, requires_grad=True)
    weights = torch.randn(3, 8)  # a loss whose gradient does not cancel (a squared layer norm's sum is constant)
    try:
        for explaining in (False, True):
            with explanation_mode() if explaining else contextlib.nullcontext():
                eager = twice(x)
                eager_grads = torch.autograd.grad((eager * weights).sum(), (x, linear.weight))
                out = compiled(x)
                grads = torch.autograd.grad((out * weights).sum(), (x, linear.weight))
            torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
            for grad, eager_grad in zip(grads, eager_grads, strict=True):  # float32 rounding, as above
                torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-5 * eager_grad.abs().max().item())
    finally:
        torch._dynamo.reset()


class _CountingBackend:
    """A torch.compile backend that runs each traced graph as it is and counts the graphs it was given."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2ForSequenceClassification",
                                  "LlamaForSequenceClassification"])
def test_compiled_dynamic_explain_is_not_traced_again_for_another_batch_or_length(name):
    # explain's probe (ones of the point's shape, the contributions' leaf) was read by the capture hook from its
    # closure: dynamo gives static shapes to a tensor reached through a torch.nn module's hooks (GPT-2's point is
    # at its Dropout, Llama's at its Embedding), the probe's shape was compared with the point's, and the graph was
    # specialised to the first batch and length: each new shape traced (and under inductor compiled, ~40 s here)
    # explain again, silently, until dynamo's recompile limit. BERT's point, at its BcosLayerNorm, was dynamic.
    torch._dynamo.reset()
    model = _one_layer_model(name)
    batches = [padded_batch(), padded_batch(length=7), padded_batch(batch=2, length=11)]
    eager = [explain(model, ids, mask) for ids, mask in batches]
    backend = _CountingBackend()
    model.compile(dynamic=True, fullgraph=True, backend=backend)
    try:
        compiled = [explain(model, *batches[0])]
        traced = backend.graphs
        compiled += [explain(model, ids, mask) for ids, mask in batches[1:]]
    finally:
        model._compiled_call_impl = None
        torch._dynamo.reset()
    assert traced == 1
    assert backend.graphs == traced, "explain was traced again for another batch size or length"
    for got, expected in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got.explained, expected.explained, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.input_contributions, expected.input_contributions, rtol=1e-4, atol=1e-6)
