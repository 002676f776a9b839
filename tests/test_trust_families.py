"""Unusual but plausible inputs on the architecture families added last (Mistral, Qwen2, Qwen3, Gemma 2 and
ModernBERT), against the silently wrong answer: every explanation is complete, equals the model's own forward output
at the explained position, and a row's explanation does not depend on the batch it is in (padding side, a row of one
real token, length-1 inputs); positions at the edges, explicit ``position_ids``, sliding / local attention windows
shorter than the input, float16 / bfloat16 models, keywords that would change what the model computes, Captum and the
TransformerLens bridge. Tiny random models from the conformance suite's configs (2 layers, d_model 32).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import settings
from test_conformance import CONFIGS, _family

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import real_token_positions
from bcos_plugins.convert.architectures import SPECS, stock_class
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

VOCAB = 60
RTOL = 1e-4
FAMILIES = ("Mistral", "Qwen2", "Qwen3", "Gemma2", "ModernBert")
NAMES = [n for n in sorted(SPECS) if n.startswith(FAMILIES)]
POSITIONED = [n for n in NAMES if not SPECS[n].is_classifier]  # causal LMs and base models: position= applies
DECODERS = [n for n in NAMES if SPECS[n].kind == "decoder"]
FEW = settings(max_examples=4, deadline=None, derandomize=True)

_MODELS: dict[tuple[str, str], torch.nn.Module] = {}


def _bcos(name: str, **config_overrides) -> torch.nn.Module:
    """The B-cos model of ``name`` from its family's conformance config (with overrides), built once; random
    non-zero biases in the stock model so that a bias lost or kept shows."""
    key = (name, repr(sorted(config_overrides.items())))
    if key not in _MODELS:
        config = CONFIGS[_family(name)]()
        for field, value in config_overrides.items():
            setattr(config, field, value)
        torch.manual_seed(0)
        stock = stock_class(name)(config).eval()
        with torch.no_grad():
            for param_name, param in stock.named_parameters():
                if param_name.endswith("bias"):
                    param.normal_(0, 0.2)
        _MODELS[key] = bcosify(stock, b=1.25, verbose=False)
    return _MODELS[key]


def _own_outputs(model, ids, mask, **forward_kwargs):
    """The model's own (not explaining) forward: class logits, else per-position logits / hidden states. Decoders get
    position ids counted over real tokens unless given, as generate() and explain() do."""
    spec = SPECS[model.config.bcos["architecture"]]
    if spec.kind == "decoder" and "position_ids" not in forward_kwargs:
        forward_kwargs["position_ids"] = real_token_positions(mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **forward_kwargs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _assert_complete(expl):
    assert torch.isfinite(expl.input_contributions).all()
    delta = expl.delta.abs()
    assert (delta <= RTOL * expl.explained.abs().clamp_min(1e-2)).all(), (delta.tolist(), expl.explained.tolist())


def _padded(lengths: list[int], width: int, side: str, seed: int):
    """Rows of ``lengths`` real tokens (ids 3.., never the pad id 0) padded with 0 to ``width`` on ``side``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=generator)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, width - n:] = 1
        else:
            mask[row, :n] = 1
    return ids.masked_fill(mask == 0, 0), mask


# ------------------------------------------------------------------ keywords that change what the model computes


@pytest.mark.parametrize("name", ["Gemma2ForCausalLM", "Qwen3ForCausalLM"])
def test_keywords_that_slice_the_logits_or_continue_a_cache_are_refused(name):
    """logits_to_keep=k keeps the last k columns' logits, so the logits at the explained position were read from
    another column (position 0 of a 2-token input explained column 1's logit, complete and wrong); a cache's keys and
    values are constants whose share was missing, with the positions restarting at 0 after them."""
    model = _bcos(name)
    ids = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(BcosValueError, match=r"^logits_to_keep: .*another column \(got 1\)\. Leave it out"):
        explain(model, ids[:, :2], target=5, position=0, logits_to_keep=1)
    explained = explain(model, ids, target=5, logits_to_keep=0).explained  # 0 keeps every column: accepted
    torch.testing.assert_close(explained, _own_outputs(model, ids, torch.ones_like(ids))[:, -1, 5])
    with torch.no_grad():
        out = model(input_ids=ids[:, :3], use_cache=True)
    with pytest.raises(BcosValueError, match=r"^cache: holds keys and values of earlier tokens.*without a cache"):
        explain(model, ids[:, 3:], target=5, cache=getattr(out, "cache", None) or out.past_key_values)


# ------------------------------------------------------------------ ModernBERT's [CLS] pooling and left padding


def test_modernbert_cls_pooling_refuses_left_padding_and_is_batch_invariant_right_padded():
    """ModernBertForSequenceClassification with classifier_pooling="cls" (transformers' default) classifies from the
    first column's hidden state: a padding token's on a left-padded row. That row's explanation was complete on the
    model's own logit but of another function than the row's (-1.18 batched against 0.28 alone on this model, the
    padding token carrying -1.32), so left padding is refused by every text path; right padding is exact and the
    same as the row alone."""
    from bcos_plugins.adapters.captum import EmbeddingForward, LayerBcos

    model = _bcos("ModernBertForSequenceClassification", classifier_pooling="cls")
    ids, mask = _padded([8, 5, 1], 8, "left", seed=4)
    message = (r"^attention_mask: rows \[1, 2\] start with padding, and ModernBertForSequenceClassification with "
               r"config\.classifier_pooling='cls' classifies from the first column.*padding_side = 'right'")
    with pytest.raises(BcosValueError, match=message):
        explain(model, ids, mask, target=1)
    with pytest.raises(BcosValueError, match=message):
        EmbeddingForward(model).embed(ids, mask)
    with pytest.raises(BcosValueError, match=message):
        LayerBcos(model).attribute(ids, target=1, additional_forward_args=(mask,))
    ids, mask = _padded([8, 5, 1], 8, "right", seed=4)
    batched = explain(model, ids, mask, target=1)
    _assert_complete(batched)
    torch.testing.assert_close(batched.explained, _own_outputs(model, ids, mask)[:, 1])
    for row, n in enumerate([8, 5, 1]):
        alone = explain(model, ids[row:row + 1, :n], target=1)
        torch.testing.assert_close(alone.explained, batched.explained[row:row + 1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(alone.contributions[0], batched.contributions[row, :n], rtol=1e-4, atol=1e-6)
    # mean pooling (the conformance config) reads every real token: left padding is exact there
    left_ids, left_mask = _padded([8, 5, 1], 8, "left", seed=4)
    _assert_complete(explain(_bcos("ModernBertForSequenceClassification"), left_ids, left_mask, target=1))
