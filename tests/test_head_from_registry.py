"""Captum's ``EmbeddingForward`` and inseq's "bcos" method decide what a model's head is from the architecture
registry (``ArchitectureSpec.head``), not from whether the model has an attribute named ``lm_head`` (before: a
base model carrying an ``lm_head`` attribute passed as a causal LM and failed deep inside the host library, and a
masked LM, whose head is ``cls``, was refused as having no LM head)."""

from __future__ import annotations

import bcos_plugins.adapters.inseq as inseq_adapter
import inseq
import pytest
import torch
import transformers as T
from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward
from conftest import padded_batch, tiny_config, tiny_model

from bcos_plugins import bcosify, explain
from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.errors import BcosTypeError, BcosValueError


def _base_model_with_an_lm_head_attribute(name: str):
    model = bcosify(tiny_model(name), b=1.5, verbose=False)
    model.lm_head = torch.nn.Linear(32, 60, bias=False)  # never called by the base model's forward
    return model


def test_captum_embedding_forward_refuses_a_base_model_even_with_an_lm_head_attribute():
    model = _base_model_with_an_lm_head_attribute("BertModel")
    # before: accepted; attribute() then failed on the base model's output, which has no .logits
    with pytest.raises(BcosTypeError, match=r"^model: EmbeddingForward wraps sequence classifiers, causal LMs and "
                                            r"masked LMs; BertModel is a base model.*Use bcos_plugins\.explain"):
        BcosAttribution(EmbeddingForward(model))


def test_captum_embedding_forward_explains_a_masked_lm_at_the_given_position_as_explain_does():
    model = bcosify(tiny_model("BertForMaskedLM"), b=1.5, verbose=False)
    ids, mask = padded_batch(side="right")
    position, target = torch.tensor([4, 2, -1]), torch.tensor([5, 9, 11])
    forward = EmbeddingForward(model)  # before: refused, "has neither class logits nor an LM head"
    embedded = forward.embed(ids, mask)
    attributions, delta = BcosAttribution(forward).attribute(
        embedded, target=target, additional_forward_args=(mask, position), return_convergence_delta=True)
    reference = explain(model, ids, mask, target=target, position=position)
    torch.testing.assert_close(attributions, reference.input_contributions, rtol=1e-5, atol=1e-6)
    assert (delta.abs() <= 1e-4 * reference.explained.abs().clamp_min(1e-3)).all()
    with pytest.raises(BcosValueError, match=r"^position: a masked LM predicts a token at every position.*Pass "
                                             r"additional_forward_args=\(attention_mask, position\)"):
        BcosAttribution(forward).attribute(embedded, target=target, additional_forward_args=(mask,))


def test_captum_embedding_forward_refuses_an_unregistered_class_naming_the_supported_ones():
    config = tiny_config("bert")
    config.is_decoder = True
    with pytest.raises(BcosTypeError, match=r"^model: transformers\.models\.bert\.modeling_bert\.BertLMHeadModel is "
                                            r"not supported by bcosify\. Pass one of the transformers classes "
                                            r".*GPT2LMHeadModel"):
        EmbeddingForward(T.BertLMHeadModel(config).eval())


def test_inseq_load_model_refuses_a_base_model_even_with_an_lm_head_attribute():
    tokenizer = T.GPT2Tokenizer.from_pretrained(SHIPPED_DATA / "gpt2_tokenizer")
    torch.manual_seed(0)
    model = bcosify(T.GPT2Model(T.GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2)).eval(),
                    b=1.5, verbose=False)
    model.lm_head = torch.nn.Linear(16, len(tokenizer), bias=False)
    # before: accepted as a causal LM; attribute() then failed in inseq ("'GPT2Model' object has no attribute
    # 'generate'")
    with pytest.raises(inseq_adapter.UnsupportedModelError, match=r"^GPT2Model is a base model: it returns hidden "
                                                                   r"states .*Supported: causal LMs GPT2LMHeadModel"):
        inseq.load_model(model, "bcos", tokenizer=tokenizer)
