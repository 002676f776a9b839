"""Trust pass 25, evaluation (helper-196): the rank metrics given candidates by hand for a causal explanation at an
earlier position, shares written in float32 (fractions and top-k), and the other unusual inputs of the area, each
checked against a hand computation (one test per finding; the tally is in the CHANGELOG and the session's report).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import transformers as T
from conftest import padded_rows, tiny_config

from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _bcos_bert(num_labels: int = 3, problem_type: str | None = None):
    from bcos_plugins import bcosify

    torch.manual_seed(0)
    config = tiny_config("bert", num_labels=num_labels)
    config.problem_type = problem_type
    return bcosify(T.BertForSequenceClassification(config), verbose=False).eval().double()


def _bcos_llama():
    from bcos_plugins import bcosify

    torch.manual_seed(0)
    return bcosify(T.LlamaForCausalLM(tiny_config("llama")), verbose=False).eval().double()


def _rows_after_a_cls(lengths=(7, 5), width: int = 8):
    """A right-padded batch whose first column is a special token (never ranked or removed)."""
    ids, mask = padded_rows(list(lengths), width, "right", seed=0)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    return ids, mask, special


# ------------------------------------------------------------------ candidates by hand for a causal explanation


def test_rank_metrics_refuse_candidates_by_hand_that_the_explained_output_does_not_see():
    """Note 25's "possibly silent": ``explain(lm, ..., position=3)`` explains the output at column 3, which a causal
    model computes from columns 0-3 alone. Without ``candidates`` the rank metrics rank those (pass 24), but candidates
    given by hand (the real tokens without BOS, as a researcher writes them) were used as given: the tokens after the
    position (contribution exactly 0) ranked above every token of negative score, a reciprocal rank of 1/7 where the
    prefix alone gives 1/4, silently. Now such candidates (and ``valid_mask`` of the rationale metrics) are refused,
    naming the columns and the fix; candidates inside the prefix are taken and rank as the prefix alone."""
    from bcos_plugins import explain
    from bcos_plugins.metrics import (
        average_precision,
        mean_reciprocal_rank,
        rationale_alignment,
        reciprocal_rank,
        top_k_iou,
    )

    lm = _bcos_llama()
    ids, mask = padded_rows([8, 8], 8, "right", seed=3)
    position, target, foil = torch.tensor([3, 4]), torch.tensor([5, 6]), torch.tensor([7, 8])
    explanation = explain(lm, ids, mask, target=target, foil=foil, position=position)
    evidence = torch.zeros_like(ids, dtype=torch.bool)
    evidence[0, 2] = evidence[1, 3] = True
    by_hand = mask.bool().clone()
    by_hand[:, 0] = False  # every real token but the first (a BOS), as the decoder batches mark them
    fix = r"Leave candidates out .* candidates & \(torch.arange\(8\)\[None, :\] <= explanation.position\[:, None\]\)"
    for metric in (reciprocal_rank, mean_reciprocal_rank):
        with pytest.raises(BcosValueError, match=r"^candidates: marks tokens after the explained position in rows "
                                                 r"\[0, 1\] \(row 0: columns \[4, 5, 6, 7\], explained at 3\).*" + fix):
            metric(explanation, evidence, by_hand)
    for metric in (top_k_iou, average_precision, rationale_alignment):
        with pytest.raises(BcosValueError, match=r"^valid_mask: marks tokens after the explained position"):
            metric(explanation, evidence.long(), by_hand)
    # the fix the message names: the same candidates up to each row's position, ranked as the prefix alone
    seen = by_hand & (torch.arange(8)[None, :] <= explanation.position[:, None])
    rr = reciprocal_rank(explanation, evidence, seen)
    for row in range(2):
        end = int(position[row]) + 1
        prefix = ids[row:row + 1, :end]
        alone = explain(lm, prefix, torch.ones_like(prefix), target=target[row], foil=foil[row]).contributions[0, 1:]
        at = int(evidence[row, 1:end].nonzero())
        hand = 1.0 / (1 + int((alone > alone[at]).sum()))  # BOS left out, as by_hand leaves it out
        assert float(rr[row]) == pytest.approx(hand, abs=1e-12)
    assert float(rr[1]) == 0.25  # the evidence ranks 4th of the 4 candidates column 4 sees (it read 1/7)
    assert mean_reciprocal_rank(explanation, evidence, seen).mrr == pytest.approx(float(rr.mean()), abs=1e-12)
    assert top_k_iou(explanation, evidence.long(), seen, k=0.5).shape == (2,)
    # a tensor of scores does not say what it explains: its candidates are taken as given, as before
    assert reciprocal_rank(explanation.contributions, evidence, by_hand).shape == (2,)


# ------------------------------------------------------------------ shares written in float32


@pytest.mark.parametrize("k", [torch.tensor(0.7), np.float32(0.7), torch.tensor(0.7, dtype=torch.bfloat16)])
def test_top_k_iou_reads_a_float32_share_as_the_decimal_it_stands_for(k):
    """``top_k_iou(k=0.7)`` takes 7 of 10 valid tokens; the same share as a float32 tensor or NumPy scalar (a value
    read from a config array, or ``torch.tensor(0.7)``) is 0.69999999 and took 6, an IoU of 0.857 for 1.0, silently.
    A share in a dtype narrower than float64 is now read to the decimals that dtype holds."""
    from bcos_plugins.metrics import top_k_iou

    scores = torch.arange(10, dtype=torch.float64)[None]
    gold = torch.tensor([[0] * 3 + [1] * 7])  # the 7 highest-scoring tokens
    assert float(top_k_iou(scores, gold, k=0.7)[0]) == 1.0  # 7 of 10, by hand
    assert float(top_k_iou(scores, gold, k=k)[0]) == 1.0
    assert float(top_k_iou(scores, gold, k=torch.tensor(0.6))[0]) == pytest.approx(6 / 7)  # 6 of them: 6 / 7, by hand


# ------------------------------------------------------------------ SeqPG: a NaN at a padding position


def test_seqpg_score_ignores_a_nan_at_a_padding_position_as_the_entropy_does():
    """Attributions with NaN at padding positions (a padding token's NaN embedding through Captum's methods) were
    refused by ``seqpg_score`` as "contain NaN or inf in rows [0, 1]" although ``attention_mask`` was given and the
    score ignores padding; ``explanation_entropy`` takes them. They are zeroed with the rest of the padding first now,
    and score as the attributions without them; a NaN at a real token is still refused."""
    from bcos_plugins.metrics import explanation_entropy, seqpg_evidence_split, seqpg_score

    segments = torch.zeros(1, 2, 6, dtype=torch.bool)
    segments[0, 0, 1:3] = True
    segments[0, 1, 3:5] = True
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])  # one padding position at the end
    clean = torch.tensor([[0.5, 2.0, 1.0, 1.0, -1.0, 0.0], [0.0, 1.0, -2.0, 3.0, 1.0, 0.0]], dtype=torch.float64)
    # by hand: row 0 (segment 0's class) 3 of 4.5 positive on segment 0; row 1 (segment 1's) 4 of 5 on segment 1
    hand = (3.0 / 4.5 + 4.0 / 5.0) / 2
    assert float(seqpg_score(clean, segments, mask)[0]) == pytest.approx(hand, abs=1e-12)
    broken = clean.clone()
    broken[:, 5] = float("nan")
    assert float(seqpg_score(broken, segments, mask)[0]) == pytest.approx(hand, abs=1e-12)
    torch.testing.assert_close(seqpg_evidence_split(broken, segments, mask), seqpg_evidence_split(clean, segments, mask))
    assert float(seqpg_score((broken[..., None].expand(2, 6, 3) / 3,), segments, mask)[0]) == pytest.approx(hand)
    assert torch.isfinite(explanation_entropy(broken, mask.repeat(2, 1))).all()  # the rule the entropy had
    real = clean.clone()
    real[0, 2] = float("nan")
    with pytest.raises(BcosValueError, match="contain NaN or inf in row"):
        seqpg_score(real, segments, mask)


# ------------------------------------------------------------------ rank metrics given Captum's attributions


def test_rank_metrics_read_captums_embedding_attributions_as_the_other_metrics_do():
    """Captum's attributions at the embeddings, ``(batch, pos, d)`` or its one-input tuple, are read by every metric
    as token scores summed over ``d`` (``token_scores``), but the rank metrics refused them: "must have 2 dimensions
    (batch, pos) ... Reshape it" and "got tuple. Pass a torch.Tensor", naming neither the reading nor the fix. They
    read them now, as their sums over ``d`` by hand."""
    from bcos_plugins.metrics import (
        average_precision,
        mean_reciprocal_rank,
        rationale_alignment,
        reciprocal_rank,
        top_k_iou,
    )

    attributions = torch.randn(3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    summed = attributions.sum(-1)
    evidence = torch.zeros(3, 6, dtype=torch.bool)
    evidence[0, 1] = evidence[1, 4] = evidence[2, 0] = evidence[2, 5] = True
    candidates = torch.ones(3, 6, dtype=torch.bool)
    candidates[:, 3] = False
    for given in (attributions, (attributions,), (summed,)):
        rr = reciprocal_rank(given, evidence, candidates)
        for row in range(3):  # by hand: 1 / (1 + the candidates scored above the best evidence token)
            best = summed[row][evidence[row]].max()
            assert float(rr[row]) == 1.0 / (1 + int(((summed[row] > best) & candidates[row]).sum()))
        assert mean_reciprocal_rank(given, evidence, candidates).mrr == pytest.approx(float(rr.mean()), abs=1e-15)
        torch.testing.assert_close(top_k_iou(given, evidence.long(), candidates),
                                   top_k_iou(summed, evidence.long(), candidates), rtol=0, atol=0)
        torch.testing.assert_close(average_precision(given, evidence.long()), average_precision(summed, evidence.long()),
                                   rtol=0, atol=0)
        assert rationale_alignment(given, evidence.long()).auprc == rationale_alignment(summed, evidence.long()).auprc
    # a NaN at a token that is no candidate (a padding token's, through Captum's methods) is left out, as in (batch, pos)
    broken = attributions.clone()
    broken[:, 3] = float("nan")
    torch.testing.assert_close(reciprocal_rank(broken, evidence, candidates), reciprocal_rank(summed, evidence, candidates),
                               rtol=0, atol=0)
    torch.testing.assert_close(top_k_iou((broken,), evidence.long(), candidates),
                               top_k_iou(summed, evidence.long(), candidates), rtol=0, atol=0)


# ------------------------------------------------------------------ paired accuracy: names and scores for class ids


def test_paired_accuracy_difference_names_class_names_and_scores_given_for_class_ids():
    """Predictions written as class names (a pipeline's labels) were refused as "got list. Pass a torch.Tensor", and
    scores (probabilities, logits) as "must be an integer tensor ... Convert it (e.g. .long())": that fix truncates a
    probability of 0.7 to class 0, and the comparison is then of other predictions, silently. Both are named now with
    the fix that keeps the predictions (label2id, argmax); whole-number floats keep the ``.long()`` fix, which is right
    for them, and the ids the fixes give score as by hand."""
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.metrics import paired_accuracy_difference

    labels = [1, 0, 0, 1]
    with pytest.raises(BcosTypeError, match=r"^predictions_a: holds class names \('POSITIVE'\), not class ids\. Map "
                                            r"them to ids with the model's config.label2id"):
        paired_accuracy_difference(["POSITIVE", "NEGATIVE", "POSITIVE", "POSITIVE"], [1, 0, 0, 1], labels)
    with pytest.raises(BcosTypeError, match=r"^labels: holds class names \('1'\).*\[int\(n\) for n in names\]"):
        paired_accuracy_difference([1, 0, 1, 1], [1, 0, 0, 1], ["1", "0", "0", "1"])
    probabilities = torch.tensor([0.7, 0.2, 0.9, 0.6])
    with pytest.raises(BcosTypeError, match=r"^predictions_a: holds scores \(0\.7\), not class ids.*\(p > 0\.5\)\.long"
                                            r"\(\).*\.long\(\) alone would truncate"):
        paired_accuracy_difference(probabilities, [1, 0, 0, 1], labels)
    logits = torch.tensor([[0.1, 2.0], [1.5, -0.5], [0.3, 0.2], [-1.0, 1.0]])
    with pytest.raises(BcosTypeError, match=r"^predictions_b: holds scores .*logits.argmax\(-1\)"):
        paired_accuracy_difference([1, 0, 1, 1], logits, labels)
    with pytest.raises(BcosTypeError, match=r"^labels: must be an integer tensor.*\.long\(\)"):
        paired_accuracy_difference([1, 0, 1, 1], [1, 0, 0, 1], [1.0, 0.0, 0.0, 1.0])
    # the fixes named: 3 of 4 right for a (row 2 wrong), 4 of 4 for b, by hand
    result = paired_accuracy_difference((probabilities > 0.5).long(), logits.argmax(-1), labels)
    assert result.accuracy_a == (0.75,) and result.accuracy_b == (1.0,)


@pytest.mark.parametrize("make", [lambda f: torch.tensor(f), lambda f: np.array(f, dtype=np.float32),
                                  lambda f: torch.tensor(f, dtype=torch.bfloat16)])
def test_perturbation_metrics_read_float32_fractions_as_the_decimals_they_stand_for(make):
    """``fractions=torch.tensor(DEFAULT_FRACTIONS)`` (float32, as ``torch.linspace(0.1, 0.9, 9)`` too) holds 0.7 as
    0.69999999: a row of 10 perturbable tokens had 6 removed at p = 0.7 for 7 (``max(1, int(10 * p))``), the curves and
    AOPC of other removals, and pixel perturbation removed 69 of 100 pixels for 70, silently. Fractions in a dtype
    narrower than float64 are read to the decimals it holds now: the counts, curves and areas of the fractions as
    written."""
    from bcos_plugins import explain
    from bcos_plugins.metrics import DEFAULT_FRACTIONS, aopc, perturbation_curves, pixel_perturbation

    model = _bcos_bert()
    ids, mask, special = _rows_after_a_cls((11, 6), 11)
    explanation = explain(model, ids, mask)
    written = perturbation_curves(model, ids, mask, explanation, special_tokens=special)
    given = perturbation_curves(model, ids, mask, explanation, special_tokens=special, fractions=make(DEFAULT_FRACTIONS))
    assert written.k[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # 10 perturbable tokens, by hand
    assert given.k.tolist() == written.k.tolist() and given.fractions == DEFAULT_FRACTIONS
    torch.testing.assert_close(given.comprehensiveness, written.comprehensiveness, rtol=0, atol=0)
    assert given.summary() == written.summary()
    curve = torch.rand(2, 9, dtype=torch.float64)
    torch.testing.assert_close(aopc(curve, make(DEFAULT_FRACTIONS)), aopc(curve, DEFAULT_FRACTIONS), rtol=0, atol=0)

    def forward(images):  # two logits: the sum of the first 31 pixels, and its negative
        first = images.flatten(1)[:, :31].sum(-1, keepdim=True)
        return torch.cat([first, -first], dim=-1)

    images = torch.ones(1, 1, 10, 10, dtype=torch.float64)
    maps = -torch.arange(100, dtype=torch.float64).reshape(1, 10, 10)  # pixel 0 ranks first, pixel 99 last
    # by hand at 0.7, 70 pixels: least important first removes pixels 30-99 and keeps 0-29 (logit 30; 69 removed kept
    # pixel 30 too: 31); most important first removes pixels 0-69 (logit 0)
    result = pixel_perturbation(forward, images, maps, 0, fractions=make([0.0, 0.7]), score="logit")
    assert result.fractions == (0.0, 0.7)
    assert result.least_first[0].tolist() == [31.0, 30.0] and result.most_first[0].tolist() == [31.0, 0.0]


# ------------------------------------------------------------------ perturbation curves: regression heads, padding, length


def test_perturbation_curves_of_a_regression_head_track_the_predicted_value():
    """A regression head (``num_labels=1``, ``config.problem_type="regression"``, which transformers also sets when a
    one-logit model is trained on float labels) predicts a value, not a class. Its softmax was refused with the fix
    ``probability='sigmoid'``, which squashes the value (a drop of 0.3 in a value of 3 read 0.01) and tracks no quantity
    the head predicts. Such a head's curves now track the value itself by default (``probability="logit"``, also
    selectable for any model), by hand; a one-logit classifier without that problem type keeps the refusal, which now
    names both fixes."""
    from bcos_plugins import explain
    from bcos_plugins.metrics import perturbation_curves

    model = _bcos_bert(num_labels=1, problem_type="regression")
    ids, mask, special = _rows_after_a_cls()
    explanation = explain(model, ids, mask)
    curves = perturbation_curves(model, ids, mask, explanation, special_tokens=special, fractions=(0.5,))
    # by hand, row 0 alone: 6 perturbable tokens, the top 3 by contribution removed through the attention mask
    row = ids[:1, :7]
    top = explanation.contributions[0, 1:7].argsort(descending=True, stable=True)[:3] + 1
    kept = torch.ones_like(row)
    kept[0, top] = 0
    with torch.no_grad():
        full = model(input_ids=row, attention_mask=torch.ones_like(row)).logits[0, 0]
        removed = model(input_ids=row, attention_mask=kept).logits[0, 0]
    assert float(curves.full_probability[0]) == pytest.approx(float(full), abs=1e-12)
    assert float(curves.comprehensiveness[0, 0]) == pytest.approx(float(full - removed), abs=1e-12)
    explicit = perturbation_curves(model, ids, mask, explanation, special_tokens=special, fractions=(0.5,),
                                   probability="logit")
    torch.testing.assert_close(explicit.comprehensiveness, curves.comprehensiveness, rtol=0, atol=0)
    model.config.problem_type = None  # a one-logit classifier of unknown kind: its softmax is refused, both fixes named
    with pytest.raises(BcosValueError, match=r"Pass probability='sigmoid' for a binary classifier with one logit, or "
                                             r"probability='logit' for a regression head"):
        perturbation_curves(model, ids, mask, explanation.contributions, special_tokens=special, fractions=(0.5,))


def test_perturbation_curves_ignore_a_nan_at_padding_and_name_ids_longer_than_the_position_table():
    """Attributions with NaN at the padding (never ranked or removed; a padding token's NaN embedding through Captum's
    methods) were refused as "contain NaN or inf in row [1]", where the entropy and now SeqPG take them: they score as
    the attributions without them now. Ids longer than the model's position table failed inside it with torch's "index
    40 is out of bounds for dimension 1"; they are refused naming ``input_ids``, the limit and the fix, as ``explain``
    refuses them."""
    from bcos_plugins.metrics import perturbation_curves

    model = _bcos_bert()
    ids, mask, special = _rows_after_a_cls()
    scores = torch.randn(2, 8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    scores[~mask.bool()] = 0.0
    broken = scores.clone()
    broken[1, 6] = float("nan")  # row 1's padding
    clean = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=(0.2, 0.5))
    taken = perturbation_curves(model, ids, mask, (broken,), special_tokens=special, fractions=(0.2, 0.5))
    torch.testing.assert_close(taken.comprehensiveness, clean.comprehensiveness, rtol=0, atol=0)
    torch.testing.assert_close(taken.sufficiency, clean.sufficiency, rtol=0, atol=0)
    broken[1, 2] = float("nan")  # a real token's
    with pytest.raises(BcosValueError, match=r"attributions: contain NaN or inf in row \[1\]"):
        perturbation_curves(model, ids, mask, broken, special_tokens=special, fractions=(0.5,))
    long = torch.randint(1, 50, (2, 44))
    with pytest.raises(BcosValueError, match=r"^input_ids: has 44 positions but the model has only 40 "
                                             r"\(config.max_position_embeddings.*Truncate the inputs to 40 tokens"):
        perturbation_curves(model, long, torch.ones_like(long), torch.randn(2, 44), special_tokens=torch.zeros_like(
            long, dtype=torch.bool), fractions=(0.5,))


# ------------------------------------------------------------------ next-token contrast with foil == target


def test_next_token_contrast_warns_of_rows_whose_foil_is_their_target():
    """``explain(..., foil=target)`` warns (its explanation is all zeros), but ``next_token_contrast`` with a foil equal
    to a row's target (a hand-made minimal pair whose continuations share their first token) scored that row 0 and
    counted it as wrong in the accuracy, silently. It warns now through the same check, naming the rows, and the
    numbers stay the hand computation (difference 0; the other rows as alone)."""
    from bcos_plugins.metrics import next_token_contrast

    lm = _bcos_llama()
    ids, mask = padded_rows([6, 4, 8], 8, "left", seed=2)
    target, foil = torch.tensor([5, 6, 7]), torch.tensor([8, 6, 10])
    with pytest.warns(UserWarning, match=r"foil: equals target in row \[1\] \(output id 6\), so the logit difference "
                                         r"is 0 there, the row counts as wrong in accuracy"):
        result = next_token_contrast(lm, ids, mask, target=target, foil=foil)
    assert float(result.logit_difference[1]) == 0.0 and float(result.probability_gap[1]) == 0.0
    keep = mask[0].bool()
    with torch.no_grad():
        logits = lm(input_ids=ids[:1, keep]).logits[0, -1]
    assert float(result.logit_difference[0]) == pytest.approx(float(logits[5] - logits[8]), abs=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # distinct ids: no warning
        next_token_contrast(lm, ids, mask, target=target, foil=torch.tensor([8, 9, 10]))


def test_perturbation_curves_concatenate_only_curves_of_one_tracked_value():
    """``PerturbationCurves.concatenate`` joined curves of the softmax probability with curves of the sigmoid (a
    multi-label model's default, next to the same model's curves with ``probability="softmax"``) and now of a logit,
    and ``summary()`` averaged drops of different quantities, silently. The curves say what they track
    (``probability``) and mixed kinds are refused; one kind concatenates and keeps it."""
    from bcos_plugins import explain
    from bcos_plugins.metrics import PerturbationCurves, perturbation_curves

    model = _bcos_bert(num_labels=4, problem_type="multi_label_classification")
    ids, mask, special = _rows_after_a_cls()
    explanation = explain(model, ids, mask, target=torch.tensor([1, 2]))
    sigmoid = perturbation_curves(model, ids, mask, explanation, special_tokens=special, fractions=(0.5,))
    softmax = perturbation_curves(model, ids, mask, explanation, special_tokens=special, fractions=(0.5,),
                                  probability="softmax")
    assert (sigmoid.probability, softmax.probability) == ("sigmoid", "softmax")
    with torch.no_grad():  # by hand: the sigmoid of the class logit on the unperturbed batch
        logits = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(sigmoid.full_probability, logits[[0, 1], [1, 2]].sigmoid(), rtol=0, atol=1e-12)
    with pytest.raises(BcosValueError, match=r"^parts: mix curves of different tracked values \['sigmoid', "
                                             r"'softmax'\]"):
        PerturbationCurves.concatenate([sigmoid, softmax])
    joined = PerturbationCurves.concatenate([sigmoid, sigmoid])
    assert joined.probability == "sigmoid" and joined.comprehensiveness.shape == (4, 1)


def test_rank_metrics_of_a_causal_explanation_made_without_a_mask_rank_only_the_tokens_it_sees():
    """Pass 24 made the rank metrics leave out the tokens after a causal explanation's ``position``, through the
    explanation's ``attention_mask``; an explanation of an unpadded batch made without one (``explain(lm, ids,
    position=3)``) kept them: a reciprocal rank of 1/7 for the prefix's 1/4 and a top-50 % IoU of 0.25 for 0, silently.
    Now it ranks the tokens the output sees, as the same explanation made with a mask of ones."""
    from bcos_plugins import explain
    from bcos_plugins.metrics import mean_reciprocal_rank, reciprocal_rank, top_k_iou

    lm = _bcos_llama()
    ids, mask = padded_rows([8, 8], 8, "right", seed=3)
    assert bool(mask.all())
    keywords = dict(target=torch.tensor([5, 6]), foil=torch.tensor([7, 8]), position=torch.tensor([3, 4]))
    unmasked, masked = explain(lm, ids, **keywords), explain(lm, ids, mask, **keywords)
    assert unmasked.attention_mask is None
    evidence = torch.zeros_like(ids, dtype=torch.bool)
    evidence[0, 2] = evidence[1, 3] = True
    rr = reciprocal_rank(unmasked, evidence)
    torch.testing.assert_close(rr, reciprocal_rank(masked, evidence), rtol=0, atol=0)
    assert float(rr[1]) == 0.25  # 4th of the 5 tokens column 4 sees (it read 1/7), pass 24's hand value
    assert mean_reciprocal_rank(unmasked, evidence).random == mean_reciprocal_rank(masked, evidence).random
    torch.testing.assert_close(top_k_iou(unmasked, evidence.long(), k=0.5), top_k_iou(masked, evidence.long(), k=0.5),
                               rtol=0, atol=0)


# ------------------------------------------------------------------ explain_dataset: the explained position of each row


@pytest.mark.parametrize("side", ["right", "left"])
def test_explain_dataset_says_each_texts_explained_position(side):
    """``explain_dataset(lm, tok, texts, position=1)`` explains each text's second token; a causal LM's scores after it
    are exactly 0 (its output does not see those tokens), but the table did not say which token was explained, so its
    rows, padded with the mask of their tokens as the metrics' refusal of a table says, ranked those tokens as tokens
    of score 0 (an MRR of 1/6 for 1/2 here), silently. The table has a ``position`` column now (counted from each
    text's first token, whatever the padding side), and the rows up to it rank as the prefix explained alone."""
    from importlib.resources import files

    from bcos_plugins import bcosify, explain
    from bcos_plugins.corpus import explain_dataset
    from bcos_plugins.metrics import reciprocal_rank

    tokenizer = T.AutoTokenizer.from_pretrained(str(files("bcos_plugins.data") / "files" / "gpt2_tokenizer"))
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, side
    config = T.GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    torch.manual_seed(0)
    lm = bcosify(T.GPT2LMHeadModel(config), verbose=False).eval().double()
    texts = ["the cat sat on the mat", "a dog"]
    for position, expected in ((1, [1, 1]), (-1, [5, 1])):
        table = explain_dataset(lm, tokenizer, texts, position=position, target=5, foil=6, progress=False)
        assert table["position"] == expected
    table = explain_dataset(lm, tokenizer, texts, position=1, target=5, foil=6, progress=False)
    scores = torch.tensor(table["scores"][0], dtype=torch.float64)
    assert (scores[2:] == 0).all()  # the tokens after the explained one
    prefix = torch.tensor([table["input_ids"][0][:2]])
    alone = explain(lm, prefix, target=5, foil=6).contributions[0]
    torch.testing.assert_close(scores[:2], alone, rtol=0, atol=1e-12)
    evidence = torch.tensor([[False, True] + [False] * 4])
    seen = torch.arange(6)[None, :] <= table["position"][0]
    hand = 1.0 / (1 + int((alone > alone[1]).sum()))
    assert float(reciprocal_rank(scores[None], evidence, seen)[0]) == hand
    # a classifier explains no position: no such column
    classifier = bcosify(T.GPT2ForSequenceClassification(T.GPT2Config(
        vocab_size=tokenizer.vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=64, num_labels=2,
        pad_token_id=tokenizer.eos_token_id)), verbose=False).eval()
    assert "position" not in explain_dataset(classifier, tokenizer, texts, progress=False).column_names
