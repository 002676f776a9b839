"""Faithfulness metrics on hand-computed cases.

The toy classifier's class-1 logit is the sum of a fixed weight per *attended* token (class-0 logit 0), so
P(class 1) = sigmoid(sum) and every comprehensiveness / sufficiency value can be written down by hand.
"""

from __future__ import annotations

import math
import os
import time

import pytest
import torch
from torch import nn

from bcos_plugins.metrics import (
    aopc,
    completeness_error,
    explanation_entropy,
    make_seqpg_examples,
    measure_cost,
    perturbation_curves,
    seqpg_evidence_split,
    seqpg_score,
    token_scores,
    top_k_masks,
)

PAD, CLS, SEP, MASK = 0, 1, 2, 3
WEIGHTS = {CLS: 0.1, SEP: 0.0, MASK: 0.25, 5: 2.0, 6: -1.0, 7: 0.5, 8: 1.0}


class SumModel(nn.Module):
    """logits = [0, sum of WEIGHTS[token] over attended tokens]."""

    def __init__(self):
        super().__init__()
        w = torch.zeros(20)
        for tok, v in WEIGHTS.items():
            w[tok] = v
        self.register_buffer("w", w)

    def forward(self, input_ids, attention_mask):
        s = (self.w[input_ids] * attention_mask).sum(-1)
        return torch.stack([torch.zeros_like(s), s], dim=-1)


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


IDS = torch.tensor([[CLS, 5, 6, 7, 8, SEP, PAD]])
ATT = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
SPECIAL = torch.tensor([[True, False, False, False, False, True, True]])
# CLS, SEP and PAD get the largest scores: they must still never be ranked or removed.
SCORES = torch.tensor([[9.0, 3.0, -2.0, 1.0, 2.0, 5.0, 7.0]])
FULL = 0.1 + 2.0 - 1.0 + 0.5 + 1.0  # 2.6
# 4 perturbable tokens: k = max(1, int(4p)) for p = .1 .. .9 -> 1 1 1 1 2 2 2 3 3; ranking 5 > 8 > 7 > 6
K = [1, 1, 1, 1, 2, 2, 2, 3, 3]
REMOVED_SUM = {1: FULL - 2.0, 2: FULL - 2.0 - 1.0, 3: FULL - 2.0 - 1.0 - 0.5}
KEPT_SUM = {1: 0.1 + 2.0, 2: 0.1 + 2.0 + 1.0, 3: 0.1 + 2.0 + 1.0 + 0.5}


def test_comprehensiveness_and_sufficiency_by_hand():
    curves = perturbation_curves(SumModel(), IDS, ATT, SCORES, special_tokens=SPECIAL)
    assert curves.k[0].tolist() == K
    assert curves.target.tolist() == [1]
    comp = [sig(FULL) - sig(REMOVED_SUM[k]) for k in K]
    suff = [sig(FULL) - sig(KEPT_SUM[k]) for k in K]
    torch.testing.assert_close(curves.comprehensiveness[0], torch.tensor(comp), rtol=0, atol=1e-6)
    torch.testing.assert_close(curves.sufficiency[0], torch.tensor(suff), rtol=0, atol=1e-6)
    # sklearn-style trapezoid over [0.1, 0.9] (spacing 0.1), and the normalised one divided by 0.8
    area_comp = 0.1 * (sum(comp) - (comp[0] + comp[-1]) / 2)
    area_suff = 0.1 * (sum(suff) - (suff[0] + suff[-1]) / 2)
    assert curves.comprehensiveness_aopc.item() == pytest.approx(area_comp, abs=1e-6)
    assert curves.sufficiency_aopc.item() == pytest.approx(area_suff, abs=1e-6)
    assert curves.comprehensiveness_aopc_normalised.item() == pytest.approx(area_comp / 0.8, abs=1e-6)
    s = curves.summary()
    assert s["sufficiency_aopc_normalised"] == pytest.approx(area_suff / 0.8, abs=1e-6)


