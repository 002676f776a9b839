"""Captum adapter: B-cos explanations as Captum attribution methods.

B-cos explanations are input x gradient inside :func:`~bcos_plugins.nn.explanation_mode`
(docs/design.md#one-explanation-mechanism). The classes here translate Captum's calling conventions to the
attribution core (:mod:`bcos_plugins.attribution`) and hold no maths of their own:

- :class:`BcosAttribution` (a ``captum.attr.GradientAttribution``, read it next to Captum's
  ``InputXGradient``): attributions ``W(x) x`` at the inputs of ``forward_func``, computed by the core's
  :func:`~bcos_plugins.attribution.input_x_gradient`. ``forward_func`` may be any function of tensors (the
  thread-wide explanation mode holds every B-cos module it runs through constant, and a function that ran
  through none is refused); the attributions are complete when the output is a function of the inputs alone. A
  transformers text model called with ``inputs_embeds=e`` is not: BERT-family models add position and token-type
  embeddings after ``e``, GPT-2 position embeddings, so attribute at the combined embedding with
  :class:`EmbeddingForward` (a call whose attributions miss part of the output warns and names it). ``delta``
  (``return_convergence_delta=True``) is the core's ``Explanation.delta``: ``sum(attributions) - explained``.
- :class:`LayerBcos` (a ``captum.attr.LayerGradientXActivation``): the same at a layer's input or output, or
  at several layers (a list, as Captum's layer methods take). Default layer: the model's attribution point
  (:func:`~bcos_plugins.attribution.text_attribution_point`). It is accepted by
  ``captum.attr.LLMGradientAttribution``; that workflow explains the *log-probability* of each target token,
  which B-cos does not decompose exactly (use :class:`BcosAttribution` with an :class:`EmbeddingForward` to
  explain a logit exactly).
- :class:`EmbeddingForward`: a transformers text model as a function of the tensor at its attribution point,
  so that every Captum method (B-cos, IxG, IG, Saliency, Occlusion, ...) attributes at the same place.
- :func:`visualization_records` and :func:`records_to_html`: Captum ``VisualizationDataRecord`` objects from
  a :class:`~bcos_plugins.attribution.TokenExplanation` (or any token scores), and a self-contained HTML page for them
  that does not need IPython (Captum's ``visualize_text`` returns an IPython display object).

Both classes work under ``captum.attr.NoiseTunnel`` and in ``captum.metrics.infidelity`` /
``sensitivity_max``. A model passed as ``forward_func`` or ``model=`` is checked to hold B-cos modules when
the method is built, and put in eval mode for each call; a plain function is checked on each call.

Examples:
    >>> import torch
    >>> from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward
    >>> fwd = EmbeddingForward(bcos_model)
    >>> emb = fwd.embed(input_ids, attention_mask)
    >>> attr, delta = BcosAttribution(fwd).attribute(emb, target=1, additional_forward_args=(attention_mask,),
    ...                                              return_convergence_delta=True)
    >>> logits = bcos_model(input_ids=input_ids, attention_mask=attention_mask).logits
    >>> torch.allclose(attr.sum(dim=(1, 2)), logits[:, 1], atol=1e-5)      # complete: the class-1 logits
    True
    >>> bool(delta.abs().max() < 1e-5)
    True
"""

from __future__ import annotations

import functools
import html as _html
import inspect
import numbers
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from bcos_plugins.adapters._captum_private import CaptumInternals, TargetType, VisualizationDataRecord
from bcos_plugins.adapters._completeness import warn_if_incomplete
from captum.attr import GradientAttribution, LayerGradientXActivation, LLMGradientAttribution, NoiseTunnel
from captum.log import log_usage
from jaxtyping import Float, Int
from torch import Tensor, nn

from bcos_plugins._checks import (
    bad_rows,
    refuse_other_methods_keywords,
    refuse_renamed_keywords,
    require_bool,
    require_label_names,
    require_model_object,
    require_row_ids,
    token_batch_and_padding,
)
from bcos_plugins.attribution import (
    Direction,
    Explanation,
    TokenExplanation,
    as_leaf,
    has_dynamic_weights,
    input_x_gradient,
    resolve_positions,
    text_attribution_point,
)
from bcos_plugins.attribution.gradient import non_finite_step, outside_inference, refuse_non_finite_step
from bcos_plugins.attribution.text import (
    check_token_inputs,
    explained_positions,
    forward_parameters,
    non_finite_embedding_cause,
    padded_float64_nan_cause,
    require_head_output_object,
    rows_as_alone_call,
    token_inputs_and_padding,
)
from bcos_plugins.convert.architectures import ArchitectureSpec, spec_for, uncompiled
from bcos_plugins.errors import BcosRuntimeError, BcosTypeError, BcosValueError, argument_error
from bcos_plugins.explain import recording_forward_autocast
from bcos_plugins.nn.dynamic import (
    dynamic_weights_used,
    evaluating,
    explanation_mode,
    is_explaining,
    thread_token,
)
from bcos_plugins.nn.functional import at_least_float32
from bcos_plugins.visualize import (
    explained_token_index,
    explanation_tokens,
    require_token_explanation,
    shown_tokens,
)

__all__ = [
    "BcosAttribution",
    "EmbeddingForward",
    "LayerBcos",
    "records_to_html",
    "save_records_html",
    "visualization_records",
]


# ------------------------------------------------------------------------------------ explanation mode


def _checked_model(forward_func: Callable, model: nn.Module | None, who: str) -> nn.Module | None:
    """The model to hold in eval mode during calls (``model=``, or ``forward_func`` if it is a module), checked
    to contain B-cos modules; ``None`` for a plain function (then each call checks what it ran through)."""
    name = "model"
    if model is None and isinstance(forward_func, nn.Module):
        model, name = forward_func, "forward_func"
    if isinstance(model, EmbeddingForward):
        # eval/train must be switched on the wrapped model: the wrapper's flag would overwrite it on exit
        model = model.model
    if model is None:
        return None
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"expected the torch module forward_func runs through, got "
                             f"{type(model).__name__}", "Pass the B-cos model, or leave model out",
                             kind=BcosTypeError)
    if not has_dynamic_weights(model):
        raise argument_error(
            name, f"{type(model).__name__} has no B-cos (dynamic-weight) modules, so its input x gradient is not an "
            "exact W(x)x explanation",
            "Convert it with bcos_plugins.bcosify(model) and fine-tune it, or use captum.attr.InputXGradient for "
            "plain input x gradient on a conventional model", kind=BcosTypeError)
    return model


_training_modules_seen = threading.local()


def _random_in_training(module: nn.Module) -> bool:
    """Whether ``module`` computes differently (randomly, or from batch statistics) in training mode: a dropout or
    batch norm, or a transformers attention that applies functional dropout with a rate it holds."""
    if isinstance(module, nn.modules.dropout._DropoutNd | nn.modules.batchnorm._BatchNorm):
        return getattr(module, "p", 1.0) > 0
    if any(isinstance(c, nn.modules.dropout._DropoutNd) and c.p > 0 for c in module.children()):
        return True
    return any(isinstance(getattr(module, a, None), float) and getattr(module, a) > 0
               for a in ("attention_dropout", "dropout_prob"))


def _note_training_module(module: nn.Module, args) -> None:
    seen = getattr(_training_modules_seen, "names", None)
    if seen is not None and not seen and module.training and _random_in_training(module):
        seen.append(type(module).__name__)
    compiled = getattr(_training_modules_seen, "compiled_bcos", None)
    # a torch.compile wrapper is called in Python; its model's B-cos modules run inside the compiled graph, where
    # dynamic_weights_used() does not count them (the thread-wide explanation mode still holds their weights constant)
    if compiled is not None and not compiled and uncompiled(module) is not module and has_dynamic_weights(module):
        compiled.append(type(uncompiled(module)).__name__)


@contextmanager
def _explaining(who: str, model: nn.Module | None) -> Iterator[None]:
    """Around one attribution call: ``model`` in eval mode, and afterwards the checks that the call explained
    a B-cos computation (it ran through dynamic-weight modules) and a deterministic one (no module in
    training mode: dropout would make the explained function random; the thread-wide explanation mode cannot
    switch it off for a plain function)."""
    used_before = dynamic_weights_used()
    outer = getattr(_training_modules_seen, "names", None)  # a call nested in another one (e.g. a metric)
    outer_compiled = getattr(_training_modules_seen, "compiled_bcos", None)
    training: list[str] = []
    compiled_bcos: list[str] = []
    _training_modules_seen.names = training
    _training_modules_seen.compiled_bcos = compiled_bcos
    # global hooks see every thread's modules; only this thread's list is set, so only its calls are noted
    handle = torch.nn.modules.module.register_module_forward_pre_hook(_note_training_module)
    # evaluating: a model already wholly in eval mode is not walked by eval() / train() (435 us per call on a 2-layer
    # Qwen2; docs/benchmarks.md, 2026-11-28 05:12 UTC), and afterwards every module has its own training flag back
    try:
        with evaluating(model) if model is not None else nullcontext():
            yield
    finally:
        handle.remove()
        _training_modules_seen.names = outer
        _training_modules_seen.compiled_bcos = outer_compiled
    if training:
        raise argument_error("forward_func", f"ran {training[0]} in training mode, where dropout makes the "
                             "explained function random", "Call model.eval() before attributing",
                             kind=BcosRuntimeError)
    if dynamic_weights_used() == used_before and not compiled_bcos and not (model is not None
                                                                           and is_explaining(model)):
        raise argument_error(
            "forward_func", f"{who} ran it, but it ran through no B-cos (dynamic-weight) module, so input x "
            "gradient of it is not an exact W(x)x explanation",
            "Pass a function that calls a B-cos model (bcos_plugins.bcosify), or use captum.attr.InputXGradient "
            "for a conventional model", kind=BcosTypeError)


