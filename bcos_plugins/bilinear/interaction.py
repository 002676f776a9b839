"""Interaction matrices of a bilinear layer, from its weights.

For an output direction ``u`` (``d_out``), the layer's output along ``u`` is a quadratic form::

    u . P ((W x) * (V x)) = sum_a (P^T u)_a (w_a . x)(v_a . x) = x^T Q(u) x
    Q(u) = W^T diag(P^T u) V              (d_in, d_in), cost O(d_hidden d_in^2)

Only the symmetric part ``(Q + Q^T) / 2`` contributes (``x^T A x = 0`` for antisymmetric ``A``), so that
is what is returned. Stacking ``Q(e_o)`` over the output basis gives the bilinear tensor
``B[o, i, j] = sum_a P[o, a] sym(w_a v_a^T)[i, j]`` (``d_out, d_in, d_in``); :func:`interaction_matrix`
never builds it (``O(d_out d_hidden d_in^2)`` time, ``O(d_out d_in^2)`` memory): only
:func:`bilinear_tensor` does, on request.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_bool, require_int, require_tensor
from ..errors import argument_error
from .sources import bilinear_weights
from .weights import BilinearWeights, require_bias_free

__all__ = ["bilinear_tensor", "interaction_matrix", "iter_interaction_matrices"]

# Directions per batched matmul: bounds the scaled copy of W (chunk, d_in, d_hidden) kept in memory.
DEFAULT_CHUNK = 8


def require_finite_weights(weights: BilinearWeights) -> None:
    """NaN / inf weights make every interaction matrix and eigenvalue NaN without an error: refuse them."""
    for name in ("W", "V", "P"):
        value = getattr(weights, name)
        if not torch.isfinite(value).all():
            raise argument_error("source", f"bilinear weight {name} contains NaN or inf",
                                 "Check the model (a diverged training run?) before analysing it")


def _directions(weights: BilinearWeights, u: Tensor) -> Tensor:
    u = require_tensor("u", u, ndim=(1, 2), kind="real", shape_hint=f"(d_out,) or (n, d_out) = (n, {weights.d_out})",
                       list_dtype=weights.P.dtype)
    if u.shape[-1] != weights.d_out:
        raise argument_error(
            "u", f"output direction(s) u must have shape (d_out,) or (n, d_out) with d_out={weights.d_out}, got "
            f"{tuple(u.shape)}", "Pass directions in the layer's output space")
    if u.ndim == 2 and u.shape[0] == 0:
        raise argument_error("u", "holds no direction (shape (0, d_out))", "Pass at least one output direction")
    require_finite_weights(weights)
    return u.to(device=weights.P.device, dtype=weights.P.dtype)


def iter_interaction_matrices(source, u: Float[Tensor, "n d_out"], chunk_size: int = DEFAULT_CHUNK):
    """Yield the symmetrised ``Q(u)`` of ``chunk_size`` directions at a time, shape ``(chunk, d_in, d_in)``.

    The streaming form of :func:`interaction_matrix`: consumers that reduce each matrix (eigenvalues,
    norms) never hold all ``n`` of them.
    """
    weights = bilinear_weights(source)
    require_bias_free(weights, "interaction_matrix")
    u = _directions(weights, u)
    if u.ndim == 1:
        u = u[None]
    chunk_size = require_int("chunk_size", chunk_size, minimum=1)
    W_t = weights.W.T  # (d_in, d_hidden)
    hidden_coefficients = u @ weights.P  # (n, d_hidden) = P^T u for each direction
    for start in range(0, u.shape[0], chunk_size):
        coeff = hidden_coefficients[start:start + chunk_size]
        # (chunk, d_in, d_hidden) @ (d_hidden, d_in): one GEMM of W^T diag(c) V per direction.
        q = (W_t[None] * coeff[:, None, :]) @ weights.V
        q = 0.5 * (q + q.mT)
        if not bool(torch.isfinite(q).all()):
            # finite weights and directions (checked above), so an overflow: Q grows as the cube of the weights' scale,
            # and torch.linalg.eigh failed on it with "the algorithm failed to converge"
            largest = max(float(t.abs().max()) for t in (weights.W, weights.V, weights.P))
            divide = "divide W, V, P or u by powers of two first (exact; the eigenvalues scale by the same factors)"
            fix = ("D" + divide[1:] if q.dtype == torch.float64 else
                   f"Analyse the layer in float64 (bilinear_weights(layer).to(torch.float64)), or {divide}")
            raise argument_error(
                "source", f"the interaction matrices overflow {q.dtype} (the weights reach {largest:.3g}, the "
                f"directions {float(u.abs().max()):.3g}; Q(u) grows as their product)", fix)
        yield q


def interaction_matrix(source, u: Float[Tensor, "*n d_out"], chunk_size: int = DEFAULT_CHUNK
                       ) -> Float[Tensor, "*n d_in d_in"]:
    """Symmetrised interaction matrix ``Q(u)`` for one direction (``u`` of shape ``(d_out,)``) or a batch.

    ``source`` is anything :func:`~bcos_plugins.bilinear.bilinear_weights` accepts. The layer must be
    bias-free; for a layer with biases pass ``bilinear_weights(layer).augmented()``.
    """
    weights = bilinear_weights(source)
    require_bias_free(weights, "interaction_matrix")
    u = _directions(weights, u)
    out = torch.cat(list(iter_interaction_matrices(weights, u.reshape(-1, weights.d_out), chunk_size)))
    return out[0] if u.ndim == 1 else out


def bilinear_tensor(source, symmetric: bool = True) -> Float[Tensor, "d_out d_in d_in"]:
    """The full ``(d_out, d_in, d_in)`` bilinear tensor, ``B[o] = Q(e_o)``. Materialises it: only on request."""
    # a string such as "no" is truthy: it returned the symmetric tensor
    require_bool("symmetric", symmetric, fix="Pass symmetric=True for the symmetrised tensor, symmetric=False for the "
                 "tensor as the weights give it")
    weights = bilinear_weights(source)
    require_bias_free(weights, "bilinear_tensor")
    tensor = torch.einsum("oh,hi,hj->oij", weights.P, weights.W, weights.V)
    return 0.5 * (tensor + tensor.mT) if symmetric else tensor
