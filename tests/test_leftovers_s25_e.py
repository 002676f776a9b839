"""What session 25's TransformerLens helpers noticed and left (helper-187): a left-padded batch made without a BOS
given to a HookedTransformer whose pad id is its BOS id (TransformerLens' derived mask attends one padding token per
padded row) is refused naming the fixes. Each test failed before its change."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify
from bcos_plugins.data.shipped import shipped_data
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

TEXTS = ["The cat sat on the mat", "Hi"]


@pytest.fixture(scope="module")
def left_padded_gpt2():
    """A tiny B-cos GPT-2 HookedTransformer whose tokenizer pads on the left with its BOS id (GPT-2's pad = eos = bos)."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    tokenizer = T.AutoTokenizer.from_pretrained(shipped_data("gpt2_tokenizer"), padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token
    assert tokenizer.pad_token_id == tokenizer.bos_token_id
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = hooked_transformer_from_hf(bcosify(T.GPT2LMHeadModel(config).eval(), b=1.5, verbose=False),
                                       tokenizer=tokenizer)
    assert model.cfg.default_prepend_bos and model.tokenizer.padding_side == "left"
    return model


# --------------------------------------------------------------- 1. a left-padded batch made without a BOS


def _calls(model):
    from bcos_plugins.adapters.transformer_lens import explain_logits, token_component_decomposition

    return {
        "forward": lambda tokens, **kw: model(tokens, **kw)[:, -1],
        "run_with_cache": lambda tokens, **kw: model.run_with_cache(tokens, **kw)[1].decompose_resid(
            pos_slice=-1).sum(0),
        "explain_logits": lambda tokens, **kw: explain_logits(model, tokens, target=5, **kw).explained,
        "token_component_decomposition": lambda tokens, **kw: token_component_decomposition(
            model, tokens, target=5, **kw).explained,
    }


@pytest.mark.parametrize("call", ["forward", "run_with_cache", "explain_logits", "token_component_decomposition"])
def test_a_left_padded_batch_made_without_a_bos_is_refused_where_the_pad_is_the_bos(left_padded_gpt2, call):
    """``to_tokens(texts, prepend_bos=False)``, left-padded with GPT-2's pad id (its BOS id), given without a mask:
    TransformerLens derives the mask with ``cfg.default_prepend_bos=True`` and unmasks each padded row's last padding
    token as its BOS, so the short row's logits and explanation were another text's (0.03-0.6 off the text alone on
    tiny B-cos GPT-2s), without a word. Refused naming ``tokens`` and the fixes; each fix gives the text alone."""
    model = left_padded_gpt2
    run = _calls(model)[call]
    tokens = model.to_tokens(TEXTS, prepend_bos=False)
    assert tokens[1, 0] == model.tokenizer.pad_token_id and tokens[0, 0] != model.tokenizer.pad_token_id
    with pytest.raises(BcosValueError, match=r"(?s)^tokens: row 0 begins with token \d+, not the BOS id.*"
                                             r"attention_mask=.*cfg\.default_prepend_bos = False"):
        run(tokens)
    alone = run(model.to_tokens(TEXTS[1:], prepend_bos=False))[0]
    mask = (tokens != model.tokenizer.pad_token_id).long()
    torch.testing.assert_close(run(tokens, attention_mask=mask)[1], alone, atol=1e-5, rtol=0)
    model.cfg.default_prepend_bos = False
    try:
        torch.testing.assert_close(run(tokens)[1], alone, atol=1e-5, rtol=0)
    finally:
        model.cfg.default_prepend_bos = True


def test_the_model_call_with_prepend_bos_false_and_batches_with_a_bos_pass_as_before(left_padded_gpt2):
    """The correct calls keep TransformerLens' numbers: the model's own ``prepend_bos=False``, a batch with a BOS on
    every row (its padding and BOS share the id), and an unpadded batch without a BOS."""
    from transformer_lens import HookedTransformer

    model = left_padded_gpt2
    tokens = model.to_tokens(TEXTS, prepend_bos=False)
    alone = model(model.to_tokens(TEXTS[1:], prepend_bos=False))[0, -1]
    torch.testing.assert_close(model(tokens, prepend_bos=False)[1, -1], alone, atol=1e-5, rtol=0)
    with_bos = model.to_tokens(TEXTS)
    assert bool((with_bos[:, 0] == model.tokenizer.bos_token_id).all())
    assert torch.equal(model(with_bos), HookedTransformer.forward(model, with_bos))
    torch.testing.assert_close(model(with_bos)[1, -1], model(model.to_tokens(TEXTS[1:]))[0, -1], atol=1e-5, rtol=0)
    unpadded = model.to_tokens(["The cat sat", "A dog ran"], prepend_bos=False)
    assert not bool((unpadded == model.tokenizer.pad_token_id).any())
    assert torch.equal(model(unpadded), HookedTransformer.forward(model, unpadded))


# --------------------------------------------------------------- 2. plain GPT-2's cached generate


def test_the_kv_cache_refusal_does_not_say_a_plain_gpt2_bridge_generates_the_models_tokens():
    """``_without_kv_cache``'s docstring and docs/benchmarks.md#bench-bridge-generate-kv-cache said plain GPT-2's
    cached generation matched the model (true of the configurations measured there): a tiny plain GPT-2 bridge over
    the GPT-2 tokenizer's vocabulary, built by ``transformer_bridge_from_hf``, leaves the model's greedy tokens with
    TransformerLens' cache (helper-176 saw it on a booted one). The behaviour and the corrected words."""
    import copy
    from pathlib import Path

    from bcos_plugins.adapters._lens import bridge as bridge_module
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf
    from transformer_lens.model_bridge import TransformerBridge

    tokenizer = T.AutoTokenizer.from_pretrained(shipped_data("gpt2_tokenizer"))
    torch.manual_seed(0)
    hf = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4,
                                        n_positions=64)).eval()
    ids = torch.tensor([[464, 3797, 3332]])
    greedy = ids
    with torch.no_grad():
        for _ in range(8):
            greedy = torch.cat([greedy, hf(greedy).logits[:, -1].argmax(-1, keepdim=True)], 1)
    bridge = transformer_bridge_from_hf(copy.deepcopy(hf), tokenizer=tokenizer)
    options = dict(max_new_tokens=8, do_sample=False, verbose=False, stop_at_eos=False)
    assert bridge.generate(ids, **options).tolist() == greedy.tolist()
    cached = TransformerBridge.generate(bridge, ids, use_past_kv_cache=True, **options)
    assert cached[0, :4].tolist() == greedy[0, :4].tolist() and cached.tolist() != greedy.tolist()
    doc = " ".join(bridge_module._without_kv_cache.__doc__.split())
    assert "a plain GPT-2 matched" not in doc and "only plain GPT-2 matched" not in doc
    assert "plain GPT-2 matched on those configurations (left them on 0 of 6) but not on every one" in doc
    page = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
    section = page.read_text().split("{#bench-bridge-generate-kv-cache}")[1].split("\n### ")[0]
    assert "*Correction (2026-11-29 08:37 UTC, helper-187):* plain GPT-2's match held for the configurations " \
           "measured here only" in section


