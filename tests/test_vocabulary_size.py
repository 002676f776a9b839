"""One vocabulary size (issue 31): how many token ids a model reads is read in one place,
``bcos_plugins.convert.architectures.vocabulary_size`` (the input embedding's rows), by every path that checks ids.

Before, four readings disagreed wherever a model's configuration and its embedding do (a configuration saved out
of step with the weights, an embedding swapped with ``set_input_embeddings``, a checkpoint padded past its
tokenizer; ``resize_token_embeddings`` itself writes the new count into ``config.vocab_size``):
``explain`` / Captum and ``explain_dataset`` read the embedding's rows, ``perplexity`` the rows else
``config.vocab_size``, ``next_token_contrast`` and the Space model ``config.vocab_size``, the TransformerLens
adapter ``cfg.d_vocab`` (which a ``TransformerBridge`` copies from the transformers configuration). So with a
configuration smaller than the embedding, ``next_token_contrast``, the Space model and a bridge refused real
tokens that ``explain`` accepts; with a larger one they passed ids past the embedding into an opaque
``IndexError`` (a device-side assert on a GPU).

- every caller is walked with the function patched: each must follow the patched size, so a caller with its own
  copy of the reading fails here;
- on models whose configuration disagrees with their embedding, every caller takes the last row's id and refuses
  the next with the words naming the embedding's size;
- no module but the registry reads the fields the size comes from.
"""

from __future__ import annotations

import copy
import importlib
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.captum import EmbeddingForward
from bcos_plugins.adapters.transformer_lens import (
    explain_logits,
    hooked_transformer_from_hf,
    token_component_decomposition,
    transformer_bridge_from_hf,
)
from conftest import package_reads_of, tiny_config, tiny_model
from test_cross_path import bcos_model
from test_position_limit import CONFIG, minilm_sized_bert, minilm_tokenizer, models
from test_pretrain import word_tokenizer

from bcos_plugins import SpaceModelForSequenceClassification, explain
from bcos_plugins.convert import architectures
from bcos_plugins.convert.architectures import vocabulary_size
from bcos_plugins.corpus import explain_dataset
from bcos_plugins.errors import BcosValueError
from bcos_plugins.metrics import next_token_contrast, perplexity
from bcos_plugins.pretrain import pretrain_masked_lm
from bcos_plugins.train_decoder import train_causal_lm

ROOT = Path(__file__).resolve().parents[1]
# the modules that read the size (each imports the one function by name, so each is patched where it calls it)
CALLERS = ("bcos_plugins.attribution.text", "bcos_plugins.metrics.decoder", "bcos_plugins.space.modeling",
           "bcos_plugins.adapters._lens.inputs", "bcos_plugins.adapters._lens.bridge", "bcos_plugins.corpus",
           "bcos_plugins.train_decoder")  # pretrain goes through corpus.require_tokenizer_fits
REFUSAL = (r"^(input_ids|tokens): has ids outside the vocabulary \[0, {n}\) at row \[0\]: \[{id}\]\. Tokenise with "
           r"the model's own tokenizer")


def _paths(m: dict):
    """(model key, path name, call on a (1, length) batch of ids): every caller of the size on the models ``m``."""
    paths = []
    for key in ("gpt2", "llama", "bert"):
        if key in m:
            paths += [(key, "explain", lambda ids, model=m[key]: explain(model, ids, target=1)),
                      (key, "captum EmbeddingForward.embed",
                       lambda ids, model=m[key]: EmbeddingForward(model).embed(ids))]
    for key in ("gpt2", "llama"):
        if key in m:
            paths.append((key, "next_token_contrast",
                          lambda ids, model=m[key]: next_token_contrast(model, ids, target=1, foil=2)))
    for key in ("hooked gpt2", "bridge gpt2", "bridge llama"):
        if key in m:
            paths += [(key, "explain_logits", lambda ids, model=m[key]: explain_logits(model, ids, target=1)),
                      (key, "token_component_decomposition",
                       lambda ids, model=m[key]: token_component_decomposition(model, ids, target=1))]
    for key in ("space bert", "space roberta"):
        if key in m:
            paths.append((key, "SpaceModel", lambda ids, model=m[key]: model(input_ids=ids)))
    return paths


