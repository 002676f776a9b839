"""The token checks every TransformerLens entry point of the adapter runs (``explain_logits``, the token x
component decomposition): one place, so that each refuses the same inputs with the same words."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bcos_plugins._checks import ids_as_long
from bcos_plugins.errors import BcosTypeError, BcosValueError

__all__ = ["check_lens_tokens"]


def check_lens_tokens(model: nn.Module, tokens, attention_mask) -> Tensor:
    """Refuse token ids ``model`` (a ``HookedTransformer`` or ``TransformerBridge``) cannot embed as meant; returns
    them as int64 (ids of any integer width convert exactly, as everywhere in the package: TransformerLens' ``W_E[tokens]``
    would read a uint8 tensor as a mask)."""
    if not isinstance(tokens, Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise BcosTypeError("tokens: must be a tensor of token ids (use model.to_tokens(text) for strings)")
    tokens = ids_as_long(tokens)
    if tokens.ndim != 2 or tokens.numel() == 0:
        raise BcosValueError(f"tokens: expected a non-empty (batch, pos) tensor, got shape {tuple(tokens.shape)}")
    if (tokens < 0).any() or (tokens >= model.cfg.d_vocab).any():  # bridges have cfg.d_vocab too
        raise BcosValueError(f"tokens: ids outside the vocabulary [0, {model.cfg.d_vocab}). Check the tokenizer")
    length = tokens.shape[1]
    if getattr(model.cfg, "positional_embedding_type", "rotary") != "rotary" and length > model.cfg.n_ctx:
        raise BcosValueError(f"tokens: {length} positions but the model has n_ctx={model.cfg.n_ctx} (its position "
                             f"table). Truncate to the last {model.cfg.n_ctx} tokens: tokens[:, -{model.cfg.n_ctx}:]")
    if attention_mask is not None and (not isinstance(attention_mask, Tensor)
                                       or attention_mask.shape != tokens.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise BcosValueError(f"attention_mask: shape {shape} differs from tokens {tuple(tokens.shape)}. Pass one 0/1 "
                             "entry per token")
    return tokens
