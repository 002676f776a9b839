"""Trust pass 22, evaluation (second wave, helper-152): unusual inputs to the metrics, each answer checked against an
independent computation; every test here failed before its fix."""

from __future__ import annotations

import math

import pytest
import torch

from bcos_plugins.errors import BcosValueError
from bcos_plugins.metrics.decoder import perplexity


def _tiny_gpt2(vocab: int = 11, n_positions: int = 8):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_embd=8, n_layer=1, n_head=2, n_positions=n_positions,
                        n_ctx=n_positions, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval().double()


def _hand_perplexity(model, windows: list[list[int]]) -> tuple[float, int]:
    """exp of the mean -log p(x_t | x_<t) over the windows' tokens after the first, in Python floats."""
    total, n = 0.0, 0
    with torch.no_grad():
        for window in windows:
            logits = model(input_ids=torch.tensor([window])).logits[0].double().tolist()
            for t in range(1, len(window)):
                row = logits[t - 1]
                total -= row[window[t]] - math.log(sum(math.exp(v) for v in row))
                n += 1
    return math.exp(total / n), n


def test_perplexity_refuses_ids_that_already_start_with_the_bos_it_prepends():
    # before: [0, 1, 2, 3] with bos_token_id=0 was scored as [0, 0, 1, 2, 3]: p(BOS | BOS) counted as a text token
    # (4 tokens, perplexity 10.83 where the text's is that of [0, 1, 2, 3]'s 3 tokens), without a word
    model = _tiny_gpt2()
    expected, n = _hand_perplexity(model, [[0, 1, 2, 3]])
    result = perplexity(model, [[1, 2, 3]], bos_token_id=0)
    assert (result.n_tokens, n) == (3, 3) and result.perplexity == pytest.approx(expected, rel=1e-12)
    with pytest.raises(BcosValueError, match=r"^texts: texts\[1\] already starts with bos_token_id \(0\): perplexity "
                                             r"prepends it to every window.*p\(BOS \| BOS\).*Drop the leading BOS"):
        perplexity(model, [[1, 2, 3], [0, 1, 2, 3]], bos_token_id=0)
    # without bos_token_id the text's own BOS starts its first window, as given
    assert perplexity(model, [[0, 1, 2, 3]]).perplexity == pytest.approx(expected, rel=1e-12)


def test_reciprocal_rank_takes_nan_scores_outside_the_candidates_and_names_those_inside():
    # before: a NaN (or inf) at a padding token, which the ranking never reads, was refused as "scores: contains NaN
    # or inf in row [0]. Pass finite values", although reciprocal_rank's own check covers the candidate tokens only
    from bcos_plugins.metrics.decoder import mean_reciprocal_rank, reciprocal_rank

    nan, inf = float("nan"), float("inf")
    evidence = torch.tensor([[0, 0, 1, 0], [0, 1, 0, 0]])
    candidates = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]])
    finite = torch.tensor([[0.0, 0.5, 0.2, 0.9], [0.3, 0.1, 0.7, 0.0]])
    padded = finite.clone()
    padded[0, 0], padded[1, 3] = nan, inf
    # hand ranks among the candidates: row 0 ranks 0.9, 0.5, 0.2 (evidence third); row 1 ranks 0.7, 0.3, 0.1 (third)
    expected = torch.tensor([1 / 3, 1 / 3], dtype=torch.float64)
    assert torch.equal(reciprocal_rank(finite, evidence, candidates), expected)
    assert torch.equal(reciprocal_rank(padded, evidence, candidates), expected)
    assert mean_reciprocal_rank(padded, evidence, candidates).mrr == pytest.approx(1 / 3, rel=1e-15)
    inside = padded.clone()
    inside[1, 0] = nan
    with pytest.raises(BcosValueError, match=r"^scores: contain NaN or inf at candidate tokens in row \[1\]"):
        reciprocal_rank(inside, evidence, candidates)


@pytest.mark.parametrize("seed", [2**64, 2**70])
def test_a_seed_beyond_torchs_generator_is_refused_naming_seed(seed):
    # before: ValueError "Overflow when unpacking long long" from inside torch.Generator().manual_seed, naming nothing
    from bcos_plugins.metrics.image import pixel_ranking
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a, b = [0.1, 0.5, 0.2, 0.9], [0.3, 0.4, 0.6, 1.0]
    with pytest.raises(BcosValueError, match=r"^seed: .*18446744073709551615"):
        paired_bootstrap_difference(a, b, seed=seed)
    maps = torch.zeros(1, 2, 2)
    with pytest.raises(BcosValueError, match=r"^seed: .*18446744073709551615"):
        pixel_ranking(maps, seed=seed)
    with pytest.raises(BcosValueError, match=r"^seed: .*-9223372036854775808"):
        pixel_ranking(maps, seed=-seed)


