"""Conversion of stock transformers models into B-cos models."""

from .architectures import SPECS, ArchitectureSpec, spec_for, supported_architectures
from .bcosify import BCOS_CONFIG_KEY, UnsupportedModuleError, bcosify
from .report import ConversionReport

__all__ = [
    "SPECS",
    "ArchitectureSpec",
    "BCOS_CONFIG_KEY",
    "ConversionReport",
    "UnsupportedModuleError",
    "bcosify",
    "spec_for",
    "supported_architectures",
]
