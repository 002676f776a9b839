"""Space Model losses: the inter-space and intra-space regularisers (padding excluded from both).

Notation: ``z`` (batch, pos, n_spaces, n_latent) are the concept activations ``tanh(h P_k)`` in [-1, 1],
``m`` the attention mask, one concept space per class.

- **Inter-space** (the reference code's match / mismatch loss): pull the true class's space towards +1 and
  push the other spaces towards -1, averaged over real tokens and latent units:
  ``match_weight * mean(1 - z_y) + mismatch_weight * mean_{k != y}(1 + z_k)``, each term in [0, 2].
- **Intra-space** (paper Eq. 5, "an inverse of the variance of the vectors inside the context
  attribution"): per example, space and latent unit, the variance of ``z`` over the real tokens,
  then ``1 / (variance + eps)`` averaged. It keeps the tokens of one space from collapsing onto one point.

Why it cannot blow up: tanh saturates at ±1, where every token gets the same value and the variance is
0 (and a one-token input has variance 0 anyway). The reference code divides by ``variance + 1e-9`` and so
returns ~1e9 there, which swamps the cross-entropy. Here ``eps`` defaults to 0.01: since ``z`` lies in
[-1, 1] the variance lies in [0, 1], so the term lies in ``[1 / (1 + eps), 1 / eps]`` = [0.99, 100] and
its gradient ``-1 / (variance + eps)^2`` is at most ``1 / eps^2`` in size. It is finite for every input.

Scale of the intra-space weight: the reference code *sums* ``1 / variance`` over the ``K`` spaces and ``L``
latent units (and averages over the batch), where :func:`intra_space_loss` *averages* over them, so at the
same weight ours is ``K x L`` times weaker. The paper's weight (0.001) therefore does not carry over as is:
:func:`intra_space_weight_from_paper` converts it (``paper_weight * K * L``).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._checks import require_class_ids, require_float, require_int, require_tensor, require_token_batch
from ..errors import argument_error

__all__ = ["inter_space_loss", "intra_space_loss", "intra_space_weight_from_paper"]


def _check_concepts(concepts) -> Tensor:
    concepts = require_tensor("concepts", concepts, ndim=4, kind="float",
                              shape_hint="(batch, pos, n_spaces, n_latent)")
    if 0 in concepts.shape:
        raise argument_error("concepts", f"is empty (shape {tuple(concepts.shape)})",
                             "Pass the concept activations of at least one token of one example")
    return concepts


def _token_weights(concepts: Tensor, attention_mask: Tensor | None) -> Float[Tensor, "batch pos"]:
    batch, pos = concepts.shape[:2]
    if attention_mask is None:
        mask = torch.ones(batch, pos, dtype=concepts.dtype, device=concepts.device)
    else:
        # the package's one mask check (shape, 0/1, a real token per row), against the concepts' (batch, pos)
        _, attention_mask = require_token_batch(torch.ones(batch, pos, dtype=torch.long), attention_mask,
                                                name="concepts")
        mask = attention_mask.to(concepts.dtype)
    return mask / mask.sum(1, keepdim=True)


def inter_space_loss(
    concepts: Float[Tensor, "batch pos n_spaces n_latent"],
    labels: Int[Tensor, " batch"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    match_weight: float = 0.5,
    mismatch_weight: float = 0.5,
) -> Float[Tensor, ""]:
    """True-class space towards +1, other spaces towards -1, over real tokens (see module docstring)."""
    concepts = _check_concepts(concepts)
    n_spaces = concepts.shape[2]
    labels = require_class_ids("labels", labels, concepts.shape[0], n_spaces, "concept spaces (one per class)")
    match_weight = require_float("match_weight", match_weight, minimum=0.0)
    mismatch_weight = require_float("mismatch_weight", mismatch_weight, minimum=0.0)
    w = _token_weights(concepts, attention_mask)
    per_space = torch.einsum("bpkl,bp->bk", concepts, w) / concepts.shape[3]  # mean z per example and space
    is_true = torch.nn.functional.one_hot(labels, n_spaces).to(concepts.dtype)
    match = ((1 - per_space) * is_true).sum(1)
    mismatch = ((1 + per_space) * (1 - is_true)).sum(1) / max(n_spaces - 1, 1)
    return (match_weight * match + mismatch_weight * mismatch).mean()


def intra_space_loss(
    concepts: Float[Tensor, "batch pos n_spaces n_latent"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    eps: float = 0.01,
) -> Float[Tensor, ""]:
    """Mean of ``1 / (variance over real tokens + eps)``, bounded by ``1 / eps`` (see module docstring)."""
    # eps is what keeps 1 / (variance + eps) finite when tanh saturates.
    eps = require_float("eps", eps, minimum=0.0, open_minimum=True)
    concepts = _check_concepts(concepts)
    w = _token_weights(concepts, attention_mask)
    mean = torch.einsum("bpkl,bp->bkl", concepts, w)
    variance = torch.einsum("bpkl,bp->bkl", (concepts - mean[:, None]) ** 2, w)
    return (1.0 / (variance + eps)).mean()


def intra_space_weight_from_paper(paper_weight: float, n_spaces: int, n_latent: int) -> float:
    """The ``intra_space_weight`` that gives the paper's / reference code's intra-space term at ``paper_weight``.

    The reference sums ``1 / variance`` over spaces and latent units, :func:`intra_space_loss` averages over
    them, so the equivalent weight here is ``paper_weight * n_spaces * n_latent`` (e.g. the paper's 0.001 with
    2 spaces of 8 latents is 0.016). Only the sum-vs-mean scale is converted; the ``eps`` bound stays.
    """
    paper_weight = require_float("paper_weight", paper_weight, minimum=0.0)
    # the package's int check: a NumPy integer (a count read from an array) was refused as "is np.int64(2), not a
    # positive int"
    fix = "Pass the head's number of concept spaces / latent units (config.num_labels / config.n_latent)"
    n_spaces = require_int("n_spaces", n_spaces, minimum=1, fix=fix)
    n_latent = require_int("n_latent", n_latent, minimum=1, fix=fix)
    return paper_weight * n_spaces * n_latent
