"""``hidden_act="gelu_accurate"`` through ``hooked_transformer_from_hf``: refused before ("activation
'gelu_accurate' ... has no TransformerLens counterpart"), though transformers' ``AccurateGELUActivation`` is
TransformerLens' ``gelu_new`` term for term. It is mapped to ``gelu_new`` now: the premise is pinned bit for bit,
and the hooked model's logits and decompositions are checked against the transformers model's, plain and B-cos;
the bridge, which runs the transformers activation itself, is checked for the B-cos model too."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.transformer_lens import (
    explain_logits,
    hooked_transformer_from_hf,
    token_component_decomposition,
    transformer_bridge_from_hf,
)
from conftest import tiny_config
from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS
from transformers.activations import ACT2FN

from bcos_plugins import bcosify


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gelu_accurate_is_transformer_lens_gelu_new_bit_for_bit(dtype):
    x = torch.cat([torch.linspace(-20, 20, 400_001, dtype=torch.float64),
                   4 * torch.randn(200_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))]).to(dtype)
    assert torch.equal(ACT2FN["gelu_accurate"](x), SUPPORTED_ACTIVATIONS["gelu_new"](x))


def _model(family: str, cls: str, key: str, act: str, bcos: bool):
    config = tiny_config(family)
    setattr(config, key, act)
    torch.manual_seed(0)
    hf = getattr(T, cls)(config).eval().double()
    return bcosify(hf, b=1.5, verbose=False) if bcos else hf


@pytest.mark.parametrize("bcos", [False, True], ids=["plain", "bcos"])
@pytest.mark.parametrize("family, cls, key", [("gpt2", "GPT2LMHeadModel", "activation_function"),
                                              ("llama", "LlamaForCausalLM", "hidden_act")])
def test_a_gelu_accurate_model_is_hooked_with_the_same_logits_and_complete_decompositions(family, cls, key, bcos):
    hf = _model(family, cls, key, "gelu_accurate", bcos)
    hooked = hooked_transformer_from_hf(hf)  # was refused: "'gelu_accurate' ... no TransformerLens counterpart"
    assert hooked.cfg.act_fn == "gelu_new"
    tokens = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    # the same weights under gelu_new, a name TransformerLens took already: the same model, bit for bit
    as_gelu_new = hooked_transformer_from_hf(_model(family, cls, key, "gelu_new", bcos))
    with torch.no_grad():
        assert torch.equal(hooked(tokens), as_gelu_new(tokens))
    # against the transformers model: GPT-2 to float64 rounding; Llama's hooked rotary tables differ from
    # transformers' by ~4e-8 in float64 whatever the activation (silu alike), so its tolerance is theirs
    atol = 1e-12 if family == "gpt2" else 1e-6
    paths = [hooked] + ([transformer_bridge_from_hf(hf)] if bcos else [])  # the plain bridge: test_trust_pass19
    for model in paths:
        with torch.no_grad():
            torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=0, atol=atol)
        explanation = explain_logits(model, tokens, target=5)
        assert (explanation.completeness_error < 1e-10).all(), explanation.completeness_error
        decomposition = token_component_decomposition(model, tokens, target=5)
        assert (decomposition.completeness_error < 1e-10).all(), decomposition.completeness_error
