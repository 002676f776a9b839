"""B-cos attention for TransformerLens: ``HookedBcosAttention`` and ``HookedBcosGroupedQueryAttention``.

With ``ŵ`` the unit-norm weights of each unit (a query/key/value unit ``(head, j)`` reads ``d_model``
inputs; an output unit ``m`` reads all ``head * d_head`` values of ``z``), each B-cos projection is::

    lin   = x @ ŵ
    scale = |lin / ||x|| | ** (B - 1)          -> hook_bcos_scale_{q,k,v,o}
    out   = scale * lin

    q, k, v = B-cos(ln1(resid))                 (biases removed)
    pattern = softmax(q k^T / attn_scale + mask)   -> hook_pattern (the dynamic weight of pattern @ v)
    z       = pattern @ v
    attn_out = B-cos(z flattened over heads)    (per head with use_attn_result: scale * z_h @ ŵ_O[h])

Every dynamic weight leaves a :class:`~.hook_point.DynamicHookPoint`, so inside
:func:`bcos_plugins.nn.explanation_mode` the block is linear in its input. Parameter and hook names are
TransformerLens' own (``W_Q``, ``hook_z``, ``hook_pattern``...); a projection not listed in
``cfg.bcos_projections`` is a plain bias-free linear map.
"""

from __future__ import annotations

from abc import ABC

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.components import Attention, GroupedQueryAttention
from transformer_lens.utilities.attention import complex_attn_linear, simple_attn_linear

from bcos_plugins.nn.functional import bcos_scale, input_norm

from .hook_point import DynamicHookPoint, hooked_bcos_product
from .unit_weights import unit_weight

__all__ = ["HookedBcosAttention", "HookedBcosGroupedQueryAttention", "HookedBcosAttentionMixin"]


