"""Llama (``LlamaForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_llama_weights``."""

from __future__ import annotations

from torch import nn
from transformer_lens.pretrained.weight_conversions import convert_llama_weights

from bcos_plugins.errors import BcosValueError

ROPE_TYPES = ("default", "llama3")


def activation(hf_config) -> str:
    return hf_config.hidden_act


def check_head_dim(hf_config, family: str) -> None:
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    if head_dim * heads != hf_config.hidden_size:
        raise BcosValueError(
            f"{family} head_dim={head_dim} with {heads} heads != hidden_size={hf_config.hidden_size}: "
            f"TransformerLens' {family} conversion assumes d_head = hidden_size // num_attention_heads."
        )


def check_rope(hf_config, family: str, rope_types: tuple[str, ...] = ROPE_TYPES) -> None:
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = (rope.get("rope_type") or rope.get("type") or "default").lower()
    if rope_type not in rope_types:
        raise BcosValueError(
            f"rope_type={rope_type!r} is not expressed by TransformerLens' {family} config "
            f"({' and '.join(rope_types)} are); convert a model with standard rotary embeddings."
        )


def refuse_inexpressible(hf_config, bcos: dict | None) -> None:
    check_head_dim(hf_config, "Llama")
    if bcos is None and (getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)):
        raise BcosValueError(
            "Llama with attention_bias/mlp_bias=True: TransformerLens' Llama conversion drops biases, "
            "so the logits would differ. B-cosify the model (it removes biases) or use one without."
        )
    check_rope(hf_config, "Llama")


def prepare_config(local_config) -> None:
    pass


def adjust_config(cfg: dict, hf_config) -> None:
    pass


def state_dict(hf_model: nn.Module, cfg) -> dict:
    return convert_llama_weights(hf_model, cfg)
