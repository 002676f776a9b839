"""Comprehensiveness, sufficiency and their AOPC (ERASER; B-cos LM paper §4.1).

For each fraction p in ``fractions`` (default 0.1, 0.2, ..., 0.9) and each example with n perturbable
tokens (real, non-special), the top ``k = max(1, int(n * p))`` tokens by *signed* score are

- removed:     ``comp_p = P(y | x) - P(y | x without top-k)``   (higher = more faithful),
- kept alone:  ``suff_p = P(y | x) - P(y | top-k and special tokens only)``   (lower = more faithful),

with y the class predicted on the full input (or a given target) and P the softmax probability (the sigmoid for a
multi-label classifier, ``config.problem_type == "multi_label_classification"``; the output itself for a regression
head, ``"regression"``, or with ``probability="logit"``). The curves of a contrastive
explanation of the package (``explain(..., foil=)``, which ranks evidence for ``target - foil``) track the contrast it
explains, ``P(y | .) - P(foil | .)`` (:func:`~bcos_plugins.metrics.probability_gap`'s quantity) in place of
``P(y | .)``.
Special tokens (CLS, SEP, PAD, ...) are never removed and never ranked.

Under removal through the attention mask, a classifier of the architecture registry that reads one token's hidden
state keeps that token the same way: a decoder classifier's (GPT-2, Llama, ... ``ForSequenceClassification``) each
row's last real token, a first-column classifier's (BERT, DistilBERT, RoBERTa, ModernBERT with
``classifier_pooling="cls"``) the first one. That hidden state holds the token's own embedding whatever the mask
says, so masking cannot remove it (its "removal" left the probability almost unchanged, 0.002 against 0.03-0.06 for
the row without it on a tiny Llama). The curves of such a model say nothing about that token's score;
``masking="mask_token"`` replaces it like any other token. A removal that would leave a row no visible token at all
(no special token kept, every perturbable token removed) is refused: attention with every key masked spreads evenly
over all of them, removed ones included, so nothing would be removed.

Removal is done through the attention mask (a removed token gets attention 0, so no position attends to
it), as in the B-cos LM paper's code; the remaining tokens keep their positions. ``masking="mask_token"``
instead replaces removed tokens by ``[MASK]`` (the tokenizer's ``mask_token_id``).

Two summaries of the curve over p, both reported by :class:`PerturbationCurves`:

- ``aopc`` (paper-compatible, **unnormalised**): trapezoidal area under the curve over [0.1, 0.9], i.e.
  ``sklearn.metrics.auc(fractions, curve)`` as the B-cos LM code computes it; its largest value is 0.8.
- ``aopc_normalised``: that area divided by the width of the p range (0.8), the curve's mean height, on
  the same scale as a single comp/suff value (in [-1, 1]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from .._checks import (
    bad_rows,
    require_bool,
    require_deterministic,
    require_float,
    require_int,
    require_row_ids,
    require_same_shape,
    require_tensor,
    require_token_batch,
    unmasked_padding_keywords,
)
from ..attribution.targets import Direction
from ..attribution.text import (
    explained_positions,
    refuse_inputs_on_another_device,
    refuse_nan_logits,
    registry_spec,
    rows_as_alone_call,
)
from ..convert.architectures import position_limit, vocabulary_size
from ..errors import BcosTypeError, argument_error
from ..nn.dynamic import evaluating
from ..nn.functional import at_least_float32
from .attributions import (
    masked_positions_zeroed,
    numbers_as_one_tensor,
    perturbable_mask,
    share_as_written,
    share_counts,
    token_scores,
)

__all__ = ["DEFAULT_FRACTIONS", "PerturbationCurves", "aopc", "perturbation_curves", "top_k_masks"]

DEFAULT_FRACTIONS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def aopc(curve: Float[Tensor, "... n_fractions"], fractions: Sequence[float] = DEFAULT_FRACTIONS,
         normalise: bool = False) -> Float[Tensor, ...]:
    """Trapezoidal area under ``curve`` over ``fractions`` (sklearn ``auc``); ``normalise`` divides by the width."""
    curve = require_tensor("curve", curve, kind="real", shape_hint="(..., n_fractions)")
    if curve.ndim == 0:
        raise argument_error("curve", "is a scalar", "Pass the curve values over the fractions (last axis)")
    # returned in at least float32 (float64 kept), as the curves are computed, but integrated in float64: in bfloat16
    # the fractions themselves round (0.1 is 0.10009765625, the width 0.8 is 0.7983) and the area of a bfloat16 curve
    # was off by 3e-3; in float32 the trapezoid's pairwise sums of values near 3e38 overflowed, the area read inf
    out_dtype = at_least_float32(curve.dtype) if curve.is_floating_point() else torch.float64
    curve = curve.double()
    # normalise="no" (a setting read from text) normalised the area, silently: 1.0 for the paper's 0.8
    normalise = require_bool("normalise", normalise, fix="Pass normalise=True (the area divided by the width of the "
                             "fractions) or normalise=False (the paper-compatible area)")
    fractions = check_fractions(fractions, zero=True)
    x = torch.as_tensor(fractions, dtype=torch.float64, device=curve.device)
    if curve.shape[-1] != x.shape[0]:
        raise argument_error("curve", f"has {curve.shape[-1]} points but there are {x.shape[0]} fractions",
                             "Pass one value per fraction")
    if x.shape[0] < 2 or not (x[1:] > x[:-1]).all():
        raise argument_error("fractions", f"fractions must be at least two increasing values, got {list(fractions)}",
                             "Pass e.g. DEFAULT_FRACTIONS")
    area = torch.trapezoid(curve, x, dim=-1)
    # the trapezoid's pairwise sums of float64 values near 1.8e308 overflowed (an area of inf for a curve of 1.7e308
    # over [0, 1]; the curve is finite, require_tensor): those rows are integrated again at half their values
    overflowed = ~torch.isfinite(area)
    if overflowed.any():
        area = torch.where(overflowed, torch.trapezoid(curve * 0.5, x, dim=-1) * 2, area)
    if normalise:
        area = area / (x[-1] - x[0])
    # fractions lie in [0, 1] (check_fractions), so the area is at most the curve's largest value (its mean with
    # normalise): it fits the curve's dtype, and the narrowing below rounds, never overflows
    return area.to(out_dtype)


@dataclass
class PerturbationCurves:
    """Per-example comprehensiveness and sufficiency curves and their summaries.

    Attributes:
        comprehensiveness: ``(batch, n_fractions)`` probability drops with the top-k tokens removed.
        sufficiency: ``(batch, n_fractions)`` probability drops with only the top-k tokens kept.
        fractions: the p values.
        full_probability: ``P(y | x)`` on the unperturbed input, ``(batch,)`` (``P(y | x) - P(foil | x)`` for a
            contrastive explanation; the logit with ``probability="logit"``).
        target: the class y per example.
        k: ``(batch, n_fractions)`` number of tokens perturbed.
        foil: the foil class per example of a contrastive explanation (its curves track ``P(y) - P(foil)``), else
            ``None``.
        probability: what the curves track of the model's outputs: ``"softmax"``, ``"sigmoid"`` or ``"logit"`` (see
            :func:`perturbation_curves`); curves of different kinds are not concatenated.
    """

    comprehensiveness: Float[Tensor, "batch n_fractions"]
    sufficiency: Float[Tensor, "batch n_fractions"]
    fractions: tuple[float, ...]
    full_probability: Float[Tensor, " batch"]
    target: Int[Tensor, " batch"]
    k: Int[Tensor, "batch n_fractions"]
    foil: Int[Tensor, " batch"] | None = None
    probability: str = "softmax"

    @property
    def comprehensiveness_aopc(self) -> Float[Tensor, " batch"]:
        """Paper-compatible unnormalised AOPC (sklearn ``auc`` over the fractions) per example."""
        return aopc(self.comprehensiveness, self.fractions)

    @property
    def sufficiency_aopc(self) -> Float[Tensor, " batch"]:
        """Paper-compatible unnormalised AOPC (sklearn ``auc`` over the fractions) per example."""
        return aopc(self.sufficiency, self.fractions)

    @property
    def comprehensiveness_aopc_normalised(self) -> Float[Tensor, " batch"]:
        """AOPC divided by the width of the fraction range (mean height of the curve) per example."""
        return aopc(self.comprehensiveness, self.fractions, normalise=True)

    @property
    def sufficiency_aopc_normalised(self) -> Float[Tensor, " batch"]:
        """AOPC divided by the width of the fraction range (mean height of the curve) per example."""
        return aopc(self.sufficiency, self.fractions, normalise=True)

    def summary(self) -> dict[str, float]:
        """Means over examples of the four AOPC numbers (as fractions, not percent)."""
        return {
            "comprehensiveness_aopc": self.comprehensiveness_aopc.mean().item(),
            "sufficiency_aopc": self.sufficiency_aopc.mean().item(),
            "comprehensiveness_aopc_normalised": self.comprehensiveness_aopc_normalised.mean().item(),
            "sufficiency_aopc_normalised": self.sufficiency_aopc_normalised.mean().item(),
        }

    @classmethod
    def concatenate(cls, parts: Sequence[PerturbationCurves]) -> PerturbationCurves:
        """Join the curves of several batches (same fractions)."""
        if not parts:
            raise argument_error("parts", "nothing to concatenate", "Pass at least one PerturbationCurves")
        if any(p.fractions != parts[0].fractions for p in parts):
            raise argument_error("parts", "all parts must use the same fractions", "Compute them with one setting")
        contrastive = {p.foil is not None for p in parts}
        if len(contrastive) > 1:
            # the curves of P(target) and of P(target) - P(foil) are different quantities: one mean of both is neither
            raise argument_error("parts", "mix curves of contrastive explanations (tracking P(target) - P(foil)) with "
                                 "curves of P(target)", "Concatenate the curves of one kind of explanation")
        kinds = sorted({p.probability for p in parts})
        if len(kinds) > 1:
            # one mean over drops of a softmax probability, a sigmoid and a logit (a multi-label model's default next
            # to a forced softmax, a regression head's values) is none of them
            raise argument_error("parts", f"mix curves of different tracked values {kinds} (the probability option "
                                 "or the models' problem types differ)", "Concatenate curves computed with one "
                                 "probability= setting")
        return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in
                     ("comprehensiveness", "sufficiency")), parts[0].fractions,
                   *(torch.cat([getattr(p, f) for p in parts]) for f in ("full_probability", "target", "k")),
                   foil=torch.cat([p.foil for p in parts]) if contrastive == {True} else None,
                   probability=parts[0].probability)


def top_k_masks(
    scores: Float[Tensor, "batch pos"],
    perturbable: Bool[Tensor, "batch pos"],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> tuple[Bool[Tensor, "batch n_fractions pos"], Int[Tensor, "batch n_fractions"]]:
    """For each p: True at the ``max(1, int(n * p))`` highest-scoring perturbable tokens of each row.

    Ties are broken by position (earlier first), so results are deterministic.
    """
    scores = token_scores(scores)
    fractions = check_fractions(fractions)
    perturbable = require_tensor("perturbable", perturbable, ndim=2, kind="mask").to(scores.device).bool()
    require_same_shape("perturbable", perturbable, "scores", scores, "Pass one flag per token score")
    n = perturbable.sum(-1)
    if (n == 0).any():
        none = n == 0
        verb = "has" if int(none.sum()) == 1 else "have"
        raise argument_error("perturbable", f"{bad_rows(none)} {verb} no perturbable token (only special tokens or "
                             "padding)", "Drop those rows")
    # rank perturbable tokens by descending score; others go last
    ranked_scores = scores.masked_fill(~perturbable, float("-inf"))
    order = torch.sort(ranked_scores, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(scores.shape[-1], device=scores.device).expand_as(order))
    k = share_counts(n[:, None], torch.tensor(fractions, dtype=torch.float64)[None, :])
    masks = (rank[:, None, :] < k[:, :, None]) & perturbable[:, None, :]
    return masks, k


def check_fractions(fractions, zero: bool = False, example: str = "DEFAULT_FRACTIONS") -> tuple[float, ...]:
    """Fractions as floats, each in (0, 1] (for perturbation), or in [0, 1] with ``zero`` (the areas and image curves,
    whose curves may start unperturbed); ``example`` names the default to suggest (the image metrics' is
    ``IMAGE_FRACTIONS``). Until 2026-11-29 ``zero`` read any float, so ``aopc(curve, [0, 10])`` was an area over a
    tenfold removal, silently."""
    # a 0-d tensor or array failed with "iteration over a 0-d tensor"; a set or dict has no order (a dict's keys
    # were read as the fractions)
    if isinstance(fractions, str | bytes | Mapping | AbstractSet) or not hasattr(fractions, "__iter__") \
            or getattr(fractions, "ndim", 1) != 1:
        raise argument_error("fractions", f"must be a sequence of floats, got {type(fractions).__name__} "
                             f"{fractions!r}", f"Pass e.g. {example}", kind=BcosTypeError)
    # a float32 / bfloat16 tensor or array of fractions (torch.tensor(DEFAULT_FRACTIONS), torch.linspace(0.1, 0.9, 9))
    # is read as the decimals it stands for: 0.7 held as 0.69999999 took 6 of 10 tokens for 7, silently
    shares = [share_as_written(f) for f in fractions]
    values = tuple(require_float("fractions", f, minimum=0.0, maximum=1.0) if zero else require_float("fractions", f)
                   for f in shares)
    if not values:
        raise argument_error("fractions", "is empty", f"Pass e.g. {example}")
    if not zero and not all(0.0 < f <= 1.0 for f in values):
        raise argument_error("fractions", f"fractions must lie in (0, 1], got {values}",
                             "Pass shares of the perturbable tokens, e.g. DEFAULT_FRACTIONS")
    return values


def refuse_target_unlike_explained(target: Tensor, explained: Tensor | None, score: str, fix: str) -> None:
    """Refuse class ids ``target`` (one per row) where they differ from ``explained``, the classes an explanation of
    the package explains (``None``: the attributions do not say, nothing to compare): the curves would score the
    attributions of one class on another's ``score`` (probability, confidence), silently."""
    if explained is None:
        return
    target, explained = target.cpu(), explained.cpu().long()
    if torch.equal(target, explained):
        return
    differ = target != explained
    raise argument_error("target", f"is {target[differ].tolist()[:8]} at {bad_rows(differ)}, but the explanation "
                         f"explains {explained[differ].tolist()[:8]} there: the curves would score attributions of one "
                         f"class on another's {score}", fix)


