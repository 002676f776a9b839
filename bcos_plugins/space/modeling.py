"""Space Model (Tytarenko & Amin): concept-operator classification head over any transformers encoder.

Maths, per example with encoder token states ``h_j`` (j over positions, ``m_j`` = 1 on real tokens) and
``n = sum_j m_j`` real tokens; one concept space k per class (paper Eq. 1-4):

    z_{k,j} = tanh(h_j @ P_k)                    P_k: (d_model, n_latent), bias-free   (concept activations)
    c_k     = sum_j m_j z_{k,j} / n              masked mean over real tokens            (space centroid)
    logits  = W [c_1; ...; c_K] + b              one linear classifier over the concatenation

The reference code averages over padding too (``mean(dim=1)``), so its predictions change with the padded
length; here padding never enters. Because the classifier is linear in the centroids, each token's share
of each logit is exact (docs/design.md#space-model):

    logit_c = sum_j  m_j / n * sum_k w_{c,k} . z_{k,j}   +   b_c

:meth:`SpaceHead.token_contributions` returns those shares; :func:`~bcos_plugins.space.context_attribution`
wraps them like :func:`~bcos_plugins.explain` does.

Hook points for attribution libraries: ``head.concept_activation`` (an ``nn.Tanh`` module) outputs
``z`` of shape (batch, pos, n_spaces, n_latent). The logits are linear in it (plus the bias), so Captum's
``LayerGradientXActivation`` at that layer reproduces the exact context attribution.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from huggingface_hub.dataclasses import strict
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from .._checks import (
    closest_name_fix,
    require_class_ids,
    require_float,
    require_int,
    require_tensor,
    require_token_batch,
    unmasked_padding_keywords,
)
from ..attribution.text import (
    check_first_column_is_real,
    check_forward_kwargs,
    forward_keywords,
    position_ids_as_alone,
    refuse_left_padding_shifting_positions,
    registry_spec,
)
from ..convert.architectures import position_limit, vocabulary_size
from ..errors import BcosTypeError, argument_error
from .losses import inter_space_loss, intra_space_loss

try:  # transformers >= 5.20 builds a sub-config from its dict through a spec
    from transformers.configuration_utils import SubConfigSpec
except ImportError:  # 5.9-5.19: SpaceModelConfig.__post_init__ builds it (pyproject.toml's lower bound is tested)
    SubConfigSpec = None

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
            (:mod:`bcos_plugins.space.losses`); the paper reports intra-space weights 0 and 0.001 in its
            scale, which sums over spaces and latents where ours averages (``K x L`` times weaker at the same
            weight): pass ``intra_space_weight_from_paper(0.001, num_labels, n_latent)`` to match it.
        intra_space_eps: the epsilon that bounds the intra-space term by ``1/eps`` (see its docstring).
        num_labels: number of classes = number of concept spaces.
    """

    model_type = "bcos_plugins_space"
    if SubConfigSpec is not None:
        sub_configs_defaults = {"encoder_config": SubConfigSpec(config_class=AutoConfig, model_type="bert")}
    else:
        sub_configs = {"encoder_config": AutoConfig}

    encoder_config: PreTrainedConfig | dict | None = None
    n_latent: int = 128
    train_encoder: bool = False
    cross_entropy_weight: float = 1.0
    inter_space_weight: float = 0.0
    intra_space_weight: float = 0.001
    intra_space_eps: float = 0.01

    def __post_init__(self, **kwargs):
        self.check_space_fields()
        if SubConfigSpec is None:
            self.encoder_config = encoder_config_object(self.encoder_config)
        super().__post_init__(**kwargs)
        # One concept space per class, trained by cross-entropy over the classes: with one class that loss is
        # identically 0 (softmax over one logit), so the head would train on the regularisers alone.
        if self.num_labels is None or self.num_labels < 2:
            raise argument_error("num_labels", f"must be >= 2 (one concept space per class), got {self.num_labels}",
                                 "For a binary task use num_labels=2")

    def check_space_fields(self) -> None:
        """Validate the Space Model's own fields (package errors naming the field)."""
        self.n_latent = require_int("n_latent", self.n_latent, minimum=1)
        if not isinstance(self.train_encoder, bool):
            raise argument_error("train_encoder", f"must be a bool, got {self.train_encoder!r}",
                                 "Pass True or False", kind=BcosTypeError)
        weights = {name: require_float(name, getattr(self, name), minimum=0.0)
                   for name in ("cross_entropy_weight", "inter_space_weight", "intra_space_weight")}
        if not any(weights.values()):
            raise argument_error("cross_entropy_weight", "and every other loss weight is 0, so the loss is "
                                 "identically 0 and nothing trains", "Give at least one loss term a positive weight")
        self.intra_space_eps = require_float("intra_space_eps", self.intra_space_eps, minimum=0.0, open_minimum=True)

    def validate_architecture(self):
        self.check_space_fields()


