"""Mistral (``MistralForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_mistral_weights``.

Mistral is Llama with sliding-window attention; TransformerLens expresses the window as local attention
(``window_size``, ``attn_types="local"``), which the conformance test checks against transformers' mask.
"""

from __future__ import annotations

from transformer_lens.pretrained.weight_conversions import convert_mistral_weights

from ._llama_shaped import llama_shaped_conversion

CONVERSION = llama_shaped_conversion("Mistral", convert_mistral_weights, dropped_biases=("attention_bias", "mlp_bias"))
