"""Leftovers of trust pass 23's evaluation area (helper-160), decided and fixed in bcos_plugins/metrics/ (session 24,
helper-165). One test per decision; each failed before its fix and checks the numbers against a hand computation.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
import transformers as T
from conftest import padded_rows, tiny_config

from bcos_plugins.errors import BcosTypeError, BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _entropy(row) -> float:
    total = sum(abs(v) for v in row)
    return -sum(abs(v) / total * math.log(abs(v) / total) for v in row if v)


# ------------------------------------------------------------------ 1. one example's (pos, d_model) tensor


def test_explanation_entropy_refuses_a_2d_tensor_without_mask_that_reads_two_ways():
    from bcos_plugins.metrics import explanation_entropy

    g = torch.Generator().manual_seed(0)
    one_example = torch.randn(5, 8, generator=g, dtype=torch.float64)  # (pos, d_model): Captum's attr[0]
    # read as 5 rows of 8 tokens: five entropies over the embedding dimensions, silently
    for given in (one_example, (one_example,)):
        with pytest.raises(BcosValueError, match=r"^attributions: are a 2-D tensor of shape \(5, 8\) without "
                                                 r"attention_mask, which reads two ways: 5 rows of 8 token scores "
                                                 r"\(batch, pos\), or one example's attributions of 5 tokens over 8 "
                                                 r"embedding dimensions.*attributions\[None\]"):
            explanation_entropy(given)
    # the fix's two readings, each by hand
    by_token = one_example.sum(-1).tolist()
    assert explanation_entropy(one_example[None]).tolist() == pytest.approx([_entropy(by_token)], abs=1e-14)
    rows = explanation_entropy(one_example, torch.ones(5, 8))
    assert rows.tolist() == pytest.approx([_entropy(r) for r in one_example.tolist()], abs=1e-14)
    # with a mask of the example's (1, pos) the (pos, d_model) tensor is refused by shape, as before
    with pytest.raises(BcosValueError, match="attention_mask"):
        explanation_entropy(one_example, torch.ones(1, 5))


# ------------------------------------------------------------------ 2. a multi-label classifier's probabilities


def test_perturbation_curves_default_to_the_sigmoid_of_a_multi_label_classifier():
    from bcos_plugins.metrics import perturbation_curves

    torch.manual_seed(0)
    config = tiny_config("bert", num_labels=3)
    config.problem_type = "multi_label_classification"
    model = T.BertForSequenceClassification(config).eval().double()
    ids, mask = padded_rows([7, 5], 8, "right", seed=0)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    scores = torch.tensor([[0.0, 5, 4, 3, 2, 1, 0.5, 0.25]] * 2, dtype=torch.float64)
    curves = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=(0.5,))
    # by hand, row 0 alone: 6 perturbable tokens, the top 3 (positions 1, 2, 3) removed through the attention mask;
    # the class tracked is the one predicted on the full row, its probability a sigmoid
    row = ids[:1, :7]
    with torch.no_grad():
        logits = model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0]
        removed = model(input_ids=row, attention_mask=torch.tensor([[1, 0, 0, 0, 1, 1, 1]])).logits[0]
    y = int(logits.argmax())
    assert int(curves.target[0]) == y
    assert float(curves.full_probability[0]) == pytest.approx(float(logits.sigmoid()[y]), abs=1e-12)
    assert float(curves.comprehensiveness[0, 0]) == pytest.approx(float(logits.sigmoid()[y] - removed.sigmoid()[y]),
                                                                   abs=1e-12)
    # the softmax, the default before, stays available when asked for, and differs
    softmax = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=(0.5,),
                                  probability="softmax")
    assert float(softmax.full_probability[0]) == pytest.approx(float(logits.softmax(-1)[y]), abs=1e-12)
    assert abs(float(softmax.full_probability[0]) - float(curves.full_probability[0])) > 0.1
    # a single-label model keeps the softmax default
    config.problem_type = "single_label_classification"
    single = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=(0.5,))
    torch.testing.assert_close(single.full_probability, softmax.full_probability, rtol=0, atol=0)


# ------------------------------------------------------------------ 3. rows of all-equal scores: one rule


def test_reciprocal_rank_leaves_out_rows_of_equal_scores_as_top_k_iou_does():
    from bcos_plugins.metrics import mean_reciprocal_rank, rationale_alignment, reciprocal_rank, top_k_iou

    scores = torch.tensor([[2.0, 2.0, 2.0, 2.0],    # all equal, not zero: no ranking
                           [0.0, 0.0, 0.0, 0.0],    # all zero (the paper's code leaves it out)
                           [1.0, 3.0, 2.0, 2.0],    # a ranking with a tie: evidence 0 at rank 4
                           [5.0, 5.0, 5.0, 7.0]])   # equal among the candidates 0-2 (3 is not one): no ranking
    evidence = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)
    candidates = torch.tensor([[1, 1, 1, 1]] * 3 + [[1, 1, 1, 0]], dtype=torch.bool)
    rr = reciprocal_rank(scores, evidence, candidates)
    # row 0 was 1.0 (the tie rule's pick: the evidence came first), row 3 0.5
    assert torch.isnan(rr[0]) and torch.isnan(rr[1]) and torch.isnan(rr[3])
    assert rr[2].item() == 1 / 4
    mrr = mean_reciprocal_rank(scores, evidence, candidates)
    assert (mrr.mrr, mrr.n, mrr.n_skipped) == (1 / 4, 1, 3)
    # the same rows under top_k_iou (k = 1, the gold count): NaN where the scores are all equal, left out of the mean
    iou = top_k_iou(scores, evidence, candidates)
    assert torch.isnan(iou[0]) and torch.isnan(iou[1]) and torch.isnan(iou[3]) and iou[2].item() == 0.0
    assert rationale_alignment(scores, evidence, candidates).n_iou_rows == 1
    with pytest.raises(BcosValueError, match="no row has both an evidence token and candidates of different scores"):
        mean_reciprocal_rank(scores[:2], evidence[:2])


# ------------------------------------------------------------------ 4. make_seqpg_examples: fewer examples, seed


def test_make_seqpg_examples_warns_when_it_makes_fewer_examples_and_checks_its_seed():
    from test_metrics_faithfulness import KeywordModel, _word_tokenizer

    from bcos_plugins.metrics import make_seqpg_examples

    tok, vocab = _word_tokenizer([f"{c}{i}" for c in "abc" for i in range(10)] + ["x"])
    model = KeywordModel(vocab)
    texts = ["a1 a2 x x", "a3 a4 x x", "b1 b2 b3 x", "c1 c2 x x"]
    labels = [0, 0, 1, 2]
    # by hand: class 0 has two segments, classes 1 and 2 one each; the pairs (0, 1), (0, 2) use them, then (1, 2) and
    # the next round find none: 2 examples of 10, returned without a word
    with pytest.warns(UserWarning, match=r"make_seqpg_examples made 2 of the n_examples=10 examples: the segments ran "
                                         r"out .*\{0: 2, 1: 1, 2: 1\}; unused: \{0: 0, 1: 0, 2: 0\}"):
        examples = make_seqpg_examples(model, tok, texts, labels, segment_length=4, n_examples=10, min_confidence=0.5)
    assert len(examples) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exactly as many as asked: no warning
        assert len(make_seqpg_examples(model, tok, texts, labels, segment_length=4, n_examples=2,
                                       min_confidence=0.5)) == 2
    # random.Random took a float or a string seed, a seed no int call reproduces
    for seed in (0.5, "0", True):
        with pytest.raises((BcosValueError, BcosTypeError), match="^seed: "):
            make_seqpg_examples(model, tok, texts, labels, segment_length=4, n_examples=2, min_confidence=0.5,
                                seed=seed)


# ------------------------------------------------------------------ 5. an explanation's own attention_mask


def _explanation_with_scores_at_padding(targets):
    """A tiny B-cos BERT's explanation of a right-padded batch, with attribution at the padding positions (a method
    whose padding carries attribution; the package's own explanations have 0 there)."""
    from conftest import tiny_bcos_model

    from bcos_plugins import explain

    model = tiny_bcos_model().double()
    ids, mask = padded_rows([7, 7], 8, "right", seed=0)
    ids = ids[:1].repeat(len(targets), 1)
    mask = mask[:1].repeat(len(targets), 1)
    explanation = explain(model, ids, mask, target=torch.tensor(targets))
    contributions = explanation.input_contributions.clone()
    contributions[:, 7] = 0.05  # the padding column
    return dataclasses.replace(explanation, input_contributions=contributions,
                               contributions=contributions.sum(-1)), mask


