"""The reviewer's list of session 24 (helper-166), helper-171: each test fails before its change."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_conformance import B, _stock

from bcos_plugins import bcosify

warnings.filterwarnings("ignore", category=DeprecationWarning)


def test_a_bcos_bridge_is_told_by_its_layers_not_by_config_bcos():
    """bridge.py's weight-processing refusal read ``original_model.config.bcos`` while the boot guard's refusals read
    the layers (two functions named ``_is_bcos_bridge``): a B-cos GPT-2 whose config had no ``bcos`` record was let
    through ``enable_compatibility_mode()``, which rewrote its B-cos projections as plain ones and changed its logits,
    silently. One test now, the layers'."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    from bcos_plugins import BcosError

    hf = bcosify(_stock("GPT2LMHeadModel"), b=B, verbose=False).eval()
    del hf.config.bcos
    bridge = transformer_bridge_from_hf(hf)
    with pytest.raises(BcosError, match=r"^bridge.enable_compatibility_mode: TransformerLens' weight processing"):
        bridge.enable_compatibility_mode()
    with pytest.raises(BcosError, match=r"^bridge.process_weights: TransformerLens' weight processing"):
        bridge.process_weights()
    tokens = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(bridge(tokens), hf(tokens).logits, rtol=1e-4, atol=1e-5)


def test_rationale_alignment_as_dict_counts_each_mean_with_its_own_rows():
    """The IoU mean leaves out rows of tied scores (``n_iou_rows``) while the AUPRC mean keeps them (``n_rows``);
    ``as_dict()`` reported ``iou`` with ``n_rows`` alone, so a summary read the IoU as a mean over rows it left out."""
    from bcos_plugins.metrics import rationale_alignment

    scores = torch.tensor([[0.9, 0.1, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0]])  # the second row found nothing: tied
    gold = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)
    valid = torch.ones(2, 4, dtype=torch.bool)
    result = rationale_alignment(scores, gold, valid)
    summary = result.as_dict()
    assert (summary["n_rows"], summary["n_iou_rows"]) == (2, 1)
    assert summary["iou"] == result.iou == 1.0
    assert summary["auprc"] == pytest.approx((1.0 + 0.25) / 2)