def test_the_embedding_rows_are_the_size():
    m = models()
    assert {key: vocabulary_size(m[key]) for key in ("gpt2", "bert", "roberta", "hooked gpt2", "bridge llama",
                                                     "space bert")} == {
        "gpt2": 40, "bert": 40, "roberta": 60, "hooked gpt2": 40, "bridge llama": 40, "space bert": 60}
    # without an embedding: cfg.d_vocab, else config.vocab_size, else nothing to check against
    for cfg, expected in ((type("Cfg", (), {"d_vocab": 7})(), 7), (None, None)):
        bare = torch.nn.Linear(2, 2)
        bare.cfg = cfg
        assert vocabulary_size(bare) == expected
    bare = torch.nn.Linear(2, 2)
    bare.config = T.GPT2Config(vocab_size=9, bos_token_id=2, eos_token_id=2)
    assert vocabulary_size(bare) == 9


def test_every_caller_follows_the_one_function(monkeypatch, tmp_path):
    seen = []

    def patched(model):
        seen.append(model)
        return 8

    for name in CALLERS:
        module = importlib.import_module(name)
        assert module.vocabulary_size is vocabulary_size, f"{name} reads the vocabulary with its own function"
        monkeypatch.setattr(module, "vocabulary_size", patched)
    m = models()
    for key, path, call in _paths(m):
        seen.clear()
        with pytest.raises(BcosValueError, match=REFUSAL.format(n=8, id=9)) as info:
            call(torch.tensor([[3, 9, 5]]))
        assert seen, (key, path, str(info.value))
        call(torch.tensor([[3, 7, 5]]))  # the last id the patched size holds runs
    gpt2 = m["gpt2"]
    with pytest.raises(BcosValueError, match=r"^target: ids must lie in \[0, 8\), got \[9\]"):
        next_token_contrast(gpt2, torch.tensor([[3, 4]]), target=9, foil=2)
    with pytest.raises(BcosValueError, match=r"^texts: texts\[0\] has token ids outside the model's vocabulary "
                                             r"\[0, 8\)"):
        perplexity(gpt2, [[3, 9, 5]])
    with pytest.raises(BcosValueError, match=r"^bos_token_id: .*\b7\b"):
        perplexity(gpt2, [[3, 4, 5]], bos_token_id=8)
    with pytest.raises(BcosValueError, match=r"^tokenizer: BertTokenizer(Fast)?\('.*'\) gives token ids up to \d+, but "
                                             r"BertForSequenceClassification\(.*\) has 8 embedding rows"):
        explain_dataset(minilm_sized_bert(), minilm_tokenizer(), ["a film"], progress=False)
    with pytest.raises(BcosValueError, match=r"^train_dataset: feature 0 has token id 9 outside the vocabulary "
                                             r"\[0, 8\)"):
        train_causal_lm(gpt2, [{"input_ids": [3, 9, 5]}], str(tmp_path), pad_token_id=0)
    # pretrain_masked_lm's refusal is corpus.require_tokenizer_fits' (06924d0): the 8 is the patched size read there
    with pytest.raises(BcosValueError, match=rf"^tokenizer: \w+\('.*'\) has {len(word_tokenizer())} tokens, but "
                                             r"BertForMaskedLM has 8 embedding rows"):
        pretrain_masked_lm(tiny_model("BertForMaskedLM"), word_tokenizer(), ["w1 w2"], progress=False)
    # the TransformerLens bridge's offline placeholder tokenizer spells one word per id the model reads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = transformer_bridge_from_hf(bcos_model("gpt2", *CONFIG))
    assert len(bridge.tokenizer) == 8


