"""The fused B-cos kernels (the default) against the reference path (the maths step by step, differentiated by
autograd): same values and gradients for every B-cos layer type, in float32 and float64, with and without
explanation mode; less memory saved for the backward pass; the bfloat16 / float16 paths under autocast."""

from __future__ import annotations

import contextlib
import weakref

import pytest
import torch
from conftest import RecordedOps, padded_batch, tiny_model, zero_unit_projection
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.pytorch_utils import Conv1D

from bcos_plugins import bcos_loss, bcosify, explain
from bcos_plugins.convert.query_key import StockQueryKeyConv1D
from bcos_plugins.errors import BcosRuntimeError, BcosTypeError
from bcos_plugins.nn import (
    BcosConv1D,
    BcosConv2d,
    BcosLayerNorm,
    BcosLinear,
    DetachableActivation,
    DetachableRMSNorm,
    explanation_mode,
    reference_path,
)
from bcos_plugins.nn.functional import bcos_linear, input_norm, reuse_unit_weights, using_reference_path
from bcos_plugins.nn.linear import AlignmentPressure
from benchmarks.bench_gpu import saved_for_backward_bytes

FLOATS = [torch.float32, torch.float64]


def _layers() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    """Every B-cos layer type of bcos_plugins.nn (and the stock-query/key GPT-2 projection), with an input shape."""
    torch.manual_seed(0)
    conv = Conv1D(12, 6)
    nn.init.normal_(conv.weight)
    nn.init.normal_(conv.bias)
    norm = BcosLayerNorm(6, eps=1e-5)
    nn.init.normal_(norm.weight)
    rms = DetachableRMSNorm(6)
    nn.init.normal_(rms.weight)
    layers = {f"linear_b{b}_m{m}": (BcosLinear(6, 5, b=b, max_out=m), (4, 3, 6))
              for b in (1.0, 1.25, 1.5, 2.0, 2.7) for m in (1, 2)}
    layers["linear_constant_outputs"] = (BcosLinear(6, 6, b=1.5, constant_outputs=slice(0, 2)), (4, 3, 6))
    layers["linear_constant_outputs_m2"] = (BcosLinear(6, 6, b=1.25, max_out=2, constant_outputs=slice(2, 4)),
                                            (4, 3, 6))
    layers["conv1d"] = (BcosConv1D.from_conv1d(conv, b=1.25), (4, 3, 6))
    layers["stock_qk_conv1d"] = (StockQueryKeyConv1D(conv, b=1.5, query_key_features=8), (4, 3, 6))
    layers["conv2d"] = (BcosConv2d(3, 4, kernel_size=3, padding=1, b=1.5, max_out=2), (2, 3, 5, 5))
    layers["layer_norm"] = (norm, (4, 3, 6))
    layers["layer_norm_no_affine"] = (BcosLayerNorm(6, elementwise_affine=False), (4, 3, 6))
    layers["rms_norm"] = (rms, (4, 3, 6))
    for kind in ("gelu", "gelu_tanh", "quick_gelu", "silu", "relu"):
        layers[f"act_{kind}"] = (DetachableActivation(kind), (4, 3, 6))
    return layers


def _run(module: nn.Module, x: torch.Tensor, explaining: bool, reference: bool):
    module.zero_grad()
    x = x.detach().requires_grad_(True)
    with reference_path(reference):
        if explaining:
            with explanation_mode(module):
                y = module(x)
        else:
            y = module(x)
        upstream = torch.linspace(-1.0, 2.0, y.numel(), dtype=y.dtype).reshape(y.shape)
        (y * upstream).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return y.detach(), x.grad.clone(), grads


class _SelfAttention(nn.Module):
    """A TransformerLens attention component called on one input (query = key = value input)."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x)


def _lens_components(dtype: torch.dtype = torch.float32) -> dict[str, nn.Module]:
    """The B-cos TransformerLens components of the adapter (GPT-2 and Llama layouts), input width 8."""
    from bcos_plugins.adapters.transformer_lens import BcosHookedTransformer, BcosTransformerConfig

    size = dict(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=12, d_vocab=20, n_ctx=8, device="cpu",
                bcos_b=1.5, seed=0, dtype=dtype)
    gpt2 = BcosHookedTransformer(BcosTransformerConfig(**size, act_fn="gelu_new", normalization_type="LN"))
    llama = BcosHookedTransformer(BcosTransformerConfig(**size, act_fn="silu", gated_mlp=True,
                                                        normalization_type="RMS", n_key_value_heads=1,
                                                        positional_embedding_type="rotary"))
    return {"lens_mlp": gpt2.blocks[0].mlp, "lens_gated_mlp": llama.blocks[0].mlp,
            "lens_attention": _SelfAttention(gpt2.blocks[0].attn),
            "lens_grouped_query_attention": _SelfAttention(llama.blocks[0].attn)}


LENS_COMPONENTS = ["lens_mlp", "lens_gated_mlp", "lens_attention", "lens_grouped_query_attention"]


def _assert_same_run(fused, ref, dtype: torch.dtype, atol_per_magnitude: bool = False) -> None:
    """Same output, input gradient and parameter gradients. ``atol_per_magnitude``: the absolute tolerance
    scales with each tensor's largest entry (for sums over many products, whose rounding grows with them)."""
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (1e-12, 1e-13)

    def close(actual, expected, msg=None):
        scale = max(1.0, expected.abs().max().item()) if atol_per_magnitude else 1.0
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * scale, msg=msg)

    close(fused[0], ref[0])
    close(fused[1], ref[1])
    assert fused[2].keys() == ref[2].keys()
    for key in ref[2]:
        close(fused[2][key], ref[2][key], msg=key)
    assert all(torch.isfinite(t).all() for t in (*fused[:2], *fused[2].values()))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("explaining", [False, True])
