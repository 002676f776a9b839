"""How many aten ops one B-cos linear forward dispatches (the eager B-cos forward on a GPU is bound by kernel
launches, docs/benchmarks.md), and the unit-norm weight cache that removes the weight normalisation from
inference and explanations inside ``reuse_unit_weights()`` (opt-in: a ``weight.data`` write is invisible to it):
it is used only while no gradient of the weight is needed and the weight is unchanged, and it never changes a
value. Every test of this module runs inside ``reuse_unit_weights()`` (the autouse fixture) except the
``test_by_default_*`` ones."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
from conftest import RecordedOps, padded_batch, tiny_model

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosTypeError
from bcos_plugins.nn import (
    BcosConv1D,
    BcosConv2d,
    BcosLayerNorm,
    BcosLinear,
    DetachableActivation,
    explanation_mode,
    reference_path,
    reuse_unit_weights,
)
from bcos_plugins.nn.dynamic import no_parameter_gradients
from bcos_plugins.nn.functional import (
    cached_unit_norm,
    clear_unit_norm_cache,
    input_norm,
    unit_norm,
    using_reference_path,
)


@pytest.fixture(autouse=True)
def _reuse_unit_weights(request):
    if request.node.name.startswith("test_by_default"):
        yield
        return
    with reuse_unit_weights():
        yield


# views and allocations launch no kernel: not counted
_NO_KERNEL = {"t", "view", "_unsafe_view", "detach", "alias", "unsqueeze", "expand", "as_strided", "new_empty",
              "empty", "empty_like"}


def _forward_ops(layer: torch.nn.Module, mode: str, autocast: bool) -> list[str]:
    """The aten ops of the second of two forward passes (the first fills the weight cache), on a new input
    tensor each (layers reading the same input tensor share its norm: see the last test)."""
    x = torch.randn(4, 7, 32)
    amp = torch.autocast("cpu", torch.bfloat16) if autocast else contextlib.nullcontext()

    def forward(x):
        if mode == "inference":
            with torch.no_grad():
                return layer(x)
        with explanation_mode(layer), no_parameter_gradients():  # as explain / input_x_gradient run it
            return layer(x.requires_grad_())

    first, second = x.clone(), x.clone()
    with amp:
        forward(first)
        with RecordedOps(_NO_KERNEL) as counter:
            forward(second)
    return counter.ops


# Measured when the fused path was slimmed, for B = 2 (B = 1.5 adds one sqrt_, B = 1.25 two). Before: 14 ops
# in float32 (vector_norm clamp_min div | mm | vector_norm mul add sqrt | promote_types reciprocal mul abs_
# clamp_min_ | mul_), 17 under bfloat16 autocast (+ the weight's and the input's casts, the reciprocal's cast).
# Now the weight normalisation is cached, the input norm is one reduction and one hypot, and the scale is
# |lin| times the per-row reciprocal, floored, all in place: mm | vector_norm hypot | abs reciprocal mul_
# clamp_min_ | mul_. Inference leaves the floor out (only derivatives need it): one op fewer; explaining writes the
# product into the matrix product's output (mul_, no fresh tensor). Lower these bounds when you cut more.
# + 1 since 2026-11-29 (the lead's decision, note 24): nan_to_num on the per-row input norm after the hypot, so a row
# whose norm overflows float32 gives NaN, not 0 (one element-wise kernel on the norms, once per distinct input; the
# MiniLM forward's cost within noise, docs/benchmarks.md#nn-norm-overflow-nan)
OP_BOUNDS = {
    ("inference", False): 8,
    ("inference", True): 9,  # + autocast's cast of the float32 input
    ("explaining", False): 9,
    ("explaining", True): 10,
}


# Outside reuse_unit_weights() (the default) the weight is normalised on every call: + vector_norm clamp_min div.
# Under autocast the division stores the autocast dtype itself (before 2026-11-28: + the normalised weight's cast).
# + 1 since 2026-11-29 (the lead's decision, helper-201): nan_to_num on the (units, 1) weight norms, so a unit whose norm
# overflows float32 gives NaN, not 0 (once per normalisation: a reused unit weight takes none; docs/benchmarks.md)
DEFAULT_EXTRA_OPS = {False: 4, True: 4}


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
@pytest.mark.parametrize("mode", ["inference", "explaining"])
def test_by_default_every_forward_normalises_the_weight(mode, autocast):
    ops = _forward_ops(BcosLinear(32, 16, b=2.0).eval(), mode, autocast)
    bound = OP_BOUNDS[(mode, autocast)] + DEFAULT_EXTRA_OPS[autocast]
    assert len(ops) <= bound, f"{len(ops)} ops > {bound}: {ops}"
    assert ops.count("linalg_vector_norm") == 2 and "div" in ops, ops
    # the overflowed-norm NaN of the input's norm and of the weight's unit norms, the one op each
    assert ops.count("nan_to_num") == 2, ops


def test_by_default_an_explanation_records_no_weight_normalisation():
    # inside no_parameter_gradients (explanations) no gradient of the weight is taken: the unit-norm weight is
    # computed afresh without autograd history (no norm, clamp and division nodes recorded per layer and call);
    # the input gradient is the reference path's. Training, and explaining while weight gradients are wanted,
    # record the normalisation as before
    torch.manual_seed(0)
    layer = BcosLinear(8, 4, b=1.5)
    x = torch.randn(3, 8, requires_grad=True)
    with explanation_mode(layer):
        with no_parameter_gradients():
            assert cached_unit_norm(layer.weight, dim=1).grad_fn is None
            (grad,) = torch.autograd.grad(layer(x).sum(), x)
        assert cached_unit_norm(layer.weight, dim=1).grad_fn is not None  # weight gradients wanted
        with reference_path(), no_parameter_gradients():
            assert cached_unit_norm(layer.weight, dim=1).grad_fn is not None  # the step-by-step maths, recorded
            (expected,) = torch.autograd.grad(layer(x).sum(), x)
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-7)
    assert cached_unit_norm(layer.weight, dim=1).grad_fn is not None


def test_by_default_a_weight_data_write_is_seen_and_inside_the_scope_clearing_makes_it_seen():
    layer = BcosLinear(8, 4, b=2.0).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        before = layer(x)
        layer.weight.data[0] = -layer.weight.data[0]  # an ablation written the old way: no version bump
        after = layer(x)
    torch.testing.assert_close(after[:, 0], -before[:, 0])  # unit 0 flips sign: the new weight is read
    with reuse_unit_weights(), torch.no_grad():
        cached = layer(x)
        layer.weight.data[1] = 0.5 * layer.weight.data[1]
        clear_unit_norm_cache(layer)
        torch.testing.assert_close(layer(x), cached)  # unit norm: scaling a weight row changes nothing
        layer.weight.data[2] = -layer.weight.data[2]
        clear_unit_norm_cache(layer)
        torch.testing.assert_close(layer(x)[:, 2], -cached[:, 2])
    with pytest.raises(BcosTypeError, match=r"^enabled: must be True or False, got str 'yes'\. Call reuse_unit_weights\(\) "
                                            r"or reuse_unit_weights\(False\)\.$"):
        with reuse_unit_weights("yes"):
            pass


def test_by_default_the_cached_copies_last_until_the_outermost_reuse_block_ends_and_errors_restore_the_switches():
    # reuse_unit_weights and reference_path share one scoped switch: nested blocks, an error inside, the message
    weight = torch.randn(4, 8)
    with reuse_unit_weights():
        first = cached_unit_norm(weight, dim=1)
        with reuse_unit_weights(False):
            assert cached_unit_norm(weight, dim=1) is not first  # off inside the inner block
        # the inner block's end drops the outer block's copies: a .data edit is safe inside it (trust pass 12)
        again = cached_unit_norm(weight, dim=1)
        assert again is not first and cached_unit_norm(weight, dim=1) is again  # then reused again
    with reuse_unit_weights():
        assert cached_unit_norm(weight, dim=1) is not first  # the outermost block's end dropped them
    with pytest.raises(RuntimeError, match="inside"), reuse_unit_weights(), reference_path():
        reused = cached_unit_norm(weight, dim=1)
        assert using_reference_path()
        raise RuntimeError("inside")
    assert not using_reference_path()
    assert cached_unit_norm(weight, dim=1) is not cached_unit_norm(weight, dim=1) is not reused  # reuse is off
    for switch in (reuse_unit_weights, reference_path):
        name = switch.__name__
        with pytest.raises(BcosTypeError, match=rf"^enabled: must be True or False, got int 1\. Call {name}\(\) or "
                                                rf"{name}\(False\)\.$"):
            with switch(1):
                pass


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
@pytest.mark.parametrize("mode", ["inference", "explaining"])
@pytest.mark.parametrize("b, extra", [(2.0, 0), (1.5, 1), (1.25, 2)])
def test_bcos_linear_forward_op_count_is_pinned(mode, autocast, b, extra):
    ops = _forward_ops(BcosLinear(32, 16, b=b).eval(), mode, autocast)
    bound = OP_BOUNDS[(mode, autocast)] + extra
    assert len(ops) <= bound, f"{len(ops)} ops > {bound}: {ops}"
    # the weight is not normalised again: one reduction (the input norm), no division
    assert ops.count("linalg_vector_norm") == 1 and "div" not in ops, ops
    assert ops.count("nan_to_num") == 1, ops  # the input norm's; the cached unit weight's norms took theirs once
    # the floor on |cos| guards the explaining backward's constant factor; inference has no backward pass
    assert ("clamp_min_" in ops) is (mode == "explaining"), ops
    # no output-sized tensor is made for the product: it is written into |lin| (inference) or into lin (explaining)
    assert "mul" not in ops and ops[-1] == "mul_", ops


def test_training_forward_normalises_the_weight_every_time():
    layer = BcosLinear(32, 16, b=1.5)
    x = torch.randn(4, 32)
    with torch.no_grad():
        layer(x)  # fills the cache
    with RecordedOps(_NO_KERNEL) as counter:
        layer(x)
    assert counter.ops.count("linalg_vector_norm") == 2  # weight and input: autograd sees the normalisation


def _weight_grad(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    layer.zero_grad()
    (layer(x) * torch.linspace(-1, 2, 16)).sum().backward()
    return layer.weight.grad.clone()


@pytest.mark.parametrize("cls", [BcosLinear, BcosConv1D])
def test_training_after_cached_inference_gets_the_full_weight_gradient(cls):
    torch.manual_seed(0)
    layer = cls(32, 16, b=1.5)
    x = torch.randn(5, 32)
    with reference_path():
        expected = _weight_grad(layer, x)
    with torch.no_grad():
        layer(x)
    with torch.inference_mode():
        layer(x)
    with explanation_mode(layer), no_parameter_gradients():
        layer(x.requires_grad_())
    torch.testing.assert_close(_weight_grad(layer, x.detach()), expected, rtol=1e-5, atol=1e-7)


def test_cache_follows_in_place_updates_replacement_and_dtype_changes():
    torch.manual_seed(0)
    layer = BcosLinear(8, 6, b=2.0)
    x = torch.randn(3, 8, dtype=torch.float64)

    def fresh_output():
        return layer(x) if layer.weight.dtype == x.dtype else layer(x.to(layer.weight.dtype))

    def uncached_output():
        with reference_path():  # normalises afresh
            return fresh_output()

    with torch.no_grad():
        layer.double()
        first = fresh_output()
        torch.testing.assert_close(first, uncached_output(), rtol=1e-12, atol=1e-12)
        layer.weight.mul_(torch.linspace(0.5, 2.0, 8, dtype=torch.float64))  # new directions, in place
        torch.testing.assert_close(fresh_output(), uncached_output(), rtol=1e-12, atol=1e-12)
        assert not torch.allclose(fresh_output(), first)
        layer.weight = torch.nn.Parameter(torch.randn(6, 8, dtype=torch.float64))  # replaced
        torch.testing.assert_close(fresh_output(), uncached_output(), rtol=1e-12, atol=1e-12)
        layer.load_state_dict({"weight": torch.randn(6, 8), "bcos_b": torch.tensor(2.0)})
        torch.testing.assert_close(fresh_output(), uncached_output(), rtol=1e-12, atol=1e-12)
        layer.float()  # same parameter object, new storage and dtype
        torch.testing.assert_close(fresh_output(), uncached_output(), rtol=1e-6, atol=1e-7)


def test_cache_is_bypassed_when_the_weight_gradient_is_needed_and_cleared_on_request():
    weight = torch.randn(6, 8, requires_grad=True)
    with torch.no_grad():
        cached = cached_unit_norm(weight, dim=1)
        assert cached_unit_norm(weight, dim=1) is cached
    with no_parameter_gradients():
        assert cached_unit_norm(weight, dim=1) is cached
    assert cached_unit_norm(weight, dim=1).grad_fn is not None  # training: differentiable, fresh
    with torch.no_grad():
        assert cached_unit_norm(weight, dim=1) is not cached  # training dropped the cached copy
    with torch.no_grad():
        weight.data.mul_(2.0)  # bypasses the version counter (documented): clear explicitly
        clear_unit_norm_cache()
        torch.testing.assert_close(cached_unit_norm(weight, dim=1), unit_norm(weight, dim=1))
        assert cached_unit_norm(weight, dim=1, transposed=True).shape == (8, 6)
        layer = BcosLinear(8, 6)
        kept = layer.unit_weight()
        clear_unit_norm_cache(layer)
        assert layer.unit_weight() is not kept
    with pytest.raises(BcosTypeError, match="model: must be a torch.nn.Module"):
        clear_unit_norm_cache(weight)
        torch.testing.assert_close(cached_unit_norm(weight, dim=1, transposed=True, first_unit=2),
                                   unit_norm(weight.T[2:], dim=1))


def test_cached_autocast_cast_equals_autocasts_own_cast():
    torch.manual_seed(0)
    layer = BcosLinear(32, 16, b=1.5).eval()
    conv = BcosConv2d(3, 4, kernel_size=3, padding=1, b=1.5).eval()
    x, image = torch.randn(4, 32), torch.randn(2, 3, 5, 5)
    with torch.autocast("cpu", torch.bfloat16):
        expected = layer(x).detach(), conv(image).detach()  # grad on: no cache, autocast casts per call
        with torch.no_grad():
            for _ in range(2):
                assert torch.equal(layer(x), expected[0]) and torch.equal(conv(image), expected[1])
    with torch.no_grad():  # outside autocast the float32 weight is used again
        assert layer(x).dtype == torch.float32


def test_explain_with_cached_weights_equals_explain_without():
    torch.manual_seed(0)
    model = bcosify(tiny_model("BertForSequenceClassification"), b=1.5)
    ids, mask = padded_batch()
    with reference_path():  # no cache
        expected = explain(model, ids, mask)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # fills the cache
    for _ in range(2):
        got = explain(model, ids, mask)
        torch.testing.assert_close(got.input_contributions, expected.input_contributions, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.explained, expected.explained, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fused_input_norm_equals_the_reference_and_has_finite_gradients_at_zero(dtype):
    x = torch.randn(6, 64, dtype=dtype) * torch.logspace(-4, 4, 6, dtype=torch.float64)[:, None].to(dtype)
    x[0] = 0
    x.requires_grad_()
    fused = input_norm(x)
    with reference_path():
        reference = input_norm(x)
    assert fused.dtype == reference.dtype
    eps = torch.finfo(fused.dtype).eps
    torch.testing.assert_close(fused, reference, rtol=2 * eps, atol=0)
    (grad,) = torch.autograd.grad(fused.sum(), x)
    assert torch.isfinite(grad).all() and (grad[0] == 0).all()


def test_layers_reading_one_input_share_its_norm_without_autograd():
    torch.manual_seed(0)
    query, key, value = (BcosLinear(32, 16, b=1.5).eval() for _ in range(3))
    x = torch.randn(4, 7, 32)
    with torch.no_grad():
        expected = [layer(x.clone()) for layer in (query, key, value)]  # a tensor each: a norm each
        with RecordedOps(_NO_KERNEL) as counter:
            got = [layer(x) for layer in (query, key, value)]
        assert counter.ops.count("linalg_vector_norm") == 1 and counter.ops.count("hypot") == 1
        for actual, wanted in zip(got, expected, strict=True):
            assert torch.equal(actual, wanted)
        x.mul_(-3.0)  # written in place: its norm is computed again
        with RecordedOps(_NO_KERNEL) as counter:
            changed = query(x)
        assert counter.ops.count("linalg_vector_norm") == 1
        assert torch.equal(changed, query(x.clone()))
    # recording autograd, every layer differentiates through its own norm of the input
    x.requires_grad_()
    (query(x) * torch.linspace(-1, 2, 16)).sum().backward()
    with reference_path():
        expected_grad = torch.autograd.grad((query(x) * torch.linspace(-1, 2, 16)).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected_grad, rtol=1e-5, atol=1e-7)


def test_training_forward_frees_the_copy_an_evaluation_cached():
    layer = BcosLinear(32, 16, b=1.5)
    x = torch.randn(4, 32)
    with torch.no_grad():
        layer(x)
        cached = weakref.ref(layer.unit_weight())
        assert cached() is layer.unit_weight()
    layer(x).sum().backward()  # a training step between evaluations
    gc.collect()
    assert cached() is None


def test_by_default_explaining_layer_norm_backward_reuses_the_forward_inverse_std_and_computes_no_gain_gradient():
    # explanations take no parameter gradient: the backward is h = grad * gamma * rsqrt(var + eps), h - mean(h),
    # with the kernel's rsqrt(var + eps) (before: var_mean, add, rsqrt again, and the gain's unused gradient)
    norm = BcosLayerNorm(32).eval()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, grad_out = torch.randn(4, 7, 32, requires_grad=True), torch.randn(4, 7, 32)
    with explanation_mode(norm), no_parameter_gradients():
        out = norm(x)
    with RecordedOps(_NO_KERNEL) as counter:
        (grad,) = torch.autograd.grad(out, x, grad_out)
    assert counter.ops == ["mul", "mul", "mean", "sub"]
    with explanation_mode(norm), reference_path():
        (expected,) = torch.autograd.grad(norm(x), x, grad_out)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    with explanation_mode(norm):  # a gradient of the gain is still there where it may be taken
        (gain_grad,) = torch.autograd.grad(norm(x), norm.weight, grad_out)
    with explanation_mode(norm), reference_path():
        torch.testing.assert_close(gain_grad, torch.autograd.grad(norm(x), norm.weight, grad_out)[0])


def test_by_default_explaining_norms_and_activations_bind_no_arguments_through_inspect(monkeypatch):
    # torch's Function.apply runs inspect.signature on every call of a Function with setup_context, which costs
    # more than a layer norm's or an activation's kernel at a layer's sizes
    import inspect

    bound = []
    signature = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *args, **kwargs: bound.append(args) or signature(*args, **kwargs))
    x = torch.randn(4, 7, 32, requires_grad=True)
    for layer in (BcosLayerNorm(32), DetachableActivation("gelu"), DetachableActivation("silu")):
        with explanation_mode(layer):
            torch.autograd.grad(layer(x).sum(), x)
    assert bound == []


def test_by_default_explanation_mode_walks_no_train_of_a_model_in_eval_mode_and_restores_a_training_one():
    model = torch.nn.Sequential(BcosLinear(8, 8), torch.nn.Dropout(0.5), BcosLayerNorm(8))
    modes = []
    train = model.train
    model.train = lambda mode=True: modes.append(mode) or train(mode)
    model.eval()
    modes.clear()
    with explanation_mode(model):
        assert model[0].explaining and model[2].explaining and not model[1].training
    assert modes == [] and not model[0].explaining and not model[2].explaining
    model.train()
    modes.clear()
    with explanation_mode(model):
        assert not model.training and not model[1].training and model[0].explaining
    assert modes == [False, True] and model.training and model[1].training and not model[0].explaining


def test_by_default_the_tanh_gate_without_autograd_takes_four_passes_and_keeps_its_values():
    from bcos_plugins.nn.activation import tanh_ratio

    x = torch.tensor([0.0, 1e-300, 1e-8, -1e-4, 5e-4, 9.99e-4, 1e-3, -0.5, 3.0, 40.0, float("inf"), float("nan")],
                     dtype=torch.float64)
    with RecordedOps(_NO_KERNEL) as counter:
        fast = tanh_ratio(x)
    # was 10 (the series' where, ones_like, ...), then tanh, div_, eq, masked_fill_ (the bool mask: slow on a CPU)
    assert counter.ops == ["tanh", "div", "nan_to_num_", "add_"]
    recorded = tanh_ratio(x.clone().requires_grad_())  # the series form autograd differentiates
    assert fast[0] == 1.0 and fast[-1].isnan() and fast[-2] == 0.0
    # the series' own error below 1e-3 is under x^4 / 7 < 2e-13: the quotient is the more accurate of the two there
    torch.testing.assert_close(fast[:-1], recorded[:-1].detach(), rtol=2e-13, atol=0.0)
    for dtype in (torch.float32, torch.bfloat16):  # within one unit in the last place
        torch.testing.assert_close(tanh_ratio(x[:-1].to(dtype)), recorded[:-1].detach().to(dtype),
                                   rtol=torch.finfo(dtype).eps, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_by_default_the_tanh_gate_without_autograd_has_the_bits_of_the_masked_quotient(dtype):
    from bcos_plugins.nn.activation import tanh_ratio

    # the form before (the quotient, then the limit 1 written through the mask x == 0): the same bits everywhere,
    # NaN where x is NaN, 1 at both zeros, 0 at +-inf, subnormal and huge x included
    special = torch.tensor([0.0, -0.0, 1e-300, 1e-40, -1e-40, 1e-8, -1e-4, 5e-4, 9.99e-4, 1e-3, -0.5, 3.0, 40.0, -40.0,
                            1e30, -1e30, float("inf"), float("-inf"), float("nan"), -float("nan")], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    x = torch.cat([special, torch.randn(20000, generator=generator, dtype=torch.float64) * 10,
                   torch.randn(2000, generator=generator, dtype=torch.float64) * 1e-3]).to(dtype)
    x = torch.cat([x, torch.finfo(dtype).tiny * torch.randn(500, generator=generator).to(dtype)])  # subnormals
    with torch.no_grad():
        before = torch.tanh(x).div_(x).masked_fill_(x == 0, 1.0)
        now = tanh_ratio(x)
    assert torch.equal(now.isnan(), x.isnan()) and torch.equal(before.isnan(), x.isnan())
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    finite = ~x.isnan()
    assert torch.equal(now[finite].view(bits), before[finite].view(bits))
    assert (now[(x == 0)] == 1.0).all() and now.dtype == dtype


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "ModernBertForSequenceClassification"])
def test_by_default_explaining_a_gated_mlp_records_no_graph_for_its_gate_branch(name):
    import transformers as T

    if name.startswith("ModernBert"):
        torch.manual_seed(0)
        stock = T.ModernBertForSequenceClassification(T.ModernBertConfig(
            vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, num_labels=2))
    else:
        stock = tiny_model(name)
    model = bcosify(stock.eval(), b=1.5, verbose=False).eval()
    mlp = next(m for n, m in model.named_modules() if n.endswith("mlp"))
    gate_branch = mlp.act_fn if hasattr(mlp, "act_fn") else mlp.act
    recorded = []
    handle = gate_branch.register_forward_hook(lambda module, args, out: recorded.append(out.requires_grad))
    ids, mask = padded_batch()
    try:
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).logits
        target = None if "Classification" in name else 3
        result = explain(model, ids, mask, target=target)
    finally:
        handle.remove()
    assert recorded[0] is False and recorded[-1] is False  # was True: recorded, then detached
    assert result.completeness_error.max() < 1e-5
    with explanation_mode(model), torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, expected)


@pytest.mark.parametrize("kind", ["gelu", "gelu_tanh"])
def test_by_default_explaining_gelu_backward_computes_the_gate_in_place_and_keeps_the_stock_formulas_bits(kind):
    # the gate's steps write into its first fresh tensor, then one product with the gradient (before: a new tensor
    # per step, 5 for the erf gate, 8 for the tanh one); the values are the out-of-place formula's, bit for bit
    import math

    act = DetachableActivation(kind)
    x, grad_out = torch.randn(4, 7, 32, requires_grad=True), torch.randn(4, 7, 32)
    with explanation_mode(act):
        out = act(x)
    with RecordedOps(_NO_KERNEL) as counter:
        (grad,) = torch.autograd.grad(out, x, grad_out)
    fresh = [op for op in counter.ops if not op.endswith("_")]
    assert len(fresh) == {"gelu": 3, "gelu_tanh": 2}[kind], counter.ops  # x / sqrt 2, erf; x ** 3; the product
    z = x.detach()
    gate = (torch.special.ndtr(z) if kind == "gelu"
            else 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z.pow(3)))))
    assert torch.equal(grad, grad_out * gate)
    assert torch.equal(act.gate(x.detach()), gate) and torch.equal(act.gate(x).detach(), gate)  # recorded: same


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_by_default_second_derivatives_through_an_explaining_layer_norm_equal_the_reference_paths(dtype):
    # rsqrt(var + eps) is a constant in explanation mode, also when the backward pass is differentiated again (a
    # loss on an explanation); before, the fused backward recomputed it from x with autograd recording, so the
    # second derivative in x took its dependence on x that the reference path holds constant (off by 10 here)
    torch.manual_seed(0)
    norm = BcosLayerNorm(8).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x0 = torch.randn(3, 8, dtype=torch.float64).to(dtype)
    readout = torch.linspace(-1, 2, 8, dtype=torch.float64).to(dtype)

    def gradients(reference: bool):
        x = x0.clone().requires_grad_()
        with explanation_mode(norm), reference_path(reference):
            (grad,) = torch.autograd.grad((norm(x) * readout).sum(), x, create_graph=True)
            return torch.autograd.grad((x * grad).float().square().sum(), [norm.weight, x])

    tolerance = {} if dtype == torch.float64 else {"rtol": 0.05, "atol": 0.05}
    for fused, reference in zip(gradients(False), gradients(True), strict=True):
        torch.testing.assert_close(fused.float(), reference.float(), **tolerance)
