"""TransformerLens ``HookedTransformer`` converters, one module per transformers family (as TransformerLens'
own ``pretrained/weight_conversions`` has one per family).

The architecture registry (:data:`bcos_plugins.convert.architectures.SPECS`) names a family's module in
``ArchitectureSpec.lens_conversion``; :func:`conversion_for` resolves it to the module's ``CONVERSION``, a
:class:`LensConversion`. A module holds only what differs for its family: Llama-shaped decoders (rotary
positions, RMSNorm, gated MLP, q/k/v/o projections) build theirs with
:func:`~._llama_shaped.llama_shaped_conversion` from TransformerLens' weight conversion and the options its
config cannot express; others (GPT-2, Gemma 2) fill in the fields themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from bcos_plugins.convert.architectures import vocabulary_size

__all__ = ["LensConversion", "conversion_for", "vocabulary_sizes", "with_zero_bias"]


def _hidden_act(hf_config) -> str:
    return hf_config.hidden_act


def _keep_config(*_config) -> None:
    return None


@dataclass(frozen=True)
class LensConversion:
    """What ``hooked_transformer_from_hf`` needs of one family.

    Attributes:
        state_dict: ``(hf_model, cfg) -> dict``: the TransformerLens state dict (TransformerLens' own weight
            conversion; layers whose bias B-cos removed read as zero biases).
        refuse_inexpressible: ``(hf_config, bcos) -> None``: raise ``BcosValueError`` naming any transformers
            option the HookedTransformer would silently get wrong (``bcos``: the model's ``config.bcos`` or
            ``None``).
        activation: ``hf_config -> str``: the MLP activation's name (a key of TransformerLens'
            ``SUPPORTED_ACTIVATIONS``); default ``hf_config.hidden_act``.
        prepare_config: ``local_config -> None``: fix a local copy of the transformers config before
            TransformerLens' ``convert_hf_model_config`` reads it; default: nothing to fix.
        adjust_config: ``(cfg, hf_config) -> None``: fix TransformerLens' config dict after that; default:
            nothing to fix.
        config_dict: ``hf_config -> dict``: TransformerLens' config dict built by the converter, for a family whose
            config TransformerLens' ``convert_hf_model_config`` knows only by hub model name (Gemma 2: its
            ``google/gemma-2-*`` entries), in that entry's field names; default ``None``: TransformerLens' own
            conversion of the config.
    """

    state_dict: Callable[[nn.Module, object], dict]
    refuse_inexpressible: Callable[[object, dict | None], None]
    activation: Callable[[object], str] = _hidden_act
    prepare_config: Callable[[object], None] = _keep_config
    adjust_config: Callable[[dict, object], None] = _keep_config
    config_dict: Callable[[object], dict] | None = None


def vocabulary_sizes(hf_model: nn.Module) -> dict:
    """The TransformerLens config's ``d_vocab`` and ``d_vocab_out`` from the weights (the input embedding's rows,
    :func:`~bcos_plugins.convert.architectures.vocabulary_size`, and the LM head's), not from
    ``config.vocab_size``: a configuration edited or saved out of step with its embedding would otherwise build a
    model of other sizes, which refuses the weights with a ``load_state_dict`` size mismatch. Every row is copied
    as it is, so the logits stay the transformers model's."""
    sizes = {"d_vocab": vocabulary_size(hf_model)}
    head = hf_model.get_output_embeddings()
    if head is not None:
        sizes["d_vocab_out"] = int(head.weight.shape[0])  # an nn.Linear (out, in), tied or not
    return sizes


def conversion_for(name: str) -> LensConversion:
    """The ``CONVERSION`` of the converter module named ``name`` by an ``ArchitectureSpec.lens_conversion``."""
    return importlib.import_module(f"{__name__}.{name}").CONVERSION


def with_zero_bias(module: nn.Module, out_features: int) -> SimpleNamespace:
    """``module``'s weight, and its bias or zeros where it has none (B-cos layers are bias-free)."""
    bias = getattr(module, "bias", None)
    if bias is None:
        bias = torch.zeros(out_features, dtype=module.weight.dtype, device=module.weight.device)
    return SimpleNamespace(weight=module.weight, bias=bias)
