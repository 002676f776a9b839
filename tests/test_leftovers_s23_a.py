"""Closing note 22's "Left" list, part A (session 23, helper-140), each pinned here."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from bcos_plugins.errors import BcosValueError

# ------------------------------------------------------------------ 1. constant_difference


def _rounding_constant_pair() -> tuple[list[float], list[float]]:
    """Scores whose difference is 0.7 on every unit up to float64 rounding, not to the letter."""
    reference = [0.1 * i for i in range(20)]
    shifted = [v + 0.7 for v in reference]
    assert len({b - a for a, b in zip(reference, shifted, strict=True)}) > 1  # not the same to the letter
    return reference, shifted


def test_constant_difference_is_the_test_paired_bootstrap_difference_refuses_with():
    from bcos_plugins.metrics.paired import constant_difference, paired_bootstrap_difference

    reference, shifted = _rounding_constant_pair()
    assert constant_difference(reference, shifted) == pytest.approx(0.7, abs=1e-15)
    with pytest.raises(BcosValueError, match=r"^values_b: minus values_a is 0\.7 on every one of the 20 units"):
        paired_bootstrap_difference(reference, shifted)
    spread = list(shifted)
    spread[3] += 1e-9  # any spread beyond rounding: no constant, and the bootstrap gives its interval
    assert constant_difference(reference, spread) is None
    r = paired_bootstrap_difference(reference, spread)
    assert r.ci_low < r.difference < r.ci_high
    assert constant_difference([2.0], [3.5]) == 1.5  # one unit is constant (the bootstrap refuses it too)
    assert constant_difference(torch.tensor([1, 2, 3]), torch.tensor([3, 4, 5])) == 2.0  # integer scores
    with pytest.raises(BcosValueError, match=r"^values_a: is empty"):
        constant_difference([], [])
    with pytest.raises(BcosValueError, match=r"^values_b: "):
        constant_difference([1.0, 2.0], [1.0, 2.0, 3.0])


def test_bench_frontier_reports_a_difference_constant_up_to_rounding_without_an_interval():
    """bench_frontier caught the bootstrap's refusal and re-derived "constant" exactly (a set of the differences): a
    difference the same only up to rounding, which the library refuses, was re-raised and stopped the table."""
    from benchmarks import bench_frontier

    reference, shifted = _rounding_constant_pair()
    cell = lambda method, values: {"methods": {method: {"comp": values}}}  # noqa: E731
    pairs = [(cell("LIME", reference[:10]), cell("B-cos", shifted[:10])),
             (cell("LIME", reference[10:]), cell("B-cos", shifted[10:]))]
    columns = bench_frontier._metric_columns(pairs, "comp", "LIME", SimpleNamespace(bootstrap=200))
    assert columns["comp_diff"] == pytest.approx(0.7, abs=1e-15) and columns["comp_units"] == 20
    assert math.isnan(columns["comp_low"]) and math.isnan(columns["comp_high"])
    assert bench_frontier._interval(columns, "comp") == "+0.7 [no interval]"


def test_paired_accuracy_difference_refuses_seeds_whose_differences_are_equal_but_rounded_apart():
    """Found by test_metrics_paired's property test: 1 - 18/19 and 18/19 - 17/19 are one example each, but differ in
    float64, so the exact comparison of the accuracies' differences let the t-interval over seeds through with a
    width of 1e-16 (a certainty about training noise that two equal differences cannot give)."""
    from bcos_plugins.metrics.paired import paired_accuracy_difference

    labels = [0] * 18 + [1]
    a = [[0] * 19, [0] * 17 + [1, 0]]  # 18 and 17 of 19 right
    b = [[0] * 18 + [1], [0] * 19]  # 19 and 18 of 19 right: one example more on each seed
    for x, y in ((a, b), (b, a)):
        with pytest.raises(BcosValueError, match=r"^predictions_b: differ from predictions_a by [+-]0\.0526316 on "
                                                 r"each of the 2 seeds, which leaves no spread over seeds"):
            paired_accuracy_difference(x, y, labels)


# ------------------------------------------------------------------ 2. require_bool's twins folded into it


def test_the_folded_boolean_checks_name_the_argument_the_problem_and_the_fix():
    """pixel_ranking's most_important_first and bcosify's verbose had hand-written checks no test reached; they are
    require_bool now, as are the other twins (tests asserting their texts: test_trust_pass21_methods, test_query_key,
    test_fused_layers, test_layer_op_count, test_triton_linear, test_leftovers_s22, test_trust_pass20_convert).
    NumPy's bool_ stays refused, as every twin refused it (isinstance(value, bool)): one rule for every flag."""
    import numpy as np
    from conftest import tiny_model

    from bcos_plugins import bcosify
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.metrics.image import pixel_ranking

    maps = torch.rand(1, 2, 2)
    for flag in ("no", 1, None, np.bool_(True)):
        with pytest.raises(BcosTypeError, match=rf"^most_important_first: must be True or False, got "
                                                rf"{'numpy.bool' if isinstance(flag, np.bool_) else type(flag).__name__}"
                                                r" .*\. Pass True \(most important pixels first\) "
                                                r"or False \(least important first\)\.$"):
            pixel_ranking(maps, most_important_first=flag)
    assert pixel_ranking(maps, most_important_first=False).tolist() == pixel_ranking(-maps).tolist()
    with pytest.raises(BcosTypeError, match=r"^verbose: must be True or False, got str 'no'\. Pass verbose=True \(the "
                                            r"default\) to log the conversion summary, or False\.$"):
        bcosify(tiny_model("BertModel"), verbose="no")


