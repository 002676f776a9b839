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

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .guidance import GuidanceMode, check_guidance, guide_scores

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


class GoldMaskAtEvaluationError(RuntimeError):
    """A gold rationale mask was passed to a model in eval mode (masks are a training-time input only)."""


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
        return additive, additive > torch.finfo(additive.dtype).min / 2
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
            raise GoldMaskAtEvaluationError(
                "rationale_mask was passed to a model in eval mode: gold masks are a training-time input only "
                "and must not reach evaluation. Drop the rationale_mask column from evaluation batches "
                "(or call model.train() if this really is a training step)."
            )
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
                raise RuntimeError(
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


def guided_layers(model: nn.Module) -> list[str]:
    """Names of the attention modules that currently carry rationale guidance."""
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
    modules = _attention_modules(model)
    if not modules:
        raise TypeError(
            f"{type(model).__name__} has no '*SelfAttention' modules that dispatch through transformers' "
            "AttentionInterface; rationale guidance supports BERT-family encoders (BERT, RoBERTa, DistilBERT, "
            "ELECTRA, ...)."
        )
    if not isinstance(last_layers, int) or not 1 <= last_layers <= len(modules):
        raise ValueError(f"last_layers must be an int in [1, {len(modules)}] for this model; got {last_layers!r}")
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
    return [name for name, _ in modules[-last_layers:]]


def unguide_attention(model: nn.Module, *, restore_implementation: bool = True) -> None:
    """Remove rationale guidance (the model's attention implementation goes back to eager/sdpa)."""
    for m in model.modules():
        if getattr(m, GUIDANCE_ATTRIBUTE, None) is not None:
            delattr(m, GUIDANCE_ATTRIBUTE)
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if restore_implementation and current in _BASE_OF:
        _set_implementation(model, _BASE_OF[current])


def attention_token_scores(
    attentions: Sequence[Float[Tensor, "batch head query key"]],
    layers: int | Sequence[int] = -1,
    query_position: int = 0,
) -> Float[Tensor, "batch key"]:
    """Token scores from attention weights: the attention of ``query_position`` ([CLS] by default) to each
    key, averaged over heads and over ``layers`` (an index or indices into ``attentions``).

    ``attentions`` is ``model(..., output_attentions=True).attentions`` (eager attention).
    """
    if not attentions or any(a is None for a in attentions):
        raise ValueError("no attention weights: run the model with output_attentions=True and eager attention "
                         "(sdpa returns none)")
    index = [layers] if isinstance(layers, int) else list(layers)
    picked = torch.stack([attentions[i][:, :, query_position, :] for i in index])  # (layer, batch, head, key)
    return picked.mean(dim=(0, 2))
