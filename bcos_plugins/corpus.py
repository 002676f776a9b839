"""Explaining a corpus: texts in, a ``datasets.Dataset`` of tokens and per-token scores out.

For users who explain thousands of examples: batched, with a progress bar, on the same core as
:func:`bcos_plugins.explain` (so the numbers are the same as explaining each batch by hand), and the result
saves with ``Dataset.save_to_disk`` / ``to_parquet`` / ``to_pandas``. ``datasets`` is imported only here
(the ``corpus`` extra: ``pip install ".[corpus]"`` from a clone of bcos-plugins).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ._checks import (
    caller_stacklevel,
    refuse_meta_model,
    require_count,
    require_max_length_beyond_special_tokens,
    require_tokenizer_object,
    rows_named_as,
    warn_if_another_models_tokenizer,
)
from .attribution.targets import Direction
from .attribution.text import forward_keywords, padding_named_as_tokenizers, readable_tokenizer_outputs
from .convert.architectures import position_limit, require_max_length_fits, vocabulary_size
from .errors import BcosTypeError, BcosValueError, argument_error
from .explain import explain

__all__ = ["explain_dataset"]


def _import_datasets():
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise BcosTypeError("explain_dataset: needs the `datasets` package. Install it with "
                            "pip install \"datasets>=3.1\" (or the `corpus` extra: pip install \".[corpus]\" "
                            "from a clone of bcos-plugins).") from err
    return datasets


def _is_id(value) -> bool:
    """An integer id: a Python or NumPy int (not a bool), or a 0-d integer tensor (an entry of a 1-d one)."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _require_ids(values: list, name: str) -> list:
    """Refuse an entry that is not an integer id, naming the text by its index in data (checked here, over all the
    texts: explain sees one chunk at a time, and a missing value (None) would fail inside torch.tensor)."""
    bad = next((i for i, v in enumerate(values) if not _is_id(v)), None)
    if bad is not None:
        fix = "Pass one int per text (fill or drop the texts without one)"
        if isinstance(values[bad], str):  # class names where their ids are meant: say how to map them
            fix = (f"Map class names to their ids first with model.config.label2id (model.config.label2id"
                   f"[{values[bad]!r}]; a list: [model.config.label2id[name] for name in names], a datasets column: "
                   "data.map over it)")
        raise argument_error(name, f"the value for text {bad} is {type(values[bad]).__name__} {values[bad]!r}, not "
                             "an integer id", fix, kind=BcosTypeError)
    return values


def _per_row(value, name: str, n: int, data, column: str | None) -> list | None:
    """``value`` as one entry per text (or None): a column name, a sequence aligned with the texts, or one
    value for all."""
    if column is not None:
        if value is not None:
            raise BcosValueError(f"{name}: pass either {name}= or {name}_column=, not both.")
        if not hasattr(data, "column_names") or column not in data.column_names:
            raise BcosValueError(f"{name}_column: {column!r} is not a column of the dataset. Columns: "
                                 f"{getattr(data, 'column_names', [])}.")
        return _require_ids(list(data[column]), f"{name}_column")
    if isinstance(value, Direction):
        if value.vector.ndim != 1:
            raise BcosValueError(f"{name}: explain_dataset takes one Direction (n_outputs,) for every text.")
        return value
    if value is None:
        return None
    if _is_id(value):  # one id for all texts: an int, a NumPy int, a 0-d tensor (list() of those raised TypeError)
        return [int(value)] * n
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 1:
        # a NumPy array of one id per text was refused as "not a class id" (it is no Sequence); float arrays stay
        # refused below, by their values
        value = value.tolist()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | torch.Tensor) \
            or (isinstance(value, torch.Tensor) and value.ndim != 1):
        # a str was read as a list of characters ("1 values for 5 texts"), a float raised "not iterable"
        raise argument_error(name, f"got {type(value).__name__} {value!r}, not a class id", f"Pass one int for all "
                             f"texts, one int per text, a Direction, or {name}_column=<column name>",
                             kind=BcosTypeError)
    values = list(value)
    if len(values) != n:
        raise BcosValueError(f"{name}: {len(values)} values for {n} texts. Pass one per text, one int for all, "
                             f"or {name}_column=<column name>.")
    return _require_ids(values, name)


