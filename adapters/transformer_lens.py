"""TransformerLens adapter: bilinear and B-cos transformers as ``HookedTransformer``s.

Importing this module registers the identity activation under ``"linear"`` (transformers' name for it) in
TransformerLens' ``SUPPORTED_ACTIVATIONS``, so ``HookedTransformerConfig(gated_mlp=True, act_fn="linear")``
is a bilinear transformer: ``hook_post == hook_pre * hook_pre_linear``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens import HookedTransformerConfig
from transformer_lens.utilities import activation_functions as _tl_activations

__all__ = ["LINEAR_ACTIVATION", "bilinear_config", "identity_activation", "register_linear_activation"]

LINEAR_ACTIVATION = "linear"


def identity_activation(x: torch.Tensor) -> torch.Tensor:
    """The identity: a gated MLP with this activation is a bilinear MLP ``(x W_gate) * (x W_in)``."""
    return x


def register_linear_activation() -> None:
    """Register :func:`identity_activation` as TransformerLens activation ``"linear"`` (idempotent).

    Raises:
        RuntimeError: if another package registered a different function under ``"linear"``: silently
            replacing it would change that package's models.
    """
    registry = _tl_activations.SUPPORTED_ACTIVATIONS
    existing = registry.get(LINEAR_ACTIVATION)
    if existing is None:
        registry[LINEAR_ACTIVATION] = identity_activation
    elif not _is_ours(existing):
        raise RuntimeError(
            f"TransformerLens activation {LINEAR_ACTIVATION!r} is already registered as {existing!r} by another "
            "package; bcos_plugins needs it to be the identity for bilinear MLPs. Remove the other "
            "registration before importing bcos_plugins.adapters.transformer_lens."
        )


def _is_ours(fn: Any) -> bool:
    # A reloaded adapter module defines a new function object; the registered one is still ours.
    return fn is identity_activation or (
        getattr(fn, "__module__", None) == __name__ and getattr(fn, "__qualname__", None) == "identity_activation"
    )


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
            raise ValueError(
                f"bilinear_config fixes {fixed!r} (gated_mlp=True, act_fn='linear', attn_only=False); build a "
                "HookedTransformerConfig directly for other MLPs."
            )
    if d_head is None:
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_head explicitly.")
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
