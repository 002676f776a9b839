"""Session 24, closing note 23's leftovers (helper-162): each test pins one fix and fails on the code before it."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch, tiny_bcos_model

# ------------------------------------------------ 1a. silent rounding in Captum


def test_layer_bcos_and_captums_own_methods_warn_when_embedding_forward_rounds_float32_to_bfloat16():
    """EmbeddingForward rounds float32 embeddings to the bfloat16 a model computes in: BcosAttribution named it (in its
    completeness warning), while LayerBcos(fwd) and Captum's own methods through EmbeddingForward explained the
    rounded values without a word. They now warn with the same cause (the one text, _rounded_embeddings_cause)."""
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos
    from captum.attr import InputXGradient, IntegratedGradients

    model = tiny_bcos_model().to(torch.bfloat16)
    ids, mask = padded_batch()
    fwd = EmbeddingForward(model)
    embeddings = fwd.embed(ids, mask)
    rounded = r"the inputs are float32 and EmbeddingForward rounded them to bfloat16, .*Pass embeddings in the model's dtype"
    for method in (LayerBcos(fwd), InputXGradient(fwd), IntegratedGradients(fwd)):
        with pytest.warns(UserWarning, match=rounded):
            method.attribute(embeddings.float(), target=1, additional_forward_args=(mask,))
        # in the model's own dtype nothing is rounded: no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            method.attribute(embeddings, target=1, additional_forward_args=(mask,))
    # fwd called directly rounds too, and says so
    with pytest.warns(UserWarning, match=rounded):
        fwd(embeddings.float(), mask)

