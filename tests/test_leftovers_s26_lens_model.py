"""What note 25 left about the adapter's HookedTransformer wrapper (adapters/_lens/model.py) and the lens "possibly
silent" items (helper-194): the forward's arguments read through the installed TransformerLens' own signature, the
pad == BOS check's one host sync, the check at a cached ``generate``'s prompt, the logit-lens recipe on a soft-capped
Gemma 2, why a float64 Qwen3 HookedTransformer is not the float64 transformers model to float64 rounding, and what
plain GPT-2's ``logit_attrs`` leaves out. Each test failed before its change (the docs ones before their sentence)."""

from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path

import pytest
import test_leftovers_s25_e as session25
import torch
import transformers as T

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

TEXTS = session25.TEXTS
left_padded_gpt2 = session25.left_padded_gpt2  # the tiny B-cos GPT-2 whose tokenizer pads on the left with its BOS id
PAGE = Path(__file__).resolve().parents[1] / "docs" / "hosts" / "transformer-lens.md"
GENERATE = dict(max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False)


def _page() -> str:
    return " ".join(PAGE.read_text().split())  # one line: sentences wrap anywhere


# --------------------------------------------------------------- 1. the forward's arguments, by the installed signature


def test_the_forwards_arguments_are_read_through_the_installed_signature(left_padded_gpt2, monkeypatch):
    """The pad == BOS check read the forward's positional arguments through a hard-coded copy of TransformerLens
    3.x's parameter order, so a release that reorders them (here: ``attention_mask`` third) had a mask given by
    position read as ``loss_per_token`` and the correct call refused. The installed class's own signature is read."""
    from transformer_lens import HookedTransformer

    model = left_padded_gpt2
    original = HookedTransformer.forward

    def reordered(self, input, return_type="logits", attention_mask=None, **rest):  # noqa: A002  (TL's name)
        return original(self, input, return_type=return_type, attention_mask=attention_mask, **rest)

    tokens = model.to_tokens(TEXTS, prepend_bos=False)
    mask = (tokens != model.tokenizer.pad_token_id).long()
    alone = model(model.to_tokens(TEXTS[1:], prepend_bos=False))[0, -1]
    monkeypatch.setattr(HookedTransformer, "forward", reordered)
    with torch.no_grad():
        logits = model(tokens, "logits", mask)  # was refused: "row 0 begins with token ..., not the BOS id"
    torch.testing.assert_close(logits[1, -1], alone, atol=1e-5, rtol=0)
    with pytest.raises(BcosValueError, match=r"^tokens: row 0 begins with token"):
        model(tokens, "logits")  # without the mask: still refused under the new order


# --------------------------------------------------------------- 2. the pad == BOS check syncs once