def explained_foil(explanation: Any, n_rows: int, n_classes: int | None, score: str) -> Tensor | None:
    """The foil class ids (one per row) of a contrastive explanation of the package (``explain(..., foil=)``), whose
    curves track the contrast it explains, the target's ``score`` minus the foil's; ``None`` for anything else
    (tensors and Captum tuples do not say what they explain). Until 2026-11-29 such an explanation's ranking of
    evidence for ``target - foil`` was scored on the target's ``score`` alone: a feature that only counted against
    the foil ranked first without moving it, silently. A foil that is a ``Direction`` has no class ``score`` to track
    and is refused."""
    if not hasattr(explanation, "input_contributions"):
        return None
    foil = getattr(explanation, "foil", None)
    if foil is None:
        return None
    if isinstance(foil, Direction):
        raise argument_error("attributions", f"explain target - a Direction of the output space (the foil), which has "
                             f"no class {score} to track, so the curves of the contrast cannot be taken",
                             "Explain with a class id as foil, or without foil")
    return require_row_ids("foil", foil, n_rows, n_ids=n_classes, what="classes (the explanation's foil)")


def refuse_explanation_of_another_model(explanation: Any, logits: Tensor, target: Tensor, argument: str,
                                        fix: str, computed_in: torch.dtype | None = None) -> None:
    """Refuse an explanation of the package whose model outputs (``explanation.logits``, one per row: the explained
    values, plus what belongs to no token, a Space model's classifier bias) are not
    those of ``logits``, the scored model's outputs ``(batch, classes)`` on the explained inputs, at its class ids
    ``target`` (minus its foil's): it explains another model (other weights, another checkpoint of the architecture),
    so its ranking was scored on this model's confidences, silently. Explanations that do not say what they explain
    (tensors, Captum tuples, a ``Direction`` target or foil) are not compared. The tolerance, 1e-3 of the logit (at
    least 1e-3) or 8 units of the widest rounding of the two dtypes and ``computed_in`` (the dtype the scored model
    computed its logits in, where ``logits`` were widened since), lets an explanation of the same model in another
    dtype or batch pass; another model's logits differ by far more."""
    explained = getattr(explanation, "explained", None)
    if not isinstance(explained, Tensor) or not explained.is_floating_point() or explained.shape != target.shape:
        return
    # a Space explanation's explained value leaves the classifier bias out (it belongs to no token): compared with the
    # logit, its own model's explanation was refused as "made for another model"; its logits add the bias back
    model_value = getattr(explanation, "logits", explained)
    if isinstance(model_value, Tensor) and model_value.shape == explained.shape:
        explained = model_value
    value = logits.gather(-1, target[:, None].to(logits.device)).squeeze(-1)
    foil = getattr(explanation, "foil", None)
    if foil is not None:
        if not isinstance(foil, Tensor) or foil.is_floating_point() or foil.dtype == torch.bool \
                or foil.shape != target.shape:
            return
        value = value - logits.gather(-1, foil[:, None].to(logits.device).long()).squeeze(-1)
    explained = explained.detach().to(value.device, torch.float64)
    value = value.double()
    # the model's own dtype too: its logits are widened to float32 before they reach here, so a float64 explanation of
    # the same model cast to bfloat16 (logits off by 3e-3) was refused as "made for another model"
    dtypes = [explanation.explained.dtype, logits.dtype] + ([computed_in] if computed_in is not None
                                                            and computed_in.is_floating_point else [])
    rounding = 8 * max(torch.finfo(dtype).eps for dtype in dtypes)
    tolerance = torch.clamp(value.abs(), min=1.0) * max(1e-3, rounding)
    differ = (explained - value).abs() > tolerance
    if differ.any():
        raise argument_error(argument, f"explains the values {explained[differ].tolist()[:4]} at "
                             f"{bad_rows(differ)}, but the model scored here gives {value[differ].tolist()[:4]} for the "
                             "same inputs and classes: the explanation was made for another model (or with other "
                             "inputs to it, e.g. token_type_ids)", fix)


