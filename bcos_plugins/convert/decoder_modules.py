"""B-cos mixins for gated MLP blocks (Llama-shaped decoders, ModernBERT)."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from ..nn.dynamic import DynamicWeightModule


class BcosGatedMLP(DynamicWeightModule):
    """Gated MLP ``down(act(gate(x)) * up(x))`` whose activated gate branch is the dynamic weight.

    Mixed into the class of an existing ``LlamaMLP`` instance (see ``bcosify``), so attribute names and
    state-dict keys are those of transformers. In explanation mode ``act(gate(x))`` is a constant:
    ``x · d/dx [a(x) * u(x)]`` would otherwise count the product twice (product rule) and the
    explanation would sum to twice the MLP output's share. With ``act = identity`` this is a bilinear MLP;
    the convention (gate constant, on every path) is stated in :mod:`bcos_plugins.bilinear.module`.

    Since the whole activated branch is the constant, ``act`` needs no ``x * gate(x)`` form of its own: any
    parameter-free elementwise activation is exact here, tanh and sigmoid included (``bcosify`` keeps those as they are,
    see ``bcos_plugins.convert.bcosify.GATE_BRANCH_ACTIVATIONS``).
    """

    # the child whose output is the dynamic weight (bcosify's plan reads it to accept any activation there)
    activated_branch = "act_fn"

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        # not explaining: the stock forward, without the scope and detach calls (docs/benchmarks.md,
        # 2026-11-28 16:16 UTC: a small model's forward pays their Python per module and call)
        if not self.explaining:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        with self.dynamic_scope():  # explaining, the whole gate branch is a constant: no autograd graph for it
            gate = self.act_fn(self.gate_proj(x))
        return self.down_proj(self.dynamic_weight(gate) * self.up_proj(x))


class BcosFusedGatedMLP(DynamicWeightModule):
    """ModernBERT's GeGLU ``Wo(act(a) * g)`` with ``a | g = Wi(x)`` (one fused projection), whose activated
    branch ``act(a)`` is the dynamic weight, for the same reason as :class:`BcosGatedMLP`.

    Mixed into the class of an existing ``ModernBertMLP`` instance: attribute names and state-dict keys stay
    transformers'.
    """

    activated_branch = "act"

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        activated, gate = self.Wi(x).chunk(2, dim=-1)
        # not explaining: the stock forward, without the scope and detach calls (docs/benchmarks.md,
        # 2026-11-28 16:16 UTC: a small model's forward pays their Python per module and call)
        if not self.explaining:
            return self.Wo(self.drop(self.act(activated) * gate))
        with self.dynamic_scope():  # explaining, the activated branch is a constant: no autograd graph for it
            activated = self.act(activated)
        return self.Wo(self.drop(self.dynamic_weight(activated) * gate))
