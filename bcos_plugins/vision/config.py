"""Configuration of the B-cos ViT (and of the conventional ViT of the same shape)."""

from __future__ import annotations

from transformers import PreTrainedConfig

from .._checks import require_float, require_int
from ..errors import BcosTypeError, argument_error
from .attention import PRIOR_KINDS
from .tokenizer import require_whole_patches

__all__ = ["TOKENIZER_KINDS", "BcosViTConfig"]

TOKENIZER_KINDS = ("linear", "conv")
# Above this every B-cos output is scaled by |cos|^(b-1) ~ 0 in float32 (the package-wide bound for b).
MAX_B = 10.0


class BcosViTConfig(PreTrainedConfig):
    """Shape and B-cos settings of :class:`~bcos_plugins.vision.BcosViT`.

    Args:
        image_size, num_channels: input images ``(num_channels, image_size, image_size)`` in [0, 1]; the
            B-cos model sees ``2 * num_channels`` encoded channels ``[x, 1 - x]``. Images outside [0, 1]
            (standardised ones) and NaN / inf pixels are refused, not clipped: the encoding's meaning (a black
            pixel is ``[0, 1]``) depends on the range.
        patch_size: side of the square patch that becomes one token; ``image_size`` must be a multiple.
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size: transformer shape.
        tokenizer: ``"linear"`` (B-cos linear patch embedding) or ``"conv"`` (B-cos CNN tokeniser with
            ``conv_channels`` 3x3 layers before the patch convolution).
        attention_prior: ``"none"``, ``"additive"`` (Eq. 18) or ``"multiplicative"`` (Eq. 19).
        position_embedding: add a learnable position embedding to the tokens (the conventional ViT's
            choice; a baseline for B-cos ViTs: it is a constant added to the tokens, so pixel contributions
            no longer sum to the logit; its share is reported separately by ``explain_image``).
        b: alignment pressure of every B-cos layer, in [1, 10]; max_out: MaxOut units per neuron (paper: 2).
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
        for name in ("image_size", "num_channels", "patch_size", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "intermediate_size", "max_out"):
            setattr(self, name, require_int(name, getattr(self, name), minimum=1))
        require_whole_patches("patch_size", self.image_size, self.image_size, self.patch_size,
                              "Pick a patch size that divides the image size")
        if self.hidden_size % self.num_attention_heads != 0:
            raise argument_error("num_attention_heads", f"hidden_size={self.hidden_size} must be divisible by "
                                 f"num_attention_heads={self.num_attention_heads}", "Pick a divisor of hidden_size")
        if self.tokenizer not in TOKENIZER_KINDS:
            raise argument_error("tokenizer", f"tokenizer={self.tokenizer!r} is not one of {TOKENIZER_KINDS}",
                                 "Pick one of those")
        if self.attention_prior not in PRIOR_KINDS:
            raise argument_error("attention_prior", f"attention_prior={self.attention_prior!r} is not one of "
                                 f"{PRIOR_KINDS}", "Pick one of those")
        b = require_float("b", self.b)
        # b = inf (or huge) scales every output by |cos|^(b-1) -> 0: an all-zero model that explains "exactly".
        if not 1 <= b <= MAX_B:
            raise argument_error("b", f"b={b} must be >= 1 and <= {MAX_B}", "Use b=2 (the paper) or 1.25-2.5")
        self.b = b
        self.logit_scale = require_float("logit_scale", self.logit_scale, minimum=0.0, open_minimum=True)
        self.layer_norm_eps = require_float("layer_norm_eps", self.layer_norm_eps, minimum=0.0, open_minimum=True)
        self.initializer_range = require_float("initializer_range", self.initializer_range, minimum=0.0)
        if isinstance(self.conv_channels, str | bytes) or not hasattr(self.conv_channels, "__iter__"):
            raise argument_error("conv_channels", f"must be a sequence of ints, got {self.conv_channels!r}",
                                 "Pass e.g. (32,) or [] for a single patch convolution", kind=BcosTypeError)
        self.conv_channels = [require_int("conv_channels", c, minimum=1) for c in self.conv_channels]
        if not isinstance(self.position_embedding, bool):
            raise argument_error("position_embedding", f"must be a bool, got {self.position_embedding!r}",
                                 "Pass True or False", kind=BcosTypeError)
        super().__post_init__(**kwargs)
        if self.num_labels is None or self.num_labels < 1:
            raise argument_error("num_labels", f"must be >= 1, got {self.num_labels}", "Pass the number of classes")

    @property
    def grid_size(self) -> int:
        """Tokens per image side."""
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.grid_size**2
