"""Exact contributions ``W(x) x`` of a TransformerLens model, taken at ``hook_embed`` + ``hook_pos_embed``.

Inside :func:`bcos_plugins.nn.explanation_mode` an explainable model (see ``make_explainable``) is linear
in its embeddings as far as autograd sees, so for the explained logit ``y``::

    sum_{pos, d} e_embed * dy/de_embed + sum_{pos, d} e_pos * dy/de_pos = y

(bias-free models: B-cos, bilinear, or plain ones with zero biases). Rotary models have no
``hook_pos_embed``; positions enter only through queries and keys, i.e. the attention pattern, a constant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from bcos_plugins._checks import require_finite_parameters
from bcos_plugins.attribution import (
    Direction,
    TokenExplanation,
    as_leaf,
    input_x_gradient,
    resolve_explained,
    resolve_positions,
)
from bcos_plugins.attribution.gradient import non_finite_step, outside_inference, refuse_non_finite_step
from bcos_plugins.attribution.text import padded_float64_nan_cause
from bcos_plugins.errors import BcosTypeError, argument_error
from bcos_plugins.explain import recording_forward_autocast
from bcos_plugins.nn.functional import at_least_float32

from .._completeness import warn_if_incomplete
from .bridge import is_explainable_bridge
from .compat import HAS_HOOKED_TRANSFORMER
from .hook_checks import hooked_points
from .inputs import check_lens_tokens
from .model_changes import refuse_cfg_unlike_built
from .sae_error import SAEErrorShares, sae_error_capture

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


__all__ = ["LensExplanation", "explain_lens_value", "explain_logits", "require_explainable", "user_hooked_points",
           "ATTRIBUTION_HOOKS"]


def require_explainable(model, *, logits: bool = True) -> None:
    """The adapter's one "is this model explainable" check (``explain_logits``, the token x component
    decomposition): a bridge made explainable, or (TransformerLens 3.x) a ``HookedTransformer`` after
    ``make_explainable``; otherwise its dynamic weights are not constants and no explanation is exact. A
    ``HookedTransformer``'s ``cfg`` is checked again (``logits=False``: for a value read inside the model, which
    a final-logit soft-cap leaves exact), since TransformerLens reads it at every forward."""
    explainable = is_explainable_bridge(model)
    if explainable and hasattr(model, "add_sae"):
        _refuse_sae_bridge()
    if not explainable and HAS_HOOKED_TRANSFORMER:  # 4.x has only bridges; this check needs 3.x's components
        from .model import dynamic_hooks_replaced, is_explainable

        explainable = is_explainable(model)
        if not explainable:
            _refuse_replaced_dynamic_hooks(model, dynamic_hooks_replaced(model))
        else:  # TransformerLens reads the options make_explainable refused at every forward: set since?
            refuse_cfg_unlike_built(model, "explain", explained_logits=logits)
    if not explainable:
        raise BcosTypeError(
            "model: its dynamic weights are not detachable, so the explanation would not be exact. Call "
            "bcos_plugins.adapters.transformer_lens.make_explainable(model) first (before adding hooks), or use a "
            "model from hooked_transformer_from_hf / BcosHookedTransformer, or a bridge from "
            "transformer_bridge_from_hf."
        )


def _refuse_sae_bridge() -> None:
    """Refuse sae-lens' ``SAETransformerBridge`` (a bridge with ``add_sae``): its ``hook_dict`` lacks TransformerLens'
    hook aliases, so ``hook_embed`` was not found and every explanation failed with "no attribution point was
    reached"; and were it found, an SAE added or reset (``reset_saes`` leaves a plain HookPoint) at a hook point
    carrying one of the bridge's dynamic weights would put that weight in the gradient, which nothing here checks."""
    raise argument_error(
        "model", "a bridge turned into sae-lens' SAETransformerBridge cannot be explained: its hook_dict lacks "
        "TransformerLens' hook aliases (hook_embed), so the embeddings cannot be captured, and an SAE added or reset "
        "there (add_sae, reset_saes) at a hook point that carries a dynamic weight of the bridge is not checked",
        "Explain the TransformerBridge from transformer_bridge_from_hf with no SAE spliced in: "
        "bcos_plugins.adapters.sae_lens.explain_sae_feature(bridge, tokens, sae, feature) reads the SAE at its "
        "hook; or splice SAEs into a HookedSAETransformer from hooked_transformer_from_hf", kind=BcosTypeError)


