"""benchmarks/bench_lens.py's method: its ratios go through benchmarks/common/paired_timing.py (paired rounds, each in
a fresh seeded order, the median [IQR] of the per-round ratios), checked on a fake clock whose answer is known and on
a tiny forward run."""

from __future__ import annotations

import re
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch

from benchmarks import bench_lens
from benchmarks.common import paired_timing


@pytest.fixture
def clock(monkeypatch):
    """paired_timing's clocks, moved only by the fake workloads (wall twice the thread CPU time)."""
    clock = SimpleNamespace(wall=0.0, cpu=0.0)
    monkeypatch.setattr(paired_timing, "time", SimpleNamespace(perf_counter=lambda: clock.wall,
                                                               thread_time=lambda: clock.cpu))
    return clock



@pytest.fixture
def paired_rounds_calls(monkeypatch):
    """bench_lens' paired_rounds, still run, with each call's (sorted callable names, rounds, keywords) recorded."""
    calls = []

    def spy(runs, rounds, **kwargs):
        calls.append((sorted(runs), rounds, kwargs))
        return paired_timing.paired_rounds(runs, rounds, **kwargs)

    monkeypatch.setattr(bench_lens, "paired_rounds", spy)
    return calls


def test_the_forward_ratio_is_the_median_of_paired_ratios_not_the_ratio_of_medians(clock):
    # per round B-cos / plain = 2, 1 and 0.5: median 1.00, quartiles 0.75 and 1.50; the ratio of the two medians
    # (3 / 2), what the fixed alternation printed before, would read 1.50
    costs = {"plain": iter([9.0, 1.0, 3.0, 4.0]), "bcos": iter([9.0, 2.0, 3.0, 2.0])}

    def run(name):
        def call():
            seconds = next(costs[name])
            clock.wall += 2 * seconds
            clock.cpu += seconds
        return call

    timed = paired_timing.paired_rounds({name: run(name) for name in costs}, rounds=3)
    assert bench_lens._forward_ratio_line(timed) == ("1.00 [0.75, 1.50] wall, 1.00 [0.75, 1.50] thread CPU  "
                                                     "(goal <= 1.5 wall: met)")


def test_a_tiny_forward_run_goes_through_paired_rounds_and_prints_the_paired_ratios(paired_rounds_calls, capsys):
    args = Namespace(layout="gpt2", d_model=32, heads=4, layers=1, vocab=64, batch=1, seq=8, b=1.5, repeats=3,
                     device="cpu", grad=False)
    bench_lens.bench_forward(args)
    assert paired_rounds_calls == [(["bcos", "plain"], 3, {"warm_up": 1, "synchronize": None})]
    out = capsys.readouterr().out
    assert "3 paired rounds in seeded random order" in out
    cell = r"\d+\.\d\d \[\d+\.\d\d, \d+\.\d\d\]"
    assert re.search(rf"ratio B-cos / plain, median \[IQR\] of paired ratios = {cell} wall, {cell} thread CPU", out)


def test_cuda_calls_are_timed_between_device_synchronisations():
    assert bench_lens._synchronize("cuda") is torch.cuda.synchronize
    assert bench_lens._synchronize("cpu") is None


def test_the_decomposition_timings_go_through_paired_rounds_with_the_matrix_product(paired_rounds_calls, capsys):
    bench_lens.bench_components(Namespace(vocab=64, device="cpu", b=1.5, repeats=1))
    names = ["decomposition (batched)", "decomposition (batched), again", "explain_logits",
             "loop, 1 backward/component", "matrix product"]  # with the self-control, a second batched call
    assert paired_rounds_calls == [(names, 1, {"warm_up": 0, "synchronize": None})]  # warmed up by the calls checked beforehand
    cell = r"\d+\.\d\d \[\d+\.\d\d, \d+\.\d\d\]x"
    out = capsys.readouterr().out
    assert re.search(rf"loop / batched = {cell} \(median \[IQR\] of paired ratios; goal >= 3: (met|NOT met)\); "
                     rf"batched / one explain call = {cell}", out)
    # on CPU the same ratios on the thread's CPU time (the clock the docs quote), with the self-control's
    assert re.search(rf"thread CPU: loop / batched = {cell}, batched / one explain call = {cell}, self-control "
                     rf"\(batched / batched again\) = {cell}; matrix-product rate \d+\.\d GFLOP/s, the loop "
                     rf"\d+\.\d \(\d+\.\d\dx at most\)", out)
    assert re.search(rf"self-control \(batched / batched again\), wall: {cell}", out)
