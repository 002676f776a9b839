"""Every check that two arguments have one shape goes through ``_checks.require_same_shape``: one message,
``"<name>: has shape <shape> but <other> has <shape>. <fix>"``, naming both arguments and both shapes (the checks
each wrote their own before, some naming one shape only or neither argument)."""

from __future__ import annotations

import pytest
import torch

from bcos_plugins import CausalLMCollator
from bcos_plugins.bilinear import BilinearWeights
from bcos_plugins.errors import BcosValueError
from bcos_plugins.guided import random_rationale_mask
from bcos_plugins.metrics import completeness_error, perturbation_curves, reciprocal_rank, top_k_masks
from bcos_plugins.vision.visualize import weight_colour_image

SCORES = torch.rand(2, 4, generator=torch.Generator().manual_seed(0))
FLAGS = torch.ones(2, 3, dtype=torch.bool)
IDS = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])


def _random_rationale():
    gold = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0]])
    random_rationale_mask(gold, FLAGS)


def _bilinear():
    W, P = torch.randn(10, 6), torch.randn(5, 10)
    BilinearWeights(W, torch.randn(10, 5), P)


CASES = {
    "reciprocal_rank evidence": (lambda: reciprocal_rank(SCORES, FLAGS),
                                 r"evidence: has shape \(2, 3\) but scores has \(2, 4\)\. Pass one flag per scored "
                                 r"token\."),
    "reciprocal_rank candidates": (lambda: reciprocal_rank(SCORES, torch.zeros(2, 4, dtype=torch.bool), FLAGS),
                                   r"candidates: has shape \(2, 3\) but scores has \(2, 4\)\. Pass one flag per "
                                   r"scored token\."),
    "top_k_masks": (lambda: top_k_masks(SCORES, FLAGS),
                    r"perturbable: has shape \(2, 3\) but scores has \(2, 4\)\. Pass one flag per token score\."),
    "perturbation_curves": (lambda: perturbation_curves(lambda **kwargs: None, IDS, None, SCORES[:, :3]),
                            r"attributions: has shape \(2, 3\) but input_ids has \(2, 4\)\. Attribute the same batch "
                            r"at the token \(embedding\) level \(the shape is that of the token scores, the "
                            r"attributions summed over the embedding\)\."),
    "completeness_error": (lambda: completeness_error(SCORES, torch.ones(3)),
                           r"explained: has shape \(3,\) but attributions \(summed per example\) has \(2,\)\. Pass "
                           r"one explained value per example\."),
    "random_rationale_mask": (_random_rationale,
                              r"eligible: has shape \(2, 3\) but gold_mask has \(2, 4\)\. Build both from the same "
                              r"encoding\."),
    "CausalLMCollator": (lambda: CausalLMCollator(0)([{"input_ids": [1, 2, 3], "attention_mask": [1, 1]}]),
                         r"features\[0\]\['attention_mask'\]: has shape \(2,\) but features\[0\]\['input_ids'\] has "
                         r"\(3,\)\. Give both the same length\."),
    "BilinearWeights": (_bilinear,
                        r"V: has shape \(10, 5\) but W has \(10, 6\)\. Pass the two branches' projections of one "
                        r"layer \(gate and up\), each \(d_hidden, d_in\)\."),
    "weight_colour_image": (lambda: weight_colour_image(torch.rand(2, 4, 4), torch.rand(4, 3)),
                            r"contributions: has shape \(4, 3\) but each channel of weights has \(4, 4\)\. Pass the "
                            r"same image's map\."),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_shape_mismatch_names_both_arguments_both_shapes_and_the_fix(case):
    call, message = CASES[case]
    with pytest.raises(BcosValueError, match=f"^{message}$"):
        call()