def test_require_bool_or_none_takes_none_and_names_it_in_the_problem():
    from bcos_plugins._checks import require_bool
    from bcos_plugins.errors import BcosTypeError

    assert require_bool("flag", None, or_none=True) is None and require_bool("flag", False, or_none=True) is False
    with pytest.raises(BcosTypeError, match=r"^flag: must be True or False, got NoneType None\. Pass flag=True or "
                                            r"flag=False"):
        require_bool("flag", None)
    with pytest.raises(BcosTypeError, match=r"^flag: must be True, False or None, got int 0\. Say which\.$"):
        require_bool("flag", 0, or_none=True, fix="Say which")


# ------------------------------------------------------------------ 4. check_n is require_int(minimum=0)


def test_check_n_is_require_int_and_takes_a_zero_d_integer_tensor_as_require_int_does():
    """check_n re-implemented require_int(minimum=0); through it, a 0-d integer tensor (a count computed with torch) is
    taken as every other int argument takes it (check_n refused it as "not an int"); a float tensor stays refused."""
    from bcos_plugins.data import check_n, load_sst2
    from bcos_plugins.errors import BcosTypeError

    got = check_n(torch.tensor(3))
    assert got == 3 and type(got) is int
    assert check_n(None) is None and check_n(0) == 0
    assert len(load_sst2("train", n=torch.tensor(2)).texts) == 2
    with pytest.raises(BcosTypeError, match=r"^n: must be an int, got Tensor .*\. Pass the number of rows to keep, an "
                                            r"int >= 0 \(None keeps all\)\.$"):
        check_n(torch.tensor(3.0))
    with pytest.raises(BcosValueError, match=r"^n: must be >= 0, got -2\. Pass the number of rows to keep"):
        check_n(torch.tensor(-2))


# ------------------------------------------------------------------ 5. the image metrics' copies of perturbation's checks


