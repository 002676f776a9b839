"""Turning any method's attributions into per-token scores, and the tokens a metric may touch.

Metrics take attributions from any method: a ``(batch, pos)`` tensor of token scores, a ``(batch, pos, d)``
tensor at an embedding (summed over ``d``, the B-cos LM paper's choice: the sum is exact for B-cos and more
faithful than the L2 norm for post-hoc methods), a one-element tuple as Captum returns for tuple inputs,
or any :class:`~bcos_plugins.attribution.Explanation` (text, image, Space, TransformerLens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .._checks import bad_rows, require_same_shape, require_tensor
from ..errors import BcosTypeError, argument_error
from ..nn.functional import at_least_float32

__all__ = ["masked_positions_zeroed", "numbers_as_one_tensor", "perturbable_mask", "refuse_boolean_scores",
           "refuse_table_of_rows", "scores_and_positions", "share_as_written", "share_counts", "special_tokens_mask", "token_scores"]


def refuse_boolean_scores(name: str, scores: Tensor, fix: str = "Pass float token scores") -> None:
    """Refuse a boolean tensor where scores are expected: flags, not scores (ranked, their ties were broken by position;
    summed, a mask counted its True entries), silently. The one refusal of the text metrics and the summaries."""
    if scores.dtype == torch.bool:
        raise argument_error(name, "must be numbers, got a boolean tensor", fix, kind=BcosTypeError)


def share_counts(n: Int[Tensor, "..."], fractions: Float[Tensor, "..."] | float) -> Int[Tensor, "..."]:
    """``max(1, int(n * p))`` token counts for shares ``p`` of ``n`` tokens (broadcast), as the papers' code takes them.

    Computed in float64 with a margin of 1e-9, so that a share written as a decimal gives the count it means
    (``180 * 0.65`` is 117; float32 gives 116, and Python's float64 ``int(90 * 0.7)`` gives 62).
    """
    shares = torch.as_tensor(fractions, dtype=torch.float64, device=n.device)
    return torch.clamp((n.double() * shares + 1e-9).floor().long(), min=1)


def share_as_written(value: Any) -> Any:
    """A share (a fraction of the tokens or pixels) held in a dtype narrower than float64 (a float32 / float16 /
    bfloat16 tensor element or NumPy scalar) as the decimal it stands for, rounded to the digits that dtype holds
    (6 for float32, 3 for float16, 2 for bfloat16); anything else is returned as given. float32 holds 0.7 as
    0.69999999: ``max(1, int(10 * p))`` took 6 tokens for 7 (``fractions=torch.tensor(DEFAULT_FRACTIONS)``,
    ``torch.linspace(0.1, 0.9, 9)``, ``top_k_iou(k=torch.tensor(0.7))``), silently; :func:`share_counts`' margin of
    1e-9 absorbs float64's rounding only."""
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, torch.dtype):
        narrow = dtype.is_floating_point and dtype.itemsize < 8
        eps = torch.finfo(dtype).eps if narrow else None
    else:
        try:
            kind = np.dtype(dtype) if dtype is not None else None
        except TypeError:
            kind = None
        narrow = kind is not None and kind.kind == "f" and kind.itemsize < 8
        eps = float(np.finfo(kind).eps) if narrow else None
    if not narrow or getattr(value, "ndim", 0) != 0:
        return value
    return round(float(value), math.floor(-math.log10(eps)))


