"""Every public entry point, driven with generated invalid and edge inputs: the package's error naming the
argument, or a finite correct result (complete where completeness is promised).

One section per area; each section owns its strategies and helpers.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import VOCAB, padded_batch, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import Direction
from bcos_plugins.errors import BcosError

# EDGE_EXAMPLES=500 make test (or pytest) for a deeper search than CI's default
EDGE = settings(max_examples=int(os.environ.get("EDGE_EXAMPLES", 25)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

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
    # BERT's classifier reads the first column, a padding token's on a left-padded row: that batch is refused
    assert not (side == "left" and name == "BertForSequenceClassification"), "left padding was not refused"
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
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import event  # noqa: E402
from hypothesis.control import currently_in_test_context  # noqa: E402

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

SUB = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
SUB_MODEL = settings(SUB, max_examples=15)  # each example runs a model forward (and backward)


def _names(err: Exception, *args: str) -> None:
    """The package's error, naming one of ``args`` in the ``"<argument>: ..."`` pattern."""
    assert isinstance(err, BcosError), f"{type(err).__name__} is not the package's error: {err}"
    if currently_in_test_context():
        event("refused")
    assert any(f"{a}:" in str(err) for a in args), f"error names none of {args}: {err}"


@st.composite
def _tensor(draw, max_batch=3, max_len=6, ndim=2, kinds=("float", "int", "bool", "mask"), shape=None):
    """Tensors of small shapes (zero sizes now and then), mostly of the first dtype kind, with NaN / inf / zero
    injections now and then: each test sees valid, edge and invalid values in comparable numbers."""
    def size(limit):
        return 0 if limit < 1 or draw(st.integers(0, 11)) == 0 else draw(st.integers(1, limit))

    if shape is None:
        shape = tuple(size(max_batch if i == 0 else max_len) for i in range(ndim))
    kind = kinds[0] if draw(st.integers(0, 9)) < 8 else draw(st.sampled_from(kinds))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if kind == "float":
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        special = draw(st.sampled_from(["none"] * 8 + ["nan", "inf", "zero", "zeros"]))
        if t.numel() and special == "zeros":
            t.zero_()
        elif t.numel() and special != "none":
            t.view(-1)[draw(st.integers(0, t.numel() - 1))] = {"nan": math.nan, "inf": math.inf, "zero": 0.0}[special]
        return t
    if kind == "int":
        return torch.randint(-1, 4, shape, generator=g)
    if kind == "bool":
        return torch.rand(shape, generator=g) < 0.5
    return (torch.rand(shape, generator=g) < 0.5).to(torch.float32)


def _mostly(valid, invalid):
    """``valid`` three times in four (``one_of`` would merge repeated branches)."""
    return st.integers(0, 3).flatmap(lambda i: valid if i < 3 else invalid)


