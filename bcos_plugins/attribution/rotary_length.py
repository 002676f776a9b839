"""Rotary embeddings whose frequencies depend on the sequence length, and the padded batches they cannot compute row
by row as alone.

transformers' ``"dynamic"`` rotary scaling recomputes its frequencies from the longest position in the call once it
passes ``config.max_position_embeddings``, and ``"longrope"`` switches to its long factors past
``original_max_position_embeddings``. In a padded batch every row then gets the frequencies of the longest row, so a
shorter row is computed as another model than alone (measured 0.3-3 % off its own logit on tiny Llama / Qwen2
models), while the text paths promise each row as alone (:func:`~bcos_plugins.attribution.text.rows_as_alone_call`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import bad_rows
from ..convert.architectures import position_limit
from ..errors import argument_error

__all__ = ["refuse_length_dependent_rotary"]


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
                "Explain rows of equal length together, or one row at a time")