# --------------------------------------------------------------- 3. cfg.normalization_type edited after building

_TOKENS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


def _hooked(name: str, bcos: bool = True):
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from test_conformance import B, _stock

    stock = _stock(name)
    return hooked_transformer_from_hf((bcosify(stock, b=B, verbose=False) if bcos else stock).eval())


@pytest.mark.parametrize("name, bcos, edited", [
    ("GPT2LMHeadModel", True, "RMS"), ("LlamaForCausalLM", True, "LN"), ("LlamaForCausalLM", True, "LNPre"),
    ("GPT2LMHeadModel", False, "RMSPre"),
])
def test_a_normalization_type_edited_after_building_is_refused_by_the_ln_applying_decompositions(name, bcos, edited):
    """TransformerLens builds the norms from ``cfg.normalization_type`` once, but ``apply_ln_to_stack`` reads it again
    to decide whether to centre: ``model.cfg.normalization_type = "RMS"`` on a (B-cos) GPT-2 left the forward as it
    was and logit_attrs of decompose_resid missed the logit by 0.008 (a B-cos Llama set to "LN": 0.054), without a
    word. Refused naming the cfg field and the fix (not covered by the soft-cap / clip_qkv refusal); an edit to the
    same kind of norm (LN -> LNPre) keeps the numbers, and explain_logits (the forward's own gradients) stays exact."""
    from bcos_plugins.adapters.transformer_lens import explain_logits

    model = _hooked(name, bcos)
    logits, cache = model.run_with_cache(_TOKENS)
    before = cache.logit_attrs(cache.decompose_resid(), tokens=3)
    original = model.cfg.normalization_type
    model.cfg.normalization_type = edited
    torch.testing.assert_close(model(_TOKENS), logits, atol=1e-6, rtol=0)  # the forward does not read it
    refusal = rf"^model: .*model\.cfg\.normalization_type is '{edited}' \(changed after the model was built\?\).*" \
              r"Set model\.cfg\.normalization_type back to"
    _, cache = model.run_with_cache(_TOKENS)
    with pytest.raises(BcosValueError, match=refusal):
        cache.logit_attrs(cache.decompose_resid(), tokens=3)
    with pytest.raises(BcosValueError, match=refusal):
        cache.decompose_resid(layer=1, apply_ln=True)
    with pytest.raises(BcosValueError, match=refusal):
        cache.stack_neuron_results(1, apply_ln=True, project_output_onto=model.W_U[:, :4])
    with pytest.raises(BcosValueError, match=refusal):
        cache.accumulated_resid(layer=1, apply_ln=True)
    # at the final norm accumulated_resid runs ln_final itself (recompute_ln): right whatever the cfg says
    final_stream = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    torch.testing.assert_close(cache.accumulated_resid(apply_ln=True)[-1], model.ln_final(final_stream),
                               atol=1e-6, rtol=0)
    if bcos:
        explained = explain_logits(model, _TOKENS, target=3)
        torch.testing.assert_close(explained.input_contributions.sum((1, 2)), logits[:, -1, 3], atol=1e-5, rtol=0)
    model.cfg.normalization_type = {"LN": "LNPre", "RMS": "RMSPre"}[original]
    _, cache = model.run_with_cache(_TOKENS)
    torch.testing.assert_close(cache.logit_attrs(cache.decompose_resid(), tokens=3), before, atol=1e-6, rtol=0)


def test_a_normalization_type_of_none_is_refused_only_where_a_block_still_normalises():
    """``None`` makes the forward skip the final norm, and TransformerLens' apply_ln_to_stack skip it too: the stack
    sums to those logits (no refusal). A block's norm still runs, so ``decompose_resid(layer=1, apply_ln=True)`` would
    return the stack without it: refused."""
    model = _hooked("GPT2LMHeadModel")
    model.cfg.normalization_type = None
    logits, cache = model.run_with_cache(_TOKENS)
    torch.testing.assert_close(cache.logit_attrs(cache.decompose_resid(), tokens=3).sum(0), logits[..., 3],
                               atol=1e-5, rtol=0)
    with pytest.raises(BcosValueError, match=r"normalization_type is None .*leave unnormalised the stack"):
        cache.decompose_resid(layer=1, apply_ln=True)
