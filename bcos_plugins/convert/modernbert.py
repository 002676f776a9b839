"""B-cos mixin for ModernBERT's attention: its query and key enter the rotary embedding as constants while
explaining.

``bcosify`` mixes it into the class of each existing ``ModernBertAttention`` instance (attribute names,
parameters and state-dict keys stay transformers'), as it does for gated MLPs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor
from transformers.models.modernbert import modeling_modernbert as stock

from ..nn.dynamic import DynamicWeightModule

__all__ = ["BcosModernBertAttention"]

# the stock forward this mixin restates while explaining (identical from the declared floor, transformers 5.9, to
# 5.24): a transformers whose forward takes other arguments gets the stock forward on every path instead
_STOCK_PARAMETERS = ("self", "hidden_states", "position_embeddings", "attention_mask", "kwargs")


def _stock_forward_is_the_restated_one() -> bool:
    return tuple(inspect.signature(stock.ModernBertAttention.forward).parameters) == _STOCK_PARAMETERS


_RESTATED = _stock_forward_is_the_restated_one()


class BcosModernBertAttention(DynamicWeightModule):
    """ModernBERT's self-attention whose query and key enter the rotary embedding detached while explaining.

    In explanation mode the attention pattern is a constant: the fused projection ``Wqkv`` holds its query and
    key units at gradient 0 (its ``constant_outputs``). They are still views of one output that requires a
    gradient, so autograd would record the rotary embedding of both (about 20 operations per layer) and run its
    backward, whose result the projection then sets to 0: 4-8 % of ``explain``'s time at the bench_core family
    shape (docs/benchmarks.md, 2026-11-28 00:43 UTC). Detaching the two views (no copy) records none of it; the
    values and the gradient reaching the value units are the same bits. Outside explanation mode, and under a
    transformers whose stock forward takes other arguments, the stock forward runs.
    """

    def forward(self, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor] | None = None,
                attention_mask: Tensor | None = None, **kwargs) -> tuple[Tensor, Tensor | None]:
        if not (_RESTATED and self.explaining and torch.is_grad_enabled()):
            return super().forward(hidden_states, position_embeddings, attention_mask, **kwargs)
        # the stock forward (transformers 5.9-5.24), with .detach() on the query and key views
        input_shape = hidden_states.shape[:-1]
        qkv = self.Wqkv(hidden_states).view(*input_shape, 3, -1, self.head_dim)
        query_states, key_states, value_states = qkv.unbind(dim=-3)
        query_states = query_states.detach().transpose(1, 2)
        key_states = key_states.detach().transpose(1, 2)
        value_states = value_states.transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = stock.apply_rotary_pos_emb(query_states, key_states, cos, sin, unsqueeze_dim=1)
        attention_interface: Callable = stock.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, stock.eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=self.attention_dropout if self.training else 0.0, scaling=self.head_dim**-0.5,
            sliding_window=self.sliding_window, deterministic=self.deterministic_flash_attn, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.out_drop(self.Wo(attn_output)), attn_weights
