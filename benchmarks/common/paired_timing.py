"""Speed ratios measured in paired rounds: every callable once per round in a fresh random order, the ratio of two
callables the median of their per-round ratios.

Why not medians of separate series in a fixed order: a callable that always runs after the same other one (a model
after another model whose weights pushed its own out of cache, a forward after an explanation that freed hundreds of
MB) is biased the same way on every round, and more rounds do not remove it. A fresh random order per round (seeded:
a run can be repeated) spreads such effects over both sides; pairing by round cancels the load the two calls of a
round share, and the quartiles of the paired ratios show the spread. A self-control pair (one callable against a
second copy of itself) shows the noise floor of a run. What the order cannot fix is the process's state: see
``benchmarks/bench_core.py`` (forwards timed before any explanation) and docs/benchmarks.md#bench-core-method.

Two clocks per call: wall-clock (``time.perf_counter``) and the calling thread's CPU time (``time.thread_time``,
which counts only what the thread ran: steadier on a shared machine, and all of the work when torch runs one
thread).

On a GPU a call returns once its kernels are queued: ``synchronize`` (e.g. ``torch.cuda.synchronize``) is then run
before each call's clocks start and again before they stop, so that each call's time is its own kernels' and none
of the previous call's. The wall clock is then the one to read: the thread's CPU time leaves out the GPU's work.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CLOCKS", "PairedRounds", "RatioSpread", "paired_rounds"]

CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class RatioSpread:
    """Median and quartiles (``q1``, ``q3``) of the per-round ratios of two callables, over ``rounds`` rounds."""

    median: float
    q1: float
    q3: float
    rounds: int

    def cell(self) -> str:
        """``1.17 [1.12, 1.21]``: the median and the interquartile range."""
        return f"{self.median:.2f} [{self.q1:.2f}, {self.q3:.2f}]"


@dataclass(frozen=True)
class PairedRounds:
    """Seconds of each named callable per round, ``seconds[name][clock][round]`` (clock ``wall`` or ``cpu``), and
    ``orders``, the order each round ran them in."""

    seconds: dict[str, dict[str, list[float]]]
    orders: list[list[str]]

    def median(self, name: str, clock: str) -> float:
        """Median seconds of one callable on one clock."""
        return statistics.median(self.seconds[name][clock])

    def ratio(self, numerator: str, denominator: str, clock: str) -> RatioSpread:
        """Median and quartiles over the rounds of ``numerator``'s time / ``denominator``'s time in the same round."""
        if clock not in CLOCKS:
            raise ValueError(f"clock={clock!r}: not a clock; pass one of {CLOCKS}")
        for name in (numerator, denominator):
            if name not in self.seconds:
                raise KeyError(f"{name!r}: not a timed callable; pass one of {sorted(self.seconds)}")
        ratios = [n / d for n, d in zip(self.seconds[numerator][clock], self.seconds[denominator][clock], strict=True)]
        # 'inclusive' keeps the quartiles within the ratios seen (the default extrapolates for a few rounds)
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
        return RatioSpread(statistics.median(ratios), q1, q3, len(ratios))


def _timed_call(fn: Callable[[], object], synchronize: Callable[[], object] | None = None) -> tuple[float, float]:
    """(wall-clock seconds, this thread's CPU seconds) of one call of ``fn``; with ``synchronize``, run before the
    clocks start (the queue holds no earlier work) and before they stop (``fn``'s queued work is done)."""
    if synchronize is not None:
        synchronize()
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    if synchronize is not None:
        synchronize()
    return time.perf_counter() - wall, time.thread_time() - cpu


def paired_rounds(runs: dict[str, Callable[[], object]], rounds: int, *, seed: int = 0, warm_up: int = 1,
                  synchronize: Callable[[], object] | None = None) -> PairedRounds:
    """Each callable of ``runs`` called ``warm_up`` times untimed, then ``rounds`` rounds, each calling every one
    once in a fresh order drawn from ``random.Random(seed)``; every call timed on both clocks, between two calls of
    ``synchronize`` when given (a GPU: ``lambda: torch.cuda.synchronize(device)``)."""
    if not runs:
        raise ValueError("runs: empty; pass at least one named callable")
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: must be >= 1; pass the number of paired rounds, e.g. 7")
    if warm_up < 0:
        raise ValueError(f"warm_up={warm_up}: must be >= 0; pass the untimed calls per callable, e.g. 1")
    if synchronize is not None and not callable(synchronize):
        raise TypeError(f"synchronize={synchronize!r}: not callable; pass a function of no arguments "
                        "(e.g. torch.cuda.synchronize) or None")
    rng = random.Random(seed)
    names = list(runs)
    for _ in range(warm_up):
        for name in rng.sample(names, len(names)):
            runs[name]()
    seconds = {name: {clock: [] for clock in CLOCKS} for name in names}
    orders = []
    for _ in range(rounds):
        order = rng.sample(names, len(names))
        orders.append(order)
        for name in order:
            wall, cpu = _timed_call(runs[name], synchronize)
            seconds[name]["wall"].append(wall)
            seconds[name]["cpu"].append(cpu)
    return PairedRounds(seconds, orders)
