"""Exact contributions ``W(x) x`` at the combined embedding.

``explain`` runs the model inside :func:`~bcos_plugins.nn.explanation_mode` and takes input x gradient at
the combined embedding (word + position + token type for BERT-family and GPT-2; token embeddings for Llama,
whose positions enter through rotary query/key only). For a B-cos model the contributions summed over
tokens and embedding dimensions equal the explained logit (completeness); on a stock model the same call is
the "W(x)x from a conventional model" baseline (plain input x gradient) and does not sum to the logit.

Explained quantities:

- classifiers: the logit of ``target`` (default: the predicted class), or ``target - foil``;
- causal LMs: the next-token logit of ``target`` (one id per row) predicted at ``position`` (default: the
  last real token), or ``target - foil`` (contrastive, B-cos LM paper §7);
- base models: unit ``target`` (an index) or a direction (a float vector) of the hidden state at
  ``position`` (default: the first token for encoders, the last real token for decoders).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from .convert.architectures import ArchitectureSpec, spec_for
from .metrics.summary import completeness_error as _completeness_error
from .nn.dynamic import explanation_mode

__all__ = ["Explanation", "explain", "embedding_point", "last_real_position"]


@dataclass
class Explanation:
    """Result of :func:`explain`.

    Attributes:
        contributions: per-token scores, the embedding contributions reduced over the embedding dim
            (``reduce="sum"``: exact, sums to ``logits``; ``"mean"``: the papers' choice, same ranking).
        embedding_contributions: ``W(x) x`` per token and embedding dimension.
        logits: the explained values (a logit, or a difference of logits for contrastive explanations).
        target, foil, position: what was explained, per row (``position`` for decoders and base models).
        input_ids, attention_mask: the explained inputs.
    """

    contributions: Float[Tensor, "batch pos"]
    embedding_contributions: Float[Tensor, "batch pos d_model"]
    logits: Float[Tensor, " batch"]
    target: Tensor
    foil: Tensor | None
    position: Int[Tensor, " batch"] | None
    input_ids: Int[Tensor, "batch pos"] | None
    attention_mask: Int[Tensor, "batch pos"] | None
    reduce: str = "sum"

    @property
    def total(self) -> Float[Tensor, " batch"]:
        """Sum of all contributions per row (equals ``logits`` for B-cos models)."""
        return self.embedding_contributions.sum(dim=(1, 2))

    @property
    def completeness_error(self) -> Float[Tensor, " batch"]:
        """``|sum of contributions - explained logit| / |explained logit|`` per row."""
        return _completeness_error(self.embedding_contributions, self.logits)

    def tokens(self, tokenizer) -> list[list[str]]:
        """Tokens of each row (padding removed), aligned with :meth:`scores`."""
        rows = []
        for i, ids in enumerate(self.input_ids):
            keep = self.attention_mask[i].bool() if self.attention_mask is not None else slice(None)
            rows.append(tokenizer.convert_ids_to_tokens(ids[keep].tolist()))
        return rows

    def scores(self) -> list[Tensor]:
        """Per-token scores of each row with padding removed."""
        out = []
        for i, row in enumerate(self.contributions):
            keep = self.attention_mask[i].bool() if self.attention_mask is not None else slice(None)
            out.append(row[keep])
        return out


def last_real_position(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, " batch"]:
    """Index of the last non-padding token of each row (left or right padding)."""
    if not (attention_mask.sum(dim=1) > 0).all():
        raise ValueError("a row of attention_mask has no real token; remove empty rows before explaining")
    length = attention_mask.shape[1]
    return length - 1 - attention_mask.flip(dims=(1,)).to(torch.long).argmax(dim=1)


@contextmanager
def embedding_point(model: nn.Module, spec: ArchitectureSpec | None = None) -> Iterator[list[Tensor]]:
    """Capture the combined embedding as a fresh leaf requiring grad; yields a list filled on forward.

    The leaf replaces the tensor inside the forward pass, so gradients w.r.t. it are gradients at the
    attribution point (the embedding parameters themselves get none).
    """
    spec = spec or spec_for(model)
    module, where = spec.embedding_module(model)
    captured: list[Tensor] = []

    def as_leaf(t: Tensor) -> Tensor:
        leaf = t.detach().requires_grad_(True)
        captured.append(leaf)
        return leaf

    if where == "input":
        handle = module.register_forward_pre_hook(lambda m, args: (as_leaf(args[0]), *args[1:]))
    else:
        handle = module.register_forward_hook(lambda m, args, out: as_leaf(out))
    try:
        yield captured
    finally:
        handle.remove()


def _as_row_tensor(value, batch: int, name: str, device) -> Tensor:
    t = torch.as_tensor(value, device=device)
    if t.is_floating_point():
        return t
    t = t.to(torch.long)
    if t.ndim == 0:
        t = t.expand(batch)
    if t.shape != (batch,):
        raise ValueError(f"{name} must be an int or have shape (batch,) = ({batch},); got {tuple(t.shape)}")
    return t


def _select(values: Float[Tensor, "batch n"], index: Tensor, name: str) -> Float[Tensor, " batch"]:
    """Pick one entry per row by index, or project each row on a direction (float ``index``)."""
    n = values.shape[-1]
    if index.is_floating_point():
        if index.shape[-1] != n:
            raise ValueError(f"{name} direction has size {index.shape[-1]}, expected {n}")
        return (values * index.to(values.dtype)).sum(-1)
    if (index < 0).any() or (index >= n).any():
        raise ValueError(f"{name} ids must lie in [0, {n}); got {index.tolist()}")
    return values.gather(-1, index[:, None]).squeeze(-1)


def explain(
    model: nn.Module,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    *,
    target: int | Tensor | None = None,
    foil: int | Tensor | None = None,
    position: int | Tensor | None = None,
    reduce: Literal["sum", "mean"] = "sum",
    **forward_kwargs,
) -> Explanation:
    """Explain a batch with exact contributions at the combined embedding (see module docstring).

    Args:
        model: a B-cosified transformers model (or a stock one of a supported class: plain IxG).
        input_ids: token ids ``(batch, pos)``; padding on either side is fine with ``attention_mask``.
        attention_mask: 1 for real tokens, 0 for padding.
        target: class / token id / hidden unit per row (int or ``(batch,)``), or a float direction.
            Classifiers default to the predicted class; causal LMs and base models need one.
        foil: optional contrast; the explained value becomes ``target - foil``.
        position: decoders and base models: which position's output to explain (int or ``(batch,)``;
            negative ints count from the last real token, -1 being it). For decoders it must be a real
            token: the causal mask makes everything after it contribute exactly zero.
        reduce: ``"sum"`` (exact, default) or ``"mean"`` over the embedding dimension for token scores.
        **forward_kwargs: passed to the model (e.g. ``token_type_ids``).
    """
    if reduce not in ("sum", "mean"):
        raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    spec = spec_for(model)
    if input_ids.ndim != 2 or input_ids.is_floating_point():
        raise ValueError(f"input_ids must be integer ids of shape (batch, pos); got {tuple(input_ids.shape)} "
                         f"{input_ids.dtype}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    batch = input_ids.shape[0]
    device = input_ids.device
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    is_decoder = spec.kind == "decoder"
    if is_decoder and "position_ids" not in forward_kwargs:
        # As generate() does: positions count real tokens, so left padding does not shift them.
        forward_kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)

    with torch.enable_grad(), explanation_mode(model), embedding_point(model, spec) as captured:
        out = model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
        pos = None
        if spec.is_classifier:
            values = out.logits
            if target is None:
                target = values.argmax(-1)
        else:
            if target is None:
                raise ValueError(
                    "target is required for causal LMs (next-token ids) and base models (a hidden unit or "
                    "direction); only classifiers default to the predicted class"
                )
            hidden = out.logits if hasattr(out, "logits") and out.logits is not None else out.last_hidden_state
            last = last_real_position(mask)
            if position is None:
                pos = last if is_decoder else torch.zeros_like(last)
            else:
                pos = _as_row_tensor(position, batch, "position", device)
                pos = torch.where(pos < 0, last + 1 + pos, pos)
                if (pos < 0).any() or (pos >= input_ids.shape[1]).any():
                    raise ValueError(f"position out of range: {pos.tolist()}")
            if is_decoder:
                on_padding = mask[torch.arange(batch, device=device), pos] == 0
                if on_padding.any():
                    rows = on_padding.nonzero().flatten().tolist()
                    raise ValueError(
                        f"position {pos[on_padding].tolist()} of row(s) {rows} is a padding token; a decoder's "
                        "prediction there is meaningless. Pass a real token's index, or a negative position "
                        "(-1 = last real token, counted per row)."
                    )
            values = hidden[torch.arange(batch, device=device), pos]
        target_t = _as_row_tensor(target, batch, "target", device)
        explained = _select(values, target_t, "target")
        foil_t = None
        if foil is not None:
            foil_t = _as_row_tensor(foil, batch, "foil", device)
            explained = explained - _select(values, foil_t, "foil")
        (grad,) = torch.autograd.grad(explained.sum(), captured[0])
    emb = captured[0].detach()
    contrib = emb * grad
    tokens = contrib.sum(-1) if reduce == "sum" else contrib.mean(-1)
    return Explanation(
        contributions=tokens,
        embedding_contributions=contrib,
        logits=explained.detach(),
        target=target_t,
        foil=foil_t,
        position=pos,
        input_ids=input_ids,
        attention_mask=attention_mask,
        reduce=reduce,
    )