# the Space Model's own configuration fields (the rest are transformers' common ones: output_attentions, id2label, ...)
SPACE_SETTINGS = ("n_latent", "train_encoder", "cross_entropy_weight", "inter_space_weight", "intra_space_weight",
                  "intra_space_eps")


def refuse_unknown_config_keywords(config_kwargs: dict) -> None:
    """A keyword that is no setting of :class:`SpaceModelConfig` would be stored as an unused attribute (transformers'
    configs keep any keyword), so a typo (``n_latant=4``) left the setting at its default without a word."""
    default = SpaceModelConfig(num_labels=2)
    known = set(vars(default)) | {name for name in dir(type(default))
                                  if isinstance(getattr(type(default), name, None), property)}
    known = {name for name in known if not name.startswith("_")} | {"attn_implementation"}
    for name in config_kwargs:
        if name in known:
            continue
        hint = closest_name_fix(name, known, f"The Space Model's own settings are {', '.join(SPACE_SETTINGS)}")
        raise argument_error(name, "is not a setting of SpaceModelConfig, which would keep it as an unused "
                             "attribute and leave the setting you meant at its default", hint, kind=BcosTypeError)


def require_base_encoder(encoder) -> None:
    """The Space head reads the token states (``last_hidden_state``) of a base model: a task model (a classifier,
    a masked LM) returns its head's logits instead, which would fail deep inside the forward pass."""
    if not isinstance(encoder, PreTrainedModel):
        raise argument_error("encoder", f"must be a transformers PreTrainedModel, got {type(encoder).__name__}",
                             "Pass e.g. AutoModel.from_pretrained(path)", kind=BcosTypeError)
    base = encoder.base_model
    if base is not encoder:
        raise argument_error("encoder", f"{type(encoder).__name__} is a task model (its head on top of "
                             f"{type(base).__name__}), which returns its head's outputs, not the token states the "
                             "Space head reads", f"Pass its base model, encoder.{encoder.base_model_prefix} "
                             "(encoder.base_model), or load AutoModel.from_pretrained(path)", kind=BcosTypeError)


def encoder_config_object(encoder_config: PreTrainedConfig | dict | None) -> PreTrainedConfig:
    """The encoder's config object from a config, its dict or ``None`` (a default BERT), as transformers >= 5.20
    builds it from ``sub_configs_defaults``; used where that mechanism is missing (transformers 5.9-5.19)."""
    if isinstance(encoder_config, PreTrainedConfig):
        return encoder_config
    fields = dict(encoder_config or {})
    return AutoConfig.for_model(fields.pop("model_type", "bert"), **fields)


