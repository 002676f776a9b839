"""Exact contributions ``W(x) x`` of a TransformerLens model, taken at ``hook_embed`` + ``hook_pos_embed``.

Inside :func:`bcos_plugins.nn.explanation_mode` an explainable model (see ``make_explainable``) is linear
in its embeddings as far as autograd sees, so for the explained logit ``y``::

    sum_{pos, d} e_embed * dy/de_embed + sum_{pos, d} e_pos * dy/de_pos = y

(bias-free models: B-cos, bilinear, or plain ones with zero biases). Rotary models have no
``hook_pos_embed``; positions enter only through queries and keys, i.e. the attention pattern, a constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

# Row-argument parsing and selection are the core's, so targets, foils and positions mean the same here as in
# bcos_plugins.explain (ids validated, float targets taken as directions).
from bcos_plugins.explain import _as_row_tensor, _select, last_real_position
from bcos_plugins.metrics.summary import completeness_error as _completeness_error
from bcos_plugins.nn.dynamic import explanation_mode

from .model import is_explainable

__all__ = ["LensExplanation", "explain_logits", "ATTRIBUTION_HOOKS"]

ATTRIBUTION_HOOKS = ("hook_embed", "hook_pos_embed")


@dataclass
class LensExplanation:
    """Result of :func:`explain_logits`.

    Attributes:
        contributions: per-token scores, the hook contributions summed over ``d_model`` and hooks.
        hook_contributions: ``W(x) x`` per hook name (``hook_embed``, ``hook_pos_embed`` when present),
            each ``(batch, pos, d_model)``.
        logits: the explained values (a logit, or a logit difference when ``foil`` is given).
        target, foil, position: what was explained, per row.
    """

    contributions: Float[Tensor, "batch pos"]
    hook_contributions: dict[str, Float[Tensor, "batch pos d_model"]]
    logits: Float[Tensor, " batch"]
    target: Int[Tensor, " batch"]
    foil: Int[Tensor, " batch"] | None
    position: Int[Tensor, " batch"]

    @property
    def total(self) -> Float[Tensor, " batch"]:
        return self.contributions.sum(dim=1)

    @property
    def completeness_error(self) -> Float[Tensor, " batch"]:
        """``|sum of contributions - explained logit| / |explained logit|`` per row."""
        return _completeness_error(self.contributions, self.logits)


def explain_logits(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    *,
    target: int | Tensor | None = None,
    foil: int | Tensor | None = None,
    position: int | Tensor | None = None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> LensExplanation:
    """Explain the next-token logit of ``target`` (minus ``foil``) predicted at ``position``.

    Args:
        model: a ``HookedTransformer`` made explainable (``BcosHookedTransformer``, a model from
            ``hooked_transformer_from_hf``, or any model after ``make_explainable``).
        tokens: token ids; strings are not accepted (tokenise with ``model.to_tokens``).
        target: one id or one per row (or a float direction over the vocabulary); default the top
            prediction at ``position``.
        foil: explain ``logit(target) - logit(foil)`` (contrastive) when given.
        position: one index or one per row; default the last real token (``attention_mask``) or the last.
        attention_mask: 1 for real tokens, passed to the model.
    """
    if not is_explainable(model):
        raise ValueError(
            "this HookedTransformer's dynamic weights are not detachable; call "
            "bcos_plugins.adapters.transformer_lens.make_explainable(model) first (before adding hooks)."
        )
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.long, torch.int):
        raise TypeError("tokens must be a tensor of token ids (use model.to_tokens(text) for strings)")
    batch, length = tokens.shape
    rows = torch.arange(batch, device=tokens.device)
    if position is None:
        position = (last_real_position(attention_mask) if attention_mask is not None
                    else torch.full((batch,), length - 1, device=tokens.device))
    position = _as_row_tensor(position, batch, "position", tokens.device) % length
    names = [n for n in ATTRIBUTION_HOOKS if n in model.hook_dict]
    leaves: dict[str, Tensor] = {}

    def capture(activation: Tensor, hook) -> Tensor:
        leaves[hook.name] = activation.detach().requires_grad_(True)
        return leaves[hook.name]

    with explanation_mode(model), torch.enable_grad():
        logits = model.run_with_hooks(tokens, attention_mask=attention_mask,
                                      fwd_hooks=[(n, capture) for n in names])
        at_position = logits[rows, position]
        if target is None:
            target = at_position.argmax(dim=-1)
        target = _as_row_tensor(target, batch, "target", tokens.device)
        explained = _select(at_position, target, "target")
        if foil is not None:
            foil = _as_row_tensor(foil, batch, "foil", tokens.device)
            explained = explained - _select(at_position, foil, "foil")
        grads = torch.autograd.grad(explained.sum(), [leaves[n] for n in names])
    hook_contributions = {n: (leaves[n] * g).detach() for n, g in zip(names, grads, strict=True)}
    contributions = sum(c.sum(dim=-1) for c in hook_contributions.values())
    return LensExplanation(contributions=contributions, hook_contributions=hook_contributions,
                           logits=explained.detach(), target=target, foil=foil, position=position)
