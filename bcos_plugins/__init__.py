"""bcos-plugins: inherently interpretable models as first-class citizens of the interpretability ecosystem.

The core imports torch and transformers only; host-library integrations live in
``bcos_plugins.adapters.{inseq,captum,transformer_lens,sae_lens}`` and are imported explicitly.
"""

from ._host_import_guard import guard_transformer_lens_on_import
from ._version import __version__ as __version__  # the one source; pyproject.toml reads it too
from .attribution import Direction, Explanation, TokenExplanation
from .convert import ConversionReport, UnsupportedModuleError, bcosify, supported_architectures
from .corpus import explain_dataset
from .errors import (
    BcosError,
    BcosFileError,
    BcosKeywordError,
    BcosRuntimeError,
    BcosTypeError,
    BcosValueError,
)
from .explain import explain
from .guided import guide_attention, unguide_attention
from .metrics.rationale import rationale_alignment
from .nn import BcosLinear, explanation_mode
from .space import SpaceModelConfig, SpaceModelForSequenceClassification, context_attribution
from .train import BWarmupCallback, bcos_loss, fine_tune_classifier, load_bcos_model
from .train_decoder import CausalLMCollator, train_causal_lm
from .vision import BcosViT, BcosViTConfig, explain_image

# TransformerLens' own boot_transformers would rewrite a B-cos model in place: refused once both are imported
guard_transformer_lens_on_import()

__all__ = [
    "BcosError",
    "BcosFileError",
    "BcosKeywordError",
    "BcosRuntimeError",
    "BcosTypeError",
    "BcosValueError",
    "BWarmupCallback",
    "BcosLinear",
    "BcosViT",
    "BcosViTConfig",
    "CausalLMCollator",
    "ConversionReport",
    "Direction",
    "TokenExplanation",
    "explain_dataset",
    "SpaceModelConfig",
    "SpaceModelForSequenceClassification",
    "Explanation",
    "UnsupportedModuleError",
    "bcos_loss",
    "bcosify",
    "context_attribution",
    "explain",
    "explain_image",
    "explanation_mode",
    "fine_tune_classifier",
    "guide_attention",
    "load_bcos_model",
    "rationale_alignment",
    "supported_architectures",
    "train_causal_lm",
    "unguide_attention",
]
