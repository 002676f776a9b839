"""Gold masks: token-level rationale masks from human highlights, and the random control.

Two routes from a human rationale to a token mask aligned with ``input_ids``:

- character spans (e-SNLI highlighted premise spans, free-text phrases): a token is 1 when its character
  span in its own segment (``offset_mapping`` of a fast tokenizer, ``sequence_ids`` for pairs) overlaps a
  rationale span of that segment;
- highlighted words of pre-split text (HateXplain ``post_tokens`` + 0/1 ``rationales``): a token is 1 when
  the word it comes from (``word_ids``) is highlighted.

Special tokens ([CLS], [SEP]) and padding are always 0. The random control of the paper (§3.3) draws, per
row, as many positions as the gold mask has, uniformly among the real non-special tokens.
"""

from __future__ import annotations

import numbers
import re
import warnings
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from .._checks import require_float, require_int, require_same_shape, require_tensor
from ..errors import BcosTypeError, TruncatedRationaleWarning, argument_error
from .guidance import check_rationale_mask

__all__ = [
    "find_span",
    "gold_mask_from_spans",
    "gold_mask_from_words",
    "random_rationale_mask",
    "text_token_mask",
    "hatexplain_word_rationale",
    "parse_esnli_question",
]

Span = tuple[int, int]


def _require_encoding(encoding) -> None:
    """A fast tokenizer's (padded) output: ``input_ids`` rows and ``word_ids`` / ``sequence_ids``."""
    ok = (hasattr(encoding, "__getitem__") and hasattr(encoding, "sequence_ids") and hasattr(encoding, "word_ids"))
    try:
        rows = encoding["input_ids"] if ok else None
    except (KeyError, TypeError, IndexError):
        rows = None
    if rows is None:
        raise argument_error("encoding", f"must be a fast tokenizer's output (BatchEncoding), got "
                             f"{type(encoding).__name__}", "Call tokenizer(texts, ...) with a fast tokenizer",
                             kind=BcosTypeError)
    if len(rows) == 0 or len(rows[0]) == 0:
        raise argument_error("encoding", "holds no tokens", "Tokenise at least one non-empty text")


def _require_offsets(encoding) -> list:
    _require_encoding(encoding)
    if "offset_mapping" not in encoding:
        raise argument_error("encoding", "has no offset_mapping", "Tokenize with return_offsets_mapping=True (needs a "
                             "fast tokenizer)")
    offsets = encoding["offset_mapping"]
    return offsets.tolist() if isinstance(offsets, Tensor) else offsets


def text_token_mask(encoding) -> Tensor:
    """True at text tokens, False at special tokens and padding (positions without a segment id), from a
    fast-tokenizer encoding: the ``valid_mask`` of the rationale metrics and the random control's pool."""
    _require_encoding(encoding)
    n_rows = len(encoding["input_ids"])
    length = len(encoding["input_ids"][0])
    return torch.tensor([[sid is not None for sid in encoding.sequence_ids(i)] for i in range(n_rows)],
                        dtype=torch.bool).reshape(n_rows, length)


def find_span(text: str, phrase: str, start: int = 0) -> Span | None:
    """Character span of ``phrase`` in ``text``: an exact match on word boundaries first, then a
    case-insensitive one (the paper lowercases to improve alignment), then, as a last resort, a substring (exact, then
    in any case); ``None`` if absent."""
    for name, value in (("text", text), ("phrase", phrase)):
        if not isinstance(value, str):
            raise argument_error(name, f"must be a str, got {type(value).__name__}", "Pass text",
                                 kind=BcosTypeError)
    start = require_int("start", start, minimum=0)
    phrase = phrase.strip()
    if not phrase:
        return None
    # whole words in either case before any substring: the exact substring was tried second, so "man" in "A woman
    # talks to a Man" was the "man" of "woman"
    whole_word = r"(?<!\w)" + re.escape(phrase) + r"(?!\w)"
    for pattern, flags in ((whole_word, 0), (whole_word, re.IGNORECASE), (re.escape(phrase), 0),
                           (re.escape(phrase), re.IGNORECASE)):
        match = re.compile(pattern, flags).search(text, start)
        if match is not None:
            return match.start(), match.end()
    return None


