"""Query/key projections kept as the pretrained affine maps (``bcosify(..., bcos_query_key=False)``).

Queries and keys only enter the attention logits, and the attention pattern ``softmax(q k^T)`` is a dynamic
weight: in explanation mode it is a constant for autograd, and the explanation flows through the values only.
So the query/key projections need not be B-cos layers for explanations to be complete; what matters is that
their outputs are constants while explaining. Kept stock, with their pretrained weights and biases, they
leave the pretrained attention logits untouched (unit-norm B-cos rows shrink them, which flattens the
pretrained attention patterns; docs/recipes.md measures what that costs).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn
from torch.nn import functional as F

from ..nn.dynamic import DynamicWeightModule
from ..nn.functional import bcos_product, cached_unit_norm, input_norm
from ..nn.linear import AlignmentPressure

__all__ = ["ConstantQueryKeyProjection", "StockQueryKeyConv1D"]


class ConstantQueryKeyProjection(DynamicWeightModule):
    """Mixed into the class of a stock query or key ``nn.Linear`` (weights, bias and state-dict keys unchanged).

    The output is the stock affine map; in explanation mode it is a dynamic weight (detached, computed without
    recording the graph), like the ``constant_outputs`` of a B-cos query/key layer.
    """

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        with self.dynamic_scope():
            out = super().forward(x)
        return self.dynamic_weight(out)


class StockQueryKeyConv1D(AlignmentPressure):
    """GPT-2's fused ``c_attn`` (outputs ``q | k | v``) with stock query/key parts and B-cos values.

    The first ``query_key_features`` outputs are the pretrained affine map (raw weight columns plus bias),
    constant in explanation mode; the remaining outputs (the values) are B-cos units (unit-norm columns,
    no bias). Weight and bias keep transformers' ``Conv1D`` layout and shapes (``(d_in, 3 d)``, ``(3 d,)``) so
    that checkpoints load into the stock class; the value part of the bias is never used.

    Deliberately not a :class:`~bcos_plugins.nn.BcosConv1D`: code that splits a B-cos ``c_attn`` into
    B-cos q/k/v layers would silently drop the stock query/key maths.
    """

    def __init__(self, conv, b: float, query_key_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = conv.weight.shape
        self.query_key_features = int(query_key_features)
        self.max_out = 1
        self.weight = nn.Parameter(conv.weight.detach().clone())
        self.bias = nn.Parameter(conv.bias.detach().clone())
        self._init_b(b, conv.weight.device)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        n = self.query_key_features
        with self.dynamic_scope():
            qk = F.linear(x, self.weight[:, :n].T, self.bias[:n])
        qk = self.dynamic_weight(qk)
        v = F.linear(x, cached_unit_norm(self.weight, dim=1, transposed=True, first_unit=n, autocast=True))
        b = self._forward_pressure()
        if isinstance(b, Tensor) or b != 1.0:
            # the values are B-cos units: the same fused product as BcosLinear (compiles without a graph break)
            explaining = self.holds_constant()
            with self.dynamic_scope():
                x_norm = input_norm(x)
            v = bcos_product(v, x_norm, b, explaining)
        return torch.cat([qk, v], dim=-1)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, b={self.b}, "
                f"stock query/key outputs=:{self.query_key_features}")
