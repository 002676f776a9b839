"""Sequence Pointing Game (SeqPG; B-cos LM paper §4.1 and App. F).

Construction (:func:`make_seqpg_examples`): segments are test texts with at least ``segment_length``
tokens, truncated to exactly that many, that the model classifies correctly with probability
>= ``min_confidence`` *after* truncation; the most confident segments are used first. Given several models
(e.g. the conventional and the B-cos model of a comparison), a segment must pass for every one of them and
ranks by its lowest probability: the examples are shared, and no model is scored on segments it cannot
classify (which would count its classification errors as pointing errors). Each example joins
two segments of different classes in random order as ``[CLS] a [SEP] b [SEP]`` (``segment_length`` fixes
length and ``random order`` removes position effects).

Score (:func:`seqpg_score`): explain the example once for each segment's class; for class c the score is
``sum of positive attribution inside c's segment / sum of positive attribution over all tokens``; the
example's score is the mean over its segments. Special tokens count in the denominator (they can take
attribution away from both segments). An explanation with no positive attribution scores 0.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from .._checks import (
    bad_rows,
    require_deterministic,
    require_float,
    require_int,
    require_real_tokens,
    require_seed,
    require_tensor,
    require_texts,
    warn_if_another_models_tokenizer,
)
from ..attribution.text import refuse_stock_loaded_bcos, with_output_object
from ..convert.architectures import position_limit
from ..errors import argument_error
from ..nn.dynamic import evaluating
from .attributions import masked_positions_zeroed, numbers_as_one_tensor, scores_and_positions, token_scores

__all__ = ["SeqPGExamples", "make_seqpg_examples", "seqpg_evidence_split", "seqpg_score"]


@dataclass
class SeqPGExamples:
    """Two-segment examples for the pointing game.

    Attributes:
        input_ids, attention_mask: ``(n, 2 * segment_length + 3)`` with no padding.
        segment_masks: ``(n, 2, pos)``, True at the tokens of segment 0 (first) and segment 1 (second).
        segment_labels: ``(n, 2)`` class of each segment, in order of appearance.
        confidence: ``(n, 2)`` the model's probability of each segment's class on the segment alone (the
            lowest over the models, when several built the examples).
        source_index: ``(n, 2)`` index of each segment's text in the dataset it was built from.
    """

    input_ids: Int[Tensor, "n pos"]
    attention_mask: Int[Tensor, "n pos"]
    segment_masks: Bool[Tensor, "n 2 pos"]
    segment_labels: Int[Tensor, "n 2"]
    confidence: Float[Tensor, "n 2"]
    source_index: Int[Tensor, "n 2"]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def explanation_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(input_ids, attention_mask, targets)`` with each example twice (once per segment class)."""
        ids = self.input_ids.repeat_interleave(2, dim=0)
        mask = self.attention_mask.repeat_interleave(2, dim=0)
        return ids, mask, self.segment_labels.reshape(-1)


