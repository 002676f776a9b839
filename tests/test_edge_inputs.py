"""Every public entry point, driven with generated invalid and edge inputs: the package's error naming the
argument, or a finite correct result (complete where completeness is promised).

One section per area; each section owns its strategies and helpers.
"""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, padded_batch, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import Direction
from bcos_plugins.errors import BcosError

EDGE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ============================================================== explanation core: explain (text)

_MODELS: dict[str, torch.nn.Module] = {}


def _model(name: str):
    if name not in _MODELS:
        _MODELS[name] = bcosify(tiny_model(name), b=1.5, verbose=False)
    return _MODELS[name]


_NAMES = ["BertForSequenceClassification", "GPT2LMHeadModel", "LlamaForCausalLM", "BertModel"]
_any_value = st.one_of(
    st.none(), st.integers(-100, 100), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
    st.lists(st.integers(-5, 70), max_size=5), st.booleans(),
    st.builds(lambda n, k: torch.randint(-3, 70, (n,)), st.integers(0, 5), st.just(0)),
    st.builds(lambda n: torch.rand(n), st.integers(0, 5)),
    st.builds(lambda n: Direction(torch.randn(n)), st.sampled_from([3, 32, 60])),
)


def _check_text_result(expl, model):
    assert torch.isfinite(expl.input_contributions).all() and torch.isfinite(expl.explained).all()
    assert expl.completeness_error.max() < 1e-3 or expl.explained.abs().min() < 1e-4


@EDGE
@given(name=st.sampled_from(_NAMES), target=_any_value, foil=_any_value, position=_any_value,
       side=st.sampled_from(["left", "right"]), reduce=st.sampled_from(["sum", "mean", "max", 1]))
def test_explain_answers_any_argument_correctly_or_names_it(name, target, foil, position, side, reduce):
    model = _model(name)
    ids, mask = padded_batch(side=side)
    try:
        expl = explain(model, ids, mask, target=target, foil=foil, position=position, reduce=reduce)
    except BcosError as err:
        named = [arg for arg in ("target", "foil", "position", "reduce", "attention_mask") if f"{arg}:" in str(err)]
        assert named, f"error does not name the argument: {err}"
        return
    _check_text_result(expl, model)


@EDGE
@given(batch=st.integers(0, 3), length=st.integers(0, 50), low=st.integers(-5, VOCAB + 5),
       mask_kind=st.sampled_from(["none", "ones", "zeros_row", "twos", "float", "short"]))
def test_explain_token_inputs_any_shape_or_range(batch, length, low, mask_kind):
    model = _model("BertForSequenceClassification")
    ids = torch.full((batch, length), low, dtype=torch.long)
    mask = {"none": None, "ones": torch.ones_like(ids), "twos": 2 * torch.ones_like(ids),
            "float": torch.ones(batch, length), "short": torch.ones(batch, max(length - 1, 0), dtype=torch.long),
            "zeros_row": torch.ones_like(ids).index_fill_(0, torch.tensor([0]), 0) if batch else torch.ones_like(ids)
            }[mask_kind]
    try:
        expl = explain(model, ids, mask)
    except BcosError as err:
        assert any(f"{arg}:" in str(err) for arg in ("input_ids", "attention_mask")), str(err)
        return
    _check_text_result(expl, model)
    assert 0 < length <= 40 and 0 <= low < VOCAB and batch > 0


@pytest.mark.parametrize("value", [None, "model", 3, torch.nn.Linear(2, 2)])
def test_explain_refuses_what_is_not_a_supported_model(value):
    ids, mask = padded_batch()
    with pytest.raises(BcosError, match="not supported|model"):
        explain(value, ids, mask)


# ============================================================== subpackages: metrics, bilinear, Space, guided,
# ViT, decoder training (and the sae-lens ranks). Each test draws valid, edge and invalid values together: an
# error must be the package's and name the argument; a result must be finite and correct.

import math  # noqa: E402

import numpy as np  # noqa: E402

