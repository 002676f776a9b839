"""Truncation to the top-k eigenvectors per output (paper §4.2, Fig. 5) and the accuracy curve it gives.

Keeping ``k`` terms of Eq. 3 per output direction ``u``::

    u . out(x) ~= sum_{i in top_k(u)} lambda_i (v_i . x)^2

is the best rank-k approximation of ``Q(u)`` when the top-k are taken by ``|lambda|`` (Eckart-Young for
symmetric matrices); ``by="positive"`` keeps the most positive ones instead.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._checks import require_class_ids, require_int, require_tensor
from ..errors import BcosTypeError, argument_error
from .eigen import (
    Eigendecomposition,
    Order,
    eigendecompose,
    eigenvector_activations,
    eigh_rounding,
    require_eigendecomposition,
    top_eigen_indices,
)
from .sources import bilinear_weights

__all__ = ["TruncationCurve", "truncated_outputs", "truncation_curve"]


def truncated_outputs(eig: Eigendecomposition, x: Float[Tensor, "batch d_in"], k: int, by: Order = "magnitude"
                      ) -> Float[Tensor, "batch n"]:
    """Outputs along each decomposed direction from its top ``k`` eigenvectors only.

    ``eig`` holds a batch of decompositions (``eigendecompose(layer, directions)`` with directions
    ``(n, d_out)``); with ``k = d_in`` this is the exact output ``directions @ out(x)``.
    """
    eig = require_eigendecomposition(eig)
    if eig.eigenvalues.ndim != 2:
        raise argument_error("eig", "truncated_outputs needs a batch of decompositions",
                             "Use eigendecompose(layer, u) with u of shape (n, d_out)")
    activations = eigenvector_activations(eig, x)  # (batch, n, d_in)
    keep = top_eigen_indices(eig.eigenvalues, k, by)  # (n, k)
    _warn_if_top_k_is_not_unique(eig.eigenvalues, k, by)
    return activations.gather(-1, keep.expand(activations.shape[0], *keep.shape)).sum(-1)


def _warn_if_top_k_is_not_unique(eigenvalues: Tensor, k: int, by: Order) -> None:
    """Warn where the k-th kept and the first left-out eigenvalue are equal within eigh's rounding and not zero: the
    top k is then no set of eigenvectors but a choice inside their shared eigenspace, which eigh makes arbitrarily, so
    two weights of one layer function (W and V rotated alike) gave different truncated outputs (9 and 5.76 for
    Q = I, x = (1, 2, 3, 4), k = 1)."""
    if not 0 < k < eigenvalues.shape[-1]:
        return
    keys = {"magnitude": eigenvalues.abs(), "positive": eigenvalues, "negative": -eigenvalues}[by]
    ordered, order = keys.sort(dim=-1, descending=True)
    rounding = eigh_rounding(eigenvalues)[..., 0]
    kept_last = eigenvalues.gather(-1, order[..., k - 1:k])[..., 0]
    tied = (ordered[..., k - 1] - ordered[..., k] <= 2 * rounding) & (kept_last.abs() > rounding)
    if bool(tied.any()):
        rows = tied.reshape(-1).nonzero().flatten().tolist()
        warnings.warn(
            f"truncated_outputs: with k={k} (by={by!r}) the top k of direction(s) {rows[:8]} is not unique: their "
            f"k-th and (k+1)-th eigenvalues are equal within rounding ({float(kept_last.reshape(-1)[rows[0]]):.4g}), "
            "so which eigenvectors of their shared eigenspace are kept, and the truncated outputs, depend on "
            "torch.linalg.eigh's arbitrary basis of it. Pick a k at a gap of the spectrum, or keep the whole "
            "eigenspace", UserWarning, stacklevel=3)


class TruncationCurve(NamedTuple):
    """Accuracy of the truncated classifier for each ``k``; ``full_accuracy`` without truncation."""

    ks: list[int]
    accuracy: list[float]
    full_accuracy: float


def truncation_curve(source, x: Float[Tensor, "batch d_in"], labels: Int[Tensor, " batch"], ks,
                     directions: Float[Tensor, "n d_out"] | None = None, by: Order = "magnitude") -> TruncationCurve:
    """Classification accuracy when every output keeps only its top ``k`` eigenvectors, for each ``k`` in ``ks``.

    ``directions`` default to the output basis (the logits). The prediction is the argmax over directions. ``x``
    is the layer's input: for activations read at a TransformerLens model's ``blocks.L.ln2.hook_normalized``
    (recorded before ln2's weight and bias) pass ``bilinear_weights(mlp, input_norm=model.blocks[L].ln2)`` as
    ``source``.
    """
    weights = bilinear_weights(source)
    if directions is None:
        directions = torch.eye(weights.d_out, dtype=weights.P.dtype, device=weights.P.device)
    # checked here, naming directions: one vector or another width were refused naming eig or u, arguments of the inner
    # functions the caller never passed
    directions = require_tensor("directions", directions, ndim=2, kind="real",
                                shape_hint=f"(n, d_out) = (n, {weights.d_out}), one output direction per class",
                                list_dtype=weights.P.dtype)
    if directions.shape[1] != weights.d_out or directions.shape[0] == 0:
        raise argument_error("directions", f"has {directions.shape[0]} directions of width {directions.shape[1]}, the "
                             f"layer's outputs have d_out={weights.d_out}", "Pass at least one direction in the layer's "
                             "output space (the default is its output basis, the logits)")
    x = require_tensor("x", x, ndim=2, kind="real", shape_hint="(batch, d_in)", list_dtype=weights.P.dtype)
    if x.shape[0] == 0:
        raise argument_error("x", "is an empty batch, whose accuracy is undefined", "Pass at least one input")
    n_directions = directions.shape[0]
    # Out-of-range or float labels would silently count as errors (or be truncated).
    labels = require_class_ids("labels", labels, x.shape[0], n_directions, "directions (classes)")
    if isinstance(ks, int | str) or not hasattr(ks, "__iter__"):
        raise argument_error("ks", f"must be a sequence of ints, got {ks!r}", "Pass e.g. [1, 2, 4]",
                             kind=BcosTypeError)
    ks = [require_int("ks", k, minimum=1, maximum=x.shape[1]) for k in ks]
    if not ks:
        raise argument_error("ks", "is empty", "Pass the numbers of eigenvectors to keep, e.g. [1, 2, 4]")
    eig = eigendecompose(weights, directions)
    accuracy = [
        (truncated_outputs(eig, x, k, by).argmax(-1) == labels).float().mean().item() for k in ks
    ]
    full = (truncated_outputs(eig, x, weights.d_in, by).argmax(-1) == labels).float().mean().item()
    return TruncationCurve(ks, accuracy, full)
