"""Bilinear MLP: ``out = P ((W x + b_w) * (V x + b_v))``.

A gated linear unit without the gate nonlinearity (paper Eq. 1 with ``sigma`` = identity). The output is a
quadratic form of the input: for an output direction ``u``, ``u . out = x^T Q(u) x`` with
``Q(u) = W^T diag(P^T u) V`` (see :mod:`bcos_plugins.bilinear.interaction`).

Explanation mode: the gate branch is the constant (the package's one convention for every product of two
input-dependent branches). A bias-free bilinear layer is homogeneous of degree 2, so plain input x gradient
gives ``x . d out / dx = 2 out`` (the product rule counts each branch once). One branch must be held
constant, and the package always holds the **gate** branch ``g(x) = W x + b_w``, the branch that a gated MLP
passes through its activation:

=====================================  ====================  =========================  ==================
layer                                  constant (gate)       linear branch (kept)       output
=====================================  ====================  =========================  ==================
:class:`BilinearMLP`                   ``W x + b_w``         ``V x + b_v``              ``P``
transformers gated MLP (``bcosify``)   ``act(gate_proj x)``  ``up_proj x``              ``down_proj``
TransformerLens ``GatedMLP``           ``act(x W_gate)``     ``x W_in``                 ``W_out``
=====================================  ====================  =========================  ==================

(``bilinear_weights`` maps ``W = gate``, ``V = up / W_in``, so the three are the same layer.) Inside
:func:`~bcos_plugins.nn.explanation_mode` the layer is then the linear map
``x -> P (diag(W x + b_w) (V x + b_v))`` and ``x . d out / dx = out - P ((W x + b_w) * b_v)``: exactly
``out`` without biases; with biases the missing term is the bias share, which is the contribution of the
constant coordinate of the augmented input ``[x, 1]``. Per hidden unit ``k`` the contribution of input
feature ``i`` is ``x_i V_ki (W x + b_w)_k``: the same on all three paths for the same weights.
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn

from .._checks import require_int
from ..errors import argument_error
from ..nn.dynamic import DynamicWeightModule
from .weights import BilinearWeights

__all__ = ["BilinearMLP"]


class BilinearMLP(DynamicWeightModule):
    """``P ((W x + b_w) * (V x + b_v)) + b_P``.

    Args:
        d_in: input width.
        d_hidden: number of hidden units (rows of ``W`` and ``V``).
        d_out: output width (default ``d_in``, as in a transformer MLP).
        bias: give ``W``, ``V`` and ``P`` biases (analyse them with ``weights().augmented()``).
    """

    def __init__(self, d_in: int, d_hidden: int, d_out: int | None = None, bias: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__()
        d_in = require_int("d_in", d_in, minimum=1)
        d_hidden = require_int("d_hidden", d_hidden, minimum=1)
        d_out = d_in if d_out is None else require_int("d_out", d_out, minimum=1)
        self.W = nn.Linear(d_in, d_hidden, bias=bias, device=device, dtype=dtype)
        self.V = nn.Linear(d_in, d_hidden, bias=bias, device=device, dtype=dtype)
        self.P = nn.Linear(d_hidden, d_out, bias=bias, device=device, dtype=dtype)

    @property
    def d_in(self) -> int:
        return self.W.in_features

    @property
    def d_hidden(self) -> int:
        return self.W.out_features

    @property
    def d_out(self) -> int:
        return self.P.out_features

    def hidden(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_hidden"]:
        """``g(x) = (W x + b_w) * (V x + b_v)``, the gate branch ``W x + b_w`` detached in explanation mode."""
        return self.dynamic_weight(self.W(x)) * self.V(x)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        if not isinstance(x, Tensor) or x.ndim == 0 or x.shape[-1] != self.d_in:
            raise argument_error("x", f"BilinearMLP expects inputs with last dimension d_in={self.d_in}, got "
                                 f"{tuple(getattr(x, 'shape', ()))}", "Pass (..., d_in) inputs")
        return self.P(self.hidden(x))

    def weights(self) -> BilinearWeights:
        """The layer's ``(W, V, P)`` and biases as detached tensors (views of the parameters)."""
        return BilinearWeights.from_linears(self.W, self.V, self.P)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_hidden={self.d_hidden}, d_out={self.d_out}"
