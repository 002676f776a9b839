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
