"""Argument checks shared by every entry point: the attribution core and the adapters (one token-batch check,
:func:`require_token_batch`; one per-row id parser, :func:`require_row_ids`), the metrics, Space, guided, vision,
bilinear and training helpers.

Each check raises the package's own exception (:mod:`bcos_plugins.errors`) with a message that names the
argument, says what was wrong with it and what to pass instead, so that bad input never reaches a torch or
transformers internal (opaque error) or a formula (silently wrong number).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterator, Mapping, MappingView, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn

from .errors import BcosTypeError, TokenizerMismatchWarning, UnmaskedPaddingWarning, argument_error

__all__ = ["available_devices", "bad_rows", "caller_stacklevel", "closest_name", "closest_name_fix", "named_row", "named_rows", "refuse_keywords_meant_as_own", "refuse_a_model_as_the_tokenizer", "refuse_meta_model", "require_model_object", "stand_in_for_a_model", "rows_named_as", "require_bool", "require_choice", "require_class_ids", "require_classifier", "require_count", "require_available_device", "require_deterministic", "require_trainable", "require_float",
           "narrowed_to_dtype", "refuse_renamed_keywords", "require_int", "require_seed", "require_label_names", "require_labels", "require_number", "require_real_tokens",
           "require_row_ids", "require_run_settings", "require_same_shape", "require_tensor", "require_text_pairs", "require_texts",
           "require_tokenizer_object", "refuse_container_of_names",
           "require_token_batch", "token_batch_and_padding", "ids_as_long", "unmasked_padding_keywords",
           "warn_if_another_models_tokenizer", "warn_if_unmasked_padding"]


# the caller's index of each row of the batch being checked, where a path batches its caller's texts in chunks or in
# another order (explain_dataset, predict): set by rows_named_as, read by named_rows
_CALLERS_ROWS: ContextVar[tuple[int, ...] | None] = ContextVar("callers_rows", default=None)


@contextmanager
def rows_named_as(row_ids: Sequence[int]) -> Iterator[None]:
    """Inside it, error messages name row ``i`` of a batch of ``len(row_ids)`` rows as ``row_ids[i]``: the one way a
    path that batches its caller's texts in chunks or in another order makes every refusal inside (``explain``'s
    included) name the caller's rows, not the batch's."""
    token = _CALLERS_ROWS.set(tuple(int(i) for i in row_ids))
    try:
        yield
    finally:
        _CALLERS_ROWS.reset(token)


def named_row(row: int, batch: int) -> int:
    """Row ``row`` of a batch of ``batch`` rows as messages name it: the caller's index inside :func:`rows_named_as`
    (for a batch of that many rows), else ``row``."""
    callers = _CALLERS_ROWS.get()
    return callers[row] if callers is not None and batch == len(callers) else row


def named_rows(bad: Tensor) -> list[int]:
    """The rows where ``bad`` (first axis the batch) holds a True anywhere, as messages name them
    (:func:`named_row`), in ascending order."""
    if not bad.ndim:
        return [0]
    rows = bad.reshape(bad.shape[0], -1).any(1).nonzero().flatten().tolist()
    return sorted(named_row(r, bad.shape[0]) for r in rows)


def bad_rows(bad: Tensor, limit: int = 8) -> str:
    """``"rows [0, 3]"`` for a boolean tensor whose first axis is the batch (for messages; :func:`named_rows`)."""
    rows = named_rows(bad)
    shown = ", ".join(str(r) for r in rows[:limit]) + (", ..." if len(rows) > limit else "")
    return f"row{'s' if len(rows) != 1 else ''} [{shown}]"


def closest_name(name: str, known, cutoff: float = 0.6) -> str | None:
    """The name of ``known`` closest to ``name`` (difflib, at least ``cutoff`` alike), or ``None``: the one lookup of
    every "did you mean" hint (:func:`closest_name_fix`)."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def closest_name_fix(name: str, known, otherwise: str) -> str:
    """The fix of a refused unknown name (a misspelt keyword): ``"Pass <closest>= if that is what you meant"`` for the
    name of ``known`` closest to ``name`` (:func:`closest_name`), else ``otherwise``."""
    close = closest_name(name, known)
    return f"Pass {close}= if that is what you meant" if close else otherwise


# what a newcomer writes for an explaining function's own keywords (explain, context_attribution): it goes to their
# **forward_kwargs, where labels= (a keyword every transformers head reads, for its loss) was taken without a word and
# the predicted class explained instead of the labels given, and label= was refused with "Pass labels= if that is
# what you meant", which led there
_MEANT_AS = {**dict.fromkeys(("labels", "label", "targets", "class_idx", "class_id", "class_index", "target_class",
                              "target_id", "target_ids"), "target"),
             **dict.fromkeys(("mask", "masks"), "attention_mask"), "foils": "foil", "positions": "position"}


def refuse_keywords_meant_as_own(forward_kwargs: Mapping, readable, target, *, call: str,
                                 own: tuple[str, ...] = ("target", "foil", "position", "reduce")) -> None:
    """Refuse a forward keyword of an explaining function (``call``, its signature for the message; ``own``, its own
    keywords but ``attention_mask``, which the forward's check suggests) that is a common way of writing one of its own:
    ``labels=`` / ``targets=`` / ``class_idx=`` for ``target=``, ``mask=`` for ``attention_mask=``, a name close to
    ``own`` that the forward does not read (``readable``: its keywords, ``None`` if unknown). The forward's check
    (``attribution.text.check_forward_kwargs``) knows only the forward's names, and ``labels`` is one of them: next to a
    ``target`` it is passed on (the model computes a loss nothing reads), without one it is refused."""
    for name in forward_kwargs:
        if name == "labels" and target is not None:
            continue
        meant = _MEANT_AS.get(name)
        if meant is not None and meant not in (*own, "attention_mask"):
            meant = None
        if meant is None and name not in (readable or ()):
            meant = closest_name(name, own, cutoff=0.8)
        if meant is None:
            continue
        read = ("the model's loss target, which no explanation reads: without target= a classifier's predicted "
                "class would be explained" if name == "labels" else "not a keyword of this call nor of the model's "
                "forward")
        raise argument_error(name, f"is {read}", f"Pass {meant}= ({call})", kind=BcosTypeError)


def require_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
                fix: str | None = None) -> int:
    """``value`` as a Python int, refusing bools, floats (``2.0`` included) and values out of range (NumPy's integer
    scalars and 0-d integer tensors taken). ``fix`` replaces the generic fix texts where the caller can say what the
    number is."""
    if isinstance(value, Tensor) and value.ndim == 0 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise argument_error(name, f"must be an int, got {type(value).__name__} {value!r}",
                             fix or "Pass a whole number (not a float or a bool)", kind=BcosTypeError)
    value = int(value)
    if minimum is not None and value < minimum:
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise argument_error(name, f"must be {bound}, got {value}", fix or f"Pass an int {bound}")
    if maximum is not None and value > maximum:
        bound = f"<= {maximum}" if minimum is None else f"in [{minimum}, {maximum}]"
        raise argument_error(name, f"must be {bound}, got {value}", fix or f"Pass an int {bound}")
    return value


def require_seed(name: str, value, *, minimum: int | None = 0, maximum: int | None = 2**64 - 1) -> int:
    """``value`` as a Python int seed within ``[minimum, maximum]`` (``None``: unbounded on that side), refused by
    name as :func:`require_int` refuses (bools, floats, out of range). The one check of the package's seeds: each
    caller passes the bounds its generator takes (``[-2**63, 2**64 - 1]`` for ``torch.Generator().manual_seed``, where a
    seed beyond them failed with "Overflow when unpacking long long"; ``maximum=None`` for NumPy's ``default_rng``;
    both ``None`` for Python's ``random``), so one caller's bounds never loosen or tighten another's."""
    return require_int(name, value, minimum=minimum, maximum=maximum)


def require_bool(name: str, value, *, fix: str | None = None, or_none: bool = False) -> bool | None:
    """``value`` if it is ``True`` or ``False`` (or ``None`` with ``or_none``); anything else (``"no"``, ``0``,
    NumPy's ``bool_``, a tensor) is refused, since a truthy string such as ``"no"`` read as True and ran what it
    asked not to, silently. ``fix`` replaces the generic fix text where the caller can say what each value does."""
    if not isinstance(value, bool) and not (or_none and value is None):
        allowed = "True, False or None" if or_none else "True or False"
        # NumPy's bool type is named "bool": "got bool np.True_" read as a bool refused for not being one. Refused
        # all the same (one rule for every flag: the Python bools only), named as NumPy's, with the conversion
        got = (f"numpy.bool {value!r} (pass bool({name}))" if type(value).__module__ == "numpy"
               and type(value).__name__ in ("bool", "bool_") else f"{type(value).__name__} {value!r}")
        raise argument_error(name, f"must be {allowed}, got {got}",
                             fix or f"Pass {name}=True or {name}=False (a string such as 'no' reads as True)",
                             kind=BcosTypeError)
    return value


