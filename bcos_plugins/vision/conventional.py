"""A conventional ViT of the same shape as a :class:`~bcos_plugins.vision.BcosViT` (the baseline).

Built from the same :class:`~bcos_plugins.vision.BcosViTConfig` (``b``, ``max_out``, ``attention_prior``
and ``logit_scale`` are ignored), so token grid, width, depth, heads and MLP size match:

    tokens = PatchEmbed(x) + E                      (Conv2d p x p stride p, or a Conv-GELU stack first)
    block:  x = x + MHA(LayerNorm(x));  x = x + Linear(GELU(Linear(LayerNorm(x))))
    logits = Linear(LayerNorm(mean over tokens))    (with bias)

Input: raw images ``(batch, C, H, W)`` in [0, 1] (no ``[x, 1 - x]`` encoding). Trained with softmax
cross-entropy, as conventional ViTs are. Attention is written out (not ``scaled_dot_product_attention``)
so that ``output_attentions=True`` returns the matrices attention rollout needs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import ImageClassifierOutput

from .._checks import require_class_ids
from ..errors import BcosTypeError, argument_error
from .config import BcosViTConfig
from .encoding import check_pixel_values
from .loading import WholeCheckpointLoading
from .model import refuse_meta_vit, require_output_attentions, vit_output_as_requested

__all__ = ["ConventionalViT"]


class _Attention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: Float[Tensor, "batch pos d_model"]):
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_size)).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        pattern = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_size), dim=-1)
        return self.output((pattern @ v).transpose(1, 2).flatten(2)), pattern


class _Block(nn.Module):
    def __init__(self, config: BcosViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = _Attention(config.hidden_size, config.num_attention_heads)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, config.intermediate_size), nn.GELU(),
                                 nn.Linear(config.intermediate_size, config.hidden_size))

    def forward(self, x):
        attended, pattern = self.attention(self.norm1(x))
        x = x + attended
        return x + self.mlp(self.norm2(x)), pattern


class ConventionalViT(WholeCheckpointLoading, PreTrainedModel):
    """Conventional ViT classifier with a learnt position embedding; see the module docstring."""

    config_class = BcosViTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    # a per-batch mean loss: see BcosViT.accepts_loss_kwargs (the Trainer skipped its division by the accumulation steps)
    accepts_loss_kwargs = False

    def __init__(self, config: BcosViTConfig) -> None:
        super().__init__(config)
        layers: list[nn.Module] = []
        previous = config.num_channels
        if config.tokenizer == "conv":
            for width in config.conv_channels:
                layers += [nn.Conv2d(previous, width, 3, padding=1), nn.GELU()]
                previous = width
        layers.append(nn.Conv2d(previous, config.hidden_size, config.patch_size, stride=config.patch_size))
        self.tokenizer = nn.Sequential(*layers)
        self.position_embedding = nn.Parameter(torch.zeros(1, config.num_tokens, config.hidden_size))
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, std=self.config.initializer_range)
            init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ConventionalViT):
            init.trunc_normal_(module.position_embedding, std=self.config.initializer_range)

    def forward(self, pixel_values: Tensor | None = None, labels: Tensor | None = None,
                output_attentions: bool | None = False, return_dict: bool | None = True,
                **kwargs) -> ImageClassifierOutput | tuple[Tensor, ...]:
        """Classify images in [0, 1]; with ``labels`` the loss is softmax cross-entropy.

        ``return_dict=False`` returns the tuple transformers models return, as :meth:`BcosViT.forward` does.

        Other keywords are refused naming the accepted ones (a misspelt ``output_attention=True`` was ignored).
        """
        if kwargs:
            raise argument_error(
                sorted(kwargs)[0], f"is not a keyword of ConventionalViT.forward (got {sorted(kwargs)})",
                "Pass only pixel_values, labels, output_attentions and return_dict", kind=BcosTypeError)
        output_attentions = require_output_attentions(output_attentions, self.config, "ConventionalViT")
        if pixel_values is None:
            raise argument_error("pixel_values", "is required", "Pass images in [0, 1] of shape (batch, C, H, W)")
        refuse_meta_vit(self)
        check_pixel_values(pixel_values, self.config.num_channels, self.config.image_size,
                           dtype=self.classifier.weight.dtype)
        if labels is not None:
            if self.config.num_labels == 1:
                # softmax over one class is 1 whatever the logit: the loss was 0 with no gradient, training nothing
                raise argument_error("labels", "given to a ConventionalViT with num_labels=1: softmax cross-entropy "
                                     "over one class is always 0 (no gradient), so nothing would be trained",
                                     "Build the model with num_labels=2 (or more) for a classification task")
            labels = require_class_ids("labels", labels, pixel_values.shape[0], self.config.num_labels)
        tokens = self.tokenizer(pixel_values).flatten(2).transpose(1, 2) + self.position_embedding
        patterns = []
        for block in self.blocks:
            tokens, pattern = block(tokens)
            patterns.append(pattern)
        logits = self.classifier(self.norm(tokens.mean(dim=1)))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        output = ImageClassifierOutput(loss=loss, logits=logits,
                                       attentions=tuple(patterns) if output_attentions else None)
        return vit_output_as_requested(output, return_dict, self.config, "ConventionalViT")