def _count_check_syncs(monkeypatch, call) -> collections.Counter:
    """Run ``call`` and count the syncing Tensor methods called from adapters/_lens/inputs.py (the pad == BOS check)."""
    from bcos_plugins.adapters._lens import inputs

    source = inputs.__file__
    counts: collections.Counter = collections.Counter()

    def counting(name):
        method = getattr(torch.Tensor, name)

        def counted(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename == source:
                counts[name] += 1
            return method(self, *args, **kwargs)
        return counted

    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "nonzero", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    call()
    monkeypatch.undo()
    return counts


@pytest.mark.parametrize("batch, syncs", [("unpadded, no BOS", 1), ("a BOS on every row", 1), ("one row", 0)])
def test_the_pad_bos_check_brings_its_condition_to_the_host_once(left_padded_gpt2, monkeypatch, batch, syncs):
    """The check read ``begins_with_pad.all()`` and ``.any()`` apart: two device-to-host syncs per forward for a
    batch without padding (each a wait for the stream on a GPU). One now, none for a single row (which cannot mix
    rows with and without padding); the refusal is unchanged (tests/test_leftovers_s25_e.py)."""
    model = left_padded_gpt2
    tokens = {"unpadded, no BOS": model.to_tokens(["The cat sat", "A dog ran"], prepend_bos=False),
              "a BOS on every row": model.to_tokens(TEXTS),
              "one row": model.to_tokens(TEXTS[:1], prepend_bos=False)}[batch]
    with torch.no_grad():
        model(tokens)  # the weights' finiteness check runs once per weight version: not counted below
        counts = _count_check_syncs(monkeypatch, lambda: model(tokens))
    assert sum(counts.values()) == syncs, dict(counts)


# --------------------------------------------------------------- 3. generate checks its prompt


@pytest.mark.parametrize("call", ["generate, cached", "generate, uncached", "generate_stream, cached"])
def test_generate_on_a_left_padded_batch_made_without_a_bos_is_refused_at_its_prompt(left_padded_gpt2, call):
    """TransformerLens 3.9's ``generate`` derives the prompt's mask with ``cfg.default_prepend_bos=True`` and runs every
    step from the residual with it (cached or not); ``generate_stream`` with the key-value cache passes the prompt
    with a cache. Neither was checked, and the short row generated another text's tokens without a word. Refused at
    the prompt, naming the fixes ``generate`` takes (not ``attention_mask=``, which it drops); they give the text
    alone's tokens."""
    model = left_padded_gpt2
    method, cached = call.split(", ")
    options = dict(GENERATE, use_past_kv_cache=cached == "cached")

    def run(tokens, **kw):
        if method == "generate":
            return model.generate(tokens, **options, **kw)
        return torch.cat(list(model.generate_stream(tokens, max_tokens_per_yield=100, **options, **kw))[-1:], 1)

    tokens = model.to_tokens(TEXTS, prepend_bos=False)
    with pytest.raises(BcosValueError, match=r"(?s)^tokens: row 0 begins with token \d+, not the BOS id.*"
                                             r"Pass prepend_bos=False \(this call takes no attention_mask\)"):
        run(tokens)
    alone = run(model.to_tokens(TEXTS[1:], prepend_bos=False))[0, -GENERATE["max_new_tokens"]:]
    assert run(tokens, prepend_bos=False)[1, -GENERATE["max_new_tokens"]:].tolist() == alone.tolist()


def test_generate_passes_correct_prompts_as_transformer_lens_and_later_cached_steps_are_not_checked(
        left_padded_gpt2):
    """A batch with a BOS on every row generates TransformerLens' own tokens; a cached forward past the prompt (one new
    token a row, where a row that generated the pad id, GPT-2's eos, reads as padding) is not checked."""
    from transformer_lens import HookedTransformer
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    model = left_padded_gpt2
    with_bos = model.to_tokens(TEXTS)
    assert torch.equal(model.generate(with_bos, **GENERATE), HookedTransformer.generate(model, with_bos, **GENERATE))
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 2)
    with torch.no_grad():
        model(with_bos, past_kv_cache=cache)
        step = torch.tensor([[model.tokenizer.pad_token_id], [5]])
        assert model(step, past_kv_cache=cache).shape[:2] == (2, 1)  # not read as a padded batch without a BOS


@pytest.mark.parametrize("call", ["forward", "generate"])
def test_the_calls_padding_side_is_the_one_the_check_reads(left_padded_gpt2, call):
    """``padding_side="left"`` given to the forward or ``generate`` of a model whose tokenizer pads on the right: while
    they derive the mask TransformerLens sets the tokenizer's side to the call's, so a left-padded batch made without a
    BOS had a padding token unmasked (0.57 off the text alone), while the check read the tokenizer's "right" and let
    it through. The call's side is read."""
    model = left_padded_gpt2
    tokens = model.to_tokens(TEXTS, prepend_bos=False)
    run = {"forward": lambda **kw: model(tokens, **kw),
           "generate": lambda **kw: model.generate(tokens, **GENERATE, **kw)}[call]
    model.tokenizer.padding_side = "right"
    try:
        with pytest.raises(BcosValueError, match=r"^tokens: row 0 begins with token"):
            run(padding_side="left")  # ran, silently
        with torch.no_grad():
            run()  # the tokenizer's right padding: TransformerLens derives no BOS-style mask on the left
    finally:
        model.tokenizer.padding_side = "left"


# --------------------------------------------------------------- 4. the logit lens on a soft-capped Gemma 2