@pytest.mark.parametrize("name", list(_layers()))
def test_fused_equals_reference_values_and_gradients(name, explaining, dtype):
    module, shape = _layers()[name]
    module = module.to(dtype)
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(1)) * 3
    x[0] = 0.0  # a zero row (padding): finite gradients in both paths
    _assert_same_run(_run(module, x, explaining, reference=False), _run(module, x, explaining, reference=True),
                     dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("explaining", [False, True])
@pytest.mark.parametrize("name", LENS_COMPONENTS)
def test_fused_lens_components_equal_reference(name, explaining, dtype):
    module = _lens_components(dtype)[name]
    x = torch.randn(4, 3, 8, dtype=dtype, generator=torch.Generator().manual_seed(1)) * 3
    x[0, 0] = 0.0  # a zero row (padding) as attention and MLP input
    # gradients of the weights reach 15 here: float32 rounding differs by up to 4e-6 between the two orders of
    # the same arithmetic (3e-7 of the largest entry)
    _assert_same_run(_run(module, x, explaining, reference=False), _run(module, x, explaining, reference=True),
                     dtype, atol_per_magnitude=True)


FUSED_NODES = {"_BcosProductBackward", "BcosLinearNodeBackward"}


def _holds_fused_product(output: torch.Tensor) -> bool:
    """Whether the autograd graph of ``output`` contains a fused B-cos node (the product, or the whole linear
    layer that training runs)."""
    seen, pending = set(), [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        if type(node).__name__ in FUSED_NODES:
            return True
        seen.add(node)
        pending.extend(child for child, _ in node.next_functions)
    return False


class _OpNames(TorchDispatchMode):
    """The names of the aten ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("explaining", [False, True])
@pytest.mark.parametrize("name", ["linear_b1.5_m1", "conv1d", "stock_qk_conv1d", "conv2d", *LENS_COMPONENTS])
def test_bcos_projections_run_the_fused_product(name, explaining):
    # every B-cos projection (the stock-query/key GPT-2 projection and the TransformerLens components too) runs
    # the fused product by default and the step-by-step maths inside reference_path(): training, the one fused
    # autograd node; explaining, the factor from the fused kernels (|lin| times the per-row reciprocal of ||x||,
    # where the reference divides lin by ||x||), then one plain recorded product in both
    module, shape = (_lens_components()[name], (4, 3, 8)) if name.startswith("lens") else _layers()[name]
    x = torch.randn(shape, requires_grad=True)
    for reference in (False, True):
        with reference_path(reference), explanation_mode(module) if explaining else contextlib.nullcontext():
            with _OpNames() as ops:
                out = module(x)
            if explaining:
                assert not _holds_fused_product(out)
                assert ("reciprocal" in ops.names) is not reference, (reference, ops.names)
            else:
                assert _holds_fused_product(out) is not reference, reference


def test_lens_scale_hooks_see_and_replace_the_scale():
    # a hook on hook_bcos_scale_* needs the scale tensor, so a hooked projection computes it as a tensor: the
    # cache holds it, a replacement changes the output, and without hooks the output is the fused one
    from bcos_plugins.adapters.transformer_lens import BcosHookedTransformer, BcosTransformerConfig

    model = BcosHookedTransformer(BcosTransformerConfig(d_model=8, n_layers=1, n_heads=2, d_head=4, d_mlp=12,
                                                        d_vocab=20, n_ctx=8, act_fn="gelu_new", bcos_b=1.5,
                                                        normalization_type="LN", seed=0, device="cpu"))
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    plain = model(tokens)
    logits, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-6)
    for short in ("in", "out"):
        scale = cache[f"blocks.0.mlp.hook_bcos_scale_{short}"]
        assert scale.shape[-1] == (12 if short == "in" else 8) and 0 < scale.min() and scale.max() <= 1
    mlp_out = {}

    def keep(t, hook):
        mlp_out[hook.name] = t

    doubled = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.mlp.hook_bcos_scale_out", lambda t, hook: 2 * t),
                                                      ("blocks.0.hook_mlp_out", keep)])
    assert not torch.allclose(doubled, plain)
    torch.testing.assert_close(mlp_out["blocks.0.hook_mlp_out"], 2 * cache["blocks.0.hook_mlp_out"])
    torch.testing.assert_close(model(tokens), plain, rtol=0, atol=0)  # the hooks are gone: fused again


@pytest.mark.parametrize("b", [1.25, 1.5, 2.0, 2.7])
def test_fused_training_gradient_passes_gradcheck(b):
    # the hand-written backward of the fused product, including the gradient through ||x||
    torch.manual_seed(0)
    layer = BcosLinear(5, 4, b=b, max_out=2).double()
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: layer(t), (x,))
    conv = BcosConv2d(2, 3, kernel_size=2, b=b).double()
    z = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: conv(t), (z,))


B_VALUES = [1.0, 1.1, 1.25, 1.5, 2.0, 2.5]


def _inputs(dtype: torch.dtype, width: int = 6) -> torch.Tensor:
    x = torch.randn(4, 3, width, dtype=dtype, generator=torch.Generator().manual_seed(1)) * 3
    x[0] = 0.0  # padding rows
    x[1, 0] = 1e-4  # a tiny input: its norm is mostly the epsilon
    return x


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("explaining", [False, True])
@pytest.mark.parametrize("b", B_VALUES)
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_fused_linear_layer_equals_reference_at_every_b(kind, b, explaining, dtype):
    # training runs the whole layer as one node (dyn recovered from the output, the unit-norm weight recomputed
    # in the backward); explaining runs the fused product; both equal the step-by-step maths, outputs and the
    # gradients wrt the input and the raw weight, with zero inputs and a zero weight unit
    layer = zero_unit_projection(kind, b, dtype)
    x = _inputs(dtype)
    _assert_same_run(_run(layer, x, explaining, reference=False), _run(layer, x, explaining, reference=True), dtype)
    with explanation_mode(layer) if explaining else contextlib.nullcontext():
        out = layer(x.requires_grad_())
    node = _fused_node(out)
    # explaining records one plain product with the constant factor (none at B = 1) and no fused node
    assert node == (None if explaining else "BcosLinearNodeBackward"), node
    if explaining and b != 1.0:
        assert type(out.grad_fn).__name__ == "MulBackward0", out.grad_fn


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("b", B_VALUES)
@pytest.mark.parametrize("kind", ["linear", "conv1d", "linear_max_out", "conv2d"])
def test_fused_inference_equals_reference_at_every_b(kind, b, dtype):
    # without autograd recording the fused product leaves the floor out and takes B = 1.25's fourth root as two
    # rsqrt: the same values as the step-by-step maths (to rounding), with zero inputs and a zero weight unit
    # giving exactly 0, never NaN; and the explaining forward (which keeps the floor) gives the same values
    if kind == "conv2d":
        torch.manual_seed(0)
        layer = BcosConv2d(3, 4, kernel_size=3, padding=1, b=b).to(dtype)
        with torch.no_grad():
            layer.weight[1] = 0.0
        x = torch.randn(2, 3, 5, 5, dtype=dtype, generator=torch.Generator().manual_seed(1)) * 3
        x[0] = 0.0
        zero_out = (slice(0, 1), slice(None))  # the zero image everywhere, the zero filter everywhere
        zero_unit = (slice(None), slice(1, 2))
    else:
        layer = (zero_unit_projection("linear" if kind == "linear_max_out" else kind, b, dtype) if kind != "linear_max_out"
                 else BcosLinear(6, 5, b=b, max_out=2).to(dtype))
        if kind == "linear_max_out":
            with torch.no_grad():
                layer.weight[4:6] = 0.0  # both units of output 2
        x = _inputs(dtype)
        zero_out = (slice(0, 1),)  # the padding rows
        zero_unit = (Ellipsis, slice(2, 3))
    with torch.no_grad():
        fused = layer(x)
        with reference_path():
            reference = layer(x)
    with explanation_mode(layer):  # recorded: the explaining product, with the floor
        explaining = layer(x.clone().requires_grad_()).detach()
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (1e-12, 1e-13)
    torch.testing.assert_close(fused, reference, rtol=rtol, atol=atol)
    torch.testing.assert_close(explaining, fused, rtol=0, atol=0)
    assert torch.isfinite(fused).all()
    assert (fused[zero_out] == 0).all() and (fused[zero_unit] == 0).all()
    # the maths, B-cos by hand: |cos| ** (B - 1) * lin; a wrong exponent or a dropped 1 / ||x|| fails here
    if kind in ("linear", "conv1d"):
        unit = layer.unit_weight().double()
        xd = x.double()
        lin = xd @ unit.T
        norm = (xd.square().sum(-1, keepdim=True) + 1e-6).sqrt()
        torch.testing.assert_close(fused.double(), (lin / norm).abs() ** (b - 1) * lin, rtol=rtol, atol=atol)


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("dtype", [*FLOATS, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b", B_VALUES)
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_inference_forward_runs_the_helpers_kernels_in_one_function(kind, b, dtype, reuse):
    # a layer's forward without autograd recording is inference_linear: the kernels of cached_unit_norm, F.linear,
    # input_norm and the inference product written out in one function (their nested Python calls cost 3-4 % of a
    # small decoder's forward), so the same ops in the same order and the same values, bit for bit
    from bcos_plugins.nn.functional import _inference_product, cached_unit_norm

    layer = zero_unit_projection(kind, b, dtype)
    x = _inputs(dtype)
    with torch.no_grad(), reuse_unit_weights(reuse):
        layer(x)  # (fills the cache inside reuse_unit_weights)
        x_fused, x_helpers = x.clone(), x.clone()  # new tensors: each computes its input norm
        with RecordedOps() as fused_ops:
            fused = layer(x_fused)
        with RecordedOps() as helper_ops:
            unit = cached_unit_norm(layer.weight, dim=1, transposed=kind == "conv1d", autocast=True)
            lin = nn.functional.linear(x_helpers, unit)
            expected = lin if b == 1.0 else _inference_product(lin, input_norm(x_helpers), b)
    assert torch.equal(fused, expected)
    views = {"t", "permute", "transpose", "view", "_unsafe_view", "expand", "as_strided", "detach", "alias"}
    assert [op for op in fused_ops.ops if op not in views] == [op for op in helper_ops.ops if op not in views]


def test_an_explaining_activation_under_no_grad_builds_no_autograd_function(monkeypatch):
    # a gated MLP computes its gate branch under no_grad while explaining: nothing is recorded there, so the
    # constant-gate Function (15 us per call in Python) is not applied; same values, still counted as held constant
    from bcos_plugins.nn import activation
    from bcos_plugins.nn.dynamic import dynamic_weights_used

    x = torch.randn(4, 3, 6)
    monkeypatch.setattr(activation._ConstantGate, "apply", lambda *args: pytest.fail("Function applied"))
    for kind in ("gelu", "gelu_tanh", "quick_gelu", "silu", "relu"):
        act = DetachableActivation(kind)
        used = dynamic_weights_used()
        with explanation_mode(act), torch.no_grad():
            assert torch.equal(act(x), activation.ACTIVATIONS[kind](x))
        assert dynamic_weights_used() == used + 1


@pytest.mark.parametrize("constant", [None, slice(1, 3)])
@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("dtype", [*FLOATS, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b", B_VALUES)
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_explaining_forward_runs_the_helpers_kernels_in_one_function(kind, b, dtype, reuse, constant):
    # explaining without parameter gradients (as explain runs), a layer's forward is explaining_linear: the kernels
    # of cached_unit_norm, input_norm, F.linear and bcos_product's explaining branch in one function, so the same
    # ops in the same order, the same values and the same input gradient, bit for bit
    from bcos_plugins.nn.dynamic import no_parameter_gradients
    from bcos_plugins.nn.functional import bcos_product, cached_unit_norm, detach_units

    layer = zero_unit_projection(kind, b, dtype)
    layer.constant_outputs = constant
    x = _inputs(dtype)
    upstream = torch.linspace(-1.0, 2.0, 4 * 3 * 5, dtype=torch.float64).reshape(4, 3, 5).to(dtype)
    results, recorded = [], []
    for helpers in (False, True):
        xr = x.clone().requires_grad_()
        with explanation_mode(layer), no_parameter_gradients(), reuse_unit_weights(reuse), RecordedOps() as ops:
            if helpers:
                with torch.no_grad():
                    unit = cached_unit_norm(layer.weight, dim=1, transposed=kind == "conv1d", autocast=True)
                    x_norm = input_norm(xr) if b != 1.0 else None
                lin = nn.functional.linear(xr, unit)
                if b == 1.0:
                    out = lin if constant is None else detach_units(lin, constant)
                else:
                    out = bcos_product(lin, x_norm, b, True, overwrite_lin=True, constant_units=constant)
            else:
                out = layer(xr)
        results.append((out.detach(), torch.autograd.grad(out, xr, upstream)[0]))
        views = {"t", "permute", "transpose", "view", "_unsafe_view", "expand", "as_strided", "detach", "alias"}
        recorded.append([op.rstrip("_") for op in ops.ops if op not in views])  # (clamp_min_ and clamp_min alike)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert recorded[0] == recorded[1]


@pytest.mark.parametrize("dtype", [*FLOATS, torch.bfloat16])
@pytest.mark.parametrize("b", B_VALUES)
@pytest.mark.parametrize("kind", ["linear", "linear_max_out", "conv2d"])
def test_explaining_product_is_complete_at_every_b(kind, b, dtype):
    # explanation mode: the factor is a constant, so x . d(upstream . out)/dx = upstream . out exactly (to
    # rounding), with the product written into the matrix product's output (no MaxOut) or not (MaxOut); a factor
    # that autograd differentiated would give B times the output instead
    torch.manual_seed(0)
    if kind == "conv2d":
        layer = BcosConv2d(3, 4, kernel_size=3, padding=1, b=b)
        x = torch.randn(2, 3, 5, 5) * 3
    else:
        layer = BcosLinear(6, 5, b=b, max_out=2 if kind == "linear_max_out" else 1)
        x = _inputs(torch.float32)
    layer = layer.to(dtype)
    x = x.to(dtype).requires_grad_()
    with explanation_mode(layer):
        out = layer(x)
    upstream = torch.linspace(-1.0, 2.0, out.numel(), dtype=dtype).reshape(out.shape)
    (grad,) = torch.autograd.grad(out, x, upstream)
    explained = (out.double() * upstream.double()).sum()
    contributions = (x.double() * grad.double()).sum()
    scale = (out.double() * upstream.double()).abs().sum()
    tolerance = {torch.float32: 1e-6, torch.float64: 1e-13, torch.bfloat16: 2e-2}[dtype]
    assert abs(contributions - explained) <= tolerance * scale, (contributions, explained)
    if b != 1.0 and dtype != torch.bfloat16:  # not the differentiated factor's (B times the output)
        assert abs(contributions - b * explained) > 10 * tolerance * scale


def test_fused_inference_leaves_out_the_floor_that_explaining_keeps():
    # |cos| = 1e-14, below the 1e-12 floor: inference computes |cos| ** (B - 1) * lin as written; explaining (whose
    # constant factor the backward multiplies by) and the reference keep the floor, 1e-12 ** (B - 1) * lin. Both
    # are below 1e-12 ** B ||x|| in size; away from the floor every path agrees (the other unit)
    layer = BcosLinear(2, 2, b=1.5).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0], [0.6, 0.8]], dtype=torch.float64))
    x = torch.tensor([[1e-14, 1.0]], dtype=torch.float64)
    norm = (1.0 + 1e-28 + 1e-6) ** 0.5
    with torch.no_grad():
        inference = layer(x)
        with reference_path():
            reference = layer(x)
    with explanation_mode(layer):  # recorded (without recording, explanation mode has no backward: inference)
        explaining = layer(x.clone().requires_grad_()).detach()
    cos = 1e-14 / norm
    torch.testing.assert_close(inference[0, 0], torch.tensor(cos**0.5 * 1e-14, dtype=torch.float64),
                               rtol=1e-12, atol=0)
    torch.testing.assert_close(reference[0, 0], torch.tensor(1e-6 * 1e-14, dtype=torch.float64), rtol=1e-12, atol=0)
    assert explaining[0, 0] == reference[0, 0] and abs(inference[0, 0]) < 1e-18 * norm
    torch.testing.assert_close(inference[0, 1], reference[0, 1], rtol=1e-14, atol=0)
    torch.testing.assert_close(explaining[0, 1], reference[0, 1], rtol=1e-14, atol=0)


def _fused_node(output: torch.Tensor) -> str | None:
    names = set()
    pending = [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is not None:
            names.add(type(node).__name__)
            pending.extend(child for child, _ in node.next_functions)
    found = names & FUSED_NODES
    assert len(found) <= 1, found
    return found.pop() if found else None


@pytest.mark.parametrize("b", [1.0, 1.25, 1.5, 2.0, 2.5, 7.0])
@pytest.mark.parametrize("units_are_columns", [False, True])
def test_fused_linear_backward_passes_gradcheck(b, units_are_columns):
    # the hand-written backward of bcos_linear, wrt the input and the raw weight (through the normalisation and
    # ||x||); float64 recovers dyn from the output at any B (B = 7 too); B as a 0-d tensor keeps lin instead
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 5, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn((5, 4) if units_are_columns else (4, 5), dtype=torch.float64, generator=g).requires_grad_()
    for pressure in (b, torch.tensor(b, dtype=torch.float64)):
        def layer(x, w, pressure=pressure):
            x_norm = None if pressure == 1.0 and not isinstance(pressure, torch.Tensor) else input_norm(x)
            return bcos_linear(x, w, x_norm, pressure, units_are_columns=units_are_columns)

        assert torch.autograd.gradcheck(layer, (x, w))


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_fused_linear_saves_input_weight_and_output_only(kind):
    # what the unfused layer kept besides these (the unit-norm weight, a weight-sized copy per layer, and the
    # pre-scale output) is recomputed in the backward pass; the output is what the next layer keeps anyway
    layer = zero_unit_projection(kind, 1.5)
    x = torch.randn(4, 7, 6, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    for reference in (False, True):
        saved.clear()
        with reference_path(reference), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = layer(x)
        large = {t.untyped_storage().data_ptr() for t in saved if t.numel() > x.shape[0] * x.shape[1]}
        expected = {t.untyped_storage().data_ptr() for t in (x, layer.weight, out)}
        if reference:
            assert len(large - expected) >= 2  # the unit-norm weight and the pre-scale output, at least
        else:
            assert large == expected


def _underflowing_layer() -> tuple[BcosLinear, torch.Tensor]:
    # unit 0 sees |cos| = 2e-12 (above the 1e-12 floor): dyn = |cos| ** 3 = 8e-36 is a normal float32, but the
    # output dyn * lin = 1.6e-47 underflows to 0
    layer = BcosLinear(3, 2, b=4.0)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    return layer, torch.tensor([[2e-12, 1.0, 0.0]])


def _unit_zero_gradients(layer: BcosLinear, x: torch.Tensor, reference: bool) -> tuple[torch.Tensor, torch.Tensor]:
    layer.zero_grad()
    x = x.clone().requires_grad_()
    with reference_path(reference):
        layer(x)[:, 0].sum().backward()  # only unit 0's gradient: nothing else adds to it
    return x.grad, layer.weight.grad


def test_fused_linear_keeps_lin_where_the_output_underflows(monkeypatch):
    # float32 above B = 2.9: dyn cannot be recovered from an output that underflows (here: 0 instead of 1.6e-47,
    # which would make unit 0 look clamped and its gradient 32x too small), so the layer keeps lin there
    from bcos_plugins.nn import functional

    assert functional.scale_recoverable(torch.float32, 2.9) and not functional.scale_recoverable(torch.float32, 3.0)
    assert functional.scale_recoverable(torch.bfloat16, 2.5) and functional.scale_recoverable(torch.float64, 10.0)
    assert not functional.scale_recoverable(torch.float16, 1.1)
    assert not functional.scale_recoverable(torch.float32, torch.tensor(1.5))
    layer, x = _underflowing_layer()
    reference = _unit_zero_gradients(layer, x, reference=True)
    assert 3e-35 < reference[0][0, 0] < 3.4e-35  # 4 * 8e-36: the reference gradient is a normal float32
    fused = _unit_zero_gradients(layer, x, reference=False)
    for actual, expected in zip(fused, reference, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=0.0)
    # recovering from the output anyway gives the wrong gradient this test exists to catch
    monkeypatch.setattr(functional, "scale_recoverable", lambda dtype, b: True)
    recovered = _unit_zero_gradients(layer, x, reference=False)
    assert not torch.allclose(recovered[0], reference[0], rtol=1e-1, atol=0.0)


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_fused_linear_in_half_precision_is_as_accurate_as_the_reference(kind):
    # half precision: the matrix products run in bfloat16 under autocast (dyn recovered from the bfloat16
    # output), float16 weights keep lin (float16 cannot hold the outputs' range). Against float64, the fused
    # output and gradients (wrt the input and the weight) are as accurate as the reference path's (both
    # round to the dtype). No zero weight unit here: its gradient is G / eps with G made of the floored dyn (1e-6,
    # subnormal in float16), which neither path can compute to float16's precision.
    def projection(dtype):
        layer = zero_unit_projection(kind, 1.5)
        with torch.no_grad():
            layer.weight.add_(0.1)
        return layer.to(dtype)

    x = _inputs(torch.float64)
    truth = _run(projection(torch.float64), x, explaining=False, reference=True)
    for dtype in (torch.bfloat16, torch.float16):
        layer = projection(torch.float32 if dtype == torch.bfloat16 else dtype)
        errors = []
        for reference in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                out, grad_x, grads = _run(layer, x.to(layer.weight.dtype), explaining=False, reference=reference)
            assert out.dtype == dtype
            pairs = [(out, truth[0]), (grad_x, truth[1]), (grads["weight"], truth[2]["weight"])]
            assert all(torch.isfinite(actual).all() for actual, _ in pairs)
            errors.append(torch.tensor([(a.double() - e).abs().max() / e.abs().max() for a, e in pairs]))
        fused, ref = errors
        assert (fused <= 2 * ref + torch.finfo(dtype).eps).all(), (dtype, fused, ref)
        assert (fused < 2 * torch.finfo(dtype).eps).all(), (dtype, fused)  # measured: at most 0.9 eps


class _DivShapes(TorchDispatchMode):
    """The output shapes of the out-of-place divisions dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "div":
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_half_precision_training_backward_divides_the_weight_once_and_keeps_its_values(kind, dtype):
    # the backward pass recomputes the forward's unit-norm weight: for a half-precision weight one float32
    # quotient, rounded to the weight's dtype for the input gradient and kept for the normalisation's gradient
    # (it used to divide twice). The gradients are those of the formulas, bit for bit (B = 1: no scale)
    torch.manual_seed(0)
    layer = zero_unit_projection(kind, 1.0).to(dtype)
    x = torch.randn(4, 3, 6, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    upstream = torch.linspace(-1.0, 2.0, 4 * 3 * 5).reshape(4, 3, 5).to(dtype)
    out = layer(x)
    assert _fused_node(out) == "BcosLinearNodeBackward"
    with _DivShapes() as divisions:
        out.backward(upstream)
    weight = layer.weight.T if kind == "conv1d" else layer.weight  # units as rows
    assert divisions.shapes.count(tuple(weight.shape)) == 1, divisions.shapes
    norms = torch.linalg.vector_norm(weight, dim=1, keepdim=True, dtype=torch.float32)
    clamped = norms.clamp_min(1e-6)
    wide_unit = weight.detach().float() / clamped
    unit = wide_unit.to(dtype)
    assert torch.equal(unit, layer.unit_weight())  # the forward's weight
    assert torch.equal(x.grad, upstream @ unit)
    grad_unit = (upstream.reshape(-1, 5).T @ x.detach().reshape(-1, 6)).float()
    radial = torch.where(norms >= 1e-6, (grad_unit * wide_unit).sum(dim=1, keepdim=True), 0.0)
    grad_rows = torch.addcmul(grad_unit, wide_unit, radial, value=-1.0).div_(clamped).to(dtype)
    assert torch.equal(layer.weight.grad, grad_rows.T if kind == "conv1d" else grad_rows)


def test_compiled_training_equals_eager():
    # a compiled training step (B read from the layers' buffers as 0-d tensors: the fused node keeps lin) traces
    # the fused layer's backward without a graph break and gives the eager gradients
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(BcosLinear(6, 8, b=1.5), BcosConv1D(8, 4, b=1.25))
    x = _inputs(torch.float32)
    eager = _run(model, x, explaining=False, reference=False)
    model.compile(fullgraph=True, backend="aot_eager")
    try:
        compiled = _run(model, x, explaining=False, reference=False)
    finally:
        torch._dynamo.reset()
    _assert_same_run(compiled, eager, torch.float32)


def test_training_forward_drops_the_cached_unit_weight():
    # cached_unit_norm's rule holds for the fused training node too: an evaluation inside reuse_unit_weights
    # caches the unit-norm weight, a training forward drops it (training memory stays as without the cache)
    from bcos_plugins.nn import functional

    layer = BcosLinear(6, 5, b=1.5)
    x = torch.randn(2, 6)
    with reuse_unit_weights():
        with torch.no_grad():
            cached = layer(x)
        assert layer.weight in functional._UNIT_WEIGHTS
        trained = layer(x)
        assert _fused_node(trained) == "BcosLinearNodeBackward"
        assert layer.weight not in functional._UNIT_WEIGHTS
        assert torch.equal(trained.detach(), cached)


def test_fused_forward_is_bit_identical_in_and_out_of_explanation_mode():
    torch.manual_seed(0)
    model = nn.Sequential(BcosLinear(8, 16, b=1.5), BcosLayerNorm(16), DetachableActivation("gelu"),
                          DetachableActivation("silu"), BcosLinear(16, 4, b=1.25, max_out=2))
    x = torch.randn(5, 8) * 10
    plain = model(x)
    with explanation_mode(model):
        explaining = model(x)
    assert torch.equal(plain, explaining)
    # and torch's own activation / layer norm values, as the conventional model computes them
    assert torch.equal(DetachableActivation("gelu")(x), nn.functional.gelu(x))
    with explanation_mode():
        assert torch.equal(DetachableActivation("gelu_tanh")(x), nn.functional.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2ForSequenceClassification",
                                  "LlamaForSequenceClassification"])
def test_fused_model_equals_reference_model(name):
    model = bcosify(tiny_model(name), b=1.25, verbose=False).double()
    ids, mask = padded_batch()
    fused = explain(model, ids, mask)
    with reference_path():
        ref = explain(model, ids, mask)
    torch.testing.assert_close(fused.explained, ref.explained, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused.input_contributions, ref.input_contributions, rtol=1e-10, atol=1e-12)
    assert fused.completeness_error.max() < 1e-10
    model.train()
    grads = []
    for reference in (False, True):
        model.zero_grad()
        with reference_path(reference):
            torch.manual_seed(0)
            bcos_loss(model(input_ids=ids, attention_mask=mask), torch.tensor([0, 1, 2])).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for key in grads[0]:
        torch.testing.assert_close(grads[0][key], grads[1][key], rtol=1e-9, atol=1e-12, msg=key)


def _saved_bytes(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd saves for the backward pass of a training forward."""
    return saved_for_backward_bytes(model, lambda: model(input_ids=ids, attention_mask=mask).logits.sum())


def test_fused_layers_save_less_for_backward_than_reference():
    # Peak training memory is set by what autograd saves. Measured on this tiny BERT (hidden 32, 2 layers,
    # batch 8 x 32): conventional 1.00, fused B-cos 1.20x (1.31x before the linear layers ran as one node),
    # reference B-cos 2.4x (the per-layer |cos|, its clamp, square roots and the GELU gate each kept).
    # tests/test_saved_activations.py bounds the ratio at larger widths and for GPT-2 and Llama.
    ids = torch.randint(3, 60, (8, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    conventional = tiny_model("BertForSequenceClassification").train()
    bcos = bcosify(tiny_model("BertForSequenceClassification"), b=1.25, verbose=False).train()
    torch.manual_seed(0)
    base = _saved_bytes(conventional, ids, mask)
    torch.manual_seed(0)
    fused = _saved_bytes(bcos, ids, mask)
    with reference_path():
        torch.manual_seed(0)
        reference = _saved_bytes(bcos, ids, mask)
    assert fused < 0.6 * reference
    assert fused <= 1.22 * base, (fused / base, reference / base)


def test_reference_path_is_scoped_and_validated():
    assert not using_reference_path()
    with reference_path():
        assert using_reference_path()
        with reference_path(False):
            assert not using_reference_path()
        assert using_reference_path()
    assert not using_reference_path()
    with pytest.raises(BcosTypeError, match=r"^enabled: must be True or False, got str 'yes'\. Call reference_path\(\) "
                                            r"or reference_path\(False\)\.$"):
        with reference_path("yes"):
            pass
    assert not using_reference_path()


def test_autocast_bfloat16_keeps_the_bcos_factor_in_bfloat16():
    # The matrix product runs in bfloat16 under autocast; the fused cosine and factor stay bfloat16 too
    # (only ||x||, one number per row, is float32), so nothing of the output's size is widened to float32 and
    # kept for the backward pass (the reference path keeps its float32 |cos| and square roots).
    torch.manual_seed(0)
    layer = BcosLinear(16, 32, b=1.5)
    x = torch.randn(4, 7, 16, requires_grad=True)

    def saved_float32_of_output_size(reference: bool) -> int:
        found = []

        def pack(t):
            if t.dtype == torch.float32 and t.shape[-1] == 32 and t.numel() == 4 * 7 * 32:
                found.append(t)
            return t

        with reference_path(reference), torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = layer(x)
        assert out.dtype == torch.bfloat16
        return len(found)

    assert saved_float32_of_output_size(reference=False) == 0
    assert saved_float32_of_output_size(reference=True) > 0


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_lens_model_under_bfloat16_autocast_is_finite_and_complete(layout):
    # the TransformerLens B-cos components on the fused path under autocast: the loss and every gradient are
    # finite, and explain_logits is complete to bfloat16's rounding (measured 1e-2 of the logit; float32: 1e-6)
    from bcos_plugins.adapters.transformer_lens import (
        BcosHookedTransformer,
        BcosTransformerConfig,
        explain_logits,
    )

    shape = dict(act_fn="gelu_new", normalization_type="LN") if layout == "gpt2" else dict(
        act_fn="silu", gated_mlp=True, normalization_type="RMS", positional_embedding_type="rotary",
        n_key_value_heads=2)
    model = BcosHookedTransformer(BcosTransformerConfig(d_model=16, n_layers=2, n_heads=4, d_head=4, d_mlp=24,
                                                        d_vocab=40, n_ctx=16, device="cpu", bcos_b=1.5, seed=0,
                                                        **shape)).eval()
    tokens = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(tokens, return_type="loss")
        loss.backward()
        explained = explain_logits(model, tokens, target=5)
    assert loss.dtype == torch.bfloat16 and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert explained.completeness_error.max() < torch.finfo(torch.bfloat16).eps ** 0.5
    assert explain_logits(model, tokens, target=5).completeness_error.max() < 1e-5


def _one_layer_model(name: str, bcos_query_key: bool = True) -> nn.Module:
    import transformers as T
    from conftest import tiny_config

    config = tiny_config({"Bert": "bert", "GPT2": "gpt2", "Llam": "llama"}[name[:4]])
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(config, key):
            setattr(config, key, 1)
    torch.manual_seed(0)
    return bcosify(getattr(T, name)(config).eval(), b=1.25, verbose=False, bcos_query_key=bcos_query_key)


@pytest.mark.parametrize(("name", "backend"), [("BertForSequenceClassification", "aot_eager"),
                                               ("GPT2ForSequenceClassification", "eager"),
                                               ("LlamaForSequenceClassification", "eager")])
@pytest.mark.parametrize("bcos_query_key", [True, False])
def test_compiled_fullgraph_forward_and_explain_equal_eager(name, backend, bcos_query_key):
    # fullgraph=True raises on any graph break. "eager" checks that Dynamo traces the whole model; "aot_eager"
    # also traces the fused layers' backward (inductor would add minutes of C++ compilation on CPU).
    # bcos_query_key=False keeps the query/key projections stock (GPT-2: StockQueryKeyConv1D).
    torch._dynamo.reset()
    model = _one_layer_model(name, bcos_query_key)
    ids, mask = padded_batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    eager = explain(model, ids, mask)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    model.compile(fullgraph=True, backend=counting_backend)
    try:
        with torch.no_grad():
            compiled_logits = model(input_ids=ids, attention_mask=mask).logits
        compiled = explain(model, ids, mask)
        compiled_once = len(graphs)
        explain(model, ids, mask)  # a second call reuses the graph (nothing in it changes per call)
        assert len(graphs) == compiled_once
        torch.testing.assert_close(compiled_logits, logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled.explained, eager.explained, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled.input_contributions, eager.input_contributions, rtol=1e-4, atol=1e-6)
        assert compiled.completeness_error.max() < 1e-5
        # the compiled graph reads B from each layer's buffer, so a B written after compiling is used
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, AlignmentPressure):
                    module.bcos_b.fill_(2.0)
            changed = model(input_ids=ids, attention_mask=mask).logits
        model._compiled_call_impl = None  # eager again
        with torch.no_grad():
            torch.testing.assert_close(changed, model(input_ids=ids, attention_mask=mask).logits, rtol=1e-5,
                                       atol=1e-6)
        assert not torch.allclose(changed, logits)
    finally:
        torch._dynamo.reset()


def test_second_derivative_through_a_training_layer_raises_and_the_reference_path_gives_it():
    # the fused node's backward is not itself differentiable: a backward pass that records its own graph raises
    # rather than returning a gradient whose graph silently lacks the terms through the recomputed dyn and
    # unit-norm weight (only the ||x|| part would be recorded); the reference path gives second derivatives
    torch.manual_seed(0)
    layer = BcosLinear(6, 5, b=1.5).double()
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)

    def grad_norm_squared():
        (grad,) = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
        return grad.square().sum()

    with pytest.raises(BcosRuntimeError, match=r"^create_graph: .* inside bcos_plugins.nn.reference_path\(\)"):
        grad_norm_squared()
    with reference_path():
        assert torch.autograd.gradgradcheck(lambda t: layer(t), (x,))
        grad_norm_squared().backward()
    assert torch.isfinite(layer.weight.grad).all()


def test_explaining_constant_outputs_record_no_concatenation_and_query_key_layers_no_graph():
    # a fused q|k|v projection holds its q|k units at gradient 0 inside one product node (before: the product, then
    # slices, the detached slice and a concatenation, a copy of the output); a query or key projection, whose whole
    # output is a constant, records nothing (before: the matrix product and the product, then detached). Values,
    # gradients and second derivatives as on the reference path, which detaches step by step
    torch.manual_seed(0)
    qkv = BcosLinear(8, 12, b=1.25, constant_outputs=slice(0, 8))
    query = BcosLinear(8, 4, b=1.25, constant_outputs=slice(None))
    x = torch.randn(2, 5, 8) * 3
    x[0, 0] = 0.0
    upstream = torch.linspace(-1.0, 2.0, 2 * 5 * 12).reshape(2, 5, 12)
    runs = []
    for reference in (False, True):
        with reference_path(reference), explanation_mode(qkv), explanation_mode(query):
            xr = x.clone().requires_grad_()
            with RecordedOps() as recorded:
                out = qkv(xr)
            (grad,) = torch.autograd.grad(out, xr, upstream, create_graph=True)
            (second,) = torch.autograd.grad((grad * grad).sum(), qkv.weight)  # a loss on the explanation
            saved: list[torch.Tensor] = []
            with torch.autograd.graph.saved_tensors_hooks(saved.append, lambda t: t):
                constant = query(xr)
            (qk_grad,) = torch.autograd.grad(qkv(xr)[..., :8].sum(), xr, allow_unused=True)
        assert qk_grad is None or not qk_grad.any()
        runs.append((out.detach(), grad.detach(), second, constant))
        if not reference:
            assert "cat" not in recorded.ops, recorded.ops
            assert constant.grad_fn is None and saved == []  # no autograd node saved a tensor
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the values of the layer out of explanation mode
        assert torch.equal(query(x), runs[0][3]) and torch.equal(qkv(x), runs[0][0])


@pytest.mark.parametrize("explaining", [False, True])
@pytest.mark.parametrize("name", ["linear_b1.5_m1", "linear_b1.5_m2", "linear_b1.0_m1", "conv1d",
                                  "linear_constant_outputs"])
def test_batched_gradients_equal_one_backward_per_row(name, explaining):
    # autograd.grad(..., is_grads_batched=True) (the TransformerLens decomposition's batched backward) vmaps the
    # backward passes of the fused nodes: they must not write a batched gradient into an unbatched tensor
    module, _ = _layers()[name]
    x = torch.randn(3, 6, requires_grad=True)
    with explanation_mode(module) if explaining else contextlib.nullcontext():
        y = module(x)
    basis = torch.eye(y.numel()).reshape(-1, *y.shape)
    (batched,) = torch.autograd.grad(y, x, basis, is_grads_batched=True, retain_graph=True)
    rows = torch.stack([torch.autograd.grad(y, x, one, retain_graph=True)[0] for one in basis])
    torch.testing.assert_close(batched, rows, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_explaining_linear_saves_no_unit_norm_weight(kind, dtype):
    # explaining without parameter gradients and without reuse_unit_weights(), the unit-norm weight is computed
    # afresh per call: F.linear(x, unit) saved it for its backward pass (a weight-sized copy per layer alive until
    # the backward, 34 MB of a MiniLM explanation). The backward recomputes it from the resident raw weight and the
    # per-unit clamped norms instead: saved are the constant dyn (output-sized) and the norms (float32 for
    # bfloat16 weights, one per unit); the weight itself is a parameter (not counted). Before: + 64 x 48 weights.
    from bcos_plugins.nn import BcosConv1D, BcosLinear
    from bcos_plugins.nn.dynamic import no_parameter_gradients

    torch.manual_seed(0)
    units, d_in = 64, 48
    layer = (BcosConv1D.from_conv1d(Conv1D(units, d_in), b=1.5) if kind == "conv1d"
             else BcosLinear(d_in, units, b=1.5)).to(dtype)
    x = torch.randn(2, 3, d_in, dtype=dtype, requires_grad=True)

    def forward():
        with explanation_mode(layer), no_parameter_gradients():
            return layer(x).sum()

    norm_bytes = units * (8 if dtype == torch.float64 else 4)
    assert saved_for_backward_bytes(layer, forward) == 2 * 3 * units * x.element_size() + norm_bytes


@pytest.mark.parametrize("constant", [None, slice(1, 3), slice(0, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_explaining_linear_records_one_node(kind, dtype, constant):
    # explaining without parameter gradients (as explain runs), a layer is one autograd node between its input and
    # its output: the matrix product's node and the recorded product with dyn (two nodes, two no_grad blocks and a
    # recorded in-place product before; about 15 us of Python a layer at hidden 128) are one Function that runs their
    # kernels, so the output, the input gradient and its second-order gradient are those of the same kernels recorded
    # as several nodes (inside reuse_unit_weights(), whose cached unit-norm weight is the same division), bit for bit;
    # a general constant block too (its units' gradient is 0 in the same node)
    from bcos_plugins.nn.dynamic import no_parameter_gradients

    layer = zero_unit_projection(kind, 1.25, dtype)
    layer.constant_outputs = constant
    upstream = torch.linspace(-1.0, 2.0, 4 * 3 * 5, dtype=torch.float64).reshape(4, 3, 5).to(dtype)
    results = []
    for reuse in (False, True):
        x = _inputs(dtype).requires_grad_()
        grad_out = upstream.clone().requires_grad_()
        with explanation_mode(layer), no_parameter_gradients(), reuse_unit_weights(reuse):
            out = layer(x)
            (grad,) = torch.autograd.grad(out, x, grad_out, create_graph=True)
        (again,) = torch.autograd.grad(grad, grad_out, torch.ones_like(grad))
        nodes = [type(node).__name__ for node, _ in out.grad_fn.next_functions if node is not None]
        results.append((nodes, out.detach(), grad.detach(), again))
    assert results[0][0] == ["AccumulateGrad"]  # the input's, straight from the layer's one node
    assert results[1][0] != ["AccumulateGrad"] or constant == slice(0, 2)  # (several nodes; one-block: one already)
    for fused, recorded in zip(results[0][1:], results[1][1:], strict=True):
        assert torch.equal(fused, recorded)


class _LiveBytes(TorchDispatchMode):
    """The peak of the bytes of the tensors that the ops run inside it allocate and that are still alive (an op's
    output that shares an input's storage, a view or an unpacked saved tensor, allocates nothing)."""

    def __init__(self):
        super().__init__()
        self.live, self.current, self.peak = set(), 0, 0

    def _gone(self, key, size):
        self.live.discard(key)
        self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size and key not in self.live and key not in inputs:
                    self.live.add(key)
                    self.current += size
                    weakref.finalize(storage, self._gone, key, size)
        self.peak = max(self.peak, self.current)
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_training_linear_backward_frees_the_scale_early(dtype):
    # the training node's backward recovers dyn and the active mask (output-sized each) from the saved output; dyn
    # was alive until the node returned, beside the norm's output-sized product and the gradient: the peak of a
    # MiniLM training step (issue 30) fell in this backward. Then dyn was freed once its product was taken and the
    # mask on return (3 output-sized tensors at once, 4 before); now the gradient is written into dyn and the norm's
    # product into the mask: at most 2 output-sized tensors allocated at once, small weight-sized ones aside
    torch.manual_seed(0)
    x = torch.randn(4096, 8, dtype=dtype, requires_grad=True)
    weight = torch.randn(64, 8, dtype=dtype, requires_grad=True)
    y = bcos_linear(x, weight, None, 1.5, own_norm=True)
    grad = torch.randn_like(y)
    out_bytes = y.numel() * (8 if dtype == torch.float64 else 4)  # dyn and the gradients: float32 for bfloat16
    with _LiveBytes() as mode:
        y.backward(grad)
    # (bfloat16: and the incoming gradient widened to float32, one more; 3, 4 and 5 before)
    assert mode.peak < (3.5 if dtype == torch.bfloat16 else 2.5) * out_bytes, (mode.peak, out_bytes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_training_linear_backward_allocates_each_gradient_once(dtype):
    # after the scale's gradient, the training node's backward took the input's gradient (input-sized), then the
    # weight's (three weight-sized temporaries: the unit-norm weight, G and G * unit), and added the input norm's
    # term to the input gradient out of place (a second input-sized tensor). Now the weight's gradient comes first
    # and the norm's term is added in place: a wide layer's peak holds the weight's temporaries without the input
    # gradient beside them, and a narrow layer's one input-sized tensor, not two
    torch.manual_seed(0)
    sizes = 8 if dtype == torch.float64 else 4  # the scale's gradient: float32 for bfloat16
    for (rows, d_in, units), wide in (((256, 512, 2048), True), ((4096, 64, 8), False)):
        if wide and dtype == torch.bfloat16:
            continue  # (its bfloat16 G and float32 unit-norm weight make a float32 product: other temporaries)
        x = torch.randn(rows, d_in, dtype=dtype, requires_grad=True)
        weight = torch.randn(units, d_in, dtype=dtype, requires_grad=True)
        y = bcos_linear(x, weight, None, 1.5, own_norm=True)
        out_bytes, weight_bytes, x_bytes = rows * units * sizes, units * d_in * sizes, x.numel() * x.element_size()
        grad = torch.randn_like(y)
        with _LiveBytes() as mode:
            y.backward(grad)
        if wide:  # before: + x_bytes
            assert mode.peak < out_bytes + 3 * weight_bytes + x_bytes / 2, (mode.peak, out_bytes, weight_bytes, x_bytes)
        else:  # before: 2 x_bytes (bfloat16: 2.7)
            assert mode.peak < 2 * out_bytes + 1.5 * x_bytes, (mode.peak, out_bytes, x_bytes)
