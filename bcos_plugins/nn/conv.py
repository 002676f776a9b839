"""B-cos 2-d convolution: a B-cos linear layer applied to every receptive field (``BcosConv2d``).

Maths per output location, with ``x_r`` the receptive field (all input channels, ``k x k`` positions)
flattened, unit-norm filters ``ŵ`` (norm over in-channels and kernel positions), MaxOut over groups of
``M`` consecutive output channels and ``B >= 1``::

    lin = ŵ · x_r                         (a plain bias-free convolution with unit-norm filters)
    dyn = |lin / ||x_r|| | ** (B - 1)      (the patch norm ||x_r|| is taken over each receptive field)
    out = dyn * lin

``dyn`` is the dynamic weight (constant in explanation mode), exactly as in
:class:`~bcos_plugins.nn.BcosLinear`; a convolution is a linear layer with shared weights, so
``x · d out / dx = out`` holds inside :func:`~bcos_plugins.nn.explanation_mode`. The patch norm is one
more convolution, of ``sum_c x_c^2`` with a ``k x k`` kernel of ones and the same stride and padding
(zero padding counts as zeros in the norm, as it does in ``lin``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from .dynamic import DynamicWeightModule
from .functional import NORM_EPS, bcos_scale, unit_norm
from .linear import check_b

__all__ = ["BcosConv2d"]


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class BcosConv2d(DynamicWeightModule):
    """B-cos convolution with weight ``(out_channels * max_out, in_channels, kh, kw)``, no bias.

    Args:
        in_channels, out_channels, kernel_size, stride, padding: as in ``nn.Conv2d`` (zero padding).
        b: alignment pressure, >= 1.
        max_out: units per output channel taken the maximum over (MaxOut); 1 disables it.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, b: float = 2.0,
                 max_out: int = 1, device=None, dtype=None) -> None:
        super().__init__()
        if max_out < 1:
            raise ValueError(f"max_out={max_out} must be >= 1 (1 disables MaxOut)")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.b = check_b(b)
        self.max_out = int(max_out)
        self.weight = nn.Parameter(torch.empty(out_channels * max_out, in_channels, *self.kernel_size,
                                               device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def unit_weight(self) -> Float[Tensor, "units c_in kh kw"]:
        """Filters scaled to unit norm over (in_channels, kh, kw)."""
        return unit_norm(self.weight, dim=(1, 2, 3))

    def patch_norm(self, x: Float[Tensor, "batch c_in h w"]) -> Float[Tensor, "batch 1 h_out w_out"]:
        """``||x_r||`` of every receptive field (with the same epsilon as ``BcosLinear``)."""
        ones = x.new_ones(1, 1, *self.kernel_size)
        squares = F.conv2d(x.pow(2).sum(dim=1, keepdim=True), ones, stride=self.stride, padding=self.padding)
        return (squares + NORM_EPS).sqrt()

    def forward(self, x: Float[Tensor, "batch c_in h w"]) -> Float[Tensor, "batch c_out h_out w_out"]:
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"BcosConv2d expects input (batch, {self.in_channels}, height, width); got "
                             f"{tuple(x.shape)}")
        lin = F.conv2d(x, self.unit_weight(), stride=self.stride, padding=self.padding)
        if self.max_out > 1:
            lin = lin.unflatten(1, (self.out_channels, self.max_out)).amax(dim=2)
        if self.b != 1.0:
            with self.dynamic_scope():
                dyn = bcos_scale(lin, self.patch_norm(x), self.b)
            lin = self.dynamic_weight(dyn) * lin
        return lin

    def extra_repr(self) -> str:
        extra = f", max_out={self.max_out}" if self.max_out > 1 else ""
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, b={self.b}{extra}")
