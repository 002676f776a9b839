"""TransformerLens ``HookedTransformer`` converters, one module per transformers family (as TransformerLens'
own ``pretrained/weight_conversions`` has one per family).

The architecture registry (:data:`bcos_plugins.convert.architectures.SPECS`) names a family's module in
``ArchitectureSpec.lens_conversion``; :func:`conversion_for` resolves it. Every module provides:

- ``activation(hf_config) -> str``: the MLP activation's name (a key of TransformerLens' ``SUPPORTED_ACTIVATIONS``);
- ``refuse_inexpressible(hf_config, bcos) -> None``: raise ``BcosValueError`` naming any transformers option the
  HookedTransformer would silently get wrong (``bcos``: the model's ``config.bcos`` or ``None``);
- ``prepare_config(local_config) -> None``: fix a local copy of the transformers config before TransformerLens'
  ``convert_hf_model_config`` reads it;
- ``adjust_config(cfg, hf_config) -> None``: fix TransformerLens' config dict after that;
- ``state_dict(hf_model, cfg) -> dict``: the TransformerLens state dict (TransformerLens' own weight conversion;
  layers whose bias B-cos removed read as zero biases).
"""

from __future__ import annotations

import importlib
from types import ModuleType, SimpleNamespace

import torch
from torch import nn

__all__ = ["conversion_for", "with_zero_bias"]


def conversion_for(name: str) -> ModuleType:
    """The converter module named ``name`` by an ``ArchitectureSpec.lens_conversion``."""
    return importlib.import_module(f"{__name__}.{name}")


def with_zero_bias(module: nn.Module, out_features: int) -> SimpleNamespace:
    """``module``'s weight, and its bias or zeros where it has none (B-cos layers are bias-free)."""
    bias = getattr(module, "bias", None)
    if bias is None:
        bias = torch.zeros(out_features, dtype=module.weight.dtype, device=module.weight.device)
    return SimpleNamespace(weight=module.weight, bias=bias)
