"""Trust pass 18, precision and compilation: ``explain``, Captum's wrappers, inseq's ``"bcos"``, the TransformerLens
paths, the metrics and training under ``torch.autocast`` (bfloat16, float16), models cast with ``.half()``,
``.bfloat16()``, ``.double()`` or with embeddings and layers in different dtypes, ``torch.compile`` (fullgraph and
not, dynamic shapes, after B changes, explanation mode switches, ``reuse_unit_weights()`` and ``load_bcos_model``) and
the opt-in Triton path, each compared with the same computation in float64, eager, without autocast, or the model's
own logits. The cases that were silently wrong or crashed unhelpfully, one test each."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch
from test_conformance import B, _stock

from bcos_plugins import bcosify, explain

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "DistilBertForSequenceClassification",
                                  "RobertaForSequenceClassification"])
def test_word_embeddings_of_another_dtype_than_the_position_table_are_explained_at_the_promoted_point(name):
    """Word embeddings cast to bfloat16 beside a float32 position table: the model runs (the sum is float32 from
    there on), but ``explain`` made its probe in the word embeddings' dtype and failed with an internal message
    ("capture_point: ... make the probe like the point"), where Captum's ``EmbeddingForward`` explained it. The
    probe is now made in the point's dtype: the contributions are float32, complete to the model's own logit and
    the same as Captum's."""
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward

    model = bcosify(_stock(name), b=B, verbose=False)
    model.get_input_embeddings().to(torch.bfloat16)
    ids, mask = padded_batch()
    result = explain(model, ids, mask)
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=mask).logits
    assert result.input_contributions.dtype == torch.float32
    torch.testing.assert_close(result.explained, own.gather(1, result.target[:, None])[:, 0], rtol=0, atol=0)
    assert result.completeness_error.max() < 1e-5
    forward = EmbeddingForward(model)
    captum = BcosAttribution(forward).attribute(forward.embed(ids, mask), target=result.target,
                                                additional_forward_args=(mask,))
    torch.testing.assert_close(result.input_contributions, captum, rtol=1e-6, atol=1e-7)