def test_aopc_matches_sklearn_auc():
    from sklearn.metrics import auc

    curve = torch.tensor([0.3, 0.1, 0.5, 0.2, 0.9, 0.4, 0.4, 0.0, 0.7])
    fr = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert aopc(curve).item() == pytest.approx(auc(fr, curve.numpy()), abs=1e-6)
    assert aopc(curve, normalise=True).item() == pytest.approx(auc(fr, curve.numpy()) / 0.8, abs=1e-6)
    with pytest.raises(ValueError, match="increasing"):
        aopc(curve[:2], fractions=[0.5, 0.1])


def test_mask_token_replacement_by_hand():
    curves = perturbation_curves(SumModel(), IDS, ATT, SCORES, special_tokens=SPECIAL, masking="mask_token",
                                 mask_token_id=MASK, fractions=(0.5,))
    # top-2 (tokens 5 and 8) replaced by [MASK] (weight 0.25 each) / all others replaced for sufficiency
    removed = FULL - 2.0 - 1.0 + 2 * 0.25
    kept = 0.1 + 2.0 + 1.0 + 2 * 0.25
    assert curves.comprehensiveness[0, 0].item() == pytest.approx(sig(FULL) - sig(removed), abs=1e-6)
    assert curves.sufficiency[0, 0].item() == pytest.approx(sig(FULL) - sig(kept), abs=1e-6)


def test_batched_with_left_padding_equals_rows_alone_and_accepts_captum_tuples():
    ids2 = torch.tensor([[PAD, PAD, CLS, 8, 6, 5, SEP]])
    att2 = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    special2 = torch.tensor([[True, True, True, False, False, False, True]])
    scores2 = torch.tensor([[100.0, 100.0, 0.0, -1.0, 0.5, 0.2, 0.0]])
    model = SumModel()
    alone = [perturbation_curves(model, IDS, ATT, SCORES, special_tokens=SPECIAL),
             perturbation_curves(model, ids2, att2, scores2, special_tokens=special2)]
    # embedding-level attributions (batch, pos, d) in a Captum-style tuple: summed over d
    emb_attr = torch.cat([SCORES, scores2])[:, :, None].expand(2, 7, 4) / 4
    both = perturbation_curves(model, torch.cat([IDS, ids2]), torch.cat([ATT, att2]), (emb_attr,),
                               special_tokens=torch.cat([SPECIAL, special2]), batch_size=5)
    torch.testing.assert_close(both.comprehensiveness, torch.cat([a.comprehensiveness for a in alone]))
    torch.testing.assert_close(both.sufficiency, torch.cat([a.sufficiency for a in alone]))
    # row 2 by hand at p = 0.9: 3 perturbable tokens, k = int(2.7) = 2: ranking 6 (0.5) > 5 (0.2) > 8
    full2 = 0.1 + 1.0 - 1.0 + 2.0
    assert both.comprehensiveness[1, -1].item() == pytest.approx(sig(full2) - sig(full2 + 1.0 - 2.0), abs=1e-6)


def test_special_tokens_from_a_tokenizer_and_clear_errors():
    class Tok:
        all_special_ids = [PAD, CLS, SEP, MASK]

        def get_special_tokens_mask(self, ids, already_has_special_tokens=False):
            assert already_has_special_tokens
            return [int(i in self.all_special_ids) for i in ids]

    with_tok = perturbation_curves(SumModel(), IDS, ATT, SCORES, tokenizer=Tok())
    with_mask = perturbation_curves(SumModel(), IDS, ATT, SCORES, special_tokens=SPECIAL)
    torch.testing.assert_close(with_tok.comprehensiveness, with_mask.comprehensiveness)
    with pytest.raises(ValueError, match="special_tokens="):
        perturbation_curves(SumModel(), IDS, ATT, SCORES)
    with pytest.raises(ValueError, match=r"^attributions: has shape \(1, 5\) but input_ids has \(1, 7\)\. Attribute the "
                                         r"same batch at the token \(embedding\) level \(the shape is that of the token "
                                         r"scores"):
        perturbation_curves(SumModel(), IDS, ATT, SCORES[:, :5], special_tokens=SPECIAL)
    with pytest.raises(ValueError, match="no perturbable token"):
        top_k_masks(SCORES, torch.zeros_like(SPECIAL))
    with pytest.raises(ValueError, match="mask_token_id"):
        perturbation_curves(SumModel(), IDS, ATT, SCORES, special_tokens=SPECIAL, masking="mask_token")