def test_the_largest_seeds_torch_takes_give_the_documented_hand_computation():
    from bcos_plugins.metrics.image import pixel_ranking
    from bcos_plugins.metrics.paired import paired_bootstrap_difference

    a, b = [0.1, 0.5, 0.2, 0.9], [0.3, 0.4, 0.6, 1.0]
    seed = 2**64 - 1
    result = paired_bootstrap_difference(a, b, n_resamples=500, seed=seed)
    d = torch.tensor(b, dtype=torch.float64) - torch.tensor(a, dtype=torch.float64)
    means = d[torch.randint(4, (500, 4), generator=torch.Generator().manual_seed(seed))].mean(1)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    assert (result.ci_low, result.ci_high) == (low, high)
    # all pixels tied: the ranking is the seed's permutation, for the largest and the smallest seed torch takes
    for seed in (2**64 - 1, -2**63):
        expected = torch.randperm(4, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(pixel_ranking(torch.zeros(1, 2, 2), seed=seed)[0], expected), seed


def test_paired_scores_of_integers_float64_cannot_hold_are_refused_not_rounded():
    # before: [2**60, 2**60 + 1, 5] against [2**60 + 3, 2**60 + 1, 7] were read in float64, where 2**60 + 3 is 2**60: the
    # differences [3, 0, 2] became [0, 0, 2], a mean of 0.667 for 1.667, silently
    from bcos_plugins.metrics.paired import constant_difference, paired_bootstrap_difference

    big_a, big_b = [2**60, 2**60 + 1, 5], [2**60 + 3, 2**60 + 1, 7]
    for call in (paired_bootstrap_difference, constant_difference):
        with pytest.raises(BcosValueError, match=r"^values_a: holds integers beyond 2\*\*53 \(1152921504606846976\).*"
                                                 r"Subtract a common offset"):
            call(big_a, big_b)
    # the same scores less the offset 2**60 (as the fix says) are the hand mean, 5 / 3
    small_a, small_b = [0, 1, 5 - 2**60], [3, 1, 7 - 2**60]
    assert paired_bootstrap_difference([0, 1, 5], [3, 1, 7]).difference == 5 / 3
    with pytest.raises(BcosValueError, match=r"^values_a: holds integers beyond 2\*\*53"):
        paired_bootstrap_difference(small_a, small_b)
    # at 2**53 every integer is exact and taken; and integers are compared exactly: float64's epsilon times the scale
    # 2**53 (a spread of 8) read the differences [0, 3, 0] as one constant, refused as "minus values_a is 1 on every
    # one of the 3 units"
    assert paired_bootstrap_difference([2**53, 0, 1], [2**53, 3, 1]).difference == 1.0
    assert constant_difference([2**53, 0, 1], [2**53, 3, 1]) is None
    assert constant_difference([2**53 - 2, 0, 1], [2**53, 2, 3]) == 2.0


def test_integer_scores_above_float32s_exact_range_rank_and_sum_as_the_integers():
    # before: integer scores were read in float32, which ties 2**24 + 1 with 2**24: the gold token ranked second by
    # position (top-1 IoU 0 for 1, AP 0.5 for 1), and token_scores summed 2**24 + 1 to 2**24, silently
    from bcos_plugins.metrics import average_precision, rationale_alignment, token_scores, top_k_iou

    scores = torch.tensor([[2**24, 2**24 + 1, 3]])
    gold = torch.tensor([[0, 1, 0]])
    assert top_k_iou(scores, gold).tolist() == [1.0]
    assert average_precision(scores, gold).tolist() == [1.0]
    assert rationale_alignment(scores, gold).as_dict() == {"iou": 1.0, "auprc": 1.0, "n_rows": 1, "n_iou_rows": 1}
    summed = token_scores(torch.tensor([[[2**24, 1], [1, 2**24]], [[2**24, 2], [3, 2**24]]]))
    assert summed.dtype == torch.float64 and summed.tolist() == [[2**24 + 1] * 2, [2**24 + 2, 2**24 + 3]]
    # float scores keep their dtype (at least float32)
    assert token_scores(torch.ones(1, 2, dtype=torch.bfloat16)).dtype == torch.float32


def test_explanation_entropy_refuses_a_row_of_padding_only_and_keeps_the_hand_entropy_of_the_others():
    # before: a row whose attention_mask is all zeros read entropy 0 (as if one token carried the whole explanation)
    from bcos_plugins.metrics import explanation_entropy

    scores = torch.tensor([[1.0, -3.0, 2.0, 5.0], [4.0, 1.0, 1.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    p0 = [3 / 10, 2 / 10, 5 / 10]
    p1 = [4 / 5, 1 / 5]
    expected = [-sum(p * math.log(p) for p in row) for row in (p0, p1)]
    assert explanation_entropy(scores, mask).tolist() == pytest.approx(expected, rel=1e-14)
    with pytest.raises(BcosValueError, match=r"^attention_mask: row\(s\) \[1\] have no real token"):
        explanation_entropy(scores, torch.tensor([[0, 1, 1, 1], [0, 0, 0, 0]]))


def test_seqpg_refuses_an_example_of_padding_only_and_keeps_the_hand_shares_of_the_others():
    # before: an example whose attention_mask is all zeros scored 0 (a pointing game lost) and split (0, 0, 0)
    from bcos_plugins.metrics import seqpg_evidence_split, seqpg_score

    segments = torch.zeros(2, 2, 5, dtype=torch.bool)
    segments[:, 0, 1:2] = True
    segments[:, 1, 3:4] = True
    scores = torch.tensor([[0.5, 2.0, 0.5, 1.0, -1.0], [0.0, 1.0, 0.0, 3.0, 0.0],
                           [1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 2.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    # example 0 (rows 0, 1; its last token padding): segment 0's class puts 2 of its 4 positive on segment 0, 1 on
    # segment 1, 1 elsewhere; segment 1's class 3 of 4 on segment 1, 1 on segment 0. Example 1 (rows 2, 3): 1 of 5 on
    # segment 0, 1 on segment 1, 3 elsewhere; then 2 of 2 on segment 1
    expected = [(2 / 4 + 3 / 4) / 2, (1 / 4 + 1 / 4) / 2, (1 / 4 + 0) / 2, (1 / 5 + 1) / 2, (1 / 5 + 0) / 2, (3 / 5) / 2]
    assert seqpg_evidence_split(scores, segments, mask).flatten().tolist() == pytest.approx(expected, rel=1e-14)
    empty = torch.tensor([[1, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
    for call in (seqpg_score, seqpg_evidence_split):
        with pytest.raises(BcosValueError, match=r"^attention_mask: row\(s\) \[1\] have no real token"):
            call(scores, segments, empty)
