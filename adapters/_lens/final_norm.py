"""The final norm's gain folded into the unembedding, so that TransformerLens' ``logit_attrs`` is exact.

``ActivationCache.logit_attrs`` (and ``apply_ln_to_stack`` followed by ``tokens_to_residual_directions``, the
logit-difference recipe of TransformerLens' tutorials) divides each residual component by the cached final norm
scale and multiplies it by ``W_U``: it assumes the final norm has no gain of its own. Folding the gain ``g`` (and a
bias ``b``) into the unembedding is exact for every model, ``(x̂ * g + b) @ W_U = x̂ @ (g ⊙ W_U) + b @ W_U``; the
bias becomes part of ``b_U``, which TransformerLens leaves out of ``logit_attrs`` as it does for its own models.
``hooked_transformer_from_hf`` folds the converted state dict; ``transformer_bridge_from_hf`` folds the modules of
the copy its bridge wraps. Needs no TransformerLens import (both TransformerLens 3.x and 4.x use it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["fold_final_norm_into_unembedding", "fold_final_norm_weight_in_state_dict"]


def fold_final_norm_weight_in_state_dict(state: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """Fold ``ln_final.w`` (and a bias ``ln_final.b``) into ``unembed.W_U`` / ``unembed.b_U`` of a state dict.

    Returns a new dict without ``ln_final.w`` / ``ln_final.b``; the logits of a model with a weightless final
    norm loading it equal those of the unfolded model. A dict without ``ln_final.w`` is returned unchanged.
    """
    w_key, b_key = f"{prefix}ln_final.w", f"{prefix}ln_final.b"
    if w_key not in state:
        return state
    state = dict(state)
    weight = state.pop(w_key)
    bias = state.pop(b_key, None)
    w_u = state[f"{prefix}unembed.W_U"]
    if bias is not None and bias.abs().max() > 0:
        b_u_key = f"{prefix}unembed.b_U"
        b_u = state.get(b_u_key, torch.zeros(w_u.shape[1], dtype=w_u.dtype, device=w_u.device))
        state[b_u_key] = b_u + bias.to(w_u.dtype) @ w_u
    state[f"{prefix}unembed.W_U"] = weight.to(w_u.dtype)[:, None] * w_u
    return state


def fold_final_norm_into_unembedding(norm: nn.Module, head: nn.Module, *, gain_offset: bool) -> bool:
    """Fold a transformers model's final norm gain (and bias) into its ``nn.Linear`` LM head, in place.

    ``norm`` computes ``x̂ * gain + bias`` with ``gain = weight`` (``gain_offset=False``: LayerNorm, RMSNorm and
    their B-cos versions) or ``gain = 1 + weight`` (``gain_offset=True``: Gemma's RMSNorm); afterwards its gain is
    1 and its bias 0, and ``head`` holds ``gain ⊙ W`` (untied from the input embeddings if it was tied: they keep
    their values) and the bias' share ``bias @ W.T``. The logits do not change (up to rounding). Returns whether
    it folded: ``False`` (nothing changed) where ``head`` is not a plain ``nn.Linear`` (a soft-capped head is not
    linear) or ``norm`` has no ``weight`` vector over the head's inputs.
    """
    weight = getattr(norm, "weight", None)
    if type(head) is not nn.Linear or not isinstance(weight, Tensor) or weight.shape != (head.in_features,):
        return False
    bias = getattr(norm, "bias", None)
    bias = bias if isinstance(bias, Tensor) else None
    head_bias = head.bias if head.bias is not None else torch.zeros(head.out_features, dtype=head.weight.dtype,
                                                                   device=head.weight.device)
    params = {"ln_final.w": (1.0 + weight.float() if gain_offset else weight).detach(),
              "unembed.W_U": head.weight.detach().T, "unembed.b_U": head_bias.detach()}
    if bias is not None:
        params["ln_final.b"] = bias.detach()
    folded = fold_final_norm_weight_in_state_dict(params)
    with torch.no_grad():
        # a new Parameter, not an in-place copy: a tied head shares its weight with the input embeddings
        head.weight = nn.Parameter(folded["unembed.W_U"].T.contiguous(), requires_grad=head.weight.requires_grad)
        if not torch.equal(folded["unembed.b_U"], head_bias):
            head.bias = nn.Parameter(folded["unembed.b_U"], requires_grad=head.weight.requires_grad)
        weight.fill_(0.0 if gain_offset else 1.0)
        if bias is not None:
            bias.zero_()
    return True
