"""Explanation entropy, completeness error, and the time / peak memory an explanation costs.

- entropy (B-cos LM paper §5, Fig. 5): of the distribution ``p_i = |s_i| / sum_j |s_j|`` over a row's real
  tokens, in nats; low = a few tokens carry the explanation. A row of zeros has entropy 0.
- completeness error: ``|sum of attributions - explained value| / |explained value|`` per example, the
  package's one definition (:func:`bcos_plugins.attribution.results.relative_completeness_error`). An explained
  value of exactly 0 has no relative error: its ``|explained|`` is floored at ``1e-12``, so the result is 0
  for an exactly complete explanation and at least 1 once ``|delta| >= 1e-12`` (never NaN or inf); pass
  ``relative=False`` for the absolute error ``|delta|`` there. The sum and the difference are computed in the wider
  of the two dtypes (float64 when either is): the error is that of the numbers as given, so float32 attributions of
  a float64 logit report the real gap even below their own rounding (about ``6e-8`` relative), where it measures
  that rounding rather than a missing share; the attributions' dtype bounds how complete they can be.
- :func:`measure_cost`: wall-clock seconds and peak memory of one call. On CUDA the peak is
  ``torch.cuda.max_memory_allocated`` above the level before the call. On CPU it is the peak resident set
  size of the process above the level before the call (PyTorch's CPU allocator is invisible to
  ``tracemalloc``). On Linux the kernel keeps that peak itself (``VmHWM``), and writing ``5`` to
  ``/proc/self/clear_refs`` resets it to the current size, so the peak is exact and nothing runs next to the
  measured call. Where that file cannot be written (other systems, some sandboxes) a background thread samples
  the resident size every millisecond instead: it can miss short spikes (a lower bound) and, on a machine with
  few cores, competes with the call for CPU (``Cost.memory_method`` says which was used). Before a CPU
  measurement, freed heap memory is handed back to the OS (glibc ``malloc_trim``, where available), so that
  memory cached by an earlier call does not hide this call's peak.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._checks import (
    require_available_device,
    require_bool,
    require_real_tokens,
    require_same_shape,
    require_tensor,
)
from ..attribution.results import relative_completeness_error
from ..errors import BcosTypeError, argument_error
from ..nn.functional import at_least_float32
from .attributions import (
    masked_positions_zeroed,
    numbers_as_one_tensor,
    refuse_boolean_scores,
    refuse_table_of_rows,
    scores_and_positions,
    token_scores,
)

__all__ = ["Cost", "completeness_error", "explanation_entropy", "measure_cost"]


def explanation_entropy(attributions, attention_mask: Int[Tensor, "batch pos"] | None = None,
                        reduce: str = "sum") -> Float[Tensor, " batch"]:
    """Entropy (nats) of the normalised absolute token scores of each row (padding excluded: a NaN or infinite value at a
    masked position is ignored with the rest of it, one at a real position is refused).

    ``attributions`` are read as every metric reads them (:func:`~bcos_plugins.metrics.token_scores`); an explanation of
    the package brings its ``attention_mask``, the default here as in the other metrics. A 2-D float tensor (or
    Captum's tuple holding one) without ``attention_mask`` is refused: it reads as ``(batch, pos)`` token scores or as
    one example's ``(pos, d_model)`` attributions (Captum's ``attr[0]``), and unlike the other metrics nothing here
    checks its shape against the input, so the second was read as ``pos`` rows of ``d_model`` "tokens", silently. Pass
    ``attention_mask`` (``(batch, pos)``; ``torch.ones_like(scores)`` for token scores without padding) or
    ``attributions[None]``. Lists and NumPy arrays of scores (written per token) keep the ``(batch, pos)`` reading.

    A row whose real tokens all score exactly 0 (an explanation of nothing: no distribution) has entropy 0, the
    documented value, which in a mean over rows reads as "all of the explanation on one token". Exclude such rows
    before averaging: ``h = explanation_entropy(scores, mask); h[(scores.abs() * mask).sum(-1) > 0].mean()`` for
    ``(batch, pos)`` scores, ``h[torch.stack([s.abs().sum() > 0 for s in explanation.scores()])].mean()`` for an
    explanation.
    """
    # an explanation of the package: its contributions, its attention_mask the default (scores_and_positions, as the
    # rationale and MRR metrics): its padding counted in the entropy of a padded batch
    if attention_mask is None and not hasattr(attributions, "input_contributions"):  # an explanation says its shape
        _refuse_ambiguous_matrix(attributions)
    attributions, attention_mask = scores_and_positions(attributions, attention_mask, reduce)
    if attention_mask is not None:
        attention_mask = require_tensor("attention_mask", attention_mask, ndim=2, kind="mask")
        attributions = masked_positions_zeroed(attributions, attention_mask)
    scores = token_scores(attributions, reduce=reduce).abs()
    if attention_mask is not None:
        require_same_shape("attention_mask", attention_mask, "attributions (as token scores)", scores)
        # a row of padding only read entropy 0, "all of the explanation on one token", of a row with no token
        require_real_tokens(attention_mask)
        scores = scores * attention_mask.to(scores.device, scores.dtype)
    # the entropy does not depend on the scale, so each row is divided by its largest score first: a row of scores
    # below the 1e-30 floor (a float64 B-cos ViT at B = 10 explains logits of 1e-57) read as almost no entropy
    largest = scores.amax(-1, keepdim=True) if scores.shape[-1] else scores.sum(-1, keepdim=True)
    scores = scores / torch.where(largest > 0, largest, torch.ones_like(largest))
    total = scores.sum(-1, keepdim=True)
    p = scores / total.clamp_min(1e-30)
    return -(torch.where(p > 0, p * p.clamp_min(1e-30).log(), torch.zeros_like(p))).sum(-1)


def _refuse_ambiguous_matrix(attributions) -> None:
    """Refuse a 2-D float tensor (or a one-tensor tuple holding one) given without a mask (see
    :func:`explanation_entropy`)."""
    one = isinstance(attributions, (tuple, list)) and len(attributions) == 1 and isinstance(attributions[0], Tensor)
    values = attributions[0] if one else attributions
    if isinstance(values, Tensor) and values.ndim == 2 and values.is_floating_point():
        rows, cols = values.shape
        raise argument_error("attributions", f"are a 2-D tensor of shape ({rows}, {cols}) without attention_mask, "
                             f"which reads two ways: {rows} rows of {cols} token scores (batch, pos), or one example's "
                             f"attributions of {rows} tokens over {cols} embedding dimensions (pos, d_model), whose "
                             f"entropy would be taken over the {cols} dimensions as tokens",
                             "Pass attention_mask= (batch, pos) for token scores (torch.ones_like(scores) without "
                             "padding), or attributions[None] for one example's (pos, d_model) attributions")


def completeness_error(attributions, explained: Float[Tensor, " batch"] | None = None,
                       relative: bool = True) -> Float[Tensor, " batch"]:
    """``|sum(attributions) - explained|`` per example, divided by ``|explained|`` when ``relative``.

    ``attributions`` may be an explanation of the package (its ``input_contributions``); ``explained`` then
    defaults to the values it explained. A tuple of tensors holds one input's attributions each (Captum's); scores
    written as numbers (a list of rows, a NumPy array) are one tensor ``(batch, ...)``, as every metric reads them. See the module docstring for an explained value of 0 (finite,
    documented, never NaN or inf).
    """
    # relative="no" (a setting read from text) gave the relative error, silently: 0.25 for an absolute gap of 1
    relative = require_bool("relative", relative, fix="Pass relative=True (|delta| / |explained|) or relative=False "
                            "(the absolute error |delta|)")
    if hasattr(attributions, "input_contributions"):  # any result type of the attribution core
        # completeness_error(explanation) failed with "missing 1 required positional argument: 'explained'"
        explained = attributions.explained if explained is None else explained
        attributions = attributions.input_contributions
    elif explained is None:
        refuse_table_of_rows(attributions)  # explain_dataset's table was named "a tensor" below
        raise argument_error("explained", "is missing: the attributions are a tensor, which does not say what they "
                             "explain", "Pass the explained value per example (e.g. the target logits), or the "
                             "explanation itself as attributions", kind=BcosTypeError)
    # scores written as numbers (nested lists: one list per row) are one tensor, as every metric reads them; a tuple
    # of tensors is one per input (Captum's)
    attributions = numbers_as_one_tensor(attributions)
    parts = list(attributions) if isinstance(attributions, (tuple, list)) else [attributions]
    if not parts:
        raise argument_error("attributions", "is an empty tuple", "Pass the attributions of every input")
    flat = []
    for a in parts:
        a = require_tensor("attributions", a, kind="real")
        # a mask summed as its count of True entries, silently (every other metric refuses boolean scores)
        refuse_boolean_scores("attributions", a, fix="Pass the float attributions (a mask's float() if it is meant "
                              "as scores)")
        if a.ndim == 0 or a.shape[0] == 0:
            raise argument_error("attributions", f"need a non-empty batch dimension, got shape {tuple(a.shape)}",
                                 "Pass (batch, ...) attributions")
        flat.append(a.detach().reshape(a.shape[0], -1))
    if len({f.shape[0] for f in flat}) > 1:
        raise argument_error("attributions", f"tensors disagree on the batch size: {[f.shape[0] for f in flat]}",
                             "Pass the attributions of one batch")
    explained = require_tensor("explained", explained, kind="real").detach()  # Python floats read in float64
    # summed and compared in the wider dtype of the two, at least float32 (a float16 / bfloat16 sum keeps 3
    # significant digits, see Explanation.total), float64 for integers: a float64 explained value was cast to the
    # float32 attributions' dtype, so any gap below its float32 rounding (1e-9 of a logit) read 0, exact, and one
    # beyond float32's range was refused; float32 parts are then summed in float64 too (their float32 sum rounds)
    dtype = torch.float32
    for t in (*flat, explained):
        dtype = torch.promote_types(dtype, at_least_float32(t.dtype) if t.is_floating_point() else torch.float64)
    total = sum(f.sum(-1, dtype=dtype) if f.is_floating_point() else f.sum(-1).to(dtype) for f in flat)
    explained = explained.to(total.device, dtype)
    require_same_shape("explained", explained, "attributions (summed per example)", total,
                       "Pass one explained value per example")
    if relative:
        return relative_completeness_error(total - explained, explained)
    return (total - explained).abs()


@dataclass
class Cost:
    """What one call cost: ``seconds`` (wall clock) and ``peak_bytes`` above the level before it."""

    seconds: float
    peak_bytes: int
    device: str
    memory_method: str = "cuda_allocator"

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20


def _rss_bytes() -> int:
    try:
        import psutil

        return psutil.Process(os.getpid()).memory_info().rss
    except ImportError:  # Linux without psutil
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _release_freed_memory() -> None:
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline may include cached memory
        pass


def _high_water_mark_bytes() -> int | None:
    """The kernel's peak resident size of this process (Linux ``VmHWM``), or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_high_water_mark() -> bool:
    """Reset ``VmHWM`` to the current resident size (Linux >= 4.0); False where that is not possible."""
    if _high_water_mark_bytes() is None:
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class _RssSampler:
    """Fallback peak tracker: polls the resident size from a thread (a lower bound; costs CPU)."""

    def __init__(self, interval: float = 1e-3):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(self.interval)

    def __enter__(self):
        self.peak = _rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def measure_cost(fn: Callable[..., Any], *args, device: str | torch.device | None = None,
                 **kwargs) -> tuple[Any, Cost]:
    """Run ``fn(*args, **kwargs)`` once; return its result and its :class:`Cost`.

    ``device``: where the work runs (default: CUDA if available, else CPU); decides how memory is measured.
    """
    if not callable(fn):
        raise argument_error("fn", f"must be callable, got {type(fn).__name__}", "Pass the function to measure",
                             kind=BcosTypeError)
    # the package's one device check, naming device: CUDA without CUDA failed inside torch (an AssertionError), an
    # unknown type with torch's list of types, and a CUDA index past the machine's GPUs inside torch.cuda
    dev = (require_available_device("device", device) if device is not None
           else torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    # any other type (meta, mps) was measured as the CPU process under that device's name
    if dev.type not in ("cpu", "cuda"):
        raise argument_error("device", f"is {str(dev)!r}; measure_cost measures the CPU or a CUDA device",
                             "Pass 'cpu' or 'cuda', where the measured call runs")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(dev) - base
        method = "cuda_allocator"
    else:
        _release_freed_memory()
        base = _rss_bytes()
        if _reset_high_water_mark():
            method = "kernel_high_water_mark"
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            seconds = time.perf_counter() - start
            peak = max(0, (_high_water_mark_bytes() or base) - base)
        else:
            method = "sampled_rss"
            with _RssSampler() as sampler:
                start = time.perf_counter()
                result = fn(*args, **kwargs)
                seconds = time.perf_counter() - start
            peak = max(0, sampler.peak - base)
    return result, Cost(seconds=seconds, peak_bytes=int(peak), device=dev.type, memory_method=method)
