"""One convention for products of two input-dependent branches: the gate branch is the constant.

The same weights as our BilinearMLP, as a transformers gated MLP converted by bcosify's mixin, and as a
TransformerLens GatedMLP (``act_fn="linear"``, made explainable) give the same per-feature contributions
(see :mod:`bcos_plugins.bilinear.module` for the maths).
"""

from __future__ import annotations

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.transformer_lens import bilinear_config, make_explainable
from transformer_lens import HookedTransformer

from bcos_plugins import explanation_mode
from bcos_plugins.bilinear import BilinearMLP
from bcos_plugins.convert.bcosify import mixed_class
from bcos_plugins.convert.decoder_modules import BcosGatedMLP

D_MODEL, D_MLP = 8, 12


def _contributions(module, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    leaf = x.clone().requires_grad_(True)
    with explanation_mode(module):
        out = (module(leaf) * u).sum(-1)
        (grad,) = torch.autograd.grad(out.sum(), leaf)
    return (leaf * grad).detach(), out.detach()


@pytest.fixture(scope="module")
def three_layers():
    torch.manual_seed(0)
    ours = BilinearMLP(D_MODEL, D_MLP, D_MODEL)
    config = T.LlamaConfig(hidden_size=D_MODEL, intermediate_size=D_MLP, hidden_act="linear",
                           num_hidden_layers=1, num_attention_heads=2, vocab_size=10)
    hf = T.models.llama.modeling_llama.LlamaMLP(config)
    hf.__class__ = mixed_class(BcosGatedMLP, type(hf))
    lens = make_explainable(HookedTransformer(bilinear_config(
        d_model=D_MODEL, n_layers=1, n_heads=2, d_mlp=D_MLP, d_vocab=10, n_ctx=8, device="cpu")))
    tl = lens.blocks[0].mlp
    with torch.no_grad():
        hf.gate_proj.weight.copy_(ours.W.weight)
        hf.up_proj.weight.copy_(ours.V.weight)
        hf.down_proj.weight.copy_(ours.P.weight)
        tl.W_gate.copy_(ours.W.weight.T)
        tl.W_in.copy_(ours.V.weight.T)
        tl.W_out.copy_(ours.P.weight.T)
    return ours, hf, tl


def test_same_weights_same_per_feature_contributions(three_layers):
    ours, hf, tl = three_layers
    x = torch.randn(1, 5, D_MODEL, generator=torch.Generator().manual_seed(1))
    u = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(2))
    c_ours, y_ours = _contributions(ours, x, u)
    c_hf, y_hf = _contributions(hf, x, u)
    c_tl, y_tl = _contributions(tl, x, u)
    torch.testing.assert_close(y_hf, y_ours)
    torch.testing.assert_close(y_tl, y_ours)
    torch.testing.assert_close(c_hf, c_ours)
    torch.testing.assert_close(c_tl, c_ours)
    # complete, and not the product rule's 2 y
    torch.testing.assert_close(c_ours.sum(-1), y_ours)


def test_the_gate_branch_is_the_constant(three_layers):
    """Per hidden unit k the contribution of feature i is x_i V_ki (W x)_k: the gate W x is held constant."""
    ours, _, _ = three_layers
    x = torch.randn(3, D_MODEL, generator=torch.Generator().manual_seed(3))
    u = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(4))
    got, _ = _contributions(ours, x, u)
    gate = x @ ours.W.weight.T                        # (n, k)
    weight_per_unit = (u @ ours.P.weight) * gate       # (n, k)
    expected = x * (weight_per_unit @ ours.V.weight)   # (n, i)
    torch.testing.assert_close(got, expected)
