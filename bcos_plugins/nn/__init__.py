"""B-cos and dynamic-linear building blocks; see :mod:`bcos_plugins.nn.dynamic` for the mechanism."""

from .activation import DetachableActivation
from .conv import BcosConv2d
from .dynamic import DynamicLinear, explanation_mode, is_explaining
from .linear import BcosConv1D, BcosLinear, check_b
from .norm import BcosLayerNorm, DetachableRMSNorm

__all__ = [
    "BcosConv1D",
    "BcosConv2d",
    "BcosLayerNorm",
    "BcosLinear",
    "DetachableActivation",
    "DetachableRMSNorm",
    "DynamicLinear",
    "check_b",
    "explanation_mode",
    "is_explaining",
]
