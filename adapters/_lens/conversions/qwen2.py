"""Qwen2 (``Qwen2ForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_qwen2_weights``.

Qwen2 has biases on q/k/v; B-cos models have none (bcosify drops them), so the converter reads zero biases
there, which the B-cos HookedTransformer leaves out anyway.
"""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn
from transformer_lens.pretrained.weight_conversions import convert_qwen2_weights

from bcos_plugins.errors import BcosValueError

from . import with_zero_bias
from .llama import check_head_dim, check_rope


def activation(hf_config) -> str:
    return hf_config.hidden_act


def refuse_inexpressible(hf_config, bcos: dict | None) -> None:
    check_head_dim(hf_config, "Qwen2")
    check_rope(hf_config, "Qwen2", ("default",))
    if "sliding_attention" in (getattr(hf_config, "layer_types", None) or ()):
        raise BcosValueError("Qwen2 with sliding-window layers (use_sliding_window=True): TransformerLens' Qwen2 "
                             "config has no window, so its attention would differ. Use "
                             "transformer_bridge_from_hf(model), or a model without sliding windows.")


def prepare_config(local_config) -> None:
    pass


def adjust_config(cfg: dict, hf_config) -> None:
    pass


def _view(qwen: nn.Module) -> SimpleNamespace:
    """Qwen2 as TransformerLens' converter reads it, with zero q/k/v biases where B-cos removed them."""

    def projection(linear):
        return with_zero_bias(linear, linear.weight.shape[0])

    layers = [
        SimpleNamespace(
            input_layernorm=layer.input_layernorm, post_attention_layernorm=layer.post_attention_layernorm,
            mlp=layer.mlp,
            self_attn=SimpleNamespace(q_proj=projection(layer.self_attn.q_proj),
                                      k_proj=projection(layer.self_attn.k_proj),
                                      v_proj=projection(layer.self_attn.v_proj), o_proj=layer.self_attn.o_proj),
        )
        for layer in qwen.model.layers
    ]
    return SimpleNamespace(model=SimpleNamespace(embed_tokens=qwen.model.embed_tokens, layers=layers,
                                                 norm=qwen.model.norm), lm_head=qwen.lm_head)


def state_dict(hf_model: nn.Module, cfg) -> dict:
    return convert_qwen2_weights(_view(hf_model), cfg)
