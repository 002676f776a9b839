"""Rotary embeddings whose frequencies depend on the sequence length, and the padded batches they cannot compute row
by row as alone.

transformers' ``"dynamic"`` rotary scaling recomputes its frequencies from the longest position in the call once it
passes ``config.max_position_embeddings``, and ``"longrope"`` switches to its long factors past
``original_max_position_embeddings``. In a padded batch every row then gets the frequencies of the longest row, so a
shorter row is computed as another model than alone (measured 0.3-3 % off its own logit on tiny Llama / Qwen2
models), while the text paths promise each row as alone (:func:`~bcos_plugins.attribution.text.rows_as_alone_call`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import bad_rows
from ..convert.architectures import position_limit
from ..errors import argument_error

__all__ = ["forget_grown_rotary_frequencies", "refuse_length_dependent_rotary"]


def _rope_settings(config) -> list[dict]:
    """The model's rotary settings (``rope_parameters``, or the older ``rope_scaling``), one dict per layer type
    where they are given per layer type."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(rope, dict):
        return []
    nested = [value for value in rope.values() if isinstance(value, dict)]
    return nested or [rope]


def refuse_length_dependent_rotary(model: nn.Module, attention_mask: Tensor) -> None:
    """Refuse a padded batch whose shorter rows a length-dependent rotary embedding would compute with the longest
    row's frequencies (module docstring)."""
    config = getattr(model, "config", None)
    for rope in _rope_settings(config):
        rope_type = str(rope.get("rope_type") or rope.get("type") or "default")
        if "dynamic" in rope_type:  # grows with the longest position past config.max_position_embeddings
            # the registry's one reading of the limit: a rotary family's context is config.max_position_embeddings
            threshold, source = position_limit(model).context, "config.max_position_embeddings"
        elif rope_type == "longrope":  # long factors past original_max_position_embeddings
            threshold = rope.get("original_max_position_embeddings")
            source = "original_max_position_embeddings"
        else:
            continue
        if not isinstance(threshold, int):
            continue
        lengths = attention_mask.sum(-1)
        longest = int(lengths.max())
        if longest <= threshold:
            continue
        shorter = lengths < longest if "dynamic" in rope_type else lengths <= threshold
        if bool(shorter.any()):
            one = int(shorter.sum()) == 1
            verb, pronoun = ("is", "it") if one else ("are", "they")
            raise argument_error(
                "attention_mask",
                f"{bad_rows(shorter)} {verb} shorter than the batch's longest row ({longest} tokens), and the model's "
                f"rotary embedding (rope_type={rope_type!r}) takes its frequencies from the longest position past "
                f"{source}={threshold}: {pronoun} would be computed with other frequencies than alone",
                "Explain (or predict) rows of equal length together, or one row at a time (predict: batch_size=1)")


def forget_grown_rotary_frequencies(model: nn.Module) -> None:
    """Put back the original frequencies of a ``"dynamic"`` rotary embedding that an earlier, longer call grew, so that
    the next call computes its own length's frequencies, as the freshly loaded model does.

    transformers grows the frequencies to the longest position seen and keeps them (the cache of generation) until a
    call shorter than ``config.max_position_embeddings`` comes: a row between that and an earlier longer call's length
    was computed with the longer call's frequencies, so explaining (or predicting) it gave another number after a
    longer row than before it (0.09351 against 0.09338 on a tiny Llama with ``factor=2``), silently. This is
    transformers' own reset (``dynamic_rope_update``), done before every call instead of after a short one only.
    Nothing is read for a model without dynamic rotary scaling (its settings are looked at in the config first)."""
    if not any("dynamic" in str(rope.get("rope_type") or rope.get("type") or "")
               for rope in _rope_settings(getattr(model, "config", None))):
        return
    for module in model.modules():
        # read from the module's own attributes (transformers sets both in the rotary module's __init__): a getattr
        # of a missing one goes through nn.Module.__getattr__'s exception for every other module, and through a
        # TransformerLens bridge component's proxy to the module it wraps (about 700 us a call on a 2-layer Llama's
        # bridge, 155 modules; docs/benchmarks.md)
        state = vars(module)
        original, rope_type = state.get("original_max_seq_len"), state.get("rope_type")
        if original is None or rope_type is None:
            continue
        # one set of frequencies, or one per layer type (ModernBERT), each named with its type's prefix
        prefixes = ([""] if isinstance(rope_type, str) and "dynamic" in rope_type else
                    [f"{kind}_" for kind, name in rope_type.items() if "dynamic" in str(name)]
                    if isinstance(rope_type, dict) else [])
        for prefix in prefixes:
            cached_name = f"{prefix}max_seq_len_cached"
            cached = getattr(module, cached_name, getattr(module, "max_seq_len_cached", None))
            initial = getattr(module, f"{prefix}original_inv_freq", None)
            current = getattr(module, f"{prefix}inv_freq", None)
            if cached is None or not isinstance(initial, Tensor) or not isinstance(current, Tensor):
                continue
            if f"{prefix}inv_freq" not in module._buffers:
                # a wrapper that reads the frequencies from the module it wraps (a TransformerLens bridge's rotary
                # component, whose register_buffer failed: "attribute 'inv_freq' already exists"); that module is
                # among model.modules() too, and is put back itself
                continue
            if bool(torch.as_tensor(cached) > original):
                # a copy: the buffer must not alias the original frequencies, which transformers keeps for its reset
                module.register_buffer(f"{prefix}inv_freq", initial.to(current.device).clone(), persistent=False)
                setattr(module, cached_name, original)