def masked_mean(
    values: Float[Tensor, "batch pos ..."], attention_mask: Int[Tensor, "batch pos"] | None
) -> Float[Tensor, "batch ..."]:
    """Mean over real positions only (``attention_mask`` 1); all positions when the mask is ``None``.

    Padding never enters, whatever it holds: its values are replaced by 0 (``torch.where``) before the sum, since a
    weight of 0 times a NaN or inf at a padding position is NaN, which made the whole row NaN."""
    values = require_tensor("values", values, kind="float", finite=False)
    if values.ndim < 2 or 0 in values.shape[:2]:
        raise argument_error("values", f"must have a non-empty batch and position axis, got shape "
                             f"{tuple(values.shape)}", "Pass (batch, pos, ...) values")
    if attention_mask is None:
        return values.mean(dim=1)
    _, attention_mask = require_token_batch(torch.ones(values.shape[:2], dtype=torch.long), attention_mask,
                                            name="values")
    real = attention_mask.bool().view(*attention_mask.shape, *(1,) * (values.ndim - 2))
    values = torch.where(real, values, torch.zeros((), dtype=values.dtype, device=values.device))
    weights = attention_mask.to(values.dtype)
    weights = weights / weights.sum(dim=1)[:, None]
    return torch.einsum("bp...,bp->b...", values, weights)