def gold_mask_from_spans(
    encoding,
    spans: Sequence[Sequence[Span]],
    segment: int = 0,
) -> Float[Tensor, "batch pos"]:
    """Token mask from character spans of one segment (0 = first text, 1 = the pair's second text).

    Args:
        encoding: a fast tokenizer's output with ``return_offsets_mapping=True`` (padded to one length).
        spans: per row, the rationale's ``(start, end)`` character spans in that row's ``segment`` text.
        segment: which text of a pair the spans refer to.

    Raises:
        BcosValueError: a row's spans all lie in text that truncation cut off (its mask would be empty).

    Warns:
        TruncatedRationaleWarning: truncation cut only part of a row's rationale; the row keeps the tokens it
            still has, and the warning names the rows and how many rationale characters each lost (past the
            segment's last encoded character). A warning, not a refusal, by decision: the kept part is exactly
            the rationale of the text the model sees, and long texts are routinely truncated, so refusing would
            stop whole datasets over rows that are still usable; but the row's guidance and metrics then use a
            smaller rationale than the annotators gave, which the caller must know. Refuse such rows with
            ``warnings.simplefilter("error", TruncatedRationaleWarning)``.
    """
    offsets = _require_offsets(encoding)
    # 0 or 1 only: segment=2 or "0" matched no token and was refused as a rationale "cut off by truncation"
    segment = require_int("segment", segment, minimum=0, maximum=1)
    if isinstance(spans, str) or not hasattr(spans, "__len__"):
        raise argument_error("spans", f"must be a list with one list of (start, end) spans per row, got "
                             f"{type(spans).__name__}", "Pass e.g. [[(6, 20)], [(4, 8), (12, 15)]]", kind=BcosTypeError)
    if len(spans) != len(offsets):
        raise argument_error("spans", f"got spans for {len(spans)} rows but the encoding has {len(offsets)}",
                             "Pass one list of (start, end) spans per encoded row")
    spans = [_require_row_spans(i, row_spans) for i, row_spans in enumerate(spans)]
    mask = torch.zeros(len(offsets), len(offsets[0]))
    cut, partly, misaligned = [], [], []
    # whether truncation cut a row is known from a fast tokenizer's overflow (not for the windows of
    # return_overflowing_tokens, whose text goes on in other rows): unknown counts as cut, as before
    parts = getattr(encoding, "encodings", None) or []
    uncut = ([not part.overflowing for part in parts] if len(parts) == len(offsets)
             and "overflow_to_sample_mapping" not in encoding else [False] * len(offsets))
    for i, (row_offsets, row_spans) in enumerate(zip(offsets, spans, strict=True)):
        segments = encoding.sequence_ids(i)
        if row_spans and segment not in segments:
            raise argument_error("segment", f"is {segment}, but row {i} of the encoding has no text of segment "
                                 f"{segment} (a single text is segment 0; the second text of a pair is 1)",
                                 "Pass the segment the spans were measured in")
        text_end = 0
        for j, ((start, end), seg) in enumerate(zip(row_offsets, segments, strict=True)):
            if seg != segment or end <= start:
                continue
            text_end = max(text_end, end)
            if any(start < span_end and span_start < end for span_start, span_end in row_spans):
                mask[i, j] = 1.0
        # A span past the last encoded character was truncated away: the row's mask would be all zeros, read
        # by the metrics and the guidance as "no rationale" (the example silently unsupervised).
        if mask[i].sum() == 0 and any(b > a and a >= text_end for a, b in row_spans):
            (misaligned if uncut[i] else cut).append(f"row {i}: {row_spans[:3]} for {text_end} characters" if uncut[i]
                                                     else i)
        elif (lost := sum(b - max(a, text_end) for a, b in row_spans if b > a and b > text_end)) > 0:
            # Cut only partly: the row keeps a smaller rationale than annotated (see Warns above).
            partly.append(f"row {i}: {lost} of {sum(max(b - a, 0) for a, b in row_spans)} characters")
    if misaligned:
        # nothing was cut there: the refusal below blamed truncation and asked for a larger max_length
        raise argument_error("spans", f"{'; '.join(misaligned[:4])}: the spans start past the segment's last encoded "
                             "character and nothing was truncated, so they do not line up with the encoded text "
                             "(offsets measured in another text, or in the other segment)", "Measure the spans in the "
                             "text that was tokenised (e.g. find_span(text, phrase)), and pass the segment they "
                             "belong to")
    if cut:
        raise argument_error("spans", f"rows {cut[:8]} mark only text that truncation cut off (the segment's "
                             "tokens end before the rationale starts), so their masks would be empty",
                             "Tokenise with a larger max_length (or truncation='only_second' for a premise "
                             "rationale), or drop those rows")
    if partly:
        _warn_partly_truncated("spans", partly, "rationale characters past the segment's last encoded token")
    return mask