def _delta(attributions: Sequence[Tensor], explained: Tensor) -> Float[Tensor, " batch"]:
    """The core's signed completeness difference ``sum(attributions) - explained`` per example."""
    batch = explained.shape[0]
    flat = torch.cat([a.reshape(batch, -1) for a in attributions], dim=1)
    return Explanation(contributions=flat, input_contributions=flat, explained=explained, target=None).delta


def _check_target(target: TargetType, output) -> None:
    """Captum's target forms checked against the output they index, before Captum indexes with them (it would
    raise from inside torch, or count a negative index from the end)."""
    if target is None or not isinstance(output, Tensor) or output.ndim < 2:
        return
    shape = tuple(output.shape)
    # Captum's own refusals of these are bare AssertionErrors ("Tensor target dimension torch.Size([3, 1]) is not
    # valid", "Target list length does not match output!") that name neither the argument nor the fix
    if isinstance(target, Tensor) and target.numel() != 1 and (target.ndim != 1 or target.numel() != shape[0]):
        raise argument_error("target", f"a tensor of targets holds one class per example, shape ({shape[0]},) for "
                             f"these {shape[0]} examples; got shape {tuple(target.shape)}",
                             "Pass target.reshape(-1) for a (batch, 1) tensor, one id per example, or an int for all")
    if isinstance(target, list) and len(target) != shape[0]:
        raise argument_error("target", f"a list of targets holds one per example; got {len(target)} for "
                             f"{shape[0]} examples", "Pass one target per example, or an int for every example")
    if isinstance(target, Tensor):
        if target.is_floating_point() or target.dtype == torch.bool:
            raise argument_error("target", f"class indices must be integers, got a {target.dtype} tensor",
                                 "Pass an int, one int per example, or a tuple of ints", kind=BcosTypeError)
        per_example = [(int(t),) for t in target.reshape(-1)] if target.ndim else None
        target = int(target) if target.ndim == 0 else None
    elif isinstance(target, list):
        per_example = [t if isinstance(t, tuple) else (t,) for t in target]
    else:
        per_example = None
    if per_example is not None:  # one target per example, indexing the dimensions after the batch
        checks = [(index, shape[1 + d]) for t in per_example for d, index in enumerate(t) if 1 + d < len(shape)]
    elif isinstance(target, tuple):  # the last dimensions of every example
        checks = list(zip(target, shape[-len(target):], strict=False)) if len(target) < len(shape) else []
    else:
        checks = [(target, shape[-1])]
    for index, size in checks:
        if isinstance(index, str):  # a class name where its id is meant: say how to get the id
            raise argument_error("target", f"got a name ({index!r}), not a class index", f"Map a class name to its id "
                                 f"with model.config.label2id[{index!r}] (a token: tokenizer.convert_tokens_to_ids)",
                                 kind=BcosTypeError)
        if isinstance(index, bool) or not isinstance(index, int):
            raise argument_error("target", f"class indices must be ints, got {index!r}",
                                 "Pass an int, one int per example, or a tuple of ints", kind=BcosTypeError)
        if not 0 <= index < size:
            raise argument_error("target", f"{index} is outside the {size} entries of the output (shape {shape}); "
                                 "negative targets are not counted from the end",
                                 f"Pass indices in [0, {size}), e.g. a class id of this model")


_MISSING_FROM_INPUTS = (
    "part of the output does not come from `inputs`. A transformers text model called with "
    "inputs_embeds= adds the position (and token-type) embeddings after them (BERT, RoBERTa, DistilBERT, "
    "GPT-2). Attribute at the combined embedding: fwd = EmbeddingForward(model); "
    "BcosAttribution(fwd).attribute(fwd.embed(input_ids, attention_mask), target=..., "
    "additional_forward_args=(attention_mask,)). A B-cos ViT (BcosViT) called with its pixels encodes them as "
    "[x, 1 - x], whose constant 1 is no part of the pixels: attribute at the encoding, BcosAttribution(lambda e: "
    "model(encoded_pixel_values=e).logits).attribute(model.encode(images), target=...). Otherwise pass every input the "
    "output depends on. Or the function "
    "applies a non-linear function to the model's outputs (softmax, log-softmax, a probability): B-cos decomposes "
    "the logits exactly, not functions of them, so explain the logits")


def _rounded_embeddings_cause(rounded: Sequence[tuple[torch.dtype, torch.dtype]], *, gap: bool = True) -> str:
    """Why the explained values are not the ones given: EmbeddingForward rounded them to the model's dtype. ``gap``:
    in a completeness warning (BcosAttribution's), where the rounding is the attributions' gap; otherwise the text of
    EmbeddingForward's own warning (LayerBcos and Captum's own methods, which record no rounding)."""
    given, used = (str(dtype).removeprefix("torch.") for dtype in rounded[0])
    so = (f"so the attributions of the {given} values miss the output by that rounding (no position is missing)" if gap
          else f"so the output and its attributions are those of the rounded values, not of the {given} ones given")
    return (f"the inputs are {given} and EmbeddingForward rounded them to {used}, the dtype the model computes in at "
            f"its attribution point, {so}. Pass embeddings in the model's dtype (fwd.embed(ids, mask) returns them; "
            "cast a baseline or noise with .to(embeddings.dtype)), or run the model in float32 (model.float())")


# the (given, used) dtypes of embeddings EmbeddingForward rounded in this thread's forward, where a caller records them
_EMBEDDING_ROUNDING = threading.local()


@contextmanager
def _recording_embedding_rounding(into: list[tuple[torch.dtype, torch.dtype]]) -> Iterator[None]:
    saved = getattr(_EMBEDDING_ROUNDING, "into", None)
    _EMBEDDING_ROUNDING.into = into
    try:
        yield
    finally:
        _EMBEDDING_ROUNDING.into = saved


def _require_tensor_output(out: Any, who: str) -> None:
    """Refuse a ``forward_func`` output that is not a tensor (a transformers ``ModelOutput``, a tuple): Captum failed
    on it inside its target selection ("'SequenceClassifierOutput' object has no attribute 'shape'")."""
    if not isinstance(out, Tensor):
        field = " (a transformers model's output: its .logits)" if hasattr(out, "logits") else ""
        raise argument_error("forward_func", f"returned a {type(out).__name__}, not a tensor{field}, so {who} has no "
                             "output to pick target from", "Return the tensor to explain, e.g. lambda e: "
                             "model(inputs_embeds=e).logits, or pass EmbeddingForward(model); for a B-cos ViT, lambda e: "
                             "model(encoded_pixel_values=e).logits on model.encode(images)", kind=BcosTypeError)


def _one_value_per_example(out: Tensor, batch: int, who: str) -> Float[Tensor, " batch"]:
    if isinstance(out, Tensor) and out.ndim == 2 and out.shape == (batch, 1):
        out = out[:, 0]
    if not isinstance(out, Tensor) or out.ndim != 1 or out.shape[0] != batch:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise argument_error("target", f"{who} must explain one scalar per example, but the selected output has "
                             f"shape {shape} for {batch} examples",
                             "Pass target= for multi-output functions (a class index, or one per example)")
    return out


# ------------------------------------------------------------------------------------ text models


class _StopForward(Exception):
    """Raised inside the attribution-point hook to stop a forward pass that only had to reach that point."""


