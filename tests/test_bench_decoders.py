"""The arithmetic of benchmarks/bench_decoders.py's tables, on hand-made inputs whose answer is known."""

from __future__ import annotations

import pytest

from benchmarks.bench_decoders import seconds_per_explanation


def test_seconds_per_explanation_is_total_time_over_total_explanations():
    # the IOI batch: 200 prompts in 1.0 s; a BLiMP batch: 50 pairs in 1.0 s -> 2.0 s / 250 = 8 ms, not the mean
    # of the batches' 5 ms and 20 ms (12.5 ms)
    timings = {"B-cos": [(1.0, 200), (1.0, 50)], "IxG": [(3.0, 100)]}
    assert seconds_per_explanation(timings) == {"B-cos": pytest.approx(0.008), "IxG": pytest.approx(0.03)}


def test_seconds_per_explanation_refuses_a_method_without_explanations():
    with pytest.raises(ValueError, match="timings\\['Occlusion'\\]: no explanation timed"):
        seconds_per_explanation({"Occlusion": []})
