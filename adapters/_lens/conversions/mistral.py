"""Mistral (``MistralForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_mistral_weights``.

Mistral is Llama with sliding-window attention; TransformerLens expresses the window as local attention
(``window_size``, ``attn_types="local"``), which the conformance test checks against transformers' mask.
"""

from __future__ import annotations

from torch import nn
from transformer_lens.pretrained.weight_conversions import convert_mistral_weights

from bcos_plugins.errors import BcosValueError

from .llama import check_head_dim, check_rope


def activation(hf_config) -> str:
    return hf_config.hidden_act


def refuse_inexpressible(hf_config, bcos: dict | None) -> None:
    check_head_dim(hf_config, "Mistral")
    check_rope(hf_config, "Mistral", ("default",))
    if bcos is None and (getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)):
        raise BcosValueError("Mistral with biases: TransformerLens' Mistral conversion has none, so the logits "
                             "would differ. B-cosify the model (it removes biases) or use one without.")


def prepare_config(local_config) -> None:
    pass


def adjust_config(cfg: dict, hf_config) -> None:
    pass


def state_dict(hf_model: nn.Module, cfg) -> dict:
    return convert_mistral_weights(hf_model, cfg)
