"""Self-Guided Attention as TransformerLens hooks on ``blocks.{l}.attn.hook_attn_scores``.

``hook_attn_scores`` of a ``HookedTransformer`` (or ``HookedEncoder``) carries the scaled scores
``Q K^T / sqrt(d_head)`` after the causal/padding mask has been applied (masked entries are ``-inf``; on a
``TransformerBridge`` the dtype's lowest value, transformers' additive mask), just before the softmax. The hook
returns :func:`~bcos_plugins.guided.guidance.guide_scores` of them, the same function the transformers path uses;
masked entries stay masked in every mode (``-inf * (1 + lam M)`` and ``-inf + c`` are ``-inf``, the lowest value
times ``1 + lam M`` overflows to ``-inf`` or stays the lowest; ``"replace"`` renormalises over the open entries only,
:func:`~bcos_plugins.guided.guidance.unmasked`).

This module does not import TransformerLens: a hook is a plain ``(tensor, hook) -> tensor`` callable.

Examples:
    >>> import torch
    >>> from transformer_lens import HookedTransformer, HookedTransformerConfig
    >>> from bcos_plugins.guided import guidance_hooks
    >>> config = HookedTransformerConfig(n_layers=4, d_model=32, d_head=8, n_ctx=16, d_vocab=60, act_fn="gelu")
    >>> model = HookedTransformer(config)
    >>> tokens = torch.randint(60, (2, 8))
    >>> gold_mask = torch.tensor([[0, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0]]).float()   # rationale
    >>> hooks = guidance_hooks(model, gold_mask, mode="multiply", strength=1.0, last_layers=4)
    >>> logits = model.run_with_hooks(tokens, fwd_hooks=hooks)          # training step only
    >>> bool((logits - model(tokens)).abs().max() > 0)                  # guidance changed the output
    True
"""

from __future__ import annotations

from collections.abc import Callable

from jaxtyping import Float
from torch import Tensor, nn

from .._checks import require_int
from ..errors import BcosTypeError, argument_error
from .guidance import GuidanceMode, check_guidance, check_rationale_mask, guide_scores, unmasked

__all__ = ["attn_scores_guidance_hook", "guidance_hooks"]


def attn_scores_guidance_hook(
    rationale_mask: Float[Tensor, "batch key"],
    mode: GuidanceMode = "multiply",
    strength: float = 1.0,
) -> Callable[[Tensor, object], Tensor]:
    """A hook for ``hook_attn_scores`` that guides the scores by ``rationale_mask`` (batch, key_pos)."""
    mode, strength = check_guidance(mode, strength)
    rationale_mask = check_rationale_mask(rationale_mask)

    def guide_attn_scores(scores: Float[Tensor, "batch head query key"], hook=None) -> Tensor:
        return guide_scores(scores, rationale_mask, mode, strength, allowed=unmasked(scores))

    return guide_attn_scores


def guidance_hooks(
    n_layers,
    rationale_mask: Float[Tensor, "batch key"],
    mode: GuidanceMode = "multiply",
    strength: float = 1.0,
    last_layers: int = 4,
) -> list[tuple[str, Callable]]:
    """``fwd_hooks`` for ``run_with_hooks`` / ``hooks(...)``: guidance in the last ``last_layers`` blocks.

    ``n_layers``: the model the hooks go on (a ``HookedTransformer``, ``HookedEncoder`` or ``TransformerBridge``: its
    ``cfg.n_layers`` is read), or its number of blocks. Pass the model where it is at hand: a count smaller than the
    model's silently guided blocks that are not its last ones (2 on a 3-block model guided blocks 0 and 1)."""
    if isinstance(n_layers, nn.Module):
        count = getattr(getattr(n_layers, "cfg", None), "n_layers", None)
        if count is None:
            raise argument_error("n_layers", f"is a {type(n_layers).__name__} without cfg.n_layers: guidance_hooks "
                                 "makes TransformerLens hooks", "Pass a HookedTransformer / HookedEncoder / "
                                 "TransformerBridge (or its cfg.n_layers); for a transformers model use "
                                 "bcos_plugins.guided.guide_attention", kind=BcosTypeError)
        n_layers = count
    n_layers = require_int("n_layers", n_layers, minimum=1)
    if isinstance(last_layers, bool) or not isinstance(last_layers, int) or not 1 <= last_layers <= n_layers:
        raise argument_error("last_layers", f"last_layers must be an int in [1, n_layers={n_layers}], got "
                             f"{last_layers!r}", "Pass how many of the last blocks to guide (the paper uses 4)")
    hook = attn_scores_guidance_hook(rationale_mask, mode, strength)
    return [(f"blocks.{layer}.attn.hook_attn_scores", hook) for layer in range(n_layers - last_layers, n_layers)]
