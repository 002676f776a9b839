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

import numbers
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..errors import BcosValueError, argument_error
from .functional import HALF_DTYPES, NORM_EPS, bcos_product, cached_unit_norm, overflowed_norm_as_nan
from .linear import AlignmentPressure, check_features, check_no_bias

__all__ = ["BcosConv2d"]


def _pair(name: str, v: int | tuple[int, int], minimum: int) -> tuple[int, int]:
    pair = (v, v) if not isinstance(v, tuple | list) else tuple(v)
    # (any integer, a NumPy one too, as BcosLinear's sizes and torch's Conv2d take it)
    if len(pair) != 2 or any(isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < minimum for p in pair):
        raise argument_error(name, f"must be an integer >= {minimum} or a pair of them, got {v!r}",
                             f"pass e.g. {name}={max(minimum, 1)}")
    return (int(pair[0]), int(pair[1]))


class BcosConv2d(AlignmentPressure):
    """B-cos convolution with weight ``(out_channels * max_out, in_channels, kh, kw)``, no bias.

    Args:
        in_channels, out_channels, kernel_size, stride, padding: as in ``nn.Conv2d`` (zero padding).
        b: alignment pressure in [1, 10] (see :func:`~bcos_plugins.nn.check_b`).
        max_out: units per output channel taken the maximum over (MaxOut); 1 disables it.
        bias: ``False`` only, as in :class:`~bcos_plugins.nn.BcosLinear` (``True`` is refused: no bias).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, b: float = 2.0,
                 max_out: int = 1, device=None, dtype=None, *, bias: bool = False) -> None:
        check_no_bias(bias)
        super().__init__()
        self.in_channels = check_features("in_channels", in_channels)
        self.out_channels = check_features("out_channels", out_channels)
        self.kernel_size = _pair("kernel_size", kernel_size, 1)
        self.stride = _pair("stride", stride, 1)
        self.padding = _pair("padding", padding, 0)
        self.max_out = check_features("max_out", max_out)
        self._init_b(b, device)
        self.weight = nn.Parameter(torch.empty(out_channels * max_out, in_channels, *self.kernel_size,
                                               device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def unit_weight(self) -> Float[Tensor, "units c_in kh kw"]:
        """Filters scaled to unit norm over (in_channels, kh, kw)."""
        return cached_unit_norm(self.weight, dim=(1, 2, 3))

    def patch_norm(self, x: Float[Tensor, "batch c_in h w"]) -> Float[Tensor, "batch 1 h_out w_out"]:
        """``||x_r||`` of every receptive field (with the same epsilon as ``BcosLinear``).

        Half-precision inputs are summed in float32 (the squares overflow float16 once a patch norm passes
        256); the result is then float32. A patch whose sum of squares passes float32's range gets NaN (its outputs are
        NaN), not ``inf`` (whose ``|cos| = 0`` made them 0).
        """
        if x.dtype in HALF_DTYPES:
            x = x.float()
        ones = x.new_ones(1, 1, *self.kernel_size)
        # outside autocast: it cast this convolution of squares to float16 / bfloat16, where a float32 input's patch
        # norm overflowed (float16 past 256: every output of the layer was 0), underflowed (float16 below 1e-4) or lost
        # digits (bfloat16), silently
        with (torch.autocast(x.device.type, enabled=False) if torch.is_autocast_enabled(x.device.type)
              else nullcontext()):
            squares = F.conv2d(x.pow(2).sum(dim=1, keepdim=True), ones, stride=self.stride, padding=self.padding)
        # a patch whose sum of squares passes float32's range gives NaN, not inf (whose |cos| = 0 made the output 0)
        return overflowed_norm_as_nan((squares + NORM_EPS).sqrt())

    def forward(self, x: Float[Tensor, "batch c_in h w"]) -> Float[Tensor, "batch c_out h_out w_out"]:
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise argument_error("x", f"BcosConv2d expects shape (batch, {self.in_channels}, height, width), got "
                                 f"{tuple(x.shape)}", "pass a batch of images with the layer's in_channels",
                                 kind=BcosValueError)
        b = self._forward_pressure()
        weight = cached_unit_norm(self.weight, dim=(1, 2, 3), autocast=True)
        lin = F.conv2d(x, weight, stride=self.stride, padding=self.padding)
        if self.max_out > 1:
            lin = lin.unflatten(1, (self.out_channels, self.max_out)).amax(dim=2)
        if isinstance(b, Tensor) or b != 1.0:
            explaining = self.holds_constant()
            with self.dynamic_scope():
                x_norm = self.patch_norm(x)
            # MaxOut's maximum saves its output for its backward pass: only the convolution's is free to reuse
            lin = bcos_product(lin, x_norm, b, explaining, overwrite_lin=self.max_out == 1)
        return lin

    def extra_repr(self) -> str:
        extra = f", max_out={self.max_out}" if self.max_out > 1 else ""
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, b={self.b}{extra}")