from bcos_plugins import metrics as M  # noqa: E402
from bcos_plugins.bilinear import (  # noqa: E402
    BilinearMLP,
    adversarial_masks,
    eigendecompose,
    eigenvector_activations,
    hosvd,
    interaction_matrix,
    l1_l2_sparsity,
    top_eigen_indices,
    truncation_curve,
)
from bcos_plugins.errors import BcosTypeError, BcosValueError  # noqa: E402

SUB = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


def _names(err: Exception, *args: str) -> None:
    """The package's error, naming one of ``args`` in the ``"<argument>: ..."`` pattern."""
    assert isinstance(err, BcosError), f"{type(err).__name__} is not the package's error: {err}"
    assert any(f"{a}:" in str(err) for a in args), f"error names none of {args}: {err}"


@st.composite
def _tensor(draw, max_batch=3, max_len=6, ndim=2, kinds=("float", "int", "bool", "mask")):
    """Tensors of any small shape (zero sizes included), dtype kind, and NaN / inf / zero injections."""
    shape = tuple(draw(st.integers(0, max_batch if i == 0 else max_len)) for i in range(ndim))
    kind = draw(st.sampled_from(kinds))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if kind == "float":
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        special = draw(st.sampled_from(["none", "none", "nan", "inf", "zero"]))
        if t.numel() and special != "none":
            t.view(-1)[draw(st.integers(0, t.numel() - 1))] = {"nan": math.nan, "inf": math.inf, "zero": 0.0}[special]
        return t
    if kind == "int":
        return torch.randint(-2, 4, shape, generator=g)
    if kind == "bool":
        return torch.rand(shape, generator=g) < 0.5
    return (torch.rand(shape, generator=g) < 0.5).to(torch.float32)


_k = st.one_of(st.none(), st.integers(-2, 8), (st.floats(-0.5, 1.5) | st.just(math.nan)), st.booleans(), st.just("3"))


# --- metrics: rationale alignment ------------------------------------------------------------------------------

@SUB
@given(scores=_tensor(), gold=_tensor(kinds=("mask", "bool", "int", "float")), valid=st.none() | _tensor(
    kinds=("bool", "mask")), k=_k)
def test_rationale_alignment_any_input(scores, gold, valid, k):
    try:
        result = M.rationale_alignment(scores, gold, valid, k=k)
    except BcosError as err:
        _names(err, "scores", "gold_mask", "valid_mask", "k")
        return
    valid_b = torch.ones_like(gold, dtype=torch.bool) if valid is None else valid.bool()
    has_gold = (gold.bool() & valid_b).any(1)
    for per_row in (result.iou_per_row, result.auprc_per_row):
        assert torch.equal(per_row.isnan(), ~has_gold)  # NaN exactly where a row has no rationale (documented)
        ok = per_row[has_gold]
        assert ((ok >= 0) & (ok <= 1 + 1e-6)).all()
    assert result.n_rows == int(has_gold.sum())
    # a ranking that puts the rationale first is perfect
    if has_gold.all() and k is None:
        perfect = M.rationale_alignment(gold.double() + 0.01 * torch.rand(gold.shape, dtype=torch.float64),
                                        gold, valid)
        assert perfect.iou == pytest.approx(1.0) and perfect.auprc == pytest.approx(1.0)


# --- metrics: token scores, entropy, completeness --------------------------------------------------------------

@SUB
@given(attributions=_tensor(ndim=3, max_len=4) | _tensor(), mask=st.none() | _tensor(kinds=("mask", "int", "float")),
       reduce=st.sampled_from(["sum", "mean", "l2", "max"]))
def test_entropy_any_input(attributions, mask, reduce):
    try:
        entropy = M.explanation_entropy(attributions, mask, reduce=reduce)
    except BcosError as err:
        _names(err, "attributions", "attention_mask", "reduce")
        return
    n_tokens = attributions.shape[1]
    assert torch.isfinite(entropy).all() and (entropy >= -1e-9).all()
    assert (entropy <= math.log(n_tokens) + 1e-6).all()


@SUB
@given(attributions=_tensor(ndim=3, max_len=4, kinds=("float", "int")), explained=_tensor(ndim=1),
       relative=st.booleans())