def _placeholder_ids(model: nn.Module, mask: Tensor) -> Tensor:
    """Ids for a forward pass whose attribution-point tensor is replaced: any id on real tokens that is not the
    pad id (decoder classifiers find each row's last token by comparing ids with ``config.pad_token_id``);
    :func:`~bcos_plugins.attribution.model_call_kwargs` writes the pad id on padding."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    return torch.full_like(mask, 1 if pad == 0 else 0)


# the attention mask EmbeddingForward.embed was given, held on the embeddings it returns where the mask pads a row
_EMBEDDED_MASK = "_bcos_plugins_embedded_mask"


def _remember_mask(embeddings: Tensor, attention_mask: Tensor | None, padded: bool | None) -> Tensor:
    """``embeddings`` holding ``attention_mask`` where it pads a row; ``padded`` is the token check's reading of that
    (``None``: not known, read here, one device sync)."""
    if attention_mask is not None and (not bool(attention_mask.bool().all()) if padded is None else padded):
        setattr(embeddings, _EMBEDDED_MASK, attention_mask.detach())
    return embeddings


def _carry_mask(source: Tensor, leaf: Tensor) -> Tensor:
    """``leaf`` (a new tensor made from ``source``) holding the mask ``source`` holds: set only where it pads a row
    (:func:`_remember_mask`), so it is carried as it is, without reading it again (a device sync per call)."""
    embedded = getattr(source, _EMBEDDED_MASK, None)
    if embedded is not None:
        setattr(leaf, _EMBEDDED_MASK, embedded)
    return leaf


def _same_values(mask: Tensor, embedded: Tensor) -> bool:
    """Whether ``mask`` is the remembered mask itself or a view of its very memory (same storage, offset, shape,
    strides and dtype: the same values without comparing them, which costs a device sync per forward)."""
    return mask is embedded or (not mask.is_meta and mask.device == embedded.device and mask.dtype == embedded.dtype
                                and mask.shape == embedded.shape and mask.stride() == embedded.stride()
                                and mask.data_ptr() == embedded.data_ptr())


def _refuse_another_mask(embeddings: Tensor, attention_mask) -> None:
    """Refuse embeddings of a padded batch (:meth:`EmbeddingForward.embed`'s, as returned) run without the mask they
    were embedded with, or with another one: every padding position was attended (or other positions masked), another
    function than the model's on those rows, silently (a left-padded row's logit 0.14 where the model's is 0.0015).
    Tensors made from them (noise, a path, a slice) hold no mask and are not checked."""
    embedded = getattr(embeddings, _EMBEDDED_MASK, None)
    if embedded is None:
        return
    if attention_mask is None:
        raise argument_error("additional_forward_args", f"the embeddings were embedded with an attention mask that "
                             f"pads {bad_rows(~embedded.bool().all(-1))}, but no attention mask is passed with them, "
                             "so the padding positions would be attended: another function than the model's on those "
                             "rows", "Pass additional_forward_args=(attention_mask,), the mask given to "
                             "fwd.embed(input_ids, attention_mask) (calling fwd directly: fwd(embeddings, "
                             "attention_mask))")
    if isinstance(attention_mask, Tensor) and not _same_values(attention_mask, embedded) and (
            attention_mask.shape != embedded.shape
            or not torch.equal(attention_mask.to(embedded.device).bool(), embedded.bool())):
        raise argument_error("attention_mask", "is another mask than the one the embeddings were embedded with (their "
                             "positions were counted from that one, and its padding is not real tokens)",
                             "Pass the mask given to fwd.embed(input_ids, attention_mask)")


class EmbeddingForward(nn.Module):
    """A transformers text model as a function of the tensor at its attribution point:
    ``f(embeddings, attention_mask=None, position=None)``.

    The point is the core's :func:`~bcos_plugins.attribution.text_attribution_point`: for B-cos models the
    combined embedding (word + position + token type; token embeddings for Llama), where completeness holds;
    for stock BERT-family models the output of the embedding LayerNorm (before it input x gradient is zero).
    ``forward`` runs the model with the given tensor swapped in at that point, called as every path calls a text
    model (:func:`~bcos_plugins.attribution.text.rows_as_alone_call`: positions counted from the mask), so every
    Captum method (B-cos, IxG, IG, Saliency, Occlusion, Shapley sampling, LIME) explains the same function as
    :func:`bcos_plugins.explain`, and in eval mode as every path runs a model (a model left in training mode after
    fine-tuning gets every module's training flag back afterwards). :meth:`embed` computes that tensor for real ids
    (inputs and baselines).

    Output: classifier logits ``(batch, classes)``; causal LMs: next-token logits ``(batch, vocab)`` at
    ``position`` (default: each row's last real token; negative values count from it, as everywhere); masked
    LMs: the token logits ``(batch, vocab)`` at ``position``, which they need (no position is the natural one).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        require_model_object(model, only_stand_ins=True)  # a tokenizer (the arguments swapped), ids, a pipeline: named
        if not isinstance(model, nn.Module):
            raise argument_error("model", f"expected a transformers model, got {type(model).__name__}",
                                 "Pass the model object", kind=BcosTypeError)
        # a torch.compile wrapper runs as its own module (the same function): embed and forward swap and read the
        # point's tensor with module hooks, and a compiled graph traced before a hook existed runs without it
        # (dynamo does not guard on module hooks by default), so embed captured nothing
        self.model = uncompiled(model)
        self.spec = spec_for(model)
        self.point = text_attribution_point(model, self.spec)
        self.train(model.training)
        if self.spec.head == "base":  # the registry says which head a class has; an attribute could be anything
            raise argument_error("model", f"EmbeddingForward wraps sequence classifiers, causal LMs and masked LMs; "
                                 f"{type(model).__name__} is a base model, with neither class logits nor an LM head",
                                 "Use bcos_plugins.explain for base models", kind=BcosTypeError)
        embeddings = model.get_input_embeddings()
        self.width = getattr(embeddings, "embedding_dim", None)

    def _hook(self, replace: Callable[[Tensor], Tensor]):
        # prepend: a Captum layer hook on the same module (LayerBcos at the default point) must see the
        # swapped-in tensor, not the placeholder's
        if self.spec.embedding_module(self.model)[0] is not self.point.module:
            # the model's module at the point was replaced after this wrapper was built (set_input_embeddings): a hook
            # on the old one never ran, so embed failed with an IndexError and forward ignored the embeddings given,
            # returning the placeholder ids' logits (every attribution 0, or another row's output), silently
            self.point = text_attribution_point(self.model, self.spec)
        module = self.point.module
        # on the model, which other threads may run meanwhile (training it): only this thread's forward is swapped
        owner = thread_token()
        if self.point.where == "input":
            return module.register_forward_pre_hook(
                lambda m, args: (replace(args[0]), *args[1:]) if thread_token() == owner else None, prepend=True)
        return module.register_forward_hook(lambda m, args, out: replace(out) if thread_token() == owner else None,
                                            prepend=True)

    @torch.no_grad()
    def embed(self, input_ids: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None,
              **forward_kwargs) -> Float[Tensor, "batch pos d_model"]:
        """The attribution-point tensor of ``input_ids`` (the forward pass stops right after computing it)."""
        input_ids, attention_mask, padded = token_inputs_and_padding(self.model, input_ids, attention_mask)
        self._check_no_real_pad_ids(input_ids, attention_mask)
        captured: list[Tensor] = []

        def grab(t: Tensor) -> Tensor:
            captured.append(_remember_mask(t.detach().clone(), attention_mask, padded))
            raise _StopForward

        kwargs = rows_as_alone_call(self.model, input_ids, attention_mask, forward_kwargs, spec=self.spec)
        handle = self._hook(grab)
        try:
            self.model(**kwargs)
        except _StopForward:
            pass
        finally:
            handle.remove()
        embeddings = captured[0]
        if not bool(torch.isfinite(embeddings).all()):
            # a NaN embedding row, the padding's or a real token's: the refusal of these embeddings (_checked) sees no
            # ids and blamed a baseline or noise the caller never added; here the ids are at hand to name the row (as
            # explain does)
            cause = (non_finite_embedding_cause(self.model, input_ids, attention_mask)
                     or _real_token_embedding_cause(self.model, input_ids, attention_mask))
            rows = ~torch.isfinite(embeddings).reshape(embeddings.shape[0], -1).all(-1)
            raise argument_error("input_ids", f"{bad_rows(rows)} embed to NaN or infinite entries, so there is "
                                 "nothing finite to explain", cause)
        return embeddings

    def _check_no_real_pad_ids(self, input_ids: Tensor, attention_mask: Tensor | None) -> None:
        """A decoder classifier classifies from each row's last token whose id is not ``config.pad_token_id``: a real
        token with that id (an end-of-sequence token used as padding) is skipped. :meth:`forward` sees embeddings, not
        ids, and runs on placeholder ids (:func:`_placeholder_ids`), so it would classify from the last real token
        instead, another logit than the model's: refused where the ids are seen."""
        pad = getattr(self.model.config, "pad_token_id", None)
        if self.spec.kind != "decoder" or not self.spec.is_classifier or pad is None:
            return
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        real_pads = (input_ids == pad) & real
        if real_pads.any():
            raise argument_error(
                "input_ids", f"{bad_rows(real_pads)} hold config.pad_token_id ({pad}) on real tokens, which "
                f"{type(self.model).__name__} skips when it finds each row's last token to classify from; from "
                "embeddings alone EmbeddingForward cannot see them and would classify from the last real token, "
                "another logit than the model's", "Use LayerBcos(model) or bcos_plugins.explain, which read the ids "
                "and explain the model's own logits")

    def _checked(self, embeddings, attention_mask) -> Tensor | None:
        if not isinstance(embeddings, Tensor) or not embeddings.is_floating_point():
            what = embeddings.dtype if isinstance(embeddings, Tensor) else type(embeddings).__name__
            raise argument_error("embeddings", f"expected a float tensor (batch, pos, d_model), got {what}",
                                 "Compute it with EmbeddingForward.embed(input_ids, attention_mask)",
                                 kind=BcosTypeError)
        if embeddings.ndim != 3 or (self.width is not None and embeddings.shape[-1] != self.width):
            raise argument_error("embeddings", f"expected shape (batch, pos, {self.width}), got "
                                 f"{tuple(embeddings.shape)}",
                                 "Compute it with EmbeddingForward.embed(input_ids, attention_mask); add a batch "
                                 "dimension with [None] for one sequence")
        if embeddings.shape[0] == 0 or embeddings.shape[1] == 0:
            # the placeholder ids' check named input_ids, which the caller never passed
            raise argument_error("embeddings", f"empty input of shape {tuple(embeddings.shape)}; there is nothing to "
                                 "explain", "Pass at least one sequence of at least one position, computed with "
                                 "EmbeddingForward.embed(input_ids, attention_mask)")
        if not torch.isfinite(embeddings).all():
            bad = ~torch.isfinite(embeddings).all(-1)
            row = int(bad.any(-1).nonzero()[0])
            raise argument_error("embeddings", f"has NaN or infinite entries at {int(bad.sum())} position(s), first in "
                                 f"row {row} at positions {bad[row].nonzero().flatten().tolist()[:8]}", "Pass finite "
                                 "embeddings: an input embedding row of those tokens may be NaN "
                                 "(EmbeddingForward.embed(input_ids, attention_mask) names it), or a baseline or noise "
                                 "added to them")
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != embeddings.shape[:2]:
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask)
            raise argument_error("attention_mask", f"expected shape {tuple(embeddings.shape[:2])} (the embeddings' "
                                 f"batch and positions), got {shape}", "Pass the mask the tokenizer returned")
        return attention_mask

    def forward(self, embeddings: Float[Tensor, "batch pos d_model"],
                attention_mask: Int[Tensor, "batch pos"] | None = None,
                position: int | Tensor | None = None) -> Tensor:
        attention_mask = self._checked(embeddings, attention_mask)
        batch, length = embeddings.shape[:2]
        mask = attention_mask if attention_mask is not None else torch.ones(
            batch, length, dtype=torch.long, device=embeddings.device)
        # validates the mask (0/1, no empty row) and the length against the position table
        placeholder, attention_mask = check_token_inputs(self.model, _placeholder_ids(self.model, mask.long()),
                                                         attention_mask)
        _refuse_another_mask(embeddings, attention_mask)
        if self.spec.is_classifier and position is not None:
            raise argument_error("position", "a sequence classifier gives one logit vector per sequence",
                                 "Leave position out (it applies to causal LMs)")
        pos = None if self.spec.is_classifier else explained_positions(
            self.spec, position, mask.long(),
            how_to_pass="additional_forward_args=(attention_mask, position) (position= when calling it) with")
        kwargs = rows_as_alone_call(self.model, placeholder, attention_mask, spec=self.spec)
        handle = self._hook(lambda t: _swapped_in(embeddings, t.dtype))
        # in eval mode, as every path runs a model: Captum's own methods (InputXGradient, IntegratedGradients, ...)
        # call this wrapper directly, and a model left in training mode after fine-tuning ran with dropout on (random
        # attributions, silently); BcosAttribution and LayerBcos already explained it in eval mode
        try:
            with evaluating(self.model):
                out = self.model(**kwargs)
        finally:
            handle.remove()
        logits = out.logits
        if pos is not None:
            logits = logits[torch.arange(batch, device=logits.device), pos]
        return logits


def _real_token_embedding_cause(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None) -> str:
    """The sentence naming a real token whose input embedding row is NaN or infinite (the padding's is named by
    ``non_finite_embedding_cause``), or the embedding's other weights where every token's row is finite."""
    weight = model.get_input_embeddings().weight
    real = input_ids if attention_mask is None else input_ids[attention_mask.to(input_ids.device) != 0]
    ids = real.to(weight.device).unique()
    ids = ids[(ids >= 0) & (ids < weight.shape[0])]
    bad = ids[~torch.isfinite(weight[ids].detach()).all(-1)].tolist()
    row = "model.get_input_embeddings().weight"
    if bad:
        return (f"The input embedding row of token {bad[0]} ({row}[{bad[0]}]"
                f"{', ids ' + str(bad[:8]) if len(bad) > 1 else ''}) is NaN or infinite. Reload the embedding weights, "
                f"or set that row to finite values ({row}.data[{bad[0]}] = ...)")
    return ("Every token's input embedding row is finite, so the embedding's other weights (position or token-type "
            "embeddings, the embedding norm) are NaN or infinite, or a huge value overflows. Reload the weights")


def _swapped_in(embeddings: Tensor, dtype: torch.dtype) -> Tensor:
    """``embeddings`` in the dtype the model computes in at its attribution point; a rounding to a coarser dtype
    (float32 embeddings of a bfloat16 model) is recorded for the caller's completeness warning, whose gap it is, or,
    where no caller records it (LayerBcos, Captum's own methods, a direct call), warned about here with the same
    cause: those explained the rounded values without a word."""
    into = getattr(_EMBEDDING_ROUNDING, "into", None)
    if (embeddings.dtype != dtype and dtype.is_floating_point
            and torch.finfo(dtype).eps > torch.finfo(embeddings.dtype).eps):
        if into is not None:
            into.append((embeddings.dtype, dtype))
        else:
            warnings.warn("EmbeddingForward: " + _rounded_embeddings_cause([(embeddings.dtype, dtype)], gap=False),
                          stacklevel=2)
    return embeddings.to(dtype)


_TOKEN_TYPES_ROUTE = ("; for sentence pairs with token_type_ids attribute at the combined embedding, which holds them: "
                      "fwd = EmbeddingForward(model); BcosAttribution(fwd).attribute(fwd.embed(ids, mask, "
                      "token_type_ids=token_type_ids), target=..., additional_forward_args=(mask,))")


class _Logits(nn.Module):
    """A transformers model called Captum-style (positional tensors) returning a logits tensor.

    Captum selects targets on tensors; transformers returns a ``ModelOutput``. Called as every path calls a text
    model on a batch (:func:`~bcos_plugins.attribution.text.rows_as_alone_call`: a model outside the registry
    too, so a left-padded row is computed as alone or refused); per-position logits are taken at ``position``
    (Captum passes it as the third of ``additional_forward_args``), by the core's
    :func:`~bcos_plugins.attribution.text.explained_positions`: left out, a causal LM's last real token, and a
    masked LM has no default.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        # a torch.compile wrapper runs as its own module (the same function): LayerBcos reads its layer with a Captum
        # hook, which a compiled graph traced before the hook existed would not run (see EmbeddingForward)
        self.model = uncompiled(model)
        try:
            self.spec = spec_for(model)
        except TypeError:  # a transformers class bcosify does not know: called as it is
            self.spec = None
        if self.spec is not None and self.spec.head == "base":  # was an AttributeError on .logits mid-attribute
            raise argument_error(
                "forward_func", f"{type(model).__name__} is a base model: it returns hidden states, no logits for "
                "Captum's target to pick", "explain its hidden units with bcos_plugins.explain(model, input_ids, "
                "target=<unit>), or pass a model with a head (a classifier or causal LM) or a function that returns "
                "the tensor to explain, with model=", kind=BcosTypeError)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position: int | Tensor | None = None, *more: Any) -> Tensor:
        if more:  # Captum passes additional_forward_args positionally: a third one has no meaning here
            raise argument_error("additional_forward_args", f"got {2 + len(more)} values; the model is called with "
                                 "(input_ids, attention_mask, position)", "Pass additional_forward_args=(attention_mask,) "
                                 "or (attention_mask, position)" + _TOKEN_TYPES_ROUTE, kind=BcosTypeError)
        if isinstance(position, Tensor) and position.ndim == 2 and position.shape == input_ids.shape:
            # one value per token is no position (one per row): token_type_ids given where the position goes
            raise argument_error("additional_forward_args", "its second value is read as the explained position, one "
                                 f"per row, but it has the ids' shape {tuple(position.shape)} (token_type_ids?)",
                                 "Pass additional_forward_args=(attention_mask,) or (attention_mask, position)"
                                 + _TOKEN_TYPES_ROUTE, kind=BcosTypeError)
        # the package's token-batch check, as explain's: float ids were truncated (5.7 read as 5) and ids outside the
        # vocabulary failed inside the embedding (IndexError); any integer width is read exactly
        input_ids, attention_mask = check_token_inputs(self.model, input_ids, attention_mask)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        if self.spec is not None and self.spec.is_classifier and position is not None:
            raise argument_error("position", "a sequence classifier gives one logit vector per sequence",
                                 "Leave position out of additional_forward_args (it applies to causal and "
                                 "masked LMs)")
        # keywords: the second positional parameter of transformers decoders is the cache, not the mask
        kwargs = rows_as_alone_call(self.model, input_ids, mask, spec=self.spec)
        logits = self.model(**kwargs).logits
        if logits.ndim == 3:
            pos = (resolve_positions(position, mask) if self.spec is None else explained_positions(
                self.spec, position, mask, how_to_pass="additional_forward_args=(attention_mask, position) with"))
            logits = logits[torch.arange(logits.shape[0], device=logits.device), pos]
        return logits


def _returns_model_output(forward_func: Callable) -> bool:
    from transformers import PreTrainedModel

    return isinstance(uncompiled(forward_func), PreTrainedModel)


def _reads_token_ids_first(forward_func: Callable) -> bool:
    """Whether ``forward_func`` is a transformers model whose forward takes token ids first (a text model): Captum
    passes the attributed inputs first, and ids are no input to multiply by a gradient."""
    if not _returns_model_output(forward_func):
        return False
    parameters = forward_parameters(forward_func)  # read once per forward function
    return bool(parameters) and next(iter(parameters)) == "input_ids"


# ------------------------------------------------------------------------------------ the two methods


class BcosAttribution(GradientAttribution):
    """B-cos explanation ``W(x) x`` as a Captum attribution method (see the module docstring).

    Args:
        forward_func: any function of tensors that runs through a B-cos model: the model, an
            :class:`EmbeddingForward` around one (text models: complete at the combined embedding), a ViT's
            ``lambda e: model(encoded_pixel_values=e).logits``, ... (``model(inputs_embeds=e)`` of a text model
            misses the position embeddings added after ``e``: a ``UserWarning`` says so).
        model: optional; the model ``forward_func`` runs through, checked to hold B-cos modules and put in
            eval mode for each call. Without it a plain function must leave its model in eval mode.
    """

    def __init__(self, forward_func: Callable[..., Tensor], model: nn.Module | None = None) -> None:
        if not callable(forward_func):
            raise argument_error("forward_func", f"expected a callable, got {type(forward_func).__name__}",
                                 "Pass the model or a function of the input tensors", kind=BcosTypeError)
        self.model = _checked_model(forward_func, model, type(self).__name__)
        GradientAttribution.__init__(self, forward_func)

    @property
    def multiplies_by_inputs(self) -> bool:
        return True

    def has_convergence_delta(self) -> bool:
        return True

    @log_usage(part_of_slo=True)
    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetType = None,
        additional_forward_args: Any = None,
        return_convergence_delta: bool = False,
        **other_methods_keywords: Any,
    ) -> Tensor | tuple[Tensor, ...] | tuple[Tensor | tuple[Tensor, ...], Tensor]:
        """Attributions ``x * d out[target] / d x`` in explanation mode, shaped like ``inputs``.

        Args:
            inputs: float tensor or tuple of float tensors, first dimension = examples.
            target: Captum's target (int, per-example tensor/list, or None for scalar-per-example outputs).
            additional_forward_args: passed after ``inputs`` to ``forward_func`` (e.g. the attention mask).
            return_convergence_delta: also return ``delta = sum(attributions) - out[target]`` per example
                (the core's ``Explanation.delta``; ~1e-6 of the logit for B-cos models; the same as Captum's
                IG delta with a zero baseline, since a bias-free B-cos network maps 0 to 0).
        """
        refuse_other_methods_keywords(f"{type(self).__name__}.attribute", other_methods_keywords)
        return_convergence_delta = require_bool("return_convergence_delta", return_convergence_delta)
        if other_methods_keywords:
            raise argument_error(next(iter(other_methods_keywords)), f"is not an argument of "
                                 f"{type(self).__name__}.attribute", "Pass inputs, target, additional_forward_args "
                                 "and return_convergence_delta only", kind=BcosTypeError)
        # a target made under the caller's torch.inference_mode(): Captum's gather saves it for backward, which
        # autograd refuses for inference tensors (RuntimeError)
        target = outside_inference(target)
        is_tuple = CaptumInternals.is_tuple(inputs)
        inputs_t = CaptumInternals.as_tuple(inputs)
        for i, x in enumerate(inputs_t):
            if not isinstance(x, Tensor) or not x.is_floating_point():
                what = x.dtype if isinstance(x, Tensor) else type(x).__name__
                raise argument_error(f"inputs[{i}]" if is_tuple else "inputs",
                                     f"input x gradient needs float inputs, got {what}",
                                     "For token ids attribute at the embedding: EmbeddingForward(model).embed(ids, "
                                     "mask), or LayerBcos(model)", kind=BcosTypeError)
        if _reads_token_ids_first(self.forward_func):
            # float inputs would reach the embedding as token ids (torch's "Expected tensor for argument #1 'indices'")
            raise argument_error("forward_func", f"{type(uncompiled(self.forward_func)).__name__} takes token ids "
                                 "first, so the float inputs would be read as ids; input x gradient is taken at the "
                                 "embedding", "Pass EmbeddingForward(model) as forward_func with inputs "
                                 "EmbeddingForward(model).embed(ids, mask), or use LayerBcos(model).attribute(ids, ...)",
                                 kind=BcosTypeError)
        if isinstance(self.forward_func, EmbeddingForward):
            _refuse_unpacked_forward_args(additional_forward_args)
        extra = CaptumInternals.forward_args(additional_forward_args)
        batch = inputs_t[0].shape[0]
        name = type(self).__name__

        forward_autocast: list[torch.dtype] = []
        rounded: list[tuple[torch.dtype, torch.dtype]] = []

        def compute():
            # new tensors: they carry the mask EmbeddingForward.embed gave the inputs, which its forward checks
            leaves = tuple(_carry_mask(x, as_leaf(x)) for x in inputs_t)
            with (nullcontext() if self.model is None
                  else recording_forward_autocast(self.model, forward_autocast)), _recording_embedding_rounding(rounded):
                out = CaptumInternals.run_forward(self.forward_func, leaves, None, extra)
            _require_tensor_output(out, name)
            _check_target(target, out)
            out = CaptumInternals.select_targets(out, target)
            return _one_value_per_example(out, batch, name), leaves

        with _explaining(name, self.model):
            step = input_x_gradient(compute, defer_finite_check=True)
        if non_finite_step(step):  # refused as input_x_gradient refuses it, naming a padded float64 batch's cause
            refuse_non_finite_step(step, _padded_float64_cause(step.contributions[0].dtype, extra))
        # a gap from embeddings EmbeddingForward rounded to the model's dtype is named as that, not as missing positions
        warn_if_incomplete(step.contributions, step.explained, forward_autocast, who=name,
                           missing_share=_rounded_embeddings_cause(rounded) if rounded else _MISSING_FROM_INPUTS)
        formatted = CaptumInternals.output_as(is_tuple, step.contributions)
        if not return_convergence_delta:
            return formatted
        return formatted, _delta(step.contributions, step.explained)


class LayerBcos(LayerGradientXActivation):
    """B-cos explanation at a layer's input or output (or several layers); usable in Captum's
    ``NoiseTunnel`` and ``LLMGradientAttribution``.

    Args:
        forward_func: the B-cos model, or any function that runs through one.
        layer: a module or a list of modules to attribute at. Default: the model's attribution point
            (:func:`~bcos_plugins.attribution.text_attribution_point`: the combined embedding of B-cos models),
            where attributions are complete; a plain ``forward_func`` then needs ``model=``.
        model: optional; the model ``forward_func`` runs through (checked, put in eval mode for each call).
        attribute_to_layer_input: default for :meth:`attribute`; ``None`` picks the attribution point's side
            when ``layer`` is left at its default, and the layer output otherwise.
        device_ids, multiply_by_inputs: as in ``LayerGradientXActivation`` (``multiply_by_inputs=False`` gives
            the layer gradient, which is not an explanation that sums to the output).
        completeness_check: warn when the attributions miss the explained output (default). ``False`` for a
            caller that reports the gap itself and whose ``forward_func`` returns something other than the
            outputs the attributions should sum to (inseq: its attributed function and its ``deltas`` step
            score).
    """

    def __init__(self, forward_func: Callable[..., Tensor], layer: nn.Module | list[nn.Module] | None = None,
                 model: nn.Module | None = None, attribute_to_layer_input: bool | None = None,
                 device_ids: list[int] | None = None, multiply_by_inputs: bool = True,
                 completeness_check: bool = True) -> None:
        if not callable(forward_func):
            raise argument_error("forward_func", f"expected a callable, got {type(forward_func).__name__}",
                                 "Pass the model or a function of the input tensors", kind=BcosTypeError)
        if not isinstance(completeness_check, bool):
            raise argument_error("completeness_check", f"must be True or False, got {completeness_check!r}",
                                 "pass completeness_check=False only where the caller reports the gap itself",
                                 kind=BcosTypeError)
        self.completeness_check = completeness_check
        self.model = _checked_model(forward_func, model, type(self).__name__)
        if self.model is not None:
            # Captum's LLMGradientAttribution calls the model itself (generate, forward), not through this class: a
            # head that cannot run with config.return_dict=False failed inside transformers there
            require_head_output_object(self.model)
        default_side = False
        # the spec of a model whose attribution point is the default layer: the point is looked up again at each call
        self._default_point_spec: ArchitectureSpec | None = None
        if layer is None:
            if self.model is None:
                raise argument_error("layer", "no default for a plain function (the attribution point is found "
                                     "from the model)", "Pass layer=<module>, or model=<the B-cos model>",
                                     kind=BcosTypeError)
            point = text_attribution_point(self.model)
            layer, default_side = point.module, point.where == "input"
            self._default_point_spec = spec_for(self.model)
        elif not (isinstance(layer, nn.Module) or (isinstance(layer, list) and layer
                                                   and all(isinstance(m, nn.Module) for m in layer))):
            raise argument_error("layer", f"expected a module or a non-empty list of modules, got {layer!r}",
                                 "Pass e.g. model.transformer.h[0] or [model.transformer.h[0], model.transformer.h[1]]",
                                 kind=BcosTypeError)
        if self.model is not None:
            inside = set(self.model.modules())
            foreign = [m for m in (layer if isinstance(layer, list) else [layer]) if m not in inside]
            if foreign:
                raise argument_error(
                    "layer", f"{type(foreign[0]).__name__} is not a module of {type(self.model).__name__} (a layer of "
                    "another model never runs in this forward)", "Pass a layer of the model you attribute, e.g. "
                    "model.bert.encoder.layer[0], or leave layer out for the attribution point")
        self._to_layer_input = default_side if attribute_to_layer_input is None else require_bool(
            "attribute_to_layer_input", attribute_to_layer_input)
        super().__init__(forward_func, layer, device_ids=device_ids, multiply_by_inputs=multiply_by_inputs)
        self._explained_forward = forward_func
        # LLMGradientAttribution needs forward_func to be the model itself (it calls generate and replaces
        # forward_func on its copy); called directly, a transformers model's ModelOutput is unwrapped.
        self._model_forward = forward_func if _returns_model_output(forward_func) else None
        self._logits_forward = _Logits(forward_func) if self._model_forward is not None else None

    def has_convergence_delta(self) -> bool:
        return self.multiplies_by_inputs  # the layer gradient (multiply_by_inputs=False) sums to nothing

    @log_usage(part_of_slo=True)
    def attribute(
        self,
        inputs: Tensor | tuple[Tensor, ...],
        target: TargetType = None,
        additional_forward_args: Any = None,
        attribute_to_layer_input: bool | None = None,
        grad_kwargs: dict[str, Any] | None = None,
        return_convergence_delta: bool = False,
        **kwargs: Any,
    ):
        """Captum's ``LayerGradientXActivation.attribute`` (every keyword passes through) in explanation mode.

        With ``return_convergence_delta=True`` also returns ``sum(attributions) - out[target]`` per example
        (the core's ``Explanation.delta``; one per layer, as a list, for a list of layers). It is ~0 wherever
        the layer cuts every path from the input to the output (e.g. the combined embedding of a B-cos model).
        """
        refuse_other_methods_keywords(f"{type(self).__name__}.attribute", kwargs)
        if isinstance(inputs, Mapping):  # a dict without input_ids: "expected a tensor of token ids", as explain
            # Captum's refusal was a bare AssertionError naming neither ids nor mask; the one check of the tokenizer's
            # output, with the fix of this call (the mask goes in additional_forward_args)
            token_batch_and_padding(inputs, name="inputs", tokenizer_output_fix="Pass its ids as inputs and its mask "
                                    "in additional_forward_args: attribute(enc['input_ids'], target=..., "
                                    "additional_forward_args=(enc['attention_mask'],))")
        return_convergence_delta = require_bool("return_convergence_delta", return_convergence_delta)
        if return_convergence_delta and not self.multiplies_by_inputs:
            # the layer gradient sums to nothing: sum(gradient) - output was returned as if it were a completeness gap
            raise argument_error("return_convergence_delta", "LayerBcos(multiply_by_inputs=False) returns the layer "
                                 "gradient, which is no explanation that sums to the output, so it has no convergence "
                                 "delta", "Leave return_convergence_delta out, or build LayerBcos with "
                                 "multiply_by_inputs=True (the default) for the W(x)x explanation and its delta")
        if isinstance(self.layer, list) and isinstance(getattr(self.forward_func, "attr", None), LLMGradientAttribution):
            # Captum's LLM workflow replaced forward_func with its own (GradientForwardFunc, holding the workflow as
            # .attr) and calls .detach() on what this returns: a list of layers' attributions failed there
            # ("'list' object has no attribute 'detach'")
            raise argument_error("layer", f"LLMGradientAttribution takes one attribution tensor per target token, and "
                                 f"this LayerBcos attributes at {len(self.layer)} layers (one tensor per layer)",
                                 "Build one LLMGradientAttribution(LayerBcos(model, layer=layer), tokenizer) per layer")
        to_input = self._to_layer_input if attribute_to_layer_input is None else require_bool(
            "attribute_to_layer_input", attribute_to_layer_input)
        if self._default_point_spec is not None:
            # the model's module at the point replaced after this was built (set_input_embeddings) was refused as "did
            # not run (a layer of another model?)", naming a layer the caller never passed: the point's module now
            self.layer = self._default_point_spec.embedding_module(self.model)[0]
        saved_forward = self.forward_func
        inner = self._logits_forward if self._model_forward is not None and saved_forward is self._model_forward \
            else saved_forward
        if inner is self._logits_forward or isinstance(inner, EmbeddingForward):
            _refuse_unpacked_forward_args(additional_forward_args)
        outputs: list[Tensor] = []

        def recording(*args, **kw):
            # the explained value comes from the same forward pass as the gradient
            out = inner(*args, **kw)
            _require_tensor_output(out, type(self).__name__)
            _check_target(target, out)
            if target is None and isinstance(out, Tensor) and out.ndim >= 2 and out[0].numel() > 1:
                # Captum's refusal is a bare AssertionError ("Target not provided when necessary"); BcosAttribution's
                # names the argument and the fix
                if isinstance(getattr(inner, "attr", None), LLMGradientAttribution):
                    # Captum's LLM workflow steps through the target's first dimension: a (1, n) tensor of token ids
                    # was one step explaining n log-probabilities, refused as "Pass target= for multi-output functions"
                    raise argument_error("target", f"LLMGradientAttribution explains one target token per step and got "
                                         f"{out.shape[-1]} at once: its target tensor of token ids has more than one "
                                         "dimension (Captum steps through the first)", "Pass a 1-d tensor of token "
                                         "ids (target.reshape(-1)) or the target text")
                _one_value_per_example(out, out.shape[0], type(self).__name__)
            outputs.append(out)
            return out

        self.forward_func = recording
        layers = self.layer if isinstance(self.layer, list) else [self.layer]
        ran: set[nn.Module] = set()
        holds_none: list[nn.Module] = []  # layers whose output is a tuple with a non-tensor (attention weights None)
        # layers with a non-float positional input: token ids (first), or a mask beside the hidden states (DistilBERT's
        # TransformerBlock gets its boolean mask positionally), each with no gradient
        takes_ids: list[tuple[nn.Module, torch.dtype, bool]] = []

        def note(module, args, out):
            ran.add(module)
            ints = [a.dtype for a in args if isinstance(a, Tensor) and not a.is_floating_point()]
            if ints and module not in [m for m, _, _ in takes_ids]:
                first_is_ids = isinstance(args[0], Tensor) and not args[0].is_floating_point()
                takes_ids.append((module, ints[0], first_is_ids))
            if isinstance(out, tuple) and not all(isinstance(o, Tensor) for o in out) and module not in holds_none:
                holds_none.append(module)

        handles = [m.register_forward_hook(note) for m in layers]
        forward_autocast: list[torch.dtype] = []
        # under the caller's torch.inference_mode() the layer's output never required grad (Captum's own
        # set_grad_enabled(True) does not lift it): RuntimeError 'element 0 of tensors does not require grad' or
        # 'Inference tensors cannot be saved for backward'; lifted here as explain lifts it, tensors made under it
        # copied to normal ones
        inputs = _outside_inference_args(inputs)
        additional_forward_args = _outside_inference_args(additional_forward_args)
        target = outside_inference(target)  # Captum's gather saves it for backward
        try:
            with torch.inference_mode(False), _explaining(type(self).__name__, self.model), explanation_mode(), \
                    (nullcontext() if self.model is None else recording_forward_autocast(self.model, forward_autocast)):
                attributions = super().attribute(
                    inputs, target=target, additional_forward_args=additional_forward_args,
                    attribute_to_layer_input=to_input, grad_kwargs=grad_kwargs, **kwargs)
        except Exception as error:
            idle = [m for m in layers if m not in ran]
            if outputs and idle and self.model is not None and idle[0] not in set(self.model.modules()):
                # a layer the model held when this was built, replaced since (set_input_embeddings): the refusal below
                # asked for "a layer of the model" of a caller who passed none (inseq's "bcos", a default point)
                raise argument_error("layer", f"{type(idle[0]).__name__} is no longer a module of "
                                     f"{type(self.model).__name__}: the model's module there was replaced after this "
                                     f"{type(self).__name__} was built (e.g. by set_input_embeddings)", "Build it again "
                                     "on the model as it is now (for inseq: inseq.load_model(model, 'bcos') again)"
                                     ) from error
            if outputs and idle:  # the forward ran, but not through the layer: Captum's hook found nothing
                raise argument_error("layer", f"{type(idle[0]).__name__} did not run in forward_func's forward "
                                     "(a layer of another model?)", "Pass a layer of the model forward_func runs "
                                     "through") from error
            if to_input and isinstance(error, AssertionError) and "not a torch.Tensor" in str(error):
                # Captum takes every positional input of the layer as an attributed input; transformers calls its
                # blocks with more than the hidden states (BertLayer: (hidden_states, attention_mask, None))
                raise argument_error(
                    "attribute_to_layer_input", f"Captum attributes to every positional input of the layer, and "
                    f"{type(layers[0]).__name__} is called with a None among them (transformers passes masks and "
                    "optional states positionally), which Captum refuses (\"Given input is not a torch.Tensor\")",
                    "Attribute at the output of the module before it (attribute_to_layer_input=False), e.g. the "
                    "previous block or the embeddings, or leave layer out for the model's attribution point") from error
            if to_input and takes_ids and isinstance(error, RuntimeError) and "does not require grad" in str(error):
                # autograd's "One of the differentiated Tensors does not require grad" named neither the argument nor
                # that the layer's input is token ids
                module, dtype, first_is_ids = takes_ids[0]
                if first_is_ids:
                    raise argument_error("attribute_to_layer_input", f"the input of {type(module).__name__} is token "
                                         f"ids ({dtype}), which have no gradient to multiply by", "Attribute at its "
                                         "output (attribute_to_layer_input=False), or leave attribute_to_layer_input "
                                         "out for the attribution point's side") from error
                # the hidden states came first: the non-float input is a mask passed positionally, not token ids
                raise argument_error(
                    "attribute_to_layer_input", f"Captum attributes to every positional input of the layer, and "
                    f"{type(module).__name__} is called with a {dtype} tensor among them (a mask transformers passes "
                    "positionally), which has no gradient to multiply by", "Attribute at the output of the module "
                    "before it (attribute_to_layer_input=False), e.g. the previous block or the embeddings, or leave "
                    "layer out for the model's attribution point") from error
            if not to_input and holds_none and isinstance(error, AssertionError) and "not a torch.Tensor" in str(error):
                # transformers' attention modules return (output, attention weights), the weights None unless asked for
                raise argument_error(
                    "layer", f"{type(holds_none[0]).__name__} returns a tuple holding None (an attention module's "
                    "(output, attention weights), the weights None unless output_attentions=True), and Captum "
                    "attributes to every tensor of a layer's output, refusing the None (\"Given input is not a "
                    "torch.Tensor\")", "Attribute at the block around it (e.g. model.transformer.h[0], "
                    "model.model.layers[0], model.bert.encoder.layer[0]) or at a submodule that returns one tensor (its "
                    "output projection); leave layer out for the model's attribution point, where the attributions "
                    "are complete") from error
            raise
        finally:
            self.forward_func = saved_forward
            for handle in handles:
                handle.remove()

        def detach(a):
            return tuple(t.detach() for t in a) if isinstance(a, tuple) else a.detach()

        attributions = [detach(a) for a in attributions] if isinstance(attributions, list) else detach(attributions)
        per_layer = attributions if isinstance(attributions, list) else [attributions]
        per_layer = [a if isinstance(a, tuple) else (a,) for a in per_layer]
        explained = CaptumInternals.select_targets(outputs[-1], target).detach()
        explained = explained.reshape(explained.shape[0], -1).sum(-1) if explained.ndim > 1 else explained
        _refuse_non_finite_layer_attributions(type(self).__name__, per_layer, explained, additional_forward_args,
                                              self.model, inputs)
        # only an explanation (multiply_by_inputs) of the function given here sums to its output: the layer
        # gradient does not, nor does LLMGradientAttribution's replacement forward_func (a log-probability,
        # which log-softmax makes non-linear in the layer), so those are not checked
        if self.completeness_check and self.multiplies_by_inputs and saved_forward is self._explained_forward:
            for layer, layer_attributions in zip(layers, per_layer, strict=True):
                warn_if_incomplete(layer_attributions, explained, forward_autocast, who=type(self).__name__,
                                   missing_share=_missing_beside_layer(layer, to_input))
        if not return_convergence_delta:
            return attributions
        deltas = [_delta(a, explained) for a in per_layer]
        return attributions, (deltas if isinstance(attributions, list) else deltas[0])


def _refuse_unpacked_forward_args(additional_forward_args: Any) -> None:
    """Captum unpacks a tuple of additional forward arguments and passes anything else whole as the first one: a list
    or dict reached a text model's forward (``EmbeddingForward``, the model itself) as its attention mask, refused
    there with a fix that asked for the mask the caller had passed."""
    if isinstance(additional_forward_args, list | Mapping):
        form = "list" if isinstance(additional_forward_args, list) else "dict"
        raise argument_error("additional_forward_args", f"got a {form}; Captum unpacks a tuple of additional forward "
                             f"arguments and passes anything else whole as the first one, so the {form} would be "
                             "read as the attention mask", "Pass a tuple: additional_forward_args=(attention_mask,) or "
                             "(attention_mask, position)", kind=BcosTypeError)


def _outside_inference_args(args: Any) -> Any:
    """``args`` (a tensor, or a tuple / list of arguments) with every tensor made under ``torch.inference_mode()``
    replaced by a normal copy (autograd cannot save inference tensors for backward); anything else unchanged."""
    if isinstance(args, (tuple, list)):
        return type(args)(outside_inference(a) for a in args)
    return outside_inference(args)


def _padded_float64_cause(dtype: torch.dtype, forward_args, model: nn.Module | None = None, inputs=None) -> str:
    """The cause of a Captum call's NaN as explain names it: a padding token's NaN / inf input embedding
    (:func:`~bcos_plugins.attribution.text.non_finite_embedding_cause`, where ``inputs`` are token ids of ``model``:
    ``LayerBcos(model)``'s; ``BcosAttribution`` gets embeddings, so no ids) and
    :func:`~bcos_plugins.attribution.text.padded_float64_nan_cause`. The attention mask is the first additional
    forward argument where it is a ``(batch, pos)`` tensor (``LayerBcos(model)``'s and ``EmbeddingForward``'s
    ``(attention_mask, position)``)."""
    args = CaptumInternals.forward_args(forward_args) or ()
    mask = args[0] if args and isinstance(args[0], Tensor) and args[0].ndim == 2 else None
    ids = inputs[0] if isinstance(inputs, tuple) and len(inputs) == 1 else inputs
    embedding = non_finite_embedding_cause(model, ids, mask) if model is not None and isinstance(ids, Tensor) else ""
    return " ".join(part for part in (embedding, padded_float64_nan_cause(
        dtype, mask, "Attribute in float32 (model.float()), or the padded rows one at a time without padding.")) if part)


def _refuse_non_finite_layer_attributions(who: str, per_layer: list[tuple[Tensor, ...]], explained: Tensor,
                                          forward_args, model: nn.Module | None = None, inputs=None) -> None:
    """Refuse NaN or infinite attributions or outputs of ``LayerBcos``, as ``BcosAttribution`` and ``explain`` refuse
    them: Captum's layer method returned them (a padded float64 Gemma 2's NaN) without a word, the completeness
    warning's comparison being false for NaN."""
    tensors = [explained, *(t for layer in per_layer for t in layer)]
    if bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        return
    rows = ~torch.isfinite(explained) if explained.ndim else None
    for t in tensors[1:]:
        bad = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(1)
        rows = bad if rows is None or rows.shape != bad.shape else rows | bad
    cause = _padded_float64_cause(tensors[1].dtype, forward_args, model, inputs)
    raise BcosValueError(f"{who}: the attributions or the explained output are NaN or infinite for "
                         f"{bad_rows(rows)}, so there is nothing finite to explain. " + (cause or "An input or an "
                         "embedding row of NaN, inf or a huge value overflows inside the model: check those rows' "
                         "inputs, the embedding rows of their tokens and the weights."))


def _missing_beside_layer(layer: nn.Module, to_input: bool) -> str:
    return (f"part of the output does not pass through the {'input' if to_input else 'output'} of "
            f"{type(layer).__name__} (a sublayer beside a residual connection, or an input the layer does not "
            "see). Attribute at a layer every path from the input to the output runs through: leave layer out "
            "for the model's attribution point (the combined embedding), or pass a whole block")


# ------------------------------------------------------------------------------------ NoiseTunnel

# what the checks below read from Captum's NoiseTunnel.attribute (tests/test_trust_adapters.py checks they exist)
NOISE_TUNNEL_PARAMETERS = ("inputs", "nt_samples", "nt_samples_batch_size")
_CHECKED = "__bcos_plugins_checked__"


def _check_noise_tunnel_arguments(arguments: dict) -> None:
    """What NoiseTunnel would fail on deep inside (nt_samples=0: a ZeroDivisionError) or run meaninglessly."""
    for name, allow_none in (("nt_samples", False), ("nt_samples_batch_size", True)):
        value = arguments.get(name)
        if value is None and allow_none:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise argument_error(name, f"must be an int >= 1, got {value!r}",
                                 "Pass the number of noisy samples per example, e.g. nt_samples=10"
                                 + (" (or leave nt_samples_batch_size out)" if allow_none else ""))
    inputs = arguments.get("inputs")
    for x in inputs if isinstance(inputs, tuple) else (inputs,):
        if isinstance(x, Tensor) and not x.is_floating_point():
            raise argument_error(
                "inputs", f"NoiseTunnel adds Gaussian noise to its inputs, and these are token ids ({x.dtype}): noisy "
                "ids are not tokens", "Smooth at the embeddings: fwd = EmbeddingForward(model); "
                "NoiseTunnel(BcosAttribution(fwd)).attribute(fwd.embed(input_ids, attention_mask), "
                "additional_forward_args=(attention_mask,), ...)", kind=BcosTypeError)


def install_noise_tunnel_checks() -> None:
    """Captum's ``NoiseTunnel.attribute`` checks its arguments first when it wraps :class:`BcosAttribution` or
    :class:`LayerBcos` (idempotent; run on import); other methods run through it unchanged."""
    original = NoiseTunnel.attribute
    if getattr(original, _CHECKED, False):
        return
    signature = inspect.signature(original)
    missing = [p for p in NOISE_TUNNEL_PARAMETERS if p not in signature.parameters]
    if missing:
        raise BcosRuntimeError(f"Captum's NoiseTunnel.attribute no longer takes {missing}; "
                               "bcos_plugins.adapters.captum.install_noise_tunnel_checks needs updating")

    @functools.wraps(original)
    def attribute(self, *args, **kwargs):
        method = getattr(self, "attribution_method", None)
        if isinstance(method, BcosAttribution | LayerBcos):
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            _check_noise_tunnel_arguments(bound.arguments)
        if isinstance(method, LayerBcos) and isinstance(method.layer, list):
            # Captum's own assertion on the per-layer list ("`inputs` must be a torch.Tensor or a tuple[torch.Tensor]
            # but found: <class 'list'>") named neither the layers nor the fix
            raise argument_error("layer", f"NoiseTunnel averages one attribution per input over its noisy samples, "
                                 f"and this LayerBcos attributes at {len(method.layer)} layers (a list, one per layer), "
                                 "which Captum's NoiseTunnel cannot average", "Smooth one layer at a time: one "
                                 "NoiseTunnel(LayerBcos(forward_func, layer=layer, model=model)) per layer")
        return original(self, *args, **kwargs)

    setattr(attribute, _CHECKED, True)
    NoiseTunnel.attribute = attribute


install_noise_tunnel_checks()


def visualization_records(
    explanation: TokenExplanation | None = None,
    tokenizer=None,
    *,
    scores: Sequence[Tensor] | None = None,
    tokens: Sequence[Sequence[str]] | None = None,
    logits: Tensor | None = None,
    true_labels: Sequence[int] | None = None,
    target: Sequence[int] | None = None,
    label_names: Sequence[str] | None = None,
    **renamed,
) -> list[VisualizationDataRecord]:
    """Captum ``VisualizationDataRecord``s, one per example.

    Either from a :class:`~bcos_plugins.attribution.TokenExplanation` plus its tokenizer (tokens, scores, explained
    class and completeness error are taken from it; ``logits`` = the model's class logits give the predicted
    class and its probability), or from any method's per-example ``scores`` and ``tokens``.
    ``convergence_score`` holds the completeness error for B-cos explanations (0 if unknown).
    Class ids are turned into ``label_names`` when given, as Captum's own examples do. ``target``: the attributed
    class per example (Captum's ``attr_class``; default the explanation's target, else the predicted class; with an
    explanation, only its own class is accepted).
    """
    refuse_renamed_keywords("visualization_records", renamed, {"attributed_class": "target"})
    if explanation is not None:
        require_token_explanation(explanation)
        if tokenizer is None:
            raise BcosValueError("visualization_records(explanation, tokenizer): the tokenizer is needed to turn "
                             "input ids into tokens")
        # as the token pages draw them: a byte-level BPE tokenizer's " café" was shown as "ĠcafÃ©"
        tokens = [shown_tokens(tokenizer, row) for row in explanation_tokens(explanation, tokenizer)]
        scores = explanation.scores()
        explained = explanation.target  # ids per row, or one Direction for every row
        own = [explained] * len(tokens) if isinstance(explained, Direction) else explained.tolist()
        if target is not None and not isinstance(explained, Direction) and len(target) == len(own):
            # the records labelled the explanation's scores (of its own class) as the scores of the class passed
            off = [i for i, (t, o) in enumerate(zip(target, own, strict=True))
                   if not (isinstance(t, numbers.Integral | Tensor) and int(t) == o)]
            if off:
                i = off[0]
                raise argument_error("target", f"names class {target[i]!r} for example {i}, but the explanation's "
                                     f"scores explain class {own[i]} ({len(off)} such examples)",
                                     "Leave target out with an explanation (its own class is used), or explain the "
                                     "class you want to show")
        target = target if target is not None else own
        delta = explanation.completeness_error.tolist()
        foil = getattr(explanation, "foil", None)
    else:
        if scores is None or tokens is None:
            raise BcosValueError("pass an Explanation (with its tokenizer) or both scores= and tokens=")
        delta = [0.0] * len(scores)
        foil = None
    n = len(scores)
    if len(tokens) != n:
        raise BcosValueError(f"{len(tokens)} token rows but {len(scores)} score rows")
    for argument, values in (("target", target), ("true_labels", true_labels)):
        # a shorter list failed with IndexError; a longer one (labels of the whole dataset for a batch of it) was
        # read from its start, so every record showed another example's class, silently
        if values is not None and len(values) != n:
            raise argument_error(argument, f"has {len(values)} entries for {n} explained examples",
                                 "Pass one per example, in the order of the explanation's rows")
    if logits is not None and (not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[0] != n):
        # a batch of another size failed with IndexError, or read another example's logits
        raise argument_error("logits", f"must be the class logits of the {n} explained examples, shape ({n}, "
                             f"n_classes), got {tuple(logits.shape) if isinstance(logits, Tensor) else type(logits)}",
                             "Pass model(...).logits of the batch you explained")
    label_names = require_label_names(label_names)  # one string was indexed by class id: "abc" named a, b and c
    if logits is not None and label_names is not None and len(label_names) != logits.shape[1]:
        # more names than classes (a 3-class dataset's names for a 2-class model) named every class by the name
        # of another, silently
        raise argument_error("label_names", f"has {len(label_names)} names, but logits have {logits.shape[1]} "
                             "classes", "Pass one name per class of the model, in class-id order "
                             "(model.config.id2label)")
    # class ids through the package's id parser: true_labels=[0.0, 1.7] showed class 1 for 1.7 and True class 1
    # (truncated, silently), names failed with "invalid literal for int()", and an id outside the classes was
    # blamed on label_names
    n_classes = len(label_names) if label_names is not None else logits.shape[1] if logits is not None else None
    if true_labels is not None:
        true_labels = require_row_ids("true_labels", true_labels, n, n_ids=n_classes, what="classes",
                                      broadcast=False).tolist()
    if target is not None and explanation is None:
        target = require_row_ids("target", target, n, n_ids=n_classes, what="classes", broadcast=False).tolist()

    def name(i):
        if i is None:
            return "-"
        if isinstance(i, Direction):
            return "a direction"
        if label_names is not None and not 0 <= int(i) < len(label_names):
            # was IndexError: list index out of range
            raise argument_error("label_names", f"has {len(label_names)} names, but class {int(i)} is shown",
                                 "Pass one name per class of the model (model.config.id2label)")
        return label_names[int(i)] if label_names is not None else int(i)

    records = []
    for i in range(n):
        # kept in the scores' precision (at least float32; Python floats as float64): a cast to float32 rounded a
        # float64 model's token scores and attr_score away from its explanation's (1e-8 of them)
        row = (scores[i].detach().cpu().to(at_least_float32(scores[i].dtype)) if isinstance(scores[i], Tensor)
               else torch.as_tensor(scores[i], dtype=torch.float64))
        if row.shape != (len(tokens[i]),):
            fix = ("Sum attributions over the embedding dimension first (Captum's (pos, dim) attributions: "
                   "attr.sum(-1))" if row.ndim == 2 and row.shape[0] == len(tokens[i])
                   else "Pass one score per token, padding removed from both")
            raise argument_error("scores", f"example {i} has {len(tokens[i])} tokens but scores of shape "
                                 f"{tuple(row.shape)}", fix)
        if not torch.isfinite(row).all():
            # a NaN score went into the record (attr_score NaN), and Captum's visualize_text failed on it later
            bad = (~torch.isfinite(row)).nonzero().flatten().tolist()
            raise argument_error("scores", f"example {i} has NaN or infinite scores at token positions {bad[:10]}",
                                 "Check the explanation (completeness_error) before building records from it")
        if logits is not None:
            probs = logits[i].detach().float().softmax(-1)
            pred = int(probs.argmax())
            pred_prob = float(probs[pred])
        else:
            pred, pred_prob = None, float("nan")
        attr_cls = name(target[i] if target is not None else pred)
        if foil is not None:  # a contrastive explanation's scores sum to target - foil, not to the target's logit
            against = ("a direction" if isinstance(foil, Direction) or foil.is_floating_point()
                       else name(foil[i] if foil.ndim else foil))
            attr_cls = f"{attr_cls} − {against}"
        at = explained_token_index(explanation, i) if explanation is not None else None
        if at is not None:  # a causal LM's output at one token, not the whole row's (the record has no other place)
            attr_cls = f"{attr_cls} at token {at} ({tokens[i][at]})"
        records.append(VisualizationDataRecord(
            word_attributions=row,
            pred_prob=pred_prob,
            pred_class=name(pred),
            true_class=name(true_labels[i] if true_labels is not None else None),
            attr_class=attr_cls,
            attr_score=float(row.sum()),
            raw_input_ids=list(tokens[i]),
            convergence_score=float(delta[i]),
        ))
    return records


def records_to_html(records: Sequence[VisualizationDataRecord], title: str = "Attributions") -> str:
    """A self-contained HTML page (no IPython) with the columns of Captum's ``visualize_text``."""
    from bcos_plugins.visualize import COLOUR_SCALE_NOTE, tokens_to_html

    iterable = hasattr(records, "__iter__") and not isinstance(records, str | Tensor)
    records = list(records) if iterable else records
    if not iterable or not all(isinstance(r, VisualizationDataRecord) for r in records):
        # an explanation failed with TypeError: ... is not iterable
        got = f"a {type(records).__name__}" if not iterable else \
            f"a sequence holding {sorted({type(r).__name__ for r in records})}"
        raise argument_error("records", f"must be Captum VisualizationDataRecords, got {got}",
                             "Build them with visualization_records(explanation, tokenizer), or write an explanation "
                             "directly with bcos_plugins.visualize.explanations_to_html", kind=BcosTypeError)
    head = ("<tr><th>True label</th><th>Predicted label (prob.)</th><th>Attribution label</th>"
            "<th>Attribution score</th><th>Convergence / completeness error</th><th>Word importance</th></tr>")
    rows = []
    for r in records:
        row_html = tokens_to_html(list(r.raw_input_ids), r.word_attributions)
        rows.append(
            f"<tr><td>{_html.escape(str(r.true_class))}</td>"
            f"<td>{_html.escape(str(r.pred_class))} ({r.pred_prob:.2f})</td>"
            f"<td>{_html.escape(str(r.attr_class))}</td><td>{r.attr_score:.4g}</td>"
            f"<td>{r.convergence_score:.2e}</td><td>{row_html}</td></tr>"
        )
    # the token column takes the width the others leave (a width hint, never a horizontal scrollbar)
    style = ("body{font-family:system-ui,sans-serif;margin:2em} table{border-collapse:collapse;width:100%} "
             "td:last-child{width:55%} "
             "td,th{border:1px solid #ccc;padding:.4em;vertical-align:top;text-align:left} "
             ".row{margin:0;line-height:2em} .tok{padding:.1em .2em;border-radius:.2em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{_html.escape(title)}</h1>"
            f"<p>green: supports the attributed class; red: opposes it.{COLOUR_SCALE_NOTE}</p>"
            f"<table>{head}{''.join(rows)}</table></body></html>")


def save_records_html(records: Sequence[VisualizationDataRecord], path: str | Path,
                      title: str = "Attributions") -> Path:
    """Write :func:`records_to_html` to ``path`` (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(records_to_html(records, title), encoding="utf-8")
    return path
