"""Attributions computed while the model runs in bfloat16 (a caller's ``torch.autocast``, or the autocast that
``Trainer(bf16=True)`` leaves wrapped around ``model.forward``) are complete only to bfloat16 rounding; every path
says so instead of handing them back as exact.

- ``explain`` holds them to bfloat16's tolerance (tests/test_bf16_training.py);
- Captum's ``BcosAttribution`` ran no check that knew the precision: under autocast it returned the attributions
  without a word, or warned that part of the output does not come from ``inputs`` (the position embeddings), which
  is false. It now warns that they are complete only to bfloat16 rounding, by how much, and how to get float32
  completeness back (the autocast is detected inside the forward the way ``explain`` detects it); a share really
  missing still gets the old warning;
- the TransformerLens adapter's ``explain_logits`` reports the gap in its result's ``completeness_error``, and now
  warns that the contributions are complete only to bfloat16 rounding (it was silent);
- Captum's ``LayerBcos`` ran no completeness check at all: it now warns the same way, both of bfloat16 rounding
  and of a share of the output that does not pass through the layer.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos
from bcos_plugins.adapters.transformer_lens import explain_logits
from test_bf16_training import cue_word_task, train_and_score
from test_cross_path import bcos_model, lens_model

BF16_ROUNDING = torch.finfo(torch.bfloat16).eps ** 0.5
ROUNDING_WARNING = r"forward ran in torch\.bfloat16 .* complete only to torch\.bfloat16 rounding"


def _ids() -> torch.Tensor:
    return torch.randint(3, 40, (2, 8), generator=torch.Generator().manual_seed(0))


def _captum(model, ids, mask=None):
    fwd = EmbeddingForward(model)
    args = () if mask is None else (mask,)
    return BcosAttribution(fwd).attribute(fwd.embed(ids, mask), target=1, additional_forward_args=args,
                                          return_convergence_delta=True)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_captum_under_a_callers_autocast_says_the_attributions_are_complete_to_bfloat16(family):
    model = bcos_model(family, 2, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32: complete, no warning
        attributions, delta = _captum(model, _ids())
    assert (delta.abs() / attributions.sum((1, 2)).abs()).max() < 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match=ROUNDING_WARNING) as record:
        attributions, delta = _captum(model, _ids())
    # before: nothing (GPT-2), or the warning that blames the position embeddings (BERT)
    assert not any("does not come from `inputs`" in str(w.message) for w in record)
    gap = delta.abs() / attributions.sum((1, 2)).abs()
    assert 1e-6 < gap.max() < BF16_ROUNDING  # the gap is bfloat16 rounding, and the delta reports it


def test_captum_under_autocast_still_warns_of_a_share_missing_from_the_inputs():
    # the word embeddings alone (inputs_embeds=) miss the position embeddings' share: that is no rounding
    model = bcos_model("bert", 2, 2.0)
    ids = _ids()
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match="does not come from `inputs`"):
        BcosAttribution(lambda emb: model(inputs_embeds=emb).logits, model=model).attribute(
            model.get_input_embeddings()(ids).detach(), target=1)


def test_captum_after_trainer_bf16_says_the_attributions_are_complete_to_bfloat16(tmp_path):
    *_, trainer = train_and_score(True, str(tmp_path), steps=5)
    rows = cue_word_task(4, seed=3)
    ids, mask = torch.tensor(rows["input_ids"]), torch.tensor(rows["attention_mask"])
    with pytest.warns(UserWarning, match=ROUNDING_WARNING):  # no autocast around the call: it is in the forward
        _captum(trainer.model, ids, mask)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fix the warning names gives float32 completeness back
        _captum(unwrapped, ids, mask)


def test_transformer_lens_explain_logits_reports_the_bfloat16_gap():
    model = lens_model("gpt2", 2, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32: complete, no warning
        exact = explain_logits(model, _ids(), target=1)
    assert exact.completeness_error.max() < 1e-5
    # before: the gap was only in completeness_error, nothing warned
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.warns(UserWarning, match="explain_logits: the " + ROUNDING_WARNING + r".*completeness_error"):
        rounded = explain_logits(model, _ids(), target=1)
    assert 1e-4 < rounded.completeness_error.max() < BF16_ROUNDING
    torch.testing.assert_close(rounded.completeness_error,
                               (rounded.total - rounded.explained.float()).abs() / rounded.explained.float().abs())


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_layer_bcos_under_a_callers_autocast_says_the_attributions_are_complete_to_bfloat16(family):
    model = bcos_model(family, 2, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32 at the attribution point: complete, no warning
        attributions, delta = LayerBcos(model).attribute(_ids(), target=1, return_convergence_delta=True)
    assert (delta.abs() / attributions.sum((1, 2)).abs()).max() < 1e-5
    # before: nothing, in any precision
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.warns(UserWarning, match="LayerBcos: the " + ROUNDING_WARNING) as record:
        attributions, delta = LayerBcos(model).attribute(_ids(), target=1, return_convergence_delta=True)
    assert not any("do not sum" in str(w.message) for w in record)
    gap = delta.abs() / attributions.sum((1, 2)).abs()
    assert 1e-6 < gap.max() < BF16_ROUNDING


def test_layer_bcos_warns_of_a_share_that_does_not_pass_through_the_layer():
    # GPT-2's MLP sublayer sits beside the residual connection: the embeddings reach the output around it
    model = bcos_model("gpt2", 2, 2.0)
    with pytest.warns(UserWarning, match=r"LayerBcos: the attributions do not sum to the explained output .*"
                                         r"does not pass through the output of .*leave layer out"):
        _, delta = LayerBcos(model, model.transformer.h[0].mlp).attribute(
            _ids(), target=1, return_convergence_delta=True)
    assert delta.abs().max() > 1e-3  # the delta the warning points to shows the missing share