def _explained_classes(attributions: Any, input_ids: Tensor, mask: Tensor) -> Tensor | None:
    """The class ids an explanation of the package explains (its ``target``, one per row), or None for attributions
    that do not say (a tensor, a Captum tuple, a direction target). An explanation of other ``input_ids`` (of the same
    shape; padding not compared) is refused: its scores would be ranked over these tokens."""
    explained_ids = getattr(attributions, "input_ids", None)
    if isinstance(explained_ids, Tensor) and explained_ids.shape == input_ids.shape:
        differ = (explained_ids.to(input_ids.device, input_ids.dtype) != input_ids) & mask.bool()
    else:
        differ = None
    if differ is not None and differ.any():
        raise argument_error("attributions", f"explain other input_ids than those passed ({bad_rows(differ)} differ)",
                             "Pass the input_ids (and attention_mask) the explanation was made of")
    explained_mask = getattr(attributions, "attention_mask", None) if differ is not None else None
    if isinstance(explained_mask, Tensor) and explained_mask.shape == mask.shape:
        # an explanation of the padded rows scored with another mask (all ones): its padding was ranked and removed as
        # tokens, and the curves were those of other inputs than the explained ones, silently
        other = explained_mask.to(mask.device).bool() != mask.bool()
        if other.any():
            raise argument_error("attention_mask", f"differs from the mask the explanation was made with in "
                                 f"{bad_rows(other)}", "Pass the attention_mask the explanation was made with "
                                 "(explanation.attention_mask)")
    target = getattr(attributions, "target", None) if hasattr(attributions, "input_contributions") else None
    if not isinstance(target, Tensor) or target.is_floating_point() or target.dtype == torch.bool or target.ndim != 1:
        return None
    return target.detach().long()


