"""The adapter's one check that a TransformerLens model is still the model its numbers are read against.

TransformerLens reads some ``cfg`` fields again at every call (``normalization_type``: whether the forward runs
``ln_final`` and whether ``apply_ln_to_stack`` centres the stack; ``output_logits_soft_cap``: the forward's tanh cap;
``clip_qkv``), and a cache's decompositions combine the cached activations with the weights as they are at the call.
So a model edited after it was built, or after the run that filled a cache, was decomposed or explained as another
model, without a word. Two references, one module:

- since the run: :class:`ModelSnapshot` records those cfg fields and each weight's version when a cache is made
  (``run_with_cache``); :meth:`ModelSnapshot.refuse_changes` refuses a decomposition once either changed.
- since the build: :func:`refuse_cfg_unlike_built` refuses a cfg that no longer says what the built model does (a norm
  module of another kind; an option make_explainable refused), which an edit before the run leaves in the snapshot too.

TransformerLens 3.x and 4.x alike: only ``cfg`` fields, ``named_parameters``, (3.x) its norm classes and a bridge
norm's ``original_component`` are read.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from bcos_plugins.errors import BcosValueError, argument_error
from bcos_plugins.nn.norm import BcosLayerNorm, DetachableRMSNorm

__all__ = ["ModelSnapshot", "WeightVersion", "refuse_cfg_unlike_built", "weight_version"]


class WeightVersion(NamedTuple):
    """What changes when a weight is written in place (``version``: its version counter; an inference tensor keeps
    none), replaced (``pointer``: another storage, as after ``load_state_dict(assign=True)``), converted (``dtype``)
    or moved (``device``). Writes that bypass the version counter (``weight.data.copy_``) are not seen."""

    version: int | None
    pointer: int
    dtype: torch.dtype
    device: torch.device


def weight_version(weight: Tensor) -> WeightVersion:
    """``weight``'s :class:`WeightVersion` now."""
    return WeightVersion(None if weight.is_inference() else weight._version, weight.data_ptr(), weight.dtype,
                         weight.device)


def _weight_changed(then: WeightVersion, now: WeightVersion, same_tensor: bool) -> bool:
    """Whether a weight holds other values than when ``then`` was recorded (``same_tensor``: it is still the parameter
    it was then). A move to another device (``.to(device)``) keeps the values, but the storage is new either way, so
    the version counter tells an in-place write after the move: torch's ``Module.to`` keeps the parameter and its
    counter (CPU <-> CUDA), or keeps the parameter with a fresh counter (``torch.__future__``'s swap mode), or makes a
    new parameter, fresh too (its overwrite mode; a device whose tensors cannot take the old one's place, as ``meta``).
    A write after the move leaves the counter at neither the old value nor 0, or a new parameter's above 0. The one
    write not seen: a swap-mode move followed by exactly ``then.version`` writes."""
    if now.dtype != then.dtype:
        return True
    if now.device == then.device:
        return (now.version, now.pointer) != (then.version, then.pointer)
    if now.version is None:
        return False  # an inference tensor keeps no counter: a move is all that can be told
    return now.version not in (then.version, 0) if same_tensor else now.version != 0


_NORM_KIND = {"LN": "centre", "LNPre": "centre", "RMS": "scale", "RMSPre": "scale"}


def _cap_in_force(cap) -> float | None:
    """A soft-cap as TransformerLens applies it: only a positive value caps (-1, 0 and None mean none)."""
    return cap if cap is not None and cap > 0 else None


# the cfg fields TransformerLens reads again at each forward / decomposition, with what of each the numbers depend on
# (LN and LNPre both centre; any cap <= 0 is none) and what it does there
_READ_AT_EACH_CALL = {
    "normalization_type": (_NORM_KIND.get, "whether the forward runs the final norm and whether apply_ln_to_stack "
                           "centres the stack"),
    "output_logits_soft_cap": (_cap_in_force, "the forward's tanh cap of the logits, which logit_attrs' sum lacks"),
    "bcos_output_logits_soft_cap": (_cap_in_force, "the B-cos unembedding's cap of the logits"),
}
_ABSENT = object()


