"""One position limit (issues 28 and 31): how many tokens a model takes is read in one place,
``bcos_plugins.convert.architectures.position_limit``, by every path that checks a token batch or cuts windows.

Before, three readings disagreed: ``explain`` / Captum asked the registry (a rotary Llama or ModernBERT has no
limit), ``next_token_contrast`` / ``perplexity`` read ``n_positions`` or ``max_position_embeddings`` (so
``next_token_contrast`` refused a Llama batch that ``explain`` accepted, and took a RoBERTa-style table for 2 rows
longer than it is), the Space model read ``max_position_embeddings`` less the padding offset (a ModernBERT encoder
was refused past 8192 tokens, where ``explain`` accepts any length), the TransformerLens adapter let a
rotary ``HookedTransformer`` run past ``cfg.n_ctx`` into an opaque shape error from its rotary table, and
``explain_dataset`` truncated at the tokenizer's ``model_max_length`` (its docstring said the model's limit).

- every caller is walked with the function patched: each must follow the patched limit, so a caller with its
  own copy of the reading fails here;
- on a model per family kind (absolute table: BERT, GPT-2, RoBERTa; rotary: Llama, ModernBERT; TransformerLens'
  HookedTransformer and bridge) every caller refuses one token more than the limit with the same words naming
  where the model keeps it, or, without a limit, runs it;
- no module but the registry reads the configuration fields the limit comes from.
"""

from __future__ import annotations

import importlib
import re
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.captum import EmbeddingForward
from bcos_plugins.adapters.transformer_lens import (
    explain_logits,
    token_component_decomposition,
    transformer_bridge_from_hf,
)
from conftest import package_reads_of, tiny_config
from test_conformance import CONFIGS
from test_cross_path import bcos_model, lens_model

from bcos_plugins import SpaceModelForSequenceClassification, explain
from bcos_plugins.convert import architectures
from bcos_plugins.convert.architectures import PositionLimit, position_limit
from bcos_plugins.corpus import explain_dataset
from bcos_plugins.encoded_texts import truncation_length
from bcos_plugins.errors import BcosValueError
from bcos_plugins.metrics import next_token_contrast, perplexity
from bcos_plugins.pretrained import minilm_path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (2, 2.0)  # heads, B of test_cross_path's tiny models (16 positions, vocabulary 40)
# the modules that read the limit (each imports the one function by name, so each is patched where it calls it)
CALLERS = ("bcos_plugins.attribution.text", "bcos_plugins.metrics.decoder", "bcos_plugins.space.modeling",
           "bcos_plugins.adapters._lens.inputs", "bcos_plugins.corpus")
LONG_TEXT = " ".join(["a gorgeous, witty film"] * 6)  # 26 MiniLM tokens with [CLS] and [SEP]


@cache
def minilm_tokenizer():
    return T.AutoTokenizer.from_pretrained(minilm_path())


@cache
def minilm_sized_bert():
    """A tiny BERT classifier with MiniLM's vocabulary (for explain_dataset) and 16 positions."""
    torch.manual_seed(0)
    return T.BertForSequenceClassification(T.BertConfig(
        vocab_size=minilm_tokenizer().vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=2)).eval()


@cache
def models():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "gpt2": bcos_model("gpt2", *CONFIG),
            "llama": bcos_model("llama", *CONFIG),
            "bert": bcos_model("bert", *CONFIG),
            "roberta": T.RobertaForSequenceClassification(tiny_config("roberta")).eval(),
            "modernbert": T.ModernBertForSequenceClassification(CONFIGS["ModernBert"]()).eval(),
            "hooked gpt2": lens_model("gpt2", *CONFIG),
            "hooked llama": lens_model("llama", *CONFIG),
            "bridge gpt2": transformer_bridge_from_hf(bcos_model("gpt2", *CONFIG)),
            "bridge llama": transformer_bridge_from_hf(bcos_model("llama", *CONFIG)),
            "space bert": SpaceModelForSequenceClassification.from_encoder(T.BertModel(tiny_config("bert")),
                                                                           num_labels=2).eval(),
            "space roberta": SpaceModelForSequenceClassification.from_encoder(
                T.RobertaModel(tiny_config("roberta")), num_labels=2).eval(),
            "space modernbert": SpaceModelForSequenceClassification.from_encoder(
                T.ModernBertModel(CONFIGS["ModernBert"]()), num_labels=2).eval(),
        }


