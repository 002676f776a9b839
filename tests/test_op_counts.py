"""How many ATen ops the B-cos layers dispatch per forward, pinned per layer type, mode and precision.

On a GPU an eager B-cos forward is bound by the host launching kernels (docs/benchmarks.md#gpu: one bfloat16
MiniLM forward launched 689 kernels for B-cos against 120 for the conventional model), and every op a layer
dispatches costs 10-30 us of host time there. The ops are counted here on the CPU with a ``TorchDispatchMode``,
which sees what the GPU would launch (``torch.autocast("cpu", torch.bfloat16)`` inserts the casts CUDA autocast
does); the few ops whose form depends on the device are counted on the ``meta`` device, which takes the non-CPU
branch. A change that adds an op to a B-cos layer fails here, naming the op; one that removes ops lowers the pins.

Modes, as the package runs them: inference (``no_grad``, eval), explaining (``explanation_mode`` and
``no_parameter_gradients`` with an input that requires a gradient, as ``explain`` runs a forward) and training
(autograd recording, train mode). The MiniLM model is the all-MiniLM-L6-v2 config (6 layers, hidden 384) with random
weights, B = 1.5, as ``benchmarks/bench_gpu.py`` builds it; only ops inside B-cos modules are pinned
(transformers' own attention, embeddings and residual sums are the conventional model's).
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch
import transformers as T
from torch.utils._python_dispatch import TorchDispatchMode

from bcos_plugins import bcosify
from bcos_plugins.nn import BcosConv1D, BcosLinear, DetachableActivation, explanation_mode
from bcos_plugins.nn.dynamic import no_parameter_gradients

# views and allocations launch no kernel: not counted (an allocation costs the host a few us of dispatch and the
# caching allocator's bookkeeping, a kernel 10-30 us on a GPU)
NO_KERNEL = {"t", "view", "_unsafe_view", "detach", "alias", "unsqueeze", "expand", "as_strided", "transpose",
             "permute", "slice", "select", "split", "unbind", "squeeze", "_reshape_alias", "lift_fresh",
             "empty", "empty_like", "new_empty", "empty_strided"}
BCOS_MODULES = ("BcosLinear", "BcosLayerNorm", "DetachableActivation")


class CountOps(TorchDispatchMode):
    """The ATen ops dispatched while active, each under the innermost module of ``modules`` running it."""

    def __init__(self, modules: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()  # (module type, op) -> count
        self._stack: list[str] = []
        self._handles = []
        for module in [] if modules is None else modules.modules():
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._leave))

    def _enter(self, module, args):
        self._stack.append(type(module).__name__)

    def _leave(self, module, args, out):
        self._stack.pop()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            self.ops[(self._stack[-1] if self._stack else "", name)] += 1
        return func(*args, **(kwargs or {}))

    def per_module(self) -> dict[str, int]:
        totals: collections.Counter = collections.Counter()
        for (module, _), n in self.ops.items():
            totals[module] += n
        return dict(totals)

    def of(self, module: str) -> dict[str, int]:
        return {op: n for (where, op), n in sorted(self.ops.items()) if where == module}

    def names(self) -> list[str]:
        return sorted(op for (_, op), n in self.ops.items() for _ in range(n))


def _amp(autocast: bool):
    return torch.autocast("cpu", torch.bfloat16) if autocast else contextlib.nullcontext()


def _layer_forward_ops(layer: torch.nn.Module, x: torch.Tensor, mode: str, autocast: bool) -> CountOps:
    """The ops of one forward of ``layer`` in ``mode`` (after one uncounted call), on a fresh copy of ``x``."""

    def forward(x):
        if mode == "inference":
            with torch.no_grad():
                return layer.eval()(x)
        if mode == "explaining":
            with explanation_mode(layer), no_parameter_gradients():
                return layer(x.requires_grad_())
        return layer.train()(x.requires_grad_())

    first, second = x.clone(), x.clone()
    with _amp(autocast):
        forward(first)
        with CountOps() as counter:
            forward(second)
    return counter


# Ops per B-cos linear layer with its own input (no norm shared with another layer), B = 1.5, forward:
#   weight: linalg_vector_norm clamp_min(_) div  (under autocast the division stores bfloat16: + empty_like, no cast)
#   mm; input: linalg_vector_norm hypot; scale: abs reciprocal mul_ [clamp_min_] sqrt_; product: mul_
# (+ autocast's cast of the float32 input). Inference leaves the floor (clamp_min_) out: only derivatives need it.
# Before 2026-11-28: 12 / 13 / 13 under autocast (the normalised weight cast by a copy of its own).
# + 1 since 2026-11-29 (nan_to_num after the hypot: an input norm that overflows float32 gives NaN, not 0; one kernel
# on the per-row norms, once per distinct input, the MiniLM forward's cost within noise, docs/benchmarks.md#nn-norm-overflow-nan).
# + 1 since 2026-11-29 (helper-201: nan_to_num on the weight's (units, 1) norms, an overflowed unit norm NaN, not 0).
LINEAR_FORWARD_OPS = {
    ("inference", False): 13, ("inference", True): 14,
    ("explaining", False): 14, ("explaining", True): 15,
    ("training", False): 14, ("training", True): 15,
}


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
@pytest.mark.parametrize("mode", ["inference", "explaining", "training"])
@pytest.mark.parametrize("cls", [BcosLinear, BcosConv1D])
def test_one_bcos_linear_forward_dispatches_the_pinned_ops(cls, mode, autocast):
    torch.manual_seed(0)
    layer = cls(32, 16, b=1.5)
    counter = _layer_forward_ops(layer, torch.randn(4, 7, 32), mode, autocast)
    ops = counter.names()
    assert len(ops) == LINEAR_FORWARD_OPS[(mode, autocast)], ops
    # under autocast only the input is cast by a copy: the unit-norm weight is divided straight into bfloat16
    assert ops.count("_to_copy") == (1 if autocast else 0), ops
    assert ops.count("mm") == 1 and ops.count("div") == 1 and ops.count("reciprocal") == 1, ops
    # the overflowed-norm NaN: one on the input's norm, one on the weight's unit norms
    assert ops.count("nan_to_num") == 2, ops


# Ops of one training backward pass through a B-cos linear layer (B = 1.5, its input norm's backward included):
# before 2026-11-28 34 in float32 and 43 under bfloat16 autocast (the output gradient widened to float32 by two
# copies, the output and the weight gradient's matrix product by one each, a dispatched promote_types, and seven ops
# of autograd's nodes for the input norm); now the gradient is widened once, the products widen their other bfloat16
# operands on load (exact, no copy kernel), the layer differentiates its own input norm (one addcmul), multiplies
# the gradient by B where |cos| is above the floor in one addcmul_ (the factor took three) and masks a clamped
# weight norm's radial term in place (torch.where took three).
LINEAR_BACKWARD_OPS = {False: 25, True: 30}


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
def test_one_bcos_linear_training_backward_dispatches_the_pinned_ops(autocast):
    torch.manual_seed(0)
    layer = BcosLinear(32, 16, b=1.5)
    x = torch.randn(4, 7, 32, requires_grad=True)
    with _amp(autocast):
        out = layer(x)
    upstream = torch.randn_like(out)
    with CountOps() as counter:
        out.backward(upstream)
    ops = counter.names()
    assert len(ops) == LINEAR_BACKWARD_OPS[autocast], ops
    # the copies left: the output and its gradient to float32 (the scale's recovery and its gradient), that
    # gradient, the unit-norm weight and x to bfloat16 (the two matrix products)
    assert ops.count("_to_copy") == (5 if autocast else 0) and "promote_types" not in ops, ops
    # no autograd node of the input norm (its backward masks zero norms: eq, masked_fill_); one mask, the radial term's
    assert "eq" not in ops and ops.count("masked_fill_") == 1 and "where" not in ops, ops


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
def test_layers_reading_one_input_share_its_norm_its_reciprocal_and_its_cast(autocast):
    # an attention block's query, key and value projections read one tensor: without autograd recording its norm,
    # the norm's reciprocal and (under autocast) its bfloat16 cast are computed once for the three (before: the
    # reciprocal and the cast three times each); the same bits as separate inputs
    torch.manual_seed(0)
    layers = [BcosLinear(32, 16, b=1.5).eval() for _ in range(3)]
    x = torch.randn(4, 7, 32)
    with torch.no_grad(), _amp(autocast):
        expected = [layer(x.clone()) for layer in layers]
        with CountOps() as counter:
            got = [layer(x) for layer in layers]
        for actual, wanted in zip(got, expected, strict=True):
            assert torch.equal(actual, wanted)
        ops = counter.names()
        assert ops.count("linalg_vector_norm") == 3 + 1 and ops.count("hypot") == 1 and ops.count("reciprocal") == 1
        assert ops.count("_to_copy") == (1 if autocast else 0), ops
        x.mul_(-1.0)  # written in place: the cast is made again, so the layers read the new values
        assert torch.equal(layers[0](x), -expected[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls", [BcosLinear, BcosConv1D])
def test_half_precision_weights_are_normalised_in_float32_without_copies(cls, dtype):
    # a model converted to bfloat16 / float16: the weight's float32 quotient is rounded once on store (before: a copy to
    # float32 and one back, two kernels per layer and call), the same bits as the two-step form
    from bcos_plugins.nn.functional import _divided_by_norm, _unit_norms, unit_norm

    torch.manual_seed(0)
    layer = cls(32, 16, b=1.5).to(dtype).eval()
    view = layer.weight.T if cls is BcosConv1D else layer.weight
    x = torch.randn(4, 7, 32).to(dtype)
    with CountOps() as counter, torch.no_grad():
        layer(x)
    # float16 computes the cosine in float32 (its range): |lin| widened and the scale rounded back, not the weight
    assert counter.names().count("_to_copy") == (2 if dtype == torch.float16 else 0), counter.names()
    two_steps = _divided_by_norm(view, _unit_norms(view, 1).clamp_min(1e-6))
    assert torch.equal(layer.unit_weight(), two_steps) and torch.equal(unit_norm(view, 1), two_steps)


@pytest.mark.parametrize("mode", ["inference", "explaining"])
@pytest.mark.parametrize("cls", [BcosLinear, BcosConv1D])
def test_autocast_forward_equals_the_per_call_cast_bit_for_bit(cls, mode):
    # the unit-norm weight stored in bfloat16 by the division itself: the same bits as autocast's own cast of the
    # float32 quotient, which the training forward (recorded: the quotient is differentiated) still takes
    from bcos_plugins.nn.functional import _inference_product, _lin_dtype_scale, input_norm

    torch.manual_seed(0)
    layer = cls(32, 16, b=2.0).eval()
    x = torch.randn(4, 7, 32)
    with torch.autocast("cpu", torch.bfloat16):
        unit = layer.unit_weight()
        assert unit.dtype == torch.float32 and unit.grad_fn is not None  # recorded, cast by autocast in F.linear
        lin = torch.nn.functional.linear(x, unit).detach()
        if mode == "inference":
            with torch.no_grad():
                got = layer(x)
        else:
            with explanation_mode(layer), no_parameter_gradients():
                got = layer(x.clone().requires_grad_()).detach()
    norm = input_norm(x.clone())
    expected = _inference_product(lin, norm, 2.0) if mode == "inference" else lin * _lin_dtype_scale(lin, norm, 2.0)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_explaining_gelu_backward_is_the_gate_in_place_and_one_product():
    # torch.special.ndtr is a composite of four out-of-place ops on every device (checked on torch 2.13: no CPU or
    # CUDA kernel of its own), so the gate's four steps, three of them in place, are as few kernels as it takes
    act = DetachableActivation("gelu")
    x = torch.randn(4, 7, 32, requires_grad=True)
    with explanation_mode(act):
        out = act(x)
    upstream = torch.ones_like(out)
    with CountOps() as counter:
        torch.autograd.grad(out, x, upstream)
    assert counter.names() == ["add_", "erf", "mul", "mul", "mul_"]  # x / sqrt 2, erf, + 1, * 0.5; the product
    with CountOps() as counter:
        torch.special.ndtr(x.detach())
    assert len(counter.names()) == 4, counter.names()


# ---------------------------------------------------------------------------------------------------------------
# One MiniLM-config forward (6 layers, hidden 384: 38 B-cos linear layers, 13 LayerNorms, 6 GELUs), ops inside the
# B-cos modules per mode and precision. Before -> after the 2026-11-28 cuts (docs/benchmarks.md#gpu):
#   inference float32 413 -> 401, bf16 autocast 476 -> 414; explaining float32 452 -> 440, bf16 515 -> 463;
#   training float32 475 -> 475, bf16 538 -> 500 (and each layer's backward pass 5 ops fewer, see above).
# Since 2026-11-29 the overflowed-norm nan_to_num, once per input norm, as LINEAR_FORWARD_OPS above: + 26 BcosLinear ops
# in inference and explaining (26 distinct inputs: the query, key and value projections share theirs), + 38 in
# training (each layer differentiates its own input norm). Since 2026-11-29 (helper-201) the same on each layer's unit
# norms, + 38 in every mode (each of the 38 layers normalises its weight once per forward).
MINILM_BCOS_OPS = {
    ("inference", False): {"BcosLinear": 446, "BcosLayerNorm": 13, "DetachableActivation": 6},
    ("inference", True): {"BcosLinear": 459, "BcosLayerNorm": 13, "DetachableActivation": 6},
    ("explaining", False): {"BcosLinear": 484, "BcosLayerNorm": 14, "DetachableActivation": 6},
    ("explaining", True): {"BcosLinear": 507, "BcosLayerNorm": 14, "DetachableActivation": 6},
    ("training", False): {"BcosLinear": 532, "BcosLayerNorm": 13, "DetachableActivation": 6},
    ("training", True): {"BcosLinear": 557, "BcosLayerNorm": 13, "DetachableActivation": 6},
}
# the nan_to_num ops of the BcosLinear modules: 26 / 38 input norms (see above) and 38 unit norms
MINILM_NAN_TO_NUM = {"inference": 26 + 38, "explaining": 26 + 38, "training": 38 + 38}


@pytest.fixture(scope="module")
def minilm():
    config = T.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                          intermediate_size=1536, num_labels=2)
    torch.manual_seed(0)
    return bcosify(T.BertForSequenceClassification(config), b=1.5, verbose=False).eval()


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16_autocast"])
@pytest.mark.parametrize("mode", ["inference", "explaining", "training"])
def test_one_minilm_forward_dispatches_the_pinned_ops_in_bcos_modules(minilm, mode, autocast):
    ids = torch.randint(5, 30522, (2, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    embeddings = minilm.bert.embeddings

    def forward():
        if mode == "inference":
            with torch.no_grad():
                return minilm(input_ids=ids, attention_mask=mask)
        if mode == "training":
            minilm.train()
            try:
                return minilm(input_ids=ids, attention_mask=mask)
            finally:
                minilm.eval()
        # as explain runs it: the combined embedding is the leaf whose gradient is taken
        with explanation_mode(minilm), no_parameter_gradients():
            probe = embeddings(input_ids=ids).detach().requires_grad_()
            handle = embeddings.register_forward_hook(lambda module, args, out: probe)
            try:
                return minilm(input_ids=ids, attention_mask=mask)
            finally:
                handle.remove()

    with _amp(autocast):
        forward()
        with CountOps(minilm) as counter:
            forward()
    got = {name: n for name, n in counter.per_module().items() if name in BCOS_MODULES}
    expected = MINILM_BCOS_OPS[(mode, autocast)]
    assert got == expected, {name: counter.of(name) for name in BCOS_MODULES}
    assert counter.of("BcosLinear").get("nan_to_num") == MINILM_NAN_TO_NUM[mode], counter.of("BcosLinear")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_training_layer_differentiating_its_own_input_norm_equals_autograds_nodes(dtype):
    # own_norm (as BcosLinear trains): the norm's gradient x * g / ||x|| added in one kernel instead of autograd's
    # seven; the same gradients to rounding, a zero row (padding) included; and x_norm given with it is refused
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.nn.functional import bcos_linear, input_norm

    torch.manual_seed(0)
    weight = torch.randn(16, 32, dtype=dtype, requires_grad=True)
    x = torch.randn(4, 7, 32, dtype=dtype) * 3
    x[0, 0] = 0.0
    upstream = torch.randn(4, 7, 16, dtype=dtype)
    grads = []
    for own in (True, False):
        xr = x.clone().requires_grad_()
        out = bcos_linear(xr, weight, None if own else input_norm(xr), 1.5, own_norm=own)
        grads.append((out.detach(), *torch.autograd.grad(out, (xr, weight), upstream)))
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-13}
    for own, autograds in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(own, autograds, **tolerance)
    assert torch.isfinite(grads[0][1]).all()
    with pytest.raises(BcosValueError, match="x_norm: must be None with own_norm=True"):
        bcos_linear(x, weight, input_norm(x), 1.5, own_norm=True)
