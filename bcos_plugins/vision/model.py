"""The B-cos ViT (paper Eq. 2-5, 9-19): a vision transformer that is dynamic linear end to end.

    y(x) = W^Class(P_L) W^Block_L(P_{L-1}) ... W^Block_1(P_0) W^Tokens(x~) x~ = W(x~) x~,   x~ = [x, 1 - x]

Pieces (one file each): :mod:`.encoding` (``[x, 1 - x]``), :mod:`.tokenizer` (B-cos linear patch embedding
or B-cos CNN, Eq. 9), :mod:`.attention` (B-cos attention with priors, Eq. 12-14, 18-19), :mod:`.mlp`
(Eq. 16); the classifier (Eq. 17) is a B-cos linear layer after mean pooling over tokens, times the
constant ``logit_scale``, and has no bias.

Every module whose weight depends on the input is a :class:`~bcos_plugins.nn.DynamicWeightModule`, so inside
:func:`~bcos_plugins.nn.explanation_mode` the logits are linear in ``x~`` as far as autograd sees, and
``x~ · dy_c/dx~ = y_c`` exactly (see :func:`~bcos_plugins.vision.explain_image`). The optional additive
position embedding (``config.position_embedding``) is the one exception: a constant added to the tokens.

The model is a transformers ``PreTrainedModel``: ``save_pretrained`` / ``from_pretrained`` and ``Trainer``
work as for any image classifier (inputs ``pixel_values``, ``labels``; output ``ImageClassifierOutput``).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import ImageClassifierOutput

from .._checks import refuse_meta_model, require_bool, require_class_ids
from ..errors import BcosTypeError, argument_error
from ..losses import bcos_loss
from ..nn.conv import BcosConv2d
from ..nn.linear import BcosLinear
from .attention import BcosViTAttention
from .config import BcosViTConfig
from .encoding import InputEncoding, check_pixel_values
from .loading import WholeCheckpointLoading
from .mlp import BcosViTMLP
from .tokenizer import BcosConvTokenizer, BcosPatchEmbedding

__all__ = ["BcosViT", "BcosViTBlock", "refuse_meta_vit", "require_output_attentions", "vit_output_as_requested"]


def refuse_meta_vit(model: nn.Module) -> None:
    """Refuse a ViT whose weights are on the meta device, as the text paths do (:func:`~bcos_plugins._checks.refuse_meta_model`):
    ``explain_image`` failed with "unknown device type for autocast" and the forward with "Tensor on device meta is not
    on the expected device cpu!", naming neither the model nor the fix. The classifier's weight stands for the rest
    (one flag read per forward; the whole check runs only when it is on the meta device)."""
    if model.classifier.weight.is_meta:
        refuse_meta_model(model)


def require_output_attentions(output_attentions, config, who: str) -> bool:
    """``output_attentions`` as transformers models read it (``None``: ``config.output_attentions``); another value is
    refused by :func:`~bcos_plugins._checks.require_bool` (``"no"`` read as True and returned the attention matrices)."""
    if require_bool("output_attentions", output_attentions, or_none=True,
                    fix=f"Pass output_attentions=True for the attention matrices, False for none or None for "
                    f"config.output_attentions's choice, as {who}.forward's transformers counterparts take") is None:
        return bool(getattr(config, "output_attentions", False))
    return output_attentions


def vit_output_as_requested(output: ImageClassifierOutput, return_dict: bool | None, config,
                            who: str) -> ImageClassifierOutput | tuple[Tensor, ...]:
    """``output`` as transformers models give it: the ``ModelOutput`` for ``return_dict=True``, its tuple of the
    fields that are set (``(loss, logits, attentions)`` without the unset ones) for ``False``, and
    ``config.return_dict``'s choice for ``None``. ``BcosViT`` and ``ConventionalViT`` ignored ``False``: indexing gave
    the same values (a ``ModelOutput`` indexes its tuple), but unpacking, ``loss, logits = model(x, labels=y,
    return_dict=False)`` as with any transformers model, iterates a ``ModelOutput``'s keys and gave the strings
    ``"loss"`` and ``"logits"``."""
    if require_bool("return_dict", return_dict, or_none=True, fix=f"Pass return_dict=False for a tuple, True for the "
                    f"ModelOutput or None for config.return_dict's choice, as {who}.forward's transformers "
                    "counterparts take") is None:
        return_dict = getattr(config, "return_dict", True)  # (a transformers config's, a bool)
    return output if return_dict else output.to_tuple()


class BcosViTBlock(nn.Module):
    """B-cos attention block (Eq. 14) followed by a B-cos MLP block (Eq. 16), both with residuals."""

    def __init__(self, config: BcosViTConfig) -> None:
        super().__init__()
        self.attention = BcosViTAttention(config.hidden_size, config.num_attention_heads, config.num_tokens,
                                       b=config.b, max_out=config.max_out, prior=config.attention_prior,
                                       layer_norm_eps=config.layer_norm_eps)
        self.mlp = BcosViTMLP(config.hidden_size, config.intermediate_size, b=config.b, max_out=config.max_out)

    def forward(self, x: Float[Tensor, "batch pos d_model"]):
        x, pattern = self.attention(x)
        return self.mlp(x), pattern


class BcosViT(WholeCheckpointLoading, PreTrainedModel):
    """B-cos vision transformer classifier; see the module docstring.

    ``forward(pixel_values)`` takes images in [0, 1]; ``forward(encoded_pixel_values=...)`` takes the
    already encoded ``[x, 1 - x]`` input (the attribution point: use it as the input of Captum methods
    that should satisfy completeness, e.g. ``BcosAttribution``).
    """

    config_class = BcosViTConfig
    base_model_prefix = "bcos_vit"
    main_input_name = "pixel_values"
    # the loss is a per-batch mean that never reads num_items_in_batch: transformers' Trainer read forward's **kwargs
    # as "normalises over the accumulated batch", passed num_items_in_batch (ignored) and skipped its division by the
    # gradient accumulation steps, so the loss and its gradients were that many times too large
    accepts_loss_kwargs = False

    def __init__(self, config: BcosViTConfig) -> None:
        super().__init__(config)
        encoded_channels = 2 * config.num_channels
        self.encoding = InputEncoding()
        if config.tokenizer == "conv":
            self.tokenizer = BcosConvTokenizer(encoded_channels, config.patch_size, config.hidden_size,
                                               tuple(config.conv_channels), b=config.b, max_out=config.max_out)
        else:
            self.tokenizer = BcosPatchEmbedding(encoded_channels, config.patch_size, config.hidden_size,
                                                b=config.b, max_out=config.max_out)
        if config.position_embedding:
            self.position_embedding = nn.Parameter(torch.zeros(1, config.num_tokens, config.hidden_size))
        else:
            self.register_parameter("position_embedding", None)
        self.blocks = nn.ModuleList(BcosViTBlock(config) for _ in range(config.num_hidden_layers))
        self.classifier = BcosLinear(config.hidden_size, config.num_labels, b=config.b, max_out=1)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (BcosLinear, BcosConv2d)):
            init.kaiming_uniform_(module.weight, a=5**0.5)
            # checkpoints older than the stored B have no bcos_b: fill it with the config's B (a B loaded
            # from the checkpoint is left alone)
            init.constant_(module.bcos_b, module.initial_b)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, std=self.config.initializer_range)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, BcosViTAttention) and module.prior is not None:
            init.zeros_(module.prior)
        elif isinstance(module, BcosViT) and module.position_embedding is not None:
            init.normal_(module.position_embedding, std=self.config.initializer_range)

    def encode(self, pixel_values: Float[Tensor, "batch c h w"]) -> Float[Tensor, "batch two_c h w"]:
        """Check the images and return ``[x, 1 - x]`` (the attribution point)."""
        refuse_meta_vit(self)
        check_pixel_values(pixel_values, self.config.num_channels, self.config.image_size,
                           dtype=self.classifier.weight.dtype)
        return self.encoding(pixel_values)

    def forward_encoded(self, encoded: Float[Tensor, "batch two_c h w"],
                        position_embedding: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Logits and attention matrices from the encoded input.

        ``position_embedding`` overrides the stored one (``explain_image`` passes a leaf to measure its share).
        """
        tokens = self.tokenizer(encoded)
        position_embedding = self.position_embedding if position_embedding is None else position_embedding
        if position_embedding is not None:
            tokens = tokens + position_embedding
        patterns = []
        for block in self.blocks:
            tokens, pattern = block(tokens)
            patterns.append(pattern)
        logits = self.classifier(tokens.mean(dim=1)) * self.config.logit_scale
        return logits, tuple(patterns)

    def forward(self, pixel_values: Tensor | None = None, labels: Tensor | None = None,
                output_attentions: bool | None = False, encoded_pixel_values: Tensor | None = None,
                return_dict: bool | None = True, **kwargs) -> ImageClassifierOutput | tuple[Tensor, ...]:
        """Classify images; with ``labels`` the loss is B-cos BCE (:func:`~bcos_plugins.bcos_loss`).

        With ``label_smoothing_factor`` (and no ``compute_loss_func``) transformers' ``Trainer`` never passes the labels
        here: it trains its own smoothed cross-entropy of the logits in place of this loss, without a word (with
        ``compute_loss_func=bcos_loss`` it ignores the factor). Leave the factor out; :class:`~bcos_plugins.BWarmupCallback`
        refuses it.

        ``return_dict=False`` returns the tuple transformers models return (the set fields of the output, in order:
        ``(loss, logits, attentions)``); ``None`` follows ``config.return_dict``. ``output_attentions=None`` follows
        ``config.output_attentions``; a value other than a bool or None is refused.

        Other keywords are refused naming the accepted ones (a misspelt ``output_attention=True`` was ignored).
        """
        if kwargs:
            raise argument_error(
                sorted(kwargs)[0], f"is not a keyword of BcosViT.forward (got {sorted(kwargs)})",
                "Pass only pixel_values or encoded_pixel_values, labels, output_attentions and return_dict",
                kind=BcosTypeError)
        output_attentions = require_output_attentions(output_attentions, self.config, "BcosViT")
        if (pixel_values is None) == (encoded_pixel_values is None):
            raise argument_error("pixel_values", "pass exactly one of pixel_values (images in [0, 1]) and "
                                 "encoded_pixel_values (the [x, 1 - x] encoding)", "Drop the other one")
        if encoded_pixel_values is None:
            encoded = self.encode(pixel_values)
        else:
            encoded = encoded_pixel_values
            refuse_meta_vit(self)
            check_pixel_values(encoded, 2 * self.config.num_channels, self.config.image_size,
                               what="encoded_pixel_values", dtype=self.classifier.weight.dtype)
        if labels is not None:
            labels = require_class_ids("labels", labels, encoded.shape[0], self.config.num_labels)
        logits, patterns = self.forward_encoded(encoded)
        loss = bcos_loss(logits, labels) if labels is not None else None
        output = ImageClassifierOutput(loss=loss, logits=logits, attentions=patterns if output_attentions else None)
        return vit_output_as_requested(output, return_dict, self.config, "BcosViT")