def _ids(length: int) -> torch.Tensor:
    return torch.randint(3, 40, (1, length), generator=torch.Generator().manual_seed(length))


def _paths():
    """(model key, path name, call on a (1, length) batch of ids): every caller of the limit, per family kind."""
    m = models()
    paths = []
    for key in ("gpt2", "llama", "bert", "roberta", "modernbert"):
        paths += [(key, "explain", lambda ids, model=m[key]: explain(model, ids, target=1)),
                  (key, "captum EmbeddingForward.embed", lambda ids, model=m[key]: EmbeddingForward(model).embed(ids))]
    for key in ("gpt2", "llama"):  # perplexity cuts windows instead (its own tests below)
        paths.append((key, "next_token_contrast",
                      lambda ids, model=m[key]: next_token_contrast(model, ids, target=1, foil=2)))
    for key in ("hooked gpt2", "hooked llama", "bridge gpt2", "bridge llama"):
        paths += [(key, "explain_logits", lambda ids, model=m[key]: explain_logits(model, ids, target=1)),
                  (key, "token_component_decomposition",
                   lambda ids, model=m[key]: token_component_decomposition(model, ids, target=1))]
    for key in ("space bert", "space roberta", "space modernbert"):
        paths.append((key, "SpaceModel", lambda ids, model=m[key]: model(input_ids=ids)))
    return paths


def _limit_of(key: str) -> PositionLimit:
    """The limit of the model a path reads (a Space model reads its encoder's)."""
    model = models()[key]
    return position_limit(model.encoder if key.startswith("space") else model)


def test_the_registry_is_the_source_of_the_limit():
    expected = {
        "gpt2": PositionLimit(16, 16, "config.n_positions"),
        "bert": PositionLimit(16, 16, "config.max_position_embeddings"),
        "roberta": PositionLimit(40, 40, "config.max_position_embeddings - pad_token_id - 1"),  # 42 rows, pad 1
        "llama": PositionLimit(None, 16, None),  # rotary: no table to run off
        "modernbert": PositionLimit(None, 40, None),
        "hooked gpt2": PositionLimit(16, 16, "cfg.n_ctx"),
        "hooked llama": PositionLimit(16, 16, "cfg.n_ctx"),  # HookedTransformer's rotary angles: n_ctx rows
        "bridge gpt2": PositionLimit(16, 16, "cfg.n_ctx"),
        "bridge llama": PositionLimit(None, 16, None),  # runs the transformers Llama
        "space bert": PositionLimit(40, 40, "config.max_position_embeddings"),
        "space roberta": PositionLimit(40, 40, "config.max_position_embeddings - pad_token_id - 1"),
        "space modernbert": PositionLimit(None, 40, None),
    }
    assert {key: _limit_of(key) for key in expected} == expected
    # outside the registry (a stock class perplexity accepts): n_positions, else max_position_embeddings less the
    # padding offset of a RoBERTa-style table
    roberta_lm = T.RobertaForCausalLM(T.RobertaConfig(**{**tiny_config("roberta").to_dict(), "is_decoder": True}))
    assert position_limit(roberta_lm) == expected["roberta"]
    assert position_limit(T.BertLMHeadModel(tiny_config("bert"))) == PositionLimit(40, 40,
                                                                                    "config.max_position_embeddings")


def test_a_space_model_has_its_encoders_limit():
    # before: the Space model's own configuration holds no position field, so position_limit said "no limit" and
    # the training helpers neither checked max_length up front nor capped their default (its forward refuses)
    for key in ("space bert", "space roberta", "space modernbert"):
        model, encoder_limit = models()[key], _limit_of(key)
        source = None if encoder_limit.source is None else f"encoder.{encoder_limit.source}"
        assert position_limit(model) == PositionLimit(encoder_limit.max_length, encoder_limit.context, source), key
    space_bert = models()["space bert"]
    assert truncation_length(space_bert, None, default=64) == 40
    with pytest.raises(BcosValueError, match=r"^max_length: is 41 but SpaceModelForSequenceClassification takes at "
                                             r"most 40 positions \(encoder\.config\.max_position_embeddings, its "
                                             r"position table\)\. Pass max_length=40 or less"):
        truncation_length(space_bert, 41, default=64)
    assert truncation_length(models()["space modernbert"], None, default=64) == 64  # rotary: no table to cap at