def _refuse_table_of_splits_or_columns(data, datasets) -> None:
    """Refuse containers whose iteration yields names, not texts: a ``DatasetDict`` (or any dict) iterates over its
    split names / keys and a pandas ``DataFrame`` over its column names, so ``explain_dataset`` explained the
    strings ``"train"`` or ``"text"`` as the corpus, without a word. An ``IterableDataset`` yields dicts."""
    if isinstance(data, datasets.Dataset):
        return
    if isinstance(data, Mapping):
        keys = list(data)[:5]
        fix = (f"Pass one split, e.g. data[{keys[0]!r}]" if isinstance(data, datasets.DatasetDict) and keys
               else "Pass the list of texts (e.g. data['text']), or a datasets.Dataset")
        raise argument_error("data", f"is a {type(data).__name__} (keys {keys}): iterating it gives its keys, not "
                             "texts", fix, kind=BcosTypeError)
    if hasattr(data, "columns") and hasattr(data, "iloc"):  # a pandas DataFrame
        raise argument_error("data", f"is a {type(data).__name__}: iterating it gives its column names "
                             f"{list(data.columns)[:5]}, not texts", "Pass a column as a list (data['text'].tolist()),"
                             " or datasets.Dataset.from_pandas(data)", kind=BcosTypeError)
    if isinstance(data, datasets.IterableDataset):
        raise argument_error("data", "is a datasets.IterableDataset (streamed; its rows are dicts and its length is "
                             "unknown)", "Materialise it first: datasets.Dataset.from_list(list(data)), or pass the "
                             "texts as a list", kind=BcosTypeError)


def require_tokenizer_fits(model: nn.Module, tokenizer) -> None:
    """Refuse a tokenizer that is no transformers tokenizer, or one with more tokens than the model has embedding
    rows: it is another model's (a GPT-2 tokenizer on a BERT), and texts whose ids all happen to fit were explained
    as the model's own tokens, silently (its tokens were shown beside the scores)."""
    require_tokenizer_object(tokenizer)
    vocab = vocabulary_size(model)
    if vocab is not None and len(tokenizer) > vocab:
        raise argument_error("tokenizer", f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '') or '?'!r})"
                             f" has {len(tokenizer)} tokens, but {type(model).__name__} has {vocab} embedding rows: "
                             "the tokenizer is another model's", "Pass the tokenizer saved with the model "
                             "(AutoTokenizer.from_pretrained of the model's folder or hub name)")
    # one whose ids all fit may be another model's too: warned where the evidence is strong, never refused
    warn_if_another_models_tokenizer(model, tokenizer, stacklevel=4)


def require_tokenizer_ids_fit(model: nn.Module, tokenizer, enc) -> None:
    """Refuse a tokenizer that is not the model's, from what it returned (``enc``: its ``input_ids`` and, if any,
    ``token_type_ids``, as tensors): token ids beyond the model's embedding, or token type ids beyond its segment
    embedding (a BERT tokenizer's pair ids on RoBERTa). Either would fail deep inside an embedding lookup, or on a
    GPU with a device-side assert. The one check of every entry point that tokenises texts itself
    (``explain_dataset``, ``predict`` / ``accuracy``, ``predict_labels``, ``fine_tune_classifier``); ``tokenizer`` is
    only named (any callable that returns these passes)."""
    tokenizer_name = f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '') or '?'!r})"
    model_name = f"{type(model).__name__}({getattr(getattr(model, 'config', None), '_name_or_path', '') or '?'!r})"
    fix = ("Pass the tokenizer saved with the model (AutoTokenizer.from_pretrained of the model's folder or hub "
           "name)")
    vocab = vocabulary_size(model)
    ids = enc["input_ids"]
    if getattr(ids, "is_meta", False):  # moved to the model's device: a model without weights, which cannot run
        refuse_meta_model(model)
    if vocab is not None and ((ids < 0) | (ids >= vocab)).any():
        raise BcosValueError(f"tokenizer: {tokenizer_name} gives token ids up to {int(ids.max())}, but "
                             f"{model_name} has {vocab} embedding rows: the tokenizer is not the model's. {fix}.")
    types = enc.get("token_type_ids")
    n_types = getattr(getattr(model, "config", None), "type_vocab_size", None)
    if types is not None and isinstance(n_types, int) and ((types < 0) | (types >= n_types)).any():
        raise BcosValueError(f"tokenizer: {tokenizer_name} gives token type ids up to {int(types.max())} (the "
                             f"segments of text pairs), but {model_name} has type_vocab_size {n_types}: the "
                             f"tokenizer is not the model's. {fix}.")