@dataclass(frozen=True)
class ModelSnapshot:
    """The model as a cache's run saw it: the cfg fields TransformerLens reads again at each call, and each weight's
    :class:`WeightVersion`. Taken when the cache is made; :meth:`refuse_changes` compares the model with it."""

    cfg: dict[str, object]
    weights: dict[str, WeightVersion]
    parameters: dict[str, weakref.ref]  # which tensor each weight was (a move may make a new one), held weakly
    changed_before_copy: tuple[str, ...] = ()  # what had changed when the cache was copied or saved (for_copy)

    @classmethod
    def of(cls, model, changed_before_copy: tuple[str, ...] = ()) -> ModelSnapshot:
        cfg = getattr(model, "cfg", None)
        fields = {name: getattr(cfg, name, _ABSENT) for name in _READ_AT_EACH_CALL}
        parameters = dict(model.named_parameters())
        return cls({name: value for name, value in fields.items() if value is not _ABSENT},
                   {name: weight_version(weight) for name, weight in parameters.items()},
                   {name: weakref.ref(weight) for name, weight in parameters.items()}, changed_before_copy)

    def _changed_cfg(self, model) -> list[tuple[str, object, object]]:
        """(field, value at the run, value now) of each cfg field whose change changed what TransformerLens does."""
        cfg = getattr(model, "cfg", None)
        found = []
        for name, then in self.cfg.items():
            now = getattr(cfg, name, then)
            if _READ_AT_EACH_CALL[name][0](then) != _READ_AT_EACH_CALL[name][0](now):
                found.append((name, then, now))
        return found

    def _changed_weights(self, model) -> list[str]:
        now = dict(model.named_parameters())
        return [name for name, then in self.weights.items() if name in now and _weight_changed(
            then, weight_version(now[name]), self.parameters[name]() is now[name])]

    def for_copy(self, model) -> tuple[str, ...]:
        """What of ``model`` changed since the run, for a copy of the cache (``copy.deepcopy``, pickle,
        ``torch.save``): the copy holds a copy of the model, whose tensors this snapshot cannot be compared with, so
        it records its own model (:meth:`of`) with these names, which its decompositions refuse if any."""
        return (*self.changed_before_copy, *(f"cfg.{name}" for name, _, _ in self._changed_cfg(model)),
                *self._changed_weights(model))

    def refuse_changes(self, model, method: str, *, weights: bool = True) -> None:
        """Refuse ``method`` (a decomposition of the cache) when a cfg field it reads changed what it does since the
        run, or (``weights``: a decomposition that reads them) a weight changed: TransformerLens combines the cached
        activations with the model as it is now, another one (an in-place edit of a head's W_O, as an ablation, made
        the per-head results miss the cached attention output by 0.73 and logit_attrs the run's logits by 0.12 on a
        tiny B-cos GPT-2; ``normalization_type = None`` after the run dropped the final norm from the stack)."""
        if self.changed_before_copy:
            names = self.changed_before_copy
            raise argument_error(
                "cache", f"{method}: it is a copy (copy.deepcopy, pickle, torch.save) of a cache whose model had "
                f"changed since the run that filled it ({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}), so "
                "the copy's model is another model than the run's (wrong numbers)", "Run run_with_cache again and "
                "copy or save that cache, or copy the cache before changing the model", kind=BcosValueError)
        for name, then, now in self._changed_cfg(model):
            raise argument_error(
                "cache", f"{method}: model.cfg.{name} was {then!r} at the run that filled it and is {now!r} now; "
                f"TransformerLens reads it again at each call ({_READ_AT_EACH_CALL[name][1]}), so the decomposition "
                "would not sum to what the run computed (wrong numbers)", f"Set model.cfg.{name} back to {then!r}, or "
                "run run_with_cache again after changing it", kind=BcosValueError)
        changed = self._changed_weights(model) if weights else []
        if changed:
            raise argument_error(
                "cache", f"{method}: the model's weights changed since the run that filled it ({', '.join(changed[:4])}"
                f"{' ...' if len(changed) > 4 else ''}: written in place, also after a move to another device, "
                "replaced, or converted by .double() / .to(dtype)), and the decomposition combines the cached "
                "activations with the weights as they are now, another model's (wrong numbers)", "Run run_with_cache "
                "again after changing the weights, or decompose the cache before changing them", kind=BcosValueError)


def _built_norm(norm) -> tuple[str | None, bool]:
    """What a built norm does to a stack: "centre" (a LayerNorm: minus the mean, then the scale), "scale" (an RMSNorm)
    or None (another module: not judged); and whether the forward reads ``cfg.normalization_type`` to skip it (a
    HookedTransformer's final norm under ``None``; a bridge's forward runs the transformers model's own norms)."""
    wrapped = getattr(norm, "original_component", None)  # a bridge's NormalizationBridge / RMSNormalizationBridge
    if isinstance(wrapped, nn.Module):
        if isinstance(wrapped, (nn.LayerNorm, BcosLayerNorm)):
            return "centre", False
        # transformers names its RMS norms <Model>RMSNorm (LlamaRMSNorm, Gemma2RMSNorm, ...)
        rms = isinstance(wrapped, (nn.RMSNorm, DetachableRMSNorm)) or type(wrapped).__name__.endswith("RMSNorm")
        return ("scale" if rms else None), False
    try:  # TransformerLens 3.x's HookedTransformer norms
        from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
    except ImportError:
        return None, False
    return ("centre" if isinstance(norm, (LayerNorm, LayerNormPre)) else
            "scale" if isinstance(norm, (RMSNorm, RMSNormPre)) else None), True


