"""The identity activation ``"linear"``: a TransformerLens gated MLP with it is a bilinear MLP.

    hook_pre = x W_gate,   hook_pre_linear = x W_in,   hook_post = hook_pre * hook_pre_linear

``"linear"`` is transformers' name for the identity (``hidden_act="linear"``), so a bilinear HF Llama
converts to TransformerLens unchanged. Registration is idempotent and never replaces another package's
``"linear"``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens.utilities import activation_functions as _tl_activations

from bcos_plugins.errors import BcosRuntimeError

__all__ = ["LINEAR_ACTIVATION", "identity_activation", "register_linear_activation"]

LINEAR_ACTIVATION = "linear"


def identity_activation(x: torch.Tensor) -> torch.Tensor:
    """The identity: a gated MLP with this activation is a bilinear MLP ``(x W_gate) * (x W_in)``."""
    return x


def _is_ours(fn: Any) -> bool:
    # A reloaded module defines a new function object; the registered one is still ours.
    return fn is identity_activation or (
        getattr(fn, "__module__", None) == __name__ and getattr(fn, "__qualname__", None) == "identity_activation"
    )


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
        raise BcosRuntimeError(
            f"TransformerLens activation {LINEAR_ACTIVATION!r} is already registered as {existing!r} by another "
            "package; bcos_plugins needs it to be the identity for bilinear MLPs. Remove the other "
            "registration before importing bcos_plugins.adapters.transformer_lens."
        )


register_linear_activation()
