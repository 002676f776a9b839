"""The speed paths of ModernBERT's explanation (issues 28 and 30) against the paths they shortcut: values and
gradients the same bits where the same kernels run in the same order, the reference path within rounding."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins import explain
from bcos_plugins.nn import BcosLayerNorm, explanation_mode
from bcos_plugins.nn.dynamic import no_parameter_gradients
from bcos_plugins.nn.functional import reference_path


def _layer_norm(dtype: torch.dtype, affine: bool = True) -> BcosLayerNorm:
    torch.manual_seed(0)
    norm = BcosLayerNorm(16, elementwise_affine=affine).to(dtype)
    if affine:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_explaining_layer_norm_input_gradient_only_path_equals_the_general_backward_and_the_reference(dtype, affine):
    # explain's layer norm (no gain gradient) saves only gamma and rsqrt(var + eps) and runs the input gradient
    # alone; with the gain's gradient taken the general backward runs: the input gradients are the same bits
    norm = _layer_norm(dtype, affine)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    upstream = torch.randn(3, 5, 16, dtype=dtype)
    with explanation_mode(norm), no_parameter_gradients():
        out = norm(x)
        (fast,) = torch.autograd.grad(out, x, upstream)
    with explanation_mode(norm):
        general_out = norm(x)
        inputs = [x, norm.weight] if affine else [x]
        general = torch.autograd.grad(general_out, inputs, upstream)
    assert torch.equal(out, general_out) and torch.equal(fast, general[0])
    with explanation_mode(norm), reference_path():
        (reference,) = torch.autograd.grad(norm(x), x, upstream)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(fast, reference, **tolerance)


def test_explaining_layer_norm_input_gradient_only_path_is_differentiable_again_with_the_scale_constant():
    # a loss on an explanation differentiates the backward: rsqrt(var + eps) stays a constant there too
    norm = _layer_norm(torch.float64)
    x0 = torch.randn(3, 16, dtype=torch.float64)
    readout = torch.linspace(-1, 2, 16, dtype=torch.float64)

    def second(reference: bool):
        x = x0.clone().requires_grad_()
        with explanation_mode(norm), no_parameter_gradients(), reference_path(reference):
            (grad,) = torch.autograd.grad((norm(x) * readout).sum(), x, create_graph=True)
            return torch.autograd.grad((x * grad).square().sum(), x)[0]

    torch.testing.assert_close(second(False), second(True), rtol=1e-12, atol=1e-13)


def _modernbert(attn_implementation: str, layer_types: list[str] | None = None):
    import transformers as T

    from bcos_plugins import bcosify

    config = T.ModernBertConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                sep_token_id=2, num_labels=2, local_attention=4, attn_implementation=attn_implementation)
    if layer_types is not None:
        config.layer_types = layer_types
    torch.manual_seed(0)
    return bcosify(T.ModernBertForSequenceClassification(config).eval(), b=1.25, verbose=False).eval()


def _with_stock_attention(model):
    """A copy of ``model`` whose attention modules run transformers' own forward on every path."""
    import copy

    from transformers.models.modernbert.modeling_modernbert import ModernBertAttention

    stock = copy.deepcopy(model)
    for module in stock.modules():
        if isinstance(module, ModernBertAttention):
            module.__class__ = ModernBertAttention
    return stock


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_explaining_modernbert_attention_with_query_and_key_detached_equals_the_stock_forward(attn_implementation):
    # explaining, the query and key enter the rotary embedding detached (nothing of it recorded); the stock forward
    # differentiates it and Wqkv sets the query/key gradient to 0 afterwards: the same outputs and gradients, bit for bit
    from bcos_plugins.convert.modernbert import BcosModernBertAttention

    model = _modernbert(attn_implementation, layer_types=["sliding_attention", "full_attention"])
    stock = _with_stock_attention(model)
    assert sum(isinstance(m, BcosModernBertAttention) for m in model.modules()) == 2
    assert "model.layers.0.attn" in model.bcos_report.patched_modules
    ids = torch.randint(3, 60, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padding (on the right: the classifier reads the first column)
    mask[2, 4:] = 0
    ours, theirs = (explain(m, ids, mask) for m in (model, stock))
    assert torch.equal(ours.explained, theirs.explained)
    assert torch.equal(ours.input_contributions, theirs.input_contributions)
    with torch.no_grad():  # and outside explanation mode the stock forward runs
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits,
                           stock(input_ids=ids, attention_mask=mask).logits)
    # the rotary embedding is not differentiated: rotate_half's negation and concatenation are not in the graph
    rotary_nodes = {"NegBackward0", "CatBackward0"}
    assert not rotary_nodes & _graph_node_names(_attention_output(model, ids, mask))
    assert rotary_nodes <= _graph_node_names(_attention_output(stock, ids, mask))


def _attention_output(model, ids, mask):
    recorded = []
    handle = model.model.layers[1].attn.register_forward_hook(lambda module, args, out: recorded.append(out[0]))
    try:
        explain(model, ids, mask)
    finally:
        handle.remove()
    return recorded[0]


