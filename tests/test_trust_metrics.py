"""The metrics compute each row of a padded batch as the same row alone (or refuse the batch naming
``attention_mask``): a metric's number is the model's number on that row, whatever the padding."""

from __future__ import annotations

import pytest
import torch
from conftest import padded_batch
from test_conformance import _stock

from bcos_plugins.convert.architectures import SPECS
from bcos_plugins.metrics import perturbation_curves

DECODER_CLASSIFIERS = sorted(name for name, spec in SPECS.items() if spec.kind == "decoder" and spec.is_classifier)
# sliding-window models (Gemma2, Mistral) included: the read token is never removed, so it always sees itself
# (test_trust_pass2 checks windows of 2 against the row's own probabilities)
CASES = [(name, masking) for name in DECODER_CLASSIFIERS for masking in ("attention", "mask_token")]


@pytest.mark.parametrize("pad_id", ["config", "other"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("name", "masking"), CASES)
def test_perturbation_curves_of_a_decoder_classifier_are_those_of_each_row_alone(name, masking, side, pad_id):
    """perturbation_curves called the model with the batch as given: a left-padded GPT-2 row's positions counted from
    the padded column (its probabilities 0.022 off the row's own, tiny model), and padding written with another id
    than config.pad_token_id made every decoder classifier read a padding position. Registry models are called
    through model_call_kwargs, with the positions of the unperturbed row (a removed token moves no other)."""
    model = _stock(name)
    config_pad = model.config.pad_token_id
    assert config_pad is not None, f"the tiny {name} config sets a pad_token_id"
    ids, mask = padded_batch(seed=1, side=side, pad_id=config_pad if pad_id == "config" else config_pad + 1)
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    special = torch.zeros_like(mask, dtype=torch.bool)
    kw = {"masking": masking, "mask_token_id": 3} if masking == "mask_token" else {}
    batched = perturbation_curves(model, ids, mask, scores, special_tokens=special, **kw)
    for row in range(ids.shape[0]):
        keep = mask[row].bool()
        alone = perturbation_curves(model, ids[row : row + 1, keep], mask[row : row + 1, keep],
                                    scores[row : row + 1, keep], special_tokens=special[row : row + 1, keep],
                                    target=batched.target[row : row + 1], **kw)
        for field in ("full_probability", "comprehensiveness", "sufficiency"):
            torch.testing.assert_close(getattr(batched, field)[row : row + 1], getattr(alone, field),
                                       rtol=1e-5, atol=1e-6, msg=lambda m, f=field, r=row: f"{f} of row {r}: {m}")


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"])
def test_attention_masking_never_removes_the_token_a_decoder_classifier_reads(name, side):
    """A decoder classifier reads its last real token's hidden state, which holds that token's own embedding whatever
    the attention mask says: its 'removal' left the probability almost unchanged (tiny Llama: 0.002 against
    0.03-0.06 for the row without it), so a score ranking it first overstated what was left. It is kept like a
    special token: the curves are those with it marked special, whatever its score."""
    model = _stock(name)
    ids, mask = padded_batch(seed=1, side=side, pad_id=model.config.pad_token_id)
    rows = torch.arange(ids.shape[0])
    read = torch.zeros_like(mask, dtype=torch.bool)
    read[rows, mask.shape[1] - 1 - mask.flip(1).argmax(1)] = True  # each row's last real token
    special = torch.zeros_like(read)
    scores = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    read_first = scores.masked_fill(read, 100.0)
    curves = perturbation_curves(model, ids, mask, read_first, special_tokens=special)
    kept_as_special = perturbation_curves(model, ids, mask, scores, special_tokens=read)
    for field in ("k", "full_probability", "comprehensiveness", "sufficiency"):
        torch.testing.assert_close(getattr(curves, field), getattr(kept_as_special, field),
                                   msg=lambda m, f=field: f"{f}: {m}")
    # mask_token removal replaces the read token's embedding like any other token's, so it stays removable
    replaced = perturbation_curves(model, ids, mask, read_first, special_tokens=special, masking="mask_token",
                                   mask_token_id=3)
    real = mask.sum(1, keepdim=True).double()
    fractions = torch.tensor(replaced.fractions, dtype=torch.float64)
    torch.testing.assert_close(replaced.k, torch.clamp((real * fractions + 1e-9).floor().long(), min=1))


def test_a_row_whose_only_perturbable_token_a_decoder_classifier_reads_is_refused():
    model = _stock("GPT2ForSequenceClassification")
    ids, mask = padded_batch(seed=1, side="right", pad_id=model.config.pad_token_id)
    special = mask.bool().clone()
    special[:2, 0] = False  # rows 0 and 1: one perturbable token, not their last real one
    special[2, int(mask[2].sum()) - 1] = False  # row 2: only its last real token (the one read)
    with pytest.raises(ValueError, match=r"attention_mask.*row \[2\].*only perturbable token is the last one"):
        perturbation_curves(model, ids, mask, torch.zeros(ids.shape), special_tokens=special | ~mask.bool())


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_next_token_contrast_calls_a_registry_lm_as_explain_does(name, side, monkeypatch):
    """next_token_contrast passed real_token_positions itself, a second copy of model_call_kwargs' position rule: a
    change there (as the decoder classifier's padding rewrite was) would not reach it. It calls model_call_kwargs,
    and each row's numbers are those of the row alone, on either padding side."""
    import bcos_plugins.attribution.text as text
    from bcos_plugins.metrics import next_token_contrast

    model = _stock(name)
    ids, mask = padded_batch(seed=2, side=side)
    target, foil = torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])
    calls = []
    original = text.model_call_kwargs
    monkeypatch.setattr(text, "model_call_kwargs", lambda *a, **k: calls.append(a[1]) or original(*a, **k))
    batched = next_token_contrast(model, ids, mask, target=target, foil=foil)
    assert calls == [SPECS[name]]
    for row in range(ids.shape[0]):
        keep = mask[row].bool()
        alone = next_token_contrast(model, ids[row : row + 1, keep], target=target[row], foil=foil[row])
        torch.testing.assert_close(batched.logit_difference[row : row + 1], alone.logit_difference,
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.probability_gap[row : row + 1], alone.probability_gap,
                                   rtol=1e-5, atol=1e-6)


def test_top_k_masks_names_rows_without_a_perturbable_token_as_the_caller_does():
    """Rows are named through the one mechanism (bad_rows / rows_named_as), so a caller that batches in another order
    sees its own indices."""
    from bcos_plugins._checks import rows_named_as
    from bcos_plugins.metrics import top_k_masks

    scores = torch.ones(3, 4)
    perturbable = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^perturbable: rows \[1, 2\] have no perturbable token"):
        top_k_masks(scores, perturbable)
    with rows_named_as([7, 5, 9]), pytest.raises(ValueError, match=r"^perturbable: rows \[5, 9\] have no perturbable"):
        top_k_masks(scores, perturbable)
    with pytest.raises(ValueError, match=r"^perturbable: row \[0\] has no perturbable token"):
        top_k_masks(scores[:1], perturbable[1:2])
