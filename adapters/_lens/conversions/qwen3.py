"""Qwen3 (``Qwen3ForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_qwen3_weights``.

Qwen3 normalises queries and keys per head (RMSNorm, TransformerLens' ``use_qk_norm``); the norms' weights
are converted by TransformerLens, and the attention pattern they shape is a constant in explanation mode. Its
config sets ``head_dim`` itself, which TransformerLens' Qwen3 config reads.
"""

from __future__ import annotations

from transformer_lens.pretrained.weight_conversions import convert_qwen3_weights

from ._llama_shaped import llama_shaped_conversion

CONVERSION = llama_shaped_conversion("Qwen3", convert_qwen3_weights, fixed_head_dim=False,
                                     refuse_sliding_windows=True, dropped_biases=("attention_bias",))