def _require_row_spans(row: int, row_spans) -> list[Span]:
    """One row's spans as ``(start, end)`` int pairs with ``0 <= start <= end``: a reversed span overlapped no token, so
    the row's mask came back empty (no rationale) without a word, and a bare pair instead of a list of pairs failed
    on "cannot unpack non-iterable int object"."""
    fix = "Pass each row's rationale as a list of (start, end) character spans with 0 <= start <= end, e.g. [(6, 20)]"
    if isinstance(row_spans, str) or not hasattr(row_spans, "__iter__"):
        raise argument_error("spans", f"row {row} is {type(row_spans).__name__} {row_spans!r}, not a list of spans",
                             fix, kind=BcosTypeError)
    checked = []
    for span in row_spans:
        pair = tuple(span) if isinstance(span, Sequence) and not isinstance(span, str) else None
        if pair is None or len(pair) != 2 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                                                     for v in pair):
            raise argument_error("spans", f"row {row} holds {span!r}, not a (start, end) pair of character offsets",
                                 fix, kind=BcosTypeError)
        if not 0 <= pair[0] <= pair[1]:
            problem = "is reversed" if pair[0] > pair[1] else "starts before the text"
            raise argument_error("spans", f"row {row} holds the span {pair}, which {problem}", fix)
        checked.append((int(pair[0]), int(pair[1])))
    return checked


def _warn_partly_truncated(name: str, rows: list[str], what: str) -> None:
    shown = "; ".join(rows[:8]) + ("; ..." if len(rows) > 8 else "")
    warnings.warn(f"{name}: truncation cut part of the rationale of {len(rows)} row(s), which keep only the rest "
                  f"({what}: {shown}); their guidance and rationale metrics use the smaller rationale. Tokenise "
                  "with a larger max_length to keep it whole", TruncatedRationaleWarning, stacklevel=3)


def gold_mask_from_words(
    encoding,
    word_rationales: Sequence[Sequence[float]],
    threshold: float = 0.5,
) -> Float[Tensor, "batch pos"]:
    """Token mask from per-word rationales of text tokenized with ``is_split_into_words=True``.

    ``word_rationales[i][w]`` is the highlight of word w of row i (0/1, or an annotator average that is
    compared with ``threshold``: >= threshold counts as rationale). Every sub-token of a highlighted word is 1.
    A row whose highlighted words were all truncated away is refused (its mask would be empty); a row that lost
    only some of them keeps the rest with a :class:`~bcos_plugins.errors.TruncatedRationaleWarning` naming the rows
    and how many highlighted words each lost (a warning by decision: see :func:`gold_mask_from_spans`). With
    ``return_overflowing_tokens`` the rows of one text share its words: a word another of its rows holds is not lost.
    Highlighted entries past the text's last word (truncated or not) are refused as a rationale list longer than
    the word list that was tokenised, not reported as truncation.
    """
    # in (0, 1], the range of the highlights: at 0 every word (the 0s too) was a rationale, above 1 none was, and either
    # mask came back without a word
    threshold = require_float("threshold", threshold, minimum=0.0, maximum=1.0, open_minimum=True)
    _require_encoding(encoding)
    rows = len(encoding["input_ids"])
    if len(word_rationales) != rows:
        raise argument_error("word_rationales", f"got word rationales for {len(word_rationales)} rows but the "
                             f"encoding has {rows}", "Pass one list of word rationales per encoded row")
    mask = torch.zeros(rows, len(encoding["input_ids"][0]))
    cut, partly = [], []
    segment_word_reach = _segment_word_reach(encoding)  # built once: it reads every row
    for i in range(rows):
        words = word_rationales[i]
        for j, (w, seg) in enumerate(zip(encoding.word_ids(i), encoding.sequence_ids(i), strict=True)):
            if w is None or seg != 0:
                continue
            if w >= len(words):
                raise argument_error("word_rationales", f"row {i}: token {j} comes from word {w} but only "
                                     f"{len(words)} word rationales were given", "Tokenize the same word list the "
                                     "rationales belong to")
            value = float(words[w])
            if not 0.0 <= value <= 1.0:  # NaN fails it too; inf counted as a highlight, -inf as none
                raise argument_error("word_rationales", f"row {i}: word {w} has the rationale {value}, outside [0, 1]",
                                     "Pass 0/1 highlights or annotator averages in [0, 1]")
            mask[i, j] = float(value >= threshold)
        # Highlighted words after the last encoded one were truncated away: an all-zero row would read as
        # "no rationale" (see gold_mask_from_spans).
        encoded = [w for w, seg in zip(encoding.word_ids(i), encoding.sequence_ids(i), strict=True)
                   if w is not None and seg == 0]
        last = max(encoded, default=-1)
        reach, count = segment_word_reach(i, last)
        _refuse_highlights_past_the_words(i, words, threshold, count)
        lost = sum(float(v) >= threshold for v in words[reach + 1:])
        if mask[i].sum() == 0 and lost:
            cut.append(i)
        elif lost:
            partly.append(f"row {i}: {lost} of {sum(float(v) >= threshold for v in words)} words")
    if cut:
        raise argument_error("word_rationales", f"rows {cut[:8]} highlight only words that truncation cut off, "
                             "so their masks would be empty", "Tokenise with a larger max_length, or drop those rows")
    if partly:
        _warn_partly_truncated("word_rationales", partly, "highlighted words after the last encoded one")
    return mask