def ranking_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the metrics rank and sum scores of ``dtype`` in: float64 for integer scores (float32 holds integers
    exactly only up to 2**24: 2**24 + 1 tied with 2**24 and ranked below it by position, silently), else at least
    float32 (float64 kept)."""
    return at_least_float32(dtype) if dtype.is_floating_point else torch.float64


def token_scores(attributions: Any, reduce: str = "sum") -> Float[Tensor, "batch pos"]:
    """Per-token scores ``(batch, pos)`` from any method's attributions (see module docstring).

    Args:
        attributions: tensor ``(batch, pos)`` or ``(batch, pos, *feature_dims)``, a tuple holding one such
            tensor (Captum), or an :class:`~bcos_plugins.attribution.Explanation` (its ``input_contributions``;
            an image explanation gives one score per pixel, ``(batch, H * W)`` row by row, reduced over its encoded
            channels).
        reduce: ``"sum"`` (default, signed) or ``"mean"`` over the feature dimensions; ``"l2"`` gives the
            unsigned norm for methods whose sign is meaningless.
    """
    if reduce not in ("sum", "mean", "l2"):
        raise argument_error("reduce", f"reduce must be 'sum', 'mean' or 'l2', got {reduce!r}", "Pick one of those")
    if hasattr(attributions, "input_contributions"):  # any result type of the attribution core
        image = _is_image_explanation(attributions)
        attributions = attributions.input_contributions
        if image:
            # (batch, 2C, H, W): the pixels are the positions and the encoded channels their features; read as
            # (batch, pos, ...) the 2C channels were the "tokens", so explanation_entropy of an image explanation was
            # the entropy of two channel sums (0.66 for the 5.17 of its pixels), silently
            attributions = attributions.flatten(2).transpose(1, 2)
    attributions = numbers_as_one_tensor(attributions)
    if isinstance(attributions, (tuple, list)):
        first, last = (attributions[0], attributions[-1]) if attributions else (None, None)
        if len(attributions) == 2 and isinstance(first, Tensor) and isinstance(last, Tensor) and first.ndim >= 2 \
                and last.ndim == 1 and last.shape[0] == first.shape[0]:
            # Captum's attribute(..., return_convergence_delta=True) returns (attributions, delta)
            raise argument_error("attributions", "are a pair of attributions and one value per row, as Captum's "
                                 "attribute(..., return_convergence_delta=True) returns them", "Pass its first "
                                 "element, the attributions")
        if len(attributions) != 1:
            raise argument_error("attributions", f"expected the attributions of one input tensor, got a "
                                 f"{type(attributions).__name__} of {len(attributions)} tensors (per-row scores, or "
                                 "several inputs' attributions)", "Pass the (batch, pos) or (batch, pos, d) tensor "
                                 "attributed at the token embeddings, or the explanation itself (not its scores())")
        attributions = attributions[0]
    if hasattr(attributions, "sequence_attributions") or hasattr(attributions, "source_attributions") \
            and hasattr(attributions, "target_attributions"):
        # an inseq output (FeatureAttributionOutput) or one of its sequences: refused with the generic "Pass the
        # attribution tensor", which did not say where in it the tensor is or which axes it has
        raise argument_error("attributions", f"are inseq's {type(attributions).__name__}, whose attributions are "
                             "(tokens, generated tokens or classes, d_model) per sequence, not (batch, pos)",
                             "Take one sequence and one column with a batch axis: seq = out.sequence_attributions[i] "
                             "(an output) and seq.aggregate().source_attributions[:, j][None] (a classifier's class "
                             "j; aggregate() sums d_model for 'bcos') or seq.aggregate().target_attributions[:, j][None] "
                             "(a decoder-only model's step j; keep its prefix rows, the later ones are NaN)",
                             kind=BcosTypeError)
    if not isinstance(attributions, Tensor):
        refuse_table_of_rows(attributions)
        raise argument_error("attributions", f"must be a tensor, a one-tensor tuple or an Explanation, got "
                             f"{type(attributions).__name__}", "Pass the attribution tensor", kind=BcosTypeError)
    if attributions.is_complex() or attributions.dtype == torch.bool:
        raise argument_error("attributions", f"must be real numbers, got dtype {attributions.dtype}",
                             "Pass float attributions", kind=BcosTypeError)
    # float64 attributions stay float64 (float32 would tie scores closer than its rounding and reorder the ranking),
    # integer ones are read in float64
    scores = attributions.detach().to(ranking_dtype(attributions.dtype))
    if scores.ndim < 2:
        raise argument_error("attributions", f"need a batch and a position dimension, got shape "
                             f"{tuple(scores.shape)}", "Add the batch dimension (attributions[None])")
    if scores.shape[0] == 0 or scores.shape[1] == 0:
        raise argument_error("attributions", f"are empty (shape {tuple(scores.shape)})",
                             "Pass the attributions of at least one token of one example")
    finite = torch.isfinite(scores)
    if not finite.all():
        # A NaN score ranks arbitrarily (first under a descending sort) and turns sums into NaN: every metric
        # built on it would be silently wrong.
        raise argument_error("attributions", f"contain NaN or inf in {bad_rows(~finite)}",
                             "Fix the attribution method (or its inputs) for those rows")
    if scores.ndim > 2:
        flat = scores.flatten(2)
        reduced = _over_features(flat, reduce)
        if not bool(torch.isfinite(reduced).all()):
            # finite float32 scores whose sum over the features passes float32's range (3.4e38) read inf for every
            # such token: the entropy read 0 and the top k was the tie rule's pick by position, silently. Reduced in
            # float64 there (returned in float64); the scores stay float32 wherever they fit, as computed before
            reduced = _over_features(flat.double(), reduce)
            if not bool(torch.isfinite(reduced).all()):
                raise argument_error("attributions", f"sum over their features beyond the range of float64 in "
                                     f"{bad_rows(~torch.isfinite(reduced))}", "Rescale the attributions (every metric "
                                     "but completeness_error reads them up to a common factor)")
        scores = reduced
    elif reduce == "l2":
        # the norm over no feature axis is the magnitude: (batch, pos) scores came back signed, where the same scores
        # with a feature axis of one were magnitudes (a token of -3 ranked last instead of first)
        scores = scores.abs()
    return scores


def numbers_as_one_tensor(attributions: Any) -> Any:
    """Attributions written as numbers (nested lists, a NumPy array, a one-input tuple holding an array) as one tensor
    ``(batch, pos, ...)``, read as the rationale and decoder metrics read them (Python floats in float64); tensors,
    tuples of tensors (Captum's, one per input) and anything else are returned as given. The one reading of every
    metric that takes such attributions (:func:`token_scores`, :func:`~bcos_plugins.metrics.completeness_error`)."""
    if isinstance(attributions, (tuple, list)) and len(attributions) == 1 \
            and hasattr(attributions[0], "__array__") and not isinstance(attributions[0], Tensor):
        # a one-input tuple holding an array, as Captum's tuple holds a tensor: read as a (1, batch, pos) tensor, it
        # summed each row's scores into one token
        attributions = attributions[0]
    # a sequence of rows: a list, a tuple, a datasets column (table["scores"], refused as "got Column")
    if not isinstance(attributions, Tensor) and (hasattr(attributions, "__array__") or isinstance(
            attributions, Sequence) and not isinstance(attributions, str | bytes)
            and not any(isinstance(part, Tensor) for part in attributions)):
        # a list of two rows was refused as "a tuple of 2" input tensors, one row as "got list"; completeness_error
        # read each row as the attributions of one input and summed them column by column (an error of 0.33 for exact
        # scores)
        attributions = require_tensor("attributions", attributions, kind="real", finite=False,
                                      shape_hint="(batch, pos, ...)")
    return attributions


def refuse_table_of_rows(attributions: Any) -> None:
    """Refuse a table of explained rows (``explain_dataset``'s ``datasets.Dataset``, one row per text with its scores
    without padding) naming how to score it: it was refused as "got Dataset. Pass the attribution tensor", or, by
    completeness_error, as "explained is missing: the attributions are a tensor"."""
    columns = getattr(attributions, "column_names", None)
    if isinstance(columns, list | tuple) and "scores" in columns:
        raise argument_error("attributions", f"are a table of explained rows ({type(attributions).__name__} with a "
                             "'scores' column, as explain_dataset returns it: one list of scores per text, its padding "
                             "removed), not the attributions of one batch", "Pass explain(model, input_ids, "
                             "attention_mask) of the padded batch, or pad the rows (torch.nn.utils.rnn.pad_sequence("
                             "[torch.as_tensor(s) for s in table['scores']], batch_first=True)) with the mask of their "
                             "real tokens (of a causal LM explained before a text's last token, of the tokens up to "
                             "its 'position' column); a row's completeness error is its 'completeness_error' column",
                             kind=BcosTypeError)


def _over_features(flat: Tensor, reduce: str) -> Tensor:
    """``(batch, pos, features)`` scores reduced over their features as ``reduce`` says (see :func:`token_scores`)."""
    if reduce == "sum":
        return flat.sum(-1)
    if reduce == "mean":
        return flat.mean(-1)
    return flat.norm(dim=-1)


def scores_and_positions(scores: Any, positions: Any, reduce: str = "sum",
                         ranked_as: str | None = None) -> tuple[Any, Tensor | None]:
    """For the metrics that take ``(batch, pos)`` scores and a mask of the positions they rank (``candidates``,
    ``valid_mask``): an explanation of the package read as :func:`token_scores` reads it, with its ``attention_mask``
    as the default ``positions``, so that padding is never ranked. Given the contributions of a padded batch without
    the mask, a row's padding (score 0) outranked its tokens of negative score, and the row scored otherwise in the
    batch than alone (an MRR of 1/8 for 1/7). Attributions at the embeddings ``(batch, pos, d)``, or Captum's
    one-input tuple, are read as :func:`token_scores` reads them. An explanation of a causal model at a position before
    a row's last real
    token (``explain(..., position=)``) leaves out the tokens after it too, which the explained output does not see
    (see :func:`_seen_by_explained_output`). Anything else is returned as given. ``reduce`` as in
    :func:`token_scores` (for the metrics that take it: explanation_entropy, seqpg_score).

    ``ranked_as``: the name of ``positions`` in a metric that ranks them (``candidates``, ``valid_mask``). Positions
    given by hand are then refused where they mark a token the explained output does not see: until 2026-11-29 they
    were used as given, so such tokens were ranked as tokens of score 0 (an MRR of 1/7 for the prefix's 1/4, silently).
    The metrics whose value a score of 0 does not change (entropy, SeqPG) leave it out."""
    if not hasattr(scores, "input_contributions"):
        one = scores[0] if isinstance(scores, tuple) and len(scores) == 1 else scores
        if isinstance(one, Tensor) and (one.ndim >= 3 or one is not scores and one.ndim >= 2):
            # Captum's attributions at the embeddings, (batch, pos, d) or the one-input tuple holding them, as every
            # metric reads them: the rank metrics refused them as "must have 2 dimensions ... Reshape it" / "got
            # tuple. Pass a torch.Tensor", naming neither the reading nor the fix. The positions the metric leaves out
            # are zeroed first: a NaN there (a padding token's, through Captum's methods) is not a ranked token's
            if positions is not None:
                name = ranked_as or "attention_mask"
                scores = masked_positions_zeroed(scores, require_tensor(name, positions, ndim=2, kind="mask"))
            return token_scores(scores, reduce=reduce), positions
        return scores, positions
    mask = getattr(scores, "attention_mask", None)
    if positions is None and isinstance(mask, Tensor):
        positions = mask.bool() & _seen_by_explained_output(scores).to(mask.device)
    elif positions is None:
        # an explanation of an unpadded batch (explain(lm, ids, position=3), no mask): its every token, but those after
        # the explained position of a causal model, which were ranked as tokens of score 0 (an MRR of 1/7 for 1/4)
        seen = _seen_by_explained_output(scores)
        positions = None if bool(seen.all()) else seen
    elif ranked_as is not None:  # positions given by hand (the branches above took None)
        _refuse_positions_the_output_does_not_see(scores, positions, ranked_as)
    return token_scores(scores, reduce=reduce), positions


def masked_positions_zeroed(attributions: Any, attention_mask: Tensor) -> Any:
    """``attributions`` (a tensor ``(batch, pos, ...)`` or a tuple holding one) with the positions ``attention_mask``
    leaves out zeroed, which the metrics ignore anyway: a NaN there (a padding token's NaN embedding through Captum's
    methods) was refused as if it were a real token's. Anything else is returned as it is (token_scores checks it)."""
    one = isinstance(attributions, (tuple, list)) and len(attributions) == 1 and isinstance(attributions[0], Tensor)
    values = attributions[0] if one else attributions
    if not isinstance(values, Tensor) or values.ndim < 2 or tuple(values.shape[:2]) != tuple(attention_mask.shape):
        return attributions
    masked = (attention_mask == 0).to(values.device).reshape(*attention_mask.shape, *[1] * (values.ndim - 2))
    values = values.detach().masked_fill(masked, 0)
    return (values,) if one else values


def _refuse_positions_the_output_does_not_see(explanation: Any, positions: Any, argument: str) -> None:
    """Refuse ``positions`` (a metric's ``candidates`` / ``valid_mask`` given by hand) that mark tokens after the
    explained position of a causal explanation (:func:`_seen_by_explained_output`)."""
    positions = require_tensor(argument, positions, ndim=2, kind="mask", shape_hint="(batch, pos)")
    unseen = ~_seen_by_explained_output(explanation)
    if tuple(positions.shape) != tuple(unseen.shape):
        return  # the metric's own shape check names it
    marked = positions.bool().to(unseen.device) & unseen
    if not marked.any():
        return
    row = int(marked.any(1).nonzero()[0])
    position = int(explanation.position[row])
    raise argument_error(argument, f"marks tokens after the explained position in {bad_rows(marked)} (row {row}: "
                         f"columns {marked[row].nonzero().flatten().tolist()[:8]}, explained at {position}), which the "
                         "causal model's output there does not see: their contributions are exactly 0, so they would "
                         "be ranked as tokens of score 0 (above every token of negative score)",
                         f"Leave {argument} out (the explanation's real tokens up to its position are used), or keep "
                         f"only the tokens up to the position: {argument} & (torch.arange({marked.shape[1]})[None, :] "
                         "<= explanation.position[:, None])")


def _seen_by_explained_output(explanation: Any) -> Tensor:
    """``(batch, pos)``: False at the tokens after a row's explained ``position`` where none of them contributes
    anything (every input contribution exactly 0): a causal model's output at that position does not see them, so they
    are not among the tokens it could rank. They were ranked as tokens of score 0: above every token of negative score
    (a reciprocal rank of 1/7 for the 1/4 of the prefix explained alone) and counted in a top k's share (an IoU of 0.25
    for 0). A bidirectional model's (a masked LM's, a base encoder's) later tokens contribute, and are kept; so is
    every token of an explanation without positions (a classifier's)."""
    contributions = explanation.input_contributions
    position = getattr(explanation, "position", None)
    seen = torch.ones(contributions.shape[:2], dtype=torch.bool, device=contributions.device)
    if not isinstance(position, Tensor) or position.ndim != 1 or contributions.ndim < 2 \
            or position.shape[0] != contributions.shape[0]:
        return seen
    columns = torch.arange(contributions.shape[1], device=contributions.device)
    after = columns[None, :] > position.to(contributions.device)[:, None]
    contributing = (contributions.detach() != 0).flatten(2).any(-1) if contributions.ndim > 2 \
        else contributions.detach() != 0
    unseen_rows = ~(after & contributing).any(-1)  # nothing after the position contributes: a causal model's row
    return seen & ~(after & unseen_rows[:, None])


def _is_image_explanation(explanation: Any) -> bool:
    """Whether ``explanation`` is a B-cos ViT's (:class:`~bcos_plugins.vision.ImageExplanation`): its
    ``input_contributions`` are ``(batch, 2C, H, W)``, channels before the pixels."""
    from ..vision.explain import ImageExplanation

    return isinstance(explanation, ImageExplanation)


def special_tokens_mask(tokenizer, input_ids: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
    """True at the tokenizer's special tokens (CLS, SEP, PAD, BOS, EOS, MASK, ...) of each row.

    The unknown token is not one of them (unless its id is also one of those, GPT-2's ``<|endoftext|>``): it stands
    for a word of the text, which the tokenizer could not spell."""
    input_ids = require_tensor("input_ids", input_ids, ndim=2, kind="int", shape_hint="(batch, pos)")
    if not hasattr(tokenizer, "get_special_tokens_mask"):
        raise argument_error("tokenizer", f"must be a transformers tokenizer, got {type(tokenizer).__name__}",
                             "Pass the model's tokenizer", kind=BcosTypeError)
    rows = [tokenizer.get_special_tokens_mask(row, already_has_special_tokens=True)
            for row in input_ids.tolist()]
    special = torch.tensor(rows, dtype=torch.bool, device=input_ids.device)
    # transformers marks every id of all_special_ids, [UNK] included: a text's unknown words were never removed or
    # ranked by the perturbation metrics, and did not count among the tokens whose shares they remove
    unk = getattr(tokenizer, "unk_token_id", None)
    added = {getattr(tokenizer, f"{name}_token_id", None) for name in ("pad", "cls", "sep", "bos", "eos", "mask")}
    if isinstance(unk, int) and unk not in added:
        special &= input_ids != unk
    return special


def perturbable_mask(
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    *,
    tokenizer=None,
    special_tokens: Bool[Tensor, "batch pos"] | None = None,
) -> Bool[Tensor, "batch pos"]:
    """Real, non-special tokens: the only ones a perturbation metric may remove or rank.

    One of ``tokenizer`` (its special-token mask) or ``special_tokens`` (a boolean mask) is required, so
    that CLS/SEP/PAD are never perturbed by accident.
    """
    input_ids = require_tensor("input_ids", input_ids, ndim=2, kind="int", shape_hint="(batch, pos)")
    if special_tokens is None:
        if tokenizer is None:
            raise argument_error("special_tokens", "pass tokenizer= (to find CLS/SEP/PAD) or special_tokens= (a "
                                 "boolean mask, True at tokens that must never be perturbed)", "Pass one of them")
        special_tokens = special_tokens_mask(tokenizer, input_ids)
    special_tokens = require_tensor("special_tokens", special_tokens, ndim=2, kind="mask")
    special_tokens = special_tokens.to(device=input_ids.device, dtype=torch.bool)
    require_same_shape("special_tokens", special_tokens, "input_ids", input_ids)
    if attention_mask is not None:
        attention_mask = require_tensor("attention_mask", attention_mask, ndim=2, kind="mask")
        require_same_shape("attention_mask", attention_mask, "input_ids", input_ids)
    real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    return real & ~special_tokens
