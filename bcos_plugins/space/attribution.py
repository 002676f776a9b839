"""Exact context attribution of the Space Model, returned like :func:`bcos_plugins.explain`'s output.

Token j's share of logit c is ``m_j / n * sum_k w_{c,k} . z_{k,j}`` (module docstring of
:mod:`bcos_plugins.space.modeling`). The shares sum to the logit minus the classifier bias, which belongs to
no token and is reported separately (``SpaceExplanation.bias``). No gradient is needed: the head is linear
in the concept activations, so the decomposition is read off the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._checks import bad_rows, refuse_keywords_meant_as_own
from ..attribution import Direction, TokenExplanation, resolve_explained
from ..attribution.text import forward_keywords
from ..errors import BcosRuntimeError, BcosTypeError
from ..explain import completeness_tolerance
from ..nn.dynamic import evaluating
from ..nn.functional import at_least_float32

__all__ = ["SpaceExplanation", "context_attribution", "concept_contributions"]


@dataclass
class SpaceExplanation(TokenExplanation):
    """:class:`~bcos_plugins.attribution.TokenExplanation` of a Space Model.

    ``contributions`` (batch, pos) are the tokens' exact shares; ``input_contributions`` holds them per
    concept unit (batch, pos, n_spaces * n_latent) instead of per embedding dimension: the decomposition is
    exact at the concept activations, not at the input embeddings (the encoder is not dynamic-weight).
    ``explained`` is the explained value without the bias (so ``completeness_error`` checks the shares);
    ``bias`` is the classifier bias of the target (minus the foil's), ``explained + bias`` the model's logit.
    """

    bias: Tensor | None = None
    n_spaces: int = 1

    @property
    def full_logits(self) -> Float[Tensor, " batch"]:
        return self.explained + self.bias

    @property
    def logits(self) -> Float[Tensor, " batch"]:
        """The model's logit (of ``target`` minus ``foil``'s), :attr:`full_logits`: the name every explanation shares
        reads the explained value there, which here is the logit minus the classifier bias (off by the bias, without
        a word)."""
        return self.full_logits

    @property
    def space_contributions(self) -> Float[Tensor, "batch pos n_spaces n_latent"]:
        b, p, _ = self.input_contributions.shape
        return self.input_contributions.view(b, p, self.n_spaces, -1)


def concept_contributions(
    model, concepts: Float[Tensor, "batch pos n_spaces n_latent"], attention_mask: Tensor | None
) -> Float[Tensor, "batch pos n_classes n_spaces n_latent"]:
    """Per-token, per-class, per-concept-unit shares of the logits from given concept activations."""
    require_space_model(model, "concept_contributions")  # another model failed on "has no attribute 'head'"
    return model.head.token_contributions(concepts, attention_mask)


def require_space_model(model, function: str) -> None:
    """What the Space attributions read of the model, not an isinstance check: modeling.py's explain() calls this
    module, so importing modeling here would make the two import each other."""
    head = getattr(model, "head", None)
    if not (callable(getattr(head, "token_contributions", None)) and hasattr(head, "classifier")
            and hasattr(head, "n_spaces")):
        raise BcosTypeError(f"model: {function} explains a SpaceModelForSequenceClassification; got "
                            f"{type(model).__name__} (use bcos_plugins.explain for B-cos models)")


@torch.no_grad()
def context_attribution(
    model,
    input_ids: Int[Tensor, "batch pos"] | None = None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    *,
    target: int | Tensor | None = None,
    foil: int | Tensor | None = None,
    **forward_kwargs,
) -> SpaceExplanation:
    """Explain a batch: each token's exact share of the ``target`` logit (default: the predicted class), or of
    ``target - foil``, less the classifier's bias (no token's share). ``forward_kwargs`` go to the model
    (``token_type_ids``, ``inputs_embeds``).

    Returns:
        A :class:`SpaceExplanation`: ``contributions`` per token ``(batch, pos)`` (0 on padding), per concept unit in
        ``input_contributions`` ``(batch, pos, n_spaces * n_latent)`` (``space_contributions`` views them as
        ``(batch, pos, n_spaces, n_latent)``), ``explained`` ``(batch,)`` the logit without the bias (what the
        contributions sum to), ``bias`` ``(batch,)`` and ``logits`` = ``explained + bias`` the model's logit,
        ``target`` / ``foil`` as resolved and ``completeness_error`` ``(batch,)``.
    """
    require_space_model(model, "context_attribution")
    if forward_kwargs:
        refuse_keywords_meant_as_own(forward_kwargs, forward_keywords(model), target, own=("target", "foil"),
                                     call="context_attribution(model, input_ids, attention_mask, target=..., foil=...)")
    with evaluating(model):
        out = model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
    logits, concepts = out.logits, out.concepts
    batch = logits.shape[0]
    device = logits.device
    # Class ids only: the head's bias is per class, so a Direction would need its own bias bookkeeping.
    for name, value in (("target", target), ("foil", foil)):
        if isinstance(value, Direction):
            raise BcosTypeError(f"{name}: the Space head explains class logits; pass class ids, not a Direction.")
    full, target_t, foil_t = resolve_explained(logits, target, foil)
    per_class = model.head.token_contributions(concepts, attention_mask)  # (b, p, c, k, l)
    rows = torch.arange(batch, device=device)
    units = per_class[rows, :, target_t]  # (b, p, k, l)
    classifier_bias = model.head.classifier.bias
    bias = classifier_bias[target_t]
    # The explained value is the head's logit before its bias is added, computed as the forward computes it (same
    # masked mean, same product, same dtype) minus the bias term, not as logit - bias: a logit is rounded to the
    # digits of its bias, so with a bias of 1e6 in float32, logit - bias kept nothing of the tokens' 0.01-0.3 (0.0 or
    # 0.0625 came back and completeness_error read 1e10 for exact shares). _require_complete then checks that the
    # model's logits are this value plus the bias, so a term beside the classifier is still refused.
    bias_free = model.head.bias_free_logits(concepts, attention_mask)
    explained = bias_free[rows, target_t]
    if foil_t is not None:
        units = units - per_class[rows, :, foil_t]
        bias = bias - classifier_bias[foil_t]
        explained = explained - bias_free[rows, foil_t]
    units = units.flatten(2)
    explanation = SpaceExplanation(
        contributions=units.sum(-1, dtype=at_least_float32(units.dtype)),  # as explain's token scores
        input_contributions=units,
        explained=explained,
        target=target_t,
        foil=foil_t,
        attribution_point="concept activations of the Space head (tanh(h P_k) per token, space and latent)",
        position=None,
        input_ids=input_ids,
        attention_mask=attention_mask,
        reduce="sum",
        bias=bias.detach(),
        n_spaces=model.head.n_spaces,
    )
    _require_complete(explanation)
    _require_logits_from_head(explanation, full, logits, target_t, foil_t, classifier_bias)
    return explanation


# the cause both completeness refusals name (the shares are exact by construction, so a gap means other logits)
_NOT_THE_HEADS_LOGITS = (
    "the model's logits are not the head's linear classifier over the masked mean of its concept activations (a hook "
    "or an adapter on head.classifier, or a replaced head), so the shares would not be the logit's. Explain the model "
    "with the head SpaceModelForSequenceClassification builds (merge an adapter into the classifier's weight first).")


def _require_logits_from_head(explanation: SpaceExplanation, full: Tensor, logits: Tensor, target: Tensor,
                              foil: Tensor | None, classifier_bias: Tensor) -> None:
    """Refuse logits that are not the bias-free value plus the bias (a hook or an adapter on ``head.classifier``
    adds a term no share carries), checked in float64. Allowed: explain's tolerance of the bias-free value's size
    (the largest of it and the token scores' sum of absolute values), plus the rounding of adding the bias (a few
    eps of the logits and biases involved), which is all a large bias costs the logit and no sign of a lost term."""
    rows = torch.arange(len(full), device=full.device)
    tolerance, precision = completeness_tolerance(explanation.input_contributions)
    eps = torch.finfo(precision).eps
    gap = (full.double() - explanation.explained.double() - explanation.bias.double()).abs()
    size = torch.maximum(explanation.explained.double().abs(), explanation.contributions.double().abs().sum(1))
    rounding = logits[rows, target].double().abs() + classifier_bias[target].double().abs()
    if foil is not None:
        rounding = rounding + logits[rows, foil].double().abs() + classifier_bias[foil].double().abs()
    within = gap <= tolerance * size + 4 * eps * rounding  # false for a NaN gap too
    if bool(within.all()):
        return
    row = int((~within).nonzero()[0])
    raise BcosRuntimeError(
        f"context_attribution: the token shares of row {row} sum to {float(explanation.total[row]):.6g}, the head's "
        f"classifier weight over the masked mean of its concept activations, but the model's logit minus the "
        f"classifier bias is {float(full[row].double() - explanation.bias[row].double()):.6g}, a gap of "
        f"{float(gap[row]):.2g} beyond {precision} rounding of the logit and its bias: {_NOT_THE_HEADS_LOGITS}"
    )


def _require_complete(explanation: SpaceExplanation) -> None:
    """Refuse shares that miss the logit beyond float rounding, as explain refuses a B-cos model's: the shares are
    exact by construction (the head is linear in the concept activations), so a larger gap means the logits did not
    come from the classifier over the masked mean of the concepts (a hook or an adapter on ``head.classifier``, a
    head replaced), and the shares would not be the logit's. The tolerance and the size it is relative to are
    explain's: sqrt(eps) of the dtype, of the largest of the explained value, the logit and the token scores' sum of
    absolute values (a half-precision logit near 0 is the difference of shares far larger, so its own rounding is a
    large part of it, as completeness_error shows, while the shares are exact)."""
    units = explanation.input_contributions
    # NaN / inf first: a NaN gap was refused below as a hook or an adapter on the classifier, the wrong cause
    finite = torch.isfinite(explanation.full_logits) & torch.isfinite(units.flatten(1)).all(1)
    if not bool(finite.all()):
        raise BcosRuntimeError(
            f"context_attribution: the logits or token shares of {bad_rows(~finite)} are NaN or inf, so no share "
            "can be given. Check the model's parameters (model.head, model.encoder: a diverged training run?) and the "
            "inputs (inputs_embeds) for NaN or inf")
    summed = explanation.contributions.dtype  # the token scores, summed in at least float32
    size = torch.stack([explanation.explained.abs().to(summed), explanation.full_logits.abs().to(summed),
                        explanation.contributions.abs().sum(1)]).amax(0)
    gap = explanation.delta.abs().to(summed) / size.clamp_min(torch.finfo(summed).tiny)
    tolerance, precision = completeness_tolerance(units)
    within = gap <= tolerance  # false for a NaN gap too
    if bool(within.all()):
        return
    row = int((~within).nonzero()[0])
    raise BcosRuntimeError(
        f"context_attribution: the token shares of row {row} sum to {float(explanation.total[row]):.4g} but the "
        f"logit minus the classifier bias is {float(explanation.explained[row]):.4g}, a gap of {float(gap[row]):.2g} "
        f"of the logit and its token scores' size where {precision} rounding allows {tolerance:.1g}: {_NOT_THE_HEADS_LOGITS}"
    )
