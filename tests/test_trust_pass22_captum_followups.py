"""Trust pass 22, Captum follow-ups (helper-151): the Captum adapter builds its refusals from the core's one check
or cause (the padding token's NaN embedding, the tokenizer's output as ids), and names the real cause of a gap.
Each test fails on the behaviour before its fix."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import padded_batch, tiny_model

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError


def _bcos(class_name: str = "BertForSequenceClassification"):
    return bcosify(tiny_model(class_name), b=1.5, verbose=False).eval()


def _with_nan_row(model, token: int):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_input_embeddings().weight[token] = float("nan")
    return broken


# ------------------------------------------------ a padding token whose embedding is NaN


def test_layer_bcos_names_the_padding_tokens_nan_embedding():
    """A NaN padding embedding makes every padded row NaN (a masked key's weight 0 times NaN): explain and predict
    name it (attribution.text.non_finite_embedding_cause), LayerBcos's refusal said "check those rows' inputs, the
    embedding rows of their tokens" where the one broken row is the padding's."""
    from bcos_plugins.adapters.captum import LayerBcos

    ids, mask = padded_batch()  # rows 1 and 2 padded with id 0
    with pytest.raises(BcosValueError, match=r"^LayerBcos: .*NaN or infinite for rows \[1, 2\].*The padding "
                                             r"token's input embedding \(model\.get_input_embeddings\(\)\.weight\[0\]\) "
                                             r"is NaN or infinite.*weight\.data\[0\] = 0"):
        LayerBcos(_with_nan_row(_bcos(), 0)).attribute(ids, target=1, additional_forward_args=(mask,))
    # a real token's broken row keeps the message that points at the rows' tokens, not the padding
    with pytest.raises(BcosValueError, match=r"^LayerBcos: .*check those rows' inputs") as caught:
        LayerBcos(_with_nan_row(_bcos(), int(ids[0, 0]))).attribute(ids, target=1, additional_forward_args=(mask,))
    assert "padding" not in str(caught.value)