def test_explanation_entropy_and_seqpg_default_to_the_explanations_attention_mask():
    from bcos_plugins.metrics import explanation_entropy, seqpg_evidence_split, seqpg_score

    explanation, mask = _explanation_with_scores_at_padding([0, 1])
    assert explanation.attention_mask is not None and int(explanation.attention_mask[0, 7]) == 0
    # by hand over the real tokens only; the padding's score counted in the entropy before
    real = explanation.contributions[:, :7].tolist()
    assert explanation_entropy(explanation).tolist() == pytest.approx([_entropy(r) for r in real], abs=1e-12)
    torch.testing.assert_close(explanation_entropy(explanation), explanation_entropy(explanation, mask),
                               rtol=0, atol=0)
    # the reduce keyword reaches the explanation's reading
    torch.testing.assert_close(explanation_entropy(explanation, reduce="l2"),
                               explanation_entropy(explanation.input_contributions, mask, reduce="l2"), rtol=0, atol=0)
    # one SeqPG example: segment 0 at positions 1-3 (class 0), segment 1 at 4-6 (class 1); the padding's positive
    # score counted among the special tokens' share before
    segments = torch.zeros(1, 2, 8, dtype=torch.bool)
    segments[0, 0, 1:4], segments[0, 1, 4:7] = True, True
    positive = explanation.contributions.clamp_min(0)[:, :7]
    by_hand = (positive[0, 1:4].sum() / positive[0].sum() + positive[1, 4:7].sum() / positive[1].sum()) / 2
    assert seqpg_score(explanation, segments).tolist() == pytest.approx([float(by_hand)], abs=1e-12)
    torch.testing.assert_close(seqpg_evidence_split(explanation, segments),
                               seqpg_evidence_split(explanation, segments, mask[:1]), rtol=0, atol=0)