def require_float(name: str, value, *, minimum: float | None = None, maximum: float | None = None,
                  open_minimum: bool = False) -> float:
    """``value`` as a finite Python float (ints accepted), refusing NaN, inf, bools and out-of-range values."""
    if isinstance(value, Tensor) and value.ndim == 0 and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise argument_error(name, f"must be a real number, got {type(value).__name__} {value!r}",
                             "Pass a float", kind=BcosTypeError)
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise argument_error(name, f"must be finite, got {value}", "Pass a finite float")
    low_ok = minimum is None or (value > minimum if open_minimum else value >= minimum)
    if not low_ok or (maximum is not None and value > maximum):
        low = "" if minimum is None else (f"> {minimum}" if open_minimum else f">= {minimum}")
        high = "" if maximum is None else f"<= {maximum}"
        bound = " and ".join(b for b in (low, high) if b)
        raise argument_error(name, f"must be {bound}, got {value}", f"Pass a float {bound}")
    return value


def require_choice(name: str, value, choices: Sequence[str], fix: str = "Pick one of those") -> str:
    """``value`` itself if it is one of ``choices``; ``fix`` lets a caller name a further way out (such as
    leaving an optional argument out)."""
    if not isinstance(value, str) or value not in choices:
        raise argument_error(name, f"must be one of {tuple(choices)}, got {value!r}", fix)
    return value


_KINDS = {
    "float": lambda t: t.is_floating_point(),
    "int": lambda t: not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool,
    "bool": lambda t: t.dtype == torch.bool,
    "real": lambda t: not t.is_complex(),
    "mask": lambda t: not t.is_complex(),
}


def _holds_python_float(value) -> bool:
    """Whether ``value`` is a Python float or a (nested) list or tuple holding one (NumPy's float64 scalars count:
    they are Python floats too); NumPy arrays and tensors are not looked into, they carry their own dtype."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            return True
        if isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _only_python_floats(value) -> bool:
    """Whether ``value`` is a Python float or a (nested) list or tuple of nothing but Python floats (``type(x) is
    float``: NumPy's float64 scalars, a subclass, and complex or other entries are left to the general reading, in
    which a complex entry makes the tensor complex, refused, where a float64 reading dropped its imaginary part).
    The first entry is looked at first, so that a list of ints costs no walk."""
    first = value
    while isinstance(first, list | tuple) and first:
        first = first[0]
    if type(first) is not float:
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is float:
            continue
        if not isinstance(item, list | tuple) or not item:
            return False
        kinds = set(map(type, item))
        if kinds == {float}:
            continue
        if not kinds <= {list, tuple}:
            return False
        stack.extend(item)
    return True


def _row_lengths(value) -> list[int] | None:
    """The lengths of the rows of ``value`` (a sequence, e.g. a list or a ``datasets`` column, of sized rows that are
    not strings), else ``None``."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes) or not len(value):
        return None
    if not all(hasattr(row, "__len__") and not isinstance(row, str | bytes) for row in value):
        return None
    try:
        return [len(row) for row in value]
    except TypeError:  # a 0-d tensor or array has __len__ but no length
        return None


def require_tensor(name: str, value, *, ndim: int | Sequence[int] | None = None, kind: str = "real",
                   finite: bool = True, shape_hint: str = "", list_dtype: torch.dtype | None = None) -> Tensor:
    """``value`` as a tensor of the right rank and dtype kind, finite unless ``finite=False``.

    ``kind``: ``"float"``, ``"int"`` (integer ids), ``"bool"``, ``"real"`` (any non-complex) or ``"mask"``
    (any non-complex, values must be 0 or 1). Lists, tuples, Python numbers and NumPy arrays are converted.

    The precision of converted values (one rule for every entry point): tensors and NumPy arrays keep their dtype,
    lists of ints stay int64 and lists of bools bool. Python floats (a list or tuple holding at least one) are read
    at Python's precision, float64, as NumPy reads them: that is the reading of a statistic, score or metric input,
    where torch's default (float32) tied scores 1e-9 apart around 1.0 (ranks, areas, sums and bootstrap differences
    silently wrong) and turned values above 3.4e38 into inf (refused as the caller's NaN or inf). An input that feeds
    a model (pixel values, embeddings, hidden states, a layer's input) or is computed in another tensor's dtype
    passes ``list_dtype``: the model's (that tensor's) dtype, or ``torch.get_default_dtype()`` where no model is
    known. Its Python floats are then read at that dtype, rounded as the model computes anyway, and a value finite in
    Python but beyond the dtype's range is refused naming the dtype, never turned into inf.
    """
    if not isinstance(value, Tensor):
        try:
            if _only_python_floats(value):
                # read once, at float64 (reading at torch's float32 first, then again at float64, took 2.5-3x the
                # time of one reading for lists of 100-1000 floats; docs/benchmarks.md, 2026-11-29)
                converted, python_floats = torch.as_tensor(value, dtype=torch.float64), True
            else:
                converted = torch.as_tensor(value)
                python_floats = converted.is_floating_point() and _holds_python_float(value)
                if python_floats and converted.dtype != torch.float64:
                    converted = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            lengths = _row_lengths(value)
            if lengths is not None and len(set(lengths)) > 1:
                # rows of different lengths (explain_dataset's scores, its padding removed; ragged gold masks) were
                # refused as "got list. Pass a torch.Tensor", which said neither what was wrong nor how to mend it
                shown = sorted(set(lengths))
                raise argument_error(name, f"has rows of different lengths {shown[:8]}{' ...' if len(shown) > 8 else ''}"
                                     f" (e.g. explain_dataset's scores, whose padding is removed), which make no "
                                     f"tensor{shape_hint and ' of shape ' + shape_hint}", "Pad the rows to one length "
                                     "(torch.nn.utils.rnn.pad_sequence([torch.as_tensor(row) for row in rows], "
                                     "batch_first=True)) and pass the mask of their real entries where the function "
                                     "takes one, or pass the explanation of the padded batch itself",
                                     kind=BcosTypeError) from None
            raise argument_error(name, f"must be a tensor{shape_hint and ' of shape ' + shape_hint}, got "
                                 f"{type(value).__name__}", "Pass a torch.Tensor", kind=BcosTypeError) from None
        if python_floats and list_dtype is not None and list_dtype != converted.dtype:
            converted = narrowed_to_dtype(name, converted, list_dtype)
        value = converted
    if not _KINDS[kind](value):
        wanted = {"float": "a floating-point", "int": "an integer", "bool": "a boolean", "real": "a real",
                  "mask": "a real"}[kind]
        raise argument_error(name, f"must be {wanted} tensor, got dtype {value.dtype}",
                             f"Convert it (e.g. .{'float' if kind == 'float' else 'long' if kind == 'int' else 'bool'}())",
                             kind=BcosTypeError)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.ndim not in allowed:
            raise argument_error(
                name, f"must have {' or '.join(str(a) for a in allowed)} dimension{'' if allowed == (1,) else 's'}"
                f"{' ' + shape_hint if shape_hint else ''}, got shape {tuple(value.shape)}",
                "Reshape it or pass the tensor the docstring describes")
    if finite and value.is_floating_point() and value.numel() and not torch.isfinite(value).all():
        where = bad_rows(~torch.isfinite(value)) if value.ndim else "its value"
        raise argument_error(name, f"contains NaN or inf in {where}", "Pass finite values")
    if kind == "mask" and value.numel() and value.dtype != torch.bool and not ((value == 0) | (value == 1)).all():
        raise argument_error(name, f"must be a 0/1 mask, got values {sorted(set(value.unique().tolist()))[:6]}",
                             "Pass a boolean tensor or one of 0s and 1s")
    return value


