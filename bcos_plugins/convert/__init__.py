"""Conversion of stock transformers models into B-cos models."""

from .architectures import REFUSED_ARCHITECTURES, SPECS, ArchitectureSpec, spec_for, supported_architectures
from .bcosify import BCOS_CONFIG_KEY, UnsupportedModuleError, bcosify
from .dynamic_linear import DYNAMIC_LINEAR_ARCHITECTURES, dynamic_linear_copy
from .report import ConversionReport

__all__ = [
    "REFUSED_ARCHITECTURES",
    "SPECS",
    "ArchitectureSpec",
    "BCOS_CONFIG_KEY",
    "ConversionReport",
    "DYNAMIC_LINEAR_ARCHITECTURES",
    "UnsupportedModuleError",
    "bcosify",
    "dynamic_linear_copy",
    "spec_for",
    "supported_architectures",
]
