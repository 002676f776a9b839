"""The weights ``(W, V, P)`` of a bilinear layer, read from any of the places they live.

A bilinear layer computes ``out = P g(x) + c`` with ``g(x) = (W x + b_w) * (V x + b_v) + b_h`` and
``W, V`` of shape ``(d_hidden, d_in)``, ``P`` of shape ``(d_out, d_hidden)``. Every analysis in
:mod:`bcos_plugins.bilinear` works on the bias-free part ``P ((W x) * (V x))``; a layer with biases is
turned into an exactly equal bias-free layer on the augmented input ``x' = [x, 1]`` by
:meth:`BilinearWeights.augmented` (paper §2, "Incorporating biases"):

    W' = [W, b_w]   V' = [V, b_v]          (d_hidden, d_in + 1)
    one extra hidden unit with w' = v' = e_{d_in} computes 1 * 1 = 1, and P' gets the column P b_h + c

so that ``P' ((W' x') * (V' x')) == P g(x) + c`` for every ``x``.

Where the weights come from (:func:`bilinear_weights`):

- :class:`~bcos_plugins.bilinear.module.BilinearMLP` (this package): ``W``, ``V``, ``P`` as named.
- a TransformerLens ``GatedMLP`` with the identity activation (``act_fn="linear"``, see
  ``bcos_plugins.adapters.transformer_lens``). TransformerLens computes
  ``post = act_fn(x @ W_gate) * (x @ W_in) + b_in``, ``out = post @ W_out + b_out`` with ``hook_pre`` on
  the gate branch ``x @ W_gate`` and ``hook_pre_linear`` on ``x @ W_in``. Mapping:
  ``W = W_gate.T`` (the ``hook_pre`` branch), ``V = W_in.T`` (the ``hook_pre_linear`` branch),
  ``P = W_out.T``, ``b_h = b_in`` (added after the product), ``c = b_out``.
- a transformers gated MLP (Llama/Mistral/Qwen layout: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``)
  whose activation is the identity, e.g. after :class:`~bcos_plugins.bilinear.swish_beta.SwishBetaToBilinear`:
  ``W = gate_proj.weight``, ``V = up_proj.weight``, ``P = down_proj.weight``.
- B-cos gated MLPs (TransformerLens ``HookedBcosGatedMLP``, a B-cosified transformers Llama MLP) are refused:
  their outputs carry an input-dependent scale, so they are not bilinear in their weights.
- plain tensors: a tuple ``(W, V, P)`` in the ``(d_hidden, d_in)``, ``(d_hidden, d_in)``,
  ``(d_out, d_hidden)`` layout above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..errors import BcosTypeError

__all__ = ["BilinearWeights", "augment_input", "bilinear_weights", "require_bias_free"]


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
                raise ValueError(
                    f"bilinear weight {name} must be a 2-d tensor, got "
                    f"{tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__}; "
                    "layout: W and V (d_hidden, d_in), P (d_out, d_hidden)."
                )
        if self.W.shape != self.V.shape:
            raise ValueError(
                f"W {tuple(self.W.shape)} and V {tuple(self.V.shape)} must have the same shape (d_hidden, d_in)."
            )
        if self.P.shape[1] != self.W.shape[0]:
            raise ValueError(
                f"P {tuple(self.P.shape)} must be (d_out, d_hidden) with d_hidden={self.W.shape[0]} (rows of W); "
                "if you passed TransformerLens-layout matrices (d_in, d_hidden), transpose them."
            )
        sizes = {"w_bias": self.d_hidden, "v_bias": self.d_hidden, "hidden_bias": self.d_hidden,
                 "out_bias": self.d_out}
        for name, size in sizes.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (size,):
                raise ValueError(f"{name} must have shape ({size},), got {tuple(value.shape)}.")

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
        """Move/cast every tensor (``Tensor.to`` arguments)."""
        moved = {name: (None if getattr(self, name) is None else getattr(self, name).to(*args, **kwargs))
                 for name in ("W", "V", "P", "w_bias", "v_bias", "hidden_bias", "out_bias")}
        return replace(self, **moved)


def augment_input(x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in_plus_1"]:
    """``[x, 1]``: the input of :meth:`BilinearWeights.augmented` layers."""
    return torch.cat([x, x.new_ones(*x.shape[:-1], 1)], dim=-1)


def _is_identity(act_fn) -> bool:
    probe = torch.linspace(-3.0, 3.0, 13)
    try:
        return torch.equal(act_fn(probe), probe)
    except Exception:  # an activation that cannot even run on a probe is not the identity
        return False


_NOT_BILINEAR_BCOS = (
    "its {which} are B-cos projections: a B-cos projection uses unit-norm weight rows and multiplies each "
    "output by |cos(x, w)| ** (B - 1), a factor that depends on the input, so the layer is not the bilinear form P((W x) * (V x)) of any fixed "
    "weights and an analysis of its weights would describe a different function. Analyse a bilinear model "
    "(bcos_plugins.adapters.transformer_lens.bilinear_config, or a Llama with hidden_act='linear' that is not "
    "B-cosified); a B-cos model is explained exactly by bcos_plugins.explain instead"
)


def _refuse_bcos_tl(mlp: nn.Module) -> None:
    cfg = getattr(mlp, "cfg", None)
    projections = getattr(cfg, "bcos_projections", None) or ()
    used = [p for p in ("W_gate", "W_in", "W_out") if p in projections]
    if used:
        raise BcosTypeError("source: this TransformerLens gated MLP is not bilinear: "
                            + _NOT_BILINEAR_BCOS.format(which=", ".join(used)) + ".")


def _refuse_bcos_hf(mlp: nn.Module) -> None:
    from ..nn.dynamic import DynamicWeightModule  # local: keeps this module importable on its own

    used = [n for n in ("gate_proj", "up_proj", "down_proj") if isinstance(getattr(mlp, n), DynamicWeightModule)]
    if used:
        raise BcosTypeError(f"source: this gated MLP ({type(mlp).__name__}) is not bilinear: "
                            + _NOT_BILINEAR_BCOS.format(which=", ".join(used)) + ".")


def _from_transformer_lens(mlp: nn.Module) -> BilinearWeights:
    _refuse_bcos_tl(mlp)
    act_name = getattr(getattr(mlp, "cfg", None), "act_fn", None)
    if not _is_identity(mlp.act_fn):
        raise ValueError(
            f"this TransformerLens GatedMLP has act_fn={act_name!r}, so it is not bilinear. Build the model with "
            "bcos_plugins.adapters.transformer_lens.bilinear_config(...) (act_fn='linear'), or fine-tune the gate "
            "away first (bcos_plugins.bilinear.SwishBetaToBilinear)."
        )
    with torch.no_grad():
        return BilinearWeights(
            W=mlp.W_gate.detach().T, V=mlp.W_in.detach().T, P=mlp.W_out.detach().T,
            hidden_bias=mlp.b_in.detach(), out_bias=mlp.b_out.detach(),
        )


def _from_hf_gated(mlp: nn.Module) -> BilinearWeights:
    _refuse_bcos_hf(mlp)
    if not _is_identity(mlp.act_fn):
        raise ValueError(
            f"this gated MLP ({type(mlp).__name__}) has activation {mlp.act_fn!r}, so it is not bilinear; convert "
            "it with bcos_plugins.bilinear.SwishBetaToBilinear (a transformers TrainerCallback) first."
        )

    def bias(linear: nn.Linear) -> Tensor | None:
        return None if linear.bias is None else linear.bias.detach()

    return BilinearWeights(
        W=mlp.gate_proj.weight.detach(), V=mlp.up_proj.weight.detach(), P=mlp.down_proj.weight.detach(),
        w_bias=bias(mlp.gate_proj), v_bias=bias(mlp.up_proj), out_bias=bias(mlp.down_proj),
    )


def bilinear_weights(source) -> BilinearWeights:
    """Read ``(W, V, P)`` (and biases) from ``source``; see the module docstring for what is accepted.

    Tensors are detached views of the parameters (no copy): analyses never build autograd graphs.
    """
    from .module import BilinearMLP  # local: module.py imports this file

    if isinstance(source, BilinearWeights):
        return source
    if isinstance(source, BilinearMLP):
        return source.weights()
    if isinstance(source, nn.Module) and all(hasattr(source, n) for n in ("W_gate", "W_in", "W_out")):
        return _from_transformer_lens(source)
    if isinstance(source, nn.Module) and all(hasattr(source, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return _from_hf_gated(source)
    if isinstance(source, tuple | list) and len(source) == 3 and all(isinstance(t, Tensor) for t in source):
        W, V, P = (t.detach() for t in source)
        return BilinearWeights(W, V, P)
    raise TypeError(
        f"cannot read bilinear weights from {type(source).__name__}. Pass a BilinearMLP, a TransformerLens "
        "GatedMLP (model.blocks[i].mlp of a bilinear HookedTransformer), a transformers gated MLP with the identity "
        "activation, a BilinearWeights, or a tuple of tensors (W, V, P) shaped (d_hidden, d_in), (d_hidden, d_in), "
        "(d_out, d_hidden)."
    )


def require_bias_free(weights: BilinearWeights, what: str) -> None:
    """Analyses of the quadratic form need a bias-free layer; say how to get one."""
    if weights.has_bias:
        raise ValueError(
            f"{what} needs a bias-free bilinear layer, but this one has biases. Use weights.augmented() (exact: "
            "inputs become [x, 1], see bcos_plugins.bilinear.augment_input) or weights.without_biases() (the "
            "quadratic part only)."
        )
