"""Truncation to the top-k eigenvectors per output (paper §4.2, Fig. 5) and the accuracy curve it gives.

Keeping ``k`` terms of Eq. 3 per output direction ``u``::

    u . out(x) ~= sum_{i in top_k(u)} lambda_i (v_i . x)^2

is the best rank-k approximation of ``Q(u)`` when the top-k are taken by ``|lambda|`` (Eckart-Young for
symmetric matrices); ``by="positive"`` keeps the most positive ones instead.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .eigen import Eigendecomposition, Order, eigendecompose, eigenvector_activations, top_eigen_indices
from .weights import bilinear_weights

__all__ = ["TruncationCurve", "truncated_outputs", "truncation_curve"]


def truncated_outputs(eig: Eigendecomposition, x: Float[Tensor, "batch d_in"], k: int, by: Order = "magnitude"
                      ) -> Float[Tensor, "batch n"]:
    """Outputs along each decomposed direction from its top ``k`` eigenvectors only.

    ``eig`` holds a batch of decompositions (``eigendecompose(layer, directions)`` with directions
    ``(n, d_out)``); with ``k = d_in`` this is the exact output ``directions @ out(x)``.
    """
    if eig.eigenvalues.ndim != 2:
        raise ValueError("truncated_outputs needs a batch of decompositions: eigendecompose(layer, u) with u (n, d_out)")
    activations = eigenvector_activations(eig, x)  # (batch, n, d_in)
    keep = top_eigen_indices(eig.eigenvalues, k, by)  # (n, k)
    return activations.gather(-1, keep.expand(activations.shape[0], *keep.shape)).sum(-1)


class TruncationCurve(NamedTuple):
    """Accuracy of the truncated classifier for each ``k``; ``full_accuracy`` without truncation."""

    ks: list[int]
    accuracy: list[float]
    full_accuracy: float


def truncation_curve(source, x: Float[Tensor, "batch d_in"], labels: Int[Tensor, " batch"], ks,
                     directions: Float[Tensor, "n d_out"] | None = None, by: Order = "magnitude") -> TruncationCurve:
    """Classification accuracy when every output keeps only its top ``k`` eigenvectors, for each ``k`` in ``ks``.

    ``directions`` default to the output basis (the logits). The prediction is the argmax over directions.
    """
    weights = bilinear_weights(source)
    if directions is None:
        directions = torch.eye(weights.d_out, dtype=weights.P.dtype, device=weights.P.device)
    if labels.shape != x.shape[:1]:
        raise ValueError(f"labels {tuple(labels.shape)} must have one entry per input row ({x.shape[0]})")
    eig = eigendecompose(weights, directions)
    ks = [int(k) for k in ks]
    accuracy = [
        (truncated_outputs(eig, x, k, by).argmax(-1) == labels).float().mean().item() for k in ks
    ]
    full = (truncated_outputs(eig, x, weights.d_in, by).argmax(-1) == labels).float().mean().item()
    return TruncationCurve(ks, accuracy, full)
