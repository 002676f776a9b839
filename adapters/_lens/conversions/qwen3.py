"""Qwen3 (``Qwen3ForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_qwen3_weights``.

Qwen3 normalises queries and keys per head (RMSNorm, TransformerLens' ``use_qk_norm``); the norms' weights
are converted by TransformerLens, and the attention pattern they shape is a constant in explanation mode.
"""

from __future__ import annotations

from torch import nn
from transformer_lens.pretrained.weight_conversions import convert_qwen3_weights

from bcos_plugins.errors import BcosValueError

from .llama import check_rope


def activation(hf_config) -> str:
    return hf_config.hidden_act


def refuse_inexpressible(hf_config, bcos: dict | None) -> None:
    check_rope(hf_config, "Qwen3", ("default",))
    if "sliding_attention" in (getattr(hf_config, "layer_types", None) or ()):
        raise BcosValueError("Qwen3 with sliding-window layers (use_sliding_window=True): TransformerLens' Qwen3 "
                             "config has no window, so its attention would differ. Use "
                             "transformer_bridge_from_hf(model), or a model without sliding windows.")
    if bcos is None and getattr(hf_config, "attention_bias", False):
        raise BcosValueError("Qwen3 with attention_bias=True: TransformerLens' Qwen3 conversion drops the biases, "
                             "so the logits would differ. B-cosify the model (it removes biases) or use one "
                             "without.")


def prepare_config(local_config) -> None:
    pass


def adjust_config(cfg: dict, hf_config) -> None:
    pass


def state_dict(hf_model: nn.Module, cfg) -> dict:
    return convert_qwen3_weights(hf_model, cfg)
