"""TransformerLens adapter: bilinear and B-cos transformers as ``HookedTransformer`` models.

Importing this module registers the identity activation under ``"linear"`` (transformers' name for it) in
TransformerLens' ``SUPPORTED_ACTIVATIONS`` (idempotent), so ``HookedTransformerConfig(gated_mlp=True,
act_fn="linear")`` is a bilinear transformer: ``hook_post == hook_pre * hook_pre_linear``. It also makes
TransformerLens' own bridge construction (``TransformerBridge.boot_transformers(name, hf_model=...)`` and the
rest) refuse B-cos models, which it would rewrite in place (:mod:`._lens.boot_guard`; use
:func:`transformer_bridge_from_hf`).

Public API:

- :func:`bilinear_config`: the ``HookedTransformerConfig`` of a bilinear transformer;
- :class:`BcosTransformerConfig` + :class:`BcosHookedTransformer`: a B-cos transformer (every projection
  B-cos unless ``bcos_projections`` says otherwise, no biases, detachable norms);
  :func:`bcos_model_class` gives the B-cos version of a subclass such as sae-lens' ``HookedSAETransformer``;
- :func:`hooked_transformer_from_hf`: a B-cosified / bilinear / plain transformers causal LM (GPT-2, Llama,
  Mistral, Qwen2, Qwen3: the registry's classes with a TransformerLens converter) as a TransformerLens model with
  the same logits, offline;
- :func:`make_explainable`: route every dynamic weight (norm scale, attention pattern, activation gate,
  B-cos scale) of a ``HookedTransformer`` through a detachable module, so that
  :func:`bcos_plugins.explanation_mode` works on it (B-cos, bilinear and plain models alike);
- :func:`explain_logits`: contributions at ``hook_embed`` + ``hook_pos_embed`` that sum to the logit.

- :class:`BcosActivationCache` (what B-cos models' ``run_with_cache`` returns) and :func:`effective_weight`:
  TransformerLens' own decompositions (``logit_attrs``, ``decompose_resid``, ``get_full_resid_decomposition``,
  ``stack_head_results``, ``stack_neuron_results``) exact on B-cos and bilinear models;
- :func:`token_component_decomposition` (+ :func:`plot_token_components`): a logit split into input token x
  component (each head, each MLP, the direct path) shares that sum to it exactly, on both model classes;
- :func:`transformer_bridge_from_hf`: a ``TransformerBridge`` over a copy of a B-cos / bilinear / plain
  causal LM (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2; the user's model is left untouched), explainable
  through its hooks.

TransformerLens versions: 3.x (the ``lens`` extra, with sae-lens) has the whole API; 4.x (the ``lens4``
extra) removed ``HookedTransformer``, so there only the bridge API is offered, and the HookedTransformer
names raise an ``ImportError`` that says so.

All hook names are TransformerLens' standard ones; B-cos models add ``hook_bcos_scale_{q,k,v,o}`` (attention)
and ``hook_bcos_scale_{in,gate,out}`` (MLP), the B-cos dynamic scales.
"""

from __future__ import annotations

from typing import Any

from bcos_plugins.errors import BcosValueError

from ._lens.boot_guard import install_boot_guard
from ._lens.bridge import (
    SUPPORTED_BRIDGE_ARCHITECTURES,
    check_bridge_internals,
    is_explainable_bridge,
    make_bridge_explainable,
    transformer_bridge_from_hf,
)
from ._lens.compat import HAS_HOOKED_TRANSFORMER, TRANSFORMER_LENS_VERSION
from ._lens.components import (
    TokenComponentDecomposition,
    plot_token_components,
    token_component_decomposition,
)
from ._lens.explain import LensExplanation, explain_logits
from ._lens.hook_point import DynamicHookPoint

__all__ = [
    "DynamicHookPoint",
    "LensExplanation",
    "explain_logits",
    "HAS_HOOKED_TRANSFORMER",
    "SUPPORTED_BRIDGE_ARCHITECTURES",
    "TRANSFORMER_LENS_VERSION",
    "TokenComponentDecomposition",
    "check_bridge_internals",
    "is_explainable_bridge",
    "make_bridge_explainable",
    "plot_token_components",
    "token_component_decomposition",
    "transformer_bridge_from_hf",
]
# TransformerLens' own bridge construction refuses B-cos models from here on (it would rewrite them in place)
install_boot_guard()

# HookedTransformer-based API: TransformerLens 3.x only.
_HOOKED_API = [
    "ALL_PROJECTIONS",
    "BcosActivationCache",
    "BcosHookedTransformer",
    "BcosTransformerConfig",
    "LINEAR_ACTIVATION",
    "SUPPORTED_HF_ARCHITECTURES",
    "bcos_model_class",
    "bilinear_config",
    "effective_weight",
    "fold_final_norm_weight",
    "fold_final_norm_weight_in_state_dict",
    "hooked_transformer_from_hf",
    "identity_activation",
    "is_explainable",
    "make_explainable",
    "register_linear_activation",
    "remove_biases",
]

if HAS_HOOKED_TRANSFORMER:
    from transformer_lens import HookedTransformerConfig

    from ._lens.activation import LINEAR_ACTIVATION, identity_activation, register_linear_activation
    from ._lens.config import ALL_PROJECTIONS, BcosTransformerConfig
    from ._lens.decomposition import (
        BcosActivationCache,
        effective_weight,
        fold_final_norm_weight,
        fold_final_norm_weight_in_state_dict,
    )
    from ._lens.from_hf import SUPPORTED_HF_ARCHITECTURES, hooked_transformer_from_hf
    from ._lens.model import (
        BcosHookedTransformer,
        bcos_model_class,
        is_explainable,
        make_explainable,
        remove_biases,
    )

    register_linear_activation()
    # the literal list again (not ``__all__ += _HOOKED_API``) so that linters see the imports above as
    # re-exports; tests/test_lens_bridge.py keeps the two lists equal
    __all__ += [
        "ALL_PROJECTIONS",
        "BcosActivationCache",
        "BcosHookedTransformer",
        "BcosTransformerConfig",
        "LINEAR_ACTIVATION",
        "SUPPORTED_HF_ARCHITECTURES",
        "bcos_model_class",
        "bilinear_config",
        "effective_weight",
        "fold_final_norm_weight",
        "fold_final_norm_weight_in_state_dict",
        "hooked_transformer_from_hf",
        "identity_activation",
        "is_explainable",
        "make_explainable",
        "register_linear_activation",
        "remove_biases",
    ]
else:
    def __getattr__(name: str):
        if name in _HOOKED_API:
            raise ImportError(
                f"{name} needs TransformerLens 3.x (HookedTransformer); the installed TransformerLens "
                f"{TRANSFORMER_LENS_VERSION} has only TransformerBridge. Use transformer_bridge_from_hf(hf_model), "
                "or install the 'lens' extra (TransformerLens 3.9, with sae-lens) for the HookedTransformer API"
            )
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


if not HAS_HOOKED_TRANSFORMER:
    del bilinear_config  # module __getattr__ explains that it needs TransformerLens 3.x