@pytest.mark.parametrize("fractions", [{0.0: 1.0, 0.5: 2.0}, {0.0, 0.5}, torch.tensor(0.5), "0.0 0.5"])
def test_pixel_perturbation_refuses_fractions_that_are_not_an_ordered_sequence(fractions):
    """pixel_perturbation had a weaker copy of perturbation's fraction check: a dict's keys (or a set's values, in no
    promised order) were taken as the fractions. It calls check_fractions now."""
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.metrics.image import pixel_perturbation

    def forward(x):
        return torch.stack([x.sum(dim=(1, 2, 3)), torch.zeros(x.shape[0])], dim=1)

    x = torch.ones(2, 1, 2, 2)
    with pytest.raises(BcosTypeError, match=r"^fractions: must be a sequence of floats, got .*\. Pass e\.g\. "
                                            r"IMAGE_FRACTIONS\.$"):
        pixel_perturbation(forward, x, torch.rand(2, 2, 2), target=0, fractions=fractions)
    with pytest.raises(BcosValueError, match=r"^fractions: is empty\. Pass e\.g\. IMAGE_FRACTIONS\.$"):
        pixel_perturbation(forward, x, torch.rand(2, 2, 2), target=0, fractions=[])
    # an ordered sequence of the same values is taken, whatever its container
    maps = torch.rand(2, 2, 2)
    by_tuple = pixel_perturbation(forward, x, maps, target=0, fractions=(0.0, 0.5))
    by_tensor = pixel_perturbation(forward, x, maps, target=0, fractions=torch.tensor([0.0, 0.5]))
    assert torch.equal(by_tuple.most_first, by_tensor.most_first) and by_tuple.fractions == (0.0, 0.5)


def test_pixel_perturbation_ranks_as_pixel_ranking_and_refuses_a_target_unlike_the_explanations():
    """pixel_perturbation checks its maps and seed once and ranks with pixel_ranking's body (it re-checked both on
    each of its two pixel_ranking calls); the curves are pixel_ranking's order, ties broken by the same seed. The
    target check is perturbation_curves' (one function)."""
    from types import SimpleNamespace

    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.metrics.image import pixel_perturbation, pixel_ranking

    weights = torch.arange(16.0).reshape(1, 1, 4, 4)

    def forward(x):
        return torch.stack([(x * weights).sum(dim=(1, 2, 3)), torch.zeros(x.shape[0])], dim=1)

    x = torch.ones(1, 1, 4, 4)
    maps = torch.tensor([[[1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 0.0], [1.0, 0.0, 0.0, 3.0], [0.0, 1.0, 1.0, 1.0]]])
    fractions = tuple(i / 16 for i in range(17))
    for seed in (0, 3):
        got = pixel_perturbation(forward, x, maps, target=0, fractions=fractions, score="logit", seed=seed)
        for most_first, curve in ((True, got.most_first), (False, got.least_first)):
            order = pixel_ranking(maps, most_important_first=most_first, seed=seed)[0]
            removed = weights.flatten()[order].cumsum(0)
            expected = torch.cat([torch.zeros(1), removed]).neg() + weights.sum()
            torch.testing.assert_close(curve[0], expected)
    with pytest.raises(BcosTypeError, match=r"^seed: must be an int, got float 0\.5"):
        pixel_perturbation(forward, x, maps, target=0, seed=0.5)
    explanation = SimpleNamespace(contributions=maps, target=torch.tensor([1]))
    with pytest.raises(BcosValueError, match=r"^target: is \[0\] at row \[0\], but the explanation explains \[1\] "
                                             r"there: the curves would score attributions of one class on another's "
                                             r"confidence\. Pass target=explanation\.target, or explain the class you "
                                             r"score\.$"):
        pixel_perturbation(forward, x, explanation, target=0)
    # the explanation's own class is taken, and scored as the maps alone are
    by_explanation = pixel_perturbation(forward, x, explanation, target=1, fractions=fractions, score="logit")
    by_maps = pixel_perturbation(forward, x, maps, target=1, fractions=fractions, score="logit")
    assert torch.equal(by_explanation.most_first, by_maps.most_first)


# ------------------------------------------------------------------ 6. require_tensor reads a list of floats once