def narrowed_to_dtype(name: str, values: Tensor, dtype: torch.dtype) -> Tensor:
    """``values`` cast to ``dtype``, refusing finite values beyond its range (the cast makes them inf, and a NaN or
    inf then comes out of the formula): the one checked cast of a wider input, list or tensor, to the dtype of the
    model or tensor it is computed with (:func:`require_tensor`'s ``list_dtype``)."""
    narrowed = values.to(dtype)
    overflow = torch.isfinite(values) & ~torch.isfinite(narrowed)
    if overflow.any():
        where = bad_rows(overflow) if values.ndim else "its value"
        largest = float(values.abs()[overflow].max())
        raise argument_error(name, f"holds {largest:.3g} in {where}, beyond the range of {dtype} (|x| <= "
                             f"{torch.finfo(dtype).max:.3g}), the dtype of the model or tensor it feeds, where it "
                             "would be inf", "Pass values within that range, or compute in a wider dtype (e.g. "
                             "model.double() and float64 inputs)")
    return narrowed


def require_same_shape(name: str, value: Tensor, other_name: str, other: Tensor, fix: str | None = None) -> None:
    """Refuse ``value`` unless it has ``other``'s shape; ``fix`` replaces the default "Pass one entry per entry of
    <other_name>" where the caller can say more (which call builds both)."""
    if tuple(value.shape) != tuple(other.shape):
        raise argument_error(name, f"has shape {tuple(value.shape)} but {other_name} has {tuple(other.shape)}",
                             fix or f"Pass one entry per entry of {other_name}")


# the arguments whose ids are classes or tokens: a string there is a class name or a token, whose id a refusal names how
# to get (a position or a grid cell given as a string is refused without that hint)
_CLASS_OR_TOKEN_IDS = frozenset({"target", "foil", "labels", "label", "true_labels"})