@cache
def out_of_step_models(config_size: int) -> dict:
    """Models whose configuration says ``config_size`` tokens while their embedding has other rows (gpt2, its
    bridge: 40; the Space model's BERT encoder: 60), as a configuration saved out of step with the weights is."""
    torch.manual_seed(0)
    gpt2 = copy.deepcopy(bcos_model("gpt2", *CONFIG))
    gpt2.config.vocab_size = config_size
    encoder = T.BertModel(tiny_config("bert"))
    encoder.config.vocab_size = config_size + 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = transformer_bridge_from_hf(gpt2)  # its cfg.d_vocab is the configuration's count
    assert bridge.cfg.d_vocab == config_size
    return {"gpt2": gpt2, "bridge gpt2": bridge,
            "space bert": SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2).eval()}


@pytest.mark.parametrize("config_size", [30, 60], ids=["config smaller than the embedding", "config larger"])
def test_a_configuration_out_of_step_with_the_embedding(config_size):
    # before: a smaller configuration made next_token_contrast, the Space model and the bridge refuse ids the
    # embedding holds; a larger one let ids past the embedding through to an IndexError
    m = out_of_step_models(config_size)
    for key, path, call in _paths(m):
        rows = m[key].get_input_embeddings().num_embeddings
        assert rows != (config_size + 20 if key.startswith("space") else config_size), (key, path)
        call(torch.tensor([[3, rows - 1, 5]]))
        with pytest.raises(BcosValueError, match=REFUSAL.format(n=rows, id=rows)):
            call(torch.tensor([[3, rows, 5]]))
    gpt2 = m["gpt2"]
    next_token_contrast(gpt2, torch.tensor([[3, 4]]), target=39, foil=2)
    with pytest.raises(BcosValueError, match=r"^target: ids must lie in \[0, 40\), got \[40\]"):
        next_token_contrast(gpt2, torch.tensor([[3, 4]]), target=40, foil=2)
    perplexity(gpt2, [[3, 39, 5]])
    with pytest.raises(BcosValueError, match=r"^texts: texts\[0\] has token ids outside the model's vocabulary "
                                             r"\[0, 40\)"):
        perplexity(gpt2, [[3, 40, 5]])


@pytest.mark.parametrize("config_size", [30, 60], ids=["config smaller than the embedding", "config larger"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "plain gpt2"])
def test_hooked_transformer_from_hf_sizes_its_vocabulary_from_the_weights(family, config_size):
    # before: TransformerLens built d_vocab from config.vocab_size, and loading the 40 embedding rows failed with
    # an opaque load_state_dict size mismatch
    torch.manual_seed(0)
    if family == "plain gpt2":
        hf = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=2, n_positions=16,
                                                           bos_token_id=2, eos_token_id=2)).eval()
    else:
        hf = copy.deepcopy(bcos_model(family, *CONFIG))
    hf.config.vocab_size = config_size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lens = hooked_transformer_from_hf(hf).eval()
    assert (lens.cfg.d_vocab, lens.cfg.d_vocab_out) == (40, 40)
    ids = torch.tensor([[3, 39, 5, 7]])
    with torch.no_grad():
        torch.testing.assert_close(lens(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
    explain_logits(lens, ids, target=39)
    with pytest.raises(BcosValueError, match=REFUSAL.format(n=40, id=40)):
        explain_logits(lens, torch.tensor([[3, 40, 5]]), target=1)


def test_only_the_registry_reads_the_fields_of_the_size():
    fields = {"vocab_size", "d_vocab", "num_embeddings"}
    # the TransformerLens converters translate a transformers config into a TransformerLens one (they write
    # d_vocab); Gemma 2's B-cos head passes its own vocab_size to transformers' loss function, as the stock one does
    allowed = {ROOT / "bcos_plugins" / "convert" / "architectures.py", ROOT / "bcos_plugins" / "convert" / "gemma.py"}
    copies = package_reads_of(fields, allowed)
    assert not copies, ("read a model's vocabulary size with bcos_plugins.convert.architectures.vocabulary_size:\n"
                        + "\n".join(copies))
    assert architectures.vocabulary_size is vocabulary_size
