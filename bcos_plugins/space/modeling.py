"""Space Model (Tytarenko & Amin): concept-operator classification head over any transformers encoder.

Maths, per example with encoder token states ``h_j`` (j over positions, ``m_j`` = 1 on real tokens) and
``n = sum_j m_j`` real tokens; one concept space k per class (paper Eq. 1-4):

    z_{k,j} = tanh(h_j @ P_k)                    P_k: (d_model, n_latent), bias-free   (concept activations)
    c_k     = sum_j m_j z_{k,j} / n              masked mean over real tokens            (space centroid)
    logits  = W [c_1; ...; c_K] + b              one linear classifier over the concatenation

The reference code averages over padding too (``mean(dim=1)``), so its predictions change with the padded
length; here padding never enters. Because the classifier is linear in the centroids, each token's share
of each logit is exact (DESIGN.md §3):

    logit_c = sum_j  m_j / n * sum_k w_{c,k} . z_{k,j}   +   b_c

:meth:`SpaceHead.token_contributions` returns those shares; :func:`~bcos_plugins.space.context_attribution`
wraps them like :func:`~bcos_plugins.explain` does.

Hook points for attribution libraries: ``head.concept_activation`` (an ``nn.Tanh`` module) outputs
``z`` of shape (batch, pos, n_spaces, n_latent). The logits are linear in it (plus the bias), so Captum's
``LayerGradientXActivation`` at that layer reproduces the exact context attribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from huggingface_hub.dataclasses import strict
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.configuration_utils import SubConfigSpec
from transformers.utils import ModelOutput

from .losses import inter_space_loss, intra_space_loss

__all__ = ["SpaceModelConfig", "SpaceHead", "SpaceModelForSequenceClassification", "SpaceModelOutput",
           "masked_mean"]


@strict
class SpaceModelConfig(PreTrainedConfig):
    """Configuration of :class:`SpaceModelForSequenceClassification`.

    Args:
        encoder_config: the config of the encoder (any ``AutoModel``), a config object or its dict.
        n_latent: size m of each concept space (the paper uses 3 for plots, 64-128 for results).
        train_encoder: ``False`` (default, the paper's "fine-tuning" setting): the encoder's parameters
            are frozen (``requires_grad=False``) and only the head trains; ``True``: the whole model trains.
        cross_entropy_weight, inter_space_weight, intra_space_weight: weights of the loss terms
            (:mod:`bcos_plugins.space.losses`); the paper reports intra-space weights 0 and 0.001.
        intra_space_eps: the epsilon that bounds the intra-space term by ``1/eps`` (see its docstring).
        num_labels: number of classes = number of concept spaces.
    """

    model_type = "bcos_plugins_space"
    sub_configs_defaults = {"encoder_config": SubConfigSpec(config_class=AutoConfig, model_type="bert")}

    encoder_config: PreTrainedConfig | dict | None = None
    n_latent: int = 128
    train_encoder: bool = False
    cross_entropy_weight: float = 1.0
    inter_space_weight: float = 0.0
    intra_space_weight: float = 0.001
    intra_space_eps: float = 0.01

    def validate_architecture(self):
        if self.n_latent < 1:
            raise ValueError(f"n_latent must be >= 1; got {self.n_latent}")
        if self.intra_space_eps <= 0:
            raise ValueError(f"intra_space_eps must be > 0 (it bounds the inverse variance); got {self.intra_space_eps}")


def masked_mean(
    values: Float[Tensor, "batch pos ..."], attention_mask: Int[Tensor, "batch pos"] | None
) -> Float[Tensor, "batch ..."]:
    """Mean over real positions only (``attention_mask`` 1); all positions when the mask is ``None``."""
    if attention_mask is None:
        return values.mean(dim=1)
    weights = attention_mask.to(values.dtype)
    n_real = weights.sum(dim=1)
    if (n_real == 0).any():
        raise ValueError("a row of attention_mask has no real token; remove empty rows")
    weights = weights / n_real[:, None]
    return torch.einsum("bp...,bp->b...", values, weights)


class SpaceHead(nn.Module):
    """The concept operators, masked centroid pooling and the linear classifier (module docstring maths).

    Shapes: ``projections`` (n_spaces, d_model, n_latent); ``classifier`` Linear(n_spaces * n_latent, n_classes).
    """

    def __init__(self, d_model: int, n_spaces: int, n_latent: int, n_classes: int | None = None):
        super().__init__()
        self.n_spaces, self.n_latent = n_spaces, n_latent
        self.projections = nn.Parameter(torch.empty(n_spaces, d_model, n_latent))
        self.concept_activation = nn.Tanh()
        self.classifier = nn.Linear(n_spaces * n_latent, n_classes or n_spaces)
        nn.init.normal_(self.projections, std=d_model**-0.5)

    def concepts(
        self, hidden_states: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos n_spaces n_latent"]:
        """``z_{k,j} = tanh(h_j @ P_k)`` for every token and concept space."""
        return self.concept_activation(torch.einsum("bpd,kdl->bpkl", hidden_states, self.projections))

    def forward(
        self,
        hidden_states: Float[Tensor, "batch pos d_model"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> tuple[Float[Tensor, "batch n_classes"], Float[Tensor, "batch pos n_spaces n_latent"]]:
        concepts = self.concepts(hidden_states)
        centroids = masked_mean(concepts, attention_mask)  # (batch, n_spaces, n_latent)
        return self.classifier(centroids.flatten(1)), concepts

    def token_contributions(
        self,
        concepts: Float[Tensor, "batch pos n_spaces n_latent"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch pos n_classes n_spaces n_latent"]:
        """Exact shares ``m_j / n * w_{c,k,l} z_{k,j,l}``; summed over (pos, n_spaces, n_latent) they give
        ``logits - classifier.bias``. Padding positions get exactly 0."""
        batch, pos = concepts.shape[:2]
        mask = torch.ones(batch, pos, device=concepts.device) if attention_mask is None else attention_mask
        weights = mask.to(concepts.dtype) / mask.to(concepts.dtype).sum(1, keepdim=True)
        w = self.classifier.weight.view(-1, self.n_spaces, self.n_latent)  # (n_classes, n_spaces, n_latent)
        return torch.einsum("bpkl,ckl,bp->bpckl", concepts, w, weights)


@dataclass
class SpaceModelOutput(ModelOutput):
    """``loss`` (when ``labels`` are given), ``logits``, the concept activations ``z`` and the encoder's
    ``last_hidden_state``; ``loss_terms`` holds the unweighted cross-entropy, inter- and intra-space terms."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    concepts: Tensor | None = None
    last_hidden_state: Tensor | None = None
    loss_terms: dict | None = None


class SpaceModelForSequenceClassification(PreTrainedModel):
    """Space Model head over a transformers encoder, saved and loaded like any transformers model.

    >>> encoder = AutoModel.from_pretrained(path)                       # any encoder
    >>> model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2, n_latent=64)
    >>> out = model(input_ids, attention_mask, labels=labels)           # out.loss for Trainer
    >>> model.save_pretrained(folder); SpaceModelForSequenceClassification.from_pretrained(folder)
    """

    config_class = SpaceModelConfig
    base_model_prefix = "encoder"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _supports_attention_backend = True
    _supports_sdpa = True

    def __init__(self, config: SpaceModelConfig, encoder: PreTrainedModel | None = None):
        super().__init__(config)
        self.encoder = encoder if encoder is not None else AutoModel.from_config(config.encoder_config)
        d_model = self.encoder.config.hidden_size
        self.head = SpaceHead(d_model, config.num_labels, config.n_latent)
        self.post_init()
        self._apply_train_encoder()

    def _init_weights(self, module):
        if isinstance(module, SpaceHead):
            init.normal_(module.projections, std=module.projections.shape[1] ** -0.5)
            init.normal_(module.classifier.weight, std=module.classifier.in_features ** -0.5)
            init.zeros_(module.classifier.bias)

    def _apply_train_encoder(self) -> None:
        for p in self.encoder.parameters():
            p.requires_grad_(bool(self.config.train_encoder))

    @classmethod
    def from_encoder(cls, encoder: PreTrainedModel, num_labels: int, **config_kwargs):
        """Wrap an encoder that already has weights (e.g. ``AutoModel.from_pretrained``); the head is new."""
        if not isinstance(encoder, PreTrainedModel):
            raise TypeError(f"encoder must be a transformers PreTrainedModel (e.g. AutoModel.from_pretrained(...)); "
                            f"got {type(encoder).__name__}")
        # The config's attention implementation propagates to the encoder's config (a sub-config): pass the
        # encoder's own, or the composite config would reset it.
        config_kwargs.setdefault("attn_implementation", encoder.config._attn_implementation or "sdpa")
        config = SpaceModelConfig(encoder_config=encoder.config, num_labels=num_labels, **config_kwargs)
        return cls(config, encoder=encoder)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        # Loading materialises fresh parameters, so the frozen/trainable setting is applied again.
        model._apply_train_encoder()
        return model

    def get_input_embeddings(self):
        return self.encoder.get_input_embeddings()

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs,
    ) -> SpaceModelOutput:
        encoder_kwargs = dict(kwargs)
        if token_type_ids is not None:
            encoder_kwargs["token_type_ids"] = token_type_ids
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                              **encoder_kwargs).last_hidden_state
        logits, concepts = self.head(hidden, attention_mask)
        loss = terms = None
        if labels is not None:
            loss, terms = self.space_loss(logits, concepts, labels, attention_mask)
        return SpaceModelOutput(loss=loss, logits=logits, concepts=concepts, last_hidden_state=hidden,
                                loss_terms=terms)

    def space_loss(
        self,
        logits: Float[Tensor, "batch n_classes"],
        concepts: Float[Tensor, "batch pos n_spaces n_latent"],
        labels: Int[Tensor, " batch"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The weighted training loss and its unweighted terms, from the head's outputs (so that a head
        trained on cached encoder states uses exactly the loss of :meth:`forward`)."""
        c = self.config
        terms = {
            "cross_entropy": nn.functional.cross_entropy(logits, labels),
            "inter_space": inter_space_loss(concepts, labels, attention_mask),
            "intra_space": intra_space_loss(concepts, attention_mask, eps=c.intra_space_eps),
        }
        loss = (c.cross_entropy_weight * terms["cross_entropy"] + c.inter_space_weight * terms["inter_space"]
                + c.intra_space_weight * terms["intra_space"])
        return loss, terms

    def explain(self, input_ids, attention_mask=None, *, target=None, foil=None, **forward_kwargs):
        """Exact context attribution; see :func:`bcos_plugins.space.context_attribution`."""
        from .attribution import context_attribution

        return context_attribution(self, input_ids, attention_mask, target=target, foil=foil, **forward_kwargs)


def register_auto_classes() -> None:
    """Make ``AutoConfig`` / ``AutoModelForSequenceClassification`` know the Space Model (idempotent; leaves a
    foreign registration of the same model type alone)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = SpaceModelConfig.model_type
    if model_type in CONFIG_MAPPING and CONFIG_MAPPING[model_type] is not SpaceModelConfig:
        return
    AutoConfig.register(model_type, SpaceModelConfig, exist_ok=True)
    AutoModelForSequenceClassification.register(SpaceModelConfig, SpaceModelForSequenceClassification,
                                                exist_ok=True)
