"""B-cos MLP block (paper Eq. 16): two B-cos linear layers with MaxOut, no activation, no norm, residual.

    MLPBlock(P) = (M_2(P) L_2(P) M_1(P) L_1(P) + I) P = W^MLP(P) P

``L_i`` are the B-cos transforms (their ``|cos|^(B-1)`` scaling is the dynamic weight) and ``M_i`` the MaxOut
selections (piece-wise constant, so exact under input x gradient). Each hidden "neuron" has two units.
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn

from ..nn.linear import BcosLinear

__all__ = ["BcosViTMLP"]


class BcosViTMLP(nn.Module):
    """``x + fc_out(fc_in(x))`` with B-cos linear layers (MaxOut ``max_out``) and no non-linearity."""

    def __init__(self, hidden_size: int, intermediate_size: int, b: float, max_out: int) -> None:
        super().__init__()
        self.fc_in = BcosLinear(hidden_size, intermediate_size, b=b, max_out=max_out)
        self.fc_out = BcosLinear(intermediate_size, hidden_size, b=b, max_out=max_out)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return x + self.fc_out(self.fc_in(x))