def _refuse_replaced_dynamic_hooks(model, replaced: list[tuple[str, str]]) -> None:
    """Name the hook points that carried a dynamic weight after make_explainable and were replaced since: after
    sae-lens' ``reset_saes`` the model was refused as if make_explainable had never been called, naming no hook."""
    if not replaced:
        return
    names = ", ".join(f"{name} (now a {now})" for name, now in replaced[:4]) + (" ..." if len(replaced) > 4 else "")
    sae_model = hasattr(model, "acts_to_saes")
    if sae_model and all(now == "HookPoint" for _, now in replaced):
        cause = ("an SAE reset (sae-lens' reset_saes) put a plain HookPoint where the SAE was, so the dynamic "
                 "weight there takes part in the gradient")
        fix = "Call bcos_plugins.adapters.transformer_lens.make_explainable(model) again: it restores them"
    else:
        cause = ("they were replaced since (an SAE attached there with sae-lens' add_sae, or a hook point set by "
                 "hand), so the dynamic weight there takes part in the gradient")
        fix = ("Remove what is there (model.reset_saes() for an SAE), then call "
               "bcos_plugins.adapters.transformer_lens.make_explainable(model) again: it restores them")
    raise argument_error(
        "model", f"the hook points {names} carried dynamic weights of the model after make_explainable, but {cause}; "
        "the explanation would not be exact", fix, kind=BcosTypeError)


ATTRIBUTION_HOOKS = ("hook_embed", "hook_pos_embed")


@dataclass
class LensExplanation(SAEErrorShares, TokenExplanation):
    """:class:`~bcos_plugins.attribution.TokenExplanation` of a TransformerLens model.

    ``input_contributions`` is the sum over the attribution hooks (``hook_embed`` and ``hook_pos_embed``
    when present), ``(batch, pos, d_model)``; ``hook_contributions`` holds each hook's share separately.

    With SAEs spliced in (sae-lens ``add_sae(sae, use_error_term=True)``) the error terms are computed
    without gradient, so the token contributions miss their share: ``sae_error_shares`` holds it per SAE
    hook, and ``total + sum(sae_error_shares.values()) == explained`` for SAEs without biases. An SAE's biases
    (``b_enc``, ``b_dec``: every trained SAE has them) carry a share no token carries either, the rest of
    ``explained`` (0.29 of a logit on a tiny B-cos GPT-2 with a random-bias SAE on the residual stream):
    ``bcos_plugins.adapters.sae_lens.sae_error_share(...).other_share`` reports it. ``completeness_error`` still
    measures the tokens alone, so it shows those shares instead of hiding them.
    """

    hook_contributions: dict[str, Float[Tensor, "batch pos d_model"]] | None = None
    sae_error_shares: dict[str, Float[Tensor, " batch"]] | None = None


