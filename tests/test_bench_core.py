"""The arithmetic of benchmarks/bench_core.py's speed table, on a fake clock whose answer is known."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import bench_core


class FakeClock:
    """perf_counter / thread_time that move only when a fake workload says so (wall twice the CPU time)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def spend(self, seconds: float) -> None:
        self.wall += 2 * seconds
        self.cpu += seconds


def test_medians_skip_the_warm_up_and_the_ratio_is_numerator_over_denominator(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_core, "time", SimpleNamespace(perf_counter=lambda: clock.wall,
                                                            thread_time=lambda: clock.cpu))
    # each callable's first (warm-up) call costs 100 s: counted, it would be the median of 2 timed calls
    costs = {"fast": iter([100.0, 3.0, 1.0, 2.0]), "slow": iter([100.0, 6.0, 2.0, 4.0])}
    order = []

    def runner(name):
        def run():
            order.append(name)
            clock.spend(next(costs[name]))
        return run

    med = bench_core._interleaved_medians({"fast": runner("fast"), "slow": runner("slow")}, repeats=3)
    assert order == ["fast", "slow"] + ["fast", "slow"] * 3  # warmed once each, then interleaved
    assert med["fast"] == bench_core.Timing(wall=4.0, cpu=2.0)  # median of [3, 1, 2] CPU seconds, wall twice
    assert med["slow"] == bench_core.Timing(wall=8.0, cpu=4.0)
    assert bench_core._ratios(med["slow"], med["fast"]) == "2.00 / 2.00"  # slow / fast: [2, 4, 6] vs [1, 2, 3]
    assert bench_core._ratios(bench_core.Timing(3.0, 1.0), bench_core.Timing(2.0, 4.0)) == "1.50 / 0.25"


@pytest.mark.parametrize("repeats", [1, 4])
def test_an_even_or_single_count_of_repeats_gives_the_statistics_median(monkeypatch, repeats):
    clock = FakeClock()
    monkeypatch.setattr(bench_core, "time", SimpleNamespace(perf_counter=lambda: clock.wall,
                                                            thread_time=lambda: clock.cpu))
    costs = iter([9.0, 1.0, 2.0, 3.0, 10.0])
    med = bench_core._interleaved_medians({"x": lambda: clock.spend(next(costs))}, repeats=repeats)
    assert med["x"].cpu == {1: 1.0, 4: 2.5}[repeats]
