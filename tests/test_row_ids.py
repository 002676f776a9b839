"""One per-row id parser (issue 31): targets, foils, positions, class labels and grid cells are read by
``_checks.require_row_ids`` on every path (``explain``, positions, the Space model's labels, the image and
decoder metrics, the Captum image methods' own code), so the same bad value gets the same words, naming the argument, the problem and the fix.

Before, the image metrics, ``probability_gap``, ``next_token_contrast`` and the class-id check each had their
own copy, with their own wordings ("must be integer cell indices", "foil ids must lie in", "has ids outside
the vocabulary"), and the decoder metrics refused an int target for every row that ``explain`` takes.
"""

from __future__ import annotations

import re
from functools import cache

import pytest
import torch
from bcos_plugins.adapters.captum_vision import image_attribution_methods
from conftest import TINY_VIT_SHAPE, tiny_config
from test_cross_path import bcos_model
from test_metrics_image import linear_model

from bcos_plugins import SpaceModelConfig, SpaceModelForSequenceClassification, explain
from bcos_plugins.attribution import resolve_positions
from bcos_plugins.errors import BcosError, BcosTypeError, BcosValueError
from bcos_plugins.metrics import grid_pointing_game, next_token_contrast, pixel_perturbation
from bcos_plugins.metrics.decoder import probability_gap
from bcos_plugins.vision import BcosViT, BcosViTConfig

IDS = torch.tensor([[5, 9, 14, 22, 7], [0, 0, 31, 8, 19]])
MASK = (IDS != 0).long()


@cache
def space():
    torch.manual_seed(0)
    return SpaceModelForSequenceClassification(SpaceModelConfig(encoder_config=tiny_config("bert"))).eval()


@cache
def _vit_methods():
    torch.manual_seed(0)
    return image_attribution_methods(BcosViT(BcosViTConfig(**TINY_VIT_SHAPE, b=2.0, max_out=2)).eval())


def _paths():
    """name -> (call with the value, argument, number of ids (None: no range), what they are, an int broadcasts)"""
    classifier, decoder = bcos_model("bert", 2, 2.0), bcos_model("gpt2", 2, 2.0)
    images = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    return {
        "explain": (lambda v: explain(classifier, IDS.clamp_min(3), target=v), "target", 4, "outputs", True),
        "resolve_positions": (lambda v: resolve_positions(v, MASK), "position", None, None, True),
        "grid_pointing_game": (lambda v: grid_pointing_game(torch.rand(2, 4, 4), v), "cell", 4,
                               "cells in the 2x2 grid, numbered row by row from 0", True),
        "pixel_perturbation": (lambda v: pixel_perturbation(linear_model(torch.ones(1, 1, 4, 4)), images,
                                                            torch.rand(2, 4, 4), target=v), "target", 2, "classes",
                               True),
        "probability_gap": (lambda v: probability_gap(torch.rand(2, 5), v, torch.tensor([0, 1])), "target", 5,
                            "vocabulary tokens", True),
        "next_token_contrast": (lambda v: next_token_contrast(decoder, IDS, MASK, target=7, foil=v), "foil", 40,
                                "vocabulary tokens", True),
        "Captum vision GradCAM (attention)": (lambda v: _vit_methods()["GradCAM (attention)"].explain(
            torch.rand(2, 1, 16, 16), v), "target", 5, "classes", True),
        "SpaceModel labels": (lambda v: space()(input_ids=IDS.clamp_min(3), attention_mask=MASK, labels=v), "labels",
                              space().config.num_labels, "classes", False),
    }


def _refusal(call, value) -> BcosError:
    with pytest.raises(BcosError) as info:
        call(value)
    return info.value


def _fix(name: str, broadcast: bool) -> str:
    every = "an int for every row, or " if broadcast else ""
    return re.escape(f"Pass {every}one integer id per row (a list of ints or an integer tensor of shape (2,))")


@pytest.mark.parametrize("path", list(_paths()))
def test_every_path_reads_per_row_ids_with_the_same_words(path):
    call, name, n, what, broadcast = _paths()[path]
    hint = re.escape(f"; to explain a direction of the output space pass {name}=Direction(vector)") \
        if path == "explain" else ""
    error = _refusal(call, 1.7)
    assert isinstance(error, BcosTypeError)
    assert re.fullmatch(re.escape(f"{name}: got a float (1.7); ids must be integers (floats are refused, not "
                                  "truncated). ") + _fix(name, broadcast) + hint + r"\.", str(error)), str(error)
    error = _refusal(call, torch.tensor([True, False]))
    assert isinstance(error, BcosTypeError)
    assert re.fullmatch(re.escape(f"{name}: got a boolean; ids must be integers. ") + _fix(name, broadcast) + hint
                        + r"\.", str(error)), str(error)
    error = _refusal(call, torch.tensor([0, 1, 1]))
    one = "an int or one id per row" if broadcast else "one id per row"
    assert isinstance(error, BcosValueError)
    assert re.fullmatch(re.escape(f"{name}: expected {one}, shape (2,); got shape (3,). ") + _fix(name, broadcast)
                        + hint + r"\.", str(error)), str(error)
    if n is not None:
        error = _refusal(call, torch.tensor([0, n]))
        assert isinstance(error, BcosValueError)
        assert str(error) == (f"{name}: ids must lie in [0, {n}), got [{n}] at row [1]. Pass ids in [0, {n}) (there "
                              f"are {n} {what}); negative ids are not counted from the end."), str(error)


def test_the_decoder_metrics_take_an_int_for_every_row_as_explain_does():
    logits = torch.rand(2, 5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(probability_gap(logits, 3, 1),
                               probability_gap(logits, torch.tensor([3, 3]), torch.tensor([1, 1])))
    decoder = bcos_model("gpt2", 2, 2.0)
    one = next_token_contrast(decoder, IDS, MASK, target=7, foil=9)
    rows = next_token_contrast(decoder, IDS, MASK, target=torch.tensor([7, 7]), foil=torch.tensor([9, 9]))
    torch.testing.assert_close(one.logit_difference, rows.logit_difference)


def test_labels_still_come_one_per_row():
    # a training label is per example: an int for a whole batch is refused, not broadcast
    with pytest.raises(BcosValueError, match=r"^labels: expected one id per row, shape \(2,\); got shape \(\)\. "):
        space()(input_ids=IDS.clamp_min(3), attention_mask=MASK, labels=torch.tensor(1))


def test_a_boolean_inside_a_list_is_refused_not_read_as_one():
    # torch.as_tensor([0, True]) is the int64 ids [0, 1]
    with pytest.raises(BcosTypeError, match=r"^target: got a boolean; ids must be integers\. "):
        probability_gap(torch.rand(2, 5), [0, True], [1, 0])