def test_token_scores_reductions_and_explanation_objects():
    attr = torch.arange(24.0).reshape(2, 3, 4)
    torch.testing.assert_close(token_scores(attr), attr.sum(-1))
    torch.testing.assert_close(token_scores(attr, reduce="mean"), attr.mean(-1))
    torch.testing.assert_close(token_scores(attr, reduce="l2"), attr.norm(dim=-1))

    class Expl:
        input_contributions = attr

    torch.testing.assert_close(token_scores(Expl()), attr.sum(-1))
    with pytest.raises(ValueError, match="tuple of 2"):
        token_scores((attr, attr))


def test_seqpg_score_by_hand():
    # [CLS] a1 a2 [SEP] b1 b2 [SEP]
    seg = torch.zeros(1, 2, 7, dtype=torch.bool)
    seg[0, 0, 1:3] = True
    seg[0, 1, 4:6] = True
    scores = torch.tensor([[1.0, 2.0, -1.0, 0.0, 1.0, 0.0, 0.0],   # for segment a's class: 2 / 4
                           [0.0, -5.0, 0.0, 0.0, 3.0, 1.0, 0.0]])  # for segment b's class: 4 / 4
    assert seqpg_score(scores, seg).tolist() == pytest.approx([0.75])
    # class a: 1 on [CLS], 2 on its segment, 1 on b's; class b: 4 on its segment
    split = seqpg_evidence_split(scores, seg)
    assert split.tolist() == [pytest.approx([(2 / 4 + 4 / 4) / 2, (1 / 4 + 0) / 2, (1 / 4 + 0) / 2])]
    # padding is not evidence: masking b2 leaves class b with 3 of 3 on its segment
    mask = torch.ones(1, 7, dtype=torch.long)
    mask[0, 5] = 0
    assert seqpg_evidence_split(scores, seg, mask)[0, 0].item() == pytest.approx((2 / 4 + 3 / 3) / 2)
    # no positive attribution at all scores 0 for that class
    assert seqpg_score(-scores.abs(), seg).tolist() == [0.0]
    with pytest.raises(ValueError, match="both segment classes"):
        seqpg_score(scores[:1], seg)


class KeywordModel(nn.Module):
    """Class c's logit = 3 x the number of words of class c ('a*' -> 0, 'b*' -> 1, 'c*' -> 2)."""

    def __init__(self, vocab):
        super().__init__()
        table = torch.zeros(len(vocab), 3)
        for word, i in vocab.items():
            if word[0] in "abc" and word[1:].isdigit():
                table[i, "abc".index(word[0])] = 3.0
        self.table = nn.Parameter(table, requires_grad=False)

    def forward(self, input_ids, attention_mask):
        return (self.table[input_ids] * attention_mask[..., None]).sum(1)


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                  cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    return tok, vocab


