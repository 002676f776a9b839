"""Self-Guided Attention as a TransformerLens hook on ``hook_attn_scores`` (tiny HookedTransformer)."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from bcos_plugins.guided import attn_scores_guidance_hook, guidance_hooks


def tiny_lens(attention_dir="causal", seed=0):
    cfg = HookedTransformerConfig(n_layers=3, d_model=32, n_ctx=12, d_head=8, n_heads=4, d_vocab=40,
                                  act_fn="gelu", attention_dir=attention_dir, initializer_range=0.2, seed=seed,
                                  device="cpu")
    return HookedTransformer(cfg).eval()


def tokens_and_gold():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 40, (2, 8), generator=g)
    gold = torch.zeros(2, 8)
    gold[0, [1, 2, 5]] = 1.0
    gold[1, [3]] = 1.0
    return tokens, gold


@pytest.mark.parametrize("mode", ["multiply", "add", "log1p"])
def test_lambda_zero_changes_nothing(mode):
    model = tiny_lens()
    tokens, gold = tokens_and_gold()
    plain = model(tokens)
    guided = model.run_with_hooks(tokens, fwd_hooks=guidance_hooks(3, gold, mode, 0.0, last_layers=2))
    assert torch.equal(plain, guided)


@pytest.mark.parametrize("attention_dir", ["causal", "bidirectional"])
@pytest.mark.parametrize("mode", ["multiply", "add", "replace", "log1p"])
def test_hook_pattern_matches_hand_computation(mode, attention_dir):
    model = tiny_lens(attention_dir)
    tokens, gold = tokens_and_gold()
    lam = 2.0
    _, plain_cache = model.run_with_cache(tokens, names_filter="blocks.2.attn.hook_attn_scores")
    scores = plain_cache["blocks.2.attn.hook_attn_scores"]  # masked entries are -inf
    hooks = guidance_hooks(3, gold, mode, lam, last_layers=1)
    captured = {}
    with model.hooks(fwd_hooks=hooks + [("blocks.2.attn.hook_pattern",
                                         lambda p, hook: captured.setdefault("p", p.detach()))]):
        logits = model(tokens)
    m = gold[:, None, None, :]
    allowed = torch.isfinite(scores)
    if mode == "multiply":
        expected = torch.softmax(scores * (1 + lam * m), -1)
    elif mode == "add":
        expected = torch.softmax(scores + lam * m, -1)
    elif mode == "log1p":
        p = torch.softmax(scores, -1) * (1 + lam * m)
        expected = p / p.sum(-1, keepdim=True)
    else:
        weights = m * allowed
        total = weights.sum(-1, keepdim=True)
        expected = torch.where(total > 0, weights / total.clamp_min(1e-30), torch.softmax(scores, -1))
    torch.testing.assert_close(captured["p"], expected, rtol=1e-5, atol=1e-6)
    assert (captured["p"][~allowed] == 0).all()  # causal masking is kept in every mode
    assert not torch.allclose(logits, model(tokens))


def test_hooks_target_the_last_layers_only():
    _, gold = tokens_and_gold()
    names = [name for name, _ in guidance_hooks(3, gold, "add", 1.0, last_layers=2)]
    assert names == ["blocks.1.attn.hook_attn_scores", "blocks.2.attn.hook_attn_scores"]
    with pytest.raises(ValueError, match=r"last_layers must be an int in \[1, n_layers=3\]"):
        guidance_hooks(3, gold, "add", 1.0, last_layers=4)
    with pytest.raises(ValueError, match="guidance mode"):
        attn_scores_guidance_hook(gold, "scale", 1.0)


def test_wrong_mask_shape_is_named():
    model = tiny_lens()
    tokens, gold = tokens_and_gold()
    with pytest.raises(ValueError, match="rationale_mask: must have shape"):
        model.run_with_hooks(tokens, fwd_hooks=guidance_hooks(3, gold[:, :5], "add", 1.0, last_layers=1))