@st.composite
def _like(draw, reference, kinds=("mask", "bool")):
    """A 0/1 mask shaped like ``reference`` three times in four, any tensor otherwise."""
    if draw(st.integers(0, 3)) < 3:
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        mask = torch.rand(reference.shape, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
        return mask if draw(st.sampled_from(kinds)) == "bool" else mask.float()
    return draw(_tensor(max_batch=max(reference.shape[0], 1) if reference.ndim else 3,
                        kinds=("float", "int", "mask")))


_k = _mostly(st.none() | st.integers(1, 6) | st.floats(0.05, 1.0),
             st.integers(-2, 8) | st.floats(-0.5, 1.5) | st.just(math.nan) | st.booleans() | st.just("3"))


# --- metrics: rationale alignment ------------------------------------------------------------------------------

@SUB
@given(scores=_tensor(kinds=("float", "int", "bool")), k=_k, data=st.data())
def test_rationale_alignment_any_input(scores, k, data):
    gold = data.draw(_like(scores))
    valid = data.draw(st.none() | _like(scores))
    try:
        result = M.rationale_alignment(scores, gold, valid, k=k)
    except BcosError as err:
        _names(err, "scores", "gold_mask", "valid_mask", "k")
        return
    event("answered")
    valid_b = torch.ones_like(gold, dtype=torch.bool) if valid is None else valid.bool()
    has_gold = (gold.bool() & valid_b).any(1)
    # rows whose valid scores are all equal have no ranking: top_k_iou leaves them out unless k takes every valid token
    wide = scores.double()
    tied = wide.masked_fill(~valid_b, math.inf).amin(1) == wide.masked_fill(~valid_b, -math.inf).amax(1)
    n_gold, n_valid = (gold.bool() & valid_b).sum(1), valid_b.sum(1)
    iou_nan = result.iou_per_row.isnan()
    assert torch.equal(result.auprc_per_row.isnan(), ~has_gold)  # NaN exactly where a row has no rationale (documented)
    assert torch.equal(iou_nan & ~tied, ~has_gold & ~tied)  # the same for the IoU of rows with a ranking
    assert iou_nan[~has_gold].all()
    if k is None:  # k = the row's gold tokens: a tied row is left out where they are not all its valid tokens
        assert torch.equal(iou_nan, ~has_gold | (tied & (n_gold < n_valid)))
    for per_row, counted in ((result.iou_per_row, ~iou_nan), (result.auprc_per_row, has_gold)):
        ok = per_row[counted]
        assert ((ok >= 0) & (ok <= 1 + 1e-6)).all()
    assert result.n_rows == int(has_gold.sum())
    assert result.n_iou_rows == int((~iou_nan).sum())
    # a ranking that puts the rationale first is perfect
    if has_gold.all() and k is None:
        perfect = M.rationale_alignment(gold.double() + 0.01 * torch.rand(gold.shape, dtype=torch.float64),
                                        gold, valid)
        assert perfect.iou == pytest.approx(1.0) and perfect.auprc == pytest.approx(1.0)


# --- metrics: token scores, entropy, completeness --------------------------------------------------------------

@SUB
@given(attributions=_tensor(ndim=3, max_len=4) | _tensor(), reduce=_mostly(st.sampled_from(["sum", "mean", "l2"]),
       st.sampled_from(["max", None])), data=st.data())
def test_entropy_any_input(attributions, reduce, data):
    mask = data.draw(st.none() | _like(attributions.sum(-1) if attributions.ndim == 3 else attributions))
    try:
        entropy = M.explanation_entropy(attributions, mask, reduce=reduce)
    except BcosError as err:
        _names(err, "attributions", "attention_mask", "reduce")
        return
    event("answered")
    n_tokens = attributions.shape[1]
    assert torch.isfinite(entropy).all() and (entropy >= -1e-9).all()
    assert (entropy <= math.log(n_tokens) + 1e-6).all()


@SUB
@given(attributions=_tensor(ndim=3, max_len=4, kinds=("float", "int")), relative=st.booleans(), data=st.data())
def test_completeness_error_any_input_and_zero_explained_values(attributions, relative, data):
    same = attributions.double().flatten(1).sum(1) + data.draw(st.sampled_from([0.0, 1e-7, 0.5]))
    explained = data.draw(_mostly(st.just(same) | st.just(torch.zeros(attributions.shape[0])), _tensor(ndim=1)))
    try:
        err = M.completeness_error(attributions, explained, relative=relative)
    except BcosError as error:
        _names(error, "attributions", "explained")
        return
    event("answered")
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
@given(scores=_mostly(_tensor(shape=(3, 9)), _tensor(max_len=9)),
       fractions=_mostly(st.lists(st.floats(0.05, 1.0), min_size=1, max_size=4),
                         st.lists(st.floats(-0.5, 1.5) | st.just(math.nan), max_size=4) | st.just("0.5")),
       target=_mostly(st.none() | st.integers(0, 2), st.integers(-1, 4) | st.floats(0, 2)),
       batch_size=_mostly(st.integers(1, 7), st.integers(-1, 0) | st.just(2.0)))
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
    event("answered")
    for curve in (curves.comprehensiveness, curves.sufficiency):
        assert torch.isfinite(curve).all() and (curve.abs() <= 1).all()
    perturbable = mask.bool() & ~special
    assert (curves.k >= 1).all() and (curves.k <= perturbable.sum(1, keepdim=True)).all()


@SUB
@given(curve=_tensor(ndim=1, max_len=5, kinds=("float", "int")), data=st.data())
def test_aopc_any_input(curve, data):
    n = curve.shape[0]
    increasing = st.lists(st.floats(0, 1), min_size=n, max_size=n, unique=True).map(sorted)
    fractions = data.draw(_mostly(increasing, st.lists(st.floats(-1, 2) | st.sampled_from([math.nan, math.inf]),
                                                       max_size=5)))
    try:
        area = M.aopc(curve, fractions)
    except BcosError as err:
        _names(err, "curve", "fractions")
        return
    event("answered")
    assert math.isfinite(float(area))
    assert float(area) == pytest.approx(float(np.trapezoid(curve.double().numpy(), np.asarray(fractions))))


@SUB
@given(maps=_mostly(st.integers(1, 3).flatmap(lambda b: _tensor(shape=(b, 4, 4))), _tensor(ndim=2)),
       cell=_mostly(st.integers(0, 3), st.integers(-1, 5) | st.floats(0, 3) | st.just(torch.tensor([0, 1, 2]))),
       grid=_mostly(st.sampled_from([(2, 2), (1, 4), [4, 1]]), st.sampled_from([(0, 2), (2, 2.0), "2x2", (3, 3)])))
def test_grid_pointing_game_any_input(maps, cell, grid):
    try:
        score = M.grid_pointing_game(maps, cell, grid=grid)
    except BcosError as err:
        _names(err, "attributions", "cell", "grid")
        return
    event("answered")
    assert torch.isfinite(score).all() and ((score >= 0) & (score <= 1 + 1e-9)).all()


@SUB_MODEL
@given(maps=_mostly(st.integers(1, 3).flatmap(lambda b: _tensor(shape=(b, 4, 4))), _tensor(ndim=3, max_len=4)),
       target=_mostly(st.integers(0, 1), st.integers(-1, 3) | st.floats(0, 1)),
       removed=_mostly(st.floats(-1, 1), st.floats(allow_nan=True, allow_infinity=True)),
       score=_mostly(st.sampled_from(["softmax", "logit", "sigmoid"]), st.just("p")))
def test_pixel_perturbation_any_input(maps, target, removed, score):
    images = torch.rand(maps.shape[0], 1, 4, 4, dtype=torch.float64)
    weights = torch.arange(16, dtype=torch.float64).reshape(1, 1, 4, 4)

    def forward(x):
        first = (x * weights).flatten(1).sum(1)
        return torch.stack([first, -first], dim=1)

    try:
        result = M.pixel_perturbation(forward, images, maps, target, removed_value=removed, score=score)
    except BcosError as err:
        _names(err, "inputs", "attributions", "target", "removed_value", "score", "forward")
        return
    event("answered")
    assert torch.isfinite(result.most_first).all() and torch.isfinite(result.area_between).all()
    assert maps.shape[1:] == (4, 4) and 0 <= target < 2


# --- metrics: decoders ----------------------------------------------------------------------------------------

@SUB
@given(scores=_tensor(), data=st.data())
def test_mean_reciprocal_rank_any_input(scores, data):
    evidence = data.draw(_like(scores))
    candidates = data.draw(_mostly(st.none() | st.just(torch.ones(scores.shape, dtype=torch.bool)), _like(scores)))
    try:
        result = M.mean_reciprocal_rank(scores, evidence, candidates)
    except BcosError as err:
        _names(err, "scores", "evidence", "candidates")
        return
    event("answered")
    ranked = result.reciprocal_ranks[~result.reciprocal_ranks.isnan()]
    assert ranked.numel() == result.n and ((ranked > 0) & (ranked <= 1)).all()
    assert 0 < result.mrr <= 1 and 0 < result.random <= 1


@SUB
@given(n=_mostly(st.integers(1, 6), st.integers(-1, 0) | st.floats(0, 6) | st.booleans()),
       k=_mostly(st.integers(1, 6), st.integers(-1, 0) | st.floats(0, 6)))
def test_expected_random_reciprocal_rank_any_input(n, k):
    try:
        value = M.expected_random_reciprocal_rank(n, k)
    except BcosError as err:
        _names(err, "n_candidates", "n_evidence")
        return
    event("answered")
    # brute force over every placement of the k evidence tokens among n
    from itertools import combinations

    places = list(combinations(range(1, n + 1), k))
    assert value == pytest.approx(sum(1 / min(p) for p in places) / len(places))


@SUB
@given(logits=_tensor(max_len=4), data=st.data())
def test_probability_gap_any_input(logits, data):
    ids = st.lists(st.integers(0, 3), min_size=logits.shape[0], max_size=logits.shape[0]).map(torch.tensor)
    target = data.draw(_mostly(ids, _tensor(ndim=1, kinds=("int", "float"))))
    foil = data.draw(_mostly(ids, _tensor(ndim=1, kinds=("int",))))
    try:
        gap = M.probability_gap(logits, target, foil)
    except BcosError as err:
        _names(err, "logits", "target", "foil")
        return
    event("answered")
    assert torch.isfinite(gap).all() and (gap.abs() <= 1).all()


# --- bilinear: weights-based analysis -------------------------------------------------------------------------

_BILINEAR = BilinearMLP(4, 6, 3).double()


@SUB
@given(u=_mostly(_tensor(shape=(3,))
                 | st.integers(1, 4).flatmap(lambda n: _tensor(shape=(n, 3))),
                 _tensor(ndim=1, max_len=4) | _tensor(max_batch=3, max_len=4)),
       chunk=_mostly(st.integers(1, 3), st.integers(-1, 0) | st.floats(0, 3)))
def test_interaction_matrix_any_direction(u, chunk):
    try:
        q = interaction_matrix(_BILINEAR, u, chunk_size=chunk)
    except BcosError as err:
        _names(err, "u", "chunk_size")
        return
    event("answered")
    x = torch.randn(5, 4, dtype=torch.float64)
    with torch.no_grad():
        out = _BILINEAR(x)
    directions = u.double().reshape(-1, 3)
    quadratic = torch.einsum("bi,nij,bj->bn", x, q.reshape(-1, 4, 4), x)
    torch.testing.assert_close(quadratic, out @ directions.T)  # x^T Q(u) x = u . out(x), exactly


@SUB
@given(values=_tensor(max_len=5, kinds=("float", "int")), k=_mostly(st.integers(0, 1), st.integers(-1, 6)
       | st.booleans() | st.floats(0, 2)), by=_mostly(st.sampled_from(["magnitude", "positive", "negative"]),
                                                     st.just("abs")))
def test_eigen_helpers_any_input(values, k, by):
    try:
        index = top_eigen_indices(values, k, by)
        sparsity = l1_l2_sparsity(values)
    except BcosError as err:
        _names(err, "eigenvalues", "values", "k", "by")
        return
    event("answered")
    assert index.shape == (*values.shape[:-1], k)
    assert torch.isfinite(sparsity).all() and (sparsity <= values.shape[-1] + 1e-9).all()


@SUB
@given(rank=_mostly(st.none() | st.integers(1, 4), st.integers(-1, 0) | st.booleans()),
       rtol=_mostly(st.floats(0, 1), st.floats(-1, 2) | st.just(math.nan)),
       per=_mostly(st.just(1), st.integers(-1, 5)),
       ks=_mostly(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.lists(st.integers(-1, 5), max_size=3)
                  | st.just([1.5])),
       labels=_mostly(st.lists(st.integers(0, 2), min_size=1, max_size=6).map(torch.tensor),
                      _tensor(ndim=1, max_len=6, kinds=("int", "float"))))
def test_hosvd_masks_and_truncation_any_input(rank, rtol, per, ks, labels):
    eig = eigendecompose(_BILINEAR, torch.eye(3, dtype=torch.float64))
    try:
        decomposition = hosvd(_BILINEAR, rank=rank, rtol=rtol)
        masks = adversarial_masks(eig, per)
        curve = truncation_curve(_BILINEAR, torch.randn(labels.shape[0], 4, dtype=torch.float64), labels, ks)
    except BcosError as err:
        _names(err, "rank", "rtol", "per_direction", "vectors", "ks", "labels", "x")
        return
    event("answered")
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


# --- Space Model ----------------------------------------------------------------------------------------------

_SPACE: dict[str, torch.nn.Module] = {}


def _space_model():
    if "model" not in _SPACE:
        from conftest import tiny_config

        from bcos_plugins.space import SpaceModelForSequenceClassification

        torch.manual_seed(0)
        encoder = __import__("transformers").AutoModel.from_config(tiny_config("bert")).eval()
        _SPACE["model"] = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=3, n_latent=4).eval()
    return _SPACE["model"]


