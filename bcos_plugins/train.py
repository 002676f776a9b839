"""Training and persistence of B-cos models.

- :func:`bcos_loss`: binary cross-entropy on one-hot targets, from logits (numerically stable, unlike
  sigmoid-then-BCE), with transformers ``Trainer``'s ``compute_loss_func`` signature.
- :func:`load_bcos_model`: rebuild a model saved with ``save_pretrained`` after :func:`bcosify`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .convert.architectures import SPECS
from .convert.bcosify import BCOS_CONFIG_KEY, bcosify

__all__ = ["bcos_loss", "load_bcos_model"]


def bcos_loss(outputs, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """Binary cross-entropy from logits on one-hot targets (B-cos training objective).

    Usable directly as ``Trainer(..., compute_loss_func=bcos_loss)``. ``outputs`` is a model output with
    ``.logits`` (or the logits tensor); ``labels`` are class ids ``(batch,)``. The loss is the mean over
    rows and classes; with ``num_items_in_batch`` (gradient accumulation) rows are summed and divided by it.
    """
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    if logits.ndim != 2:
        raise ValueError(f"bcos_loss expects classifier logits of shape (batch, classes); got {tuple(logits.shape)}")
    if labels.is_floating_point() or labels.shape != logits.shape[:1]:
        raise ValueError(f"labels must be integer class ids of shape ({logits.shape[0]},); got "
                         f"{tuple(labels.shape)} {labels.dtype}")
    n_classes = logits.shape[-1]
    if (labels < 0).any() or (labels >= n_classes).any():
        raise ValueError(f"labels must lie in [0, {n_classes}); got {labels.tolist()}")
    one_hot = F.one_hot(labels.to(logits.device), n_classes).to(logits.dtype)
    if num_items_in_batch is None:
        return F.binary_cross_entropy_with_logits(logits, one_hot)
    per_row = F.binary_cross_entropy_with_logits(logits, one_hot, reduction="none").mean(-1)
    return per_row.sum() / num_items_in_batch


def load_bcos_model(path: str | Path, **from_pretrained_kwargs) -> nn.Module:
    """Reload a B-cos model written by ``model.save_pretrained(path)`` (safetensors only).

    The stock architecture recorded in ``config.bcos`` is loaded with transformers' own
    ``from_pretrained`` (sharding, dtype and device options work), converted again with the recorded B,
    and checked: the only weights transformers may report missing are the biases B-cos removes.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    settings = getattr(config, BCOS_CONFIG_KEY, None)
    if not isinstance(settings, dict) or "architecture" not in settings:
        raise ValueError(f"{path} has no B-cos settings in config.json (config.bcos); it was not saved from a "
                         "model converted with bcosify. Load it with transformers and call bcosify instead.")
    name = settings["architecture"]
    if name not in SPECS:
        raise ValueError(f"{path}: unknown B-cos architecture {name!r}; supported: {sorted(SPECS)}")
    import transformers

    cls = getattr(transformers, name)
    hf_logger = logging.getLogger("transformers.modeling_utils")
    level = hf_logger.level
    hf_logger.setLevel(logging.ERROR)  # the missing biases are expected; checked below instead
    try:
        model, info = cls.from_pretrained(path, config=config, use_safetensors=True,
                                          output_loading_info=True, **from_pretrained_kwargs)
    finally:
        hf_logger.setLevel(level)
    bcosify(model, b=settings["b"], verbose=False)
    dropped = set(model.bcos_report.dropped_biases)
    unexpected_missing = [k for k in info["missing_keys"] if k not in dropped]
    if unexpected_missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise ValueError(
            f"{path} does not match a B-cos {name}: missing {unexpected_missing}, unexpected "
            f"{info['unexpected_keys']}, mismatched {info.get('mismatched_keys')}"
        )
    model.eval()
    return model

