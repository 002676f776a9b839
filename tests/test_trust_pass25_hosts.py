"""Trust pass 25, the hosts a fourth time (Captum and inseq as their users write the calls, on every registry family):
BcosAttribution / LayerBcos with Captum's target forms, convergence deltas, layer inputs and NoiseTunnel; Captum's LLM
workflow (TextTokenInput / TextTemplateInput, skip_tokens, gen_args, string and id targets) against a by-hand
log-probability gradient; Captum's metrics; inseq's attribute options, step scores, batches, aggregators and save / load.
Each test fails on the behaviour before its fix."""

from __future__ import annotations

import copy
import re
import warnings

import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
import inseq
import pytest
import torch
from bcos_plugins.adapters.captum import LayerBcos
from bcos_plugins.adapters.inseq import load_classifier
from conftest import VOCAB
from test_conformance import _word_tokenizer
from test_trust_pass22_core import _bcos

from bcos_plugins import explain
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _token_scores(seq) -> torch.Tensor:
    scores = seq.source_attributions if seq.source_attributions is not None else seq.target_attributions
    return torch.nan_to_num(scores, nan=-99.0)


# ------------------------------------------------ inseq: an output saved after aggregate(), loaded again


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "GPT2LMHeadModel", "BertForSequenceClassification"])
def test_an_inseq_output_saved_after_aggregate_loads_as_token_scores_that_aggregate_and_show_as_before(name, tmp_path):
    """``out.aggregate().save(path)`` then ``FeatureAttributionOutput.load(path)``: the loaded output's default
    aggregation was the signed sum over d_model again (its scores are decoded after inseq builds the object), so its
    ``aggregate()`` and ``show()`` refused to reduce d_model of token scores ("asks to reduce the embedding dimension
    of an output already aggregated"), where the same object before saving aggregated as itself. Now the loaded output
    aggregates and shows as the saved one, and its token scores still sum to the logits."""
    model, tokenizer = _bcos(name), _word_tokenizer()
    if name.endswith("SequenceClassification"):
        out = load_classifier(model, tokenizer).attribute(["w3 w4 w5", "w6 w7"])
    else:
        attribution_model = inseq.load_model(copy.deepcopy(model), "bcos", tokenizer=copy.deepcopy(tokenizer))
        out = attribution_model.attribute(["w3 w4 w5", "w9 w10"], ["w3 w4 w5 w6 w7 w8", "w9 w10 w11 w12"],
                                          step_scores=["logit"], show_progress=False)
    aggregated = out.aggregate()
    path = tmp_path / "aggregated.json"
    aggregated.save(str(path), overwrite=True)
    loaded = inseq.FeatureAttributionOutput.load(str(path))
    again = loaded.aggregate()
    for saved, back in zip(aggregated.sequence_attributions, again.sequence_attributions, strict=True):
        assert torch.equal(_token_scores(back), _token_scores(saved))
        scores = back.source_attributions if back.source_attributions is not None else back.target_attributions
        torch.testing.assert_close(torch.nansum(scores, 0), back.step_scores["logit"], rtol=1e-4, atol=1e-5)
    html = loaded.show(display=False, return_html=True)
    # inseq names each drawing's elements with random ids, and a saved output's step scores come back in another
    # order: the page's rows are the saved output's
    assert _rows(html) == _rows(aggregated.show(display=False, return_html=True))


def _rows(html: str) -> list[str]:
    return sorted(re.sub(r"\b[a-z]{20}_", "", html).split("<tr"))


# ------------------------------------------------ Captum: LayerBcos at the input of a block called with a mask


def test_layer_bcos_at_the_input_of_a_block_called_with_a_boolean_mask_names_the_mask_not_token_ids():
    """DistilBERT calls each TransformerBlock with its boolean attention mask positionally, and Captum attributes to
    every positional input: the refusal said "the input of TransformerBlock is token ids (torch.bool)", to a caller
    whose block input is the hidden states (a padded batch; without padding the mask is None, refused as such). Token ids (an embedding's input) are still named as such."""
    model = _bcos("DistilBertForSequenceClassification")
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 3:] = 0  # a padded batch: DistilBERT then passes its mask (without padding, None)
    block = model.distilbert.transformer.layer[1]
    with pytest.raises(BcosValueError, match=r"^attribute_to_layer_input: Captum attributes to every positional input "
                                             r"of the layer, and TransformerBlock is called with a torch\.bool tensor "
                                             r"among them \(a mask transformers passes positionally\)") as refusal:
        LayerBcos(model, layer=block).attribute(ids, target=1, additional_forward_args=(mask,),
                                                attribute_to_layer_input=True)
    assert "token ids" not in str(refusal.value)
    # its output is attributed, and at the block's output every path to the logit runs through it: complete
    attributions = LayerBcos(model, layer=block).attribute(ids, target=1, additional_forward_args=(mask,))
    expected = explain(model, ids, attention_mask=mask, target=1).explained
    torch.testing.assert_close(attributions.sum((1, 2)), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(BcosValueError, match=r"^attribute_to_layer_input: the input of Embedding is token ids"):
        LayerBcos(model, layer=model.distilbert.embeddings.word_embeddings).attribute(
            ids, target=1, additional_forward_args=(mask,), attribute_to_layer_input=True)


# ------------------------------------------------ Captum's LLM workflow: target token ids as a (1, n) tensor


def test_llm_gradient_attribution_with_a_two_dimensional_tensor_of_target_ids_names_the_one_dimensional_fix():
    """``target=tokenizer(" mat", return_tensors="pt").input_ids`` is a (1, n) tensor: Captum steps through its first
    dimension, so the one step asked LayerBcos to explain n log-probabilities at once, refused as "Pass target= for
    multi-output functions" (the caller had passed one). A 1-d tensor of the same ids is explained token by token."""
    from captum.attr import LLMGradientAttribution, TextTokenInput

    model, tokenizer = _bcos("LlamaForCausalLM"), _word_tokenizer()
    attribution = LLMGradientAttribution(LayerBcos(model), tokenizer)
    with pytest.raises(BcosValueError, match=r"^target: LLMGradientAttribution explains one target token per step and "
                                             r"got 2 at once.*Pass a 1-d tensor of token ids \(target\.reshape\(-1\)\)"):
        attribution.attribute(TextTokenInput("w3 w4 w5", tokenizer), target=torch.tensor([[7, 8]]))
    result = attribution.attribute(TextTokenInput("w3 w4 w5", tokenizer), target=torch.tensor([[7, 8]]).reshape(-1))
    assert torch.equal(result.token_attr, attribution.attribute(TextTokenInput("w3 w4 w5", tokenizer),
                                                                target="w7 w8").token_attr)