@torch.no_grad()
def make_seqpg_examples(
    model: nn.Module | Sequence[nn.Module],
    tokenizer,
    texts: Sequence[str],
    labels: Sequence[int],
    *,
    segment_length: int = 50,
    n_examples: int = 500,
    min_confidence: float = 0.75,
    seed: int = 0,
    batch_size: int = 64,
) -> SeqPGExamples:
    """Build SeqPG examples from a labelled dataset and a classifier, or several (see module docstring).

    ``model``: one sequence classifier, or a list of them that must all be confident and correct on every
    segment used (they must share ``tokenizer``). A module is scored in eval mode; a function that scores the same
    segments differently (one around a model in training mode: dropout) is refused.
    Class pairs cycle through all pairs of distinct classes that still have segments, so every pair is
    represented; the order inside an example is random (``seed``, an int: Python's ``random.Random(seed)``).
    When the confident segments run out before ``n_examples`` examples, the examples that could be made are returned
    with a ``UserWarning`` naming how many and why (each segment is used once; each example needs two classes that
    still have segments): a smaller set than asked for was returned without a word.
    """
    # random.Random takes any hashable: a float seed (0.5) or a string ran with it, a seed no int call reproduces
    seed = require_seed("seed", seed, minimum=None, maximum=None)
    segment_length = require_int("segment_length", segment_length, minimum=1)
    n_examples = require_int("n_examples", n_examples, minimum=1)
    batch_size = require_int("batch_size", batch_size, minimum=1)
    min_confidence = require_float("min_confidence", min_confidence, minimum=0.0, maximum=1.0)
    if getattr(tokenizer, "cls_token_id", None) is None or getattr(tokenizer, "sep_token_id", None) is None:
        raise argument_error("tokenizer", "make_seqpg_examples joins segments as [CLS] a [SEP] b [SEP]; the "
                             "tokenizer needs cls_token and sep_token", "Use a BERT-style tokenizer")
    # one string was split into its characters (each a text, refused later as "fewer than two classes"), and a text that
    # is not a string failed inside the tokenizer
    texts = require_texts(texts)
    if len(texts) != len(labels):
        raise argument_error("labels", f"{len(texts)} texts but {len(labels)} labels", "Pass one label per text")
    # int(0.7) would silently make a float label class 0.
    labels = [require_int("labels", y, minimum=0) for y in labels]
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    pieces = tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
    candidates = [(i, ids[:segment_length]) for i, ids in enumerate(pieces) if len(ids) >= segment_length]
    if not candidates:
        raise argument_error("segment_length", f"no text has {segment_length} tokens (special tokens not counted)",
                             "Pass a smaller segment_length, or texts with that many tokens")
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not models:
        raise argument_error("model", "is an empty list; make_seqpg_examples needs at least one model",
                             "Pass one classifier, or the classifiers of the comparison")
    for m in models:  # a B-cos checkpoint loaded with plain transformers: segments the stock model is sure of
        if isinstance(m, nn.Module):
            refuse_stock_loaded_bcos(m)
            warn_if_another_models_tokenizer(m, tokenizer)  # ids that fit, read as other tokens: other segments
            # an example is 2 segments and 3 special tokens: past the position table the segments failed inside the
            # embedding (RuntimeError: "The expanded size of the tensor (13) must match ..."), or examples were built
            # that no explanation of the model can take
            limit = position_limit(m)
            if limit.max_length is not None and 2 * segment_length + 3 > limit.max_length:
                raise argument_error("segment_length", f"{segment_length} makes examples of {2 * segment_length + 3} "
                                     f"tokens, but {type(m).__name__} takes at most {limit.max_length} positions "
                                     f"({limit.source})", f"Pass segment_length <= {(limit.max_length - 3) // 2}")
    per_model = [_segment_probabilities(m, candidates, cls_id, sep_id, batch_size) for m in models]
    for m, probs in zip(models, per_model, strict=True):
        if not isinstance(m, nn.Module):
            # eval mode cannot reach a model inside a function: in training mode (dropout) the segments were picked
            # by noisy confidences; the first batch of segments is scored a second time (the same rows, so a
            # deterministic function gives the same probabilities)
            require_deterministic("model", probs[:batch_size], _segment_probabilities(
                m, candidates[:batch_size], cls_id, sep_id, batch_size), "segments",
                "Put the model in eval mode (model.eval()), or pass the model itself")
    widths = sorted({p.shape[-1] for p in per_model})
    if len(widths) > 1:
        raise argument_error("model", f"the models disagree on the number of classes ({widths}); SeqPG examples are "
                             "built for models of one task", "Pass classifiers of one task")
    probs = torch.stack(per_model)
    n_classes = widths[0]
    if any(not 0 <= int(y) < n_classes for y in labels):
        raise argument_error("labels", f"labels must be class indices in [0, {n_classes}); the models have "
                             f"{n_classes} classes", "Pass the dataset's class ids of the models' task")
    label_of = torch.tensor([int(labels[i]) for i, _ in candidates])
    correct = (probs.argmax(-1) == label_of).all(0)
    confidence = probs.gather(-1, label_of[None, :, None].expand(len(models), -1, 1))[..., 0].min(0).values
    by_class: dict[int, list[tuple[float, int, list[int]]]] = {}
    for (i, seg), ok, p in zip(candidates, correct.tolist(), confidence.tolist(), strict=True):
        if ok and p >= min_confidence:
            by_class.setdefault(int(labels[i]), []).append((p, i, seg))
    for queue in by_class.values():
        queue.sort(key=lambda r: -r[0])
    classes = sorted(by_class)
    if len(classes) < 2:
        raise argument_error("min_confidence", f"fewer than two classes have confidently, correctly classified "
                             f"segments of length {segment_length} (found {classes})"
                             f"{' by every model' if len(models) > 1 else ''}", "Lower min_confidence or "
                             "segment_length, or train the models further")
    pairs = [(a, b) for ai, a in enumerate(classes) for b in classes[ai + 1 :]]
    rng = random.Random(seed)
    used = {c: 0 for c in classes}
    rows, seg_masks, seg_labels, confs, sources = [], [], [], [], []
    length = 2 * segment_length + 3
    while len(rows) < n_examples:
        progressed = False
        for a, b in pairs:
            if len(rows) >= n_examples:
                break
            if used[a] >= len(by_class[a]) or used[b] >= len(by_class[b]):
                continue
            first, second = (a, b) if rng.random() < 0.5 else (b, a)
            ca, ia, sa = by_class[first][used[first]]
            cb, ib, sb = by_class[second][used[second]]
            used[first] += 1
            used[second] += 1
            rows.append([cls_id, *sa, sep_id, *sb, sep_id])
            m = torch.zeros(2, length, dtype=torch.bool)
            m[0, 1 : 1 + segment_length] = True
            m[1, 2 + segment_length : 2 + 2 * segment_length] = True
            seg_masks.append(m)
            seg_labels.append([first, second])
            confs.append([ca, cb])
            sources.append([ia, ib])
            progressed = True
        if not progressed:
            break
    if not rows:
        raise argument_error("texts", "could not pair segments of two different classes",
                             "Pass texts of at least two classes")
    if len(rows) < n_examples:
        left = {c: len(by_class[c]) - used[c] for c in classes}
        warnings.warn(f"make_seqpg_examples made {len(rows)} of the n_examples={n_examples} examples: the segments ran "
                      f"out (confident, correct segments of {segment_length} tokens per class: "
                      f"{ {c: len(by_class[c]) for c in classes} }; unused: {left}; each example takes one of each of "
                      "two classes). Pass more texts, or a lower min_confidence or segment_length", UserWarning,
                      stacklevel=2)
    ids = torch.tensor(rows)
    return SeqPGExamples(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        segment_masks=torch.stack(seg_masks),
        segment_labels=torch.tensor(seg_labels),
        confidence=torch.tensor(confs),
        source_index=torch.tensor(sources),
    )


