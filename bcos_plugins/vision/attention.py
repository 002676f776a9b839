"""B-cos multi-head attention block with learnable attention priors (paper Eq. 12-14, 18, 19).

For tokens ``P`` (batch, N, D), heads ``h = 1..H`` of size ``d = D / H``::

    P~   = LayerNorm(P)                                   only inside the attention matrix (Eq. 13)
    R_h  = (P~ Q_h^T)(P~ K_h^T)^T / sqrt(d)               plain linear queries and keys
    A_h  = SM(R_h)                  prior "none"
         = SM(R_h + B_h)            prior "additive"       (Eq. 18)
         = SM(R_h) * SM(B_h)        prior "multiplicative" (Eq. 19; element-wise, rows not renormalised)
    out  = P + U([A_h W_h^V(P) P]_h)                      B-cos value / output projections with MaxOut (Eq. 12, 14)

``SM`` is the softmax over keys; ``B_h`` (N x N) is a learnable prior per head and per layer (zeros at
initialisation: a uniform prior). The value path sees the raw tokens, not ``P~``: that keeps the block
dynamic linear (requirement (c) of the paper: the output scales with the input).

``A`` is the dynamic weight of ``A @ V``: :class:`BcosViTAttention` is a
:class:`~bcos_plugins.nn.DynamicWeightModule` and passes ``A`` through ``self.dynamic_weight``, so in
explanation mode the whole attention matrix (queries, keys, LayerNorm and prior) is a constant and
``W^Att(P) P`` is explained exactly. The prior depends on positions only, never on the input, so it keeps
completeness (unlike an additive position embedding, which adds a constant to the tokens).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .._checks import require_int
from ..errors import argument_error
from ..nn.dynamic import DynamicWeightModule
from ..nn.linear import BcosLinear

__all__ = ["PRIOR_KINDS", "BcosViTAttention"]

PRIOR_KINDS = ("none", "additive", "multiplicative")
PriorKind = Literal["none", "additive", "multiplicative"]


class BcosViTAttention(DynamicWeightModule):
    """One B-cos attention block (with its residual connection); see the module docstring for the maths.

    Hook points (``nn.Identity`` modules, so ``register_forward_hook`` works on them): ``hook_pattern``
    sees the attention matrices ``(batch, heads, N, N)``, ``hook_values`` the per-head values.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_tokens: int, b: float, max_out: int,
                 prior: PriorKind = "additive", layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        hidden_size = require_int("hidden_size", hidden_size, minimum=1)
        num_heads = require_int("num_heads", num_heads, minimum=1)
        num_tokens = require_int("num_tokens", num_tokens, minimum=1)
        if hidden_size % num_heads != 0:
            raise argument_error("num_heads", f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}",
                                 "Pick a divisor of hidden_size")
        if prior not in PRIOR_KINDS:
            raise argument_error("prior", f"attention prior {prior!r} is not one of {PRIOR_KINDS}", "Pick one of those")
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.prior_kind = prior
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.query = nn.Linear(hidden_size, hidden_size, bias=False)
        self.key = nn.Linear(hidden_size, hidden_size, bias=False)
        self.value = BcosLinear(hidden_size, hidden_size, b=b, max_out=max_out)
        self.output = BcosLinear(hidden_size, hidden_size, b=b, max_out=max_out)
        if prior == "none":
            self.register_parameter("prior", None)
        else:
            self.prior = nn.Parameter(torch.zeros(num_heads, num_tokens, num_tokens))
        self.hook_pattern = nn.Identity()
        self.hook_values = nn.Identity()

    def _heads(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch head pos d_head"]:
        return x.unflatten(-1, (self.num_heads, self.head_size)).transpose(1, 2)

    def attention_matrix(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch head pos pos"]:
        """``A_h(P)`` of Eq. 13 with the prior of Eq. 18 / 19 (not detached: see ``forward``)."""
        normed = self.norm(x)
        scores = self._heads(self.query(normed)) @ self._heads(self.key(normed)).transpose(-1, -2)
        scores = scores / math.sqrt(self.head_size)
        if self.prior_kind == "additive":
            return torch.softmax(scores + self.prior, dim=-1)
        if self.prior_kind == "multiplicative":
            return torch.softmax(scores, dim=-1) * torch.softmax(self.prior, dim=-1)
        return torch.softmax(scores, dim=-1)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Float[Tensor, "batch pos d_model"],
                                                                     Float[Tensor, "batch head pos pos"]]:
        # shape errors named here: torch's came from the prior's broadcast or a matrix product three steps in
        width = self.num_heads * self.head_size
        if x.ndim != 3 or x.shape[-1] != width:
            raise argument_error("x", f"must be tokens of shape (batch, tokens, {width}), got {tuple(x.shape)}",
                                 "Pass the tokeniser's output (add the batch dimension to one image's tokens: x[None])")
        if self.prior is not None and x.shape[1] != self.prior.shape[-1]:
            raise argument_error("x", f"has {x.shape[1]} tokens, but the attention prior was built for "
                                 f"{self.prior.shape[-1]}", "Pass images of the size the model was configured with "
                                 "(num_tokens = (image_size / patch_size) ** 2)")
        pattern = self.hook_pattern(self.attention_matrix(x))
        values = self.hook_values(self._heads(self.value(x)))
        mixed = (self.dynamic_weight(pattern) @ values).transpose(1, 2).flatten(2)
        return x + self.output(mixed), pattern

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_size={self.head_size}, prior={self.prior_kind!r}"
