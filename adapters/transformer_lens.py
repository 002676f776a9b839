"""TransformerLens adapter: bilinear and B-cos transformers as ``HookedTransformer`` models.

Importing this module registers the identity activation under ``"linear"`` (transformers' name for it) in
TransformerLens' ``SUPPORTED_ACTIVATIONS`` (idempotent), so ``HookedTransformerConfig(gated_mlp=True,
act_fn="linear")`` is a bilinear transformer: ``hook_post == hook_pre * hook_pre_linear``.

Public API:

- :func:`bilinear_config`: the ``HookedTransformerConfig`` of a bilinear transformer;
- :class:`BcosTransformerConfig` + :class:`BcosHookedTransformer`: a B-cos transformer (every projection
  B-cos unless ``bcos_projections`` says otherwise, no biases, detachable norms);
  :func:`bcos_model_class` gives the B-cos version of a subclass such as sae-lens' ``HookedSAETransformer``;
- :func:`hooked_transformer_from_hf`: a B-cosified / bilinear / plain transformers GPT-2 or Llama as a
  TransformerLens model with the same logits, offline;
- :func:`make_explainable`: route every dynamic weight (norm scale, attention pattern, activation gate,
  B-cos scale) of a ``HookedTransformer`` through a detachable module, so that
  :func:`bcos_plugins.explanation_mode` works on it (B-cos, bilinear and plain models alike);
- :func:`explain_logits`: contributions at ``hook_embed`` + ``hook_pos_embed`` that sum to the logit.

All hook names are TransformerLens' standard ones; B-cos models add ``hook_bcos_scale_{q,k,v,o}`` (attention)
and ``hook_bcos_scale_{in,gate,out}`` (MLP), the B-cos dynamic scales.
"""

from __future__ import annotations

from typing import Any

from transformer_lens import HookedTransformerConfig

from bcos_plugins.errors import BcosValueError

from ._lens.activation import LINEAR_ACTIVATION, identity_activation, register_linear_activation
from ._lens.bridge import (
    SUPPORTED_BRIDGE_ARCHITECTURES,
    check_bridge_internals,
    is_explainable_bridge,
    make_bridge_explainable,
    transformer_bridge_from_hf,
)
from ._lens.config import ALL_PROJECTIONS, BcosTransformerConfig
from ._lens.decomposition import (
    BcosActivationCache,
    effective_weight,
    fold_final_norm_weight,
    fold_final_norm_weight_in_state_dict,
)
from ._lens.explain import LensExplanation, explain_logits
from ._lens.from_hf import SUPPORTED_HF_ARCHITECTURES, hooked_transformer_from_hf
from ._lens.hook_point import DynamicHookPoint
from ._lens.model import (
    BcosHookedTransformer,
    bcos_model_class,
    is_explainable,
    make_explainable,
    remove_biases,
)

__all__ = [
    "ALL_PROJECTIONS",
    "BcosActivationCache",
    "BcosHookedTransformer",
    "BcosTransformerConfig",
    "DynamicHookPoint",
    "LINEAR_ACTIVATION",
    "LensExplanation",
    "SUPPORTED_BRIDGE_ARCHITECTURES",
    "SUPPORTED_HF_ARCHITECTURES",
    "bcos_model_class",
    "bilinear_config",
    "check_bridge_internals",
    "effective_weight",
    "explain_logits",
    "fold_final_norm_weight",
    "fold_final_norm_weight_in_state_dict",
    "hooked_transformer_from_hf",
    "identity_activation",
    "is_explainable",
    "is_explainable_bridge",
    "make_bridge_explainable",
    "make_explainable",
    "register_linear_activation",
    "remove_biases",
    "transformer_bridge_from_hf",
]

register_linear_activation()


def bilinear_config(
    *,
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_mlp: int,
    d_vocab: int,
    n_ctx: int,
    d_head: int | None = None,
    normalization_type: str | None = "RMS",
    positional_embedding_type: str = "rotary",
    **overrides: Any,
) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` for a bilinear transformer.

    The MLP of every block is ``W_out ((x W_gate) * (x W_in))``: a gated MLP with the identity activation
    (``gated_mlp=True, act_fn="linear"``). Models built from it have no biases: TransformerLens creates its
    bias parameters as zeros, and the default normalisation (RMSNorm) has none. Defaults follow the Llama
    layout (rotary positions, RMSNorm); any other ``HookedTransformerConfig`` field can be passed through
    ``overrides``.

    Raises:
        ValueError: if ``overrides`` tries to change ``gated_mlp`` or ``act_fn`` (then it is no longer
            bilinear), or ``d_model`` is not divisible by ``n_heads`` and no ``d_head`` is given.
    """
    for fixed in ("gated_mlp", "act_fn", "attn_only"):
        if fixed in overrides:
            raise BcosValueError(
                f"bilinear_config fixes {fixed!r} (gated_mlp=True, act_fn='linear', attn_only=False); build a "
                "HookedTransformerConfig directly for other MLPs."
            )
    if d_head is None:
        if d_model % n_heads:
            raise BcosValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_head explicitly.")
        d_head = d_model // n_heads
    return HookedTransformerConfig(
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=d_mlp,
        d_vocab=d_vocab,
        n_ctx=n_ctx,
        act_fn=LINEAR_ACTIVATION,
        gated_mlp=True,
        normalization_type=normalization_type,
        positional_embedding_type=positional_embedding_type,
        **overrides,
    )
