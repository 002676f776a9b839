"""Higher-order SVD of the bilinear tensor (paper §3.3), without building the tensor.

Flatten the two input axes of the symmetric tensor, ``T = B.reshape(d_out, d_in * d_in)``, and take its SVD::

    T = sum_i sigma_i u_i (x) vec(q_i)

``u_i`` are the most important output directions and ``q_i`` (``d_in, d_in``, symmetric, unit Frobenius
norm) the interaction matrices they read, to be eigendecomposed in turn. ``T = P S`` with ``S`` the
(``d_hidden, d_in^2``) stack of ``sym(w_a v_a^T)``, so the output Gram matrix is::

    T T^T = P K P^T,   K_ab = <sym(w_a v_a^T), sym(w_b v_b^T)>_F
                            = ((w_a . w_b)(v_a . v_b) + (w_a . v_b)(v_a . w_b)) / 2

Its eigenvectors are the ``u_i``, its eigenvalues ``sigma_i^2``, and ``q_i = Q(u_i) / sigma_i``
(``Q`` from :func:`~bcos_plugins.bilinear.interaction_matrix`). Cost ``O(d_hidden^2 d_in + d_out^2 d_hidden
+ r d_hidden d_in^2)`` instead of the SVD of a ``d_out x d_in^2`` matrix. The Gram matrix is formed in
float64 because it squares the singular values, from ``W``, ``V`` and ``P`` each divided by a power of two (exact)
that brings its largest entry into [1/2, 1); the singular values are multiplied back at the end, so weights far
from 1 (float64 below about 1e-52 or above 1e51) neither underflow to an empty decomposition nor overflow.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_float, require_int
from ..nn.functional import at_least_float32
from .interaction import interaction_matrix, require_finite_weights
from .sources import bilinear_weights
from .weights import require_bias_free

__all__ = ["HOSVD", "hosvd"]


class HOSVD(NamedTuple):
    """``B ~= sum_i singular_values[i] * output_directions[:, i] (x) interaction_matrices[i]``."""

    singular_values: Float[Tensor, " r"]
    output_directions: Float[Tensor, "d_out r"]
    interaction_matrices: Float[Tensor, "r d_in d_in"]

    def reconstruct(self) -> Float[Tensor, "d_out d_in d_in"]:
        """The (rank-r) symmetric bilinear tensor; materialises ``d_out x d_in^2`` numbers."""
        return torch.einsum("r,or,rij->oij", self.singular_values, self.output_directions, self.interaction_matrices)


def hosvd(source, rank: int | None = None, rtol: float = 1e-6) -> HOSVD:
    """Top ``rank`` terms of the HOSVD (all non-zero ones if ``None``), singular values descending.

    Terms with ``sigma_i <= rtol * sigma_max`` are dropped: their ``q_i`` are undefined. So are, whatever ``rtol``,
    terms within the rounding of the float64 Gram matrix, ``sigma_i^2 <= d_out * eps * sigma_max^2`` (``sigma_i``
    below about ``1.5e-8 * sqrt(d_out)`` of ``sigma_max``): such a ``sigma_i`` is rounding of a zero, not a term of
    the layer (``rtol=0`` kept them, with ``q_i`` of norm 1e-8 or 10 instead of 1). Returned in at least
    float32, as :func:`~bcos_plugins.bilinear.eigendecompose` (a float16 / bfloat16 layer's terms are computed and
    returned in float32: its interaction matrices were computed in half precision, 3 significant digits).
    """
    if rank is not None:
        rank = require_int("rank", rank, minimum=1)
    rtol = require_float("rtol", rtol, minimum=0.0, maximum=1.0)
    weights = bilinear_weights(source)
    require_bias_free(weights, "hosvd")
    require_finite_weights(weights)
    # each factor scaled to a largest entry in [1/2, 1) by a power of two (exact) and the singular values unscaled
    # at the end: the Gram matrix is the sixth power of the weights' scale, which underflowed float64 for weights
    # below about 1e-52 (the empty decomposition of a non-zero layer) and overflowed above about 1e51
    factors = [t.to(torch.float64) for t in (weights.W, weights.V, weights.P)]
    scales = [_power_of_two_scale(t) for t in factors]
    W, V, P = (t / scale for t, scale in zip(factors, scales, strict=True))
    gram_hidden = 0.5 * ((W @ W.T) * (V @ V.T) + (W @ V.T) * (V @ W.T))
    gram_out = P @ gram_hidden @ P.T
    squared, directions = torch.linalg.eigh(gram_out)
    squared, directions = squared.flip(0), directions.flip(1)
    sigma = squared.clamp_min(0).sqrt()
    # eigh's backward error on the Gram matrix, the rule adversarial_masks applies to an eigendecomposition
    resolvable = math.sqrt(gram_out.shape[0] * torch.finfo(torch.float64).eps)
    keep = sigma > max(rtol, resolvable) * sigma[0].clamp_min(torch.finfo(torch.float64).tiny)
    if rank is not None:
        keep &= torch.arange(sigma.numel(), device=sigma.device) < rank
    sigma, directions = sigma[keep], directions[:, keep]
    dtype = at_least_float32(weights.W.dtype)
    # by the exponents' sum: the product of the three scales could underflow or overflow where sigma itself does not
    exponent = sum(math.frexp(scale)[1] - 1 for scale in scales)
    unscaled = torch.tensor([math.ldexp(value, exponent) for value in sigma.tolist()], dtype=torch.float64,
                            device=sigma.device)
    if sigma.numel() == 0:
        # An all-zero layer: the empty decomposition, whose reconstruction is the zero tensor.
        return HOSVD(unscaled.to(dtype), directions.to(dtype),
                     weights.W.new_zeros(0, weights.d_in, weights.d_in, dtype=dtype))
    directions = directions.to(dtype)
    # the matrices (unit norm, whatever the scale) from the scaled weights, so that a tiny float32 layer's products
    # do not underflow either; a half-precision layer's scaled weights widened (exactly) to float32
    matrices = interaction_matrix(tuple(t.to(dtype) for t in (W, V, P)), directions.T) / sigma.to(dtype)[:, None, None]
    return HOSVD(unscaled.to(dtype), directions, matrices)


def _power_of_two_scale(t: Tensor) -> float:
    """The power of two just above ``t``'s largest magnitude (1 for an all-zero ``t``): dividing by it is exact."""
    largest = float(t.abs().max()) if t.numel() else 0.0
    if largest == 0.0:
        return 1.0
    return math.ldexp(1.0, math.frexp(largest)[1])
