"""Trust pass 23, conversion and persistence after edits (a model edited before ``bcosify``, a B-cos model edited after
it and saved, ``load_bcos_model`` of unusual folders and keywords, whole-model copies and state-dict round trips).

- A parameter held by two modules (a projection's weight tied by hand to another layer's) became two copies under
  ``bcosify``, which then trained apart, silently; the B-cos layer now holds the very parameter it is built from.
"""

from __future__ import annotations

import warnings

import torch
from test_conformance import _stock

from bcos_plugins import bcosify

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _logits(model, ids, mask=None):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids) if mask is None else mask)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


# ------------------------------------------------------------------ parameters shared before bcosify stay shared


def test_a_weight_tied_by_hand_between_two_layers_stays_one_parameter_and_trains_as_one():
    model = _stock("BertForSequenceClassification")
    layers = model.bert.encoder.layer
    layers[1].attention.output.dense.weight = layers[0].attention.output.dense.weight
    layers[1].output.LayerNorm.weight = layers[0].output.LayerNorm.weight
    bcosify(model, verbose=False)
    layers = model.bert.encoder.layer
    assert layers[1].attention.output.dense.weight is layers[0].attention.output.dense.weight
    assert layers[1].output.LayerNorm.weight is layers[0].output.LayerNorm.weight
    # one parameter, so one optimiser step moves both places alike
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(3, 50, (2, 6))
    model.train()
    model(input_ids=ids, labels=torch.tensor([0, 1])).loss.backward()
    optimiser.step()
    assert torch.equal(layers[1].attention.output.dense.weight, layers[0].attention.output.dense.weight)


def test_a_conv1d_weight_tied_by_hand_between_two_layers_stays_one_parameter():
    model = _stock("GPT2LMHeadModel")
    blocks = model.transformer.h
    blocks[1].mlp.c_fc.weight = blocks[0].mlp.c_fc.weight
    bcosify(model, verbose=False)
    assert model.transformer.h[1].mlp.c_fc.weight is model.transformer.h[0].mlp.c_fc.weight


def test_a_weight_shared_with_a_module_bcosify_keeps_stays_shared():
    # an intermediate projection of the vocabulary's width holding the word embeddings (kept as they are): the B-cos
    # layer held a copy, and training moved the two apart
    model = _stock("BertForSequenceClassification", intermediate_size=60)
    embeddings = model.bert.embeddings.word_embeddings.weight
    model.bert.encoder.layer[0].intermediate.dense.weight = embeddings
    bcosify(model, verbose=False)
    assert model.bert.encoder.layer[0].intermediate.dense.weight is model.bert.embeddings.word_embeddings.weight


def test_the_converted_layers_hold_the_parameters_they_are_built_from_frozen_or_not():
    model = _stock("LlamaForCausalLM")
    down, norm = model.model.layers[0].mlp.down_proj.weight, model.model.norm.weight
    down.requires_grad_(False)
    bcosify(model, verbose=False)
    assert model.model.layers[0].mlp.down_proj.weight is down and not down.requires_grad
    assert model.model.norm.weight is norm and norm.requires_grad
