"""The token checks every TransformerLens entry point of the adapter runs (``explain_logits``, the token x
component decomposition): one place, so that each refuses the same inputs with the same words."""

from __future__ import annotations

from torch import Tensor, nn

from bcos_plugins._checks import require_token_batch

__all__ = ["check_lens_tokens"]


def check_lens_tokens(model: nn.Module, tokens, attention_mask) -> Tensor:
    """The package's token-batch check (:func:`~bcos_plugins._checks.require_token_batch`) against ``model``'s
    (a ``HookedTransformer`` or ``TransformerBridge``: both have them) ``cfg.d_vocab`` and, for a position table,
    ``cfg.n_ctx``; returns the ids as int64 (ids of any integer width convert exactly, as everywhere in the
    package: TransformerLens' ``W_E[tokens]`` would read a uint8 tensor as a mask)."""
    rotary = getattr(model.cfg, "positional_embedding_type", "rotary") == "rotary"
    tokens, _ = require_token_batch(tokens, attention_mask, vocab_size=model.cfg.d_vocab,
                                    max_length=None if rotary else model.cfg.n_ctx, limit_name="cfg.n_ctx",
                                    name="tokens")
    return tokens
