"""GPT-2 (``GPT2LMHeadModel``) -> HookedTransformer, through TransformerLens' ``convert_gpt2_weights``."""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

from bcos_plugins.errors import BcosValueError

from . import LensConversion, with_zero_bias


def _activation(hf_config) -> str:
    return hf_config.activation_function


def _refuse_inexpressible(hf_config, bcos: dict | None) -> None:
    if getattr(hf_config, "add_cross_attention", False):
        raise BcosValueError("GPT-2 with add_cross_attention=True cannot be expressed as a HookedTransformer.")


def _prepare_config(local_config) -> None:
    local_config.n_ctx = local_config.n_positions  # TransformerLens reads n_ctx, which GPT2Config may lack


def _adjust_config(cfg: dict, hf_config) -> None:
    if getattr(hf_config, "n_inner", None):
        cfg["d_mlp"] = hf_config.n_inner  # TransformerLens assumes 4 * n_embd


def _view(gpt2: nn.Module) -> SimpleNamespace:
    """GPT-2 as TransformerLens' converter reads it, with zero biases where B-cos removed them."""
    t = gpt2.transformer

    def conv(m):
        return with_zero_bias(m, m.weight.shape[1])

    def norm(m):
        return with_zero_bias(m, m.weight.shape[0])

    blocks = [
        SimpleNamespace(
            ln_1=norm(h.ln_1), ln_2=norm(h.ln_2),
            attn=SimpleNamespace(c_attn=conv(h.attn.c_attn), c_proj=conv(h.attn.c_proj)),
            mlp=SimpleNamespace(c_fc=conv(h.mlp.c_fc), c_proj=conv(h.mlp.c_proj)),
        )
        for h in t.h
    ]
    return SimpleNamespace(
        transformer=SimpleNamespace(wte=t.wte, wpe=t.wpe, h=blocks, ln_f=norm(t.ln_f)), lm_head=gpt2.lm_head)


def _state_dict(hf_model: nn.Module, cfg) -> dict:
    return convert_gpt2_weights(_view(hf_model), cfg)


CONVERSION = LensConversion(state_dict=_state_dict, refuse_inexpressible=_refuse_inexpressible,
                            activation=_activation, prepare_config=_prepare_config, adjust_config=_adjust_config)
