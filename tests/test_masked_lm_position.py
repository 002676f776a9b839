"""A masked LM has no default position to explain: ``explain`` and Captum's ``LayerBcos`` refuse a missing
``position`` alike, and explain the same logit at the position given (before: ``explain`` picked each row's
first real token and ``LayerBcos`` its last, so the same model and input gave two different answers)."""

from __future__ import annotations

import pytest
import torch
from conftest import padded_batch, tiny_model

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import real_token_positions
from bcos_plugins.errors import BcosValueError


@pytest.fixture(scope="module")
def bcos_masked_lm():
    return bcosify(tiny_model("BertForMaskedLM"), b=1.5, verbose=False)


def test_explain_refuses_a_masked_lm_without_position_naming_it(bcos_masked_lm):
    ids, mask = padded_batch(side="right")
    with pytest.raises(BcosValueError, match=r"^position: a masked LM predicts a token at every position .*Pass "
                                             r"position= the index of the token whose prediction to explain, e\.g\. "
                                             r"the \[MASK\] token's: \(input_ids == tokenizer\.mask_token_id\)"):
        explain(bcos_masked_lm, ids, mask, target=5)


def test_captum_layer_bcos_refuses_a_masked_lm_without_position_naming_it(bcos_masked_lm):
    from bcos_plugins.adapters.captum import LayerBcos

    ids, mask = padded_batch(side="right")
    with pytest.raises(BcosValueError, match=r"^position: a masked LM .*Pass "
                                             r"additional_forward_args=\(attention_mask, position\) with the index"):
        LayerBcos(bcos_masked_lm).attribute(ids, target=5, additional_forward_args=(mask,))


@pytest.mark.parametrize("side", ["right", "left"])
def test_explain_and_captum_layer_bcos_explain_the_same_masked_lm_position(bcos_masked_lm, side):
    from bcos_plugins.adapters.captum import LayerBcos

    ids, mask = padded_batch(side=side)
    position = torch.tensor([-3, -2, -1])  # counted back from each row's last real token, either padding side
    target = torch.tensor([5, 9, 11])
    reference = explain(bcos_masked_lm, ids, mask, target=target, position=position)
    # each row's logits as the row alone: BERT's absolute positions counted from its first real token
    logits = bcos_masked_lm(input_ids=ids, attention_mask=mask, position_ids=real_token_positions(mask)).logits
    rows = torch.arange(3)
    torch.testing.assert_close(reference.explained, logits[rows, reference.position, target])
    attributions, delta = LayerBcos(bcos_masked_lm).attribute(
        ids, target=target, additional_forward_args=(mask, position), return_convergence_delta=True)
    torch.testing.assert_close(attributions, reference.input_contributions, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attributions.sum(dim=(1, 2)), reference.explained, rtol=1e-4, atol=1e-5)
    assert (delta.abs() <= 1e-4 * reference.explained.abs().clamp_min(1e-3)).all()


def test_causal_lm_defaults_are_unchanged_on_both_paths():
    """The rule only takes the masked LM's default away: a causal LM still explains each row's last real token."""
    from bcos_plugins.adapters.captum import LayerBcos

    model = bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False)
    ids, mask = padded_batch(side="left")
    reference = explain(model, ids, mask, target=5)
    assert reference.position.tolist() == [8, 8, 8]
    attributions = LayerBcos(model).attribute(ids, target=5, additional_forward_args=(mask,))
    torch.testing.assert_close(attributions, reference.input_contributions, rtol=1e-5, atol=1e-6)