def test_require_tensor_reads_a_list_of_python_floats_once_at_float64_and_the_same_values(monkeypatch):
    """A list of Python floats was converted twice, at torch's float32 and then again at float64: once now, with the
    same tensor; a complex entry is still read as complex and refused (a float64 reading would drop its imaginary
    part), and lists that are not all Python floats take the general reading as before."""
    import numpy as np

    from bcos_plugins._checks import require_tensor
    from bcos_plugins.errors import BcosTypeError

    calls = []
    as_tensor = torch.as_tensor
    monkeypatch.setattr(torch, "as_tensor", lambda *a, **k: calls.append(k.get("dtype")) or as_tensor(*a, **k))
    cases = [[0.1, 0.2, 1e-9], (0.1, 1 / 3), [[0.1, 0.2], [0.3, 0.4]], ([0.5], (0.25,)), 0.1]
    for value in cases:
        calls.clear()
        got = require_tensor("x", value)
        assert calls == [torch.float64], value
        assert got.dtype == torch.float64 and torch.equal(got, as_tensor(value, dtype=torch.float64))
    # not all Python floats: as before (an int list stays int64, a mixed one is float64, np.float64 scalars kept)
    for value, dtype in (([1, 2], torch.int64), ([0, 0.5], torch.float64), ([True, 0.5], torch.float64),
                         ([np.float64(0.1), 0.2], torch.float64), ([], torch.float32)):
        got = require_tensor("x", value)
        assert got.dtype == dtype and torch.equal(got, as_tensor(value, dtype=dtype)), value
    with pytest.raises(BcosTypeError, match=r"^x: must be a real tensor, got dtype torch\.complex128"):
        require_tensor("x", [1.0, np.complex128(1 + 1j)])
    with pytest.raises(BcosTypeError, match=r"^x: must be a real tensor, got dtype torch\.complex64"):
        require_tensor("x", [1.0, 2j])
    with pytest.raises(BcosTypeError, match=r"^x: must be a tensor"):
        require_tensor("x", [1.0, None])


# ------------------------------------------------------------------ 7. bcos_product checks b once per call


def _bcos_product_paths():
    """(name, call) for each path of bcos_product: a call of it on fresh tensors with pressure ``b``."""
    from bcos_plugins.nn.functional import bcos_product, input_norm, reference_path

    def call(explaining: bool, grad: bool, reference: bool = False, constant=None):
        def run(b):
            x = torch.randn(2, 4, requires_grad=grad)
            lin = x @ torch.randn(4, 6)
            with reference_path(reference):
                return bcos_product(lin, input_norm(x), b, explaining, constant_units=constant)
        return run

    return {"inference": call(True, False), "explaining": call(True, True),
            "explaining_constant_units": call(True, True, constant=slice(0, 2)), "training": call(False, True),
            "reference_explaining": call(True, True, reference=True), "reference": call(False, True, reference=True)}


@pytest.mark.parametrize("path", list(_bcos_product_paths()))
def test_bcos_product_checks_b_once_on_every_path_and_still_refuses_a_bad_b(path, monkeypatch):
    """bcos_product checked b, then called bcos_scale / explaining_scale, which checked it again: once now, on each
    path (the functions that compute dyn check it where they do; the other paths in bcos_product)."""
    import bcos_plugins.nn.functional as F
    from bcos_plugins.errors import BcosTypeError

    run = _bcos_product_paths()[path]
    torch.manual_seed(0)
    expected = run(1.5)
    checks = []
    check = F._require_pressure
    monkeypatch.setattr(F, "_require_pressure", lambda b: checks.append(b) or check(b))
    torch.manual_seed(0)
    got = run(1.5)
    assert checks == [1.5]
    assert torch.equal(got, expected)
    for bad, kind in ((0.5, BcosValueError), (float("nan"), BcosValueError), ("2", BcosTypeError)):
        with pytest.raises(kind, match=r"^b: must be a "):
            run(bad)