def require_row_ids(name: str, value, batch: int, *, n_ids: int | None = None, what: str = "outputs",
                    broadcast: bool = True, direction_hint: bool = False, device=None,
                    form: str | None = None) -> Tensor:
    """``value`` as ``(batch,)`` int64 ids, one per row, in ``[0, n_ids)`` when ``n_ids`` is given: the one
    per-row id parser (targets, foils, positions, class ids, labels, grid cells).

    Takes an int for every row (unless ``broadcast=False``), a sequence of ints or an integer tensor of shape
    ``(batch,)``. Floats are refused, never truncated (torch would read 1.7 as 1 without a word), booleans too
    (a mask is not ids); ``direction_hint`` names ``Direction(vector)`` in the refusal of a float, where the
    caller takes one. ``what`` names the ``n_ids`` things in the out-of-range message ("3 classes"). ``form`` names
    what the caller takes, for ids that are not one per row (inseq's list of classes, each explained for every text):
    the refusals then ask for it instead of one id per row of a batch of ``batch``.
    """
    if form is not None:
        one, fix_type = form, f"Pass {form}"
    else:
        one = ("an int or one id per row" if broadcast else "one id per row") + f", shape ({batch},)"
        fix_type = (f"Pass {'an int for every row, or ' if broadcast else ''}one integer id per row (a list of ints "
                    f"or an integer tensor of shape ({batch},))")
    if direction_hint:
        fix_type += f"; to explain a direction of the output space pass {name}=Direction(vector)"
    if isinstance(value, list | tuple) and any(isinstance(v, bool) for v in value):
        # torch reads [0, True] as the ids [0, 1] without a word
        raise argument_error(name, "got a boolean; ids must be integers", fix_type, kind=BcosTypeError)
    if isinstance(value, float):
        raise argument_error(name, f"got a float ({value}); ids must be integers (floats are refused, not "
                             "truncated)", fix_type, kind=BcosTypeError)
    # the names are read only for the arguments that take class or token ids (a copy of every other id list was waste)
    names = ([] if name not in _CLASS_OR_TOKEN_IDS else [value] if isinstance(value, str)
             else list(value) if isinstance(value, list | tuple) else [])
    if names and all(isinstance(v, str) for v in names):
        # a class name (or a token) where its id is meant, the most common first mistake: say how to get the id
        raise argument_error(name, f"got {'a name' if isinstance(value, str) else 'names'} ({value!r}), not "
                             f"{'an id' if isinstance(value, str) else 'ids'}", f"Map a class name to its id with "
                             f"model.config.label2id[{names[0]!r}], a token with tokenizer.convert_tokens_to_ids"
                             f"(token) (a text's: tokenizer(text, add_special_tokens=False).input_ids). {fix_type}",
                             kind=BcosTypeError)
    try:
        ids = torch.as_tensor(value, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise argument_error(name, f"cannot read {value!r} as ids", fix_type, kind=BcosTypeError) from None
    if ids.numel() == 0 and batch:  # [] is read as a float32 tensor, and was refused as "a float (torch.float32)"
        raise argument_error(name, f"is empty (shape {tuple(ids.shape)}), with no id for any row", fix_type)
    if ids.is_floating_point():
        raise argument_error(name, f"got a float ({ids.dtype}); ids must be integers (floats are refused, not "
                             "truncated)", fix_type, kind=BcosTypeError)
    if ids.dtype == torch.bool:  # a mask (or True / False) is not ids
        raise argument_error(name, "got a boolean; ids must be integers", fix_type, kind=BcosTypeError)
    if ids.is_complex():
        raise argument_error(name, f"ids must be integers, got {ids.dtype}", fix_type, kind=BcosTypeError)
    ids = ids.to(torch.long)
    if ids.ndim == 0 and broadcast:
        ids = ids.expand(batch)
    if tuple(ids.shape) != (batch,):
        raise argument_error(name, f"expected {one}; got shape {tuple(ids.shape)}", fix_type)
    # a passing batch is decided from the ids on the host (one device-to-host sync and no kernel where the range test
    # ran 4: resolve_explained 0.27 -> 0.16 ms in explain, docs/benchmarks.md, 2026-11-28 04:15 UTC); the message's
    # tensors are built on a failure only
    listed = ids.tolist() if n_ids is not None else ()
    if listed and (min(listed) < 0 or max(listed) >= n_ids):
        outside = (ids < 0) | (ids >= n_ids)
        raise argument_error(name, f"ids must lie in [0, {n_ids}), got {ids[outside].tolist()[:8]} at "
                             f"{bad_rows(outside)}", f"Pass ids in [0, {n_ids}) (there are {n_ids} {what}); negative "
                             "ids are not counted from the end")
    return ids


def require_class_ids(name: str, value, batch: int, n_classes: int, what: str = "classes") -> Tensor:
    """One class id per row (:func:`require_row_ids` without broadcasting an int: labels come one per row)."""
    return require_row_ids(name, value, batch, n_ids=n_classes, what=what, broadcast=False)


def ids_as_long(ids: Tensor) -> Tensor:
    """Integer token ids of any width (uint8, int16, int32, ...) as int64, exactly: embeddings take only
    int64 / int32, and a uint8 tensor used as an index is read as a boolean mask."""
    return ids if ids.dtype == torch.long else ids.to(torch.long)


def require_token_batch(input_ids, attention_mask=None, *, vocab_size: int | None = None,
                        max_length: int | None = None, limit_name: str | None = None,
                        name: str = "input_ids", pad_token_id: int | None = None,
                        pad_is_text: bool = False) -> tuple[Tensor, Tensor | None]:
    """:func:`token_batch_and_padding` without the padding flag: the checked ids and mask."""
    return token_batch_and_padding(input_ids, attention_mask, vocab_size=vocab_size, max_length=max_length,
                                   limit_name=limit_name, name=name, pad_token_id=pad_token_id,
                                   pad_is_text=pad_is_text)[:2]


def unmasked_padding_keywords(source, attention_mask) -> dict:
    """The ``pad_token_id`` / ``pad_is_text`` keywords of :func:`token_batch_and_padding`'s unmasked-padding warning,
    read from ``source`` (a transformers config, a tokenizer, a TransformerLens cfg: anything with ``pad_token_id``
    and optionally ``eos_token_id`` / ``bos_token_id``); empty with a mask (nothing is read or computed then) or
    without an integer pad id, so every path that takes ids runs the one detection with the same reading."""
    if attention_mask is not None:
        return {}
    pad = getattr(source, "pad_token_id", None)
    if not isinstance(pad, int) or isinstance(pad, bool):
        return {}
    return {"pad_token_id": pad, "pad_is_text": pad in special_text_ids(source)}


def special_text_ids(config) -> set[int]:
    """The eos and bos ids of ``config`` (each an id, a list of ids or None): a pad id among them (GPT-2 pads with its
    eos) can also be a row's own last or first token."""
    found: set[int] = set()
    for name in ("eos_token_id", "bos_token_id"):
        value = getattr(config, name, None)
        found.update(value if isinstance(value, (list, tuple)) else () if value is None else (value,))
    return found


def token_batch_and_padding(input_ids, attention_mask=None, *, vocab_size: int | None = None,
                            max_length: int | None = None, limit_name: str | None = None,
                            name: str = "input_ids", pad_token_id: int | None = None,
                            pad_is_text: bool = False, tokenizer_output_fix: str | None = None,
                            ) -> tuple[Tensor, Tensor | None, bool | None]:
    """Validate a ``(batch, pos)`` batch of token ids and its 0/1 attention mask before a model sees it: the one
    token-batch check of ``explain``, the Captum and TransformerLens adapters, the Space model and the metrics.

    Catches what would otherwise fail deep inside an embedding or a position table (opaque errors): a non-tensor,
    float ids, another rank, an empty batch or zero-length rows, ids outside the vocabulary, rows longer than the
    model's position table (``max_length``; ``limit_name`` says where the model keeps it, e.g. ``"cfg.n_ctx"``),
    a mask of another shape or with values other than 0/1, and rows without any real token. Returns the ids as
    int64 (any integer width, exactly), the mask as int64, and whether the batch is padded: ``False`` when the mask is
    ``None`` or all ones, ``True`` when it holds a 0, ``None`` (not known) for a mask the one-sync route does not decide
    (a float one). That route reads the mask's minimum anyway, so the answer costs nothing; a caller that takes a
    shortcut for an unpadded batch takes it on ``False`` only.

    A batch without a mask that looks padded is explained as given (exactly what ``model(ids)`` computes, the padding
    attended to as tokens) but warned about once, naming ``attention_mask``: with ``pad_token_id`` (the model's
    ``config.pad_token_id``) and no mask, a :class:`~bcos_plugins.errors.UnmaskedPaddingWarning` is issued when the
    rows of a batch of more than one differ in the length of a run of pad ids at their start or end (left or right
    padding of rows of different real lengths). ``pad_is_text``: the pad id is also the model's eos or bos id (GPT-2
    pads with its eos), so one such id at a row's end or start can be text: each run counts one id less. The pattern
    is read in the check's one sync, and a call with a mask (the usual one) computes nothing for it.

    ``tokenizer_output_fix``: the fix named when ``input_ids`` is the tokenizer's whole output (default: pass its ids
    and mask as the keywords ``name`` and ``attention_mask``), for a caller whose mask goes elsewhere (Captum's
    ``LayerBcos``: in ``additional_forward_args``).
    """
    if isinstance(input_ids, Mapping) and "input_ids" in input_ids:
        # the tokenizer's whole output (a BatchEncoding is a dict): the usual fix below, to tokenise, was done already
        unpacking = " (explain(model, **enc) unpacks them)" if name == "input_ids" else ""
        raise argument_error(name, f"got the tokenizer's output (a {type(input_ids).__name__} with keys "
                             f"{list(input_ids)}), not a tensor of token ids (batch, pos)", tokenizer_output_fix or (
                                 f"Pass its ids and mask: {name}=enc['input_ids'], "
                                 f"attention_mask=enc['attention_mask']{unpacking}"), kind=BcosTypeError)
    if not isinstance(input_ids, Tensor):
        raise argument_error(name, f"expected a tensor of token ids (batch, pos), got {type(input_ids).__name__}",
                             "Tokenise with tokenizer(texts, return_tensors='pt') (TransformerLens: "
                             "model.to_tokens(texts))", kind=BcosTypeError)
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise argument_error(name, f"token ids must be integers, got {input_ids.dtype}", "Pass the tokenizer's "
                             "ids (TransformerLens: model.to_tokens(text); to explain embeddings use the Captum "
                             "adapter's EmbeddingForward)", kind=BcosTypeError)
    if input_ids.ndim != 2:
        # a third dimension is most often a stack of one-row encodings (texts tokenised one at a time), whose fix is
        # not the batch dimension the 1-d case needs
        raise argument_error(name, f"expected shape (batch, pos), got {tuple(input_ids.shape)}",
                             f"Add a batch dimension with {name}[None] for one sequence" if input_ids.ndim < 2 else
                             f"Tokenise the texts in one call, tokenizer(texts, padding=True, return_tensors='pt'), "
                             f"which gives (batch, pos); a stack of one-row encodings (batch, 1, pos) is "
                             f"{name}.squeeze(1)")
    if 0 in input_ids.shape:
        raise argument_error(name, f"empty input of shape {tuple(input_ids.shape)}; there is nothing to explain",
                             "Pass at least one sequence of at least one token")
    for arg, given in ((name, input_ids), ("attention_mask", attention_mask)):
        if isinstance(given, Tensor) and given.is_meta:  # the value checks below failed with NotImplementedError
            raise argument_error(arg, "is on the meta device (a shape without values), so there are no tokens to "
                                 "check or explain", "Pass the real tensor (on the model's device)")
    ids = ids_as_long(input_ids)
    unmasked_padding = (_unmasked_padding(ids, pad_token_id, pad_is_text)
                        if attention_mask is None and pad_token_id is not None and ids.shape[0] > 1 else None)
    passed = _token_batch_passes(ids, attention_mask, vocab_size, max_length, unmasked_padding)
    if passed is not None:
        *result, looks_padded = passed
        if looks_padded:
            _emit_unmasked_padding_warning(name, pad_token_id)
        return tuple(result)
    if vocab_size is not None:
        outside = (ids < 0) | (ids >= vocab_size)
        if outside.any():
            raise argument_error(name, f"has ids outside the vocabulary [0, {vocab_size}) at {bad_rows(outside)}: "
                                 f"{ids[outside].unique().tolist()[:8]}", "Tokenise with the model's own tokenizer")
    if max_length is not None and ids.shape[1] > max_length:
        where = f" ({limit_name}, its position table)" if limit_name else ""
        raise argument_error(name, f"has {ids.shape[1]} positions but the model has only {max_length}{where}",
                             f"Truncate the inputs to {max_length} tokens (tokenizer(..., truncation=True, "
                             f"max_length={max_length}), or {name}[:, -{max_length}:])")
    if attention_mask is None:
        if unmasked_padding is not None and bool(unmasked_padding):
            _emit_unmasked_padding_warning(name, pad_token_id)
        return ids, None, False
    if not isinstance(attention_mask, Tensor):
        raise argument_error("attention_mask", f"expected a tensor, got {type(attention_mask).__name__}",
                             "Pass the mask the tokenizer returned with the ids", kind=BcosTypeError)
    if tuple(attention_mask.shape) != tuple(ids.shape):
        raise argument_error("attention_mask", f"shape {tuple(attention_mask.shape)} differs from {name} "
                             f"{tuple(ids.shape)}", "Pass the mask the tokenizer returned with the ids (one 0/1 "
                             "entry per token)")
    if attention_mask.is_complex() or not ((attention_mask == 0) | (attention_mask == 1)).all():
        shown = attention_mask.unique().tolist()[:6] if not attention_mask.is_complex() else attention_mask.dtype
        raise argument_error("attention_mask", f"must hold 0 (padding) and 1 (real token) only, got {shown}",
                             "Pass a boolean tensor or one of 0s and 1s")
    attention_mask = attention_mask.to(torch.long)
    require_real_tokens(attention_mask)
    return ids, attention_mask, None  # whether it is padded: not known without another sync on this rare route


def _unmasked_padding(ids: Tensor, pad_token_id: int, pad_is_text: bool) -> Tensor:
    """Whether the rows of ``ids`` differ in the length of a run of ``pad_token_id`` at their start or at their end,
    as a 0-dim tensor (no sync). ``pad_is_text``: each run counts one id less (a pad id that is also eos / bos)."""
    is_pad = (ids == pad_token_id).to(torch.int32)
    runs = torch.stack([is_pad.cumprod(1).sum(1), is_pad.flip(1).cumprod(1).sum(1)])  # (start / end, batch)
    if pad_is_text:
        runs = (runs - 1).clamp_min(0)
    return (runs.amax(1) > runs.amin(1)).any()


def warn_if_unmasked_padding(ids: Tensor, name: str, *, pad_token_id: int | None = None,
                             pad_is_text: bool = False, fix: str | None = None) -> None:
    """:func:`token_batch_and_padding`'s unmasked-padding detection for a path that takes a 2-d tensor of ids and no
    mask at all (``perplexity``'s ``texts``): the rows are read as given, so padding is scored as tokens; warned
    about with a fix that drops the padding (there is no mask to pass). Keywords: :func:`unmasked_padding_keywords`.
    ``fix``: the whole message instead (a path that could have taken a mask: a TransformerLens bridge's forward).
    One sync, on a path that reads the ids on the host anyway."""
    if pad_token_id is not None and ids.ndim == 2 and ids.shape[0] > 1 and ids.shape[1] > 0 and bool(
            _unmasked_padding(ids_as_long(ids), pad_token_id, pad_is_text)):
        _emit_unmasked_padding_warning(name, pad_token_id, fix=fix or (
            f"{name} has rows of different lengths padded with config.pad_token_id ({pad_token_id}) at their start "
            "or end, read as given: the padding is scored as tokens. Pass one id sequence per text without its "
            f"padding ([row[m.bool()] for row, m in zip(ids, attention_mask)]) or the texts with tokenizer="))


def caller_stacklevel() -> int:
    """The ``stacklevel`` that shows a warning of the function calling this one at the user's line: the first frame
    outside the package, whichever path (explain, Captum, a TransformerLens forward) called."""
    import sys

    level, frame = 1, sys._getframe(1)
    # (torch.no_grad's wrapper of a decorated entry point, perplexity's, is skipped too, and so are torch's module
    # call and TransformerLens' run_with_cache / run_with_hooks around a bridge's forward, which warns)
    while frame is not None and frame.f_globals.get("__name__", "").startswith((
            "bcos_plugins", "torch.utils._contextlib", "torch.nn.modules", "transformer_lens.")):
        level, frame = level + 1, frame.f_back
    return level


def _emit_unmasked_padding_warning(name: str, pad_token_id: int, fix: str | None = None) -> None:
    """Emit the unmasked-padding warning at the caller's line; detects nothing (its callers found the padding)."""
    import warnings

    level = caller_stacklevel()
    warnings.warn(fix or (
        f"attention_mask: not given, but {name} has rows of different lengths padded with config.pad_token_id "
        f"({pad_token_id}) at their start or end; without a mask the padding is attended to and explained as tokens "
        "(the explanation is exact for model(ids), an input other than the texts alone). Pass the tokenizer's "
        "attention_mask with the ids (tokenizer(texts, padding=True, return_tensors='pt'))."),
        UnmaskedPaddingWarning, stacklevel=level)


def _token_batch_passes(ids: Tensor, attention_mask, vocab_size: int | None, max_length: int | None,
                        unmasked_padding: Tensor | None = None) -> tuple[Tensor, Tensor | None, bool, bool] | None:
    """:func:`token_batch_and_padding`'s result when every check after the ids' type and shape passes, decided from
    the ids' and an integer or boolean mask's extremes in one device-to-host sync (5 small kernels instead of 14 and
    three syncs; docs/benchmarks.md, 2026-11-28 01:20 UTC), the mask's minimum saying whether it is padded;
    ``None`` when a check fails or for a mask it does not decide (a float or complex one). Then the step-by-step
    checks run and raise in their order with their messages, so this changes no refusal. ``unmasked_padding``
    (:func:`_unmasked_padding`'s flag, for a batch without a mask) is read in the same sync and returned last."""
    if max_length is not None and ids.shape[1] > max_length:
        return None
    mask = None
    if attention_mask is not None:
        if (not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(ids.shape)
                or attention_mask.is_floating_point() or attention_mask.is_complex()):
            return None
        mask = attention_mask.to(torch.long)
    extremes = []
    if vocab_size is not None:
        extremes += torch.aminmax(ids)
    if mask is not None:
        # a mask of integers holds only 0 and 1 if its extremes lie in [0, 1]; then a row has a real token if its
        # maximum is 1
        extremes += [*torch.aminmax(mask), mask.amax(1).amin()]
    if unmasked_padding is not None:
        extremes.append(unmasked_padding.to(torch.long))
    if not extremes:
        return ids, None, False, False
    values = torch.stack(extremes).tolist()
    looks_padded = bool(values.pop()) if unmasked_padding is not None else False
    if vocab_size is not None:
        low, high, *values = values
        if low < 0 or high >= vocab_size:
            return None
    if mask is not None:
        low, high, least_row_maximum = values
        if low < 0 or high > 1 or least_row_maximum < 1:
            return None
        return ids, mask, low == 0, False
    return ids, mask, False, looks_padded


def require_real_tokens(attention_mask: Tensor) -> None:
    """Refuse a ``(batch, pos)`` 0/1 mask with a row of padding only (its explained position, mean or share
    would be undefined: 0/0)."""
    empty = attention_mask.sum(1) == 0
    if empty.any():
        raise argument_error("attention_mask", f"row(s) {named_rows(empty)} have no real token "
                             "(all zeros); there is nothing to attribute to", "Remove empty rows from the batch")


# The training helpers' checks (fine-tuning, pre-training, prediction): their messages state the whole
# allowed range ("must be finite and (0, 1]"), which the training tests and the docs quote.


def require_number(name: str, value, *, low: float, low_open: bool = False, high: float | None = None) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` with ``low_open``), bools refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise argument_error(name, f"must be a number, got {type(value).__name__} {value!r}",
                             f"pass a float, e.g. {name}=0.5" if high else "pass a positive float",
                             kind=BcosTypeError)
    value = float(value)
    above = value > low if low_open else value >= low
    if not (math.isfinite(value) and above and (high is None or value <= high)):
        # the range this call enforces: label_smoothing=0 is allowed ([0, 1]), and the message said "(0, 1]"
        span = (f"{'(' if low_open else '['}{low:g}, {high:g}]" if high is not None
                else f"{'>' if low_open else '>='} {low:g}")
        raise argument_error(name, f"must be finite and {span}, got {value!r}", "pass a value in that range")
    return value


def require_count(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (a batch size, a length, a number of labels), bools refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise argument_error(name, f"must be an integer, got {type(value).__name__} {value!r}",
                             f"pass e.g. {name}={max(minimum, 8)}", kind=BcosTypeError)
    if value < minimum:
        raise argument_error(name, f"must be >= {minimum}, got {value}", f"pass e.g. {name}={max(minimum, 8)}")
    return int(value)


def available_devices() -> list[str]:
    """The devices this machine can run on, as ``torch.device`` strings (``cpu``, each ``cuda:<i>``, ``mps``)."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def require_available_device(name: str, device) -> torch.device:
    """``device`` as a ``torch.device``, refused naming ``name`` and the available devices where it is not a device or
    is a CUDA / MPS device this machine lacks: torch's own refusal, "Torch not compiled with CUDA enabled" (an
    AssertionError), named neither the argument nor what to pass."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise argument_error(name, f"is {device!r}, not a device", f"Pass one of {available_devices()}",
                             kind=BcosTypeError) from None
    missing = ((dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()))
               or (dev.type == "mps" and not torch.backends.mps.is_available()))
    if missing:
        raise argument_error(name, f"is {str(dev)!r}, which this machine does not have (available: "
                             f"{', '.join(available_devices())})", "Pass an available device, e.g. 'cpu'")
    return dev


def require_classifier(model) -> int:
    """The ``num_labels`` (>= 2) of a transformers sequence classifier, refusing anything else (a one-logit
    regression head too)."""
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    require_model_object(model, only_stand_ins=True)
    if not isinstance(model, nn.Module) or not isinstance(num_labels, int) or num_labels < 1:
        raise argument_error("model", f"must be a transformers sequence classifier (config.num_labels), got "
                             f"{type(model).__name__}", "pass e.g. AutoModelForSequenceClassification"
                             ".from_pretrained(name, num_labels=2)", kind=BcosTypeError)
    if num_labels == 1:
        # one logit is transformers' regression head: its only class id is 0, so every label had to be 0, the
        # argmax was always 0 (accuracy 1.0 whatever the model) and training fitted that constant
        raise argument_error("model", "has config.num_labels == 1, a regression head (one logit, trained with MSE "
                             "on float targets), not a classifier: its only class id is 0, so every prediction "
                             "is class 0", "build the classifier with num_labels=2 for a binary task")
    return num_labels


def stand_in_for_a_model(value) -> str | None:
    """What a common stand-in passed where a model goes is, and the fix (``"is a tokenizer ... Pass ..."``), or
    ``None``: a tokenizer (the model and tokenizer arguments swapped), a tensor (the ids passed first), a transformers
    pipeline (its model is ``pipe.model``), a Trainer (``fine_tune_classifier`` returns one), a PEFT model (its adapter
    layers are not B-cos layers). The one reading of them, for the refusal of an unsupported model
    (:func:`~bcos_plugins.convert.architectures.unsupported_message`), which listed some thirty class names instead."""
    kind = type(value).__name__
    if hasattr(value, "convert_ids_to_tokens") and not isinstance(value, nn.Module):
        return (f"is a tokenizer ({kind}), not a model: the arguments may be swapped. Pass the model first and the "
                "tokenizer where a tokenizer is asked for, e.g. explain(model, input_ids, attention_mask), "
                "explain_dataset(model, tokenizer, texts)")
    if isinstance(value, Tensor):
        return (f"is a tensor (shape {tuple(value.shape)}), not a model: the arguments may be out of order. Pass the "
                "model first, e.g. explain(model, input_ids, attention_mask)")
    if isinstance(getattr(value, "model", None), nn.Module) and not isinstance(value, nn.Module):
        if callable(getattr(value, "train", None)) and hasattr(value, "args"):
            # fine_tune_classifier / train_causal_lm return the Trainer: its model, trained in place, is the one passed
            return (f"is a transformers Trainer ({kind}), not a model (fine_tune_classifier and train_causal_lm return "
                    "the Trainer and train the model in place). Pass the model: trainer.model (or the model you "
                    "passed to it)")
        return (f"is a transformers pipeline ({kind}), not a model. Pass its model: pipe.model (and "
                "pipe.tokenizer)")
    if isinstance(value, nn.Module) and callable(getattr(value, "merge_and_unload", None)):
        return (f"is a PEFT model ({kind}): its adapter layers are not B-cos layers, so its explanations would not "
                "be exact. Merge the adapters into the weights first: model = model.merge_and_unload()")
    return None


def require_model_object(model, name: str = "model", *, only_stand_ins: bool = False) -> None:
    """Refuse what is not a model (an ``nn.Module``), naming a common stand-in with its fix
    (:func:`stand_in_for_a_model`: a tokenizer, the ids, a pipeline); ``only_stand_ins``: leave anything else to the
    caller's own words. ``predict(tokenizer, model, texts)`` failed with "BertTokenizer has no attribute parameters"."""
    stand_in = stand_in_for_a_model(model) if not isinstance(model, nn.Module) else None
    if stand_in is not None:
        raise BcosTypeError(f"{name}: {stand_in}.")
    if not only_stand_ins and not isinstance(model, nn.Module):
        raise argument_error(name, f"must be a transformers model (torch.nn.Module), got {type(model).__name__}",
                             "Pass e.g. AutoModelForSequenceClassification.from_pretrained(...)", kind=BcosTypeError)


def refuse_a_model_as_the_tokenizer(tokenizer, name: str = "tokenizer",
                                    call: str = "explain_dataset(model, tokenizer, texts)") -> None:
    """Refuse a model passed where the tokenizer goes (the two arguments swapped, or the model twice), naming the order
    of ``call``: the model was called on the texts and failed with "'list' object has no attribute 'size'", and
    :func:`require_tokenizer_object` printed its module tree, cut at 200 characters."""
    if isinstance(tokenizer, nn.Module):
        raise argument_error(name, f"expected a transformers tokenizer, got a model ({type(tokenizer).__name__}): the "
                             "arguments may be swapped", f"Pass the model first and its tokenizer second, e.g. {call}",
                             kind=BcosTypeError)


def refuse_meta_model(model: nn.Module, name: str = "model") -> None:
    """Refuse a model whose parameters are on the meta device (shapes without values): the one check of it, before
    TransformerLens models are built (``transformer_bridge_from_hf`` failed in a norm check with ``NotImplementedError:
    aten::equal``, ``hooked_transformer_from_hf`` in the weight conversion) and before the paths that tokenise texts
    run the model (``explain_dataset`` and ``predict`` failed on ``Tensor.item() cannot be called on meta tensors``),
    neither naming the cause."""
    meta = next((n for n, p in model.named_parameters() if p.is_meta), None) if isinstance(model, nn.Module) else None
    if meta is not None:
        raise argument_error(name, f"its parameters are on the meta device (shapes without values, e.g. {meta}), "
                             "so there are no weights to run", "Load the weights first (from_pretrained without "
                             "device='meta', or model.to_empty(device='cpu') and then load_state_dict)")


def require_tokenizer_object(tokenizer, name: str = "tokenizer") -> None:
    """Refuse what is not a transformers tokenizer object: the one check of every entry point that takes one
    (``explain_dataset``, the inseq and pre-training paths through ``corpus.require_tokenizer_fits``, the
    TransformerLens converters, which let ``None`` through before calling it). A hub name failed deep inside
    (``AttributeError: 'str' object has no attribute 'pad_token'`` / ``'save_pretrained'``), and a callable with
    ``convert_ids_to_tokens`` passed the corpus' older duck-typed check, then failed on ``pad_token``."""
    from transformers import PreTrainedTokenizerBase

    refuse_a_model_as_the_tokenizer(tokenizer, name)
    if isinstance(tokenizer, list | tuple) and tokenizer and all(isinstance(t, str) for t in tokenizer):
        raise argument_error(name, f"expected a transformers tokenizer, got a {type(tokenizer).__name__} of "
                             f"{len(tokenizer)} text(s): the arguments may be swapped", "Pass the model, its "
                             "tokenizer, then the texts, e.g. explain_dataset(model, tokenizer, texts)",
                             kind=BcosTypeError)
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise argument_error(name, f"expected a transformers tokenizer, got {type(tokenizer).__name__} "
                             f"{tokenizer!r}"[:200], "Pass the tokenizer object, e.g. AutoTokenizer.from_pretrained("
                             "the model's folder or hub name) (nothing is fetched from the hub here)",
                             kind=BcosTypeError)


def require_texts(texts, name: str = "texts") -> list[str]:
    """A non-empty list of strings (a single string is refused: it would be split into characters, and so is a
    container that iterates over names: see :func:`refuse_container_of_names`)."""
    if isinstance(texts, str) or not hasattr(texts, "__len__"):
        raise argument_error(name, f"must be a list of strings, got {type(texts).__name__}",
                             "pass e.g. ['a text', 'another']", kind=BcosTypeError)
    refuse_container_of_names(name, texts)
    refuse_unordered(name, texts, "Pass a list of the texts, in the order the rows should come back")
    texts = list(texts)
    if not texts:
        raise argument_error(name, "is empty", "pass at least one text")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise argument_error(name, f"{name}[{bad}] is {type(texts[bad]).__name__} {texts[bad]!r}, not a string",
                             "pass strings only", kind=BcosTypeError)
    return texts


def refuse_unordered(name: str, values, fix: str) -> None:
    """Refuse a set (``set``, ``frozenset``, any ``collections.abc.Set``): it has no order, so the rows computed from
    it came back in an order the caller could not match to its own list (``predict({"a", "b"})`` returned two rows
    of logits, in the set's hash order). A dict's ``keys()`` / ``items()`` views are ``Set`` types too, but keep the
    dict's insertion order, so they pass (as ``list(d)`` would)."""
    if isinstance(values, AbstractSet) and not isinstance(values, MappingView):
        raise argument_error(name, f"is a {type(values).__name__}, which has no order: its entries would be matched to "
                             "the results (or to another list) in an arbitrary order", fix, kind=BcosTypeError)


def refuse_container_of_names(name: str, texts, *, items: str = "texts", fix: str | None = None) -> None:
    """Refuse a container whose iteration yields names, not texts: a dict (a tokenizer's ``BatchEncoding``, a
    ``DatasetDict``, a column table) iterates over its keys and a pandas ``DataFrame`` over its column names, so the
    strings ``"input_ids"`` or ``"text"`` were read as the texts, without a word (predict gave three rows of logits
    for two texts given as their BatchEncoding). ``items`` and ``fix``: a caller that takes other items than texts
    (``train_causal_lm``'s tokenised examples) names them and says how to pass the tokenizer's output or a table."""
    if isinstance(texts, Mapping):
        keys = list(texts)[:5]
        if "input_ids" in texts:
            what = "the tokenizer's output, "
            fixed = fix or "Pass the texts themselves (the list given to the tokenizer), not its output"
        else:
            what = ""
            fixed = ("Pass the list of texts (e.g. data['text'])" if items == "texts" else
                     f"Pass one of its entries (e.g. {name}[{keys[0]!r}])" if keys else fix or f"Pass the {items}")
        raise argument_error(name, f"is {what}{'an' if type(texts).__name__[0] in 'AEIOU' else 'a'} "
                             f"{type(texts).__name__} (keys {keys}): iterating it gives its keys, not {items}", fixed,
                             kind=BcosTypeError)
    if hasattr(texts, "columns") and hasattr(texts, "iloc"):  # a pandas DataFrame, without importing pandas
        raise argument_error(name, f"is a {type(texts).__name__}: iterating it gives its column names "
                             f"{list(texts.columns)[:5]}, not {items}", fix or "Pass a column as a list "
                             "(data['text'].tolist())", kind=BcosTypeError)


def require_label_names(label_names) -> list[str] | None:
    """The class names as a list of strings, or None; the one check of ``label_names`` for visualize's HTML pages,
    Captum's ``visualization_records`` and inseq's ``load_classifier``: a NumPy array failed inside the captions ("The
    truth value of an array ... is ambiguous"), and one string named class ``c`` by its ``c``-th character ("abc"
    named the classes a, b and c). A dict is read as ``config.id2label`` ({id: name}) or ``config.label2id``
    ({name: id}), in class-id order."""
    fix = "Pass one name per class, in class-id order, e.g. ['negative', 'positive'] (or model.config.id2label)"
    if label_names is None:
        return None
    if isinstance(label_names, str | bytes):
        raise argument_error("label_names", f"must be a list of class names; it is one string, {label_names!r}, "
                             "whose characters would name the classes", fix, kind=BcosTypeError)
    if not hasattr(label_names, "__len__"):
        raise argument_error("label_names", f"must be a list of class names, got {type(label_names).__name__} "
                             f"{label_names!r}", fix, kind=BcosTypeError)
    if isinstance(label_names, Mapping):
        # a dict was read as its keys: model.config.label2id ({"pos": 1, "neg": 0}) named class 0 "pos" (the keys in
        # their insertion order), silently, and id2label ({0: "neg"}) was refused as "must be strings, got int 0"
        return _label_names_of_mapping(label_names, fix)
    names = list(label_names)
    bad = next((n for n in names if not isinstance(n, str)), None)
    if bad is not None:
        raise argument_error("label_names", f"must be strings, got {type(bad).__name__} {bad!r}", fix,
                             kind=BcosTypeError)
    return names


def _label_names_of_mapping(mapping: Mapping, fix: str) -> list[str]:
    """The class names, in class-id order, of an ``id2label`` ({id: name}) or a ``label2id`` ({name: id}) whose ids are
    0, 1, ... (each once)."""
    def is_id(value) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if all(is_id(k) and isinstance(v, str) for k, v in mapping.items()):
        by_id = {int(k): v for k, v in mapping.items()}
    elif all(isinstance(k, str) and is_id(v) for k, v in mapping.items()):
        by_id = {int(v): k for k, v in mapping.items()}
        if len(by_id) != len(mapping):
            raise argument_error("label_names", f"maps two names to one class id ({dict(mapping)!r})", fix)
    else:
        raise argument_error("label_names", f"a dict must map class ids to names (config.id2label) or names to ids "
                             f"(config.label2id), got {dict(mapping)!r}", fix, kind=BcosTypeError)
    if sorted(by_id) != list(range(len(by_id))):
        raise argument_error("label_names", f"the class ids of the dict are {sorted(by_id)}, not 0 to "
                             f"{len(by_id) - 1} each once", fix)
    return [by_id[i] for i in range(len(by_id))]


def require_text_pairs(text_pairs, n: int) -> list[str] | None:
    """The second texts of sentence pairs (``None``: single texts), one string per text."""
    if text_pairs is None:
        return None
    if isinstance(text_pairs, str) or not hasattr(text_pairs, "__len__"):
        raise argument_error("text_pairs", f"must be a list of strings (the second text of each pair), got "
                             f"{type(text_pairs).__name__}", "pass e.g. ['a hypothesis', 'another'], one per text",
                             kind=BcosTypeError)
    text_pairs = list(text_pairs)
    if len(text_pairs) != n:
        raise argument_error("text_pairs", f"{n} texts but {len(text_pairs)} text_pairs",
                             "pass one second text per text (texts[i] pairs with text_pairs[i])")
    bad = next((i for i, t in enumerate(text_pairs) if not isinstance(t, str)), None)
    if bad is not None:
        raise argument_error("text_pairs", f"text_pairs[{bad}] is {type(text_pairs[bad]).__name__} "
                             f"{text_pairs[bad]!r}, not a string", "pass strings only (use '' for an empty "
                             "second text)", kind=BcosTypeError)
    return text_pairs


def require_max_length_beyond_special_tokens(tokenizer, max_length: int | None, pairs: bool) -> None:
    """Refuse a ``max_length`` that the special tokens ``tokenizer`` adds to each text (or pair) fill: a transformers
    tokenizer ignores one below them (it logs and returns the whole text, so the text was explained / trained on
    untruncated and marked not truncated), and one equal to them leaves the special tokens alone (a row of nothing of
    the text). The one check of the paths that truncate texts themselves (``explain_dataset``, ``EncodedTexts``)."""
    if max_length is None or not hasattr(tokenizer, "num_special_tokens_to_add"):
        return
    specials = tokenizer.num_special_tokens_to_add(pair=pairs)
    needed = specials + (2 if pairs else 1)  # one token of each text of a pair
    if max_length < needed:
        what = "pair" if pairs else "text"
        raise argument_error("max_length", f"{max_length} leaves no token of {'a text of ' if pairs else ''}the "
                             f"{what}: the tokenizer adds {specials} special tokens to each {what} (and ignores a "
                             "max_length below them)", f"Pass max_length={needed} or more")


def require_labels(labels, num_labels: int, *, n: int | None = None) -> list[int]:
    """Class ids as a list of ints (a list or a tensor, one per text when ``n`` is given), read by the package's
    one per-row id parser (:func:`require_row_ids`): floats are refused, not truncated (``int(0.7) == 0`` would
    train on a wrong label)."""
    if not isinstance(labels, Tensor) and (isinstance(labels, str) or not hasattr(labels, "__len__")):
        raise argument_error("labels", f"must be a list of integer class ids, got {type(labels).__name__}",
                             "pass e.g. [0, 1, 1]", kind=BcosTypeError)
    labels = labels.reshape(-1) if isinstance(labels, Tensor) else list(labels)
    if n is not None and len(labels) != n:
        raise argument_error("labels", f"{n} texts but {len(labels)} labels", "pass one label per text")
    if not len(labels):
        return []
    return require_row_ids("labels", labels, len(labels), n_ids=num_labels, what="classes of the model (num_labels)",
                           broadcast=False).tolist()


def require_run_settings(epochs, batch_size, max_length, learning_rate, seed) -> None:
    """The settings every training helper of the package takes, checked before any work is done (``max_length``
    ``None``: the helper's default length, ``bcos_plugins.encoded_texts.truncation_length``)."""
    require_number("epochs", epochs, low=0.0, low_open=True)
    require_count("batch_size", batch_size)
    if max_length is not None:
        require_count("max_length", max_length, minimum=2)
    require_number("learning_rate", learning_rate, low=0.0, low_open=True)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise argument_error("seed", f"must be an integer, got {seed!r}", "pass e.g. seed=0", kind=BcosTypeError)


def refuse_renamed_keywords(function: str, given: dict, renamed: dict[str, str]) -> None:
    """Refuse the keywords a release renamed (``renamed``: old name -> new name) by name, pointing at the new
    one, and any other keyword a function's ``**given`` caught, as Python would refuse it.

    Old code then fails with the fix in the message instead of Python's bare "unexpected keyword argument".
    """
    for key in given:
        if key in renamed:
            raise argument_error(key, f"{function}() calls it {renamed[key]} since 0.2 (the name the package's "
                                 "explanation entry points share)", f"Pass {renamed[key]}= instead",
                                 kind=BcosTypeError)
        raise BcosTypeError(f"{function}() got an unexpected keyword argument {key!r}")


# keywords of other attribution methods that users carry over (Captum's and inseq's IntegratedGradients, DeepLift, ...):
# refused with the reason, where Python's "unexpected keyword argument" (Captum) or a logged "Unused arguments" (inseq,
# which then ran without them) says neither why nor what to do instead; one table for every B-cos method
_OTHER_METHODS_KEYWORDS = {
    "baselines": ("a B-cos explanation W(x)x needs no baseline: it is complete at the input itself (a bias-free B-cos "
                  "network maps 0 to 0, so the reference is zero)", "Leave baselines out; for attributions relative to "
                  "another reference input use {integrated_gradients}"),
    "internal_batch_size": ("the explanation is one forward and one backward pass of the inputs as given, with no "
                            "integration steps to batch", "Leave it out; to bound memory pass fewer examples per call"),
    "n_steps": ("the explanation is exact in one pass, with no integration steps", "Leave it out"),
    "method": ("the explanation is exact in one pass, with no integration rule", "Leave it out"),
}


def refuse_other_methods_keywords(call: str, given, *,
                                  integrated_gradients: str = "captum.attr.IntegratedGradients on the same "
                                                              "forward_func") -> None:
    """Refuse, by name and with the fix, the keywords of ``given`` (names) that other attribution methods take
    (``baselines``, ``internal_batch_size``, ``n_steps``, ``method``) and an exact B-cos explanation has no use for;
    ``call`` names the call in the message, ``integrated_gradients`` the method to use for a baseline instead."""
    for name in given:
        if name in _OTHER_METHODS_KEYWORDS:
            problem, fix = _OTHER_METHODS_KEYWORDS[name]
            raise argument_error(name, f"{call} takes no {name}: {problem}",
                                 fix.format(integrated_gradients=integrated_gradients), kind=BcosTypeError)


def _named_ids(source, names: tuple[str, ...]) -> set[int]:
    """The non-negative integer ids ``source`` (a config, a tokenizer) holds under ``names`` (lists flattened: Llama
    3.1's config names three EOS ids)."""
    found = set()
    for name in names:
        value = getattr(source, name, None)
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                found.add(item)
    return found


def _tokenizer_special_ids(tokenizer) -> set[int]:
    """Every id the tokenizer treats as special: its named special tokens and its added tokens marked special
    (Qwen2's ``<|im_end|>``, Llama 3's ``<|eot_id|>``, which ``all_special_ids`` may leave out)."""
    ids = {i for i in (getattr(tokenizer, "all_special_ids", None) or ()) if isinstance(i, int)}
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        ids.update(i for i, token in decoder.items() if isinstance(i, int) and getattr(token, "special", False))
    return ids


def warn_if_another_models_tokenizer(model, tokenizer, *, stacklevel: int = 3) -> None:
    """Warn (:class:`~bcos_plugins.errors.TokenizerMismatchWarning`) when ``tokenizer`` is, on strong evidence,
    another model's although its ids fit ``model``'s vocabulary: the two were loaded from different names, and none
    of the special tokens ``model.config`` names (``bos_token_id``, ``eos_token_id``, ``cls_token_id``,
    ``sep_token_id``) is a special token of the tokenizer (a BERT tokenizer on a GPT-2: GPT-2's EOS 50256 is no token
    of it, its special tokens are 0 and 100-103). Silent when the names match, when either is unnamed (a model built from a config, a
    tokenizer trained in memory), or when the config names no special token (BERT's names only its padding), so that
    a valid pair (a fine-tuned model with its base model's tokenizer) is never warned about; never a refusal."""
    config = getattr(model, "config", None)
    model_name = str(getattr(config, "_name_or_path", "") or "")
    tokenizer_name = str(getattr(tokenizer, "name_or_path", "") or "")
    if not model_name or not tokenizer_name or model_name.rstrip("/") == tokenizer_name.rstrip("/"):
        return
    named = _named_ids(config, ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"))
    special = _tokenizer_special_ids(tokenizer)
    if not named or not special or named & special:
        return
    import warnings

    warnings.warn(
        f"tokenizer: {type(tokenizer).__name__}({tokenizer_name!r}) looks like another model's than "
        f"{type(model).__name__}({model_name!r}): none of the special token ids the model's config names "
        f"({sorted(named)[:6]}) is a special token of the tokenizer (its own: {sorted(special)[:6]}), so its ids, "
        "though they fit the vocabulary, would be read as other tokens than the ones shown. Pass the tokenizer saved "
        "with the model (AutoTokenizer.from_pretrained of the model's folder or hub name); if this pair is right, "
        "silence it with warnings.filterwarnings('ignore', category=bcos_plugins.errors.TokenizerMismatchWarning).",
        TokenizerMismatchWarning, stacklevel=stacklevel)


def require_training_argument_names(training_args, helper: str, own=()) -> None:
    """Refuse a keyword of a training helper that is neither one of its own arguments (``own``) nor a field of
    transformers' ``TrainingArguments``, where the helper sends the others: a misspelt ``learning_rat=`` or a
    ``Trainer`` argument (``callbacks=``, ``eval_dataset=``) failed with Python's bare "TrainingArguments.__init__()
    got an unexpected keyword argument", naming neither the helper nor the closest valid name."""
    import dataclasses

    from transformers import TrainingArguments

    from .errors import BcosKeywordError

    fields = {field.name for field in dataclasses.fields(TrainingArguments) if field.init}
    for key in training_args:
        if key not in fields:
            raise argument_error(key, f"is neither an argument of {helper} nor a field of transformers' "
                                 f"TrainingArguments, where {helper} sends the keywords it does not take itself",
                                 closest_name_fix(key, fields | set(own), "Check the spelling against "
                                                  "transformers.TrainingArguments; for Trainer arguments (callbacks, "
                                                  "evaluation data) build a transformers Trainer yourself"),
                                 kind=BcosKeywordError)


def require_finite_parameters(model: nn.Module, name: str = "model", *,
                              consequence: str = "its loss would be NaN from the first step and every weight NaN "
                                                 "after it",
                              fix: str = "Reload the weights (or find the step that wrote them)",
                              parameters: Sequence[tuple[str, Tensor]] | None = None) -> None:
    """Refuse a model with a NaN or infinite parameter, naming the parameters (one device synchronisation for the
    whole model). The default words are the training helpers' (checked before training: the loss is NaN from the
    first step and every weight NaN after it); ``consequence`` and ``fix`` are another caller's (the TransformerLens
    adapter's, once an explanation came out NaN). ``parameters``: the named parameters to check, where a caller checks
    only some (the B-cos HookedTransformer's query / key weights); default all of ``model``'s."""
    named = [(n, p) for n, p in (model.named_parameters() if parameters is None else parameters)
             if p.is_floating_point() and not p.is_meta]
    if not named:
        return
    bad = torch.stack([~torch.isfinite(p.detach()).all() for _, p in named])
    if bool(bad.any()):
        which = [n for (n, _), b in zip(named, bad.tolist(), strict=True) if b]
        # the first three, then how many more: a bridge's paths run to 100 characters each
        # (model.layers.0._original_component.self_attn._original_component.q_proj._original_component.weight)
        more = f" and {len(which) - 3} more" if len(which) > 3 else ""
        raise argument_error(name, f"has NaN or infinite values in {len(which)} parameter(s) ({', '.join(which[:3])}"
                             f"{more}): {consequence}", fix)


def require_trainable(model: nn.Module, name: str = "model") -> None:
    """Refuse, before training, a model without a parameter that requires a gradient: the training helpers failed at
    the first backward pass with torch's "element 0 of tensors does not require grad and does not have a grad_fn",
    which named neither the model nor the fix. The one check of the training helpers and :func:`two_rate_adamw`."""
    if not any(p.requires_grad for p in model.parameters()):
        raise argument_error(name, "has no trainable parameters (all have requires_grad=False)",
                             "unfreeze the parameters to train (p.requires_grad_(True))")


def require_deterministic(name: str, first: Tensor, again: Tensor, what: str, fix: str) -> None:
    """Refuse ``name`` (a function the metric calls) when it scored the same ``what`` twice differently: eval mode
    cannot reach a model inside a function, so one around a model in training mode scores every input with dropout on
    and the numbers built on its scores (perturbation curves, the segments SeqPG examples pick) are noise. The one
    comparison of the metrics that score a function (``first`` and ``again``: its scores of the same inputs)."""
    if not torch.allclose(first, again, rtol=1e-4, atol=1e-6):
        raise argument_error(name, f"scored the same {what} differently (by up to "
                             f"{float((first - again).abs().max()):.3g}): it is not deterministic, e.g. a model in "
                             "training mode (dropout), so what is built on its scores would be noise", fix)
