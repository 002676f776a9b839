"""Self-Guided Attention for transformers models: rationale masks inside the attention of the last L layers.

How the guidance reaches the forward pass (the reference code only edited the returned attention tensor,
so its guidance never changed a logit):

transformers 5 dispatches every BERT-family self-attention through ``AttentionInterface``, keyed by
``config._attn_implementation``. This module registers two implementations, ``"bcos_guided_eager"`` and
``"bcos_guided_sdpa"``, each with the matching ``AttentionMaskInterface`` entry (the stock ``eager_mask``
/ ``sdpa_mask``). Without that mask registration transformers would treat the key as a backend that needs
no mask and padding would be silently attended to. :func:`guide_attention` switches a model to the
guided key of its current implementation and marks the self-attention modules of its last L layers.

- A marked module called with ``rationale_mask`` (training only) runs eager attention with the guided
  logits of :func:`~bcos_plugins.guided.guidance.guide_scores`, then the padding mask, softmax, dropout.
- Every other call (unmarked layers, no mask, evaluation) delegates to the model's own implementation:
  its module's ``eager_attention_forward`` or transformers' ``sdpa``, with the mask that implementation
  expects. A guided model without a mask is therefore the same function as the stock model.

The gold mask travels as a forward keyword, ``model(input_ids, attention_mask=..., rationale_mask=M)``:
transformers passes unknown keywords down to the attention function. It is a training-time input only:
calling a guided model in eval mode with ``rationale_mask`` raises :class:`GoldMaskAtEvaluationError`, so
gold masks cannot leak into evaluation. Attention modules keep their class, so weights, ``save_pretrained``
and ``output_attentions`` are untouched; a saved guided model loads as a plain model (the implementation
key is not serialised).

Why the interface and not subclassed attention modules: every architecture that uses the interface
(BERT, RoBERTa, DistilBERT, ELECTRA, ...) gets guidance from one function, with its own projections and
forward left as they are, and ``bcosify`` (which replaces q/k/v projections) composes with it.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .._checks import bad_rows, require_int, require_tensor
from ..errors import BcosRuntimeError, BcosTypeError, argument_error
from ..nn.functional import at_least_float32
from .guidance import GuidanceMode, check_guidance, check_rationale_mask, guide_scores, unmasked

__all__ = [
    "GUIDED_IMPLEMENTATIONS",
    "GoldMaskAtEvaluationError",
    "RationaleGuidance",
    "guide_attention",
    "unguide_attention",
    "guided_layers",
    "attention_token_scores",
    "register_guided_attention",
]

GUIDANCE_ATTRIBUTE = "rationale_guidance"
_BASE_MASKS = {"eager": eager_mask, "sdpa": sdpa_mask}
GUIDED_IMPLEMENTATIONS = {base: f"bcos_guided_{base}" for base in _BASE_MASKS}
_BASE_OF = {name: base for base, name in GUIDED_IMPLEMENTATIONS.items()}


class GoldMaskAtEvaluationError(BcosRuntimeError):
    """A gold rationale mask was passed to a model in eval mode (masks are a training-time input only)."""


_EVAL_MESSAGE = ("rationale_mask: was passed to a model in eval mode, but gold masks are a training-time input only "
                 "and must not reach evaluation. Drop the rationale_mask column from evaluation batches "
                 "(or call model.train() if this really is a training step).")


@dataclass(frozen=True)
class RationaleGuidance:
    """Guidance settings of one attention module (see :mod:`bcos_plugins.guided.guidance`)."""

    mode: GuidanceMode = "multiply"
    strength: float = 1.0


def _module_eager(module: nn.Module) -> Callable:
    """The ``eager_attention_forward`` of the module's own modelling file (the stock eager fallback)."""
    for cls in type(module).__mro__:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if fn is not None:
            return fn
    raise TypeError(f"{type(module).__qualname__} has no eager_attention_forward in its modelling file; "
                    "rationale guidance supports modules that dispatch through transformers' AttentionInterface")


def _padding_as_additive(attention_mask: Tensor | None, scores: Tensor, is_causal: bool):
    """(additive mask, allowed keys) from an eager (float) or sdpa (bool / None) mask."""
    n_keys = scores.shape[-1]
    if attention_mask is None:
        if not is_causal:
            return None, None
        q = scores.shape[-2]
        allowed = torch.ones(q, n_keys, dtype=torch.bool, device=scores.device).tril(n_keys - q)
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask[..., :n_keys]
    else:
        additive = attention_mask[..., :n_keys]
        return additive, unmasked(additive)
    additive = torch.zeros(allowed.shape, dtype=scores.dtype, device=scores.device)
    return additive.masked_fill(~allowed, torch.finfo(scores.dtype).min), allowed