def _tracked(probabilities: Tensor, target: Tensor, foil: Tensor | None) -> Tensor:
    """Per row, the target's probability, minus the foil's for a contrastive explanation."""
    value = probabilities.gather(-1, target[:, None]).squeeze(-1)
    return value if foil is None else value - probabilities.gather(-1, foil[:, None]).squeeze(-1)


def _probabilities(model: Callable, call: dict, probability: str, examples: Sequence[int]) -> Tensor:
    """The class probabilities of ``model(**call)``; ``examples``: the explained example each row of the call is a
    (perturbed) copy of, named where its logits are NaN or infinite."""
    logits = _class_logits(model, call, examples)
    return _as_probability(logits, probability)


def _as_probability(logits: Tensor, probability: str) -> Tensor:
    """The tracked value of class ``logits`` as ``probability`` says: softmax, sigmoid, or the logit itself."""
    if probability == "softmax":
        return logits.softmax(-1)
    return logits.sigmoid() if probability == "sigmoid" else logits


def _class_logits(model: Callable, call: dict, examples: Sequence[int], widen: bool = True) -> Tensor:
    """The class logits of ``model(**call)`` in at least float32 (see :func:`_probabilities`); ``widen=False``: in the
    dtype the model returned them in."""
    # in eval mode, as the decoder metrics and SeqPG score: a model left in training mode (after a Trainer run)
    # scored every perturbed row with dropout on, so the curves were random (off by 2x on a tiny BERT), silently
    with evaluating(model) if isinstance(model, nn.Module) else nullcontext():
        out = model(**call)
    logits = out.logits if hasattr(out, "logits") else out
    if not isinstance(logits, Tensor) or logits.ndim != 2:
        raise argument_error("model", f"must return class logits (batch, classes), got "
                             f"{tuple(getattr(logits, 'shape', ()))}", "Pass a sequence classifier")
    # a float64 Gemma 2 gives NaN where the perturbation's mask leaves a query only masked keys: the package's one
    # refusal of such logits names that cause (an infinite logit makes the softmax NaN too)
    refuse_nan_logits("perturbation_curves", ~torch.isfinite(logits).all(-1), examples, "examples", logits.dtype,
                      call.get("attention_mask"), "Pass the model in float32 (model.float()), or masking='mask_token' "
                      "with unpadded rows.", what="NaN or infinite",
                      masked="tokens are masked out (padding, or the perturbation's removals through the attention "
                      "mask)", model=model if isinstance(model, nn.Module) else None, input_ids=call.get("input_ids"))
    return logits.to(at_least_float32(logits.dtype)) if widen else logits  # a float64 model's stay float64