def test_completeness_error_any_input_and_zero_explained_values(attributions, explained, relative):
    try:
        err = M.completeness_error(attributions, explained, relative=relative)
    except BcosError as error:
        _names(error, "attributions", "explained")
        return
    total = attributions.double().flatten(1).sum(1)
    delta = (total - explained.double()).abs()
    expected = delta / explained.double().abs().clamp_min(1e-12) if relative else delta
    assert torch.isfinite(err).all()  # an explained value of 0 gives a finite, documented number
    torch.testing.assert_close(err.double(), expected)


def test_completeness_error_of_a_zero_explained_value_is_defined():
    exact = M.completeness_error(torch.tensor([[0.5, -0.5]]), torch.tensor([0.0]))
    off = M.completeness_error(torch.tensor([[0.5, -0.25]]), torch.tensor([0.0]))
    assert exact.item() == 0.0 and math.isfinite(off.item()) and off.item() >= 1.0
    assert M.completeness_error(torch.tensor([[0.5, -0.25]]), torch.tensor([0.0]), relative=False).item() == 0.25


# --- metrics: perturbation curves, AOPC, pointing game ---------------------------------------------------------

def _bag_of_tokens(input_ids, attention_mask, **_):
    """A linear bag-of-tokens classifier over 3 classes: exact, milliseconds."""
    weights = torch.linspace(-1, 1, VOCAB * 3).reshape(VOCAB, 3)
    return (weights[input_ids.clamp(0, VOCAB - 1)] * attention_mask[..., None]).sum(1)


@SUB
@given(scores=_tensor(max_len=9), fractions=st.lists((st.floats(-0.5, 1.5) | st.just(math.nan)), max_size=4)
       | st.just((0.1, 0.5, 0.9)), target=st.none() | st.integers(-1, 4) | st.floats(0, 2),
       batch_size=st.integers(-1, 3))
def test_perturbation_curves_any_input(scores, fractions, target, batch_size):
    ids, mask = padded_batch()
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    try:
        curves = M.perturbation_curves(_bag_of_tokens, ids, mask, scores, special_tokens=special, target=target,
                                       fractions=fractions, batch_size=batch_size)
    except BcosError as err:
        _names(err, "attributions", "fractions", "target", "batch_size", "perturbable")
        return
    for curve in (curves.comprehensiveness, curves.sufficiency):
        assert torch.isfinite(curve).all() and (curve.abs() <= 1).all()
    perturbable = mask.bool() & ~special
    assert (curves.k >= 1).all() and (curves.k <= perturbable.sum(1, keepdim=True)).all()


@SUB
@given(curve=_tensor(ndim=1, max_len=5, kinds=("float", "int")),
       fractions=st.lists((st.floats(-1, 2) | st.sampled_from([math.nan, math.inf])), max_size=5))
def test_aopc_any_input(curve, fractions):
    try:
        area = M.aopc(curve, fractions)
    except BcosError as err:
        _names(err, "curve", "fractions")
        return
    assert math.isfinite(float(area))
    assert float(area) == pytest.approx(float(np.trapezoid(curve.double().numpy(), np.asarray(fractions))))


@SUB
@given(maps=_tensor(ndim=3, max_len=4) | _tensor(ndim=2), cell=st.integers(-1, 5) | st.floats(0, 3)
       | st.just(torch.tensor([0, 1, 2])), grid=st.sampled_from([(2, 2), (0, 2), (1, 4), (2, 2.0), "2x2"]))
def test_grid_pointing_game_any_input(maps, cell, grid):
    try:
        score = M.grid_pointing_game(maps, cell, grid=grid)
    except BcosError as err:
        _names(err, "attributions", "cell", "grid")
        return
    assert torch.isfinite(score).all() and ((score >= 0) & (score <= 1 + 1e-9)).all()


@SUB
@given(maps=_tensor(ndim=3, max_len=4), target=st.integers(-1, 3) | st.floats(0, 1),
       removed=st.floats(allow_nan=True, allow_infinity=True), score=st.sampled_from(["softmax", "logit", "p"]))