def _segment_probabilities(model, candidates, cls_id: int, sep_id: int, batch_size: int) -> Tensor:
    """Class probabilities ``(n_segments, classes)`` of ``[CLS] segment [SEP]`` under one classifier."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    device = first.device if first is not None else torch.device("cpu")
    conf = []
    with evaluating(model) if isinstance(model, nn.Module) else nullcontext():
        for start in range(0, len(candidates), batch_size):
            chunk = candidates[start : start + batch_size]
            ids = torch.tensor([[cls_id, *seg, sep_id] for _, seg in chunk], device=device)
            # with_output_object: a config.return_dict=False made a module's output a tuple, which failed here as
            # "'tuple' object has no attribute 'float'" (a function is called as it is)
            out = model(**with_output_object(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}))
            logits = out.logits if hasattr(out, "logits") else out
            conf.append(logits.float().softmax(-1).cpu())
    return torch.cat(conf)


def _refuse_explanation_not_of_both_segments(explanation, n: int) -> None:
    """Refuse an explanation of the package that is not of :meth:`SeqPGExamples.explanation_batch`: rows ``2i`` and
    ``2i + 1`` explain one example (the same ids) for two classes (its segments are of different classes). Explained
    without ``targets`` (each row's predicted class, the same for both) or of ids in another order, the pointing game
    scored one class's explanation against the other segment, silently (0.14 for 0.18 on a tiny BERT)."""
    if not hasattr(explanation, "input_contributions"):
        return  # a tensor or a Captum tuple does not say what it explains
    ids = getattr(explanation, "input_ids", None)
    if isinstance(ids, Tensor) and ids.ndim == 2 and ids.shape[0] == 2 * n:
        pairs = ids.reshape(n, 2, -1)
        other = (pairs[:, 0] != pairs[:, 1]).any(-1)
        if other.any():
            raise argument_error("attributions", f"rows 2i and 2i + 1 explain different input_ids at examples "
                                 f"{other.nonzero().flatten().tolist()[:8]}: each example is explained twice in a "
                                 "row, once per segment class", "Explain SeqPGExamples.explanation_batch() (its "
                                 "input_ids, attention_mask and targets)")
    target = getattr(explanation, "target", None)
    if isinstance(target, Tensor) and target.shape == (2 * n,) and not target.is_floating_point() \
            and target.dtype != torch.bool:
        pairs = target.reshape(n, 2)
        same = pairs[:, 0] == pairs[:, 1]
        if same.any():
            raise argument_error("attributions", f"explain the same class {pairs[same, 0].tolist()[:8]} for both "
                                 f"segments of examples {same.nonzero().flatten().tolist()[:8]}: the pointing game "
                                 "needs each example explained for each segment's class", "Pass target= the "
                                 "targets of SeqPGExamples.explanation_batch() (its segment_labels, row by row)")


def seqpg_evidence_split(
    attributions,
    segment_masks: Bool[Tensor, "n 2 pos"],
    attention_mask: Int[Tensor, "n pos"] | None = None,
    reduce: str = "sum",
) -> Float[Tensor, "n 3"]:
    """Where each SeqPG example's positive evidence lands: ``(right segment, other segment, special tokens)``.

    For each explained class, the positive attribution on the class's own segment, on the other class's
    segment and on the remaining real tokens ([CLS]/[SEP]), each as a share of all its positive attribution;
    averaged over the example's two classes. The first column is :func:`seqpg_score`; the second says how much
    evidence a method puts on the wrong segment, the usual reason a method loses the pointing game. Rows sum to
    1 (0 for an explanation with no positive attribution). Arguments as for :func:`seqpg_score`.
    """
    # an explanation of the package brings its attention_mask, the default here as in the other metrics
    # (scores_and_positions): its padding was counted as special tokens in the denominator
    given_mask = attention_mask
    if attention_mask is not None and not hasattr(attributions, "input_contributions"):
        # a NaN or inf at a padding position (a padding token's NaN embedding through Captum's methods), which the
        # score ignores, was refused as if it were a real token's ("contain NaN or inf in rows [0, 1]"), where
        # explanation_entropy takes it: zeroed with the rest of the padding first, one mask row per explained row
        rows_mask = require_tensor("attention_mask", attention_mask, ndim=2, kind="mask")
        attributions = masked_positions_zeroed(numbers_as_one_tensor(attributions), rows_mask.repeat_interleave(2, 0))
    scores, attention_mask = scores_and_positions(attributions, attention_mask, reduce)
    scores = token_scores(scores, reduce=reduce)
    segment_masks = require_tensor("segment_masks", segment_masks, ndim=3, kind="mask", shape_hint="(n, 2, pos)")
    n, two, length = segment_masks.shape
    if two != 2 or scores.shape != (2 * n, length):
        raise argument_error("attributions", f"expected attributions for {2 * n} rows of {length} tokens (each "
                             f"example explained for both segment classes), got {tuple(scores.shape)}",
                             "Explain SeqPGExamples.explanation_batch()")
    _refuse_explanation_not_of_both_segments(attributions, n)
    if given_mask is None and attention_mask is not None and tuple(attention_mask.shape) == (2 * n, length):
        # the explanation's mask has a row per explained row (2n); the examples' mask one per example
        pairs = attention_mask.reshape(n, 2, length)
        other = (pairs[:, 0] != pairs[:, 1]).any(-1)
        if other.any():
            raise argument_error("attributions", f"rows 2i and 2i + 1 explain different attention masks at examples "
                                 f"{other.nonzero().flatten().tolist()[:8]}", "Explain "
                                 "SeqPGExamples.explanation_batch() (its input_ids, attention_mask and targets)")
        attention_mask = pairs[:, 0]
    both = segment_masks[:, 0].bool() & segment_masks[:, 1].bool()
    if both.any():
        # a token in both segments counted as right and as wrong evidence: the score reached 1 and the special
        # tokens' share went negative
        raise argument_error("segment_masks", f"mark tokens as in both segments in {bad_rows(both)}",
                             "Pass disjoint segments (SeqPGExamples.segment_masks)")
    positive = scores.clamp_min(0).reshape(n, 2, length)
    if attention_mask is not None:
        attention_mask = require_tensor("attention_mask", attention_mask, ndim=2, kind="mask")
        if attention_mask.shape != (n, length):
            raise argument_error("attention_mask", f"has shape {tuple(attention_mask.shape)}, expected ({n}, {length})",
                                 "Pass SeqPGExamples.attention_mask")
        # an example of padding only scored 0, a pointing game lost, for an example with no token
        require_real_tokens(attention_mask)
        positive = positive * attention_mask.to(positive.device)[:, None, :].to(positive.dtype)
    # the shares do not depend on the scale, so each explanation is divided by its largest positive score first: the
    # total was floored at 1e-30, so scores below it (a float64 B-cos model at a large B explains logits of 1e-57) gave
    # shares of 1e-10 instead of the split, and rows that no longer summed to 1
    largest = positive.amax(-1, keepdim=True)
    positive = positive / torch.where(largest > 0, largest, torch.ones_like(largest))
    segments = segment_masks.to(positive.device, positive.dtype)
    right = (positive * segments).sum(-1)  # (n, 2): row s explains segment s's class
    wrong = (positive * segments.flip(1)).sum(-1)
    total = positive.sum(-1)
    parts = torch.stack([right, wrong, total - right - wrong], dim=-1)  # (n, 2, 3)
    shares = torch.where(total[..., None] > 0, parts / total.clamp_min(torch.finfo(total.dtype).tiny)[..., None], torch.zeros_like(parts))
    return shares.mean(1)


def seqpg_score(
    attributions,
    segment_masks: Bool[Tensor, "n 2 pos"],
    attention_mask: Int[Tensor, "n pos"] | None = None,
    reduce: str = "sum",
) -> Float[Tensor, " n"]:
    """SeqPG score per example, in [0, 1].

    Args:
        attributions: token-level attributions for ``2 n`` rows, ordered as
            :meth:`SeqPGExamples.explanation_batch` (row ``2i + s`` explains example i for segment s's
            class), from any method (see :func:`~bcos_plugins.metrics.token_scores`). An explanation of the package
            that explains one class for both rows of an example, or other ids in its two rows, is refused.
        segment_masks: ``(n, 2, pos)`` from :class:`SeqPGExamples`.
        attention_mask: padding is ignored (``(n, pos)``; optional; default an explanation's own
            ``attention_mask``, as the other metrics take it).

    :func:`seqpg_evidence_split` also reports the share on the wrong segment.
    """
    return seqpg_evidence_split(attributions, segment_masks, attention_mask, reduce)[:, 0]