def _refuse_options_unlike_built(model, logits: bool) -> None:
    """The options make_explainable refuses, set on the built model's cfg (``model.cfg.output_logits_soft_cap =
    30.0``): TransformerLens reads ``output_logits_soft_cap`` and ``clip_qkv`` at every forward, so they bent its logits
    and explain_logits' contributions missed the capped logit by 0.019 (0.006 the clipped one), without a word."""
    from .config import check_explainable  # TransformerLens 3.x only, as its callers' models

    try:
        check_explainable(model.cfg, logits=logits)
    except BcosValueError as error:
        raise argument_error(
            "model", "its cfg (model.cfg, changed after the model was built?) sets an option under which no "
            f"explanation is exact: {str(error).rstrip('.')}", "Set that option back on model.cfg, or rebuild the "
            "model (hooked_transformer_from_hf, BcosHookedTransformer)") from None


def _refuse_normalization_unlike_built(model, method: str, target: int, mlp_input: bool, recompute_ln: bool) -> None:
    """``cfg.normalization_type`` no longer saying what the norm a stack meets does: TransformerLens builds the norms
    from it once, but its decompositions read it again at each call to decide whether to centre the stack, so an edit
    after building (``model.cfg.normalization_type = "RMS"`` on a LayerNorm model, or the reverse) left the forward as
    it was and made logit_attrs of decompose_resid miss the logit by 0.008 (B-cos GPT-2) / 0.054 (B-cos Llama), without
    a word; ``None`` returned a block's stack without its norm. The norm is the final one (``target`` n_layers; a
    HookedTransformer's forward skips it under ``None`` too, which stays consistent) or block ``target``'s ``ln1`` /
    ``ln2`` (``mlp_input``); a bridge's are judged by the transformers norm they wrap (its forward never reads the
    cfg: an edit before the run, which its snapshot holds too, left logit_attrs 0.04-0.08 off on tiny B-cos GPT-2 /
    Llama bridges); other norm modules are not. ``recompute_ln`` at the final norm runs ``ln_final`` itself."""
    cfg = model.cfg
    final = target == cfg.n_layers
    if final and recompute_ln:
        return  # the module itself normalises: the stack and the logits agree
    if final:
        norm = getattr(model, "ln_final", None)
    else:
        blocks = getattr(model, "blocks", None)
        block = blocks[target] if blocks is not None and target < len(blocks) else None
        norm = getattr(block, "ln2" if mlp_input else "ln1", None)
    built, skipped_under_none = _built_norm(norm)
    said = _NORM_KIND.get(cfg.normalization_type)
    if built is None or said == built or (final and said is None and skipped_under_none):
        return  # (a HookedTransformer's forward skips ln_final under None as well: the stack and the logits agree)
    wrapped = getattr(norm, "original_component", None)
    raise argument_error(
        "model", f"{method}: model.cfg.normalization_type is {cfg.normalization_type!r} (changed after the model was "
        f"built?), but the norm the stack meets is a {type(norm).__name__}"
        f"{f' ({type(wrapped).__name__})' if wrapped is not None else ''}, which "
        f"{'centres and scales' if built == 'centre' else 'scales without centring'}; TransformerLens reads the cfg "
        f"to {'centre' if said == 'centre' else 'leave uncentred' if said else 'leave unnormalised'} the stack, so the "
        "decomposition would not sum to what the forward computed (wrong numbers)",
        f"Set model.cfg.normalization_type back to {'LN' if built == 'centre' else 'RMS'!r} (the norms do not change "
        "with it), or rebuild the model with the norm you want", kind=BcosValueError)


def refuse_cfg_unlike_built(model, method: str, *, explained_logits: bool | None = None,
                            stack_norm: tuple[int, bool, bool] | None = None) -> None:
    """Refuse a ``cfg`` edited after the model was built (before a run as well, so no run's snapshot shows it) where
    the caller reads it: ``explained_logits`` (an explanation of an explainable HookedTransformer; False for a value
    read inside the model, which a final-logit soft-cap leaves exact) judges the options make_explainable refuses,
    ``stack_norm`` ``(target layer, mlp_input, recompute_ln)`` (a decomposition that normalises a stack) judges
    ``normalization_type`` against the norm that stack meets. Each refusal names the field and the fix."""
    if explained_logits is not None:
        _refuse_options_unlike_built(model, explained_logits)
    if stack_norm is not None:
        _refuse_normalization_unlike_built(model, method, *stack_norm)
