"""Trust pass 21, TransformerLens bridges and the tokenizer's padding side (the ordinary TransformerLens workflow on
``transformer_bridge_from_hf`` with a batch of texts of different lengths, against the HF model run on each text alone).

``transformer_bridge_from_hf`` saved and reloaded the user's tokenizer, which dropped a ``padding_side`` set after
construction (``tokenizer.padding_side = "left"``, the usual setting for decoders): ``bridge.to_tokens(texts)`` padded
on the right, so position -1 of a shorter row was a pad token, and ``cache.logit_attrs`` / ``decompose_resid`` /
``stack_head_results`` at ``pos_slice=-1`` with the batch's mask decomposed the pad position's logit, silently."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from test_conformance import B, _stock
from tokenizers import Tokenizer, models, pre_tokenizers
from transformer_lens import utils as lens_utils

from bcos_plugins import BcosError, bcosify
from bcos_plugins.errors import UnmaskedPaddingWarning

warnings.filterwarnings("ignore", category=DeprecationWarning)

FAMILIES = ["GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM"]
TEXTS = ["w3 w4 w5 w6 w7 w8", "w9 w10", "w11 w12 w13"]
TARGET = 5


def _tokenizer(padding_side: str):
    """A word-level tokenizer (pad 0, bos 1, eos 2, words w3.. w19) whose side is set after construction."""
    words = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>"] + [f"w{i}" for i in range(3, 20)])}
    backend = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = T.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                          eos_token="<eos>", unk_token="<pad>")
    tokenizer.padding_side = padding_side  # as users do; save_pretrained does not record it
    return tokenizer


_BUILT: dict = {}


def _models(name: str, padding_side: str = "left"):
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    if (name, padding_side) not in _BUILT:
        hf = bcosify(_stock(name), b=B, verbose=False).eval()
        _BUILT[name, padding_side] = hf, transformer_bridge_from_hf(hf, tokenizer=_tokenizer(padding_side))
    return _BUILT[name, padding_side]


def _alone(hf, bridge, target: int = TARGET):
    """The HF model's last-position logit of ``target`` on each text alone (no padding): the independent reference."""
    with torch.no_grad():
        return torch.stack([hf(bridge.to_tokens(text)).logits[0, -1, target] for text in TEXTS])


@pytest.mark.parametrize("name", FAMILIES)
def test_the_bridge_pads_on_the_side_of_the_users_tokenizer(name):
    hf, bridge = _models(name)
    assert bridge.tokenizer.padding_side == "left"
    tokens = bridge.to_tokens(TEXTS)
    for row, text in enumerate(TEXTS):
        alone = bridge.to_tokens(text)[0]
        assert tokens[row, -len(alone):].tolist() == alone.tolist()  # each row ends with its own last token
    _, right = _models(name, "right")
    assert right.tokenizer.padding_side == "right"
    assert right.to_tokens(TEXTS)[1, -1].item() == right.tokenizer.pad_token_id  # a right-padding one stays right


@pytest.mark.parametrize("name", FAMILIES)
def test_last_position_logit_attribution_of_a_padded_batch_equals_each_text_alone(name):
    """The TransformerLens workflow with the batch's mask: logits, logit_attrs of decompose_resid and of the stacked
    head results plus the rest, explain_logits and token_component_decomposition at position -1, against the HF
    model on each text alone (before the fix position -1 of the shorter rows was a pad token: off by about 0.1-0.5)."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    hf, bridge = _models(name)
    tokens = bridge.to_tokens(TEXTS)
    mask = lens_utils.get_attention_mask(bridge.tokenizer, tokens, prepend_bos=bridge.cfg.default_prepend_bos)
    assert bool((mask == 0).any())  # the batch is padded
    want = _alone(hf, bridge)
    scale = want.abs().max()
    targets = torch.full((len(TEXTS),), TARGET)
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens, attention_mask=mask)
        resid = cache.decompose_resid(pos_slice=-1, return_labels=False)
        attrs = cache.logit_attrs(resid, tokens=targets, pos_slice=-1)
    assert ((logits[:, -1, TARGET] - want).abs().max() / scale) < 1e-5
    b_u = bridge.b_U[TARGET] if getattr(bridge, "b_U", None) is not None else 0.0
    assert ((attrs.sum(0) + b_u - want).abs().max() / scale) < 1e-4
    explained = explain_logits(bridge, tokens, target=TARGET, position=-1, attention_mask=mask)
    assert ((explained.explained - want).abs().max() / scale) < 1e-5
    shares = token_component_decomposition(bridge, tokens, target=TARGET, position=-1, attention_mask=mask)
    assert ((shares.explained - want).abs().max() / scale) < 1e-5


@pytest.mark.parametrize("name", FAMILIES)
def test_an_unmasked_padded_batch_is_warned_about_naming_attention_mask(name):
    """Without the mask the bridge attends to the padding (a tensor input gets no mask from TransformerLens): the
    adapter's entry points warn, as the core explain does, instead of explaining it silently."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    for side in ("left", "right"):
        _, bridge = _models(name, side)
        tokens = bridge.to_tokens(TEXTS)
        with pytest.warns(UnmaskedPaddingWarning, match="attention_mask"):
            explain_logits(bridge, tokens, target=TARGET, position=-1)
        with pytest.warns(UnmaskedPaddingWarning, match="attention_mask"):
            token_component_decomposition(bridge, tokens, target=TARGET, position=-1)


def test_the_side_check_fails_loudly_when_transformer_lens_changes_the_tokenizers_side(monkeypatch):
    """TransformerLens' boot sets a cfg's default_padding_side over the tokenizer's: the one check refuses a bridge
    whose side differs from the given tokenizer's instead of padding on another side silently."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf
    from transformer_lens.model_bridge.sources import transformers as lens_sources

    setup = lens_sources.setup_tokenizer
    monkeypatch.setattr(lens_sources, "setup_tokenizer", lambda tokenizer, **_: setup(tokenizer, default_padding_side="right"))
    hf, _ = _models("GPT2LMHeadModel")
    with pytest.raises(BcosError, match="padding_side='right' where the given one has 'left'.*padding_side="):
        transformer_bridge_from_hf(hf, tokenizer=_tokenizer("left"))
