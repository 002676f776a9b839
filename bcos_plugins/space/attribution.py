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

from ..explain import Explanation

__all__ = ["SpaceExplanation", "context_attribution", "concept_contributions"]


@dataclass
class SpaceExplanation(Explanation):
    """:class:`~bcos_plugins.explain.Explanation` of a Space Model.

    ``contributions`` (batch, pos) are the tokens' exact shares; ``embedding_contributions`` holds them per
    concept unit (batch, pos, n_spaces * n_latent) instead of per embedding dimension: the decomposition is
    exact at the concept activations, not at the input embeddings (the encoder is not dynamic-weight).
    ``logits`` are the explained values without the bias (so ``completeness_error`` checks the shares);
    ``bias`` is the classifier bias of the target (minus the foil's), ``logits + bias`` the model's logit.
    """

    bias: Tensor | None = None
    n_spaces: int = 1

    @property
    def full_logits(self) -> Float[Tensor, " batch"]:
        return self.logits + self.bias

    @property
    def space_contributions(self) -> Float[Tensor, "batch pos n_spaces n_latent"]:
        b, p, _ = self.embedding_contributions.shape
        return self.embedding_contributions.view(b, p, self.n_spaces, -1)


def concept_contributions(
    model, concepts: Float[Tensor, "batch pos n_spaces n_latent"], attention_mask: Tensor | None
) -> Float[Tensor, "batch pos n_classes n_spaces n_latent"]:
    """Per-token, per-class, per-concept-unit shares of the logits from given concept activations."""
    return model.head.token_contributions(concepts, attention_mask)


def _rows(value, batch: int, name: str, device) -> Int[Tensor, " batch"]:
    t = torch.as_tensor(value, device=device, dtype=torch.long)
    t = t.expand(batch) if t.ndim == 0 else t
    if t.shape != (batch,):
        raise ValueError(f"{name} must be an int or have shape (batch,) = ({batch},); got {tuple(t.shape)}")
    return t


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
    """Explain a batch: each token's exact share of the ``target`` logit (default: the predicted class),
    or of ``target - foil``. ``forward_kwargs`` go to the model (``token_type_ids``, ``inputs_embeds``)."""
    from .modeling import SpaceModelForSequenceClassification

    if not isinstance(model, SpaceModelForSequenceClassification):
        raise TypeError(f"context_attribution explains a SpaceModelForSequenceClassification; got "
                        f"{type(model).__name__} (use bcos_plugins.explain for B-cos models)")
    was_training = model.training
    model.eval()
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
    finally:
        model.train(was_training)
    logits, concepts = out.logits, out.concepts
    batch, n_classes = logits.shape
    device = logits.device
    for name, value in (("target", target), ("foil", foil)):
        if value is not None and ((torch.as_tensor(value) < 0).any() or (torch.as_tensor(value) >= n_classes).any()):
            raise ValueError(f"{name} must lie in [0, {n_classes}); got {torch.as_tensor(value).tolist()}")
    target_t = logits.argmax(-1) if target is None else _rows(target, batch, "target", device)
    per_class = model.head.token_contributions(concepts, attention_mask)  # (b, p, c, k, l)
    rows = torch.arange(batch, device=device)
    units = per_class[rows, :, target_t]  # (b, p, k, l)
    bias = model.head.classifier.bias[target_t]
    foil_t = None
    if foil is not None:
        foil_t = _rows(foil, batch, "foil", device)
        units = units - per_class[rows, :, foil_t]
        bias = bias - model.head.classifier.bias[foil_t]
    units = units.flatten(2)
    full = logits[rows, target_t] - (logits[rows, foil_t] if foil_t is not None else 0)
    return SpaceExplanation(
        contributions=units.sum(-1),
        embedding_contributions=units,
        logits=full - bias,
        target=target_t,
        foil=foil_t,
        position=None,
        input_ids=input_ids,
        attention_mask=attention_mask,
        reduce="sum",
        bias=bias.detach(),
        n_spaces=model.head.n_spaces,
    )
