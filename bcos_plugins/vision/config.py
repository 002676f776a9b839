"""Configuration of the B-cos ViT (and of the conventional ViT of the same shape)."""

from __future__ import annotations

from transformers import PreTrainedConfig

from .attention import PRIOR_KINDS

__all__ = ["TOKENIZER_KINDS", "BcosViTConfig"]

TOKENIZER_KINDS = ("linear", "conv")


class BcosViTConfig(PreTrainedConfig):
    """Shape and B-cos settings of :class:`~bcos_plugins.vision.BcosViT`.

    Args:
        image_size, num_channels: input images ``(num_channels, image_size, image_size)`` in [0, 1]; the
            B-cos model sees ``2 * num_channels`` encoded channels ``[x, 1 - x]``.
        patch_size: side of the square patch that becomes one token; ``image_size`` must be a multiple.
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size: transformer shape.
        tokenizer: ``"linear"`` (B-cos linear patch embedding) or ``"conv"`` (B-cos CNN tokeniser with
            ``conv_channels`` 3x3 layers before the patch convolution).
        attention_prior: ``"none"``, ``"additive"`` (Eq. 18) or ``"multiplicative"`` (Eq. 19).
        position_embedding: add a learnable position embedding to the tokens (the conventional ViT's
            choice; a baseline for B-cos ViTs: it is a constant added to the tokens, so pixel contributions
            no longer sum to the logit; its share is reported separately by ``explain_image``).
        b: alignment pressure of every B-cos layer; max_out: MaxOut units per neuron (paper: 2).
        logit_scale: constant factor on the logits (linear, so exact; the paper divides by 10^3 and adds
            a logit bias, which would break completeness: there is no logit bias here).
    """

    model_type = "bcos_vit"

    image_size: int = 16
    num_channels: int = 1
    patch_size: int = 4
    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 128
    tokenizer: str = "conv"
    conv_channels: tuple[int, ...] | list[int] = (32,)
    attention_prior: str = "additive"
    position_embedding: bool = False
    b: float = 2.0
    max_out: int = 2
    logit_scale: float = 1.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        if self.image_size % self.patch_size != 0:
            raise ValueError(f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer={self.tokenizer!r} is not one of {TOKENIZER_KINDS}")
        if self.attention_prior not in PRIOR_KINDS:
            raise ValueError(f"attention_prior={self.attention_prior!r} is not one of {PRIOR_KINDS}")
        if self.b < 1:
            raise ValueError(f"b={self.b} must be >= 1")
        if self.max_out < 1:
            raise ValueError(f"max_out={self.max_out} must be >= 1")
        self.conv_channels = [int(c) for c in self.conv_channels]
        super().__post_init__(**kwargs)

    @property
    def grid_size(self) -> int:
        """Tokens per image side."""
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.grid_size**2