def _guided_eager(module, query, key, value, attention_mask, scaling, dropout, rationale_mask, guidance):
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if key.shape[1] != query.shape[1]:  # grouped-query attention: share key/value heads
        n_rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    additive, allowed = _padding_as_additive(attention_mask, scores, bool(getattr(module, "is_causal", False)))
    scores = guide_scores(scores, rationale_mask, guidance.mode, guidance.strength, allowed)
    if additive is not None:
        scores = scores + additive
    probs = nn.functional.softmax(scores, dim=-1)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return out, probs


def _make_guided_forward(base: str) -> Callable:
    def guided_attention_forward(
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        rationale_mask: Tensor | None = None,
        **kwargs,
    ):
        if rationale_mask is not None and not module.training:
            raise GoldMaskAtEvaluationError(_EVAL_MESSAGE)
        guidance = getattr(module, GUIDANCE_ATTRIBUTE, None)
        if guidance is None or rationale_mask is None:
            fn = _module_eager(module) if base == "eager" else ALL_ATTENTION_FUNCTIONS[base]
            return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        return _guided_eager(module, query, key, value, attention_mask, scaling, dropout, rationale_mask, guidance)

    guided_attention_forward.__name__ = f"guided_attention_forward_{base}"
    guided_attention_forward.__qualname__ = guided_attention_forward.__name__
    return guided_attention_forward


_FORWARDS = {base: _make_guided_forward(base) for base in _BASE_MASKS}


def register_guided_attention() -> None:
    """Register the guided implementations and their masks (idempotent; never overwrites a foreign entry)."""
    for base, name in GUIDED_IMPLEMENTATIONS.items():
        for interface, value in ((AttentionInterface, _FORWARDS[base]), (AttentionMaskInterface, _BASE_MASKS[base])):
            existing = interface._global_mapping.get(name)
            if existing is None:
                interface.register(name, value)
            elif existing is not value:
                raise BcosRuntimeError(
                    f"{interface.__name__} already has a different function registered as {name!r} "
                    f"({getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)}); "
                    "bcos_plugins will not overwrite it. Unregister it or use one of them only."
                )


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules()
            if type(m).__name__.endswith("SelfAttention") and hasattr(m, "config")]


def _set_implementation(model: nn.Module, name: str) -> None:
    seen = set()
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and id(config) not in seen and hasattr(config, "_attn_implementation"):
            seen.add(id(config))
            config._attn_implementation = name


GUARD_ATTRIBUTE = "_bcos_rationale_mask_guard"


