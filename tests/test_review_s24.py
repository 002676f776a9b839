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


def test_a_bridges_generate_keeps_transformer_lens_signature_and_name():
    """``_without_kv_cache`` copied only ``__name__`` and ``__doc__``: ``inspect.signature(bridge.generate)`` read
    ``(*args, **kwargs)``, hiding ``max_new_tokens`` / ``use_past_kv_cache`` from help and IDEs. ``functools.wraps``
    now: TransformerLens' signature, its qualified name, and ``__wrapped__``."""
    import inspect

    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    bridge = transformer_bridge_from_hf(_stock("GPT2LMHeadModel").eval())
    for name in ("generate", "generate_stream"):
        own = getattr(type(bridge).__mro__[1], name)
        method = getattr(type(bridge), name)
        assert method.__wrapped__ is own
        assert (method.__name__, method.__qualname__, method.__doc__) == (own.__name__, own.__qualname__, own.__doc__)
        parameters = inspect.signature(getattr(bridge, name)).parameters
        assert "max_new_tokens" in parameters and "use_past_kv_cache" in parameters