def explain_logits(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    *,
    target: int | Tensor | Direction | None = None,
    foil: int | Tensor | Direction | None = None,
    position: int | Tensor | None = None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> LensExplanation:
    """Explain the next-token logit of ``target`` (minus ``foil``) predicted at ``position``.

    Targets, foils and positions mean what they mean in :func:`bcos_plugins.explain` (the same parser):
    ids per row or ``Direction(vector)``; negative positions count from each row's last real token
    (``attention_mask``); padding and out-of-range positions raise.

    The contributions sum to the explained logit on B-cos, bilinear and bias-free plain models. On a plain model
    with non-zero biases they leave the biases' share out, without a warning (the "W(x)x of a conventional model"
    baseline): ``completeness_error`` shows that share (``token_component_decomposition`` refuses such a model).

    Args:
        model: a ``HookedTransformer`` made explainable (``BcosHookedTransformer``, a model from
            ``hooked_transformer_from_hf``, or any model after ``make_explainable``).
        tokens: token ids; strings are not accepted (tokenise with ``model.to_tokens``).
        target: one id or one per row, or ``Direction(vector)`` over the vocabulary; default the top
            prediction at ``position``.
        foil: explain ``logit(target) - logit(foil)`` (contrastive) when given.
        position: one index or one per row; default each row's last real token.
        attention_mask: 1 for real tokens, passed to the model.
    """
    def logit_at(run, pos: Tensor):
        logits = run([])
        return resolve_explained(logits[torch.arange(logits.shape[0], device=logits.device), pos], target, foil)

    return explain_lens_value(model, tokens, logit_at, position=position, attention_mask=attention_mask,
                              who="explain_logits")


def require_finite_lens_weights(model) -> None:
    """Refuse ``model`` naming its NaN or infinite parameters (an attached SAE's too: it is a submodule), for a lens
    path whose values came out non-finite: the refusal of the values alone listed "the weights" among the causes
    without saying which. Called only then, so a finite explanation pays no device synchronisation for it."""
    require_finite_parameters(model, "model", consequence="the values explained (or their gradients) are NaN or "
                              "infinite, and there is nothing finite to explain", fix="Reload the weights (a broken "
                              "checkpoint, or a training step that diverged, wrote them), or fix those parameters")


def user_hooked_points(model) -> list[str]:
    """The hook points that carry forward hooks when an explanation starts (the caller's: ``model.hooks()``,
    ``add_hook``), whose edits of activations the explanation runs with. None while SAEs are attached: the tokens
    then miss the error terms' and the SAE biases' shares by design (reported in ``sae_error_shares``), so a miss
    could not be laid at the hooks' door (and ``sae_error_capture`` hooks the SAEs' own points)."""
    # the hooked points are read by the one reader run_with_cache's hook checks use (hook_checks.hooked_points);
    # no hook_dict: a model that is no TransformerLens model at all is refused by require_explainable, after this
    if getattr(model, "acts_to_saes", None) or getattr(model, "hook_dict", None) is None:
        return []
    return list(hooked_points(model))


def explain_lens_value(
    model,
    tokens: Int[Tensor, "batch pos"],
    explained_at: Callable[[Callable[[list], Tensor], Tensor], tuple[Tensor, object, object]],
    *,
    position: int | Tensor | None = None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    result_class: type[LensExplanation] | None = None,
    who: str = "explain_logits",
    logits: bool = True,
    **result_fields,
) -> LensExplanation:
    """The adapter's one explanation loop, for any value the model computes from its tokens: a logit
    (:func:`explain_logits`) or a readout of an inner activation (an SAE feature's pre-activation).

    ``explained_at(run, positions)`` calls ``run(fwd_hooks)``, which runs the model on ``tokens`` with the
    attribution captures plus ``fwd_hooks`` (TransformerLens ``(name, hook)`` pairs) and returns its output,
    and returns ``(explained (batch,), target, foil)``, the explained value attached to the autograd graph.
    A hook may end the forward pass early by raising; ``explained_at`` then catches it (the leaves captured
    before it are kept). ``result_fields`` go to ``result_class`` (a :class:`LensExplanation` subclass).

    ``who`` (the public caller's name) heads the completeness warning: the caller's own forward hooks that patch
    an activation add a share no token carries, named there (see :func:`_warn_if_hooks_incomplete`). ``logits``:
    whether the explained value is read from the logits (:func:`require_explainable`).
    """
    forward_autocast: list[torch.dtype] = []
    hooked = user_hooked_points(model)
    with recording_forward_autocast(model, forward_autocast):
        result = _explain_lens_value(model, tokens, explained_at, position=position, attention_mask=attention_mask,
                                     result_class=result_class, logits=logits, **result_fields)
    _warn_if_hooks_incomplete(result, hooked, forward_autocast, who)
    return result


def _warn_if_hooks_incomplete(result: LensExplanation, hooked: list[str], forward_autocast: list[torch.dtype],
                              who: str) -> None:
    """A share really missing is reported where it is known: SAE error terms in sae_error_shares, the terms of the
    caller's own hooks here (an activation patched in or mean-ablated does not come from the tokens: explain_logits'
    contributions missed the logit by 25-660 % of it, explain_sae_feature's a feature's pre-activation by 95 %,
    without a word); otherwise only the rounding."""
    missing = (f"the forward hooks on {', '.join(hooked[:3])}{' ...' if len(hooked) > 3 else ''} add terms that "
               "do not come from the tokens (a patched or mean-ablated activation); the contributions explain "
               "only the tokens' share. Remove the hooks (model.reset_hooks()), or hook by scaling "
               "(zero-ablation, a * 0.5), which keeps the explanation exact") if hooked else None
    # stacklevel 4: the warning points at the line that called explain_logits / explain_sae_feature (their caller,
    # through this function and explain_lens_value)
    warn_if_incomplete([result.input_contributions], result.explained, forward_autocast, who=who,
                       missing_share=missing, per_example="completeness_error", stacklevel=4)


def _explain_lens_value(
    model,
    tokens: Int[Tensor, "batch pos"],
    explained_at: Callable[[Callable[[list], Tensor], Tensor], tuple[Tensor, object, object]],
    *,
    position: int | Tensor | None = None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    result_class: type[LensExplanation] | None = None,
    logits: bool = True,
    **result_fields,
) -> LensExplanation:
    require_explainable(model, logits=logits)
    tokens, attention_mask = check_lens_tokens(model, tokens, attention_mask)
    # normal copies of what was made under the caller's inference_mode: the forward's embedding lookup and the
    # logit indexing save them for backward, which autograd refuses for inference tensors
    tokens, attention_mask = outside_inference(tokens), outside_inference(attention_mask)
    mask = attention_mask if attention_mask is not None else torch.ones_like(tokens)
    pos = outside_inference(resolve_positions(position, mask, default="last"))
    names = [n for n in ATTRIBUTION_HOOKS if n in model.hook_dict]
    leaves: dict[str, Tensor] = {}
    parsed: dict = {}

    def capture_as(name: str):
        # keyed by the requested name: on a TransformerBridge, hook_embed is an alias that fires under
        # another name (embed.hook_out)
        def capture(activation: Tensor, hook) -> Tensor:
            leaves[name] = as_leaf(activation)
            return leaves[name]
        return capture

    def run(fwd_hooks: list):
        return model.run_with_hooks(tokens, attention_mask=attention_mask,
                                    fwd_hooks=[(n, capture_as(n)) for n in names] + list(fwd_hooks))

    def compute():
        parsed["resolved"] = explained_at(run, pos)
        names[:] = [n for n in names if n in leaves]  # a bridge lists hook_pos_embed for rotary models too
        return parsed["resolved"][0], [leaves[n] for n in names]

    with sae_error_capture(model) as sae_capture:  # records nothing when no SAEs are attached
        step = input_x_gradient(compute, model, defer_finite_check=True)
    if non_finite_step(step):
        require_finite_lens_weights(model)  # a NaN / inf weight named (the generic refusal said only "and the weights")
        # a float64 bridge's attention softmax runs in float32, so a left-padded row's all-masked padding queries
        # give NaN: the generic cause ("an input or an embedding row of NaN, inf or a huge value") sent users to
        # check inputs that were fine
        refuse_non_finite_step(step, padded_float64_nan_cause(
            step.explained.dtype, attention_mask, "Explain in float32 (model.float()), or explain the padded rows "
            "one at a time without padding."))
    hook_contributions = dict(zip(names, step.contributions, strict=True))
    total = sum(step.contributions)
    # each hook's share summed over d_model in at least float32, as explain's token scores: in half precision the
    # sum (and adding the hooks' tensors first) kept 3 significant digits
    token_scores = sum(c.sum(-1, dtype=at_least_float32(c.dtype)) for c in step.contributions)
    _, explained_target, explained_foil = parsed["resolved"]
    return (result_class or LensExplanation)(
        contributions=token_scores, input_contributions=total, explained=step.explained,
        target=explained_target, foil=explained_foil,
        attribution_point=" + ".join(names) + " (TransformerLens hooks)",
        position=pos, input_ids=tokens, attention_mask=attention_mask, reduce="sum",
        hook_contributions=hook_contributions, sae_error_shares=sae_capture.shares(), **result_fields,
    )