def test_make_seqpg_examples_selects_confident_correct_segments_and_pairs_classes():
    words = [f"{c}{i}" for c in "abc" for i in range(10)] + ["x"]
    tok, vocab = _word_tokenizer(words)
    texts = [
        "a1 a2 a3 x x",      # class 0, confident
        "a4 x x x x",        # class 0, p = e^3 / (e^3 + 2) = 0.909 < 0.95: not confident enough
        "b1 b2 b3 b4 x",     # class 1, confident
        "b5 b6",             # too short
        "c1 c2 c3 c4 c5",    # class 2, confident
        "a5 a6 a7 a8 x",     # labelled 2 but predicted 0: wrong, dropped
        "b7 b8 b9 x x",      # class 1, confident (less than row 2)
    ]
    labels = [0, 0, 1, 1, 2, 2, 1]
    model = KeywordModel(vocab)
    ex = make_seqpg_examples(model, tok, texts, labels, segment_length=4, n_examples=10, min_confidence=0.95)
    # usable segments: class 0 [0], class 1 [2, 6] (most confident first), class 2 [4]; pairs cycle
    # (0,1) -> rows 0 & 2, (0,2) -> class 0 used up, (1,2) -> rows 6 & 4; then nothing is left to pair
    assert len(ex) == 2
    assert [sorted(r) for r in ex.source_index.tolist()] == [[0, 2], [4, 6]]
    assert ex.input_ids.shape == (2, 2 * 4 + 3)
    for i in range(len(ex)):
        ids = ex.input_ids[i].tolist()
        assert ids[0] == tok.cls_token_id and ids[5] == tok.sep_token_id and ids[10] == tok.sep_token_id
        for s in range(2):
            segment = ex.input_ids[i][ex.segment_masks[i, s]].tolist()
            source = tok(texts[ex.source_index[i, s]], add_special_tokens=False)["input_ids"][:4]
            assert segment == source
            assert labels[ex.source_index[i, s]] == ex.segment_labels[i, s]
        assert ex.segment_labels[i, 0] != ex.segment_labels[i, 1]
    assert (ex.confidence >= 0.95).all()
    # an oracle explanation (the model's own per-token logit contributions) scores 1 on every example
    ids, mask, targets = ex.explanation_batch()
    oracle = model.table[ids].gather(-1, targets[:, None, None].expand(-1, ids.shape[1], 1)).squeeze(-1)
    assert seqpg_score(oracle, ex.segment_masks).tolist() == [1.0, 1.0]
    # a class-agnostic explanation (same for both classes) scores 1/2 when both segments get equal mass
    uniform = ex.segment_masks.any(1).float().repeat_interleave(2, dim=0)
    assert seqpg_score(uniform, ex.segment_masks).tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="segment_length"):
        make_seqpg_examples(model, tok, texts, labels, segment_length=40)



def test_make_seqpg_examples_with_several_models_keeps_segments_every_model_gets_right():
    words = [f"{c}{i}" for c in "abc" for i in range(10)] + ["x"]
    tok, vocab = _word_tokenizer(words)
    texts = ["a1 a2 a3 x x", "b1 b2 b3 b4 x", "c1 c2 c3 c4 c5", "b7 b8 b9 x x"]
    labels = [0, 1, 2, 1]
    first = KeywordModel(vocab)
    second = KeywordModel(vocab)
    with torch.no_grad():
        for word in ("b1", "b2", "b3"):  # the second model sees one class-1 word in row 1: p = 0.909
            second.table[vocab[word]] = 0.0
    alone = make_seqpg_examples(first, tok, texts, labels, segment_length=4, n_examples=10, min_confidence=0.95)
    assert 1 in alone.source_index.flatten().tolist()
    both = make_seqpg_examples([first, second], tok, texts, labels, segment_length=4, n_examples=10,
                               min_confidence=0.95)
    # row 1 fails the second model; (0,1) pairs rows 0 & 3, then classes 0 and 1 are used up
    assert [sorted(r) for r in both.source_index.tolist()] == [[0, 3]]
    p_row3 = math.exp(9) / (math.exp(9) + 2)
    assert both.confidence[both.source_index == 3].item() == pytest.approx(p_row3)

    class TwoClasses(nn.Module):
        def forward(self, input_ids, attention_mask):
            return torch.zeros(input_ids.shape[0], 2)

    with pytest.raises(ValueError, match="number of classes"):
        make_seqpg_examples([first, TwoClasses()], tok, texts, labels, segment_length=4)
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\)"):
        make_seqpg_examples(first, tok, texts, [0, 1, 2, 3], segment_length=4)
    with pytest.raises(ValueError, match="by every model"):
        make_seqpg_examples([first, second], tok, texts[1:2] + texts[3:], [1, 1], segment_length=4)