_config_value = _mostly(st.integers(1, 4) | st.floats(0.0, 2.0),
                        st.integers(-2, 0) | st.sampled_from([math.nan, math.inf, -1.0, 2.5, "4", None, True]))


@SUB
@given(num_labels=_mostly(st.integers(2, 4), st.integers(-1, 1)), n_latent=_config_value,
       weight=_config_value, eps=_config_value)
def test_space_config_any_value(num_labels, n_latent, weight, eps):
    from conftest import tiny_config

    from bcos_plugins.space import SpaceModelConfig

    try:
        config = SpaceModelConfig(encoder_config=tiny_config("bert"), num_labels=num_labels, n_latent=n_latent,
                                  inter_space_weight=weight, intra_space_eps=eps)
    except BcosError as err:
        _names(err, "num_labels", "n_latent", "inter_space_weight", "intra_space_eps")
        return
    event("answered")
    assert config.num_labels >= 2 and isinstance(config.n_latent, int) and config.n_latent >= 1
    assert math.isfinite(config.inter_space_weight) and config.intra_space_eps > 0


@SUB_MODEL
@given(batch=_mostly(st.integers(1, 3), st.just(0)), length=_mostly(st.integers(1, 40), st.sampled_from([0, 41])),
       low=_mostly(st.integers(0, VOCAB - 1), st.sampled_from([-1, VOCAB])),
       mask_kind=_mostly(st.sampled_from(["none", "ones", "padded"]), st.sampled_from(["twos", "short", "empty_row"])),
       labels=_mostly(st.none() | st.integers(0, 2), st.sampled_from([3, -1, -100, 0.5, "row"])))
