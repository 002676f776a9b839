"""``explain``: exact contributions ``W(x) x`` of a transformers text model, per token.

Built on the attribution core (:mod:`bcos_plugins.attribution`): targets, foils and positions are parsed
there, the input x gradient step runs there, and the result is a
:class:`~bcos_plugins.attribution.TokenExplanation`. For a B-cos model the contributions summed over tokens
and embedding dimensions equal the explained value (completeness); on a stock model the same call is plain
input x gradient at a point where it is meaningful (:mod:`bcos_plugins.attribution.text`) and
``completeness_error`` says how far from complete it is.

Explained quantities:

- classifiers: the logit of ``target`` (default: the predicted class), or ``target - foil``;
- causal LMs: the next-token logit of ``target`` predicted at ``position`` (default: each row's last real
  token), or ``target - foil`` (contrastive, B-cos LM paper §7);
- masked LMs: the logit of ``target`` predicted at ``position``, which has no default (usually the [MASK]
  token's prediction is meant, wherever it is; a missing ``position`` is refused);
- base models: hidden unit ``target`` (or a :class:`~bcos_plugins.attribution.Direction` of the hidden state)
  at ``position`` (default: the first real token for encoders, the last real token for decoders).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from math import isfinite
from typing import Literal

import torch
from jaxtyping import Int
from torch import Tensor, nn

from ._checks import bad_rows, named_row, refuse_keywords_meant_as_own
from .attribution.gradient import (
    GradientStep,
    PointDtypeMismatch,
    capture_point,
    input_x_gradient,
    non_finite_step,
    outside_inference,
    refuse_non_finite_step,
)
from .attribution.results import TokenExplanation
from .attribution.targets import (
    Direction,
    last_real_position,
    resolve_explained,
    select_explained,
)
from .attribution.text import (
    explained_outputs_only,
    explained_positions,
    forward_keywords,
    logits_at_positions,
    non_finite_embedding_cause,
    padded_float64_nan_cause,
    rows_as_alone_call,
    text_attribution_point,
    token_inputs_and_padding,
)
from .convert.architectures import spec_for
from .errors import BcosRuntimeError, BcosValueError
from .nn.dynamic import thread_token
from .nn.functional import at_least_float32

__all__ = ["explain", "last_real_position"]

_FLOAT64_TINY = torch.finfo(torch.float64).tiny


def explain(
    model: nn.Module,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    *,
    target: int | Tensor | Direction | None = None,
    foil: int | Tensor | Direction | None = None,
    position: int | Tensor | None = None,
    reduce: Literal["sum", "mean"] = "sum",
    **forward_kwargs,
) -> TokenExplanation:
    """Explain a batch of token ids: the contribution of each token to one output value per row, exact for B-cos models.

    The contributions are ``W(x) x`` at the model's attribution point (the input embeddings): summed over the
    tokens and embedding dimensions they equal the explained value, up to float rounding (completeness). On a stock
    model of a supported class the same call is plain input x gradient, and ``completeness_error`` says how far from
    complete it is. What is explained, per kind of model:

    - classifiers: the logit of ``target`` (default: the predicted class), or ``target - foil``;
    - causal LMs: the next-token logit of ``target`` predicted at ``position`` (default: each row's last real
      token), or ``target - foil`` (contrastive);
    - masked LMs: the logit of ``target`` predicted at ``position``, which is required (usually the [MASK] token's);
    - base models: hidden unit ``target`` (or a ``Direction`` of the hidden state) at ``position`` (default: the
      first real token for encoders, the last real token for decoders).

    In depth (how exactness works, choosing B, decoders): docs/in-depth.md; every host library's call:
    docs/getting-started.md and docs/hosts/.

    Args:
        model: a B-cosified transformers model (or a stock one of a supported class: plain input x gradient).
        input_ids: token ids ``(batch, pos)``; padding on either side is fine with ``attention_mask``.
        attention_mask: 1 for real tokens, 0 for padding; every row needs a real token. Left out, the ids are
            explained as given (padding attended to as tokens, as ``model(ids)`` computes); rows that differ in
            a run of ``config.pad_token_id`` at their start or end get one
            ``bcos_plugins.errors.UnmaskedPaddingWarning`` naming the fix (pass the tokenizer's mask), not a
            refusal: the explanation is exact for the call made.
        target: class / token id / hidden unit, one for all rows or one per row (integers), or
            ``Direction(vector)`` for a direction of the output space. Classifiers default to the predicted
            class; causal LMs, masked LMs and base models need one.
        foil: optional contrast (same forms); the explained value becomes ``target - foil``.
        position: causal LMs, masked LMs and base models: which position's output to explain (int or one per
            row; negative values count from each row's last real token, -1 being it). Must be a real token.
            Required for masked LMs (no position is the natural one). Classifiers explain the whole sequence
            and refuse it.
        reduce: ``"sum"`` (exact, default) or ``"mean"`` over the embedding dimension for token scores.
            The token scores (``contributions``) are reduced and returned in at least float32 (float32 for a
            float16 / bfloat16 model, float64 kept), like ``total``; ``input_contributions`` keep the model's dtype.
        **forward_kwargs: passed to the model (e.g. ``token_type_ids``); a keyword its forward does not read
            is refused, naming the close match (transformers would drop it without a word).

    Returns:
        A :class:`~bcos_plugins.attribution.TokenExplanation`: ``contributions`` per token ``(batch, pos)``
        (``scores()`` and ``tokens(tokenizer)`` give them per row without padding), ``input_contributions`` per token
        and embedding dimension ``(batch, pos, d_model)``, ``explained`` (the value explained per row), ``target`` /
        ``foil`` / ``position`` as resolved, and ``completeness_error`` (``|sum - explained| / |explained|``).

    Raises:
        BcosRuntimeError: the contributions are not finite, or (B-cos models) do not sum to the explained value
            beyond float rounding of the dtype (an overflowed or cancelled computation, or a module that is not
            exact in explanation mode); the message names the cause and the fix.

    Examples:
        >>> from bcos_plugins import explain  # given a B-cos classifier, its tokenizer and a tokenised batch
        >>> explanation = explain(bcos_model, input_ids, attention_mask)  # each row's predicted class
        >>> explanation
        TokenExplanation(batch=2, positions=..., target=[...], completeness_error max=...)
        >>> tokens, scores = explanation.tokens(tokenizer)[0], explanation.scores()[0]  # row 0, padding removed
        >>> len(tokens) == len(scores)
        True
        >>> bool(explanation.completeness_error.max() < 1e-4)  # the token shares sum to the logit
        True
    """
    if reduce not in ("sum", "mean"):
        raise BcosValueError(f"reduce: must be 'sum' or 'mean', got {reduce!r}. 'sum' is the exact one.")
    spec = spec_for(model)
    if forward_kwargs:
        refuse_keywords_meant_as_own(forward_kwargs, forward_keywords(model), target,
                                     call="explain(model, input_ids, attention_mask, target=..., foil=..., position=...)")
    point = text_attribution_point(model, spec)
    # whether a row is padded comes from the check's one sync: an unpadded batch skips work only padding needs
    input_ids, attention_mask, padded = token_inputs_and_padding(model, input_ids, attention_mask)
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    if spec.is_classifier and position is not None:
        raise BcosValueError("position: a sequence classifier explains one logit per sequence, not a position. "
                             "Leave position out (it applies to causal LMs and base models).")
    if not spec.is_classifier and target is None:
        raise BcosValueError("target: required for causal LMs (next-token ids) and base models (a hidden unit, "
                             "or Direction(vector)); only classifiers default to the predicted class.")
    # made here, so an inference tensor under the caller's inference_mode: the forward's indexing saves it for backward
    pos = None if spec.is_classifier else outside_inference(explained_positions(spec, position, mask,
                                                                                mask_checked=True, padded=padded))
    call_kwargs = rows_as_alone_call(model, input_ids, attention_mask, forward_kwargs, spec=spec, padded=padded)
    call_kwargs = explained_outputs_only(spec, call_kwargs, pos, input_ids.shape[1])
    parsed: dict = {}
    probe_dtype: dict = {}  # set where the point's dtype is not the input embeddings' (see below)
    forward_autocast: list[torch.dtype] = []  # the autocast dtype the forward ran under, if any (see below)

    def compute():
        # the point is multiplied by a probe of ones made here, outside the forward pass: then a compiled
        # model (torch.compile, fullgraph) is explained too; the contributions are the probe's gradient
        weight = model.get_input_embeddings().weight
        probe = torch.ones(*input_ids.shape, weight.shape[-1], dtype=probe_dtype.get("dtype", weight.dtype),
                           device=weight.device, requires_grad=True)
        if point.module._modules:  # submodules: a hook on each notes the autocast dtype
            recording, note = recording_forward_autocast(point.module, forward_autocast), None
        else:  # a leaf (every registry model's point): the capturing hook notes it too, one hook instead of two
            recording, note = nullcontext(), autocast_note(point.module, forward_autocast)
        with recording, capture_point(point.module, point.where, probe=probe, each_call=note) as leaves:
            out = model(**call_kwargs)
        if spec.is_classifier:
            values = out.logits
        else:
            hidden = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
            values = logits_at_positions(hidden, pos, input_ids.shape[1])
        resolved = parsed["resolved"] = resolve_explained(values, target, foil)
        parsed["scale"] = _output_scale(values.detach(), resolved.target, resolved.foil, resolved.explained)
        return resolved.explained, leaves[:1]

    # the step's finiteness is checked with the completeness, in one device-to-host sync
    try:
        step = input_x_gradient(compute, model, defer_finite_check=True)
    except PointDtypeMismatch as mismatch:
        # input embeddings of another dtype than a table added to them (BERT's word embeddings in bfloat16, its
        # position table in float32): the model runs, and its point has the wider dtype; the probe is made again in
        # that one (the call failed with an internal message, where Captum's EmbeddingForward explained it)
        probe_dtype["dtype"] = mismatch.point_dtype
        forward_autocast.clear()
        step = input_x_gradient(compute, model, defer_finite_check=True)
    contrib = step.contributions[0]
    # summed in at least float32, as Explanation.total is: a half-precision sum over d_model keeps 3 significant
    # digits, so a token's score was off by 3e-3 of itself (bfloat16) while the total looked right
    feature_sum = contrib.sum if reduce == "sum" else contrib.mean
    result = TokenExplanation(
        contributions=feature_sum(-1, dtype=at_least_float32(contrib.dtype)),
        input_contributions=contrib,
        explained=step.explained,
        target=parsed["resolved"].target,
        foil=parsed["resolved"].foil,
        attribution_point=point.description,
        position=pos,
        input_ids=input_ids,
        attention_mask=attention_mask,
        reduce=reduce,
    )
    _require_complete(model, result, parsed["scale"], forward_autocast, step)
    return result


@contextmanager
def recording_forward_autocast(module: nn.Module, seen: list[torch.dtype]) -> Iterator[list[torch.dtype]]:
    """Append to ``seen`` the autocast dtype that ``module`` and its submodules run under, while inside. An
    autocast entered inside the model's forward counts too: ``Trainer(bf16=True)`` / accelerate leave
    ``model.forward`` wrapped in autocast after training, so the caller sees no autocast around the call."""
    # a hook per module, not one global hook filtered to these modules: a global hook is traced into a compiled
    # model's graph with this call's closure, and the next call compiled the graph again (4 graphs instead of 3 in
    # tests/test_fused_layers.py), where dynamo does not guard on per-module hooks
    note = autocast_note(module, seen)
    notes = [m.register_forward_pre_hook(lambda submodule, args: note()) for m in module.modules()]
    try:
        yield seen
    finally:
        for note in notes:
            note.remove()


def autocast_note(module: nn.Module, seen: list[torch.dtype]) -> Callable[[], None]:
    """A function that appends to ``seen`` the autocast dtype in force for ``module``'s device type (its first
    parameter's; the CPU without one) when it is called (nothing outside autocast): what
    :func:`recording_forward_autocast`'s hooks call."""
    # a leaf's own parameters are read directly: parameters() walks named_modules to yield them (the first one found
    # is the same parameter)
    parameters = module.parameters() if module._modules else module._parameters.values()
    first = next((p for p in parameters if p is not None), None)
    device = "cpu" if first is None else first.device.type
    owner = thread_token()  # the hooks calling it are on the model: another thread's forward is not this call's

    def note() -> None:
        if thread_token() == owner and torch.is_autocast_enabled(device):
            seen.append(torch.get_autocast_dtype(device))

    return note


def _output_scale(values: Tensor, target: Tensor | Direction, foil: Tensor | Direction | None,
                  explained: Tensor) -> Tensor:
    """Per row, ``|output[target]| + |output[foil]|`` (``sum |v_i| |output_i|`` for a Direction): the size of
    the outputs whose difference is explained, against which a logit difference near 0 is still exact. Without a foil
    an id target's output is the ``explained`` value itself (resolve_explained's pick of ``values``): its size."""
    if foil is None and not isinstance(target, Direction):
        return explained.detach().abs()

    def size(which):
        if isinstance(which, Direction):
            return select_explained(values.abs(), Direction(which.vector.abs()))
        return select_explained(values, which).abs()  # the picked outputs' sizes: no pass over all outputs

    return size(target) if foil is None else size(target) + size(foil)


def completeness_tolerance(contributions: Tensor,
                            forward_autocast: Sequence[torch.dtype] = ()) -> tuple[float, torch.dtype]:
    """``sqrt(eps)`` of the least precise dtype the forward ran in (3.5e-4 in float32, 0.03 in float16, 0.09 in
    bfloat16): a B-cos model's completeness error is that dtype's rounding, well below it
    (docs/benchmarks.md#readme-results), a broken computation is off by the order of the value itself. ``forward_autocast``: autocast dtypes seen
    inside the forward pass (an autocast entered by the model's own forward). Autocast casts no float64 tensor
    (CPU and CUDA alike), so float64 contributions come from a float64 forward whatever autocast is on. Returns
    the tolerance and that dtype."""
    if contributions.dtype == torch.float64:
        # a float64 model under bfloat16 autocast computes in float64: its check was loosened to bfloat16's 0.09
        # (a 9 % miss passed), and the adapters warned that the forward ran in bfloat16
        return torch.finfo(torch.float64).eps ** 0.5, torch.float64
    dtypes = [contributions.dtype, *forward_autocast]
    device = contributions.device.type
    if torch.is_autocast_enabled(device):
        dtypes.append(torch.get_autocast_dtype(device))
    least_precise = max(dtypes, key=lambda d: torch.finfo(d).eps)
    return torch.finfo(least_precise).eps ** 0.5, least_precise


def _likely_nan_cause(model: nn.Module, result: TokenExplanation) -> str:
    """The likely causes of a NaN in the explained batch (on a failure only): an input embedding row of its tokens
    that is not finite (the padding's above all: :func:`~bcos_plugins.attribution.text.non_finite_embedding_cause`),
    and :func:`~bcos_plugins.attribution.text.padded_float64_nan_cause`."""
    return " ".join(part for part in (
        non_finite_embedding_cause(model, result.input_ids, result.attention_mask),
        padded_float64_nan_cause(result.input_contributions.dtype, result.attention_mask,
                                 "Explain in float32 (model.float()), or explain the padded rows one at a time "
                                 "without padding.")) if part)


def _complete_on_host(rows: list[list[float]], tolerance: float) -> bool:
    """Whether every row passes ``|delta| / max(|explained|, scale, token scores, tiny) <= tolerance``, from the
    rows ``[explained, scale, token_scores, delta]`` as Python floats (float64); False as soon as a value is not
    finite (NaN and inf take the tensor form's route) or a row is beyond the tolerance."""
    tiny = _FLOAT64_TINY
    for explained, scale, token_scores, delta in zip(*rows, strict=True):
        if not (isfinite(explained) and isfinite(scale) and isfinite(token_scores) and isfinite(delta)):
            return False
        if not abs(delta) / max(abs(explained), scale, token_scores, tiny) <= tolerance:
            return False
    return True


def _require_complete(model: nn.Module, result: TokenExplanation, scale: Tensor,
                      forward_autocast: Sequence[torch.dtype], step: GradientStep) -> None:
    """Raise instead of returning contributions that are not finite, or (B-cos models, whose contributions
    are exact) that do not sum to the explained value beyond float rounding; the numbers would look like an
    explanation. The message names the cause: values at the attribution point so large (an embedding row of
    1e10) that the forward pass or the sum over tokens and dimensions overflows or cancels to noise, or else a
    module that is not exact in explanation mode.

    The contributions are the gradient of a probe of ones (``1 * gradient``, exactly), so they are finite where
    ``step``'s gradients are: :func:`~bcos_plugins.attribution.gradient.non_finite_step` checks both. For a B-cos
    model it runs only where ``delta`` is not finite: a NaN or infinite gradient entry or explained value makes
    its row's ``delta`` (the contributions' sum minus the explained value) NaN or infinite, so ``delta``'s
    finiteness, which reaches the host with the completeness condition in one device-to-host sync, rules out
    both at once (``delta`` can also overflow from finite terms: then the exact check decides). The messages
    (which may sync) are built only on a failure."""
    if not isinstance(getattr(getattr(model, "config", None), "bcos", None), dict):
        # only a B-cos model (bcosify / load_bcos_model record config.bcos) claims exactness: plain input x
        # gradient of a stock model, and dynamic_linear_copy's W(x) x + bias terms, are not complete by design,
        # and completeness_error / delta report how far
        if non_finite_step(step):
            refuse_non_finite_step(step, _likely_nan_cause(model, result))
        return
    contributions = result.input_contributions
    tolerance, precision = completeness_tolerance(contributions, forward_autocast)
    # against the explained value, the outputs it is a difference of, or the token scores' own size, whichever
    # is largest: float rounding of a healthy model is relative to those (an explained value can be near 0),
    # while an overflowed or cancelled computation is off by the size of the scores themselves
    token_sums = (result.contributions if result.reduce == "sum"  # the same sum, in the same dtype
                  else contributions.sum(-1, dtype=result.contributions.dtype))
    token_scores = token_sums.abs().sum(-1)
    delta = result.delta
    scale = scale.to(result.explained.dtype)
    # the healthy case: the four (batch,) tensors reach the host in one kernel and one sync, and the rule below is
    # evaluated there in float64, the same IEEE operations as the tensor form after it (abs, max, the floor, a
    # correctly rounded division, the comparison), on values that widen exactly; that form ran 10 kernels of a few us
    # each. A row with a non-finite value (whose NaN the tensor form propagates) or one beyond the tolerance goes on
    # to the tensor form, which decides and words every refusal as before.
    if _complete_on_host(torch.stack([result.explained, scale, token_scores, delta]).tolist(), tolerance):
        return
    size = torch.stack([result.explained.abs(), scale, token_scores]).amax(0)
    error = delta.abs().double() / size.double().clamp_min(torch.finfo(torch.float64).tiny)
    # `error <= tolerance` is false for a broken row and for a NaN or infinite delta, so only a failure tells the
    # conditions below apart (and may sync again)
    if bool((error <= tolerance).all()):
        return
    broken = error > tolerance
    finite_delta, any_broken = torch.stack([torch.isfinite(delta).all(), broken.any()]).tolist()
    if not finite_delta and non_finite_step(step):
        refuse_non_finite_step(step, _likely_nan_cause(model, result))
    if any_broken:
        row = int(broken.nonzero()[0])
        found = (f"{bad_rows(broken)} do not sum to the explained value (row {named_row(row, len(broken))}: "
                 f"{float(result.total[row]):.3g} "
                 f"against {float(result.explained[row]):.3g}, an error of {float(error[row]):.2g} of the size of "
                 f"the value and its scores where {precision} allows {tolerance:.1g})")
        # rounding alone reaches this error only if the contributions are huge next to the scores (cancellation)
        magnitude = float(contributions[row].abs().sum(dtype=at_least_float32(contributions.dtype)))
        if torch.finfo(contributions.dtype).eps * magnitude > 0.1 * float(result.delta[row].abs()):
            # a healthy value near 0 lands here too (a float32 logit of -1.9e-5 whose contributions add up to 0.24:
            # rounding alone is 0.27 % of it); the refusal stays (a looser tolerance would let 100 % errors through
            # on such values), but it names the fix that tells the two apart: float64, the inputs unchanged
            rounding = torch.finfo(contributions.dtype).eps * magnitude
            value = abs(float(result.explained[row]))
            raise BcosRuntimeError(
                f"explain: the contributions of {found}: the computation overflowed or cancelled to noise, or the "
                f"value is so close to 0 that {str(contributions.dtype).removeprefix('torch.')} rounding of the "
                f"contributions alone (they add up to {magnitude:.3g} in absolute value: {rounding:.2g}, "
                f"{rounding / max(value, torch.finfo(torch.float64).tiny):.2g} of the value) is beyond the "
                "tolerance; either way the scores would not be exact. Explain in float64 (model.double(), the inputs "
                "unchanged): its rounding is 1e-16 of the contributions, so it tells the two apart; if it fails there "
                "too, check the inputs and the embedding rows of their tokens for huge values "
                "(model.get_input_embeddings().weight[input_ids].abs().max())."
            )
        raise BcosRuntimeError(
            f"explain: the contributions of {found}, though float rounding does not explain it: a module of the "
            "model is not exact in explanation mode (a stock module put back after bcosify, a plain product of "
            "two input-dependent branches, a bias). Convert the model with bcosify (or load it with "
            "load_bcos_model) and add no module that computes outside bcos_plugins.nn."
        )
