"""Gemma 2 (``Gemma2ForCausalLM``) -> HookedTransformer, through TransformerLens' ``convert_gemma_weights``.

TransformerLens 3.9 converts Gemma 2's config only by hub name (its ``google/gemma-2-*`` entries), so the config
dict is built here from the transformers config, in those entries' field names: pre- and post-norms
(``use_normalization_before_and_after``, RMSNorm gains ``1 + weight`` added by the weight conversion), GeGLU
(``gelu_pytorch_tanh``), embeddings scaled by ``sqrt(d_model)`` (folded into ``W_E`` by the weight conversion, so
``hook_embed`` is the scaled embedding, the transformers model's attribution point), queries scaled by
``query_pre_attn_scalar ** -0.5`` (``attn_scale``), sliding-window layers alternating with global ones
(``attn_types``, ``window_size``) and both soft-caps. The attention-score soft-cap only shapes the pattern (a
constant in explanation mode); the final-logit soft-cap is applied by the B-cos unembedding as a dynamic scale
(:class:`~bcos_plugins.adapters._lens.unembed.BcosSoftCappedUnembed`). A plain (not B-cosified) model with the
final-logit soft-cap is refused by ``make_explainable``: TransformerLens' forward applies it inline.
"""

from __future__ import annotations

import transformers
from packaging.version import Version
from transformer_lens.loading_from_pretrained import _get_rope_theta
from transformer_lens.pretrained.weight_conversions import convert_gemma_weights
from transformer_lens.utilities.activation_functions import SOFTCAP_DISABLED

from bcos_plugins.errors import BcosValueError

from . import LensConversion
from ._llama_shaped import check_no_dropped_biases, check_rope

_FAMILY = "Gemma 2"
# The oldest transformers on which this conversion was checked to reproduce the transformers model's logits. On
# transformers 5.9 (the package's declared floor) its Gemma 2 gives other logits than TransformerLens' Gemma 2 from
# the second position on (found by the lowest-versions environment), so older versions are refused, not converted.
GEMMA2_MIN_TRANSFORMERS = "5.24"
# transformers' layer types -> TransformerLens' attention types
_ATTENTION_TYPES = {"sliding_attention": "local", "full_attention": "global"}


def _activation(hf_config) -> str:
    return hf_config.hidden_activation


def _soft_cap(value) -> float:
    return SOFTCAP_DISABLED if value is None else float(value)


def _refuse_inexpressible(hf_config, bcos: dict | None) -> None:
    if Version(transformers.__version__) < Version(GEMMA2_MIN_TRANSFORMERS):
        raise BcosValueError(
            f"{_FAMILY} through hooked_transformer_from_hf needs transformers >= {GEMMA2_MIN_TRANSFORMERS}; the "
            f"installed {transformers.__version__} computes Gemma 2 logits that TransformerLens' Gemma 2 does not "
            f"reproduce. Upgrade transformers (pip install 'transformers>={GEMMA2_MIN_TRANSFORMERS}').")
    if getattr(hf_config, "use_bidirectional_attention", None):
        raise BcosValueError(
            f"{_FAMILY} with use_bidirectional_attention=True: TransformerLens' attention is causal, so its logits "
            "would differ. Convert a causal Gemma 2 (use_bidirectional_attention=False).")
    check_rope(hf_config, _FAMILY, ("default",))
    check_no_dropped_biases(hf_config, bcos, _FAMILY, ("attention_bias",))
    layer_types = list(hf_config.layer_types)
    unknown = sorted({t for t in layer_types if t not in _ATTENTION_TYPES})
    if unknown:
        raise BcosValueError(
            f"{_FAMILY} layer_types {unknown}: TransformerLens' attention types express "
            f"{' and '.join(_ATTENTION_TYPES)} only.")
    if "sliding_attention" in layer_types and not isinstance(hf_config.sliding_window, int):
        raise BcosValueError(
            f"{_FAMILY} with sliding-window layers and sliding_window={hf_config.sliding_window!r}: TransformerLens' "
            "local attention needs the window's length. Set sliding_window to an int.")


def _config_dict(hf_config) -> dict:
    """TransformerLens' config of a Gemma 2, as its ``google/gemma-2-2b`` entry, from the transformers config."""
    attn_types = [_ATTENTION_TYPES[t] for t in hf_config.layer_types]
    local = "local" in attn_types
    return {
        "d_model": hf_config.hidden_size,
        "d_head": hf_config.head_dim,
        "n_heads": hf_config.num_attention_heads,
        "d_mlp": hf_config.intermediate_size,
        "n_layers": hf_config.num_hidden_layers,
        "n_ctx": hf_config.max_position_embeddings,
        "eps": hf_config.rms_norm_eps,
        "d_vocab": hf_config.vocab_size,
        "act_fn": _activation(hf_config),
        "initializer_range": hf_config.initializer_range,
        "normalization_type": "RMS",
        "rotary_base": _get_rope_theta(hf_config),
        "positional_embedding_type": "rotary",
        "use_attn_scale": True,
        "attn_scale": float(hf_config.query_pre_attn_scalar) ** 0.5,
        "n_key_value_heads": hf_config.num_key_value_heads,
        "window_size": hf_config.sliding_window if local else None,
        "use_local_attn": local,
        "attn_types": attn_types if local else None,
        "attn_scores_soft_cap": _soft_cap(hf_config.attn_logit_softcapping),
        "output_logits_soft_cap": _soft_cap(hf_config.final_logit_softcapping),
        "gated_mlp": True,
        "final_rms": True,
        "use_normalization_before_and_after": True,
        "original_architecture": "Gemma2ForCausalLM",
        "tokenizer_name": None,
    }


CONVERSION = LensConversion(state_dict=convert_gemma_weights, refuse_inexpressible=_refuse_inexpressible,
                            activation=_activation, config_dict=_config_dict)