def _rationale_mask_guard(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: a gold mask is refused at evaluation, and in training by a model with no guided layer;
    class labels outside ``[0, num_labels)`` are refused by name.

    transformers passes unknown keywords down to the attention functions, and the stock ones drop them, so
    without this hook a mask given to an unguided model (or at evaluation) would be silently ignored.
    """
    _check_class_labels(model, kwargs.get("labels"))
    mask = kwargs.get("rationale_mask")
    if mask is None:
        return
    if not model.training:
        raise GoldMaskAtEvaluationError(_EVAL_MESSAGE)
    if not guided_layers(model):
        raise BcosRuntimeError(
            "rationale_mask: was passed to a model with no guided layer, so it would be silently ignored. Call "
            "guide_attention(model, ...) first, or drop the rationale_mask column (an unguided baseline trains "
            "without it).")
    _require_guided_implementation(model)
    ids = kwargs.get("input_ids", args[0] if args and isinstance(args[0], Tensor) else None)
    if isinstance(ids, Tensor) and ids.ndim == 2:
        check_rationale_mask(mask, *ids.shape)
    else:
        check_rationale_mask(mask)


def _require_guided_implementation(model: nn.Module) -> None:
    """The guided layers must still dispatch to a guided attention function: ``model.set_attn_implementation("sdpa")``
    (or ``"eager"``) after :func:`guide_attention` put the stock function back, which drops the mask, and the model
    trained unguided with its guidance attribute still set, without a word."""
    stale = sorted({implementation for _, m in model.named_modules()
                    if getattr(m, GUIDANCE_ATTRIBUTE, None) is not None
                    and (implementation := getattr(getattr(m, "config", None), "_attn_implementation", None))
                    not in _BASE_OF})
    if stale:
        raise BcosRuntimeError(
            f"rationale_mask: the guided layers now use the attention implementation {stale[0]!r} (set after "
            "guide_attention, e.g. by model.set_attn_implementation), whose attention function drops the mask, so "
            "this step would train unguided. Call guide_attention(model, ...) again after changing the attention "
            "implementation.")


def _check_class_labels(model: nn.Module, labels) -> None:
    """Class-id labels of a sequence / token classifier must lie in ``[0, num_labels)`` (or be -100, the rows
    transformers' cross-entropy skips); torch's cross-entropy would fail with an opaque index error (on a GPU, a
    device-side assert) after the whole forward pass.

    Not the package's id parser (``_checks.require_row_ids``), on purpose: this guard runs inside every forward
    of a transformers model and refuses only what transformers' own loss would fail on, so it takes labels of
    any shape (a token classifier's are ``(batch, pos)``), the ``-100`` entries that loss skips, and float
    labels (regression, multi-label) unchecked, where ``require_row_ids`` reads one id per row for the
    package's own entry points and refuses all three."""
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex() \
            or labels.dtype == torch.bool:
        return  # float labels are regression / multi-label targets, which have no class range
    config = getattr(model, "config", None)
    n_labels = getattr(config, "num_labels", None)
    if getattr(config, "problem_type", None) not in (None, "single_label_classification") \
            or not isinstance(n_labels, int) or n_labels < 2 \
            or not any(c.__name__.endswith(("ForSequenceClassification", "ForTokenClassification"))
                       for c in type(model).__mro__):
        return
    bad = ((labels < 0) & (labels != -100)) | (labels >= n_labels)
    if bad.any():
        raise argument_error("labels", f"must be class ids in [0, {n_labels}) (or -100 to skip), got "
                             f"{labels[bad].flatten()[:8].tolist()} in {bad_rows(bad)}",
                             f"The model has config.num_labels = {n_labels}: map the dataset's labels to "
                             f"0..{n_labels - 1}, or build the model with the dataset's number of classes")


def _install_guard(model: nn.Module) -> None:
    if getattr(model, GUARD_ATTRIBUTE, None) is None:
        handle = model.register_forward_pre_hook(_rationale_mask_guard, with_kwargs=True)
        object.__setattr__(model, GUARD_ATTRIBUTE, handle)


def guided_layers(model: nn.Module) -> list[str]:
    """Names of the attention modules that currently carry rationale guidance."""
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"must be a torch model, got {type(model).__name__}", "Pass the model",
                             kind=BcosTypeError)
    return [name for name, m in model.named_modules() if getattr(m, GUIDANCE_ATTRIBUTE, None) is not None]


def guide_attention(
    model: nn.Module,
    *,
    mode: GuidanceMode = "multiply",
    strength: float = 1.0,
    last_layers: int = 4,
) -> list[str]:
    """Guide the self-attention of the last ``last_layers`` layers of ``model`` by rationale masks (in place).

    Args:
        model: a transformers BERT-family model (any class whose self-attention modules, named
            ``*SelfAttention``, dispatch through ``AttentionInterface``) using ``eager`` or ``sdpa`` attention.
            Use eager if you need ``output_attentions`` (sdpa returns no attention weights).
        mode: ``"multiply"`` (Eq. 3, the paper's choice), ``"add"`` (Eq. 4), ``"replace"`` (Eq. 5) or
            ``"log1p"`` (renormalised product); see :mod:`bcos_plugins.guided.guidance`.
        strength: lambda >= 0 (ignored by ``"replace"``).
        last_layers: how many of the last layers to guide (the paper uses 4).

    Then train with ``model(**batch, rationale_mask=gold)`` and evaluate without ``rationale_mask``.
    Calling it again replaces the previous settings. Returns the names of the guided modules.
    """
    mode, strength = check_guidance(mode, strength)
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"must be a transformers model (torch.nn.Module), got {type(model).__name__}",
                             "Pass e.g. AutoModelForSequenceClassification.from_pretrained(...)", kind=BcosTypeError)
    modules = _attention_modules(model)
    if not modules:
        raise TypeError(
            f"{type(model).__name__} has no '*SelfAttention' modules that dispatch through transformers' "
            "AttentionInterface; rationale guidance supports BERT-family encoders (BERT, RoBERTa, DistilBERT, "
            "ELECTRA, ...)."
        )
    if isinstance(last_layers, bool) or not isinstance(last_layers, int) or not 1 <= last_layers <= len(modules):
        raise argument_error("last_layers", f"last_layers must be an int in [1, {len(modules)}] for this model, got "
                             f"{last_layers!r}", "Pass how many of the last layers to guide (the paper uses 4)")
    current = model.config._attn_implementation
    base = _BASE_OF.get(current, current)
    if base not in GUIDED_IMPLEMENTATIONS:
        raise ValueError(
            f"rationale guidance needs eager or sdpa attention; this model uses {current!r}. Load it with "
            "attn_implementation='eager' (or call model.set_attn_implementation('eager')) first."
        )
    register_guided_attention()
    unguide_attention(model, restore_implementation=False)
    for _, m in modules[-last_layers:]:
        setattr(m, GUIDANCE_ATTRIBUTE, RationaleGuidance(mode, strength))
    _set_implementation(model, GUIDED_IMPLEMENTATIONS[base])
    _install_guard(model)
    return [name for name, _ in modules[-last_layers:]]


def unguide_attention(model: nn.Module, *, restore_implementation: bool = True) -> None:
    """Remove rationale guidance (the model's attention implementation goes back to eager/sdpa).

    The model keeps a guard (a forward pre-hook) that refuses ``rationale_mask`` from then on: at evaluation
    with :class:`GoldMaskAtEvaluationError`, in training because no layer would use it. Calling it on a model
    that was never guided installs the same guard, which is how to build the unguided baseline of a
    comparison: a stock transformers model silently drops the unknown keyword.
    """
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"must be a transformers model (torch.nn.Module), got {type(model).__name__}",
                             "Pass the model that guide_attention was given", kind=BcosTypeError)
    _install_guard(model)
    for m in model.modules():
        if getattr(m, GUIDANCE_ATTRIBUTE, None) is not None:
            delattr(m, GUIDANCE_ATTRIBUTE)
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if restore_implementation and current in _BASE_OF:
        _set_implementation(model, _BASE_OF[current])