def test_space_forward_any_batch(batch, length, low, mask_kind, labels):
    model = _space_model()
    ids = torch.full((batch, length), low, dtype=torch.long)
    mask = {"none": None, "ones": torch.ones_like(ids), "twos": 2 * torch.ones_like(ids),
            "padded": torch.ones_like(ids).index_fill_(1, torch.tensor([length - 1]), 0) if length > 1
            else torch.ones_like(ids),
            "short": torch.ones(batch, max(length - 1, 0), dtype=torch.long),
            "empty_row": torch.zeros_like(ids)}[mask_kind]
    label_t = None
    if labels is not None:
        label_t = (torch.ones(batch, 1, dtype=torch.long) if labels == "row" else
                   torch.full((batch,), labels, dtype=torch.float32 if isinstance(labels, float) else torch.long))
    try:
        out = model(input_ids=ids, attention_mask=mask, labels=label_t)
    except BcosError as err:
        _names(err, "input_ids", "attention_mask", "labels")
        return
    event("answered")
    assert torch.isfinite(out.logits).all() and out.logits.shape == (batch, 3)
    if label_t is not None:
        assert torch.isfinite(out.loss) and out.loss > 0
    # the logits are the bias plus the exact token shares (DESIGN.md §3)
    shares = model.head.token_contributions(out.concepts, mask).sum(dim=(1, 3, 4))
    torch.testing.assert_close(shares + model.head.classifier.bias, out.logits, rtol=1e-5, atol=1e-5)