class HookedBcosAttentionMixin(ABC, nn.Module):
    """B-cos projections for a TransformerLens attention class; use through the two concrete classes.

    Its bases repeat ``AbstractAttention``'s (``ABC, nn.Module``) so that an existing attention module's
    class can be swapped in place (CPython refuses ``__class__`` assignment across other layouts).
    """

    _SCALE_HOOKS = {"W_Q": "q", "W_K": "k", "W_V": "v", "W_O": "o"}

    def convert_to_bcos(self) -> None:
        """Add the B-cos scale hook points (for the B-cos projections, when B != 1)."""
        for projection, short in self._SCALE_HOOKS.items():
            if self.cfg.is_bcos(projection) and self.cfg.bcos_b != 1.0:
                setattr(self, f"hook_bcos_scale_{short}", DynamicHookPoint())

    def _project(
        self,
        x: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head_index d_model"],
        weight_name: str,
        zero_bias: Float[Tensor, "head_index d_head"],
        projection: str,
    ) -> Float[Tensor, "batch pos head_index d_head"]:
        split = x.ndim == 4
        attn_fn = complex_attn_linear if split else simple_attn_linear
        if not self.cfg.is_bcos(projection):
            return attn_fn(x, getattr(self, weight_name), zero_bias)
        lin = attn_fn(x, unit_weight(self, weight_name, dim=1), zero_bias)
        if self.cfg.bcos_b == 1.0:
            return lin
        x_norm = input_norm(x) if split else input_norm(x).unsqueeze(-1)
        hook = getattr(self, f"hook_bcos_scale_{self._SCALE_HOOKS[projection]}")
        return hooked_bcos_product(lin, x_norm, self.cfg.bcos_b, hook)

    def calculate_qkv_matrices(self, query_input, key_input, value_input):
        grouped = hasattr(self, "_W_K") and not self.cfg.ungroup_grouped_query_attention
        w_k, b_k = ("_W_K", self._b_K) if grouped else ("W_K", self.b_K)
        w_v, b_v = ("_W_V", self._b_V) if grouped else ("W_V", self.b_V)
        q = self.hook_q(self._project(query_input, "W_Q", self.b_Q, "W_Q"))
        k = self.hook_k(self._project(key_input, w_k, b_k, "W_K"))
        v = self.hook_v(self._project(value_input, w_v, b_v, "W_V"))
        if self.cfg.use_qk_norm:
            # per-head RMSNorm of queries and keys (Qwen3), where the parent applies it; it only shapes the
            # pattern, which hook_pattern holds constant in explanation mode
            q = self._apply_qk_norm(q, self.q_norm)
            k = self._apply_qk_norm(k, self.k_norm)
        return q, k, v

    def forward(
        self,
        query_input: Float[Tensor, "batch pos d_model"],
        key_input: Float[Tensor, "batch kv_pos d_model"],
        value_input: Float[Tensor, "batch kv_pos d_model"],
        past_kv_cache_entry=None,
        additive_attention_mask: Float[Tensor, "batch 1 1 kv_pos"] | None = None,
        attention_mask: Int[Tensor, "batch offset_pos"] | None = None,
        position_bias: Float[Tensor, "1 head_index pos kv_pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        # TransformerLens' forward fuses W_O into one matmul with raw weights; the B-cos output needs
        # the unit-norm weights and the scale, so the (short) score -> pattern -> z path is restated
        # here from the parent's own helpers (rotary, masks, GQA expansion, KV cache).
        q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
        if past_kv_cache_entry is not None:
            offset = past_kv_cache_entry.past_keys.size(1)
            k, v = past_kv_cache_entry.append(k, v)
        else:
            offset = 0
        if self.cfg.positional_embedding_type == "rotary":
            q = self.hook_rot_q(self.apply_rotary(q, offset, attention_mask))
            k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))
        scores = self.calculate_attention_scores(q, k)
        if (getattr(self, "_attention_dir_override", None) or self.cfg.attention_dir) == "causal":
            scores = self.apply_causal_mask(scores, offset, attention_mask)
        if additive_attention_mask is not None:
            scores = scores + additive_attention_mask
        scores = self.hook_attn_scores(scores)
        pattern = F.softmax(scores, dim=-1)
        pattern = torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern)
        pattern = self.hook_pattern(pattern).to(device=v.device, dtype=v.dtype)
        z = self.calculate_z_scores(v, pattern)  # [batch, pos, head_index, d_head]
        return self._output(z)

    def _output(self, z: Float[Tensor, "batch pos head_index d_head"]) -> Float[Tensor, "batch pos d_model"]:
        bcos = self.cfg.is_bcos("W_O")
        w_o = unit_weight(self, "W_O", dim=(0, 1)) if bcos else self.W_O
        z_flat = z.reshape(z.shape[0], z.shape[1], -1)
        if self.cfg.use_attn_result:
            per_head = einops.einsum(z, w_o, "b p h d, h d m -> b p h m")
            lin = per_head.sum(dim=2)
        else:
            lin = F.linear(z_flat, einops.rearrange(w_o, "h d m -> m (h d)"))
        if not (bcos and self.cfg.bcos_b != 1.0):
            if not self.cfg.use_attn_result:
                return lin
            scale = None
        elif not self.cfg.use_attn_result:
            return hooked_bcos_product(lin, input_norm(z_flat), self.cfg.bcos_b, self.hook_bcos_scale_o)
        else:  # the per-head results need the scale tensor itself
            scale = self.hook_bcos_scale_o(bcos_scale(lin, input_norm(z_flat), self.cfg.bcos_b))
        result = self.hook_result(per_head if scale is None else per_head * scale.unsqueeze(2))
        return result.sum(dim=2)


class HookedBcosAttention(HookedBcosAttentionMixin, Attention):
    """B-cos version of TransformerLens' ``Attention`` (same parameters, biases removed)."""


class HookedBcosGroupedQueryAttention(HookedBcosAttentionMixin, GroupedQueryAttention):
    """B-cos version of ``GroupedQueryAttention`` (``_W_K``/``_W_V`` hold the key/value heads)."""