def test_entropy_and_completeness_error_by_hand():
    scores = torch.tensor([[1.0, -1.0, 0.0, 5.0], [0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    ent = explanation_entropy(scores, mask)
    assert ent.tolist() == pytest.approx([math.log(2), 0.0, 0.0])
    attr = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[1.0, 1.0], [-1.0, 0.0]]])
    explained = torch.tensor([10.0, 2.0])
    assert completeness_error(attr, explained).tolist() == pytest.approx([0.0, 0.5])
    assert completeness_error((attr,), explained, relative=False).tolist() == pytest.approx([0.0, 1.0])


def test_measure_cost_sees_time_and_memory():
    def work():
        big = torch.ones(64 * 2**20 // 4 * 4)  # 256 MiB of float32, touched
        time.sleep(0.05)
        return big.sum().item()

    result, cost = measure_cost(work, device="cpu")
    assert result == 64 * 2**20
    assert cost.seconds >= 0.05
    assert cost.peak_mib > 128
    _, small = measure_cost(lambda: torch.ones(10).sum(), device="cpu")
    assert small.peak_mib < 64


def test_measure_cost_catches_a_spike_too_short_to_sample():
    """With the kernel's high-water mark, a peak that lives for microseconds is still seen, exactly."""
    def spike():
        big = torch.ones(96 * 2**20 // 4)  # 96 MiB, touched and freed at once: no sampler would see it
        return float(big[0])

    _, cost = measure_cost(spike, device="cpu")
    if os.access("/proc/self/clear_refs", os.W_OK):
        assert cost.memory_method == "kernel_high_water_mark"
        assert 90 < cost.peak_mib < 140
    else:
        assert cost.memory_method == "sampled_rss"


def test_measure_cost_falls_back_to_sampling(monkeypatch):
    import bcos_plugins.metrics.summary as summary

    monkeypatch.setattr(summary, "_reset_high_water_mark", lambda: False)

    def work():
        big = torch.ones(64 * 2**20 // 4 * 4)
        time.sleep(0.05)
        return big.sum().item()

    _, cost = measure_cost(work, device="cpu")
    assert cost.memory_method == "sampled_rss"
    assert cost.peak_mib > 128


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "DistilBertForSequenceClassification",
                                  "RobertaForSequenceClassification"])
def test_left_padding_is_refused_for_a_classifier_that_reads_the_first_column(name):
    """BERT, DistilBERT and RoBERTa classify from the first column's hidden state, a padding token's on a left-padded
    row: its full and perturbed probabilities were a padding token's (batch-dependent, silently). The one check of
    explain refuses that batch here too, stock or B-cos; the same rows padded on the right are scored."""
    from conftest import padded_batch, tiny_model

    from bcos_plugins import bcosify

    for model in (tiny_model(name), bcosify(tiny_model(name), verbose=False)):
        ids, mask = padded_batch(side="right")
        special = (mask == 0) | (torch.arange(ids.shape[1]) == 0)
        scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
        curves = perturbation_curves(model, ids, mask, scores, special_tokens=special)
        assert torch.isfinite(curves.comprehensiveness).all() and torch.isfinite(curves.sufficiency).all()
        ids, mask = padded_batch(side="left")
        with pytest.raises(ValueError, match=rf"^attention_mask: rows \[1, 2\] start with padding, and {name} "
                                             r"classifies from the first column.*padding_side = 'right'"):
            perturbation_curves(model, ids, mask, scores, special_tokens=mask == 0)
