"""The arithmetic of benchmarks/bench_decoders.py's tables, on hand-made inputs whose answer is known."""

from __future__ import annotations

import pytest

from benchmarks.common.decoder_baselines import seconds_per_explanation


def test_seconds_per_explanation_is_total_time_over_total_explanations():
    # the IOI batch: 200 prompts in 1.0 s; a BLiMP batch: 50 pairs in 1.0 s -> 2.0 s / 250 = 8 ms, not the mean
    # of the batches' 5 ms and 20 ms (12.5 ms)
    timings = {"B-cos": [(1.0, 200), (1.0, 50)], "IxG": [(3.0, 100)]}
    assert seconds_per_explanation(timings) == {"B-cos": pytest.approx(0.008), "IxG": pytest.approx(0.03)}


def test_seconds_per_explanation_refuses_a_method_without_explanations():
    with pytest.raises(ValueError, match="timings\\['Occlusion'\\]: no explanation timed"):
        seconds_per_explanation({"Occlusion": []})


def test_evaluate_warms_every_method_untimed_and_divides_by_each_batchs_own_size(monkeypatch):
    from types import SimpleNamespace

    import torch

    from benchmarks import bench_decoders

    class Batch(SimpleNamespace):
        def __len__(self):
            return self.n

    fields = dict(input_ids=None, attention_mask=None, target_ids=None, foil_ids=None, evidence=None, candidates=None)
    ioi, blimp_a, blimp_b = (Batch(n=n, name=name, **fields) for n, name in ((200, "ioi"), (50, "a"), (40, "b")))
    calls = []
    batch_seconds = {"ioi": 1.0, "a": 1.0, "b": 0.8}

    def fake_scores(model, batch, with_bcos):
        calls.append(batch.name)
        # a cold first call costs 100 s: timed, it would dominate every number
        seconds = 100.0 if len(calls) == 1 else batch_seconds[batch.name]
        return ({"B-cos": torch.zeros(1), "Saliency": torch.zeros(1)},
                {"B-cos": seconds, "Saliency": 2 * seconds})

    contrast = SimpleNamespace(accuracy=1.0, mean_logit_difference=0.0, mean_probability_gap=0.0)
    monkeypatch.setattr(bench_decoders, "explanation_scores", fake_scores)
    monkeypatch.setattr(bench_decoders, "perplexity", lambda *a, **k: SimpleNamespace(perplexity=1.0, n_tokens=1))
    monkeypatch.setattr(bench_decoders, "next_token_contrast", lambda *a, **k: contrast)
    monkeypatch.setattr(bench_decoders, "mean_reciprocal_rank", lambda *a, **k: SimpleNamespace(mrr=1.0, random=0.5))
    data = SimpleNamespace(heldout_text="", eos=0, ioi_test=ioi, blimp={"a": blimp_a, "b": blimp_b})
    row = bench_decoders.evaluate(None, data, True)
    assert calls == ["b", "ioi", "a", "b"]  # the warm-up on the smallest batch, then the timed ones
    assert row["seconds_per_explanation"] == {"B-cos": pytest.approx(2.8 / 290),
                                              "Grad Norm": pytest.approx(5.6 / 290)}