def mask_keywords(tokenizer) -> dict:
    """The keywords with which a path that pads texts itself calls ``tokenizer`` (``predict`` / ``accuracy``,
    ``predict_labels``; ``explain_dataset`` passes them directly, taking transformers tokenizers only): the attention
    mask asked for from a transformers tokenizer, where one whose ``model_input_names`` leave it out padded without one
    and a padded BERT row's logits were of its padding attended to as tokens, silently. Any other callable (a path that
    takes any callable returning ids) is called as before: it may take no such keyword."""
    from transformers import PreTrainedTokenizerBase

    return {"return_attention_mask": True} if isinstance(tokenizer, PreTrainedTokenizerBase) else {}


def pad_rows(tokenizer, features: list[dict], **keywords):
    """``tokenizer.pad(features, padding=True, **keywords)`` without transformers' advice to call a fast tokenizer
    instead (``DataCollatorWithPadding`` pads the same way): the one padding of the collators that ask for the mask
    (``fine_tuning.PaddingWithMask``, ``pretrain.MaskedLMPadding``). It reads transformers'
    ``data.data_collator.pad_without_fast_tokenizer_warning``, not a documented API, here alone;
    tests/test_lead_s24.py fails if transformers drops or changes it."""
    from transformers.data.data_collator import pad_without_fast_tokenizer_warning

    return pad_without_fast_tokenizer_warning(tokenizer, features, padding=True, **keywords)


def truncated_token_counts(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, kept: Sequence[int],
                           max_length: int | None) -> list[int | None]:
    """For each of ``texts`` (with ``pairs``) that ``tokenizer`` cut to ``max_length`` tokens (``kept[i]`` of its tokens
    kept), its whole token count; ``None`` for a text kept whole. Only a text whose kept tokens reach the limit can
    have been cut (truncation keeps exactly ``max_length``), so only those are tokenised again, whole. The one
    detection of every path that truncates texts itself (``explain_dataset``, ``predict`` / ``accuracy``), which
    warn of the cut texts through :func:`warn_of_truncated_texts`."""
    from transformers import PreTrainedTokenizerBase

    limit = max_length if max_length is not None else getattr(tokenizer, "model_max_length", None)
    at_limit = [i for i, n in enumerate(kept) if not isinstance(limit, int) or n >= limit]
    counts: list[int | None] = [None] * len(kept)
    if at_limit:
        quiet = {"verbose": False} if isinstance(tokenizer, PreTrainedTokenizerBase) else {}  # no "too long" warning
        whole = tokenizer([texts[i] for i in at_limit], None if pairs is None else [pairs[i] for i in at_limit],
                          truncation=False, **quiet)["input_ids"]
        for i, ids in zip(at_limit, whole, strict=True):
            if len(ids) > int(kept[i]):
                counts[i] = len(ids)
    return counts


# the one state of the truncation warning for the calls an entry point makes, set by the entry point around them:
# None (each call warns under its own name), the name of the entry point the user called (truncation_named), or
# _ALREADY_WARNED (truncation_warned: the entry point warned of the same texts itself). The outermost setting holds
_ALREADY_WARNED = object()
_TRUNCATION_WARNING: ContextVar[str | object | None] = ContextVar("_TRUNCATION_WARNING", default=None)