def test_every_caller_follows_the_one_function(monkeypatch):
    seen = []

    def patched(model):
        seen.append(model)
        return PositionLimit(4, 4, "patched.limit")

    for name in CALLERS:
        module = importlib.import_module(name)
        assert module.position_limit is position_limit, f"{name} reads the limit with its own function"
        monkeypatch.setattr(module, "position_limit", patched)
    for key, path, call in _paths():
        seen.clear()
        with pytest.raises(BcosValueError, match=r"^(input_ids|tokens): has 5 positions but the model has only 4 "
                                                 r"\(patched\.limit, its position table\)\. Truncate the inputs to 4 "
                                                 r"tokens") as info:
            call(_ids(5))
        assert seen, (key, path, str(info.value))
    # explain_dataset truncates at the patched limit by default
    out = explain_dataset(minilm_sized_bert(), minilm_tokenizer(), [LONG_TEXT], progress=False)
    assert [len(t) for t in out["tokens"]] == [4]
    # perplexity cuts its default windows at the patched context and caps max_length there
    gpt2 = models()["gpt2"]
    assert perplexity(gpt2, [list(range(3, 10))]).n_windows == 2  # 7 tokens: windows of 4 and 3
    with pytest.raises(BcosValueError, match=r"^max_length: must be in \[2, 4\], got 5"):
        perplexity(gpt2, [list(range(3, 10))], max_length=5)


def test_every_caller_refuses_past_the_limit_with_the_same_words_or_runs_without_one():
    for key, path, call in _paths():
        limit = _limit_of(key)
        if limit.max_length is None:  # rotary, no table: a batch longer than the context runs
            call(_ids(limit.context + 3))
            continue
        n = limit.max_length
        with pytest.raises(BcosValueError) as info:
            call(_ids(n + 1))
        assert re.fullmatch(rf"(input_ids|tokens): has {n + 1} positions but the model has only {n} "
                            rf"\({re.escape(limit.source)}, its position table\)\. Truncate the inputs to {n} tokens "
                            rf"\(tokenizer\(\.\.\., truncation=True, max_length={n}\), or \w+\[:, -{n}:\]\)\.?",
                            str(info.value)), (key, path, str(info.value))
        call(_ids(n))  # the limit itself runs


def test_explain_dataset_truncates_at_the_models_limit_not_the_tokenizers():
    # before: the tokenizer's model_max_length (512) left the text whole, and explain refused its 26 tokens
    out = explain_dataset(minilm_sized_bert(), minilm_tokenizer(), [LONG_TEXT, "dull"], progress=False)
    assert [len(t) for t in out["tokens"]] == [16, 3] and out["tokens"][0][-1] == "[SEP]"


def test_perplexity_windows_default_to_the_context_of_each_family():
    for key in ("gpt2", "llama"):  # a table of 16 rows; a rotary model built for 16 positions
        assert perplexity(models()[key], [list(range(3, 37))]).n_windows == 3, key  # 34 tokens: 16 + 16 + 2
        with pytest.raises(BcosValueError, match=r"^max_length: must be in \[2, 16\], got 17"):
            perplexity(models()[key], [list(range(3, 37))], max_length=17)


def test_only_the_registry_reads_the_configuration_fields_of_the_limit():
    fields = {"n_positions", "max_position_embeddings", "n_ctx"}
    # the TransformerLens converters translate a transformers config into a TransformerLens one (they write n_ctx)
    allowed = {ROOT / "bcos_plugins" / "convert" / "architectures.py"}
    copies = package_reads_of(fields, allowed)
    assert not copies, ("read a model's position limit with bcos_plugins.convert.architectures.position_limit:\n"
                        + "\n".join(copies))
    assert architectures.position_limit is position_limit
