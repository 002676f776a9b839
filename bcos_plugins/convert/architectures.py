"""The architecture registry: every per-architecture fact the core and the host adapters need.

One :class:`ArchitectureSpec` per supported transformers class, in :data:`SPECS`. Everything that differs
between families lives here (or in a module a spec names): which projections are query/key, where the
combined embedding is, which head activations go, which modules are swapped for B-cos subclasses, the
model's position limit, which head the class has, and which host-library paths accept it (TransformerLens'
``HookedTransformer`` through the per-family converter module a spec names, the ``TransformerBridge``,
``dynamic_linear_copy``, masked-LM pretraining). The adapters derive their accept/refuse decisions from it,
so adding an architecture means adding its specs here (plus a TransformerLens converter module if
``HookedTransformer`` needs one) and its entry in ``tests/test_conformance.py`` (docs/design.md, "Adding an
architecture").

The core never imports an adapter: a spec names its TransformerLens converter by a module name
(``lens_conversion``) that ``bcos_plugins.adapters`` resolves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from torch import nn

from .._checks import stand_in_for_a_model
from ..errors import BcosTypeError, argument_error
from ..nn.dynamic import has_dynamic_weights

__all__ = ["ArchitectureSpec", "PositionLimit", "PositionTable", "REFUSED_ARCHITECTURES", "SPECS",
           "UnsupportedModuleError", "architecture_name", "check_stock_class", "position_limit", "refuse_stock_loaded_bcos",
           "spec_for", "specs_where", "stock_class", "supported_architectures", "uncompiled", "vocabulary_size"]


Head = Literal["base", "classifier", "causal_lm", "masked_lm"]


def _config_int(config, key: str) -> int | None:
    value = getattr(config, key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class PositionTable:
    """A learned position table of ``config.<size_key>`` rows. ``after_padding``: positions count from
    ``pad_token_id + 1`` (RoBERTa), so that many rows are never reached by real tokens."""

    size_key: str
    after_padding: bool = False

    def usable_rows(self, config) -> int | None:
        rows = _config_int(config, self.size_key)
        if rows is None or not self.after_padding:
            return rows
        return rows - (getattr(config, "pad_token_id", None) or 0) - 1

    @property
    def source(self) -> str:
        return f"config.{self.size_key}" + (" - pad_token_id - 1" if self.after_padding else "")


@dataclass(frozen=True)
class PositionLimit:
    """How many positions a model takes (:func:`position_limit`).

    Attributes:
        max_length: the longest input the model can run, the usable rows of its position table; every token
            check refuses longer inputs. ``None``: no table (rotary positions), or the model does not say.
        context: the number of positions the model was built for, the default and largest window of
            ``perplexity``: ``max_length`` for a position table, ``config.max_position_embeddings`` (``cfg.n_ctx``)
            for a rotary model, which runs longer inputs but on positions it was not trained on.
        source: where the model keeps ``max_length`` (``"config.n_positions"``, ``"cfg.n_ctx"``), named in errors.
    """

    max_length: int | None
    context: int | None
    source: str | None


# dynamic_linear_copy's refusals (a class's forward read in transformers 5: a non-linearity outside a module cannot be
# held constant, so explaining it would be wrong without an error)
_FORWARD_NOT_READ = ("its forward has not been checked for non-linearities applied outside a module (the classes "
                     "dynamic_linear_copy takes were)")
_GATED_INLINE = ("its gated MLP multiplies two input-dependent branches in its forward (act(gate) * up) and its "
                 "RMSNorm is no LayerNorm: neither can be held constant (bcosify converts both)")
_FUSED_QKV = ("its query, key and value come from one fused projection, {path}, whose output cannot be held "
              "constant for the query and key alone")


@dataclass(frozen=True)
class ArchitectureSpec:
    """How one transformers architecture is B-cosified, explained and handed to the host libraries.

    Attributes:
        kind: ``"encoder"`` (explain a class logit or a hidden unit) or ``"decoder"`` (next-token logits).
        base_prefix: attribute holding the base model in task models ("" for the base model itself).
        query_key: suffixes of projections that only feed attention scores, mapped to the part of their
            output that is query/key (``"all"`` or ``"first_two_thirds"`` for fused q|k|v projections).
        gate_units: suffixes of fused gated-MLP input projections mapped to the part of their output that only
            feeds the activated branch (``"first_half"``: ModernBERT's ``Wi``, whose ``act(input) * gate`` holds
            ``act(input)`` constant while explaining). Those units get the projection's ``constant_outputs``
            like query/key units: their gradient is 0 anyway, so the explaining backward leaves their rows out
            instead of multiplying zeros (``bcos_plugins.nn.functional.kept_unit_block``); listed in the conversion
            report's ``constant_gate_outputs``.
        embedding_point: (module path under the base model, ``"input"`` or ``"output"``): the tensor at
            which contributions are taken, i.e. word + position (+ token type) embeddings summed.
        head: ``"base"`` (hidden states), ``"classifier"`` (``logits`` of shape (batch, classes)),
            ``"causal_lm"`` (next-token logits from ``lm_head``) or ``"masked_lm"``.
        remove_activations: module paths of head activations replaced by ``nn.Identity``.
        class_swaps: module path ("" = the model) -> (B-cos subclass factory, reason).
        keep: module paths left unconverted, with the reason (``"{tied}"`` in it: whether the model's LM head is
            tied to its input embeddings, filled in by ``bcosify``'s report).
        module_swaps: module-path suffix -> (B-cos mixin factory, reason): modules whose forward multiplies
            two input-dependent branches (gated MLPs), swapped so that the gate branch is the detachable
            dynamic weight.
        position_table: the learned position table (inputs longer than its usable rows are refused); ``None``
            for rotary models, which have no table to run off. Read through :func:`position_limit`. Its positions
            are absolute, so the text paths pass position ids that count each row's real tokens
            (``bcos_plugins.attribution.text.model_call_kwargs``), or refuse left padding where the forward takes
            none (``check_first_column_is_real``).
        lens_conversion: name of the module under ``bcos_plugins.adapters._lens.conversions`` that converts
            this class to a TransformerLens 3.x ``HookedTransformer`` (``None``: not expressible there;
            ``hooked_transformer_from_hf`` refuses the class, naming the classes that have one).
        bridge: whether ``transformer_bridge_from_hf`` accepts this class (TransformerLens' bridge has an
            adapter for it and the bridged model computes the same logits, checked by the conformance test).
        dynamic_linear_refusal: why ``dynamic_linear_copy`` refuses the stock class (named in its error); ``None``:
            accepted (every non-linearity of its forward is a module that can be held constant).
        masked_lm_classifier: masked LMs only: the sequence-classifier class ``pretrain_masked_lm``'s encoder
            moves into (``None``: ``pretrain_masked_lm`` refuses the class).
        first_column_pooling: classifiers only: whether the head classifies from the first column's hidden state,
            a padding token's on a left-padded row, so the text paths, ``perturbation_curves``, ``predict`` and
            ``fine_tune_classifier`` refuse left padding there (:meth:`classifies_from_first_column`): ``True``
            always (BERT's pooler, DistilBERT's and RoBERTa's heads read ``[CLS]`` / ``<s>``), ``(config field,
            value)`` when the model's config has that value (ModernBERT's ``classifier_pooling="cls"``; its
            ``"mean"`` reads every real token), ``False`` never (decoders read each row's last real token).
    """

    kind: Literal["encoder", "decoder"]
    base_prefix: str
    query_key: dict[str, str]
    embedding_point: tuple[str, Literal["input", "output"]]
    head: Head = "base"
    gate_units: dict[str, str] = field(default_factory=dict)
    remove_activations: tuple[str, ...] = ()
    class_swaps: dict[str, tuple[Callable[[], type[nn.Module]], str]] = field(default_factory=dict)
    keep: dict[str, str] = field(default_factory=dict)
    module_swaps: dict[str, tuple[Callable[[], type[nn.Module]], str]] = field(default_factory=dict)
    position_table: PositionTable | None = None
    lens_conversion: str | None = None
    bridge: bool = False
    dynamic_linear_refusal: str | None = _FORWARD_NOT_READ
    masked_lm_classifier: str | None = None
    first_column_pooling: bool | tuple[str, object] = False

    @property
    def is_classifier(self) -> bool:
        """Whether the model has a classification head (``logits`` of shape (batch, classes))."""
        return self.head == "classifier"

    def classifies_from_first_column(self, config) -> bool:
        """Whether a classifier of this class with ``config`` reads its logits from the first column's hidden state
        (:attr:`first_column_pooling`)."""
        if isinstance(self.first_column_pooling, tuple):
            field_name, value = self.first_column_pooling
            return self.is_classifier and getattr(config, field_name, None) == value
        return self.is_classifier and self.first_column_pooling

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


def _fused_gated_mlp():
    from .decoder_modules import BcosFusedGatedMLP
    return BcosFusedGatedMLP


def _modernbert_attention():
    from .modernbert import BcosModernBertAttention
    return BcosModernBertAttention


def _gemma_rms_norm():
    from .gemma import BcosGemmaRMSNorm
    return BcosGemmaRMSNorm


def _soft_capped_head():
    from .gemma import BcosSoftCappedLMHead
    return BcosSoftCappedLMHead


def _uncapped_lm():
    from .gemma import BcosUncappedCausalLM
    return BcosUncappedCausalLM


_BERT_TABLE = PositionTable("max_position_embeddings")
_GPT2_TABLE = PositionTable("n_positions")
_ROBERTA_TABLE = PositionTable("max_position_embeddings", after_padding=True)


_BERT_QK = {"attention.self.query": "all", "attention.self.key": "all"}
_DISTIL_QK = {"attention.q_lin": "all", "attention.k_lin": "all"}
_GPT2_QK = {"attn.c_attn": "first_two_thirds"}
_GPT2_NOT_DYNAMIC = _FUSED_QKV.format(path="attn.c_attn (a Conv1D)")
_LLAMA_QK = {"self_attn.q_proj": "all", "self_attn.k_proj": "all"}
_MODERNBERT_QK = {"attn.Wqkv": "first_two_thirds"}
_MODERNBERT_GATE = {"mlp.Wi": "first_half"}  # Wi(x).chunk(2): act(input) * gate
# "{tied}": bcosify's report fills in whether the converted model's head is tied to its input embeddings
_LM_HEAD = "LM head {tied}; kept, as in the B-cos LM paper (it is linear and bias-free)"
_MLM_BIAS = ("masked-LM decoder applied without its vocabulary bias (a bias is no token's contribution); the "
             "transform's dense / GELU / LayerNorm are converted")
_GATED = ("gated MLP: the activated gate branch is the dynamic weight, so the product is not counted "
          "twice (product rule)")
_MODERNBERT_ATTENTION = ("attention: explaining, its query and key (a constant attention pattern) enter the rotary "
                         "embedding detached, so autograd does not differentiate it (Wqkv's constant units)")


def _llama_like(prefix: str, lens_conversion: str | None) -> dict[str, ArchitectureSpec]:
    """The three classes of a Llama-shaped decoder family (rotary positions, RMSNorm, gated MLP, q/k/v/o
    projections): ``{prefix}Model``, ``{prefix}ForCausalLM``, ``{prefix}ForSequenceClassification``."""
    gated = {"mlp": (_gated_mlp, _GATED)}
    common = dict(query_key=_LLAMA_QK, embedding_point=("embed_tokens", "output"), module_swaps=gated,
                  dynamic_linear_refusal=_GATED_INLINE)
    return {
        f"{prefix}Model": ArchitectureSpec("decoder", "", **common),
        f"{prefix}ForCausalLM": ArchitectureSpec("decoder", "model", head="causal_lm", keep={"lm_head": _LM_HEAD},
                                                 lens_conversion=lens_conversion, bridge=True, **common),
        f"{prefix}ForSequenceClassification": ArchitectureSpec("decoder", "model", head="classifier", **common),
    }


_GEMMA_NORM = ("Gemma RMSNorm x * rsqrt(mean(x^2) + eps) * (1 + weight): the rsqrt factor is the dynamic "
               "weight (the (1 + weight) gain is kept)")
_SOFT_CAP = ("LM head (weights kept, {tied}) with the final-logit soft-cap c * tanh(z / c) = z * g, g = tanh(z / c) / "
             "(z / c) the dynamic weight (config.final_logit_softcapping kept)")
_UNCAPPED = "forward without the inline final-logit soft-cap, which the LM head applies as a dynamic scale"


def _gemma2() -> dict[str, ArchitectureSpec]:
    """Gemma 2: Llama-shaped with GeGLU (gelu_tanh gate), an RMSNorm before and after attention and MLP whose
    gain is ``1 + weight``, scaled embeddings (the attribution point is after the scale), sliding-window
    layers and soft-capped attention scores (both only shape the attention pattern, a constant in explanation
    mode) and soft-capped final logits (a dynamic scale)."""
    norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm", "norm")
    swaps = {"mlp": (_gated_mlp, _GATED), **{n: (_gemma_rms_norm, _GEMMA_NORM) for n in norms}}
    refusal = f"{_GATED_INLINE}; it also soft-caps its attention scores with tanh inline (the causal LM its logits too)"
    common = dict(query_key=_LLAMA_QK, embedding_point=("embed_tokens", "output"), module_swaps=swaps,
                  dynamic_linear_refusal=refusal)
    return {
        "Gemma2Model": ArchitectureSpec("decoder", "", **common),
        "Gemma2ForCausalLM": ArchitectureSpec(
            "decoder", "model", head="causal_lm", class_swaps={"": (_uncapped_lm, _UNCAPPED)},
            lens_conversion="gemma2", bridge=True,
            **{**common, "module_swaps": {**swaps, "lm_head": (_soft_capped_head, _SOFT_CAP)}}),
        "Gemma2ForSequenceClassification": ArchitectureSpec("decoder", "model", head="classifier", **common),
    }


_BERT_POINT = ("embeddings.LayerNorm", "input")

SPECS: dict[str, ArchitectureSpec] = {
    "BertModel": ArchitectureSpec("encoder", "", _BERT_QK, _BERT_POINT, remove_activations=("pooler.activation",),
                                  position_table=_BERT_TABLE, dynamic_linear_refusal=None),
    "BertForSequenceClassification": ArchitectureSpec(
        "encoder", "bert", _BERT_QK, _BERT_POINT, head="classifier", remove_activations=("bert.pooler.activation",),
        position_table=_BERT_TABLE, dynamic_linear_refusal=None, first_column_pooling=True),
    "BertForMaskedLM": ArchitectureSpec(
        "encoder", "bert", _BERT_QK, _BERT_POINT, head="masked_lm", keep={"cls.predictions.decoder": _LM_HEAD},
        class_swaps={"cls.predictions": (_bert_mlm_head, _MLM_BIAS)}, position_table=_BERT_TABLE,
        masked_lm_classifier="BertForSequenceClassification", dynamic_linear_refusal=None),
    "DistilBertModel": ArchitectureSpec("encoder", "", _DISTIL_QK, _BERT_POINT,
                                        position_table=_BERT_TABLE, dynamic_linear_refusal=None),
    "DistilBertForSequenceClassification": ArchitectureSpec(
        "encoder", "distilbert", _DISTIL_QK, _BERT_POINT, head="classifier",
        class_swaps={"": (_distilbert_cls, "ReLU after pre_classifier removed")}, first_column_pooling=True,
        position_table=_BERT_TABLE, dynamic_linear_refusal="its forward applies ReLU to pre_classifier's output "
        "inline (nn.ReLU()(pooled_output)), where no module of the model can hold it constant"),
    "RobertaModel": ArchitectureSpec("encoder", "", _BERT_QK, _BERT_POINT, remove_activations=("pooler.activation",),
                                     position_table=_ROBERTA_TABLE, dynamic_linear_refusal=None),
    "RobertaForSequenceClassification": ArchitectureSpec(
        "encoder", "roberta", _BERT_QK, _BERT_POINT, head="classifier",
        class_swaps={"classifier": (_roberta_head, "tanh between dense and out_proj removed")},
        first_column_pooling=True, position_table=_ROBERTA_TABLE, dynamic_linear_refusal="its classifier applies "
        "tanh between dense and out_proj inline (torch.tanh), where no module can hold it constant"),
    "GPT2Model": ArchitectureSpec("decoder", "", _GPT2_QK, ("drop", "input"), position_table=_GPT2_TABLE,
                                  dynamic_linear_refusal=_GPT2_NOT_DYNAMIC),
    "GPT2LMHeadModel": ArchitectureSpec("decoder", "transformer", _GPT2_QK, ("drop", "input"), head="causal_lm",
                                        keep={"lm_head": _LM_HEAD}, position_table=_GPT2_TABLE,
                                        lens_conversion="gpt2", bridge=True, dynamic_linear_refusal=_GPT2_NOT_DYNAMIC),
    "GPT2ForSequenceClassification": ArchitectureSpec(
        "decoder", "transformer", _GPT2_QK, ("drop", "input"), head="classifier", position_table=_GPT2_TABLE,
        dynamic_linear_refusal=_GPT2_NOT_DYNAMIC),
    **_llama_like("Llama", lens_conversion="llama"),
    # Mistral: Llama's maths plus sliding-window attention, which only masks the (constant) attention pattern
    **_llama_like("Mistral", lens_conversion="mistral"),
    # Qwen2: biases on q/k/v (bcosify drops and reports them; kept with bcos_query_key=False for q/k)
    **_llama_like("Qwen2", lens_conversion="qwen2"),
    # Qwen3: RMSNorm on queries and keys (detachable norms like every RMSNorm; their inputs, the query/key
    # outputs, are constants in explanation mode anyway)
    **_llama_like("Qwen3", lens_conversion="qwen3"),
    **_gemma2(),
    # ModernBERT: rotary positions (no table), fused q|k|v, GeGLU with a fused input|gate projection,
    # alternating local/global attention (a mask on the constant pattern), bias-free LayerNorms
    **{name: ArchitectureSpec("encoder", prefix, _MODERNBERT_QK, ("embeddings.norm", "input"), head=head,
                              gate_units=_MODERNBERT_GATE,
                              module_swaps={"mlp": (_fused_gated_mlp, _GATED),
                                            "attn": (_modernbert_attention, _MODERNBERT_ATTENTION)},
                              first_column_pooling=("classifier_pooling", "cls") if head == "classifier" else False,
                              dynamic_linear_refusal=f"{_FUSED_QKV.format(path='attn.Wqkv')}, and its GeGLU "
                              "multiplies two input-dependent branches in its forward (act(input) * gate)")
       for name, prefix, head in (("ModernBertModel", "", "base"),
                                  ("ModernBertForSequenceClassification", "model", "classifier"))},
}

# Classes people ask for that bcosify refuses, with the reason (named in the error instead of a bare "not
# supported"). A class is either fully supported (a spec above that passes the conformance suite) or here.
REFUSED_ARCHITECTURES: dict[str, str] = {
    "Gemma2ForTokenClassification": ("Gemma2ForTokenClassification is not supported (no token-classification "
                                     "head is in the registry); Gemma2Model, Gemma2ForCausalLM and "
                                     "Gemma2ForSequenceClassification are."),
    "ModernBertForMaskedLM": ("ModernBertForMaskedLM is not supported yet (its decoder adds a vocabulary bias "
                              "and no B-cos masked-LM head exists for it); ModernBertModel and "
                              "ModernBertForSequenceClassification are."),
}


def specs_where(predicate: Callable[[ArchitectureSpec], bool]) -> tuple[str, ...]:
    """The names of the registered classes whose spec satisfies ``predicate``, in registry order (for the
    adapters' lists and messages: families in the order they were added, a family's classes together)."""
    return tuple(name for name, spec in SPECS.items() if predicate(spec))


class UnsupportedModuleError(BcosTypeError):
    """A module ``bcosify`` cannot make bias-free and dynamic-weight (defined with the registry that refuses
    models, so that the registry and ``bcosify`` do not import each other)."""


def uncompiled(model):
    """The module ``torch.compile(model)`` wraps (an ``OptimizedModule``'s ``_orig_mod``), else ``model`` itself:
    the one reading through the wrapper of everything that inspects a model's class or forward signature (the
    wrapper's class is torch's and its forward takes ``(*args, **kwargs)``), so a compiled model is looked up, and
    called, as the model it compiles. The call itself still goes through the wrapper."""
    # torch._dynamo is imported by torch.compile: a model is no OptimizedModule while it is not (nor imported here)
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        return model._orig_mod
    return model


def architecture_name(model: nn.Module) -> str:
    """The transformers class a (possibly B-cosified, possibly compiled: :func:`uncompiled`) model was built as:
    ``config.bcos["architecture"]`` for converted models (bcosify may swap the class for a B-cos subclass), else the
    class name."""
    model = uncompiled(model)
    bcos = getattr(getattr(model, "config", None), "bcos", None)
    return bcos["architecture"] if isinstance(bcos, dict) and "architecture" in bcos else type(model).__name__


def unsupported_message(model: nn.Module, name: str, what: str = "bcosify") -> str:
    stand_in = stand_in_for_a_model(model)  # a tokenizer, the ids, a pipeline, a PEFT model: named, with the fix
    if stand_in is not None:
        return f"model: {stand_in}."
    where = f"{type(model).__module__}.{type(model).__qualname__}"
    if name in REFUSED_ARCHITECTURES:
        return f"model: {where} is not supported by {what}: {REFUSED_ARCHITECTURES[name]}"
    inner = getattr(model, "module", None)  # nn.DataParallel / DistributedDataParallel hold the model they run here
    if isinstance(inner, nn.Module) and inner is not model:
        return (f"model: {where} is a wrapper around {type(inner).__name__}, which {what} does not read through. "
                f"Pass the wrapped model itself (model.module).")
    return (f"model: {where} is not supported by {what}. Pass one of the transformers classes "
            f"{', '.join(supported_architectures())}.")


def supported_architectures() -> list[str]:
    """The transformers class names ``bcosify`` converts (and ``explain``, the adapters and ``load_bcos_model``
    take), sorted: e.g. ``"BertForSequenceClassification"``, ``"LlamaForCausalLM"``. Any other class is refused
    with an :class:`~bcos_plugins.convert.UnsupportedModuleError` that lists them."""
    return sorted(SPECS)


def stock_class(name: str) -> type[nn.Module]:
    """The transformers class a spec of :data:`SPECS` describes (``"BertModel"`` -> ``transformers.BertModel``)."""
    import transformers

    return getattr(transformers, name)


def refuse_stock_loaded_bcos(model: nn.Module, argument: str = "model") -> None:
    """Refuse a B-cos checkpoint loaded with plain transformers (``config.bcos`` but stock modules): it runs the
    stock model, so its logits, predictions, metrics and explanations are a conventional model's (``predict`` gave
    them, and ``perplexity`` scored them, silently)."""
    record = getattr(getattr(model, "config", None), "bcos", None)
    if isinstance(record, dict) and not has_dynamic_weights(model):
        # loaded as another class than the one saved (a B-cos LlamaForCausalLM as a LlamaModel): named too
        saved = record.get("architecture")
        of = f", of a B-cos {saved}" if isinstance(saved, str) and saved != type(model).__name__ else ""
        raise BcosTypeError(
            f"{argument}: {type(model).__name__} has B-cos settings in its config (config.bcos{of}) but no B-cos "
            "modules: it was saved from a B-cos model and loaded with plain transformers, so it runs the stock model. "
            "Load it with bcos_plugins.load_bcos_model(path)."
        )


def spec_for(model: nn.Module) -> ArchitectureSpec:
    """The spec of a (possibly already B-cosified) model, or a clear error.

    The model's real class is checked, not its name: a spec describes the forward pass of one transformers
    class, and a subclass (or a copy under the same name) may compute something else, which would be
    explained incompletely without any error. A ``torch.compile(model)`` wrapper is read through
    (:func:`uncompiled`): it runs the model's own forward.
    """
    model = uncompiled(model)
    bcos = getattr(getattr(model, "config", None), "bcos", None)
    converted = isinstance(bcos, dict) and "architecture" in bcos
    name = architecture_name(model)
    if name not in SPECS:
        raise UnsupportedModuleError(unsupported_message(model, name))
    if converted and not isinstance(model, stock_class(name)):
        # a B-cos save loaded with plain transformers as another class (a B-cos LlamaForCausalLM as a LlamaModel) was
        # refused below as "a bare LlamaModel ... pass the LlamaForCausalLM itself", which is not the cause
        refuse_stock_loaded_bcos(model)
    # bcosify swaps some classes for B-cos subclasses of the stock class (heads.py), hence isinstance after
    # conversion; bcosify itself checks the class by identity before converting.
    check_stock_class(model, name, exact=not converted)
    return SPECS[name]


def position_limit(model: nn.Module) -> PositionLimit:
    """How many positions ``model`` takes: the one reading of a model's position limit, used by every token check
    (``explain``, Captum's ``EmbeddingForward``, the TransformerLens adapter, the Space model,
    ``next_token_contrast``) and by ``perplexity``'s windows.

    - A class in the registry (stock or B-cos): its spec's ``position_table``: ``config.max_position_embeddings``
      (BERT, DistilBERT), ``config.n_positions`` (GPT-2), ``config.max_position_embeddings - pad_token_id - 1``
      (RoBERTa, whose positions count from the padding index). Rotary families (Llama, Mistral, Qwen2, Qwen3,
      Gemma 2, ModernBERT) have no table: ``max_length`` is ``None`` (no input is refused for its length) and
      ``context`` is ``config.max_position_embeddings``.
    - A TransformerLens model (a ``cfg`` with ``n_ctx``): ``cfg.n_ctx``. A ``HookedTransformer`` cannot run
      past it, rotary or not (its rotary angles are a table of ``n_ctx`` rows); a ``TransformerBridge`` runs the
      transformers model it wraps (``original_model``), so a rotary one (``cfg.positional_embedding_type``
      ``"rotary"`` or missing) has ``max_length`` ``None``.
    - Any other transformers model (a stock class outside the registry, e.g. ``BertLMHeadModel`` for
      ``perplexity`` or an encoder under the Space head): ``config.n_positions``, else
      ``config.max_position_embeddings``, less ``pad_token_id + 1`` when its position embedding has a padding
      index (RoBERTa-style tables), rotary or not (outside the registry the package cannot tell); ``None``
      where the config has neither.
    - A wrapper whose body (``base_model``) keeps a configuration of its own (a Space model's ``encoder``): the
      body's limit, its ``source`` named through the wrapper (``"encoder.config.max_position_embeddings"``).
    """
    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "n_ctx"):  # checked first: a bridge forwards .config to the HF model
        unlimited = (getattr(model, "original_model", None) is not None
                     and getattr(cfg, "positional_embedding_type", "rotary") == "rotary")
        n_ctx = _config_int(cfg, "n_ctx")
        return PositionLimit(None if unlimited else n_ctx, n_ctx, None if unlimited else "cfg.n_ctx")
    config = getattr(model, "config", None)
    body = getattr(model, "base_model", model)
    if isinstance(body, nn.Module) and body is not model and getattr(body, "config", config) is not config:
        # the wrapper's own configuration does not describe the positions (a Space model's holds the head's
        # fields): only the body's does, so reading the wrapper's would report no limit at all
        limit = position_limit(body)
        prefix = getattr(model, "base_model_prefix", "") or "base_model"
        return limit if limit.source is None else replace(limit, source=f"{prefix}.{limit.source}")
    name = architecture_name(model)
    if name in SPECS:
        table = SPECS[name].position_table
        if table is None:
            return PositionLimit(None, _config_int(config, "max_position_embeddings"), None)
    elif _config_int(config, "n_positions") is not None:
        table = PositionTable("n_positions")
    else:
        base = getattr(model, "base_model", model)
        embedding = getattr(getattr(base, "embeddings", None), "position_embeddings", None)
        table = PositionTable("max_position_embeddings",
                              after_padding=getattr(embedding, "padding_idx", None) is not None)
    rows = table.usable_rows(config)
    return PositionLimit(rows, rows, None if rows is None else table.source)


def require_max_length_fits(model: nn.Module, max_length: int) -> None:
    """Refuse a truncation length ``max_length`` longer than ``model``'s position limit (:func:`position_limit`): the
    one check of :func:`~bcos_plugins.encoded_texts.truncation_length`, ``train_causal_lm`` and ``explain_dataset``."""
    limit = position_limit(model)
    if limit.max_length is not None and max_length > limit.max_length:
        raise argument_error("max_length", f"is {max_length} but {type(model).__name__} takes at most "
                             f"{limit.max_length} positions ({limit.source}, its position table)",
                             f"Pass max_length={limit.max_length} or less (longer texts are then truncated to it)")


def vocabulary_size(model: nn.Module) -> int | None:
    """How many token ids ``model`` reads (ids lie in ``[0, vocabulary_size(model))``): the one reading of a
    model's vocabulary, used by every token check (``explain``, Captum's ``EmbeddingForward``, the TransformerLens
    adapter, the Space model, ``next_token_contrast``, ``perplexity``, ``explain_dataset``'s tokenizer check, the
    training entry points).

    An id indexes the rows of the input embedding, so those rows are read first, ahead of what the configuration
    says: where the two disagree (an embedding swapped with ``set_input_embeddings``, a configuration edited or
    saved out of step with its weights, a checkpoint whose embedding was padded past its tokenizer's count), the
    rows are what the model can look up; ids past them fail deep in the embedding (a device-side assert on a
    GPU), and ids below them are real tokens a smaller ``config.vocab_size`` would refuse.

    - A transformers model (stock or B-cos, a Space model, a TransformerLens ``TransformerBridge``, which hands
      out its transformers model's embedding): rows of ``get_input_embeddings()`` (``num_embeddings``).
    - A TransformerLens ``HookedTransformer``: rows of ``W_E`` (``cfg.d_vocab`` when it was built).
    - Otherwise ``cfg.d_vocab``, else ``config.vocab_size``; ``None`` where the model says neither (no id is
      refused).
    """
    rows = None
    if callable(getattr(model, "get_input_embeddings", None)):
        try:
            rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
        except NotImplementedError:  # transformers' default when a class does not say where its embedding is
            rows = None
    if isinstance(rows, int) and not isinstance(rows, bool):
        return rows
    embedding_matrix = getattr(model, "W_E", None)  # HookedTransformer: (d_vocab, d_model)
    if getattr(embedding_matrix, "ndim", None) == 2:
        return int(embedding_matrix.shape[0])
    d_vocab = _config_int(getattr(model, "cfg", None), "d_vocab")
    return d_vocab if d_vocab is not None else _config_int(getattr(model, "config", None), "vocab_size")


def _is_bare_transformer_of(model: nn.Module, cls: type) -> bool:
    """Whether ``model`` is the body (``cls.base_model_prefix``) of a ``cls`` rather than a ``cls``: the same
    family's pre-trained base class, and no head of its own (it is its own ``base_model``)."""
    family = next((c for c in cls.__mro__[1:] if c.__name__.endswith("PreTrainedModel")), None)
    return (family is not None and isinstance(model, family) and not isinstance(model, cls)
            and getattr(model, "base_model", None) is model)


def check_stock_class(model: nn.Module, name: str, *, exact: bool) -> None:
    """Refuse a model that is not transformers' ``name`` (``exact``: not that very class, no subclass)."""
    cls = stock_class(name)
    if (type(model) is not cls) if exact else not isinstance(model, cls):
        if uncompiled(model) is not model:
            raise UnsupportedModuleError(
                f"model: a torch.compile wrapper of {type(uncompiled(model)).__name__}; bcosify converts the model's "
                "own modules, which the compiled graph would not see. bcosify first, then compile: "
                "torch.compile(bcosify(model, ...)) (explain, predict and the metrics read through the wrapper)."
            )
        inner = getattr(cls, "base_model_prefix", "")
        if inner and _is_bare_transformer_of(model, cls):
            raise UnsupportedModuleError(
                f"model: a bare {type(model).__name__} (the .{inner} of a {name}, the class its config names); "
                f"bcosify and explain work on the whole {name}, head included. Pass the {name} itself: "
                f"explain(lm, ...), not explain(lm.{inner}, ...)."
            )
        raise UnsupportedModuleError(
            f"model: {type(model).__module__}.{type(model).__qualname__} is not transformers' {name} (a "
            f"subclass or a class of the same name); bcosify knows the forward pass of transformers' {name} "
            f"only, and another forward would be explained incompletely. Build transformers.{name} itself, "
            "or convert your own forward by hand with the layers of bcos_plugins.nn."
        )
