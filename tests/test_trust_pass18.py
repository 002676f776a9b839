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


def test_a_compiled_model_with_word_embeddings_of_another_dtype_is_explained_as_the_eager_one():
    """The same model under ``torch.compile(fullgraph=True)``: the point's dtype is noted inside the forward and the
    probe made again outside it (an exception raised inside the traced forward breaks a full graph)."""
    model = bcosify(_stock("BertForSequenceClassification"), b=B, verbose=False)
    model.get_input_embeddings().to(torch.bfloat16)
    ids, mask = padded_batch()
    compiled = explain(torch.compile(model, backend="eager", fullgraph=True), ids, mask)
    eager = explain(model, ids, mask)
    assert compiled.input_contributions.dtype == torch.float32
    torch.testing.assert_close(compiled.input_contributions, eager.input_contributions, rtol=1e-5, atol=1e-6)
    assert compiled.completeness_error.max() < 1e-5


def _float64_bert_with_a_logit_offset(share: float):
    """A float64 B-cos BERT whose classifier adds ``share`` of the largest |logit| to every logit (a bias put back):
    its explanations miss that much of the logit, beyond float64 rounding by far, within bfloat16's tolerance."""
    model = bcosify(_stock("BertForSequenceClassification"), b=B, verbose=False).double()
    ids, mask = padded_batch()
    with torch.no_grad():
        offset = share * model(input_ids=ids, attention_mask=mask).logits.abs().max()
    model.classifier.register_forward_hook(lambda module, args, out: out + offset)
    return model, ids, mask


def test_a_float64_models_completeness_check_is_float64s_under_a_callers_autocast():
    """Autocast casts no float64 tensor, so a float64 model under ``torch.autocast("cpu", torch.bfloat16)`` computes in
    float64 (the same contributions bit for bit); but the check took the autocast dtype as the forward's precision,
    so ``explain`` allowed bfloat16's sqrt(eps) = 0.09 and returned contributions that miss 1-6 % of the logit (a bias
    put back) without a word, where without the autocast it refuses them. It refuses them now under autocast too."""
    from bcos_plugins.errors import BcosRuntimeError

    model, ids, mask = _float64_bert_with_a_logit_offset(0.01)
    with pytest.raises(BcosRuntimeError, match="not exact in explanation mode"):
        explain(model, ids, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.raises(BcosRuntimeError, match="where torch.float64 allows"):
        explain(model, ids, mask)


def test_captum_on_a_float64_model_under_autocast_does_not_claim_a_bfloat16_forward():
    """Captum's ``LayerBcos`` on a float64 model under bfloat16 autocast warned that the forward ran in bfloat16 and
    the attributions were complete only to its rounding (false: autocast casts no float64 tensor, they are complete
    to float64's), and a share really missing (a bias put back, 1-6 % of the logit) was passed off as that rounding
    instead of the warning that the attributions do not sum to the output."""
    from bcos_plugins.adapters.captum import LayerBcos

    model = bcosify(_stock("BertForSequenceClassification"), b=B, verbose=False).double()
    ids, mask = padded_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64, complete: no warning, autocast or not
        with torch.autocast("cpu", dtype=torch.bfloat16):
            attributions, delta = LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,),
                                                             return_convergence_delta=True)
    assert delta.abs().max() < 1e-12
    broken, ids, mask = _float64_bert_with_a_logit_offset(0.01)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match="do not sum") as record:
        LayerBcos(broken).attribute(ids, target=1, additional_forward_args=(mask,))
    assert not any("bfloat16" in str(w.message) for w in record)
