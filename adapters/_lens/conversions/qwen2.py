"""Qwen2 (``Qwen2ForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_qwen2_weights``.

Qwen2 has biases on q/k/v; B-cos models have none (bcosify drops them), so the converter reads zero biases
there, which the B-cos HookedTransformer leaves out anyway.
"""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn
from transformer_lens.pretrained.weight_conversions import convert_qwen2_weights

from . import with_zero_bias
from ._llama_shaped import llama_shaped_conversion


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


# TransformerLens converts Qwen2's q/k/v biases (none are dropped)
CONVERSION = llama_shaped_conversion("Qwen2", convert_qwen2_weights, refuse_sliding_windows=True, view=_view)