def test_the_logit_lens_on_a_soft_capped_gemma2_goes_through_the_unembedding():
    """TransformerLens' logit-lens recipe ``cache.accumulated_resid(apply_ln=True) @ model.W_U`` leaves out a B-cos
    Gemma 2's final-logit soft-cap, which its unembedding applies (``cfg.output_logits_soft_cap`` reads -1 there, so
    ``utils.apply_softcap`` with it does nothing): at the last layer it is not the model's logits. ``model.unembed``
    applies the cap; the page says so."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    torch.manual_seed(0)
    config = T.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                            query_pre_attn_scalar=8, final_logit_softcapping=0.5)
    model = hooked_transformer_from_hf(bcosify(T.Gemma2ForCausalLM(config), b=1.25, verbose=False).eval())
    assert model.cfg.output_logits_soft_cap < 0 and model.cfg.bcos_output_logits_soft_cap == 0.5
    tokens = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        lens = cache.accumulated_resid(apply_ln=True)
        assert (lens[-1] @ model.W_U - logits).abs().max() > 1e-2  # the recipe misses the cap
        torch.testing.assert_close(model.unembed(lens)[-1], logits, atol=1e-6, rtol=0)
    page = _page()
    assert "accumulated_resid(apply_ln=True) @ model.W_U" in page and "model.unembed(" in page
    assert "bcos_output_logits_soft_cap" in page.split("logit lens", 1)[1][:1500]


# --------------------------------------------------------------- 5. float64 Qwen3


def _float64_transformers_steps(model_module, norm: str, rotary: str):
    """transformers' RMSNorm and rotary table of ``model_module`` computed in float64 (transformers computes both in
    float32 whatever the model's dtype: ``hidden_states.to(torch.float32)``, ``position_ids.float() * inv_freq``)."""
    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary_table(self, x, position_ids):
        base, dim = self.config.rope_parameters["rope_theta"], 2 * self.inv_freq.numel()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        emb = torch.cat([position_ids[..., None].double() * inv_freq] * 2, dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    return {(getattr(model_module, norm), "forward"): rms_norm, (getattr(model_module, rotary), "forward"): rotary_table}


@pytest.mark.parametrize("bcos", [False, True], ids=["plain", "bcos"])
def test_a_float64_qwen3_hooked_transformer_is_the_float64_model_where_transformers_stays_float32(monkeypatch, bcos):
    """A float64 Qwen3 HookedTransformer was 5e-8 (plain) / 1e-8 (B-cos) off the float64 transformers model: neither
    the conversion nor TransformerLens, but transformers, whose RMSNorm (also q_norm / k_norm) and rotary table are
    float32 in a float64 model. With those two steps in float64 the two agree to float64 rounding (the page says so)."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from transformers.models.qwen3 import modeling_qwen3

    torch.manual_seed(0)
    config = T.Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    hf = T.Qwen3ForCausalLM(config).eval()
    hf = (bcosify(hf, b=1.5, verbose=False) if bcos else hf).eval().double()
    hooked = hooked_transformer_from_hf(hf)
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = hooked(tokens)
        assert (hf(tokens).logits - logits).abs().max() > 1e-10  # transformers' float32 steps
        for (owner, name), step in _float64_transformers_steps(modeling_qwen3, "Qwen3RMSNorm",
                                                                "Qwen3RotaryEmbedding").items():
            monkeypatch.setattr(owner, name, step)
        torch.testing.assert_close(hf(tokens).logits, logits, atol=1e-13, rtol=0)
    assert "a float64 Qwen3 `HookedTransformer`, plain or B-cos, is the float64 transformers model to 1e-13" in _page()


# --------------------------------------------------------------- 6. plain GPT-2's logit_attrs


def test_plain_gpt2s_logit_attrs_leave_out_the_unembedding_bias_as_the_page_says():
    """Plain GPT-2's ``logit_attrs`` over any residual stack summed to the logit minus ``b_U[token]`` (the final
    LayerNorm's bias, folded into ``b_U`` with its weight): TransformerLens' stacks have no component for it (its
    design). The page says so and what to add; with it the sum is the logit."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    torch.manual_seed(0)
    hf = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)).eval()
    with torch.no_grad():
        for name, parameter in hf.named_parameters():
            if name.endswith("bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))  # trained-like biases (the init's are zero)
    model = hooked_transformer_from_hf(hf)
    tokens = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    target = torch.tensor([5, 9])
    logits, cache = model.run_with_cache(tokens)
    logit = logits[:, -1].gather(1, target[:, None])[:, 0]
    for stack in (cache.decompose_resid(pos_slice=-1), cache.accumulated_resid(pos_slice=-1)[-1:],
                  cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=False)):
        total = cache.logit_attrs(stack, tokens=target, pos_slice=-1).sum(0)
        assert (total - logit).abs().max() > 1e-3
        torch.testing.assert_close(total + model.b_U[target], logit, atol=1e-5, rtol=0)
    page = _page()
    assert "model.b_U[tokens]" in page and "token_component_decomposition" in page.split("model.b_U[tokens]", 1)[1][:600]
