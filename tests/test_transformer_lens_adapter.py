"""TransformerLens adapter: bilinear and B-cos transformers as HookedTransformers."""

from __future__ import annotations

import importlib

import pytest
import torch
from transformer_lens import HookedTransformer
from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

import bcos_plugins.adapters.transformer_lens as tl_adapter
from bcos_plugins.adapters.transformer_lens import bilinear_config

torch.set_grad_enabled(True)


def tiny_bilinear(seed: int = 0, **kw) -> HookedTransformer:
    cfg = bilinear_config(d_model=16, n_layers=2, n_heads=4, d_mlp=24, d_vocab=40, n_ctx=16, seed=seed,
                          device="cpu", **kw)
    return HookedTransformer(cfg).eval()


def test_linear_activation_registered_idempotently():
    assert SUPPORTED_ACTIVATIONS["linear"] is tl_adapter.identity_activation
    importlib.reload(tl_adapter)  # a second import registers nothing new and does not raise
    tl_adapter.register_linear_activation()
    assert SUPPORTED_ACTIVATIONS["linear"](torch.tensor([-2.0, 3.0])).tolist() == [-2.0, 3.0]


def test_foreign_linear_registration_is_not_clobbered():
    original = SUPPORTED_ACTIVATIONS["linear"]
    SUPPORTED_ACTIVATIONS["linear"] = torch.relu
    try:
        with pytest.raises(RuntimeError, match="already registered"):
            tl_adapter.register_linear_activation()
        assert SUPPORTED_ACTIVATIONS["linear"] is torch.relu
    finally:
        SUPPORTED_ACTIVATIONS["linear"] = original


def test_bilinear_identity_through_hooks():
    model = tiny_bilinear()
    assert model.cfg.gated_mlp and model.cfg.act_fn == "linear"
    tokens = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        pre, pre_lin, post = (cache[f"blocks.{layer}.mlp.{h}"] for h in ("hook_pre", "hook_pre_linear", "hook_post"))
        torch.testing.assert_close(post, pre * pre_lin, rtol=0, atol=0)
    assert all(float(p.abs().max()) == 0.0 for n, p in model.named_parameters() if ".b_" in n or n.startswith("b_"))


def test_bilinear_config_refuses_non_bilinear_overrides():
    with pytest.raises(ValueError, match="fixes 'act_fn'"):
        bilinear_config(d_model=16, n_layers=1, n_heads=4, d_mlp=8, d_vocab=10, n_ctx=8, act_fn="gelu")
    with pytest.raises(ValueError, match="not divisible"):
        bilinear_config(d_model=15, n_layers=1, n_heads=4, d_mlp=8, d_vocab=10, n_ctx=8)
