"""The method of benchmarks/bench_core.py's speed table (benchmarks/common/paired_timing.py), on a fake clock whose
answer is known: every callable once per round in a fresh seeded order, ratios as medians of per-round ratios."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import bench_core
from benchmarks.common import paired_timing


class FakeClock:
    """perf_counter / thread_time that move only when a fake workload says so (wall twice the CPU time)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def spend(self, seconds: float) -> None:
        self.wall += 2 * seconds
        self.cpu += seconds


@pytest.fixture
def clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(paired_timing, "time", SimpleNamespace(perf_counter=lambda: clock.wall,
                                                               thread_time=lambda: clock.cpu))
    return clock


def test_every_round_runs_each_callable_once_in_a_fresh_seeded_order_after_an_untimed_warm_up(clock):
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    timed = paired_timing.paired_rounds(runs, rounds=40, seed=3, warm_up=2)
    assert sorted(calls[:8]) == sorted("abcd" * 2)  # the warm-up: each twice, untimed
    rounds = [calls[8 + 4 * i: 12 + 4 * i] for i in range(40)]
    assert rounds == timed.orders and all(sorted(r) == list("abcd") for r in rounds)
    assert len({tuple(r) for r in rounds}) > 10  # not one fixed order: the order is drawn afresh per round
    # each callable comes first in some rounds and last in others (no callable always follows the same one)
    assert {r[0] for r in rounds} == set("abcd") and {r[-1] for r in rounds} == set("abcd")
    assert all(len(timed.seconds[n]["cpu"]) == 40 for n in "abcd")
    again = []
    paired_timing.paired_rounds({n: (lambda n=n: again.append(n)) for n in "abcd"}, rounds=40, seed=3, warm_up=2)
    assert again == calls  # seeded: the same orders again


def test_a_pair_with_a_known_cost_ratio_gives_that_ratio_under_load_that_changes_between_rounds(clock):
    # the machine's load changes from round to round (a factor on both calls of the round); within a round the
    # slow callable costs 1.2x the fast one: every paired ratio is 1.2, so the median and both quartiles are
    loads = [1.0, 1.0, 3.0, 3.0, 3.0, 8.0, 8.0, 1.0, 2.0, 5.0, 0.5, 2.0]
    calls = [0]

    def costing(factor):
        def run():
            clock.spend(factor * loads[calls[0] // 2])  # two calls per round, the warm-up's included
            calls[0] += 1
        return run

    timed = paired_timing.paired_rounds({"fast": costing(1.0), "slow": costing(1.2)}, rounds=len(loads) - 1)
    cpu, wall = timed.ratio("slow", "fast", "cpu"), timed.ratio("slow", "fast", "wall")
    assert (cpu.median, cpu.q1, cpu.q3, cpu.rounds) == pytest.approx((1.2, 1.2, 1.2, 11))
    assert wall.median == pytest.approx(1.2)
    assert timed.ratio("fast", "slow", "cpu").median == pytest.approx(1 / 1.2)
    # the median load of the timed rounds is 3 (the warm-up round, load 1, left out: it would give 2)
    assert (timed.median("fast", "cpu"), timed.median("fast", "wall")) == pytest.approx((3.0, 6.0))


def test_the_spread_is_the_interquartile_range_of_the_per_round_ratios(clock):
    costs = {"a": iter([1.0] + [1.0] * 5), "b": iter([1.0] + [1.0, 2.0, 3.0, 4.0, 5.0])}
    timed = paired_timing.paired_rounds({k: (lambda k=k: clock.spend(next(costs[k]))) for k in costs}, rounds=5)
    spread = timed.ratio("b", "a", "cpu")
    assert (spread.median, spread.q1, spread.q3, spread.rounds) == (3.0, 2.0, 4.0, 5)
    assert spread.cell() == "3.00 [2.00, 4.00]"
    single = paired_timing.paired_rounds({"a": lambda: clock.spend(2.0), "b": lambda: clock.spend(3.0)},
                                         rounds=1, warm_up=0).ratio("b", "a", "cpu")
    assert (single.median, single.q1, single.q3) == (1.5, 1.5, 1.5)


def test_a_ratio_of_a_callable_that_was_not_timed_or_a_bad_clock_is_refused(clock):
    timed = paired_timing.paired_rounds({"a": lambda: clock.spend(1.0)}, rounds=2)
    with pytest.raises(KeyError, match="'b': not a timed callable"):
        timed.ratio("b", "a", "cpu")
    with pytest.raises(ValueError, match="clock='process'"):
        timed.ratio("a", "a", "process")
    with pytest.raises(ValueError, match="rounds=0"):
        paired_timing.paired_rounds({"a": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="runs: empty"):
        paired_timing.paired_rounds({}, rounds=3)


def test_bench_core_prints_the_thread_cpu_then_the_wall_ratio_with_their_quartiles(clock):
    costs = {"x": iter([1.0] * 4), "y": iter([1.0, 1.0, 1.5, 2.0])}
    timed = paired_timing.paired_rounds({k: (lambda k=k: clock.spend(next(costs[k]))) for k in costs}, rounds=3)
    assert bench_core._ratio_cells(timed, "y", "x") == "1.50 [1.25, 1.75] | 1.50 [1.25, 1.75]"


def test_bench_core_times_the_forwards_in_rounds_of_their_own_before_any_explanation(clock):
    # an explanation leaves the allocator a heap that spares every later forward its page faults: interleaved, the
    # forward ratio read 0.03-0.04 lower than a forward-only process measures it
    calls = []

    def costing(name, seconds):
        def run():
            calls.append(name)
            clock.spend(seconds)
        return run

    timed = bench_core._forwards_then_explanations(
        {"fwd_conv": costing("fwd_conv", 2.0), "fwd_conv_again": costing("fwd_conv_again", 2.0),
         "fwd_bcos": costing("fwd_bcos", 2.3)},
        {"ixg": costing("ixg", 4.0), "bcos": costing("bcos", 4.2)}, rounds=5, seed=0)
    forwards = {"fwd_conv", "fwd_conv_again", "fwd_bcos"}
    assert set(calls[:3 * 6]) == forwards and set(calls[3 * 6:]) == {"ixg", "bcos"}  # warm-up and 5 rounds each
    assert timed.ratio("fwd_bcos", "fwd_conv", "cpu").median == pytest.approx(1.15)
    assert timed.ratio("fwd_conv_again", "fwd_conv", "cpu").median == pytest.approx(1.0)
    assert timed.ratio("bcos", "ixg", "wall").median == pytest.approx(1.05)


def test_synchronize_runs_before_each_timed_call_starts_its_clocks_and_before_they_stop(monkeypatch):
    # a GPU call returns once its kernels are queued: without a synchronisation after it, its time would be the
    # launch's, and the next call's would carry its kernels
    events = []
    monkeypatch.setattr(paired_timing, "time", SimpleNamespace(perf_counter=lambda: events.append("wall") or len(events),
                                                               thread_time=lambda: events.append("cpu") or len(events)))
    paired_timing.paired_rounds({"a": lambda: events.append("a")}, rounds=2, warm_up=1,
                                synchronize=lambda: events.append("sync"))
    assert events == ["a"] + ["sync", "wall", "cpu", "a", "sync", "wall", "cpu"] * 2  # the warm-up unsynchronised
    with pytest.raises(TypeError, match="synchronize=1: not callable"):
        paired_timing.paired_rounds({"a": lambda: None}, rounds=1, synchronize=1)
