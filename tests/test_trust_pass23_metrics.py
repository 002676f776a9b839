"""Trust pass 23, evaluation (helper-160): the metrics given explanations from other sources (a Space model's, Captum
tensors, our results), margins and shares written in points instead of fractions, ties and counts at the top-k
boundary, batched against one-at-a-time calls, each checked against a hand computation (one test per finding; the
tally is in the CHANGELOG and the session's report).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from conftest import padded_rows, tiny_config

from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ paired accuracy: a margin written in points


def test_non_inferior_refuses_a_margin_written_in_points_and_keeps_the_fraction_answer():
    from bcos_plugins.metrics import paired_accuracy_difference

    labels = [1] * 30
    a = [1, 1, 0, 1, 0, 1, 1, 1, 0, 0] * 3  # 60 % right
    b = [1, 0, 0, 1, 0, 1, 1, 0, 0, 0] * 3  # 40 % right: b is 20 points worse
    r = paired_accuracy_difference(a, b, labels)
    assert r.difference == pytest.approx(-0.2) and r.ci_low < -0.2
    # two points are 0.02 accuracy units: b is not within them of a
    assert not r.non_inferior(0.02)
    # non_inferior(2), meant as two points, read as 200 points and answered True for a variant 20 points worse
    with pytest.raises(BcosValueError, match=r"margin: is 2 accuracy units \(200 points\).*Pass the margin in "
                                             r"accuracy units \(0.01 = one point, e.g. 0.02 for 2 points\)"):
        r.non_inferior(2)
    with pytest.raises(BcosValueError, match="margin: is 1 accuracy units"):
        r.non_inferior(1.0)
    assert r.non_inferior(0.999)  # the largest margin still taken: the interval's lower end -0.34 is above it


# ------------------------------------------------------------------ perturbation curves of a Space model's explanation


def _space_model(seed: int, bias: float):
    from bcos_plugins.space import SpaceModelForSequenceClassification

    torch.manual_seed(seed)
    encoder = T.AutoModel.from_config(tiny_config("bert")).eval()
    model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=3, n_latent=4).eval().double()
    with torch.no_grad():
        model.head.classifier.bias.fill_(bias)
    return model


def test_perturbation_curves_score_a_space_explanation_of_the_same_model_as_its_contributions():
    from bcos_plugins.metrics import perturbation_curves
    from bcos_plugins.space import context_attribution

    model = _space_model(0, bias=0.7)
    ids, mask = padded_rows([7, 5], 8, "right", seed=0)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    explanation = context_attribution(model, ids, mask)
    # its explained value leaves the classifier bias out (the shares sum to the logit minus the bias): compared with the
    # logit, the explanation of this very model was refused as "made for another model"
    assert (explanation.explained - explanation.logits).abs().min() > 0.5
    curves = perturbation_curves(model, ids, mask, explanation, special_tokens=special, fractions=(0.2, 0.5))
    by_tensor = perturbation_curves(model, ids, mask, explanation.contributions, special_tokens=special,
                                    fractions=(0.2, 0.5), target=explanation.target)
    torch.testing.assert_close(curves.comprehensiveness, by_tensor.comprehensiveness, rtol=0, atol=0)
    torch.testing.assert_close(curves.sufficiency, by_tensor.sufficiency, rtol=0, atol=0)
    # another Space model's explanation of the same ids is still refused
    other = context_attribution(_space_model(1, bias=0.7), ids, mask, target=explanation.target)
    with pytest.raises(BcosValueError, match="made for another model"):
        perturbation_curves(model, ids, mask, other, special_tokens=special, fractions=(0.2, 0.5))


# ------------------------------------------------------------------ paired accuracy: predictions collected row by row


def test_paired_accuracy_difference_takes_a_list_of_0d_tensors_as_one_seed():
    from bcos_plugins.metrics import paired_accuracy_difference

    # one seed's predictions collected as [logits.argmax() for ...] failed with "len() of a 0-d tensor"
    a = [torch.tensor(1), torch.tensor(0), torch.tensor(1), torch.tensor(0)]
    b = [torch.tensor(1), torch.tensor(1), torch.tensor(1), torch.tensor(0)]
    r = paired_accuracy_difference(a, b, [1, 1, 1, 0])
    assert (r.n_seeds, r.n_examples) == (1, 4)
    assert r.accuracy_a == (0.75,) and r.accuracy_b == (1.0,)  # by hand: 3 of 4 and 4 of 4 right
    assert r.difference == pytest.approx(0.25) and (r.only_a_correct, r.only_b_correct) == (0, 1)
    same = paired_accuracy_difference([1, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0])
    assert (r.ci_low, r.ci_high) == (same.ci_low, same.ci_high)


def test_paired_accuracy_difference_names_per_seed_arrays_of_different_lengths():
    import numpy as np

    from bcos_plugins.metrics import paired_accuracy_difference

    ragged = [np.array([1, 0, 1]), np.array([1, 1])]
    # was "must be a tensor of shape (seed, example), got list. Pass a torch.Tensor", for a list the docstring takes
    with pytest.raises(BcosValueError, match=r"predictions_a: seeds have different numbers of examples \[2, 3\]"):
        paired_accuracy_difference(ragged, ragged, [1, 1, 1])
    even = paired_accuracy_difference([np.array([1, 0, 1]), np.array([0, 1, 1])],
                                      [np.array([1, 1, 1]), np.array([0, 1, 1])], [1, 1, 1])
    assert even.n_seeds == 2 and even.per_seed == pytest.approx((1 / 3, 0.0))


# ------------------------------------------------------------------ one-logit classifiers: the softmax of one logit is 1


def test_perturbation_curves_refuse_the_softmax_of_a_one_logit_classifier_and_score_its_sigmoid():
    from bcos_plugins.metrics import perturbation_curves

    torch.manual_seed(0)
    model = T.BertForSequenceClassification(tiny_config("bert", num_labels=1)).eval().double()
    ids, mask = padded_rows([7, 5], 8, "right", seed=0)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = True
    scores = torch.tensor([[0.0, 5, 4, 3, 2, 1, 0.5, 0.25]] * 2, dtype=torch.float64)
    # every curve was 0 (P = 1 with and without the tokens), every method's AOPC 0, without a word
    with pytest.raises(BcosValueError, match="probability: is 'softmax', but BertForSequenceClassification returns one "
                                             "logit per row.*Pass probability='sigmoid'"):
        perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=(0.5,))
    curves = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=(0.5,),
                                 probability="sigmoid")
    # by hand, row 0 alone: 6 perturbable tokens, the top 3 (positions 1, 2, 3) removed through the attention mask
    row = ids[:1, :7]
    with torch.no_grad():
        full = model(input_ids=row, attention_mask=torch.ones_like(row)).logits.sigmoid()[0, 0]
        removed = model(input_ids=row, attention_mask=torch.tensor([[1, 0, 0, 0, 1, 1, 1]])).logits.sigmoid()[0, 0]
    assert float(curves.comprehensiveness[0, 0]) == pytest.approx(float(full - removed), abs=1e-12)
    assert float(curves.comprehensiveness[0, 0]) != 0.0


def test_pixel_perturbation_refuses_the_softmax_of_a_one_logit_model_and_scores_its_logit():
    from bcos_plugins.metrics import pixel_perturbation

    def forward(x):  # one logit per image: three times its first pixel
        return 3.0 * x.flatten(1)[:, :1]

    images = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(0)) + 0.5
    maps = torch.zeros(2, 4, 4)
    maps[:, 0, 0] = 1.0  # the first pixel ranks first
    # both curves were flat at 1 and the area between them 0 for any map, silently
    with pytest.raises(BcosValueError, match="score: is 'softmax', but forward returns one logit per image"):
        pixel_perturbation(forward, images, maps, 0, fractions=(0.0, 0.5, 1.0))
    result = pixel_perturbation(forward, images, maps, 0, fractions=(0.0, 0.5), score="logit")
    first = 3.0 * images[:, 0, 0, 0]
    torch.testing.assert_close(result.most_first, torch.stack([first, torch.zeros(2)], 1))  # removed to 0 at once
    torch.testing.assert_close(result.least_first, torch.stack([first, first], 1))  # kept until the last half


# ------------------------------------------------------------------ perplexity of a padded batch given as lists


@pytest.mark.parametrize("form", ["list of lists", "list of tensors"])
def test_perplexity_warns_about_a_padded_batch_of_ids_given_as_lists_as_it_does_for_a_tensor(form):
    from conftest import tiny_model

    from bcos_plugins.errors import UnmaskedPaddingWarning
    from bcos_plugins.metrics import perplexity

    model = tiny_model("LlamaForCausalLM").double()
    assert model.config.pad_token_id == 0
    padded = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])  # tokenizer(texts, padding=True)'s ids
    texts = padded.tolist() if form == "list of lists" else list(padded)
    with pytest.warns(UnmaskedPaddingWarning, match="texts has rows of different lengths padded with "
                                                    r"config.pad_token_id \(0\)"):
        as_tensor = perplexity(model, padded, max_length=6)
    # the same ids as lists: the three padding ids were scored as tokens (10 for 7) without the tensor's warning
    with pytest.warns(UnmaskedPaddingWarning, match="texts has rows of different lengths padded"):
        as_lists = perplexity(model, texts, max_length=6)
    assert (as_lists.perplexity, as_lists.n_tokens) == (as_tensor.perplexity, as_tensor.n_tokens) \
        and as_lists.n_tokens == 10
    unpadded = perplexity(model, [[5, 6, 7, 8, 9, 10], [11, 12, 13]], max_length=6)
    assert unpadded.n_tokens == 7 and unpadded.perplexity != pytest.approx(as_lists.perplexity)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmaskedPaddingWarning)  # rows of one length without padding: no warning
        perplexity(model, [[5, 6, 7], [8, 9, 10]], max_length=6)


# ------------------------------------------------------------------ token scores as lists and arrays


def test_token_scores_read_nested_lists_and_arrays_as_the_rationale_metrics_do():
    import math

    import numpy as np

    from bcos_plugins.metrics import explanation_entropy, reciprocal_rank, token_scores

    def entropy(row):
        total = sum(abs(v) for v in row)
        return -sum(abs(v) / total * math.log(abs(v) / total) for v in row if v)

    rows = [[1.0, 2.0], [3.0, -4.0]]
    # two rows as a list were refused as "a tuple of 2" input tensors, one row as "got list", an array as "got ndarray";
    # reciprocal_rank and the rationale metrics read the same lists
    for given in (rows, np.array(rows)):
        got = explanation_entropy(given)
        assert got.dtype == torch.float64
        assert got.tolist() == pytest.approx([entropy(rows[0]), entropy(rows[1])], abs=1e-15)
    assert explanation_entropy([[1.0, 2.0, 3.0]]).tolist() == pytest.approx([entropy([1.0, 2.0, 3.0])], abs=1e-15)
    # a one-input tuple holding the array, as Captum's holds a tensor: the array's rows, not one (1, batch, pos) row
    assert token_scores((np.array(rows),)).tolist() == rows
    # Python floats in float64, as require_tensor reads them (scores 1e-9 apart stay apart)
    assert token_scores([[1.0, 1.0 + 1e-9]]).dtype == torch.float64
    assert reciprocal_rank(rows, [[0, 1]] * 2).tolist() == [1.0, 0.5]
    # per-row scores of different lengths (Explanation.scores()) are named as such, not as "a tuple"
    with pytest.raises(BcosValueError, match="got a list of 2 tensors .*not its scores"):
        explanation_entropy([torch.tensor([1.0, 2.0]), torch.tensor([3.0])])


# ------------------------------------------------------------------ switches given as text


def test_aopc_and_completeness_error_refuse_a_switch_given_as_text():
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.metrics import aopc, completeness_error

    curve = torch.ones(1, 9)
    assert aopc(curve).item() == pytest.approx(0.8) and aopc(curve, normalise=True).item() == pytest.approx(1.0)
    # "no" (a setting read from a file or the command line) normalised the area: 1.0 for the paper's 0.8
    with pytest.raises(BcosTypeError, match=r"normalise: must be True or False, got str 'no'\. Pass normalise=True"):
        aopc(curve, normalise="no")
    scores, logit = torch.tensor([[1.0, 2.0]]), torch.tensor([4.0])
    assert completeness_error(scores, logit, relative=False).item() == 1.0  # |3 - 4|
    assert completeness_error(scores, logit).item() == 0.25  # |3 - 4| / 4
    # "no" gave the relative error, 0.25 for the absolute gap of 1
    with pytest.raises(BcosTypeError, match=r"relative: must be True or False, got str 'no'\. Pass relative=True"):
        completeness_error(scores, logit, relative="no")


def test_metrics_name_captums_attributions_and_delta_pair():
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward
    from conftest import tiny_bcos_model

    from bcos_plugins import explain
    from bcos_plugins.metrics import explanation_entropy

    model = tiny_bcos_model().double()
    ids, mask = padded_rows([7, 5], 8, "right", seed=0)
    forward = EmbeddingForward(model)
    explanation = explain(model, ids, mask)
    pair = BcosAttribution(forward).attribute(forward.embed(ids, mask), target=explanation.target,
                                              additional_forward_args=(mask,), return_convergence_delta=True)
    assert isinstance(pair, tuple) and len(pair) == 2 and pair[1].shape == (2,)
    # was "expected the attributions of one input tensor, got a tuple of 2", as if two inputs had been attributed
    with pytest.raises(BcosValueError, match=r"attributions: are a pair of attributions and one value per row, as "
                                             r"Captum's attribute\(\.\.\., return_convergence_delta=True\) returns"):
        explanation_entropy(pair, mask)
    torch.testing.assert_close(explanation_entropy(pair[0], mask), explanation_entropy(explanation, mask),
                               rtol=0, atol=1e-12)


# ------------------------------------------------------------------ MRR of an explanation of a padded batch


def test_reciprocal_rank_of_an_explanation_ranks_its_real_tokens_as_each_row_alone():
    from conftest import tiny_model

    from bcos_plugins import bcosify, explain
    from bcos_plugins.metrics import expected_random_reciprocal_rank, mean_reciprocal_rank, reciprocal_rank

    model = bcosify(tiny_model("LlamaForCausalLM"), b=1.5, verbose=False).eval().double()
    ids, mask = padded_rows([7, 4], 8, "left", seed=0)
    target, foil = torch.tensor([3, 4]), torch.tensor([5, 6])
    explanation = explain(model, ids, mask, target=target, foil=foil)
    evidence = torch.zeros_like(ids, dtype=torch.bool)
    evidence[0, 2], evidence[1, 5] = True, True
    alone = []
    for row in range(2):
        keep = mask[row].bool()
        one = explain(model, ids[row:row + 1, keep], mask[row:row + 1, keep], target=target[row:row + 1],
                      foil=foil[row:row + 1])
        # by hand: 1 / (1 + the real tokens scored above the evidence token)
        scores, at = one.contributions[0], int(evidence[row, keep].nonzero())
        alone.append(1.0 / (1 + int((scores > scores[at]).sum())))
    assert alone[0] == 1 / 7  # the evidence ranks last among row 0's seven tokens
    # the explanation was refused ("must be a tensor"); its contributions without candidates rank row 0's padding
    # (score 0) above the evidence: 1/8 for 1/7
    assert reciprocal_rank(explanation.contributions, evidence).tolist()[0] == 1 / 8
    assert reciprocal_rank(explanation, evidence).tolist() == pytest.approx(alone, abs=0)
    result = mean_reciprocal_rank(explanation, evidence)
    assert result.mrr == pytest.approx(sum(alone) / 2)
    # the random baseline over the same candidates, the real tokens: 7 and 4 of them, one evidence token each
    assert result.random == pytest.approx((expected_random_reciprocal_rank(7, 1) + expected_random_reciprocal_rank(4, 1))
                                          / 2)


def test_rationale_metrics_of_an_explanation_leave_its_padding_out_as_each_row_alone():
    from conftest import tiny_bcos_model

    from bcos_plugins import explain
    from bcos_plugins.metrics import average_precision, rationale_alignment

    model = tiny_bcos_model().double()
    ids, mask = padded_rows([7, 4], 8, "right", seed=0)
    explanation = explain(model, ids, mask)
    gold = torch.zeros_like(ids)
    hand = []
    for row in range(2):
        real = explanation.contributions[row, : int(mask[row].sum())]
        lowest = int(real.argmin())
        assert real[lowest] < 0  # a token of negative score, below the padding's 0
        gold[row, lowest] = 1
        hand.append(1.0 / (1 + int((real > real[lowest]).sum())))  # AP of one gold token: precision at its threshold
    # the explanation was refused ("must be a tensor"); its contributions without valid_mask rank the padding (score 0)
    # above the gold token
    assert average_precision(explanation.contributions, gold).tolist()[1] == 1 / 8
    result = rationale_alignment(explanation, gold)
    assert result.auprc_per_row.tolist() == pytest.approx(hand, abs=1e-7) and hand[1] == 1 / 4
    assert result.auprc_per_row.tolist() == pytest.approx(
        rationale_alignment(explanation.contributions, gold, mask).auprc_per_row.tolist(), abs=0)