def _reads_one_token(model, spec) -> bool:
    """Whether a registry classifier classifies from one token's hidden state (a decoder's last, a first-column
    classifier's first), which masking that token's attention does not remove."""
    return spec is not None and spec.is_classifier and (
        spec.kind == "decoder" or spec.classifies_from_first_column(model.config))


def _without_read_token(model, spec, perturbable: Tensor, mask: Tensor, call_ids: Tensor) -> Tensor:
    """``perturbable`` without the token the classifier reads (its hidden state holds that token's own embedding,
    which masking its attention does not remove: see the module docstring). A first-column classifier reads the first
    column (left padding is refused before). A decoder classifier reads the last token whose id in the model's call
    (padding written as ``config.pad_token_id``) is not ``config.pad_token_id``, found as transformers finds it: a real
    token with that id at the end of a row (an end-of-sequence token used as padding) is skipped."""
    rows = torch.arange(mask.shape[0], device=mask.device)
    read = torch.zeros_like(perturbable)
    pad = getattr(model.config, "pad_token_id", None)
    if spec.kind != "decoder":
        position = torch.zeros_like(rows)
        which = "first one, which the classifier reads"
    else:
        which = "last one (whose id is not config.pad_token_id), which the decoder classifier reads"
        if pad is None:  # unpadded (model_call_kwargs refuses padding then): the model reads the last column
            position = explained_positions(spec, None, mask)
        else:
            columns = torch.arange(call_ids.shape[1], device=call_ids.device)
            position = (columns * (call_ids != pad)).argmax(-1)
    read[rows, position.to(mask.device)] = True
    only_read = read.any(-1) & perturbable.any(-1) & ~(perturbable & ~read).any(-1)
    if only_read.any():
        raise argument_error(
            "attention_mask", f"{bad_rows(only_read)}: the only perturbable token is the {which}: removing it through "
            "the attention mask leaves its own embedding in the hidden state the classifier reads, so it is never "
            "perturbed", "Drop those rows, or pass masking='mask_token'")
    return perturbable & ~read


