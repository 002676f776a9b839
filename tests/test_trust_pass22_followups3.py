"""Trust pass 22, follow-ups 3 (helper-153): small mends noticed by this session's helpers. Each test fails on the
behaviour before its fix."""

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


# ------------------------------------------------ EmbeddingForward.embed of a padding token whose embedding is NaN


def test_embedding_forward_embed_names_the_padding_tokens_nan_embedding():
    """embed() of ids padded with a token whose embedding row is NaN returned NaN at the padded positions, and the
    refusal of those embeddings said "check the baseline or the noise added to them", which the caller never added:
    embed() has the ids and names the padding's row (attribution.text.non_finite_embedding_cause)."""
    from bcos_plugins.adapters.captum import EmbeddingForward

    ids, mask = padded_batch()  # rows 1 and 2 padded with id 0
    fwd = EmbeddingForward(_with_nan_row(_bcos(), 0))
    with pytest.raises(BcosValueError, match=r"^input_ids: rows \[1, 2\] embed to NaN or infinite entries.*The "
                                             r"padding token's input embedding \(model\.get_input_embeddings\(\)"
                                             r"\.weight\[0\]\) is NaN or infinite.*weight\.data\[0\] = 0") as caught:
        fwd.embed(ids, mask)
    assert "baseline" not in str(caught.value)
    # finite rows: embed() returns the attribution-point tensor as before
    assert torch.isfinite(EmbeddingForward(_bcos()).embed(ids, mask)).all()

