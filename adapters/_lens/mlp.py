"""B-cos MLPs for TransformerLens: ``HookedBcosMLP`` and ``HookedBcosGatedMLP``.

Each B-cos projection (``ŵ``: unit-norm columns of ``W_in``, ``W_gate``, ``W_out``, i.e. per unit over
its inputs)::

    lin   = x @ ŵ
    scale = |lin / ||x|| | ** (B - 1)          -> hook_bcos_scale_{in,gate,out}
    out   = scale * lin

    HookedBcosMLP:       pre = B-cos_in(x)  -> hook_pre;  post = act(pre) -> hook_post;  out = B-cos_out(post)
    HookedBcosGatedMLP:  pre = B-cos_gate(x) -> hook_pre;  pre_linear = B-cos_in(x) -> hook_pre_linear
                   post = act(pre) * pre_linear -> hook_post;  out = B-cos_out(post)

No biases. In explanation mode the scales, the activation gate (``act = x * gate(x)``, a
``DetachableActivation``) and, in the gated MLP, the whole gate branch (``hook_pre`` is a
``DynamicHookPoint``) are constants, so ``x · d out / dx = out``.
"""

from __future__ import annotations

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.components.mlps.gated_mlp import GatedMLP
from transformer_lens.components.mlps.mlp import MLP

from bcos_plugins.nn.functional import input_norm

from .hook_point import DynamicHookPoint, hooked_bcos_product
from .unit_weights import unit_weight

__all__ = ["HookedBcosMLP", "HookedBcosGatedMLP", "HookedBcosMLPMixin"]


class HookedBcosMLPMixin(nn.Module):
    """B-cos projections with TransformerLens' ``(d_in, d_out)`` weight layout."""

    _SCALE_HOOKS = {"W_in": "in", "W_gate": "gate", "W_out": "out"}

    def convert_to_bcos(self) -> None:
        for projection, short in self._SCALE_HOOKS.items():
            if hasattr(self, projection) and self.cfg.is_bcos(projection) and self.cfg.bcos_b != 1.0:
                setattr(self, f"hook_bcos_scale_{short}", DynamicHookPoint())

    def _project(self, x: Float[Tensor, "batch pos d_in"], projection: str) -> Float[Tensor, "batch pos d_out"]:
        if not self.cfg.is_bcos(projection):
            return F.linear(x, getattr(self, projection).T)
        lin = F.linear(x, unit_weight(self, projection, dim=0).T)
        if self.cfg.bcos_b == 1.0:
            return lin
        hook = getattr(self, f"hook_bcos_scale_{self._SCALE_HOOKS[projection]}")
        return hooked_bcos_product(lin, input_norm(x), self.cfg.bcos_b, hook)


class HookedBcosMLP(HookedBcosMLPMixin, MLP):
    """B-cos version of TransformerLens' ``MLP``."""

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(self._project(x, "W_in"))
        post = self.hook_post(self.act_fn(pre))
        return self._project(post, "W_out")


class HookedBcosGatedMLP(HookedBcosMLPMixin, GatedMLP):
    """B-cos version of TransformerLens' ``GatedMLP`` (bilinear when ``act_fn="linear"``)."""

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(self._project(x, "W_gate"))
        pre_linear = self.hook_pre_linear(self._project(x, "W_in"))
        post = self.hook_post(self.act_fn(pre) * pre_linear)
        return self._project(post, "W_out")
