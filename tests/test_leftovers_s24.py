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


# ------------------------------------------------ 1b. integers read in float32


def test_at_least_float32_reads_integers_in_float64_so_visualization_records_keep_large_integer_scores():
    """at_least_float32 turned integers into float32, which rounds every integer above 2**24: integer scores given to
    visualization_records came back 2**24 + 1 -> 2**24 (the rationale metrics had the same rounding, fixed there alone).
    Integers (and flags) are now read in float64, exact to 2**53; floating dtypes are unchanged."""
    from bcos_plugins.adapters.captum import visualization_records

    from bcos_plugins.nn.functional import at_least_float32

    for dtype in (torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool):
        assert at_least_float32(dtype) == torch.float64, dtype
    for dtype, wide in ((torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                        (torch.float64, torch.float64)):
        assert at_least_float32(dtype) == wide
    big = 2**24 + 1
    (record,) = visualization_records(scores=[torch.tensor([big, 3])], tokens=[["a", "b"]])
    assert record.word_attributions.tolist() == [big, 3]
    assert record.attr_score == big + 3