# --- guided attention -----------------------------------------------------------------------------------------

@SUB
@given(scores=_tensor(shape=(2, 1, 3, 4)), mask=_mostly(_tensor(shape=(2, 4), kinds=("mask", "bool")),
       _tensor(shape=(2, 4), kinds=("float", "int")) | _tensor(max_len=5)),
       mode=_mostly(st.sampled_from(["multiply", "add", "replace", "log1p"]), st.just("scale")),
       strength=_mostly(st.floats(0, 5), st.sampled_from([-1.0, math.nan, math.inf, "1"])))
def test_guide_scores_any_mask(scores, mask, mode, strength):
    from bcos_plugins.guided import guide_scores

    scores = scores.nan_to_num(0.0, 1.0, -1.0) if scores.is_floating_point() else scores
    try:
        guided = guide_scores(scores, mask, mode, strength)
    except BcosError as err:
        _names(err, "rationale_mask", "mode", "strength", "scores")
        return
    event("answered")
    attention = torch.softmax(guided, dim=-1)
    assert torch.isfinite(attention).all()
    torch.testing.assert_close(attention.sum(-1), torch.ones(2, 1, 3, dtype=attention.dtype))
    if strength == 0 and mode != "replace":
        assert torch.equal(guided, scores)


# --- ViT ------------------------------------------------------------------------------------------------------

