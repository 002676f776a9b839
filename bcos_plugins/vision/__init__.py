"""B-cos vision transformers (B-cos ViT paper): holistically explainable image classifiers.

Public API:

- :class:`BcosViT`, :class:`BcosViTConfig`: the model (``[x, 1 - x]`` encoding, B-cos linear or CNN
  tokeniser, B-cos attention with additive / multiplicative attention priors, B-cos MLPs, B-cos classifier);
- :func:`explain_image` -> :class:`ImageExplanation`: exact per-pixel contributions ``W(x) x``, batched;
- :class:`ConventionalViT`: the conventional ViT of the same shape (baseline);
- :func:`attention_rollout`: the attention-only explanation the paper compares with;
- :func:`attribution_input`: the model's attribution point (the ``[x, 1 - x]`` encoding for a B-cos ViT), where
  the post-hoc methods the paper compares with attribute (``bcos_plugins.adapters.captum_vision``: last-layer
  attention, rollout, Captum's IntGrad, IxG and GradCAM);
- :mod:`.visualize`: colour images of ``W(x)`` rows and contribution maps (matplotlib);
- :mod:`.data`: digit images and 2x2 grids from scikit-learn's bundled digits.
"""

from ..nn.conv import BcosConv2d
from .attention import BcosViTAttention
from .config import BcosViTConfig
from .conventional import ConventionalViT
from .encoding import encode_image
from .explain import ImageExplanation, attribution_input, explain_image
from .mlp import BcosViTMLP
from .model import BcosViT
from .rollout import attention_rollout
from .tokenizer import BcosConvTokenizer, BcosPatchEmbedding

__all__ = [
    "BcosViTAttention",
    "BcosConv2d",
    "BcosConvTokenizer",
    "BcosViTMLP",
    "BcosPatchEmbedding",
    "BcosViT",
    "BcosViTConfig",
    "ConventionalViT",
    "ImageExplanation",
    "attention_rollout",
    "attribution_input",
    "encode_image",
    "explain_image",
]
