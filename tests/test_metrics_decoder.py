"""MRR, its random baseline and the probability gap on hand-computed cases (B-cos LM paper §7)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from bcos_plugins.metrics.decoder import (
    expected_random_reciprocal_rank,
    mean_reciprocal_rank,
    probability_gap,
    random_reciprocal_rank,
    reciprocal_rank,
)


def _mask(*rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_reciprocal_rank_hand_computed():
    scores = torch.tensor([
        [0.1, 0.5, -0.2, 0.3],   # order 1, 3, 0, 2: evidence 3 at rank 2
        [0.1, 0.5, -0.2, 0.3],   # evidence 0 (rank 3) and 2 (rank 4): the best counts
        [1.0, 1.0, 1.0, 0.5],    # ties keep prefix order: evidence 1 at rank 2 (a row of all-equal scores has no
                                 # rank: tests/test_leftovers_s24_c.py)
        [-3.0, -1.0, -2.0, 0.5],  # signed scores: negatives rank low, evidence 0 at rank 4
    ])
    evidence = _mask([0, 0, 0, 1], [1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0])
    rr = reciprocal_rank(scores, evidence)
    assert rr.tolist() == [1 / 2, 1 / 3, 1 / 2, 1 / 4]


def test_candidates_exclude_bos_and_padding():
    scores = torch.tensor([[9.0, 0.1, 0.5, 7.0], [0.0, 2.0, 1.0, 3.0]])
    candidates = _mask([0, 1, 1, 0], [0, 1, 1, 1])  # row 0: BOS first, padding last; row 1: left padding
    evidence = _mask([0, 1, 0, 0], [0, 0, 1, 0])
    assert reciprocal_rank(scores, evidence, candidates).tolist() == [1 / 2, 1 / 3]
    # without the candidate mask the high BOS and padding scores push the evidence down
    assert reciprocal_rank(scores, evidence).tolist() == [1 / 4, 1 / 3]


def test_undefined_rows_are_nan_and_skipped():
    scores = torch.tensor([[0.0, 0.0, 0.0], [0.2, 0.1, 0.3], [0.2, 0.1, 0.3]])
    evidence = _mask([1, 0, 0], [0, 0, 0], [0, 1, 0])
    rr = reciprocal_rank(scores, evidence)
    assert math.isnan(rr[0]) and math.isnan(rr[1]) and rr[2] == 1 / 3
    result = mean_reciprocal_rank(scores, evidence)
    assert (result.n, result.n_skipped) == (1, 2)
    assert result.mrr == pytest.approx(1 / 3)
    # random baseline over the rows with a rank, as the MRR (row 2, n=3, k=1): (1 + 1/2 + 1/3) / 3
    assert result.random == pytest.approx(11 / 18)


@pytest.mark.parametrize(("n", "k", "expected"), [
    (1, 1, Fraction(1)),
    (4, 1, Fraction(25, 48)),           # (1 + 1/2 + 1/3 + 1/4) / 4
    (4, 2, Fraction(13, 18)),           # 1 * 1/2 + 1/2 * 1/3 + 1/3 * 1/6
    (5, 5, Fraction(1)),
])
def test_random_baseline_hand_computed(n, k, expected):
    assert expected_random_reciprocal_rank(n, k) == pytest.approx(float(expected), abs=1e-12)


@pytest.mark.parametrize(("n", "k"), [(5, 1), (5, 2), (6, 3), (7, 2)])
def test_random_baseline_equals_enumeration_of_all_rankings(n, k):
    evidence = set(range(k))
    values = [1 / (1 + min(perm.index(e) for e in evidence)) for perm in itertools.permutations(range(n))]
    assert expected_random_reciprocal_rank(n, k) == pytest.approx(sum(values) / len(values), abs=1e-12)


def test_random_baseline_per_row_and_mean():
    evidence = _mask([0, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0])
    candidates = _mask([1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0])
    rand = random_reciprocal_rank(evidence, candidates)
    assert rand[0] == pytest.approx(25 / 48) and rand[1] == pytest.approx(expected_random_reciprocal_rank(5, 2))
    assert math.isnan(rand[2])


def test_random_scores_average_to_the_random_baseline():
    g = torch.Generator().manual_seed(0)
    evidence = torch.zeros(20000, 6, dtype=torch.bool)
    evidence[:, 2] = True
    evidence[:, 4] = True
    result = mean_reciprocal_rank(torch.rand(20000, 6, generator=g), evidence)
    assert result.random == pytest.approx(expected_random_reciprocal_rank(6, 2))
    assert result.mrr == pytest.approx(result.random, abs=0.01)


def test_probability_gap_hand_computed():
    logits = torch.tensor([[0.0, math.log(3.0), -math.inf], [2.0, 2.0, 2.0]])
    gap = probability_gap(logits, torch.tensor([1, 0]), torch.tensor([0, 2]))
    torch.testing.assert_close(gap, torch.tensor([0.5, 0.0]))
    assert probability_gap(logits, torch.tensor([0, 0]), torch.tensor([1, 0]))[0] == pytest.approx(-0.5)


def test_metric_error_paths():
    scores = torch.rand(2, 4)
    with pytest.raises(ValueError, match=r"scores: must have 2 dimensions \(batch, pos\)"):
        reciprocal_rank(scores[0], _mask([1, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"^evidence: has shape \(1, 3\) but scores has \(2, 4\)\. Pass one flag per "
                                         "scored token"):
        reciprocal_rank(scores, _mask([1, 0, 0]))
    with pytest.raises(ValueError, match=r"rows \[1\] mark evidence outside the candidate tokens"):
        reciprocal_rank(scores, _mask([1, 0, 0, 0], [0, 0, 0, 1]), _mask([1, 1, 1, 1], [1, 1, 1, 0]))
    with pytest.raises(ValueError, match="MRR is undefined"):
        mean_reciprocal_rank(scores, torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="need 1 <= n_evidence <= n_candidates"):
        expected_random_reciprocal_rank(3, 4)
    with pytest.raises(ValueError, match="need 1 <= n_evidence"):
        expected_random_reciprocal_rank(3, 0)
    with pytest.raises(ValueError, match=r"logits must be next-token logits of shape \(batch, vocab\)"):
        probability_gap(torch.rand(2, 3, 5), torch.tensor([0, 1]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"foil: ids must lie in \[0, 5\), got \[5\] at row \[1\]\. Pass ids in "
                                         r"\[0, 5\) \(there are 5 vocabulary tokens\)"):
        probability_gap(torch.rand(2, 5), torch.tensor([0, 1]), torch.tensor([1, 5]))
    # a float is a type error, as everywhere ids are read (it was a ValueError here only)
    with pytest.raises(TypeError, match=r"target: got a float \(torch\.float32\); ids must be integers .*"
                                        r"shape \(2,\)"):
        probability_gap(torch.rand(2, 5), torch.tensor([0.0, 1.0]), torch.tensor([1, 0]))


# --- BLiMP loader: prefix / target / foil / evidence --------------------------------------------------------

from transformers import GPT2Tokenizer  # noqa: E402

from bcos_plugins.data import SHIPPED_DATA, ContrastiveBatch  # noqa: E402
from bcos_plugins.data.blimp import BLIMP_SUBSETS, BlimpPair, encode_blimp, load_blimp  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return GPT2Tokenizer.from_pretrained(SHIPPED_DATA / "gpt2_tokenizer")


def test_shipped_tokenizer_is_gpt2(gpt2_tokenizer):
    assert len(gpt2_tokenizer) == 50257 and gpt2_tokenizer.eos_token_id == 50256
    assert gpt2_tokenizer("Hello world")["input_ids"] == [15496, 995]  # GPT-2's documented ids


@pytest.mark.parametrize(("subset", "prefix", "target", "foil", "evidence"), [
    ("aga", "Katherine can't help", "herself", "himself", ["Katherine"]),
    ("ana", "Susan revealed", "herself", "themselves", ["Susan"]),
    ("asp", "Amanda was respected by some", "waitresses", "picture", ["respected"]),
    ("dna", "Raymond is selling this", "sketch", "sketches", ["this"]),
    ("dnai", "Laurie hasn't lifted those", "cacti", "cactus", ["those"]),
    ("dnaa", "Rebecca was criticizing those good", "documentaries", "documentary", ["those"]),
    ("dnaai", "Some waiters broke this lost", "foot", "feet", ["this"]),
    ("npi", "Even Suzanne has", "really", "ever", ["Even"]),
    ("darn", "A niece of most senators", "hasn't", "haven't", ["niece"]),
])
def test_first_pair_of_each_subset(subset, prefix, target, foil, evidence):
    pair = load_blimp(subset, n=1)[0]
    assert (pair.prefix, pair.target, pair.foil, pair.evidence_words) == (prefix, target, foil, evidence)
    assert pair.paradigm == BLIMP_SUBSETS[subset] and load_blimp(pair.paradigm, n=1)[0] == pair


def test_evidence_rules_on_harder_prefixes():
    def pair(subset, prefix):
        from bcos_plugins.data.blimp import _evidence_spans
        return BlimpPair(subset, "", "0", prefix, "x", "y", _evidence_spans(subset, prefix)).evidence_words

    assert pair("ana", "These patients do respect") == ["These", "patients"]
    assert pair("asp", "The hills were dropped by by some") == ["dropped"]
    assert pair("darn", "The report about the Great Lakes") == ["report"]
    assert pair("darn", "A newspaper article about the Borgias") == ["newspaper", "article"]
    assert pair("dna", "That girl is selling these") == ["these"]  # the last demonstrative, not the subject's
    assert pair("npi", "Suzanne has") == []


def test_encode_blimp_left_pads_and_marks_evidence(gpt2_tokenizer):
    pairs = load_blimp("aga", n=2) + load_blimp("asp", n=1)
    bos = gpt2_tokenizer.eos_token_id
    batch = encode_blimp(pairs, gpt2_tokenizer, bos_token_id=bos)
    assert len(batch) == 3 and not batch.dropped and isinstance(batch, ContrastiveBatch)
    assert (batch.attention_mask[:, -1] == 1).all(), "every prefix must end at the last column"
    first = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    assert first == [bos, 42, 15289, 460, 470, 1037]  # <|endoftext|> K atherine Ġcan 't Ġhelp
    assert gpt2_tokenizer.convert_ids_to_tokens(batch.input_ids[0][batch.evidence[0]].tolist()) == ["K", "atherine"]
    assert batch.candidates.sum(1).tolist() == [5, len(gpt2_tokenizer("Karla could listen to")["input_ids"]),
                                                len(gpt2_tokenizer("Amanda was respected by some")["input_ids"])]
    assert not (batch.candidates & (batch.input_ids == bos)).any(), "BOS is never ranked"
    assert batch.target_ids[0] == gpt2_tokenizer(" herself")["input_ids"][0]
    assert batch.foil_ids[0] == gpt2_tokenizer(" himself")["input_ids"][0]
    assert gpt2_tokenizer.convert_ids_to_tokens(batch.input_ids[2][batch.evidence[2]].tolist()) == ["Ġrespected"]
    # the batch feeds the MRR directly
    result = mean_reciprocal_rank(batch.evidence.float(), batch.evidence, batch.candidates)
    assert result.mrr == 1.0


def test_encode_blimp_drops_pairs_sharing_first_token(gpt2_tokenizer):
    same = BlimpPair("dna", "determiner_noun_agreement_1", "0", "Craig explored that", "grocery store",
                     "grocery stores", ((14, 18),))
    good = load_blimp("dna", n=1)
    batch = encode_blimp([same, *good], gpt2_tokenizer)
    assert batch.pairs == good and batch.dropped == [(same, "target and foil share their first token")]
    with pytest.raises(ValueError, match="none of the 1 pairs is usable"):
        encode_blimp([same], gpt2_tokenizer)


def test_blimp_error_paths(tmp_path, gpt2_tokenizer):
    with pytest.raises(ValueError, match=r"unknown BLiMP subset 'wh_island'.*aga: anaphor_gender_agreement"):
        load_blimp("wh_island")
    with pytest.raises(FileNotFoundError, match="source='hub'"):
        load_blimp("aga", path=tmp_path)
    with pytest.raises(ValueError, match="source: must be 'local' or 'hub', got 'web'"):
        load_blimp("aga", source="web")
    slow = type("SlowTokenizer", (), {"is_fast": False})()
    with pytest.raises(ValueError, match="needs a fast tokenizer"):
        encode_blimp(load_blimp("aga", n=1), slow)
