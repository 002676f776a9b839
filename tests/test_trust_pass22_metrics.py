"""Trust pass 22, evaluation and vision (helper-144): the faithfulness metrics recomputed by hand in float64 on tiny
models, number by number (rows of different lengths in one batch, tied / all-zero / all-equal / negative scores,
special tokens at both ends, the fraction 1), the B-cos ViT's maps complete for every class, and the metrics given an
explanation made for another model, another mask, other images or the wrong classes: those were scored silently and
are refused now (one test each; the tally is in the CHANGELOG and the session's report).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import TINY_VIT_SHAPE, padded_rows, tiny_model

from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bcos_bert(seed: int = 0) -> torch.nn.Module:
    from bcos_plugins import bcosify

    return bcosify(tiny_model("BertForSequenceClassification", seed=seed), verbose=False).eval().double()


# ------------------------------------------------------------------ perturbation curves against a float64 hand computation


def _curves_by_hand(model, ids, mask, special, scores, fractions):
    """ERASER comprehensiveness / sufficiency of each row alone (its real tokens only), in float64: the top
    ``max(1, floor(n p))`` perturbable tokens by descending score, ties to the earlier position, removed through the
    attention mask (comprehensiveness) or all other perturbable tokens removed (sufficiency)."""
    comp, suff = [], []
    for r in range(ids.shape[0]):
        n = int(mask[r].sum())
        row = ids[r, :n][None]
        perturbable = [i for i in range(n) if not special[r, i]]
        with torch.no_grad():
            full = torch.softmax(model(input_ids=row, attention_mask=torch.ones_like(row)).logits, -1)[0]
        target = int(full.argmax())
        order = sorted(perturbable, key=lambda i: (-float(scores[r, i]), i))
        comp_row, suff_row = [], []
        for p in fractions:
            top = set(order[:max(1, math.floor(len(perturbable) * p + 1e-9))])
            removed = torch.tensor([[0 if i in top else 1 for i in range(n)]])
            kept = torch.tensor([[0 if (i in perturbable and i not in top) else 1 for i in range(n)]])
            with torch.no_grad():
                p_removed = torch.softmax(model(input_ids=row, attention_mask=removed).logits, -1)[0, target]
                p_kept = torch.softmax(model(input_ids=row, attention_mask=kept).logits, -1)[0, target]
            comp_row.append(float(full[target] - p_removed))
            suff_row.append(float(full[target] - p_kept))
        comp.append(comp_row)
        suff.append(suff_row)
    return torch.tensor(comp, dtype=torch.float64), torch.tensor(suff, dtype=torch.float64)


@pytest.mark.parametrize("kind", ["random", "zeros", "equal", "negative", "ties"])
@pytest.mark.parametrize("fractions", [(0.1, 0.3, 0.5, 0.9), (0.5, 1.0)])
def test_perturbation_curves_are_the_float64_hand_computation_of_each_row_alone(kind, fractions):
    from bcos_plugins.metrics import perturbation_curves

    model = tiny_model("BertForSequenceClassification").double()
    ids, mask = padded_rows([7, 4, 9, 3], 9, "right", seed=0)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True  # a [CLS] at the start and a [SEP] at each row's end are never ranked or removed
    special[torch.arange(4), mask.sum(1) - 1] = True
    torch.manual_seed(1)
    scores = {"random": torch.randn(ids.shape, dtype=torch.float64), "zeros": torch.zeros(ids.shape),
              "equal": torch.full(ids.shape, 0.5), "negative": -torch.rand(ids.shape, dtype=torch.float64),
              "ties": torch.tensor([[0.0, 1, 1, 0, 1, 1, 0, 0, 0]] * 4)}[kind]
    curves = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=fractions)
    comp, suff = _curves_by_hand(model, ids, mask, special, scores, fractions)
    # the documented tie order (the earlier position first) is the hand computation's
    torch.testing.assert_close(curves.comprehensiveness, comp, rtol=0, atol=1e-12)
    torch.testing.assert_close(curves.sufficiency, suff, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ perturbation curves: an explanation of other inputs


def test_perturbation_curves_refuse_an_explanation_made_with_another_attention_mask():
    from bcos_plugins import explain
    from bcos_plugins.metrics import perturbation_curves

    model = _bcos_bert()
    ids, mask = padded_rows([7, 5, 9], 9, "right", seed=1)
    special = torch.zeros_like(ids, dtype=torch.bool)
    explanation = explain(model, ids, mask)
    # the padded rows' explanation scored with a mask of ones: its padding ranked and removed as tokens, silently
    with pytest.raises(BcosValueError, match=r"attention_mask: differs from the mask the explanation was made with in "
                                             r"rows \[0, 1\].*explanation\.attention_mask"):
        perturbation_curves(model, ids, torch.ones_like(mask), explanation, special_tokens=special)
    perturbation_curves(model, ids, mask, explanation, special_tokens=special)  # its own mask is taken


def test_perturbation_curves_refuse_an_explanation_made_for_another_model():
    from bcos_plugins import explain
    from bcos_plugins.metrics import perturbation_curves

    model, other = _bcos_bert(seed=0), _bcos_bert(seed=3)
    ids, mask = padded_rows([7, 5, 9], 9, "right", seed=1)
    special = torch.zeros_like(ids, dtype=torch.bool)
    explanation = explain(model, ids, mask)
    with pytest.raises(BcosValueError, match=r"attributions: explains the values .* at rows \[0, 1, 2\], but the model "
                                             r"scored here gives .*made for another model"):
        perturbation_curves(other, ids, mask, explanation, special_tokens=special)
    # the same model in float32 (and a contrastive explanation) is no other model
    contrast = explain(model, ids, mask, target=1, foil=torch.tensor([0, 2, 0]))
    with pytest.raises(BcosValueError, match="made for another model"):
        perturbation_curves(other, ids, mask, contrast, special_tokens=special)
    perturbation_curves(model.float(), ids, mask, contrast, special_tokens=special)
    perturbation_curves(model, ids, mask, explanation, special_tokens=special)


# ------------------------------------------------------------------ SeqPG: one class explained for both segments


def _seqpg_batch():
    ids = torch.tensor([[1, 5, 6, 7, 2, 8, 9, 10, 2], [1, 11, 12, 13, 2, 14, 15, 16, 2]])
    segments = torch.zeros(2, 2, 9, dtype=torch.bool)
    segments[:, 0, 1:4] = True
    segments[:, 1, 5:8] = True
    return ids, segments, torch.tensor([[0, 1], [2, 0]])


def test_seqpg_score_of_an_explanation_batch_is_the_hand_share_of_positive_evidence():
    from bcos_plugins import explain
    from bcos_plugins.metrics import seqpg_score

    model = _bcos_bert()
    ids, segments, labels = _seqpg_batch()
    rows = ids.repeat_interleave(2, 0)
    explanation = explain(model, rows, torch.ones_like(rows), target=labels.reshape(-1))
    positive = explanation.contributions.double().clamp_min(0).reshape(2, 2, 9)
    by_hand = ((positive * segments).sum(-1) / positive.sum(-1)).mean(1)
    torch.testing.assert_close(seqpg_score(explanation, segments), by_hand, rtol=1e-12, atol=0)


def test_seqpg_score_refuses_an_explanation_of_one_class_for_both_segments():
    from bcos_plugins import explain
    from bcos_plugins.metrics import seqpg_evidence_split, seqpg_score

    model = _bcos_bert()
    ids, segments, _ = _seqpg_batch()
    rows = ids.repeat_interleave(2, 0)
    # explained without the segment classes: each row's predicted class, the same for both segments (scored 0.14 and
    # 0.15 for the right explanations' 0.18 and 0.19, silently)
    predicted = explain(model, rows, torch.ones_like(rows))
    for metric in (seqpg_score, seqpg_evidence_split):
        with pytest.raises(BcosValueError, match=r"attributions: explain the same class .* for both segments of "
                                                 r"examples \[0, 1\].*segment_labels"):
            metric(predicted, segments)
    # rows that are not each example twice in a row
    apart = explain(model, torch.cat([ids, ids]), torch.ones_like(rows), target=torch.tensor([0, 2, 1, 0]))
    with pytest.raises(BcosValueError, match=r"rows 2i and 2i \+ 1 explain different input_ids at examples \[0, 1\]"):
        seqpg_score(apart, segments)


# ------------------------------------------------------------------ images: completeness, other images, another model


def _vit(seed: int = 0, **options):
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(seed)
    return BcosViT(BcosViTConfig(**{**TINY_VIT_SHAPE, **options}, b=2.0, max_out=2, logit_scale=10.0)).eval()


@pytest.mark.parametrize("prior", ["none", "additive", "multiplicative"])
@pytest.mark.parametrize("position_embedding", [False, True])
def test_image_explanations_of_every_class_sum_to_the_models_logit(prior, position_embedding):
    from bcos_plugins.vision import explain_image

    model = _vit(attention_prior=prior, position_embedding=position_embedding).double()
    torch.manual_seed(2)
    images = torch.rand(2, 1, 16, 16, dtype=torch.float64)
    logits = model(images).logits
    for c in range(logits.shape[1]):
        explanation = explain_image(model, images, target=c)
        total = explanation.contributions.sum((1, 2)) + explanation.position_contributions
        torch.testing.assert_close(total, logits[:, c], rtol=1e-12, atol=1e-14)
        alone = explain_image(model, images[1:], target=c)  # batch 1 is the row of the batch
        torch.testing.assert_close(alone.contributions[0], explanation.contributions[1], rtol=1e-12, atol=1e-15)


def test_pixel_perturbation_refuses_an_explanation_of_other_images():
    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.vision import attribution_input, explain_image

    model = _vit()
    torch.manual_seed(3)
    images, others = torch.rand(2, 1, 16, 16), torch.rand(2, 1, 16, 16)
    explanation = explain_image(model, images, target=torch.tensor([1, 2]))
    encoded, forward = attribution_input(model, images)
    encoded_others, _ = attribution_input(model, others)
    for inputs, fwd in ((encoded_others, forward), (others, lambda p: model(p).logits)):  # encoded or pixels
        with pytest.raises(BcosValueError, match=r"inputs: are not the images the explanation was made of \(rows "
                                                 r"\[0, 1\] differ\)"):
            pixel_perturbation(fwd, inputs, explanation, torch.tensor([1, 2]))
    pixel_perturbation(forward, encoded, explanation, torch.tensor([1, 2]))
    pixel_perturbation(lambda p: model(p).logits, images, explanation, torch.tensor([1, 2]))


def test_pixel_perturbation_refuses_an_explanation_made_for_another_model():
    from bcos_plugins.metrics import pixel_perturbation
    from bcos_plugins.vision import attribution_input, explain_image

    model, other = _vit(seed=0), _vit(seed=5)
    torch.manual_seed(3)
    images = torch.rand(2, 1, 16, 16)
    explanation = explain_image(model, images, target=torch.tensor([1, 2]))
    encoded, _ = attribution_input(model, images)
    with pytest.raises(BcosValueError, match=r"attributions: explains the values .* at rows \[0, 1\], but the model "
                                             r"scored here gives .*made for another model"):
        pixel_perturbation(lambda e: other(encoded_pixel_values=e).logits, encoded, explanation, torch.tensor([1, 2]))


# ------------------------------------------------------------------ explain_dataset: a text longer than max_length


def test_explain_dataset_marks_and_names_the_texts_it_truncated():
    import transformers as T
    from test_pretrain import word_tokenizer

    from bcos_plugins import bcosify
    from bcos_plugins.corpus import explain_dataset

    tok = word_tokenizer()
    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(T.BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, num_labels=3)), verbose=False).eval()
    texts = ["w1 w2 w3 w4 w5 w6 w7 w8", "w4", "w5 w6 w7 w8"]
    # the first text was explained as its first 4 words and nothing in the result or on screen said so
    with pytest.warns(UserWarning, match=r"explain_dataset: 1 text\(s\) \[0\] have more than max_length=4 tokens: "
                                         r"each is explained as the first tokens the tokenizer kept"):
        data = explain_dataset(model, tok, texts, max_length=4, batch_size=2, progress=False)
    assert data["truncated"] == [True, False, False]
    assert data["tokens"][0] == ["w1", "w2", "w3", "w4"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing cut, nothing said
        whole = explain_dataset(model, tok, texts, max_length=8, progress=False)
    assert whole["truncated"] == [False, False, False]


# ------------------------------------------------------------------ rationale metrics: ties, by hand and against sklearn


def test_rationale_metrics_with_tied_scores_are_the_hand_and_sklearn_values():
    from sklearn.metrics import average_precision_score

    from bcos_plugins.metrics import average_precision, top_k_iou

    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(-2, 3, (64, 8), generator=generator).double()  # five values over eight tokens: many ties
    gold = torch.randint(0, 2, (64, 8), generator=generator)
    valid = torch.randint(0, 2, (64, 8), generator=generator)
    iou, ap = top_k_iou(scores, gold, valid), average_precision(scores, gold, valid)
    for r in range(64):
        kept = [i for i in range(8) if valid[r, i]]
        rationale = {i for i in kept if gold[r, i]}
        if not rationale:
            assert math.isnan(iou[r]) and math.isnan(ap[r])
            continue
        # the documented tie order: the earlier token first
        top = set(sorted(kept, key=lambda i: (-float(scores[r, i]), i))[:len(rationale)])
        assert float(iou[r]) == pytest.approx(len(top & rationale) / len(top | rationale), abs=1e-7)
        # tied scores form one threshold, as scikit-learn's average precision takes them
        reference = average_precision_score([int(i in rationale) for i in kept], scores[r, kept].numpy())
        assert float(ap[r]) == pytest.approx(reference, abs=1e-6)


# ------------------------------------------------------------------ an image explanation's scores are its pixels'


def test_explanation_entropy_of_an_image_explanation_is_that_of_its_pixels():
    from bcos_plugins.metrics import explanation_entropy, token_scores
    from bcos_plugins.vision import explain_image

    model = _vit().double()
    torch.manual_seed(4)
    explanation = explain_image(model, torch.rand(2, 1, 16, 16, dtype=torch.float64), target=0)
    pixels = explanation.contributions.flatten(1)  # (batch, H * W), row by row
    torch.testing.assert_close(token_scores(explanation), pixels, rtol=1e-12, atol=1e-15)
    share = pixels.abs() / pixels.abs().sum(1, keepdim=True)
    by_hand = -(share * share.log()).nansum(1)
    # the encoded channels were read as the tokens: the entropy of two channel sums, 0.66 for the pixels' 5.17
    torch.testing.assert_close(explanation_entropy(explanation), by_hand, rtol=1e-12, atol=0)
    channels = explanation.input_contributions.flatten(2).norm(dim=1)  # l2 over the encoded channels, per pixel
    torch.testing.assert_close(token_scores(explanation, reduce="l2"), channels, rtol=1e-12, atol=1e-15)


def test_perturbation_curves_of_a_direction_explanation_need_the_class_to_track():
    from bcos_plugins import explain
    from bcos_plugins.attribution import Direction
    from bcos_plugins.metrics import perturbation_curves

    model = _bcos_bert()
    ids, mask = padded_rows([7, 5, 9], 9, "right", seed=1)
    special = torch.zeros_like(ids, dtype=torch.bool)
    explanation = explain(model, ids, mask, target=Direction(torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)))
    # a direction's explanation was scored on each row's predicted class, silently
    with pytest.raises(BcosValueError, match=r"target: is missing and the explanation explains a Direction, not a "
                                             r"class.*Pass target="):
        perturbation_curves(model, ids, mask, explanation, special_tokens=special)
    curves = perturbation_curves(model, ids, mask, explanation, special_tokens=special, target=0)
    assert curves.target.tolist() == [0, 0, 0]


def test_perturbation_curves_refuse_an_explanation_made_with_other_forward_keywords():
    from bcos_plugins import explain
    from bcos_plugins.metrics import perturbation_curves

    model = _bcos_bert()
    ids, mask = padded_rows([7, 5, 9], 9, "right", seed=1)
    special = torch.zeros_like(ids, dtype=torch.bool)
    segments = torch.ones_like(ids)
    explanation = explain(model, ids, mask, token_type_ids=segments)
    # explained with token_type_ids of 1, scored without them (as segment 0): other logits, scored silently
    with pytest.raises(BcosValueError, match=r"made for another model \(or with other inputs to it, e\.g\. "
                                             r"token_type_ids\).*passing the keywords it was explained with"):
        perturbation_curves(model, ids, mask, explanation, special_tokens=special)
    perturbation_curves(model, ids, mask, explanation, special_tokens=special, token_type_ids=segments)