@SUB
@given(image_size=_mostly(st.sampled_from([4, 8]), st.sampled_from([0, -4, 6, 8.0])),
       patch_size=_mostly(st.sampled_from([2, 4]), st.sampled_from([0, -2, 3])),
       channels=_mostly(st.integers(1, 3), st.integers(-1, 0)),
       b=_mostly(st.floats(1.0, 3.0), st.sampled_from([0.5, math.inf, math.nan, 1e6])))
def test_vit_config_any_value(image_size, patch_size, channels, b):
    from bcos_plugins.vision import BcosViTConfig

    try:
        config = BcosViTConfig(image_size=image_size, patch_size=patch_size, num_channels=channels, b=b,
                               hidden_size=8, num_attention_heads=2, intermediate_size=8, num_hidden_layers=1)
    except BcosError as err:
        _names(err, "image_size", "patch_size", "num_channels", "b")
        return
    event("answered")
    assert config.grid_size * config.patch_size == config.image_size and 1 <= config.b <= 10


_VIT: dict[str, torch.nn.Module] = {}


def _vit():
    if "model" not in _VIT:
        from bcos_plugins.vision import BcosViT, BcosViTConfig

        torch.manual_seed(0)
        _VIT["model"] = BcosViT(BcosViTConfig(image_size=8, num_channels=1, patch_size=4, hidden_size=8,
                                              num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                                              num_labels=3, conv_channels=[4])).double().eval()
    return _VIT["model"]


@SUB_MODEL
@given(pixels=_mostly(st.integers(1, 3).flatmap(lambda n: _tensor(shape=(n, 1, 8, 8), kinds=("float",))),
                      _tensor(ndim=4, max_len=8, kinds=("float", "int"))),
       shift=_mostly(st.just("unit"), st.sampled_from(["raw", "edges"])),
       target=_mostly(st.none() | st.integers(0, 2), st.integers(-1, 3) | st.just(1.0)))
def test_vit_forward_and_explain_any_image(pixels, shift, target):
    from bcos_plugins.vision import explain_image

    if shift == "unit" and pixels.is_floating_point():
        pixels = torch.sigmoid(pixels)  # NaN / inf injections survive as NaN / 1.0 / 0.0
    elif shift == "edges" and pixels.is_floating_point():
        pixels = (pixels > 0).to(pixels.dtype)
    model = _vit()
    try:
        logits = model(pixel_values=pixels).logits
        explanation = explain_image(model, pixels, target=target)
    except BcosError as err:
        _names(err, "pixel_values", "target")
        return
    event("answered")
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(explanation.total, explanation.explained, rtol=1e-6, atol=1e-8)


# --- decoder training -----------------------------------------------------------------------------------------

@SUB
@given(lengths=_mostly(st.lists(st.integers(2, 5), min_size=1, max_size=3),
                       st.lists(st.integers(0, 3), max_size=3)),
       side=st.sampled_from(["left", "right"]), pad=_mostly(st.integers(0, 5), st.sampled_from([-1, 1.5])),
       max_length=_mostly(st.none() | st.integers(2, 6), st.integers(-1, 1) | st.just(2.5)))
def test_causal_lm_collator_any_features(lengths, side, pad, max_length):
    from bcos_plugins.train_decoder import IGNORE_INDEX, CausalLMCollator

    features = [{"input_ids": list(range(3, 3 + n))} for n in lengths]
    try:
        batch = CausalLMCollator(pad, padding_side=side, max_length=max_length)(features)
    except BcosError as err:
        _names(err, "features", "pad_token_id", "max_length")
        return
    event("answered")
    labelled = batch["labels"] != IGNORE_INDEX
    assert labelled.any()  # the loss is a mean over at least one position: never 0/0
    real = batch["attention_mask"].sum(1)
    assert torch.equal(labelled.sum(1), (real - 1).clamp_min(0))