# ------------------------------------------------------------------ 6./7. paired statistics


def test_paired_bootstrap_raises_no_spread_error_as_paired_accuracy_difference_does():
    from bcos_plugins.metrics.paired import (
        NoSpreadError,
        paired_accuracy_difference,
        paired_bootstrap_difference,
    )

    with pytest.raises(NoSpreadError, match="on each of the 2 seeds"):
        paired_accuracy_difference([[0, 1, 1], [1, 1, 0]], [[1, 1, 1], [1, 1, 1]], [1, 1, 1])
    # the same condition in the bootstrap raised a plain BcosValueError, which a report catching NoSpreadError let
    # stop the run
    with pytest.raises(NoSpreadError, match="on every one of the 3 units"):
        paired_bootstrap_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    with pytest.raises(NoSpreadError, match="hold one unit"):
        paired_bootstrap_difference([1.0], [2.0])
    # invalid input stays a plain BcosValueError, not "no spread"
    with pytest.raises(BcosValueError) as refused:
        paired_bootstrap_difference([1.0, 2.0], [1.0, 3.0], n_resamples=1)
    assert not isinstance(refused.value, NoSpreadError)


def test_paired_accuracy_difference_clips_the_interval_over_seeds_to_the_possible_range():
    from scipy import stats

    from bcos_plugins.metrics import paired_accuracy_difference

    labels = [1, 1, 1, 1]
    a = [[0, 0, 0, 0], [1, 1, 1, 0]]
    b = [[1, 1, 1, 1], [1, 1, 1, 1]]  # per seed: +1.0 and +0.25
    r = paired_accuracy_difference(a, b, labels)
    # by hand: mean 0.625, sd 0.530, t(0.975, 1) = 12.71: [-4.14, 5.39] unclipped, past +-1 on both sides
    half = stats.t.ppf(0.975, 1) * torch.tensor([1.0, 0.25], dtype=torch.float64).std().item() / math.sqrt(2)
    assert 0.625 - half < -1 and 0.625 + half > 1
    assert (r.difference, r.ci_low, r.ci_high) == (pytest.approx(0.625), -1.0, 1.0)
    # an interval inside the range is unchanged
    a = [[0, 0, 0, 0, 1, 1, 1, 1] * 4, [0, 0, 0, 1, 1, 1, 1, 1] * 4, [0, 0, 1, 1, 1, 1, 1, 1] * 4]
    b = [[1] * 32] * 3
    r = paired_accuracy_difference(a, b, [1] * 32)
    per_seed = torch.tensor([0.5, 0.375, 0.25], dtype=torch.float64)
    half = stats.t.ppf(0.975, 2) * per_seed.std().item() / math.sqrt(3)
    assert (r.ci_low, r.ci_high) == (pytest.approx(0.375 - half, abs=1e-12), pytest.approx(0.375 + half, abs=1e-12))
    assert -1 < r.ci_low and r.ci_high < 1