@contextmanager
def _truncation_warning(state: str | object) -> Iterator[None]:
    """The calls inside warn under ``state`` (a name, or ``_ALREADY_WARNED``'s silence), unless an outer entry point
    set one: the user called that one, so its name or silence holds for everything it runs. Silence holds inside a
    name too (a teacher's ``predict`` inside the ``fine_tune_classifier`` stage of ``fine_tune_task_then_bcos``)."""
    holds = _TRUNCATION_WARNING.get() is None or state is _ALREADY_WARNED
    token = _TRUNCATION_WARNING.set(state) if holds else None
    try:
        yield
    finally:
        if token is not None:
            _TRUNCATION_WARNING.reset(token)


def truncation_warned() -> AbstractContextManager[None]:
    """Inside it, :func:`warn_of_truncated_texts` says nothing: the one way a call that warns of its texts' truncation
    keeps the calls it makes on the same texts from warning a second time (a teacher's ``predict`` inside
    ``fine_tune_classifier``, the B-cos stage of ``fine_tune_task_then_bcos`` after the conventional one)."""
    return _truncation_warning(_ALREADY_WARNED)


def truncation_named(call: str) -> AbstractContextManager[None]:
    """Inside it, :func:`warn_of_truncated_texts` names ``call``, the entry point the user called, in place of the
    function inside it that truncates (``fine_tune_task_then_bcos``'s stages are ``fine_tune_classifier`` calls,
    ``zero_shot_evaluation``'s ``predict_labels`` a ``predict`` call); an outer entry point's name holds."""
    return _truncation_warning(call)


def warn_of_truncated_texts(call: str, counts: Sequence[int | None], max_length: int | None, model: nn.Module,
                            tokenizer, paired: bool, *, outcome: str, marked: str = "") -> None:
    """Warn that texts were cut to ``max_length`` tokens (``counts``: :func:`truncated_token_counts` of the caller's
    texts, in the caller's order), naming how many, which (their index, the first 8), which tokens were kept and the
    ``max_length`` that keeps every token (the longest text's count, or the model's position limit below it). The
    one warning of every path that truncates texts itself: ``explain_dataset`` (``outcome="explained as"``; its
    column 'truncated', ``marked``, marks them), ``predict`` / ``accuracy`` (``"classified from"``),
    ``fine_tune_classifier`` (``"trained on as"``) and ``pretrain_masked_lm`` (``"pre-trained on as"``), which cut
    texts to 64 (128) tokens by default, silently. Once per call: nothing inside :func:`truncation_warned`. The
    warning names the entry point the user called (:func:`truncation_named`) and points at the user's line (the
    first frame outside the package, :func:`~bcos_plugins._checks.caller_stacklevel`)."""
    truncated = [i for i, n in enumerate(counts) if n is not None]
    named = _TRUNCATION_WARNING.get()
    if not truncated or named is _ALREADY_WARNED:
        return
    # which tokens were kept is the tokenizer's truncation_side (a left-truncating one keeps the last ones)
    side = getattr(tokenizer, "truncation_side", "right")
    end = "last" if side == "left" else "first"
    limit = max_length if max_length is not None else tokenizer.model_max_length
    kept_tokens = (f"the {end} tokens the tokenizer kept (its {end} {limit}" if not paired
                   else f"the tokens the tokenizer kept of the pair ({limit}, cut from the longer segment's "
                   f"{'start' if side == 'left' else 'end'}")
    longest, model_limit = max(counts[i] for i in truncated), position_limit(model).max_length
    if model_limit is None or longest <= model_limit:
        fix = f"Pass max_length={longest} (the longest text's tokens), or split the texts"
    elif limit < model_limit:
        fix = f"Pass max_length={model_limit} (the model's limit; the longest text has {longest} tokens), or split the texts"
    else:  # cut at the model's limit already: no max_length keeps more
        fix = f"The model reads at most {model_limit} tokens (the longest text has {longest}): split the texts"
    call = named or call
    warnings.warn(f"{call}: {len(truncated)} text(s) {truncated[:8]} have more than max_length={limit} tokens: each "
                  f"is {outcome} {kept_tokens}, as the tokenizer's truncation_side={side!r} cuts; the rest is left "
                  f"out{marked}). {fix}", UserWarning, stacklevel=caller_stacklevel())