def test_train_causal_lm_refuses_rows_with_nothing_to_predict(tmp_path):
    from bcos_plugins.train_decoder import train_causal_lm

    model = bcosify(tiny_model("GPT2LMHeadModel"), b=1.1, verbose=False)
    with pytest.raises(BcosValueError, match=r"train_dataset: 2 example\(s\) have fewer than 2 real tokens.*\[0, 2\]"):
        train_causal_lm(model, [{"input_ids": [5]}, {"input_ids": [5, 6]}, {"input_ids": [7]}], str(tmp_path),
                        pad_token_id=0)
    with pytest.raises(BcosValueError, match="train_dataset: is empty"):
        train_causal_lm(model, [], str(tmp_path), pad_token_id=0)
    with pytest.raises(BcosValueError, match="eval_dataset: .*outside the vocabulary"):
        train_causal_lm(model, [{"input_ids": [5, 6]}], str(tmp_path), pad_token_id=0,
                        eval_dataset=[{"input_ids": [5, VOCAB]}])
    with pytest.raises(BcosValueError, match="pad_token_id: must be >= 0"):
        train_causal_lm(model, [{"input_ids": [5, 6]}], str(tmp_path), pad_token_id=-1)


# --- the smaller public helpers: one bad argument each, named -------------------------------------------------

_SST2 = __import__("bcos_plugins.data", fromlist=["SHIPPED_DATA"]).SHIPPED_DATA / "sst2" / "train.tsv"
_RT = _SST2.parent.parent / "rt_polarity"


class _OneWordEncoding(dict):
    """A fast-tokenizer-like encoding: one row holding one token of word 0 in segment 0."""

    def word_ids(self, i):
        return [0]

    def sequence_ids(self, i):
        return [0]


def _words_encoding():
    return _OneWordEncoding(input_ids=[[5]])


def _helper_cases():
    from bcos_plugins.guided import (
        find_span,
        gold_mask_from_words,
        parse_esnli_question,
        random_rationale_mask,
    )
    from bcos_plugins.space import (
        SpaceHead,
        classification_scores,
        masked_mean,
        predict_labels,
        read_rt_polarity,
        read_sst2_tsv,
    )
    from bcos_plugins.vision import BcosPatchEmbedding, BcosViTAttention, attention_rollout
    from bcos_plugins.vision.data import DigitImages, load_digits_split, make_grids, place_digits
    from bcos_plugins.vision.visualize import contribution_map, weight_colour_image

    digits = torch.rand(8, 1, 8, 8)
    head = SpaceHead(4, 2, 3)
    return {
        "rollout patch 0 (was an empty map)": (lambda: attention_rollout([torch.rand(1, 2, 4, 4)], 0), "patch_size"),
        "rollout NaN": (lambda: attention_rollout([torch.full((1, 2, 4, 4), math.nan)], 2), "attentions"),
        "rollout layers disagree": (lambda: attention_rollout([torch.rand(1, 2, 4, 4), torch.rand(1, 2, 9, 9)], 2),
                                    "attentions"),
        "colour image NaN": (lambda: weight_colour_image(torch.full((2, 4, 4), math.nan), torch.rand(4, 4)),
                             "weights"),
        "contribution map NaN (was a NaN map)": (lambda: contribution_map(torch.full((4, 4), math.nan)),
                                                 "contributions"),
        "canvas too small": (lambda: DigitImages(digits, torch.arange(8), size=4), "size"),
        "labels for other digits (were repeated)": (lambda: DigitImages(digits[:2], torch.arange(3)), "labels"),
        "no views (was an empty dataset)": (lambda: DigitImages(digits, torch.arange(8), views=0), "views"),
        "offset off the canvas": (lambda: place_digits(digits[:1], 16, torch.tensor([False]), torch.tensor([[20, 0]])),
                                  "offsets"),
        "no grids": (lambda: make_grids(digits, torch.arange(8), torch.rand(8), 0), "n_grids"),
        "test fraction 1.5": (lambda: load_digits_split(1.5), "test_fraction"),
        "span of None": (lambda: find_span(None, "a"), "text"),
        "question not a str": (lambda: parse_esnli_question(3), "question"),
        "NaN gold mask": (lambda: random_rationale_mask(torch.tensor([[math.nan, 1.0]]), torch.ones(1, 2)),
                          "gold_mask"),
        "empty scores": (lambda: classification_scores([], []), "labels"),
        "one string as texts (was one text per character)": (
            lambda: predict_labels(torch.nn.Identity(), str, "good film"), "texts"),
        "no model (AttributeError)": (lambda: predict_labels(None, None, ["good film"]), "model"),
        "missing SST-2 file": (lambda: read_sst2_tsv(_SST2.parent / "missing.tsv"), "path"),
        "encoding of another type (TypeError)": (lambda: gold_mask_from_words([[1, 2]], [[1.0]]), "encoding"),
        "attention as one tensor (RuntimeError)": (lambda: attention_rollout(torch.rand(1, 2, 4, 4), 2),
                                                   "attentions"),
        "eigendecomposition of another type (AttributeError)": (
            lambda: eigenvector_activations((torch.ones(3), torch.eye(3)), torch.ones(1, 3)), "eig"),
        "tokenizer without special tokens": (lambda: M.special_tokens_mask(None, torch.ones(1, 2, dtype=torch.long)),
                                             "tokenizer"),
        "mask of other values": (lambda: masked_mean(torch.rand(2, 3, 4), torch.ones(2, 4)), "attention_mask"),
        "shares of an empty row (were NaN)": (lambda: head.token_contributions(torch.rand(2, 3, 2, 3),
                                                                               torch.zeros(2, 3)), "attention_mask"),
        "cost of a non-callable": (lambda: M.measure_cost(3), "fn"),
        "no curves": (lambda: M.PerturbationCurves.concatenate([]), "parts"),
        "negative SST-2 limit (was one row)": (lambda: read_sst2_tsv(_SST2, limit=-1), "limit"),
        "negative rt_polarity limit (dropped the last rows)": (lambda: read_rt_polarity(_RT, limit_per_class=-1),
                                                               "limit_per_class"),
        "patch embedding of patch 0": (lambda: BcosPatchEmbedding(2, 0, 8, b=2.0, max_out=2), "patch_size"),
        "attention with 0 heads (was a ZeroDivisionError)": (lambda: BcosViTAttention(8, 0, 4, b=2.0, max_out=2),
                                                             "num_heads"),
        "float SeqPG labels (were truncated)": (lambda: M.make_seqpg_examples(
            torch.nn.Identity(), SimpleNamespace(cls_token_id=1, sep_token_id=2), ["a b"], [0.7]), "labels"),
        "NaN word rationale (was 0)": (lambda: gold_mask_from_words(_words_encoding(), [[math.nan]]),
                                       "word_rationales"),
    }