def _segment_word_reach(encoding) -> Callable[[int, int], tuple[int, int | None]]:
    """``reach(row, last) -> (reach, count)`` for a row's first segment, whose last encoded word is ``last``.
    ``reach``: the last word encoded in this row or, with ``return_overflowing_tokens``, in any row of the same text
    (``overflow_to_sample_mapping``): a word another row holds is no truncation loss (a row whose window holds no
    rationale was refused as "truncation cut off" its sibling's words). ``count``: the number of words the tokenizer
    saw, truncated ones included (those rows, and the overflow a fast tokenizer keeps of what truncation cut,
    ``encoding.encodings[row].overflowing``, filled whether or not ``return_overflowing_tokens`` was asked); ``None``
    where the encoding keeps no overflow. Words that give no token at the end of the list are not counted (nothing
    of them reaches the encoding). Each text's largest words are gathered once, in one pass over the rows: read per
    row, every row read all of its text's rows (rows squared with ``return_overflowing_tokens``)."""
    encodings = getattr(encoding, "encodings", None) or []
    sample = ([int(s) for s in encoding["overflow_to_sample_mapping"]]
              if encodings and "overflow_to_sample_mapping" in encoding else list(range(len(encodings))))

    def first_segment_words(part) -> list[int]:
        return [w for w, seg in zip(part.word_ids, part.sequence_ids, strict=True) if w is not None and seg == 0]

    encoded, overflowing = {}, {}  # per text: its largest word encoded in a row, and in a row's overflow
    for part, text in zip(encodings, sample, strict=True):
        encoded[text] = max([encoded.get(text, -1)] + first_segment_words(part))
        overflowing[text] = max([overflowing.get(text, -1)] + [w for o in (getattr(part, "overflowing", None) or ())
                                                               for w in first_segment_words(o)])

    def reach(row: int, last: int) -> tuple[int, int | None]:
        if row >= len(encodings):
            return last, None
        farthest = max(last, encoded[sample[row]])
        return farthest, max(farthest, overflowing[sample[row]]) + 1

    return reach


def _refuse_highlights_past_the_words(row: int, words, threshold: float, count: int | None) -> None:
    """Highlighted entries past the text's last word are no truncation loss (nothing was cut there): the
    rationale list is longer than the word list it was tokenised from, and was reported as truncated."""
    if count is None:
        return
    extra = [w for w in range(count, len(words)) if float(words[w]) >= threshold]
    if extra:
        raise argument_error("word_rationales", f"row {row}: {len(words)} word rationales for a text of {count} "
                             f"words (truncated or not), and words {extra[:8]} past its end are highlighted: the "
                             "rationale list is longer than the word list that was tokenised (or its last words "
                             "give no token)", "Tokenise the same word list the rationales belong to, one rationale "
                             "per word, and drop words that give no token from both")