def _refuse_rows_left_without_tokens(perturbed_mask: Tensor, fractions: tuple[float, ...]) -> None:
    """Refuse removals that leave a row no visible token: attention whose keys are all masked spreads evenly over every
    column, removed tokens included, so the model would still see them (a row of one perturbable token and no kept
    special token, or a fraction of 1)."""
    empty = ~perturbed_mask.bool().any(-1)  # (batch, 2 n_fractions): removed top-k, then kept only top-k
    if not empty.any():
        return
    rows = empty.any(-1)
    at = sorted({fractions[f % len(fractions)] for f in empty.nonzero()[:, 1].tolist()})
    raise argument_error(
        "fractions", f"removing the top-k tokens through the attention mask leaves {bad_rows(rows)} no visible token "
        f"at fractions {at}: attention with every key masked spreads evenly over all of them, removed ones included, "
        "so nothing would be removed", "Keep the special tokens (tokenizer= or special_tokens= marking [CLS] / [SEP]), "
        "use fractions below 1 and drop rows of one token, or pass masking='mask_token'")


@torch.no_grad()
def perturbation_curves(
    model: Callable[..., Any],
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    attributions: Any,
    *,
    tokenizer=None,
    special_tokens: Bool[Tensor, "batch pos"] | None = None,
    target: int | Tensor | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    masking: Literal["attention", "mask_token"] = "attention",
    mask_token_id: int | None = None,
    probability: Literal["softmax", "sigmoid", "logit"] | None = None,
    batch_size: int = 64,
    reduce: str = "sum",
    **forward_kwargs,
) -> PerturbationCurves:
    """Comprehensiveness and sufficiency curves of a batch (see module docstring).

    Args:
        model: a transformers classifier, or any ``f(input_ids=, attention_mask=, **kw)`` returning class
            logits (a tensor or an object with ``.logits``). A module runs in eval mode; a function that scores the
            same rows differently (one around a model in training mode: dropout) is refused.
        input_ids, attention_mask: the explained batch (padding on either side, except for a classifier that
            reads the first column, BERT's, DistilBERT's, RoBERTa's, ModernBERT's with ``classifier_pooling="cls"``:
            left padding is refused there, its probabilities would be a padding token's). Models of the
            architecture registry are called as ``explain`` calls them (``rows_as_alone_call``), so each row's
            curves are those of the row alone: a decoder classifier's positions count real tokens (of the
            unperturbed row, so a removed token leaves the others' positions as they are) and its padding is
            written as ``config.pad_token_id``. Any other callable is called with the batch as given. A transformers
            model outside the registry is refused left padding where it reads a learned position table, and where it
            is a sequence classifier not known to classify from the last token (ELECTRA's reads the first column),
            also with the caller's own ``position_ids``: its curves would score a padding token's logits. GPT-2-,
            GPT-Neo- and OPT-style classifiers, transformers' generic decoder classifiers and XLNet's
            (``summary_type="last"``) keep left padding.
        attributions: from any method (see :func:`~bcos_plugins.metrics.token_scores`), aligned with
            ``input_ids``.
        tokenizer / special_tokens: where the special tokens are (one is required; they are never perturbed).
            With ``masking="attention"``, the token a registry classifier reads (a decoder's last real token, a
            first-column classifier's first) is never perturbed either (see the module docstring); a row with no
            other perturbable token is refused, and so is a removal that leaves a row no visible token.
        target: the class whose probability is tracked; default the class ``attributions`` explains when it is an
            explanation of the package (its ``target``; another ``target`` is refused), else the class predicted on
            the full input. An explanation of other ``input_ids``, made with another ``attention_mask`` or for
            another model (its ``explained`` logits are not this model's, beyond 1e-3 of the logit) is refused. A
            contrastive explanation (made with ``foil=``) is scored on ``P(target) - P(foil)`` (module docstring).
        fractions: the p values (default 0.1..0.9).
        masking: ``"attention"`` (remove via attention mask, the paper code's choice) or ``"mask_token"``.
        mask_token_id: for ``masking="mask_token"``; default ``tokenizer.mask_token_id``. A registry decoder
            classifier's ``config.pad_token_id`` is refused (the classifier reads the last token whose id is not it).
        probability: ``"softmax"`` (as in ERASER and the paper), ``"sigmoid"`` or ``"logit"``; default (``None``) what the
            model's ``config.problem_type`` implies: ``"sigmoid"`` for ``"multi_label_classification"`` (whose classes'
            probabilities are sigmoids: the softmax tracked a share among the classes, which removing evidence of
            another class raised, silently), ``"logit"`` (the output itself: the drop of the predicted value) for
            ``"regression"`` (a one-logit head trained on values; its sigmoid squashed the value), else ``"softmax"``.
        batch_size: perturbed inputs per forward pass.
        reduce: how embedding-level attributions become token scores (``"sum"``, the paper's choice).
        **forward_kwargs: extra per-example tensors for the model (e.g. ``token_type_ids``).
    """
    if masking not in ("attention", "mask_token"):
        raise argument_error("masking", f"masking must be 'attention' or 'mask_token', got {masking!r}",
                             "Pick one of those")
    if probability is None:
        problem = getattr(getattr(model, "config", None), "problem_type", None)
        # a regression head (config.problem_type "regression", which transformers also sets when a one-logit model is
        # trained on float labels) predicts the value itself: its softmax was refused, suggesting the sigmoid, which
        # squashed a value of 3.5 to 0.97 and its drops to almost nothing, silently
        probability = {"multi_label_classification": "sigmoid", "regression": "logit"}.get(problem, "softmax")
    if probability not in ("softmax", "sigmoid", "logit"):
        raise argument_error("probability", f"probability must be 'softmax', 'sigmoid' or 'logit', got "
                             f"{probability!r}", "Pick one of those")
    if not callable(model):
        raise argument_error("model", f"must be callable, got {type(model).__name__}", "Pass the classifier",
                             kind=BcosTypeError)
    # the ids and mask on another device than the model (a model moved to a GPU, the tokenizer's tensors left on
    # the CPU) failed inside the first forward with torch's "Expected all tensors to be on the same device"
    refuse_inputs_on_another_device(model, input_ids, attention_mask)
    if masking == "mask_token" and mask_token_id is None:
        mask_token_id = getattr(tokenizer, "mask_token_id", None)
        if mask_token_id is None:
            raise argument_error("mask_token_id", "masking='mask_token' needs mask_token_id= or a tokenizer with a "
                                 "mask token", "Pass one of them")
    # ids past the model's embedding rows fail deep inside it (IndexError; a device-side assert on a GPU)
    vocab = vocabulary_size(model) if isinstance(model, nn.Module) else None
    if mask_token_id is not None:
        mask_token_id = require_int("mask_token_id", mask_token_id, minimum=0,
                                    maximum=None if vocab is None else vocab - 1)
    batch_size = require_int("batch_size", batch_size, minimum=1)
    fractions = check_fractions(fractions)
    # ids past the model's position table failed inside it with torch's "index 40 is out of bounds for dimension 1",
    # naming no argument: refused here as explain and next_token_contrast refuse them
    limit = position_limit(model) if isinstance(model, nn.Module) else None
    input_ids, attention_mask = require_token_batch(
        input_ids, attention_mask, vocab_size=vocab, max_length=limit.max_length if limit is not None else None,
        limit_name=limit.source if limit is not None else None,
        **unmasked_padding_keywords(getattr(model, "config", None), attention_mask))
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    spec = registry_spec(model)
    pad_id = getattr(getattr(model, "config", None), "pad_token_id", None)
    if masking == "mask_token" and spec is not None and spec.is_classifier and spec.kind == "decoder" \
            and pad_id is not None and mask_token_id == pad_id:
        # a decoder classifier reads the last token whose id is not config.pad_token_id: a removed last token written
        # as that id moved the read position to an earlier token, so the perturbed row was scored at another position
        # than the unperturbed one, silently
        # the unknown token is suggested only where it is another id: GPT-2's is its end-of-text token, the pad id
        # its classifiers are given, so the fix named an id that was refused again
        unk = getattr(tokenizer, "unk_token_id", None)
        example = f"tokenizer.unk_token_id, {unk}" if isinstance(unk, int) and unk != pad_id else \
            "the id of a neutral word of the vocabulary"
        raise argument_error("mask_token_id", f"is {mask_token_id}, {type(model).__name__}'s config.pad_token_id: the "
                             "decoder classifier reads the last token whose id is not the pad id, so a removed last "
                             "token written as it moves the position the perturbed row is scored at",
                             f"Pass another token id as mask_token_id (not {pad_id}; e.g. {example}), or "
                             "masking='attention'")
    # refuses left padding before a classifier reads the first column; position ids of the unperturbed rows
    call = rows_as_alone_call(model, input_ids, mask, forward_kwargs, spec=spec)
    # a NaN or inf at a padding position (never ranked or removed: a padding token's NaN embedding through Captum's
    # methods) was refused as a real token's; zeroed with the rest of the padding, as explanation_entropy and
    # seqpg_score take it
    given = attributions if attention_mask is None or hasattr(attributions, "input_contributions") \
        else masked_positions_zeroed(numbers_as_one_tensor(attributions), attention_mask)
    scores = token_scores(given, reduce=reduce).to(input_ids.device)
    require_same_shape("attributions", scores, "input_ids", input_ids,
                       "Attribute the same batch at the token (embedding) level (the shape is that of the token "
                       "scores, the attributions summed over the embedding)")
    perturbable = perturbable_mask(input_ids, mask, tokenizer=tokenizer, special_tokens=special_tokens)
    if masking == "attention" and _reads_one_token(model, spec):
        perturbable = _without_read_token(model, spec, perturbable, mask, call["input_ids"])
    top, k = top_k_masks(scores, perturbable, fractions)
    batch, n_fr, length = top.shape

    raw_logits = _class_logits(model, call, range(batch), widen=False)
    full_logits = raw_logits.to(at_least_float32(raw_logits.dtype))
    if probability == "softmax" and full_logits.shape[-1] == 1:
        # the softmax of one logit is 1 whatever the input: every curve of a one-logit classifier (num_labels=1, a
        # binary one trained with a sigmoid) was 0, every method's AOPC 0, silently
        raise argument_error("probability", f"is 'softmax', but {type(model).__name__} returns one logit per row, "
                             "whose softmax is 1 whatever the input (every curve would be 0)",
                             "Pass probability='sigmoid' for a binary classifier with one logit, or "
                             "probability='logit' for a regression head (the predicted value itself)")
    full = _as_probability(full_logits, probability)
    if not isinstance(model, nn.Module):
        # eval mode cannot reach a model inside a function: in training mode (dropout) every perturbed row was scored
        # by another random network, so the curves were noise; the unperturbed rows are scored a second time
        require_deterministic("model", full, _probabilities(model, call, probability, range(batch)), "rows",
                              "Put the model in eval mode (model.eval()), or pass the model itself")
    explained = _explained_classes(attributions, input_ids, mask)
    if target is None and explained is not None:
        # an explanation of another class than the predicted one was scored on the predicted class, silently
        target_t = require_row_ids("target", explained, batch, n_ids=full.shape[-1], what="classes (the "
                                   "explanation's target)").to(input_ids.device)
    elif target is None:
        if hasattr(attributions, "input_contributions") and isinstance(getattr(attributions, "target", None),
                                                                       Direction):
            # an explanation of a direction of the output space was scored on the predicted class, silently
            raise argument_error("target", "is missing and the explanation explains a Direction, not a class, so "
                                 "there is no class whose probability to track", "Pass target= the class ids to track "
                                 "(one per row), or explain a class")
        target_t = full.argmax(-1)
    else:
        target_t = require_row_ids("target", target, batch, n_ids=full.shape[-1], what="classes").to(input_ids.device)
        refuse_target_unlike_explained(target_t, explained, "probability", "Leave target out (the explanation's "
                                       "class is used), or explain the class you score")
    if explained is not None:
        refuse_explanation_of_another_model(attributions, full_logits, explained.to(full_logits.device),
                                            "attributions", "Score the model the explanation was made with, "
                                            "passing the keywords it was explained with (or explain this model)",
                                            computed_in=raw_logits.dtype)
    # a contrastive explanation ranks evidence for target - foil: its curves track P(target) - P(foil)
    foil_t = explained_foil(attributions, batch, full.shape[-1], "probability")
    foil_t = foil_t.to(input_ids.device) if foil_t is not None else None
    p_full = _tracked(full, target_t, foil_t)

    # rows: [removed top-k for each p] then [kept only top-k for each p], per example
    removed = top
    kept_only = perturbable[:, None, :] & ~top  # the tokens removed for sufficiency
    drop = torch.cat([removed, kept_only], dim=1)  # (batch, 2 n_fr, pos)
    ids = call["input_ids"][:, None, :].expand(batch, 2 * n_fr, length)
    msk = mask[:, None, :].expand(batch, 2 * n_fr, length)
    if masking == "attention":
        msk = msk.masked_fill(drop, 0)
        _refuse_rows_left_without_tokens(msk, fractions)
    else:
        ids = ids.masked_fill(drop, mask_token_id)
    ids, msk = ids.reshape(-1, length), msk.reshape(-1, length)
    per_row = {name: v for name, v in call.items() if name not in ("input_ids", "attention_mask")
               and isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == batch}
    constant = {name: v for name, v in call.items()  # e.g. the return_dict=True of rows_as_alone_call
                if name not in ("input_ids", "attention_mask") and name not in per_row}
    extra = {name: v[:, None].expand(batch, 2 * n_fr, *v.shape[1:]).reshape(-1, *v.shape[1:])
             for name, v in per_row.items()}
    target_rows = target_t[:, None].expand(batch, 2 * n_fr).reshape(-1)
    foil_rows = foil_t[:, None].expand(batch, 2 * n_fr).reshape(-1) if foil_t is not None else None
    probs = []
    for start in range(0, ids.shape[0], batch_size):
        sl = slice(start, start + batch_size)
        p = _probabilities(model, {"input_ids": ids[sl], "attention_mask": msk[sl], **constant,
                                   **{n: v[sl] for n, v in extra.items()}}, probability,
                           [row // (2 * n_fr) for row in range(start, min(start + batch_size, ids.shape[0]))])
        probs.append(_tracked(p, target_rows[sl], foil_rows[sl] if foil_rows is not None else None))
    p_pert = torch.cat(probs).reshape(batch, 2 * n_fr)
    drops = p_full[:, None] - p_pert
    return PerturbationCurves(
        comprehensiveness=drops[:, :n_fr].cpu(),
        sufficiency=drops[:, n_fr:].cpu(),
        fractions=fractions,
        full_probability=p_full.cpu(),
        target=target_t.cpu(),
        k=k.cpu(),
        foil=foil_t.cpu() if foil_t is not None else None,
        probability=probability,
    )