def test_pixel_perturbation_any_input(maps, target, removed, score):
    images = torch.rand(maps.shape[0], 1, 4, 4, dtype=torch.float64)
    weights = torch.arange(16, dtype=torch.float64).reshape(1, 1, 4, 4)

    def forward(x):
        first = (x * weights).flatten(1).sum(1)
        return torch.stack([first, -first], dim=1)

    try:
        result = M.pixel_perturbation(forward, images, maps, target, removed_value=removed, score=score)
    except BcosError as err:
        _names(err, "inputs", "attributions", "target", "removed_value", "score")
        return
    assert torch.isfinite(result.most_first).all() and torch.isfinite(result.area_between).all()
    assert maps.shape[1:] == (4, 4) and 0 <= target < 2


# --- metrics: decoders ----------------------------------------------------------------------------------------

@SUB
@given(scores=_tensor(), evidence=_tensor(kinds=("bool", "mask", "float")),
       candidates=st.none() | _tensor(kinds=("bool", "mask")))
def test_mean_reciprocal_rank_any_input(scores, evidence, candidates):
    try:
        result = M.mean_reciprocal_rank(scores, evidence, candidates)
    except BcosError as err:
        _names(err, "scores", "evidence", "candidates")
        return
    ranked = result.reciprocal_ranks[~result.reciprocal_ranks.isnan()]
    assert ranked.numel() == result.n and ((ranked > 0) & (ranked <= 1)).all()
    assert 0 < result.mrr <= 1 and 0 < result.random <= 1


@SUB
@given(n=st.integers(-1, 6) | st.floats(0, 6) | st.booleans(), k=st.integers(-1, 6) | st.floats(0, 6))
def test_expected_random_reciprocal_rank_any_input(n, k):
    try:
        value = M.expected_random_reciprocal_rank(n, k)
    except BcosError as err:
        _names(err, "n_candidates", "n_evidence")
        return
    # brute force over every placement of the k evidence tokens among n
    from itertools import combinations

    places = list(combinations(range(1, n + 1), k))
    assert value == pytest.approx(sum(1 / min(p) for p in places) / len(places))


@SUB
@given(logits=_tensor(max_len=4), target=_tensor(ndim=1, kinds=("int", "float")),
       foil=_tensor(ndim=1, kinds=("int",)))
def test_probability_gap_any_input(logits, target, foil):
    try:
        gap = M.probability_gap(logits, target, foil)
    except BcosError as err:
        _names(err, "logits", "target", "foil")
        return
    assert torch.isfinite(gap).all() and (gap.abs() <= 1).all()


# --- bilinear: weights-based analysis -------------------------------------------------------------------------

_BILINEAR = BilinearMLP(4, 6, 3).double()


@SUB
@given(u=_tensor(ndim=1, max_len=4) | _tensor(max_batch=3, max_len=4), chunk=st.integers(-1, 3) | st.floats(0, 3))
def test_interaction_matrix_any_direction(u, chunk):
    try:
        q = interaction_matrix(_BILINEAR, u, chunk_size=chunk)
    except BcosError as err:
        _names(err, "u", "chunk_size")
        return
    x = torch.randn(5, 4, dtype=torch.float64)
    with torch.no_grad():
        out = _BILINEAR(x)
    directions = u.double().reshape(-1, 3)
    quadratic = torch.einsum("bi,nij,bj->bn", x, q.reshape(-1, 4, 4), x)
    torch.testing.assert_close(quadratic, out @ directions.T)  # x^T Q(u) x = u . out(x), exactly


@SUB
@given(values=_tensor(max_len=5, kinds=("float", "int")), k=st.integers(-1, 6) | st.booleans() | st.floats(0, 2),
       by=st.sampled_from(["magnitude", "positive", "negative", "abs"]))
def test_eigen_helpers_any_input(values, k, by):
    try:
        index = top_eigen_indices(values, k, by)
        sparsity = l1_l2_sparsity(values)
    except BcosError as err:
        _names(err, "eigenvalues", "values", "k", "by")
        return
    assert index.shape == (*values.shape[:-1], k)
    assert torch.isfinite(sparsity).all() and (sparsity <= values.shape[-1] + 1e-9).all()