def _check_attention_weights(weights: Tensor, layer: int) -> None:
    """Refuse what is not softmax attention: NaN / inf (a diverged step would make every score and the loss
    NaN), negative values or rows that do not sum to 1 (scores before the softmax).

    Rows are checked on average: the weights a training forward returns are after attention dropout, which
    zeroes some and scales the rest by ``1 / (1 - p)``, so single rows sum to 1 only in expectation."""
    values = weights.detach()
    finite = torch.isfinite(values)
    # one device synchronisation per layer and training step, not three
    has_bad, has_negative, mean_row_sum = torch.stack([
        (~finite).any().float(), (values < 0).any().float(), values.float().sum(-1).mean()]).tolist()
    if has_bad:
        raise argument_error("attentions", f"layer {layer} holds NaN or inf in batch {bad_rows(~finite)}",
                             "The forward pass diverged or got non-finite inputs (check the inputs, the learning "
                             "rate and the loss of the previous steps); NaN attention would make the loss NaN")
    if has_negative:
        raise argument_error("attentions", f"layer {layer} has negative values (down to {values.min().item():.3g}), "
                             "so these are attention scores before the softmax, not attention weights",
                             "Pass model(..., output_attentions=True).attentions (eager attention), which are "
                             "the softmax outputs")
    if abs(mean_row_sum - 1.0) > 0.1:
        raise argument_error("attentions", f"layer {layer}'s rows sum to {mean_row_sum:.4g} on average, not 1, so "
                             "these are not softmax attention weights (scores before the softmax, or a sum over "
                             "heads)", "Pass model(..., output_attentions=True).attentions (eager attention)")


def _as_indices(value):
    """An index given as a NumPy or torch integer (a scalar, or a 1-d array / tensor of them) as Python's ``int`` or
    ``list`` of ints; anything else as given. ``layers=np.int64(-1)`` or ``heads=torch.tensor([0, 1])`` were refused as
    "must be a layer index or a list of them", while ``query_position`` and the entries of a list took NumPy integers."""
    if isinstance(value, bool | int | None | tuple | list | range):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, Tensor | np.ndarray) and value.ndim <= 1 and not value.dtype == torch.bool \
            and not (isinstance(value, Tensor) and value.is_floating_point()) \
            and not (isinstance(value, np.ndarray) and value.dtype.kind not in "iu"):
        return value.tolist()
    return value