def random_rationale_mask(
    gold_mask: Tensor,
    eligible: Tensor,
    generator: torch.Generator | None = None,
) -> Float[Tensor, "batch pos"]:
    """Random control with the gold mask's sparsity: per row, as many positions as the gold mask has non-zero
    entries, drawn uniformly among ``eligible`` positions (real, non-special tokens), without replacement, each 1
    (a soft gold mask's control is binary: ``(gold > 0).sum()`` positions, not ``gold.sum()``)."""
    gold_mask = check_rationale_mask(gold_mask, name="gold_mask") if isinstance(gold_mask, Tensor) else gold_mask
    if not isinstance(gold_mask, Tensor):
        raise argument_error("gold_mask", f"must be a (batch, pos) tensor, got {type(gold_mask).__name__}",
                             "Pass the gold mask of the batch", kind=BcosTypeError)
    eligible = require_tensor("eligible", eligible, ndim=2, kind="mask")
    require_same_shape("eligible", eligible, "gold_mask", gold_mask, "Build both from the same encoding")
    eligible = eligible.bool()
    counts = (gold_mask > 0).sum(1)
    if (counts > eligible.sum(1)).any():
        raise argument_error("eligible", "a row's gold mask has more positions than eligible tokens",
                             "Build eligible from the same encoding as the gold mask")
    keys = torch.rand(gold_mask.shape, generator=generator).to(gold_mask.device)
    keys = keys.masked_fill(~eligible, -1.0)
    rank = keys.argsort(dim=1, descending=True).argsort(dim=1)
    return ((rank < counts[:, None]) & eligible).to(gold_mask.dtype if gold_mask.is_floating_point()
                                                    else torch.float32)


def hatexplain_word_rationale(record: dict) -> list[float] | None:
    """Annotator-averaged word rationale of a HateXplain record (the paper thresholds it at 0.5);
    ``None`` when no annotator marked a rationale (posts labelled normal)."""
    if not isinstance(record, dict):
        raise argument_error("record", f"must be a HateXplain record (dict), got {type(record).__name__}",
                             "Pass one parsed JSON line", kind=BcosTypeError)
    rationales = record.get("rationales") or []
    if not rationales:
        return None
    if not isinstance(record.get("post_tokens"), list):  # a KeyError or a TypeError from len() before
        raise argument_error("record", f"post {record.get('post_id')} has no post_tokens list (got "
                             f"{type(record.get('post_tokens')).__name__})", "Pass an unmodified HateXplain record")
    n_words = len(record["post_tokens"])
    if any(len(r) != n_words for r in rationales):
        raise argument_error("record", f"post {record.get('post_id')}: a rationale's length differs from "
                             "post_tokens", "Pass an unmodified HateXplain record")
    # each annotator's highlight is 0 or 1: a 2 averaged with another annotator's 0 read as a full highlight (1.0), NaN
    # as no rationale only further on, and a "1" failed inside sum ("unsupported operand type(s) for +: 'int' and 'str'")
    bad = next(((k, w, v) for k, r in enumerate(rationales) for w, v in enumerate(r)
                if not (isinstance(v, numbers.Real) and v in (0, 1))), None)
    if bad is not None:
        raise argument_error("record", f"post {record.get('post_id')}: annotator {bad[0]}'s rationale holds "
                             f"{type(bad[2]).__name__} {bad[2]!r} at word {bad[1]}; HateXplain highlights are 0 or 1",
                             "Pass an unmodified HateXplain record (rationales: one 0/1 list per annotator)")
    return [sum(r[w] for r in rationales) / len(rationales) for w in range(n_words)]


_ESNLI_QUESTION = re.compile(r'^Suppose "(.*)"\. Can we infer that "(.*)"\?$', re.DOTALL)


def parse_esnli_question(question: str) -> tuple[str, str]:
    """(premise, hypothesis) from the ``question`` field of the e-SNLI premise-span slice."""
    if not isinstance(question, str):
        raise argument_error("question", f"must be a str, got {type(question).__name__}",
                             "Pass the record's question field", kind=BcosTypeError)
    match = _ESNLI_QUESTION.match(question)
    if match is None:
        raise argument_error("question", f"not an e-SNLI 'Suppose \"...\". Can we infer that \"...\"?' question: "
                             f"{question[:80]!r}", "Pass the question field of the premise-span slice")
    return match.group(1), match.group(2)