def test_dataset_readers_take_a_limit_of_zero():
    from bcos_plugins.space import read_rt_polarity, read_sst2_tsv

    assert read_sst2_tsv(_SST2, limit=0) == ([], [])
    assert len(read_sst2_tsv(_SST2, limit=3)[0]) == 3
    texts, labels = read_rt_polarity(_RT, limit_per_class=2)
    assert labels == [0, 0, 1, 1] and len(texts) == 4


@pytest.mark.parametrize("case", list(_helper_cases()))
def test_small_helpers_name_the_bad_argument(case):
    call, argument = _helper_cases()[case]
    with pytest.raises(BcosError) as info:
        call()
    _names(info.value, argument)


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


def test_digit_helpers_take_nested_lists_of_images_as_the_tensor():
    """place_digits, DigitImages and make_grids checked a list of digit images and then went on with the raw list
    (``'list' object has no attribute 'repeat'``); the list is read in torch's default dtype, as the images feed a
    model."""
    from bcos_plugins.vision.data import DigitImages, make_grids, place_digits

    digits = torch.rand(4, 1, 8, 8)
    as_list = digits.tolist()
    flags, offsets = torch.tensor([False, True, False, True]), torch.tensor([[0, 0], [1, 1], [2, 3], [8, 8]])
    placed = place_digits(as_list, 16, flags, offsets)
    assert placed.dtype == torch.get_default_dtype()
    assert torch.equal(placed, place_digits(digits, 16, flags, offsets))
    assert torch.equal(DigitImages(as_list, [0, 1, 2, 3], views=1).pixel_values,
                       DigitImages(digits, [0, 1, 2, 3], views=1).pixel_values)
    labels, confidence = torch.tensor([0, 1, 2, 3]), torch.rand(4)
    assert torch.equal(make_grids(as_list, labels, confidence, 1)[0], make_grids(digits, labels, confidence, 1)[0])