@SUB
@given(rank=st.none() | st.integers(-1, 4) | st.booleans(), rtol=(st.floats(-1, 2) | st.just(math.nan)),
       per=st.integers(-1, 5), ks=st.lists(st.integers(-1, 5), max_size=3) | st.just([1.5]),
       labels=_tensor(ndim=1, max_len=6, kinds=("int", "float")))
def test_hosvd_masks_and_truncation_any_input(rank, rtol, per, ks, labels):
    eig = eigendecompose(_BILINEAR, torch.eye(3, dtype=torch.float64))
    try:
        decomposition = hosvd(_BILINEAR, rank=rank, rtol=rtol)
        masks = adversarial_masks(eig, per)
        curve = truncation_curve(_BILINEAR, torch.randn(labels.shape[0], 4, dtype=torch.float64), labels, ks)
    except BcosError as err:
        _names(err, "rank", "rtol", "per_direction", "vectors", "ks", "labels", "x")
        return
    keys = masks.masks.reshape(-1, 4) @ masks.eigenvectors.reshape(-1, 4).T
    torch.testing.assert_close(keys, torch.eye(keys.shape[0], dtype=keys.dtype), atol=1e-6, rtol=0)
    assert torch.isfinite(decomposition.singular_values).all()
    assert all(0 <= a <= 1 for a in curve.accuracy)
    full = eigenvector_activations(eig, torch.randn(2, 4, dtype=torch.float64)).sum(-1)
    assert torch.isfinite(full).all()


def test_adversarial_masks_of_dependent_vectors_are_refused():
    from bcos_plugins.bilinear import pseudo_inverse_masks

    with pytest.raises(BcosValueError, match="vectors: are linearly dependent"):
        pseudo_inverse_masks(torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]]))


def test_low_rank_correlation_refuses_ranks_below_one():
    sae_lens = pytest.importorskip("sae_lens")
    from bcos_plugins.adapters.sae_lens import BilinearSAEInteractions

    def sae(seed):
        torch.manual_seed(seed)
        return sae_lens.TopKSAE(sae_lens.TopKSAEConfig(d_in=4, d_sae=6, k=3))

    analysis = BilinearSAEInteractions(BilinearMLP(4, 6), sae(0), sae(1))
    x = torch.randn(20, 4)
    for ranks in ([0], [-1], [], 0, [1.5]):  # [0] used to report a correlation of exactly 1.0
        with pytest.raises((BcosValueError, BcosTypeError), match="ranks:"):
            analysis.low_rank_correlation(x, [0, 1], ranks=ranks)


# ============================================================== layers, conversion, checkpoints, training helpers

from bcos_plugins import load_bcos_model  # noqa: E402
from bcos_plugins.nn import BcosConv2d, BcosLayerNorm, BcosLinear, explanation_mode  # noqa: E402
from bcos_plugins.train import bcos_loss  # noqa: E402

_ANY_B = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 20), st.text(max_size=4), st.none(),
    st.booleans(), st.floats(0.5, 11.0), st.builds(lambda v: torch.tensor(v), st.floats(0.0, 12.0)),
)


def _b_in_range(b) -> bool:
    if isinstance(b, bool):
        return False
    value = b.item() if isinstance(b, torch.Tensor) else b
    return isinstance(value, int | float) and math.isfinite(value) and 1.0 <= value <= 10.0


@EDGE
@given(b=_ANY_B)
def test_bcosify_and_layers_take_any_b_in_range_or_name_it(b):
    model = tiny_model("BertForSequenceClassification")
    for build in (lambda: bcosify(model, b=b, verbose=False), lambda: BcosLinear(3, 2, b=b),
                  lambda: BcosConv2d(1, 2, 3, b=b)):
        try:
            built = build()
        except Exception as err:  # noqa: BLE001 - the assertion checks what was raised
            assert not _b_in_range(b), f"b={b!r} is valid but was refused: {err}"
            _names(err, "b")
            assert "b must be >= 1" in str(err)
            continue
        assert _b_in_range(b), f"b={b!r} was accepted"
        layers = [m for m in built.modules() if isinstance(m, BcosLinear | BcosConv2d)]
        assert layers and all(m.b == float(b) and m.bcos_b.item() == float(b) for m in layers)