def require_texts_with_tokens(lengths: Sequence[int], rows: Sequence[int], texts: Sequence[str], argument: str,
                              action: str, scope: str = " in this batch") -> None:
    """Refuse texts that tokenise to no token: ``lengths[i]`` real tokens of text ``rows[i]`` of the caller's ``texts``.
    An empty text with a tokenizer that adds no special tokens becomes a row of padding alone, whose outputs are no
    text's (a decoder classifier's logits of it were returned, counted and trained on; a first-column classifier's
    refusal asked for right padding). The one check of every path that tokenises texts itself (``explain_dataset``,
    ``predict`` / ``accuracy``, ``predict_labels``, ``fine_tune_classifier``); the message names the text by its index
    in ``texts`` (the first of them), ``argument`` the caller's argument that holds them, ``action`` what the caller
    does with them, ``scope`` where the others were counted."""
    empty = sorted(rows[i] for i, n in enumerate(lengths) if n == 0)
    if empty:
        more = f" (and {len(empty) - 1} more{scope})" if len(empty) > 1 else ""
        raise argument_error(argument, f"text {empty[0]} ({texts[empty[0]]!r}) tokenises to no token{more}: there is "
                             f"nothing to {action}", "Drop empty texts (or give the tokenizer special tokens to add)")


def explain_dataset(
    model: nn.Module,
    tokenizer,
    data: Sequence[str] | Any,
    *,
    text_column: str = "text",
    text_pair_column: str | None = None,
    target: int | Sequence[int] | Direction | None = None,
    target_column: str | None = None,
    foil: int | Sequence[int] | Direction | None = None,
    foil_column: str | None = None,
    position: int | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    reduce: str = "sum",
    progress: bool = True,
):
    """Explain every text of ``data`` and return a ``datasets.Dataset`` with one row per text.

    Args:
        model: as for :func:`bcos_plugins.explain`.
        tokenizer: the model's tokenizer (padding side as the model expects; a pad token is required).
        data: a list of texts, or a ``datasets.Dataset`` (texts in ``text_column``, optional second segment in
            ``text_pair_column``); its other columns are kept in the result.
        target, foil: one id for all texts, one per text, a ``Direction``, or a column (``target_column`` /
            ``foil_column``). Classifiers default to the predicted class.
        position: for causal LMs and base models: the index of a token in each text, counted from its first token
            (non-negative) or back from its last (negative, -1 being it), whatever side the tokenizer pads (the
            batches are padded here, so a column of them would name another token of a text in another batch);
            default: each text's last token for decoders, the first for encoders.
        batch_size, max_length: batching and truncation (``max_length`` defaults to the model's limit,
            :func:`~bcos_plugins.convert.architectures.position_limit`; without one, as for a rotary model, to
            the tokenizer's ``model_max_length``).
        reduce: ``"sum"`` (exact) or ``"mean"`` token scores.
        progress: show a tqdm progress bar.

    Returns:
        A ``datasets.Dataset`` with the input columns plus ``tokens`` (list of str, padding removed),
        ``input_ids``, ``scores`` (one float per token), ``explained`` (the explained value), ``target``,
        ``foil`` (when given), ``position`` (causal LMs and base models: the explained token's index counted from the
        text's first token; a causal LM's scores after it are exactly 0, as its output does not see those tokens, so
        rank a row's tokens up to it), ``delta``, ``completeness_error`` and ``truncated`` (True where the text had more tokens
        than ``max_length``: its explanation is of the ``max_length`` tokens the tokenizer kept, its first ones, or its
        last ones with ``truncation_side="left"``, and a ``UserWarning`` names those texts). An input column named
        like one of these is kept as ``original_<name>`` (prefixed again while that name is taken). Save it with
        ``.save_to_disk(path)``.
    """
    datasets = _import_datasets()
    # first: with the arguments swapped (the texts second, the tokenizer third) the data's reading failed on
    # "'BertTokenizer' object is not iterable"
    require_tokenizer_object(tokenizer)
    if isinstance(data, str):
        raise BcosTypeError("data: got one string; pass a list of texts (or a datasets.Dataset).")
    _refuse_table_of_splits_or_columns(data, datasets)
    if isinstance(data, datasets.Dataset):
        if text_column not in data.column_names:
            raise BcosValueError(f"text_column: {text_column!r} is not a column of the dataset. Columns: "
                                 f"{data.column_names}. Pass text_column=<the column holding the texts>.")
        texts = list(data[text_column])
        pairs = list(data[text_pair_column]) if text_pair_column is not None else None
        kept = data
    else:
        texts = list(data)
        if text_pair_column is not None:
            raise BcosValueError("text_pair_column: only a datasets.Dataset has columns; pass a Dataset.")
        pairs, kept = None, None
    if not texts:
        raise BcosValueError("data: no texts to explain (empty input).")
    for argument, strings, what in (("data", texts, "text"), ("text_pair_column", pairs or [], "the pair of text")):
        bad = next((i for i, t in enumerate(strings) if not isinstance(t, str)), None)
        if bad is not None:
            raise argument_error(argument, f"{what} {bad} is {type(strings[bad]).__name__} {strings[bad]!r}, not a "
                                 "str", "Pass strings only (fill or drop the texts without one)", kind=BcosTypeError)
    batch_size = require_count("batch_size", batch_size)  # True was a batch size of 1
    if position is not None and not (isinstance(position, numbers.Integral) and not isinstance(position, bool)):
        # a list or tensor went to explain as columns of each padded batch: on a left-padded batch a column is not
        # the text's token at that index (another token, silently, or a refusal naming padding)
        raise argument_error("position", f"must be one int for every text, got {type(position).__name__}",
                             "Pass a token index counted from each text's first token (>= 0) or back from its last "
                             "(< 0); for a different token per text, call explain on each batch yourself",
                             kind=BcosTypeError)
    position = None if position is None else int(position)  # a NumPy int was taken as a column, not from the first token
    n = len(texts)
    targets = _per_row(target, "target", n, data, target_column)
    foils = _per_row(foil, "foil", n, data, foil_column)
    if tokenizer.pad_token is None:
        raise BcosValueError("tokenizer: has no pad token, so texts cannot be batched. Set "
                             "tokenizer.pad_token = tokenizer.eos_token (decoders) before explaining.")
    if max_length is None:
        max_length = position_limit(model).max_length
    else:
        # checked here, naming max_length: a negative or float one failed inside the tokenizer (OverflowError,
        # TypeError), 0 was reported as texts that tokenise to nothing, one beyond the position table as input_ids
        # too long (an argument the caller never passed)
        max_length = require_count("max_length", max_length, minimum=1)
        require_max_length_fits(model, max_length)
    require_max_length_beyond_special_tokens(tokenizer, max_length, pairs is not None)
    device = next(model.parameters()).device
    columns: dict[str, list] = {"tokens": [], "input_ids": [], "scores": [], "explained": [], "target": [],
                                "delta": [], "completeness_error": [], "truncated": []}
    if foils is not None:
        columns["foil"] = []

    def value_of(items, lo, hi):
        if items is None or isinstance(items, Direction):
            return items
        return torch.tensor(items[lo:hi], device=device)

    bar = tqdm(total=n, desc="explaining", unit="text", disable=not progress)
    cut_counts: list[int | None] = []
    readable = forward_keywords(model)
    for lo in range(0, n, batch_size):
        hi = min(lo + batch_size, n)
        # the mask asked for: a tokenizer whose model_input_names leave it out failed with KeyError: 'attention_mask'
        enc = tokenizer(texts[lo:hi], pairs[lo:hi] if pairs is not None else None, padding=True,
                        truncation=True, max_length=max_length, return_attention_mask=True,
                        return_tensors="pt").to(device)
        require_tokenizer_ids_fit(model, tokenizer, enc)
        # a text longer than max_length was explained as its first tokens and nothing said so (a decoder's position -1
        # was then the last kept token, not the text's): the row says it, and a warning names those texts
        cut_counts += truncated_token_counts(tokenizer, texts[lo:hi], pairs[lo:hi] if pairs is not None else None,
                                             enc["attention_mask"].sum(1).tolist(), max_length)
        if lo == 0:
            # ids that all fit do not make it the model's tokenizer; its size and names are the same for every
            # batch, so checked once, after the first batch's ids (whose refusal names the ids it saw)
            require_tokenizer_fits(model, tokenizer)
        # explain's refusal named attention_mask, an argument the caller of explain_dataset never passed
        require_texts_with_tokens(enc["attention_mask"].sum(1).tolist(), range(lo, hi), texts, "data", "explain")
        if position is not None:
            # explain's refusal named the padded column it was given (1 + the batch's padding: "position: [18] is
            # outside row(s) [6]" for position=1) or called a short text's missing token "a padding token"
            lengths = enc["attention_mask"].sum(1).tolist()
            short = [lo + i for i, n in enumerate(lengths) if (n <= position if position >= 0 else n < -position)]
            if short:
                k, more = short[0], (f" nor of {len(short) - 1} more in this batch" if len(short) > 1 else "")
                raise argument_error("position", f"{position} is not a token of text {k} ({texts[k]!r}, "
                                     f"{lengths[k - lo]} tokens){more}",
                                     "Pass a position inside every text (counted from its first token, or back "
                                     "from its last with -1 being it), or drop the shorter texts")
        extra = readable_tokenizer_outputs(enc, readable)
        # a non-negative position counts from each text's first token: on a left-padded batch that is the text's
        # padding plus the position, not the column itself
        from_first = (position if position is None or position < 0
                      else enc["attention_mask"].argmax(1) + position)
        # a refusal names the texts' rows in data, not the chunk's, and of left padding the tokenizer's padding side
        # (it named attention_mask, an argument the caller never passed)
        with rows_named_as(range(lo, hi)), padding_named_as_tokenizers(tokenizer):
            expl = explain(model, enc["input_ids"], enc["attention_mask"], target=value_of(targets, lo, hi),
                           foil=value_of(foils, lo, hi), position=from_first, reduce=reduce, **extra)
        ids_rows = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)]
        columns["input_ids"] += ids_rows
        columns["tokens"] += [tokenizer.convert_ids_to_tokens(r) for r in ids_rows]
        # Python floats hold every dtype's values exactly (a cast to float32 first rounded a float64 model's scores)
        columns["scores"] += [s.cpu().tolist() for s in expl.scores()]
        columns["explained"] += expl.explained.cpu().tolist()
        columns["delta"] += expl.delta.cpu().tolist()
        columns["completeness_error"] += expl.completeness_error.cpu().tolist()
        columns["target"] += (expl.target.cpu().tolist() if isinstance(expl.target, torch.Tensor)
                              else [None] * (hi - lo))
        if foils is not None:
            columns["foil"] += (expl.foil.cpu().tolist() if isinstance(expl.foil, torch.Tensor)
                                else [None] * (hi - lo))
        if isinstance(expl.position, torch.Tensor):
            # each text's explained token counted from its first: a causal LM explained before a text's last token has
            # scores of exactly 0 after it (its output does not see those tokens), which the table did not say, so the
            # rows' padded scores ranked them as tokens of score 0 in the rank metrics, silently
            columns.setdefault("position", []).extend(
                (expl.position.to(enc["attention_mask"].device) - enc["attention_mask"].argmax(1)).cpu().tolist())
        bar.update(hi - lo)
    bar.close()
    columns["truncated"] = [n is not None for n in cut_counts]
    warn_of_truncated_texts("explain_dataset", cut_counts, max_length, model, tokenizer, pairs is not None,
                            outcome="explained as", marked="; the column 'truncated' marks them")
    if kept is not None:
        clashes = [c for c in columns if c in kept.column_names]
        if clashes:
            # prefixed until the name is free: a dataset that also held 'original_scores' failed inside datasets
            taken, renamed = set(kept.column_names) | set(columns), {}
            for c in clashes:
                name = f"original_{c}"
                while name in taken:
                    name = f"original_{name}"
                taken.add(name)
                renamed[c] = name
            kept = kept.rename_columns(renamed)
        for name, values in columns.items():
            kept = kept.add_column(name, values)
        return kept
    return datasets.Dataset.from_dict({"text": texts, **columns})