# ------------------------------------------------------------------ 8. pixel counts from a fraction


def test_pixel_perturbation_counts_pixels_by_the_text_metrics_rule():
    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.metrics.attributions import share_counts

    def forward(x):  # one class: the sum of the image; a second class at 0
        total = x.flatten(1).sum(1, keepdim=True)
        return torch.cat([total, torch.zeros_like(total)], 1)

    images = torch.ones(1, 1, 2, 5)  # 10 pixels of 1
    maps = torch.arange(10.0).reshape(1, 2, 5)
    fractions = (0.0, 0.05, 0.25, 0.35, 1.0)
    result = pixel_perturbation(forward, images, maps, 0, fractions=fractions, score="logit")
    # k = max(1, floor(r * 10)) for r > 0, as share_counts takes token counts: 1, 2, 3, 10 (round: 0, 2, 4, 10, halves
    # to even)
    counts = [0] + share_counts(torch.tensor([10]), torch.tensor(fractions[1:], dtype=torch.float64)).tolist()
    assert counts == [0, 1, 2, 3, 10]
    assert result.most_first[0].tolist() == [10.0 - k for k in counts]
    assert result.least_first[0].tolist() == [10.0 - k for k in counts]


# ------------------------------------------------------------------ 9. an inseq output given to token_scores


def test_token_scores_names_the_path_into_an_inseq_output():
    from bcos_plugins.metrics import explanation_entropy, token_scores

    class FeatureAttributionOutput:  # the two attributes the metrics read inseq's objects by
        sequence_attributions: list = []

    class FeatureAttributionSequenceOutput:
        source_attributions = torch.zeros(3, 2, 4)
        target_attributions = None

    for given in (FeatureAttributionOutput(), FeatureAttributionSequenceOutput()):
        # was "must be a tensor, a one-tensor tuple or an Explanation, got ... Pass the attribution tensor"
        with pytest.raises(BcosTypeError, match=rf"^attributions: are inseq's {type(given).__name__}, whose "
                                                r"attributions are \(tokens, generated tokens or classes, d_model\).*"
                                                r"out\.sequence_attributions\[i\].*seq\.aggregate\(\)\."
                                                r"source_attributions\[:, j\]\[None\]"):
            token_scores(given)
        with pytest.raises(BcosTypeError, match="inseq's"):
            explanation_entropy(given)
