"""The adapters' one completeness warning (Captum's ``BcosAttribution`` and ``LayerBcos``, TransformerLens'
``explain_logits``); it imports no host library, so each adapter can use it without the others installed."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from bcos_plugins.explain import completeness_tolerance
from bcos_plugins.nn.functional import at_least_float32

# above float rounding (B-cos: about 1e-6 of the logit), below any share that matters
_INCOMPLETE = 1e-3


def warn_if_incomplete(contributions: Sequence[Tensor], explained: Tensor,
                       forward_autocast: Sequence[torch.dtype] = (), *, who: str,
                       missing_share: str | None, per_example: str = "the convergence delta",
                       stacklevel: int = 2) -> None:
    """Warn when the contributions miss part of the explained output. The forward ran in a lower precision than
    the contributions (``torch.autocast``, or the autocast ``Trainer(bf16=True)`` leaves in the forward, as
    ``explain`` detects it, ``forward_autocast``) and they miss it by no more than that precision's rounding:
    they are complete only to that rounding. Otherwise a miss beyond float rounding is a share that does not come
    from the attributed values: ``missing_share`` says why and the fix (``None``: the caller reports it itself).
    ``who`` names the caller, ``per_example`` what tells the miss per example, ``stacklevel`` as ``warnings.warn``
    counts it from the caller (2: the caller's caller)."""
    batch = explained.shape[0]
    flat = torch.cat([c.reshape(batch, -1) for c in contributions], dim=1)
    summed = at_least_float32(flat.dtype)  # a half-precision sum keeps 3 significant digits
    scale = explained.abs().to(summed) + flat.abs().sum(1, dtype=summed)
    gap = (flat.sum(1, dtype=summed) - explained.to(summed)).abs() / scale.clamp_min(torch.finfo(summed).tiny)
    rounding, precision = completeness_tolerance(flat, forward_autocast)
    low_precision = torch.finfo(precision).eps > torch.finfo(flat.dtype).eps
    if low_precision and (gap <= rounding).all():
        warnings.warn(
            f"{who}: the forward ran in {precision} (torch.autocast, or the autocast Trainer(bf16=True) "
            f"leaves in model.forward), so the attributions are complete only to {precision} rounding: they miss "
            f"the explained output by up to {float(gap.max()):.2g} of its size ({per_example} says by how "
            "much per example). For float32 completeness run the model outside autocast (after Trainer(bf16=True): "
            "trainer.accelerator.unwrap_model(model, keep_fp32_wrapper=False))", stacklevel=stacklevel + 1)
        return
    # the dtype's rounding as explain allows it (sqrt(eps)): 100 eps let a bfloat16 model's attributions at a
    # sublayer miss 99 % of the logit without a word (0.78 of the scale in bfloat16)
    tolerance = max(_INCOMPLETE, rounding)
    if missing_share is not None and (gap > tolerance).any():
        warnings.warn(
            f"{who}: the attributions do not sum to the explained output (they miss it by up to "
            f"{float(gap.max()):.2g} of its size; {per_example} says by how much per example): "
            f"{missing_share}", stacklevel=stacklevel + 1)
