"""Eigendecomposition of interaction matrices (paper §3.2) and spectrum statistics (App. E).

For a symmetric interaction matrix ``Q(u) = sum_i lambda_i v_i v_i^T`` (spectral theorem)::

    u . out(x) = x^T Q(u) x = sum_i lambda_i (v_i . x)^2        (paper Eq. 3)

so each eigenvector ``v_i`` is an input direction whose activation ``lambda_i (v_i . x)^2`` is quadratic in
the input, and the eigenvectors have no cross-interactions. Eigenvalues are returned in ascending order
(``torch.linalg.eigh``): the last is the most positive, the first the most negative.

Near-sparsity ``(L1 / L2)^2`` (App. E): between 1 (one non-zero entry) and n (all entries equal in size),
a continuous L0. On eigenvalues it is the effective rank of ``Q``; on an eigenvector, its number of
effectively active inputs.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._checks import require_choice, require_int, require_tensor
from ..errors import BcosTypeError, argument_error
from ..nn.functional import at_least_float32
from .interaction import DEFAULT_CHUNK, interaction_matrix, iter_interaction_matrices
from .sources import bilinear_weights
from .weights import BilinearWeights

__all__ = [
    "Eigendecomposition",
    "effective_rank",
    "eigendecompose",
    "eigenvector_activations",
    "interaction_spectra",
    "l1_l2_sparsity",
    "top_eigen_indices",
]

Order = Literal["magnitude", "positive", "negative"]


class Eigendecomposition(NamedTuple):
    """``Q = V diag(eigenvalues) V^T``; ``eigenvectors[..., :, i]`` belongs to ``eigenvalues[..., i]`` (ascending)."""

    eigenvalues: Float[Tensor, "*n d_in"]
    eigenvectors: Float[Tensor, "*n d_in d_in"]


def eigendecompose(source, u: Float[Tensor, "*n d_out"], chunk_size: int = DEFAULT_CHUNK) -> Eigendecomposition:
    """Eigendecomposition of ``Q(u)`` for one output direction or a batch (ascending eigenvalues), in at least
    float32 (a float16 / bfloat16 layer's ``Q`` is decomposed, and returned, in float32)."""
    q = interaction_matrix(_widened(source), u, chunk_size=chunk_size)
    eigenvalues, eigenvectors = torch.linalg.eigh(q)
    return Eigendecomposition(eigenvalues, eigenvectors)


def _widened(source) -> BilinearWeights:
    """The layer's weights in at least float32: torch has no half-precision ``eigh`` (it raised NotImplementedError),
    and a ``Q`` computed in half precision before widening kept 3 significant digits (eigenvalues off by 0.25% of
    the largest, small ones by more), although the result is float32. Widening bfloat16 / float16 is exact."""
    weights = bilinear_weights(source)
    wide = at_least_float32(weights.W.dtype)
    return weights if weights.W.dtype == wide else weights.to(wide)


def interaction_spectra(source, u: Float[Tensor, "n d_out"], chunk_size: int = DEFAULT_CHUNK
                        ) -> Float[Tensor, "n d_in"]:
    """Eigenvalues (ascending) of ``Q(u)`` for many directions, holding ``chunk_size`` matrices at a time (in at
    least float32, as :func:`eigendecompose`)."""
    return torch.cat([torch.linalg.eigvalsh(q) for q in iter_interaction_matrices(_widened(source), u, chunk_size)])


def require_eigendecomposition(eig) -> Eigendecomposition:
    if not isinstance(eig, Eigendecomposition):
        raise argument_error("eig", f"must be an Eigendecomposition, got {type(eig).__name__}",
                             "Pass eigendecompose(layer, u)", kind=BcosTypeError)
    return eig


def eigenvector_activations(eig: Eigendecomposition, x: Float[Tensor, "batch d_in"]
                            ) -> Float[Tensor, "batch *n d_in"]:
    """``lambda_i (v_i . x)^2`` for every eigenvector; summed over the last axis it equals ``u . out(x)``.

    ``x`` is the decomposed layer's input. A TransformerLens model's ``blocks.L.ln2.hook_normalized`` is not
    ``model.blocks[L].mlp``'s (it is recorded before ln2's weight and bias): decompose
    ``bilinear_weights(mlp, input_norm=model.blocks[L].ln2)`` for activations read there."""
    eig = require_eigendecomposition(eig)
    d_in = eig.eigenvectors.shape[-1]
    x = require_tensor("x", x, ndim=2, kind="real", shape_hint=f"(batch, d_in) = (batch, {d_in})",
                       list_dtype=eig.eigenvectors.dtype)
    if x.shape[1] != d_in:
        raise argument_error("x", f"has width {x.shape[1]}, the eigenvectors live in d_in={d_in}",
                             "Pass inputs of the decomposed layer (augment_input(x) for an augmented layer)")
    projections = torch.einsum("bi,...ik->b...k", x.to(eig.eigenvectors.dtype), eig.eigenvectors)
    return eig.eigenvalues * projections.square()


def eigh_rounding(eigenvalues: Float[Tensor, "*n d_in"]) -> Float[Tensor, "*n 1"]:
    """How far ``torch.linalg.eigh`` may move an eigenvalue by rounding (its backward error), per decomposition:
    ``d_in * eps * max |lambda|``. A zero eigenvalue comes back as about this much, and two equal eigenvalues as two
    values this close."""
    return eigenvalues.shape[-1] * torch.finfo(eigenvalues.dtype).eps * eigenvalues.abs().amax(-1, keepdim=True)


def top_eigen_indices(eigenvalues: Float[Tensor, "*n d_in"], k: int, by: Order = "magnitude"
                      ) -> Int[Tensor, "*n k"]:
    """Indices of the ``k`` leading eigenvalues: largest ``|lambda|``, most positive, or most negative."""
    eigenvalues = require_tensor("eigenvalues", eigenvalues, kind="real", shape_hint="(..., d_in)")
    if eigenvalues.ndim == 0:
        raise argument_error("eigenvalues", "is a scalar", "Pass (..., d_in) eigenvalues")
    k = require_int("k", k)
    if not 0 <= k <= eigenvalues.shape[-1]:
        raise argument_error("k", f"k={k} must lie in [0, {eigenvalues.shape[-1]}] (the number of eigenvalues)",
                             "Pass a smaller k")
    # require_choice: a list (by=["positive"]) failed on "unhashable type" in the dictionary look-up
    by = require_choice("by", by, ("magnitude", "positive", "negative"))
    keys = {"magnitude": eigenvalues.abs(), "positive": eigenvalues, "negative": -eigenvalues}
    return keys[by].topk(k, dim=-1).indices


def l1_l2_sparsity(values: Float[Tensor, "... n"], eps: float = 1e-30) -> Float[Tensor, ...]:
    """``(||v||_1 / ||v||_2)^2`` over the last axis (App. E); 0 for an all-zero vector."""
    # NaN would fall through ``l2 > 0`` and read as an all-zero vector (sparsity 0).
    values = require_tensor("values", values, kind="real", shape_hint="(..., n)")
    if values.ndim == 0:
        raise argument_error("values", "is a scalar", "Pass (..., n) values")
    if not values.is_floating_point():
        values = values.double()
    # the ratio does not depend on the scale, so each vector is divided by its largest magnitude first: the squares
    # in ||v||_2 overflowed (float32 eigenvalues of 2e19, a layer's weights at 1e6: ||v||_2 = inf, sparsity 0) or
    # underflowed below eps (1e-36: ||v||_2 clamped to eps, sparsity 1e-11 instead of 2.3), silently
    magnitude = values.abs()
    if magnitude.shape[-1] == 0:  # no entries: an all-zero vector (amax has no empty reduction)
        return magnitude.sum(-1)
    largest = magnitude.amax(-1, keepdim=True)
    scaled = magnitude / torch.where(largest > 0, largest, torch.ones_like(largest))
    l1 = scaled.sum(-1)
    l2 = scaled.norm(dim=-1)
    return torch.where(l2 > 0, (l1 / l2.clamp_min(eps)).square(), torch.zeros_like(l1))


def effective_rank(eigenvalues: Float[Tensor, "... d_in"]) -> Float[Tensor, ...]:
    """``(L1/L2)^2`` of the eigenvalues: how many eigenvectors effectively carry the interaction matrix."""
    return l1_l2_sparsity(eigenvalues)
