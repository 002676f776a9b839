"""Adversarial masks from the weights alone (paper §4.4).

Eigenvectors of different output directions overlap, so an input along one of them can activate several.
The mask of eigenvector ``v_i`` is instead row ``i`` of the pseudo-inverse of the set ``V`` (rows
``v_j``): ``m_i . v_j = delta_ij``, a "key" that activates ``v_i`` and none of the other eigenvectors in
the set. Adding ``alpha m_i`` to an input moves ``v_i . x`` by ``alpha`` and leaves the other ``v_j . x``
unchanged, so the output reading ``v_i`` (``lambda_i > 0``) grows by ``lambda_i ((v_i . x + alpha)^2 -
(v_i . x)^2)``. The set is the top ``per_direction`` positive eigenvectors of every output direction (the
paper's "top 10 positive"; with ``per_direction=1`` and ten digit logits, the top positive eigenvector of each
digit). The more vectors in the set, the more the keys have to differ from the eigenvectors themselves and the
larger their norm: on 8x8 digits one per digit works far better than four per digit
(``examples/bilinear_digits.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_int, require_tensor
from ..errors import argument_error
from ..nn.functional import at_least_float32
from .eigen import Eigendecomposition, eigh_rounding, require_eigendecomposition, top_eigen_indices

__all__ = ["AdversarialMasks", "adversarial_masks", "pseudo_inverse_masks"]


def pseudo_inverse_masks(vectors: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_in"]:
    """Rows ``m_i`` with ``m_i . vectors[j] = delta_ij`` (needs ``n <= d_in`` and independent vectors); in at least
    float32, as :func:`~bcos_plugins.bilinear.eigendecompose`."""
    vectors = require_tensor("vectors", vectors, ndim=2, kind="float", shape_hint="(n, d_in)")
    if vectors.shape[0] == 0:
        raise argument_error("vectors", "holds no vector", "Pass at least one eigenvector")
    return _separating_masks(vectors, (
        "vectors", f"{vectors.shape[0]} vectors in {vectors.shape[1]} dimensions cannot be separated (m_i . v_j = "
        "delta_ij needs n <= d_in)", "Use fewer eigenvectors per direction"), (
        "vectors", "are linearly dependent, so no masks with m_i . v_j = delta_ij exist",
        "Use fewer eigenvectors per direction (or directions with different spectra)"))


def _separating_masks(vectors: Tensor, too_many: tuple[str, str, str], dependent: tuple[str, str, str]) -> Tensor:
    """:func:`pseudo_inverse_masks` of ``vectors`` ``(n, d_in)``, refusing with ``too_many`` (argument, problem, fix)
    where ``n > d_in`` and with ``dependent`` where they are linearly dependent: each caller names its own argument
    (``adversarial_masks``' refusals named ``vectors``, an argument it does not take)."""
    # torch's rank and pseudo-inverse take float and double only: float16 / bfloat16 failed with "This function
    # doesn't handle types other than float and double" (widening them is exact)
    vectors = vectors.to(at_least_float32(vectors.dtype))
    n, d_in = vectors.shape
    if n > d_in:
        raise argument_error(*too_many)
    # With dependent vectors the pseudo-inverse is only a least-squares answer: m_i . v_j = delta_ij fails,
    # and the masks would silently not be the keys they are meant to be. (Rank with torch's default tolerance,
    # so ill-conditioned but independent sets still get their, large, keys.)
    if int(torch.linalg.matrix_rank(vectors)) < n:
        raise argument_error(*dependent)
    return torch.linalg.pinv(vectors).T


class AdversarialMasks(NamedTuple):
    """``masks[d, r]`` targets ``eigenvectors[d, r]``, the r-th most positive eigenvector of direction d."""

    masks: Float[Tensor, "n per d_in"]
    eigenvectors: Float[Tensor, "n per d_in"]
    eigenvalues: Float[Tensor, "n per"]


def adversarial_masks(eig: Eigendecomposition, per_direction: int = 1,
                      reference: Float[Tensor, " d_in"] | None = None) -> AdversarialMasks:
    """Pseudo-inverse masks for the top ``per_direction`` positive eigenvectors of every direction in ``eig``.

    The sign of an eigenvector is arbitrary; with ``reference`` (e.g. the mean input) each mask is
    oriented so that adding it increases ``|v_i . reference|``, i.e. it strengthens the eigenvector's
    activation on typical inputs rather than first cancelling it.

    For an augmented layer (``bilinear_weights(layer).augmented()``, inputs ``[x, 1]``: ``augment_input``) the
    masks, like the eigenvectors and ``reference``, have ``d_in + 1`` entries, the last one on the constant ``[x, 1]``
    coordinate, which no input moves. They separate the eigenvectors over ``[x, 1]``: adding ``alpha * m_i[:-1]`` to
    ``x`` moves ``v_j . [x, 1]`` by ``alpha * (delta_ij - m_i[-1] * v_j[-1])``, the key's promise only where that
    last product is 0 (decompose the bias-free layer, ``without_biases()``, for masks over ``x`` alone).
    """
    eig = require_eigendecomposition(eig)
    if eig.eigenvalues.ndim != 2:
        raise argument_error("eig", "adversarial_masks needs a batch of decompositions",
                             "Use eigendecompose(layer, u) with u of shape (n, d_out)")
    n_dirs, d_in = eig.eigenvalues.shape
    per_direction = require_int("per_direction", per_direction, minimum=1, maximum=d_in)
    if reference is not None:
        reference = require_tensor("reference", reference, ndim=1, kind="real", shape_hint=f"({d_in},)",
                                   list_dtype=eig.eigenvectors.dtype)
        if reference.shape[0] != d_in:
            raise argument_error("reference", f"has {reference.shape[0]} entries, the eigenvectors {d_in}",
                                 "Pass an input of the layer (e.g. the mean input)")
    # top_eigen_indices(by="positive") takes the most positive eigenvalues, positive or not: a direction with fewer
    # than per_direction of them (a singular Q(u), e.g. of a rank-1 layer, or a negative semidefinite one) got masks for
    # null-space eigenvectors (eigenvalue 1e-8, eigh's rounding of 0) or negative ones, keys that activate nothing. A
    # zero eigenvalue comes back as rounding of about d_in * eps * max |lambda| (eigh's backward error): not positive.
    n_positive = (eig.eigenvalues > eigh_rounding(eig.eigenvalues)).sum(-1)
    short = n_positive < per_direction
    if short.any():
        rows = short.nonzero().flatten().tolist()
        counts = ", ".join(str(int(n_positive[r])) for r in rows[:8])
        raise argument_error(
            "per_direction", f"is {per_direction}, but direction(s) {rows[:8]} have only {counts} positive "
            "eigenvalue(s) above rounding (d_in * eps * max |lambda|): a mask keys one eigenvector, and one of a zero "
            "or negative eigenvalue does not raise the output", f"Pass per_direction <= "
            f"{int(n_positive.min())}, or leave out directions whose interaction matrix is singular or negative "
            "semidefinite")
    index = top_eigen_indices(eig.eigenvalues, per_direction, by="positive")  # (n, per)
    vectors = eig.eigenvectors.gather(-1, index[:, None, :].expand(n_dirs, d_in, per_direction)).mT  # (n, per, d_in)
    values = eig.eigenvalues.gather(-1, index)
    # one set of masks separates every kept eigenvector from every other, across the directions
    separable = (f"{n_dirs * per_direction} masks, each keyed to one eigenvector and blind to every other kept one, "
                 f"cannot be separated in d_in={d_in} dimensions")
    masks = _separating_masks(vectors.reshape(-1, d_in), (
        "per_direction", f"is {per_direction} for {n_dirs} direction(s): {separable}",
        f"Pass per_direction <= {d_in // n_dirs}") if n_dirs <= d_in else (
        "eig", f"holds {n_dirs} directions: {separable}", f"Decompose at most {d_in} directions (the rows of u in "
        "eigendecompose(layer, u))"), (
        "eig", f"the {n_dirs * per_direction} kept eigenvectors of its {n_dirs} direction(s) are linearly dependent "
        "(two directions share an eigenvector: the same direction twice, or interaction matrices with a common "
        "eigenspace), so no masks keyed to each one alone exist", "Decompose distinct directions (the rows of u "
        "in eigendecompose(layer, u)), or keep fewer eigenvectors per direction"))
    masks = masks.reshape(n_dirs, per_direction, d_in)
    if reference is not None:
        sign = torch.sign(vectors @ reference.to(vectors.dtype))
        masks = masks * torch.where(sign == 0, torch.ones_like(sign), sign)[..., None]
    return AdversarialMasks(masks, vectors, values)
