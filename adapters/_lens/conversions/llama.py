"""Llama (``LlamaForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_llama_weights``."""

from __future__ import annotations

from transformer_lens.pretrained.weight_conversions import convert_llama_weights

from ._llama_shaped import llama_shaped_conversion

CONVERSION = llama_shaped_conversion("Llama", convert_llama_weights, rope_types=("default", "llama3"),
                                     dropped_biases=("attention_bias", "mlp_bias"))
