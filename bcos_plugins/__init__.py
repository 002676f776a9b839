"""bcos-plugins: inherently interpretable models as first-class citizens of the interpretability ecosystem.

The core imports torch and transformers only; host-library integrations live in
``bcos_plugins.adapters.{inseq,captum,transformer_lens,sae_lens}`` and are imported explicitly.
"""

from .convert import ConversionReport, UnsupportedModuleError, bcosify, supported_architectures
from .explain import Explanation, explain
from .nn import BcosLinear, explanation_mode
from .train import bcos_loss, load_bcos_model

__version__ = "0.1.0"

__all__ = [
    "BcosLinear",
    "ConversionReport",
    "Explanation",
    "UnsupportedModuleError",
    "bcos_loss",
    "bcosify",
    "explain",
    "explanation_mode",
    "load_bcos_model",
    "supported_architectures",
]
