"""B-cos and dynamic-weight building blocks; see :mod:`bcos_plugins.nn.dynamic` for the mechanism."""

from .activation import DetachableActivation
from .conv import BcosConv2d
from .dynamic import DynamicWeightModule, explanation_mode, has_dynamic_weights, is_explaining
from .functional import reference_path, reuse_unit_weights
from .linear import BcosConv1D, BcosLinear, check_b
from .norm import BcosLayerNorm, DetachableRMSNorm
from .triton_linear import triton_kernels, using_triton_kernels

__all__ = [
    "BcosConv1D",
    "BcosConv2d",
    "BcosLayerNorm",
    "BcosLinear",
    "DetachableActivation",
    "DetachableRMSNorm",
    "DynamicWeightModule",
    "check_b",
    "explanation_mode",
    "has_dynamic_weights",
    "is_explaining",
    "reference_path",
    "reuse_unit_weights",
    "triton_kernels",
    "using_triton_kernels",
]