class SpaceHead(nn.Module):
    """The concept operators, masked centroid pooling and the linear classifier (module docstring maths).

    Shapes: ``projections`` (n_spaces, d_model, n_latent); ``classifier`` Linear(n_spaces * n_latent, n_classes).
    """

    def __init__(self, d_model: int, n_spaces: int, n_latent: int, n_classes: int | None = None):
        super().__init__()
        d_model = require_int("d_model", d_model, minimum=1)
        n_spaces = require_int("n_spaces", n_spaces, minimum=2)
        n_latent = require_int("n_latent", n_latent, minimum=1)
        n_classes = n_spaces if n_classes is None else require_int("n_classes", n_classes, minimum=2)
        self.n_spaces, self.n_latent = n_spaces, n_latent
        self.projections = nn.Parameter(torch.empty(n_spaces, d_model, n_latent))
        self.concept_activation = nn.Tanh()
        self.classifier = nn.Linear(n_spaces * n_latent, n_classes)
        nn.init.normal_(self.projections, std=d_model**-0.5)

    def concepts(
        self, hidden_states: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos n_spaces n_latent"]:
        """``z_{k,j} = tanh(h_j @ P_k)`` for every token and concept space."""
        d_model = self.projections.shape[1]
        hidden_states = require_tensor("hidden_states", hidden_states, ndim=3, kind="float",
                                       shape_hint=f"(batch, pos, {d_model})", list_dtype=self.projections.dtype)
        if hidden_states.shape[-1] != d_model:
            raise argument_error("hidden_states", f"has width {hidden_states.shape[-1]}, the head expects {d_model}",
                                 "Pass the encoder's last hidden state")
        if hidden_states.dtype != self.projections.dtype:
            # torch's einsum said only "expected scalar type Float but found Double"
            raise argument_error("hidden_states", f"are {hidden_states.dtype} but the head's weights are "
                                 f"{self.projections.dtype}", "Convert the head (or the whole model) to the hidden "
                                 "states' dtype, e.g. model.double(), or cast the hidden states",
                                 kind=BcosTypeError)
        return self.concept_activation(torch.einsum("bpd,kdl->bpkl", hidden_states, self.projections))

    def forward(
        self,
        hidden_states: Float[Tensor, "batch pos d_model"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> tuple[Float[Tensor, "batch n_classes"], Float[Tensor, "batch pos n_spaces n_latent"]]:
        concepts = self.concepts(hidden_states)
        centroids = masked_mean(concepts, attention_mask)  # (batch, n_spaces, n_latent)
        return self.classifier(centroids.flatten(1)), concepts

    def bias_free_logits(
        self,
        concepts: Float[Tensor, "batch pos n_spaces n_latent"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch n_classes"]:
        """The forward's logits without the classifier bias: the classifier's weight over the same masked mean of the
        concepts, in their dtype. What :meth:`token_contributions` sums to; ``logits - classifier.bias`` would round
        it to the digits of a large bias."""
        centroids = masked_mean(concepts, attention_mask)
        return nn.functional.linear(centroids.flatten(1), self.classifier.weight)

    def token_contributions(
        self,
        concepts: Float[Tensor, "batch pos n_spaces n_latent"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch pos n_classes n_spaces n_latent"]:
        """Exact shares ``m_j / n * w_{c,k,l} z_{k,j,l}``; summed over (pos, n_spaces, n_latent) they give
        ``logits - classifier.bias``. Padding positions get exactly 0."""
        concepts = require_tensor("concepts", concepts, ndim=4, kind="float",
                                  shape_hint="(batch, pos, n_spaces, n_latent)", list_dtype=self.classifier.weight.dtype)
        if concepts.shape[2:] != (self.n_spaces, self.n_latent):
            raise argument_error("concepts", f"has spaces x latent {tuple(concepts.shape[2:])}, the head "
                                 f"({self.n_spaces}, {self.n_latent})", "Pass this head's concepts(hidden_states)")
        batch, pos = concepts.shape[:2]
        if attention_mask is not None:
            # a row without real tokens would give 0/0 = NaN shares
            _, attention_mask = require_token_batch(torch.ones(batch, pos, dtype=torch.long), attention_mask,
                                                    name="concepts")
        mask = torch.ones(batch, pos, device=concepts.device) if attention_mask is None else attention_mask
        weights = mask.to(concepts.dtype) / mask.to(concepts.dtype).sum(1, keepdim=True)
        w = self.classifier.weight.view(-1, self.n_spaces, self.n_latent)  # (n_classes, n_spaces, n_latent)
        return torch.einsum("bpkl,ckl,bp->bpckl", concepts, w, weights)


@dataclass
class SpaceModelOutput(ModelOutput):
    """``loss`` (when ``labels`` are given), ``logits``, the concept activations ``z`` and the encoder's
    ``last_hidden_state``; ``loss_terms`` holds the unweighted cross-entropy, inter- and intra-space terms;
    ``hidden_states`` and ``attentions`` are the encoder's, as transformers models return them, when asked for
    (``output_hidden_states=True`` / ``output_attentions=True``, in the call or the model's config), else ``None``.
    They come last, so that ``to_tuple()`` keeps the other fields' places."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    concepts: Tensor | None = None
    last_hidden_state: Tensor | None = None
    loss_terms: dict | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class SpaceModelForSequenceClassification(PreTrainedModel):
    """Space Model head over a transformers encoder, saved and loaded like any transformers model.

    Examples:
        >>> from transformers import AutoModel
        >>> from bcos_plugins.space import SpaceModelForSequenceClassification
        >>> encoder = AutoModel.from_pretrained(path)                       # any encoder
        >>> model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2, n_latent=64)
        >>> out = model(input_ids, attention_mask, labels=y)                # out.loss for Trainer
        >>> out.logits.shape
        torch.Size([4, 2])
        >>> model.save_pretrained("space-model")
        >>> reloaded = SpaceModelForSequenceClassification.from_pretrained("space-model")

    With ``label_smoothing_factor`` (and no ``compute_loss_func``) transformers' ``Trainer`` never passes the labels to
    :meth:`forward`: it trains its own smoothed cross-entropy of the logits in place of this model's loss, dropping the
    inter- and intra-space terms without a word. Leave the factor out (``fine_tune_classifier`` and
    :class:`~bcos_plugins.BWarmupCallback` refuse it; ``fine_tune_classifier(..., loss="ce")`` smooths the
    cross-entropy alone, asked for).
    """

    config_class = SpaceModelConfig
    base_model_prefix = "encoder"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    # the loss is a per-batch mean that never reads num_items_in_batch: forward's **kwargs (the encoder's own keywords)
    # made transformers' Trainer skip its division by the gradient accumulation steps (as BcosViT's did)
    accepts_loss_kwargs = False
    # fine_tune_classifier's loss="auto" trains it with the loss its forward computes (the cross-entropy plus the
    # inter- and intra-space terms its config weighs): the cross-entropy alone dropped those terms without a word
    trains_with_its_own_loss = True
    _supports_attention_backend = True
    _supports_sdpa = True

    def __init__(self, config: SpaceModelConfig, encoder: PreTrainedModel | None = None):
        if encoder is not None:
            require_base_encoder(encoder)
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
        require_base_encoder(encoder)
        refuse_unknown_config_keywords(config_kwargs)
        # The config's attention implementation propagates to the encoder's config (a sub-config): pass the
        # encoder's own, or the composite config would reset it.
        config_kwargs.setdefault("attn_implementation", encoder.config._attn_implementation or "sdpa")
        config = SpaceModelConfig(encoder_config=encoder.config, num_labels=num_labels, **config_kwargs)
        return cls(config, encoder=encoder)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        if isinstance(getattr(model.encoder.config, "bcos", None), dict):
            model._reconvert_bcos_encoder(args[0] if args else kwargs.get("pretrained_model_name_or_path"),
                                          kwargs.get("subfolder"), kwargs.get("variant"), kwargs)
        # Loading materialises fresh parameters, so the frozen/trainable setting is applied again.
        model._apply_train_encoder()
        return model

    def _reconvert_bcos_encoder(self, path, subfolder=None, variant=None, loading=None) -> None:
        """A B-cos encoder (``bcosify``) loads as its stock class: converted again as it was saved, then every saved
        tensor loaded into it, strictly (each layer's stored B too). Without it the reloaded model's forward refused
        its stock encoder and named ``load_bcos_model``, which refused the Space folder: it could not be reloaded.
        The files are those ``from_pretrained`` read (its ``subfolder``, ``variant`` and, for a hub id, the
        ``revision`` / cache options among ``loading``, its keywords): the top folder's plain save was loaded over them,
        so ``from_pretrained(folder, subfolder="checkpoint-5")`` or ``variant="fp16"`` returned the other save's model,
        silently."""
        from safetensors.torch import load_file

        from ..persistence import (
            checked_folder,
            hub_options,
            reconvert_stock_load,
            subfolder_path,
            weight_files,
        )

        if subfolder:
            path = subfolder_path(path, subfolder, reader=f"{type(self).__name__}.from_pretrained")
        files = weight_files(*checked_folder(path), variant, hub_options(loading or {}))
        reconvert_stock_load(self.encoder, os.fspath(path), files=files)
        # the encoder's weights sit under "encoder." in the Space save, where reconvert_stock_load reads no B: the
        # strict load sets each layer's stored B and refuses any tensor the conversion does not rebuild
        saved = {key: value for file in files for key, value in load_file(file).items()}
        self.load_state_dict(saved, strict=True)

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
        if (input_ids is None) == (inputs_embeds is None):
            raise argument_error("input_ids", "and inputs_embeds: pass exactly one of them",
                                 "Pass token ids (batch, pos) or embeddings (batch, pos, hidden)")
        if input_ids is not None:
            vocab_size, limit = vocabulary_size(self.encoder), position_limit(self.encoder)
            input_ids, attention_mask = require_token_batch(
                input_ids, attention_mask, vocab_size=vocab_size, max_length=limit.max_length,
                limit_name=limit.source, **unmasked_padding_keywords(self.encoder.config, attention_mask))
            batch = input_ids.shape[0]
        else:
            inputs_embeds = require_tensor("inputs_embeds", inputs_embeds, ndim=3, kind="float",
                                           shape_hint="(batch, pos, hidden)", list_dtype=self.encoder.dtype)
            batch = inputs_embeds.shape[0]
            if batch == 0 or inputs_embeds.shape[1] == 0:
                raise argument_error("inputs_embeds", f"is empty (shape {tuple(inputs_embeds.shape)})",
                                     "Pass at least one row of one position")
            if attention_mask is not None:
                _, attention_mask = require_token_batch(torch.ones(inputs_embeds.shape[:2], dtype=torch.long),
                                                        attention_mask, name="inputs_embeds")
        if labels is not None:
            # Checked before the encoder runs: torch's cross-entropy would fail with an opaque index error (or
            # silently skip -100) before the inter-space term could name the problem.
            labels = require_class_ids("labels", labels, batch, self.config.num_labels)
        # the encoder takes **kwargs and drops what it does not know: a typo would be silently ignored
        check_forward_kwargs(self.encoder, kwargs)
        if kwargs.get("return_dict", True) is not True:
            # it reached the encoder, whose tuple then failed on "'tuple' object has no attribute 'last_hidden_state'"
            raise argument_error("return_dict", f"got {kwargs['return_dict']!r}; the Space model returns a "
                                 "SpaceModelOutput", "Leave return_dict out; for a tuple call .to_tuple() on the output")
        encoder_kwargs = dict(kwargs)
        if "return_dict" in (forward_keywords(self.encoder) or ()):
            # the output object is read below: an encoder config's return_dict=False made it a tuple
            encoder_kwargs["return_dict"] = True
        if token_type_ids is not None:
            encoder_kwargs["token_type_ids"] = token_type_ids
        if attention_mask is not None and "position_ids" not in encoder_kwargs:
            # a learned position table counts from the first column: a left-padded row would run on other
            # positions than alone (a registry encoder is given the position ids explain gives it)
            encoder_spec = registry_spec(self.encoder)
            if encoder_spec is None:
                refuse_left_padding_shifting_positions(self.encoder, input_ids, attention_mask, role="encoder")
            else:
                check_first_column_is_real(self.encoder, attention_mask, encoder_spec)
                # the ids too: RoBERTa's table gives a real token of the padding id the padding row, as its forward does
                position_ids = position_ids_as_alone(self.encoder, encoder_spec, attention_mask, input_ids=input_ids)
                if position_ids is not None:
                    encoder_kwargs["position_ids"] = position_ids
        requested = self.requested_encoder_outputs(encoder_kwargs)
        encoded = self.encoder(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                               **encoder_kwargs)
        hidden = encoded.last_hidden_state
        extras = self.encoder_extras(encoded, requested)
        logits, concepts = self.head(hidden, attention_mask)
        loss = terms = None
        if labels is not None:
            loss, terms = self.space_loss(logits, concepts, labels, attention_mask)
        return SpaceModelOutput(loss=loss, logits=logits, concepts=concepts, last_hidden_state=hidden,
                                loss_terms=terms, **extras)

    # the output fields an encoder returns on request, each with the keyword that asks for it
    ENCODER_EXTRAS = {"hidden_states": "output_hidden_states", "attentions": "output_attentions"}

    def requested_encoder_outputs(self, encoder_kwargs: dict) -> list[str]:
        """The encoder outputs asked for (``ENCODER_EXTRAS``), by keyword or else by this model's or the encoder's
        config; a request made by this model's config is passed on to the encoder, whose own config does not
        see it (``SpaceModelConfig(output_hidden_states=True)`` left the encoder's at False: nothing came back)."""
        requested = []
        for field, keyword in self.ENCODER_EXTRAS.items():
            asked = encoder_kwargs.get(keyword)
            if asked is None:
                asked = bool(getattr(self.config, keyword, False) or getattr(self.encoder.config, keyword, False))
                if asked:
                    encoder_kwargs[keyword] = True
            if asked:
                requested.append(field)
        return requested

    def encoder_extras(self, encoded, requested: list[str]) -> dict:
        """The requested encoder outputs, for :class:`SpaceModelOutput` (they were dropped: the output had no field
        for them). One the encoder did not return is refused by name: sdpa attention, say, returns no attention
        weights (transformers gives an empty tuple with a log line)."""
        extras = {}
        for field in requested:
            value = getattr(encoded, field, None)
            if not value:
                keyword = self.ENCODER_EXTRAS[field]
                implementation = getattr(self.encoder.config, "_attn_implementation", None)
                fix = (f"Load the encoder with attn_implementation='eager' (it uses {implementation!r}, which returns "
                       "no attention weights)" if field == "attentions" else "Use an encoder that returns them")
                raise argument_error(keyword, f"asks for the encoder's {field}, but {type(self.encoder).__name__} "
                                     "returned none", fix)
            extras[field] = value
        return extras

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
        logits = require_tensor("logits", logits, ndim=2, kind="float", shape_hint="(batch, n_classes)")
        labels = require_class_ids("labels", labels, logits.shape[0], logits.shape[1])
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