def _graph_node_names(t: torch.Tensor) -> set[str]:
    seen, names, stack = set(), set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            names.add(type(node).__name__)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_explain_still_refuses_a_non_finite_gradient_of_a_finite_output_found_through_delta():
    # explain tests the gradients' finiteness exactly only where a row's delta is not finite: a NaN or infinite
    # gradient entry makes the contributions' sum, and so delta, NaN or infinite; the refusal and its message stay
    from bcos_plugins.errors import BcosValueError

    model = _modernbert("sdpa")
    ids = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    healthy = explain(model, ids, mask)
    for bad in (float("nan"), float("inf")):
        def poison(module, grad_input, grad_output, bad=bad):
            grad = grad_input[0].clone()
            grad[1, 3, 5] = bad
            return (grad, *grad_input[1:])

        handle = model.model.layers[0].mlp_norm.register_full_backward_hook(poison)
        try:
            with pytest.raises(BcosValueError, match="^the gradient at the attribution point is NaN or infinite"):
                explain(model, ids, mask)
        finally:
            handle.remove()
    assert torch.equal(explain(model, ids, mask).input_contributions, healthy.input_contributions)


def _wi_layers(model):
    return [(name, module) for name, module in model.named_modules() if name.endswith("mlp.Wi")]


def test_bcosify_declares_wi_activated_half_constant_units_from_the_registry_spec():
    # the spec's gate_units (one registry field) gives every Wi the constant units of its activated half, and the
    # report lists them apart from the query/key projections
    from bcos_plugins.convert.architectures import SPECS

    assert SPECS["ModernBertForSequenceClassification"].gate_units == {"mlp.Wi": "first_half"}
    model = _modernbert("sdpa")
    wi = _wi_layers(model)
    assert len(wi) == 2
    for _, layer in wi:
        assert layer.constant_outputs == slice(0, layer.out_features // 2) == slice(0, 64)
    report = model.bcos_report
    assert report.constant_gate_outputs == [name for name, _ in wi]
    assert not set(report.constant_gate_outputs) & set(report.constant_outputs)
    assert "2 gated-MLP input projections with their activated units constant" in report.summary()


def test_a_family_without_gate_units_reports_none():
    from conftest import tiny_model

    from bcos_plugins import bcosify

    report = bcosify(tiny_model("LlamaForCausalLM"), b=1.25, verbose=False).bcos_report
    assert report.constant_gate_outputs == []  # a Llama's gate is a projection of its own
    assert "gated-MLP input projections" not in report.summary()


@pytest.mark.parametrize("parameter_gradients", [False, True])
def test_explaining_with_wi_activated_half_constant_gives_the_same_bits_as_without(monkeypatch, parameter_gradients):
    # Wi's activated half feeds only act(input), a constant while explaining, so its gradient was 0 already: with the
    # units declared constant the backward leaves their rows out (one-block node) or zeroes them (the general
    # path, taken when parameter gradients are), and every output and input gradient is the same bits
    import copy

    from bcos_plugins.nn import functional

    model = _modernbert("sdpa")
    before = copy.deepcopy(model)
    for _, layer in _wi_layers(before):
        layer.constant_outputs = None  # the conversion before the spec declared gate_units
    ids = torch.randint(3, 60, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    if not parameter_gradients:
        applied = []
        original = functional._KeptUnitsProduct.apply
        monkeypatch.setattr(functional._KeptUnitsProduct, "apply", lambda *args: applied.append(1) or original(*args))
        fast, general = explain(model, ids, mask), explain(before, ids, mask)
        assert len(applied) == 2 * 2 + 2  # both calls: each layer's Wqkv, and Wi in the converted model only
        for name in ("input_contributions", "explained", "delta"):
            assert torch.equal(getattr(fast, name), getattr(general, name))
        assert fast.completeness_error.max() < 1e-4
        return
    outcomes = []
    for m in (model, before):
        embeds = m.get_input_embeddings()(ids).detach().requires_grad_()
        with explanation_mode(m):
            logits = m(inputs_embeds=embeds, attention_mask=mask).logits
            grads = torch.autograd.grad(logits[:, 1].sum(), [embeds, *m.parameters()], allow_unused=True)
        outcomes.append((logits.detach(), *grads))
    for a, b in zip(*outcomes, strict=True):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_training_ignores_wi_constant_units():
    # outside explanation mode no unit is constant: the training gradients of a converted model are those without
    import copy

    model = _modernbert("sdpa").train()
    before = copy.deepcopy(model)
    for _, layer in _wi_layers(before):
        layer.constant_outputs = None
    ids = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(3))
    grads = []
    for m in (model, before):
        torch.manual_seed(0)  # the same dropout masks
        loss = m(input_ids=ids, labels=torch.tensor([0, 1])).loss
        grads.append(torch.autograd.grad(loss, list(m.parameters()), allow_unused=True))
    for a, b in zip(*grads, strict=True):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert any(g is not None and g[: g.shape[0] // 2].abs().sum() > 0
               for (name, _), g in zip(model.named_parameters(), grads[0], strict=True) if name.endswith("Wi.weight"))
