"""The weights ``(W, V, P)`` of a bilinear layer and their exact bias-free form.

A bilinear layer computes ``out = P g(x) + c`` with ``g(x) = (W x + b_w) * (V x + b_v) + b_h`` and
``W, V`` of shape ``(d_hidden, d_in)``, ``P`` of shape ``(d_out, d_hidden)``. Every analysis in
:mod:`bcos_plugins.bilinear` works on the bias-free part ``P ((W x) * (V x))``; a layer with biases is
turned into an exactly equal bias-free layer on the augmented input ``x' = [x, 1]`` by
:meth:`BilinearWeights.augmented` (paper §2, "Incorporating biases"):

    W' = [W, b_w]   V' = [V, b_v]          (d_hidden, d_in + 1)
    one extra hidden unit with w' = v' = e_{d_in} computes 1 * 1 = 1, and P' gets the column P b_h + c

so that ``P' ((W' x') * (V' x')) == P g(x) + c`` for every ``x``.

:func:`~bcos_plugins.bilinear.sources.bilinear_weights` reads them from the places they live.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .._checks import require_available_device, require_same_shape, require_tensor
from ..errors import argument_error

__all__ = ["BilinearWeights", "augment_input", "require_bias_free"]


@dataclass(frozen=True)
class BilinearWeights:
    """``out = P ((W x + w_bias) * (V x + v_bias) + hidden_bias) + out_bias``; biases may be ``None``."""

    W: Float[Tensor, "d_hidden d_in"]
    V: Float[Tensor, "d_hidden d_in"]
    P: Float[Tensor, "d_out d_hidden"]
    w_bias: Float[Tensor, " d_hidden"] | None = None
    v_bias: Float[Tensor, " d_hidden"] | None = None
    hidden_bias: Float[Tensor, " d_hidden"] | None = None
    out_bias: Float[Tensor, " d_out"] | None = None

    def __post_init__(self) -> None:
        for name in ("W", "V", "P"):
            value = getattr(self, name)
            if not isinstance(value, Tensor) or value.ndim != 2:
                raise argument_error(
                    name, "a bilinear weight must be a 2-d tensor, got "
                    f"{tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__}",
                    "Pass W and V shaped (d_hidden, d_in) and P shaped (d_out, d_hidden), in that order in a "
                    "(W, V, P) tuple")
        require_same_shape("V", self.V, "W", self.W,
                           "Pass the two branches' projections of one layer (gate and up), each (d_hidden, d_in)")
        if self.P.shape[1] != self.W.shape[0]:
            raise argument_error(
                "P", f"P {tuple(self.P.shape)} must be (d_out, d_hidden) with d_hidden={self.W.shape[0]} (rows of W)",
                "If you passed TransformerLens-layout matrices (d_in, d_hidden), transpose them")
        if 0 in (*self.W.shape, self.P.shape[0]):
            # hosvd failed on an IndexError (d_out = 0) and the other analyses described a layer that computes nothing
            raise argument_error(
                "source", f"the bilinear weights have an empty dimension (d_hidden={self.W.shape[0]}, "
                f"d_in={self.W.shape[1]}, d_out={self.P.shape[0]})", "Pass the weights of a layer with at least one "
                "input, hidden unit and output")
        tensors = {n: getattr(self, n) for n in ("W", "V", "P", "w_bias", "v_bias", "hidden_bias", "out_bias")
                   if getattr(self, n) is not None}
        kinds = {(t.dtype, t.device) for t in tensors.values()}
        if len(kinds) > 1:  # torch refused it deep inside a matrix product ("expected m1 and m2 to have the same dtype")
            found = ", ".join(f"{n}: {t.dtype} on {t.device}" for n, t in tensors.items())
            raise argument_error("source", f"the bilinear weights mix dtypes or devices ({found})",
                                 "Cast them to one dtype and device first, e.g. (W.float(), V.float(), P.float())")
        sizes = {"w_bias": self.d_hidden, "v_bias": self.d_hidden, "hidden_bias": self.d_hidden,
                 "out_bias": self.d_out}
        for name, size in sizes.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (size,):
                raise argument_error(name, f"must have shape ({size},), got {tuple(value.shape)}",
                                     f"Pass one bias per {'output' if name == 'out_bias' else 'hidden unit'}, "
                                     "or None")

    @classmethod
    def from_linears(cls, w: nn.Linear, v: nn.Linear, p: nn.Linear) -> BilinearWeights:
        """``W``, ``V``, ``P`` and their biases from three linear layers, detached (views of the parameters):
        a :class:`~bcos_plugins.bilinear.BilinearMLP`'s or a gated MLP's gate, up and down projections."""

        def bias(linear: nn.Linear) -> Tensor | None:
            return None if linear.bias is None else linear.bias.detach()

        return cls(W=w.weight.detach(), V=v.weight.detach(), P=p.weight.detach(),
                   w_bias=bias(w), v_bias=bias(v), out_bias=bias(p))

    @property
    def d_in(self) -> int:
        return self.W.shape[1]

    @property
    def d_hidden(self) -> int:
        return self.W.shape[0]

    @property
    def d_out(self) -> int:
        return self.P.shape[0]

    @property
    def has_bias(self) -> bool:
        return any(b is not None and bool(b.any()) for b in
                   (self.w_bias, self.v_bias, self.hidden_bias, self.out_bias))

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """The layer's output, evaluated from the weights."""
        x = require_tensor("x", x, kind="real", finite=False, shape_hint=f"(..., d_in) = (..., {self.d_in})",
                           list_dtype=self.W.dtype)
        if x.ndim == 0 or x.shape[-1] != self.d_in:  # torch said only "mat1 and mat2 shapes cannot be multiplied"
            raise argument_error("x", f"has shape {tuple(x.shape)}, the layer reads vectors of width d_in={self.d_in}",
                                 "Pass (..., d_in) inputs (augment_input(x) for an augmented layer)")
        left = x @ self.W.T
        right = x @ self.V.T
        if self.w_bias is not None:
            left = left + self.w_bias
        if self.v_bias is not None:
            right = right + self.v_bias
        hidden = left * right
        if self.hidden_bias is not None:
            hidden = hidden + self.hidden_bias
        out = hidden @ self.P.T
        return out if self.out_bias is None else out + self.out_bias

    def without_biases(self) -> BilinearWeights:
        """The quadratic part ``P ((W x) * (V x))`` alone."""
        return BilinearWeights(self.W, self.V, self.P)

    def augmented(self) -> BilinearWeights:
        """A bias-free layer on ``[x, 1]`` equal to this layer with its biases (see the module docstring)."""
        W, V, P = self.W, self.V, self.P
        zeros = W.new_zeros(self.d_hidden)
        w_col = zeros if self.w_bias is None else self.w_bias
        v_col = zeros if self.v_bias is None else self.v_bias
        one_unit = W.new_zeros(1, self.d_in + 1)
        one_unit[0, -1] = 1.0
        W_aug = torch.cat([torch.cat([W, w_col[:, None]], dim=1), one_unit])
        V_aug = torch.cat([torch.cat([V, v_col[:, None]], dim=1), one_unit])
        constant = P.new_zeros(self.d_out)
        if self.hidden_bias is not None:
            constant = constant + P @ self.hidden_bias
        if self.out_bias is not None:
            constant = constant + self.out_bias
        P_aug = torch.cat([P, constant[:, None]], dim=1)
        return BilinearWeights(W_aug, V_aug, P_aug)

    def to(self, *args, **kwargs) -> BilinearWeights:
        """Move/cast every tensor (``Tensor.to`` arguments). A device this machine lacks is refused naming ``device``
        and the available ones (the package's one device check, as ``TokenExplanation.to``): torch's refusal, "Torch
        not compiled with CUDA enabled" (an AssertionError), named neither."""
        # Tensor.to's forms: to(device, dtype, ...), to(dtype, ...), to(other_tensor, ...), or device= / dtype= alone
        first = args[0] if args else None
        device = kwargs.get("device", first if isinstance(first, str | torch.device | int)
                            and not isinstance(first, bool) else None)
        if device is not None:
            require_available_device("device", device)
        moved = {name: (None if getattr(self, name) is None else getattr(self, name).to(*args, **kwargs))
                 for name in ("W", "V", "P", "w_bias", "v_bias", "hidden_bias", "out_bias")}
        return replace(self, **moved)


def augment_input(x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in_plus_1"]:
    """``[x, 1]``: the input of :meth:`BilinearWeights.augmented` layers."""
    # a list failed on .new_ones; its output feeds a layer, none known here
    x = require_tensor("x", x, kind="real", finite=False, shape_hint="(..., d_in)", list_dtype=torch.get_default_dtype())
    if x.ndim == 0:
        raise argument_error("x", "is a scalar", "Pass (..., d_in) inputs")
    return torch.cat([x, x.new_ones(*x.shape[:-1], 1)], dim=-1)


def require_bias_free(weights: BilinearWeights, what: str) -> None:
    """Analyses of the quadratic form need a bias-free layer; say how to get one."""
    if weights.has_bias:
        raise argument_error(
            "source", f"{what} needs a bias-free bilinear layer, but this one has biases", "Pass "
            "bilinear_weights(layer).augmented() (exact: inputs become [x, 1], see "
            "bcos_plugins.bilinear.augment_input) or bilinear_weights(layer).without_biases() (the quadratic part "
            "only)")
