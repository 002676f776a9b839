"""Per-architecture facts ``bcosify`` and ``explain`` need: which projections are query/key, where the
combined embedding is, which head activations go, which modules stay.

One :class:`ArchitectureSpec` per supported transformers class. Adding an architecture means adding a
spec here (and, if its forward applies an activation inline, a subclass in ``heads.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

__all__ = ["ArchitectureSpec", "SPECS", "check_stock_class", "spec_for", "stock_class", "supported_architectures"]


@dataclass(frozen=True)
class ArchitectureSpec:
    """How one transformers architecture is B-cosified and explained.

    Attributes:
        kind: ``"encoder"`` (explain a class logit or a hidden unit) or ``"decoder"`` (next-token logits).
        base_prefix: attribute holding the base model in task models ("" for the base model itself).
        query_key: suffixes of projections that only feed attention scores, mapped to the part of their
            output that is query/key (``"all"`` or ``"first_two_thirds"`` for fused q|k|v projections).
        embedding_point: (module path under the base model, ``"input"`` or ``"output"``): the tensor at
            which contributions are taken, i.e. word + position (+ token type) embeddings summed.
        remove_activations: module paths of head activations replaced by ``nn.Identity``.
        class_swaps: module path ("" = the model) -> (B-cos subclass factory, reason).
        keep: module paths left unconverted, with the reason.
        is_classifier: whether the model has a classification head (``logits`` of shape (batch, classes)).
    """

    kind: Literal["encoder", "decoder"]
    base_prefix: str
    query_key: dict[str, str]
    embedding_point: tuple[str, Literal["input", "output"]]
    is_classifier: bool = False
    remove_activations: tuple[str, ...] = ()
    class_swaps: dict[str, tuple[Callable[[], type[nn.Module]], str]] = field(default_factory=dict)
    keep: dict[str, str] = field(default_factory=dict)
    module_swaps: dict[str, tuple[Callable[[], type[nn.Module]], str]] = field(default_factory=dict)

    def base_model(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.base_prefix) if self.base_prefix else model

    def embedding_module(self, model: nn.Module) -> tuple[nn.Module, str]:
        path, where = self.embedding_point
        return self.base_model(model).get_submodule(path), where


def _roberta_head():
    from .heads import BcosRobertaClassificationHead
    return BcosRobertaClassificationHead


def _distilbert_cls():
    from .heads import BcosDistilBertForSequenceClassification
    return BcosDistilBertForSequenceClassification


def _bert_mlm_head():
    from .mlm_heads import BcosBertLMPredictionHead
    return BcosBertLMPredictionHead


def _gated_mlp():
    from .decoder_modules import BcosGatedMLP
    return BcosGatedMLP


_BERT_QK = {"attention.self.query": "all", "attention.self.key": "all"}
_DISTIL_QK = {"attention.q_lin": "all", "attention.k_lin": "all"}
_GPT2_QK = {"attn.c_attn": "first_two_thirds"}
_LLAMA_QK = {"self_attn.q_proj": "all", "self_attn.k_proj": "all"}
_TIED = "LM head tied to the input embeddings; kept, as in the B-cos LM paper (it is linear and bias-free)"
_MLM_BIAS = ("masked-LM decoder applied without its vocabulary bias (a bias is no token's contribution); the "
             "transform's dense / GELU / LayerNorm are converted")
_GATED = ("gated MLP: the activated gate branch is the dynamic weight, so the product is not counted "
          "twice (product rule)")

SPECS: dict[str, ArchitectureSpec] = {
    "BertModel": ArchitectureSpec("encoder", "", _BERT_QK, ("embeddings.LayerNorm", "input"),
                                  remove_activations=("pooler.activation",)),
    "BertForSequenceClassification": ArchitectureSpec(
        "encoder", "bert", _BERT_QK, ("embeddings.LayerNorm", "input"), is_classifier=True,
        remove_activations=("bert.pooler.activation",)),
    "BertForMaskedLM": ArchitectureSpec(
        "encoder", "bert", _BERT_QK, ("embeddings.LayerNorm", "input"), keep={"cls.predictions.decoder": _TIED},
        class_swaps={"cls.predictions": (_bert_mlm_head, _MLM_BIAS)}),
    "DistilBertModel": ArchitectureSpec("encoder", "", _DISTIL_QK, ("embeddings.LayerNorm", "input")),
    "DistilBertForSequenceClassification": ArchitectureSpec(
        "encoder", "distilbert", _DISTIL_QK, ("embeddings.LayerNorm", "input"), is_classifier=True,
        class_swaps={"": (_distilbert_cls, "ReLU after pre_classifier removed")}),
    "RobertaModel": ArchitectureSpec("encoder", "", _BERT_QK, ("embeddings.LayerNorm", "input"),
                                     remove_activations=("pooler.activation",)),
    "RobertaForSequenceClassification": ArchitectureSpec(
        "encoder", "roberta", _BERT_QK, ("embeddings.LayerNorm", "input"), is_classifier=True,
        class_swaps={"classifier": (_roberta_head, "tanh between dense and out_proj removed")}),
    "GPT2Model": ArchitectureSpec("decoder", "", _GPT2_QK, ("drop", "input")),
    "GPT2LMHeadModel": ArchitectureSpec("decoder", "transformer", _GPT2_QK, ("drop", "input"),
                                        keep={"lm_head": _TIED}),
    "GPT2ForSequenceClassification": ArchitectureSpec(
        "decoder", "transformer", _GPT2_QK, ("drop", "input"), is_classifier=True),
    "LlamaModel": ArchitectureSpec("decoder", "", _LLAMA_QK, ("embed_tokens", "output"),
                                   module_swaps={"mlp": (_gated_mlp, _GATED)}),
    "LlamaForCausalLM": ArchitectureSpec("decoder", "model", _LLAMA_QK, ("embed_tokens", "output"),
                                         keep={"lm_head": _TIED.replace("tied to the input embeddings",
                                                                        "(tied or not)")},
                                         module_swaps={"mlp": (_gated_mlp, _GATED)}),
    "LlamaForSequenceClassification": ArchitectureSpec(
        "decoder", "model", _LLAMA_QK, ("embed_tokens", "output"), is_classifier=True,
        module_swaps={"mlp": (_gated_mlp, _GATED)}),
}


def supported_architectures() -> list[str]:
    return sorted(SPECS)


def stock_class(name: str) -> type[nn.Module]:
    """The transformers class a spec of :data:`SPECS` describes (``"BertModel"`` -> ``transformers.BertModel``)."""
    import transformers

    return getattr(transformers, name)


def spec_for(model: nn.Module) -> ArchitectureSpec:
    """The spec of a (possibly already B-cosified) model, or a clear error.

    The model's real class is checked, not its name: a spec describes the forward pass of one transformers
    class, and a subclass (or a copy under the same name) may compute something else, which would be
    explained incompletely without any error.
    """
    from .bcosify import UnsupportedModuleError

    bcos = getattr(getattr(model, "config", None), "bcos", None)
    converted = isinstance(bcos, dict) and "architecture" in bcos
    name = bcos["architecture"] if converted else type(model).__name__
    if name not in SPECS:
        raise UnsupportedModuleError(
            f"model: {type(model).__module__}.{type(model).__qualname__} is not supported by bcosify. Pass "
            f"one of the transformers classes {', '.join(supported_architectures())}."
        )
    # bcosify swaps some classes for B-cos subclasses of the stock class (heads.py), hence isinstance after
    # conversion; bcosify itself checks the class by identity before converting.
    check_stock_class(model, name, exact=not converted)
    return SPECS[name]


def check_stock_class(model: nn.Module, name: str, *, exact: bool) -> None:
    """Refuse a model that is not transformers' ``name`` (``exact``: not that very class, no subclass)."""
    from .bcosify import UnsupportedModuleError

    cls = stock_class(name)
    if (type(model) is not cls) if exact else not isinstance(model, cls):
        raise UnsupportedModuleError(
            f"model: {type(model).__module__}.{type(model).__qualname__} is not transformers' {name} (a "
            f"subclass or a class of the same name); bcosify knows the forward pass of transformers' {name} "
            f"only, and another forward would be explained incompletely. Build transformers.{name} itself, "
            "or convert your own forward by hand with the layers of bcos_plugins.nn."
        )