@EDGE
@given(
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    log_scale=st.floats(-3.0, 4.0),
    zero_rows=st.integers(0, 3),
    b=st.sampled_from([1.0, 1.1, 1.25, 1.5, 2.0, 2.5]),
    max_out=st.integers(1, 2),
    seed=st.integers(0, 1000),
)
def test_bcos_layers_are_finite_and_close_to_float32_at_any_scale(dtype, log_scale, zero_rows, b, max_out, seed):
    # Norms up to ~1e4 * sqrt(16): their squares overflow float16 from norm 256 on; zero rows are padding.
    torch.manual_seed(seed)
    layer = BcosLinear(16, 6, b=b, max_out=max_out)
    norm = BcosLayerNorm(6, eps=1e-12)
    x = torch.randn(4, 16) * 10.0**log_scale
    x[:zero_rows] = 0
    x = x.to(dtype).float()  # the same (representable) input for both precisions
    reference = norm(layer(x))
    low = norm.to(dtype)(layer.to(dtype)(x.to(dtype))).float()
    assert torch.isfinite(low).all()
    assert (low[:zero_rows] == 0).all()
    # LayerNorm output has unit scale; half precision keeps about 3 (bfloat16: 2) significant digits per op
    # (the bound allows a row whose variance is tiny to amplify rounding).
    tol = 0.15 if dtype == torch.bfloat16 else 0.05
    close = (low - reference).abs().amax(-1) <= tol * reference.abs().amax(-1).clamp_min(1.0)
    assert close.all()
    layer.float()
    x64 = x.double().requires_grad_(True)
    layer.double()
    with explanation_mode(layer):
        y = layer(x64)
        (grad,) = torch.autograd.grad(y[:, 0].sum(), x64)
    torch.testing.assert_close((x64 * grad).sum(-1), y[:, 0].detach(), rtol=1e-9, atol=1e-9)


@EDGE
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16]), b=st.sampled_from([1.1, 1.25, 1.5, 2.0]))
def test_zero_inputs_train_with_finite_gradients_in_half(dtype, b):
    layer = BcosLinear(8, 4, b=b).to(dtype)
    x = torch.zeros(2, 8, dtype=dtype, requires_grad=True)
    layer(x).square().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()


# Local paths only ("./" or "/" first): a bare "user/model" is a hub id, which would try the network.
_PATHS = st.one_of(
    st.text(max_size=30).map(lambda s: "./" + s), st.text(max_size=30).map(lambda s: "/" + s), st.none(),
    st.integers(), st.binary(max_size=5), st.floats(),
    st.sampled_from([".", "..", "./tests", "/", "/nonexistent/x", "~", "./" + "a" * 300, "./x\x00y"]),
)


@EDGE
@given(path=_PATHS)
def test_load_bcos_model_names_the_path_for_anything_that_is_not_a_saved_model(path):
    with pytest.raises(BcosError) as info:
        load_bcos_model(path)
    _names(info.value, "path")


@EDGE
@given(
    batch=st.integers(0, 3), classes=st.integers(0, 3), extra_dim=st.booleans(),
    labels=st.lists(st.one_of(st.integers(-2, 4), st.floats(-1, 4)), max_size=4),
    n_items=st.one_of(st.none(), st.integers(-1, 5), st.floats(allow_nan=True)),
)
def test_bcos_loss_is_finite_or_names_the_argument(batch, classes, extra_dim, labels, n_items):
    logits = torch.randn(batch, classes, *((2,) if extra_dim else ()))
    as_float = any(isinstance(v, float) for v in labels)
    label_tensor = torch.tensor(labels, dtype=torch.float32 if as_float else torch.long)
    try:
        loss = bcos_loss(logits, label_tensor, n_items)
    except Exception as err:  # noqa: BLE001 - the assertion checks what was raised
        _names(err, "outputs", "labels", "num_items_in_batch")
        return
    assert torch.isfinite(loss) and loss >= 0
    assert batch > 0 and len(labels) == batch and not as_float and classes > 0