def attention_token_scores(
    attentions: Sequence[Float[Tensor, "batch head query key"]],
    layers: int | Sequence[int] = -1,
    query_position: int = 0,
    heads: int | Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
) -> Float[Tensor, "batch key"]:
    """Token scores from attention weights: the attention of ``query_position`` ([CLS] by default) to each
    key, averaged over ``heads`` (all by default; an index or distinct indices) and over ``layers`` (an index
    or distinct indices into ``attentions``).

    The selected layers must hold softmax attention: NaN / inf, negative values (scores before the softmax)
    and rows that do not sum to 1 on average are refused.

    ``attentions`` is ``model(..., output_attentions=True).attentions`` (eager attention).

    ``query_position`` is a column of the batch (negative: from the last column), the same in every row. Attention
    weights cannot show padding (a padding token's query row is a softmax over the real keys like any other), so
    on a left-padded batch column 0 is a padding token's for the padded rows, and with right padding so is a
    negative column: their scores would be that token's attention, silently. Pass the batch's ``attention_mask``
    ``(batch, key)`` to have that refused; without it, padding is not checked.
    """
    if not isinstance(attentions, tuple | list):
        raise argument_error("attentions", f"must be the per-layer tuple of attention weights, got "
                             f"{type(attentions).__name__}", "Pass model(..., output_attentions=True).attentions",
                             kind=BcosTypeError)
    if not attentions or any(a is None for a in attentions):
        raise argument_error("attentions", "holds no attention weights", "Run the model with output_attentions=True "
                             "and eager attention (sdpa returns none)")
    n_layers = len(attentions)
    for i, a in enumerate(attentions):
        if not isinstance(a, Tensor) or a.ndim != 4 or a.shape != attentions[0].shape:
            raise argument_error("attentions", f"entry {i} is not a (batch, head, query, key) tensor of the same "
                                 f"shape as entry 0, got {getattr(a, 'shape', type(a).__name__)}",
                                 "Pass model(..., output_attentions=True).attentions")
    layers, heads = _as_indices(layers), _as_indices(heads)
    if not isinstance(layers, int) and not isinstance(layers, tuple | list | range):
        raise argument_error("layers", f"must be a layer index or a list of them, got {layers!r}",
                             "Pass e.g. -1 or [-2, -1]", kind=BcosTypeError)
    index = [layers] if isinstance(layers, int) else list(layers)
    if not index:
        raise argument_error("layers", "is empty", "Pass a layer index or a non-empty list of them")
    index = [require_int("layers", i, minimum=-n_layers, maximum=n_layers - 1) % n_layers for i in index]
    if len(set(index)) != len(index):
        # [0, 1, -1] on two layers is [0, 1, 1]: layer 1 would silently weigh twice in the mean
        raise argument_error("layers", f"repeats a layer: {list(layers)} is {index} on {n_layers} layers",
                             "Pass distinct layer indices (negative ones count from the last layer)")
    for i in index:
        _check_attention_weights(attentions[i], i)
    n_queries = attentions[0].shape[2]
    query_position = require_int("query_position", query_position, minimum=-n_queries, maximum=n_queries - 1)
    if attention_mask is not None:
        batch, n_keys = attentions[0].shape[0], attentions[0].shape[3]
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != (batch, n_keys):
            raise argument_error("attention_mask", f"must have shape (batch, key) = ({batch}, {n_keys}), got "
                                 f"{tuple(getattr(attention_mask, 'shape', ()))}", "Pass the batch's attention mask")
        # 0/1 only: a NaN passed the padding check here and made attention_supervision_loss 0 without a word
        attention_mask = require_tensor("attention_mask", attention_mask, kind="mask")
        on_padding = attention_mask[:, query_position] == 0
        if on_padding.any():
            raise argument_error(
                "query_position", f"column {query_position} is padding in {bad_rows(on_padding)} (attention_mask), "
                "so their scores would be a padding token's attention, not the query token's",
                "Pad on the right (tokenizer.padding_side = 'right') for query_position=0 ([CLS]), or pass a column "
                "that is real in every row")
    n_heads = attentions[0].shape[1]
    if heads is None:
        head_index = list(range(n_heads))
    else:
        if not isinstance(heads, int) and not isinstance(heads, tuple | list | range):
            raise argument_error("heads", f"must be a head index or a list of them, got {heads!r}",
                                 "Pass e.g. 0 or [0, 1], or None for all heads", kind=BcosTypeError)
        head_index = [heads] if isinstance(heads, int) else list(heads)
        if not head_index:
            raise argument_error("heads", "is empty", "Pass a head index or a non-empty list of them, or None for "
                                 "all heads")
        head_index = [require_int("heads", h, minimum=-n_heads, maximum=n_heads - 1) % n_heads for h in head_index]
        if len(set(head_index)) != len(head_index):
            # a repeated head would silently weigh twice in the mean
            raise argument_error("heads", f"repeats a head: {list(heads)}", "Pass distinct head indices")
    picked = torch.stack([attentions[i][:, head_index, query_position, :] for i in index])  # (layer, batch, head, key)
    # in at least float32: a half-precision mean rounded the scores, and attention_supervision_loss of bf16 attentions
    # was up to 3.5% off the loss of the values it was given
    return picked.mean(dim=(0, 2), dtype=at_least_float32(picked.dtype))
