"""Text models: input checks, the attribution point and forward arguments, shared by every text path.

``bcos_plugins.explain``, the Captum adapter's ``EmbeddingForward`` and the inseq adapter all take
contributions at the point chosen here and call the model with the arguments built here, so they explain
the same function.

Attribution point:

- B-cos models (any supported class), GPT-2 and Llama: the combined embedding (word + position + token
  type; token embeddings for Llama, whose positions enter through rotary query/key only). For a B-cos model
  contributions there sum exactly to the explained logit.
- stock BERT, DistilBERT and RoBERTa: the *output* of the embedding LayerNorm. The combined embedding feeds
  that LayerNorm, which ignores its input's scale, so input x gradient before it is identically zero
  (floating-point noise of about 1e-9) for any model; after it, input x gradient means what it means for
  GPT-2 (where the paper's reference code attributes). For a B-cos model both points give the same token sums.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor, nn

from .._checks import bad_rows, closest_name_fix, token_batch_and_padding, unmasked_padding_keywords
from ..convert.architectures import (
    SPECS,
    ArchitectureSpec,
    architecture_name,
    position_limit,
    refuse_stock_loaded_bcos,
    spec_for,
    uncompiled,
    vocabulary_size,
)
from ..errors import BcosRuntimeError, BcosTypeError, BcosValueError, argument_error
from ..nn.dynamic import has_dynamic_weights
from .gradient import outside_inference
from .rotary_length import forget_grown_rotary_frequencies, refuse_length_dependent_rotary
from .targets import real_token_positions, resolve_positions

__all__ = ["TextPoint", "text_attribution_point", "check_token_inputs", "explained_positions",
           "model_call_kwargs", "check_forward_kwargs", "forward_keywords", "check_first_column_is_real",
           "readable_tokenizer_outputs", "real_token_position_ids", "position_ids_as_alone",
           "gets_real_token_position_ids", "registry_spec", "rows_as_alone_call", "learned_position_table",
           "refuse_left_padding_shifting_positions", "explained_outputs_only", "logits_at_positions",
           "padded_float64_nan_cause", "non_finite_embedding_cause", "refuse_inputs_on_another_device", "refuse_nan_logits", "forward_parameters",
           "padding_named_as_tokenizers"]


@dataclass(frozen=True)
class TextPoint:
    """Where contributions are taken: ``module``'s input or output, described in words."""

    module: nn.Module
    where: str
    description: str


def text_attribution_point(model: nn.Module, spec: ArchitectureSpec | None = None) -> TextPoint:
    """The attribution point of a supported transformers model (module docstring)."""
    spec = spec or spec_for(model)
    refuse_stock_loaded_bcos(model)
    bcos = has_dynamic_weights(model)
    module, where = spec.embedding_module(model)
    path = spec.embedding_point[0]
    if not bcos and where == "input" and isinstance(module, nn.LayerNorm):
        return TextPoint(module, "output", f"output of {path} (stock model: after the embedding LayerNorm, "
                                           "where input x gradient is not zero)")
    if spec.kind == "decoder" and where == "output":
        what = "token embeddings (positions enter through rotary query/key)"
    else:
        what = "combined embedding (word + position" + (" + token type" if spec.kind == "encoder" else "") + ")"
    return TextPoint(module, where, f"{what}, {where} of {path}")


def explained_positions(spec: ArchitectureSpec, position, attention_mask: Int[Tensor, "batch pos"], *,
                        how_to_pass: str = "position=", mask_checked: bool = False,
                        padded: bool | None = None) -> Int[Tensor, " batch"]:
    """The position per row whose output a text model without a classification head explains, the one rule of
    every path (``explain``, Captum's ``EmbeddingForward`` and ``LayerBcos``): ``position`` as
    :func:`~bcos_plugins.attribution.resolve_positions` reads it; left out, each row's last real token for
    decoders (the next-token prediction) and first real token for encoder base models (the [CLS] state).

    A masked LM predicts a token at every position and none of them is the natural one (usually the [MASK]
    token's is meant, wherever it is), so it has no default: a guessed position would explain another
    prediction than the user's without a word. ``how_to_pass`` names how the caller's path takes a position;
    ``mask_checked``: the mask passed :func:`check_token_inputs` (every row has a real token, not checked again);
    ``padded``: :func:`token_inputs_and_padding`'s flag (``False``: no row is padded, see
    :func:`~bcos_plugins.attribution.resolve_positions`).
    """
    if position is None and spec.head == "masked_lm":
        raise argument_error(
            "position", "a masked LM predicts a token at every position and none is the default one to explain",
            f"Pass {how_to_pass} the index of the token whose prediction to explain, e.g. the [MASK] token's: "
            "(input_ids == tokenizer.mask_token_id).int().argmax(1)")
    return resolve_positions(position, attention_mask, default="last" if spec.kind == "decoder" else "first",
                             mask_checked=mask_checked, padded=padded)


def check_token_inputs(model: nn.Module, input_ids, attention_mask) -> tuple[Tensor, Tensor | None]:
    """The package's token-batch check (:func:`~bcos_plugins._checks.require_token_batch`) against ``model``'s
    vocabulary (:func:`~bcos_plugins.convert.architectures.vocabulary_size`) and position limit
    (:func:`~bcos_plugins.convert.architectures.position_limit`); returns the ids and mask as normal (not
    inference-mode) int64 tensors."""
    return token_inputs_and_padding(model, input_ids, attention_mask)[:2]


def token_inputs_and_padding(model: nn.Module, input_ids,
                             attention_mask) -> tuple[Tensor, Tensor | None, bool | None]:
    """:func:`check_token_inputs`' ids and mask, and whether the batch is padded (``False``: no mask or all ones;
    ``None``: not known, see :func:`~bcos_plugins._checks.token_batch_and_padding`), read in the check's one sync.

    Without a mask, a batch whose rows look padded with ``config.pad_token_id`` (rows of different lengths) is
    explained as given but warned about (:class:`~bcos_plugins.errors.UnmaskedPaddingWarning`): the explanation is
    exact for ``model(ids)``, the padding attended to as tokens, which is rarely the input meant (transformers 5 no
    longer warns). A warning, not a refusal: a batch of texts that end or start with the pad id is valid input."""
    refuse_inputs_on_another_device(model, input_ids, attention_mask)
    limit = position_limit(model)
    input_ids, attention_mask, padded = token_batch_and_padding(
        input_ids, attention_mask, vocab_size=vocabulary_size(model), max_length=limit.max_length,
        limit_name=limit.source, **unmasked_padding_keywords(getattr(model, "config", None), attention_mask))
    return (outside_inference(input_ids), None if attention_mask is None else outside_inference(attention_mask),
            padded)


def refuse_inputs_on_another_device(model: nn.Module, input_ids, attention_mask) -> None:
    """Refuse ids or a mask on another device than ``model``'s input embeddings (a model moved to a GPU, its
    tokenizer's tensors left on the CPU), naming the move: the call failed deep inside the embedding lookup with
    torch's "Expected all tensors to be on the same device" (or an autocast error), naming neither argument. A meta
    tensor is left to the token check, which refuses it in its own words. The one device check of the ids: explain's
    token check and perturbation_curves' (which takes any callable: one without input embeddings is not checked)."""
    try:
        embeddings = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    except NotImplementedError:  # a transformers model that does not say where its input embeddings are
        embeddings = None
    weight = getattr(embeddings, "weight", None)
    if not isinstance(weight, Tensor):
        return
    for name, given in (("input_ids", input_ids), ("attention_mask", attention_mask)):
        if isinstance(given, Tensor) and not given.is_meta and given.device != weight.device:
            # a model on the meta device has no weights: moving the inputs there would not help
            unloaded = (" (shapes without values: the model's weights were never loaded; load them first, "
                        "e.g. model.to_empty(device='cpu') and then load_state_dict)") if weight.is_meta else ""
            raise argument_error(name, f"is on {given.device}, but the model's input embeddings are on "
                                 f"{weight.device}{unloaded}", f"Move the inputs to the model's device: "
                                 f"{name}.to(model.device) (enc = tokenizer(...).to(model.device) moves every tensor "
                                 "at once)")


def forward_keywords(model: nn.Module) -> set[str] | None:
    """The keyword arguments ``model``'s forward reads: its named parameters, plus the keywords transformers
    passes down through ``**kwargs`` (``TransformersKwargs``); ``None`` if its signature cannot be read. A
    ``torch.compile(model)`` wrapper's forward takes ``(*args, **kwargs)``: the compiled model's is read
    (:func:`~bcos_plugins.convert.architectures.uncompiled`)."""
    parameters = forward_parameters(model)
    if parameters is None:
        return None
    names = {n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        from transformers.utils.generic import TransformersKwargs

        names |= set(TransformersKwargs.__annotations__)
    return names | _decorator_keywords(uncompiled(model).forward)


def _decorator_keywords(forward) -> set[str]:
    """``{"return_dict"}`` where a decorator of ``forward`` reads it (transformers' ``can_return_tuple`` and
    ``capture_outputs`` pop it from ``**kwargs``, defaulting to ``config.return_dict``), else empty: the signature
    shown through ``functools.wraps`` is the wrapped forward's, which does not name it."""
    function = getattr(forward, "__func__", forward)
    while (wrapped := getattr(function, "__wrapped__", None)) is not None:
        if "return_dict" in getattr(getattr(function, "__code__", None), "co_consts", ()):
            return {"return_dict"}
        function = wrapped
    return set()


def _passes_return_dict_on(forward) -> bool:
    """Whether ``forward`` (unwrapped from its decorators) passes ``return_dict=`` by keyword in a call of its own: a
    keyword call's names are a tuple among the code's constants."""
    function = getattr(forward, "__func__", forward)
    while (wrapped := getattr(function, "__wrapped__", None)) is not None:
        function = wrapped
    constants = getattr(getattr(function, "__code__", None), "co_consts", ())
    return any(isinstance(c, tuple) and "return_dict" in c for c in constants)


def require_head_output_object(model: nn.Module) -> None:
    """Refuse a model whose ``config.return_dict`` is False where its head cannot run with it: transformers 5.24's
    decoder heads (GPT-2, Llama, Mistral, Qwen2/3, Gemma 2) and ModernBERT's classifier call their base model without
    ``return_dict``, so it follows the config and returns a tuple, and the head reads ``.last_hidden_state`` (or
    ``.hidden_states``) of it: an AttributeError from inside transformers that names neither the config nor the fix,
    whatever the call passes (the head's decorator takes ``return_dict`` for itself). A head that passes
    ``return_dict`` on (BERT, DistilBERT, RoBERTa) runs, and is called with ``return_dict=True``
    (:func:`with_output_object`). docs/hosts/upstream-issues.md#transformers-return-dict-false."""
    if getattr(getattr(model, "config", None), "return_dict", True) is not False:
        return  # (first: every path calls this once per model call)
    model = uncompiled(model)
    base = getattr(model, "base_model", None)
    if (not isinstance(base, nn.Module) or base is model
            or "return_dict" not in _decorator_keywords(uncompiled(base).forward)
            or _passes_return_dict_on(type(model).forward)):
        return
    raise argument_error(
        "model", f"{type(model).__name__}'s config.return_dict is False, and its forward calls its "
        f"{type(base).__name__} without return_dict, so that returns a tuple and the head fails reading an output "
        "field of it (AttributeError inside transformers, whatever return_dict the call passes)",
        "Set model.config.return_dict = True (return_dict=False in a call of your own still gives the tuple; "
        "docs/hosts/upstream-issues.md#transformers-return-dict-false)")


def with_output_object(model, call: dict) -> dict:
    """``call`` with ``return_dict=True`` where ``model``'s forward reads it (:func:`forward_keywords`), its
    ``config.return_dict`` is not already True and the caller did not pass it: with ``config.return_dict = False`` the
    model returns a tuple, and every caller reads the output's ``.logits``: a ``return_dict`` other than True passed
    by the caller is refused, and so is a model whose head fails on its config's False
    (:func:`require_head_output_object`)."""
    if "return_dict" in call and call["return_dict"] is not True:
        raise argument_error("return_dict", f"got {call['return_dict']!r}; the paths of bcos_plugins read the model's "
                             "output object (its .logits), which return_dict=False replaces by a tuple",
                             "leave return_dict out (or pass True); to get a tuple, call the model yourself")
    if isinstance(model, nn.Module):
        require_head_output_object(model)
    if ("return_dict" not in call and isinstance(model, nn.Module)
            and getattr(getattr(model, "config", None), "return_dict", None) is not True
            and "return_dict" in (forward_keywords(model) or ())):
        call["return_dict"] = True
    return call


def readable_tokenizer_outputs(encoding, readable: set[str] | None) -> dict:
    """The tokenizer outputs of ``encoding`` besides ``input_ids`` and ``attention_mask`` that a forward reading
    ``readable`` (:func:`forward_keywords`, computed once per model; ``None``: unknown, all kept) takes. What a
    tokenizer returns by default and the forward does not read (a BERT tokenizer's ``token_type_ids`` for a
    DistilBERT or a Llama) is left out, as the model's own tokenizer would not return it."""
    return {k: v for k, v in encoding.items()
            if k not in ("input_ids", "attention_mask") and (readable is None or k in readable)}


# what a tokenizer returns beside the model's inputs (its return_* options), each with what it is and what to do with
# it: ``explain(model, **enc)`` passes them on as forward keywords
_TOKENIZER_BOOKKEEPING = {
    "overflow_to_sample_mapping": (
        "the text each row (window) came from (return_overflowing_tokens=True)",
        ": each window is a row of the batch and is explained as its own row; keep the mapping to join each text's "
        "windows' rows afterwards"),
    "offset_mapping": ("each token's character span in its text (return_offsets_mapping=True)",
                       "; keep it to map the explanation's token scores to characters"),
    "special_tokens_mask": ("which tokens the tokenizer added (return_special_tokens_mask=True)",
                            "; keep it to leave those tokens out of the explanation's scores"),
    "length": ("each row's token count (return_length=True)", ""),
    "num_truncated_tokens": ("how many tokens truncation cut from each text (return_overflowing_tokens=True)",
                             "; pass a larger max_length (or split the texts) to explain every token"),
}


def check_forward_kwargs(model: nn.Module, forward_kwargs: dict) -> None:
    """Refuse keyword arguments the model's forward does not read: transformers 5 passes unknown keywords down
    to the attention functions, which drop them, so a typo (``token_type_id=``) would be silently ignored and
    the explanation would be of another input than the user meant."""
    if not forward_kwargs:  # nothing to check, so no signature to read (forward_parameters)
        return
    known = forward_keywords(model)
    if known is None:
        return
    for name in forward_kwargs:
        if name in known:
            continue
        if name == "rationale_mask":
            if any(getattr(m, "rationale_guidance", None) is not None for m in model.modules()):
                continue  # a guided model's own guard refuses it at evaluation, naming it
            raise argument_error("rationale_mask", f"{type(model).__name__} has no guided layer, so the gold mask "
                                 "would be silently ignored (and gold masks are a training-time input only)",
                                 "Drop it from explanation and evaluation calls; to train with it, call "
                                 "bcos_plugins.guide_attention(model) first", kind=BcosTypeError)
        if name in _TOKENIZER_BOOKKEEPING:
            # a tokenizer's own output passed on with **enc: the refusal named it without the fix (length= was
            # even pointed at max_length_q=, an attention kernel's argument)
            what, fix = _TOKENIZER_BOOKKEEPING[name]
            raise argument_error(name, f"is {what}, returned by the tokenizer; "
                                 f"{type(uncompiled(model)).__name__}.forward does not read it (it would be silently "
                                 "ignored)", f"Drop it before the call (enc.pop({name!r})){fix}", kind=BcosTypeError)
        hint = closest_name_fix(name, known, f"It reads {', '.join(sorted(known))}")
        raise argument_error(name, f"is not an argument of {type(uncompiled(model)).__name__}.forward, which would "
                             "silently ignore it", hint, kind=BcosTypeError)
    _check_token_type_ids(model, forward_kwargs.get("token_type_ids"))


def _check_token_type_ids(model: nn.Module, token_type_ids) -> None:
    """Refuse segment ids outside the model's token-type table, naming the table's size: the embedding lookup fails
    with a bare ``IndexError: index out of range in self`` that names neither the argument nor the limit."""
    types = getattr(getattr(uncompiled(model), "config", None), "type_vocab_size", None)
    if not isinstance(token_type_ids, Tensor) or type(types) is not int or token_type_ids.numel() == 0:
        return
    if token_type_ids.is_floating_point() or token_type_ids.is_complex():
        raise argument_error("token_type_ids", f"is a {token_type_ids.dtype} tensor; segment ids are integers",
                             "Pass integer segment ids (torch.long), e.g. the tokenizer's token_type_ids")
    _refuse_ids_outside_table("token_type_ids", token_type_ids, types, "segment types (config.type_vocab_size)",
                              "Pass the segment ids the model's tokenizer gives (0 for the first text, 1 for a "
                              "pair's second where the model has two types)")


def _refuse_ids_outside_table(name: str, ids: Tensor, rows: int, table: str, fix: str) -> None:
    """Refuse per-token ids (segment ids, position ids; integer, not empty) outside an embedding table of ``rows``
    rows, ``table`` naming it with its config field: the lookup fails with a bare ``IndexError: index out of range in
    self`` (a device-side assert on a GPU) that names neither the argument nor the limit. Both ends are read back in one
    transfer, only when such ids are given."""
    low, high = torch.stack(torch.aminmax(ids)).long().tolist()
    if low < 0 or high >= rows:
        raise argument_error(name, f"holds {low if low < 0 else high}, outside the model's {rows} {table}, 0 to "
                             f"{rows - 1}", fix)


# Keywords a forward reads that make its output another than the explained one, without an error from transformers:
# keyword -> (the int value that changes nothing, or None; the problem; the fix)
_OTHER_OUTPUT_KEYWORDS = {
    "logits_to_keep": (0, "makes the model compute the logits of the last columns only, so the logits at the "
                       "explained position (a column of input_ids) would be read from another column",
                       "Leave it out (explain reads the logits of the explained position only)"),
    **{name: (None, "holds keys and values of earlier tokens computed outside the explanation: their share of the "
              "explained value would be missing, and the positions of input_ids would restart at 0 after them",
              "Pass the whole sequence (the earlier tokens included) as input_ids, without a cache")
       for name in ("cache", "past_key_values")},
    # the paths call the model on input_ids (explain takes its contributions from their embeddings): transformers
    # refuses both ("You must specify exactly one of input_ids or inputs_embeds"), which points at dropping input_ids
    "inputs_embeds": (None, "would replace the embeddings of input_ids, which every path calls the model on (explain "
                      "takes its contributions from them; the model refuses both)",
                      "Pass the token ids as input_ids alone; to attribute to embeddings of your own, use the Captum "
                      "adapter's EmbeddingForward(model), whose forward takes them"),
}


def _check_explained_output_kwargs(forward_kwargs: dict) -> None:
    """Refuse forward keywords that make the model compute another output than the one explained (a slice of the
    logits, a continuation of a cached prefix): the numbers would be of another position or input."""
    for name, (neutral, problem, fix) in _OTHER_OUTPUT_KEYWORDS.items():
        value = forward_kwargs.get(name)
        if value is None or (type(value) is int and value == neutral):
            continue
        got = repr(value) if type(value) is int else f"a {type(value).__name__}"
        raise argument_error(name, f"{problem} (got {got})", fix)


# function -> (its __code__, whether it was read bound, its signature's parameters or None): see forward_parameters
_FORWARD_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def forward_parameters(model) -> Mapping[str, inspect.Parameter] | None:
    """The parameters of ``model``'s forward as ``inspect.signature`` reads them (``self`` not included), or ``None``
    if it cannot be read: the one reading of a forward's signature (:func:`forward_keywords`,
    :func:`gets_real_token_position_ids`, the Captum adapter's test for a text model). A ``torch.compile(model)``
    wrapper's forward takes ``(*args, **kwargs)``: the compiled model's is read
    (:func:`~bcos_plugins.convert.architectures.uncompiled`).

    Remembered per forward function (a bound method's ``__func__``, the same object at every call), not per model: the
    signature is a property of that function alone, so a forward replaced on the model or its class is another key, and
    one whose ``__code__`` was swapped is read again (so is a function read once bound and once as a plain attribute,
    whose signatures differ by ``self``). ``inspect.signature`` follows transformers' decorators through ``__wrapped__``
    (30-40 us per call, twice per ModernBERT ``explain``: about a tenth of its own work outside the model at 4 x 32
    tokens; docs/benchmarks.md, 2026-11-28 07:42 UTC)."""
    forward = uncompiled(model).forward
    function = getattr(forward, "__func__", forward)
    code, bound = getattr(function, "__code__", None), function is not forward
    try:
        known = _FORWARD_PARAMETERS.get(function)
    except TypeError:  # not weakly referenceable (or not hashable): read every time
        known = None
    if known is not None and known[0] is code and known[1] is bound:
        return known[2]
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        parameters = None
    try:
        _FORWARD_PARAMETERS[function] = (code, bound, parameters)
    except TypeError:
        pass
    return parameters


def _forward_takes_position_ids(model: nn.Module) -> bool:
    """Whether ``model``'s forward names ``position_ids`` (:func:`forward_parameters`; not :func:`forward_keywords`:
    transformers' ``**kwargs`` annotation lists ``position_ids`` for every model, read or not)."""
    return "position_ids" in (forward_parameters(model) or ())


def gets_real_token_position_ids(model: nn.Module, spec: ArchitectureSpec) -> bool:
    """Whether a registry model is given position ids counting real tokens (:func:`position_ids_as_alone`), the one
    predicate of both that function and the refusal of left padding (:func:`check_first_column_is_real` refuses it
    for a learned position table that is not given them).

    Decoders get them (rotary or not, as ``generate`` does), and encoders whose forward takes ``position_ids``: those
    with a learned position table (BERT, DistilBERT, RoBERTa) and rotary ones (ModernBERT). Rotary attention scores
    depend on the distance between two tokens only in exact arithmetic: transformers computes the rotary tables in
    float32, so a left-padded row's shifted positions changed a float64 ModernBERT's numbers by float32's rounding
    (1e-8 of the row alone's) where the ids counting real tokens give the row alone's to float64's.
    """
    return spec.kind == "decoder" or _forward_takes_position_ids(model)


def position_ids_as_alone(model: nn.Module, spec: ArchitectureSpec, attention_mask: Int[Tensor, "batch pos"], *,
                          padded: bool | None = None,
                          input_ids: Int[Tensor, "batch pos"] | None = None) -> Int[Tensor, "batch pos"] | None:
    """The position ids :func:`model_call_kwargs` passes (and the Space model gives its encoder) so that every row of
    a padded batch is computed as alone (:func:`real_token_position_ids`), or ``None`` where none are needed
    (:func:`gets_real_token_position_ids`) or where the caller knows the batch is not padded (``padded=False``) and
    the model's forward counts its own positions from the first column (every registry class but RoBERTa's, whose
    table counts from the padding index over the ids that are not ``pad_token_id``): its default ids are then
    :func:`real_token_position_ids`' for every row, as one row broadcast, and a learned table's rows or rotary tables
    (each position times the frequencies, elementwise) of them have the same bits. At 4 x 32 tokens the call-building
    step takes 3-5 us instead of 10-16 and whole ``explain`` calls 0.990-1.001 of before, within what the runs resolve
    (docs/benchmarks.md); tests/test_explain_unpadded_shortcuts.py holds the bits. ``input_ids``: the batch's ids, which
    a table counted from the padding index reads (:func:`real_token_position_ids`)."""
    table = spec.position_table
    if padded is False and not (table is not None and table.after_padding):
        return None
    if gets_real_token_position_ids(model, spec):
        return real_token_position_ids(spec, getattr(model, "config", None), attention_mask, input_ids=input_ids)
    return None


def real_token_position_ids(spec: ArchitectureSpec, config, attention_mask: Int[Tensor, "batch pos"], *,
                            input_ids: Int[Tensor, "batch pos"] | None = None) -> Int[Tensor, "batch pos"]:
    """Position ids under which every row of a padded batch is computed as it would be alone: real tokens count
    from the row's first real token (:func:`~bcos_plugins.attribution.real_token_positions`), from
    ``config.pad_token_id + 1`` where the position table counts from the padding index (RoBERTa, whose own ids
    count the tokens that are not ``pad_token_id``, so padding written with another id shifted them); padding
    gets the table's padding row (the model never attends to it).

    There, given ``input_ids``, a token of id ``pad_token_id`` that the mask calls real (a ``"<pad>"`` in the text, or
    unmasked padding) is not counted either and gets the padding row, as the model's own forward places it: it was
    counted, so it and every later token sat one row further down the table than in ``model(ids, mask)`` (a RoBERTa
    logit 0.722 against the model's 0.624, complete and silent)."""
    table = spec.position_table
    if table is None or not table.after_padding:
        return real_token_positions(attention_mask)
    pad = getattr(config, "pad_token_id", None) or 0
    counted = attention_mask.bool() if input_ids is None else attention_mask.bool() & (input_ids != pad)
    positions = real_token_positions(counted.to(attention_mask.dtype))
    return torch.where(counted, positions + pad + 1, torch.full_like(positions, pad))


# the padding side of the tokenizer a path padded its caller's texts with (padding_named_as_tokenizers), else None
_CALLERS_PADDING_SIDE: ContextVar[str | None] = ContextVar("_CALLERS_PADDING_SIDE", default=None)


@contextmanager
def padding_named_as_tokenizers(tokenizer) -> Iterator[None]:
    """Inside it, a refusal of left padding (:func:`check_first_column_is_real`,
    :func:`refuse_left_padding_shifting_positions`) names ``tokenizer``'s padding side, not ``attention_mask``: the
    one way a path that pads its caller's texts itself (``explain_dataset``, ``predict`` / ``accuracy``,
    ``fine_tune_classifier``) names what its caller passed; its refusal named ``attention_mask``, an argument the
    caller never passed."""
    token = _CALLERS_PADDING_SIDE.set(str(getattr(tokenizer, "padding_side", "")))
    try:
        yield
    finally:
        _CALLERS_PADDING_SIDE.reset(token)


def _left_padding_error(rows: Tensor, problem: str, fix: str) -> BcosValueError:
    """The refusal of rows that start with padding (``rows``: a boolean per row), naming ``attention_mask`` or, inside
    :func:`padding_named_as_tokenizers`, the tokenizer's padding side."""
    verb = "starts" if int(rows.sum()) == 1 else "start"
    side = _CALLERS_PADDING_SIDE.get()
    if side is None:
        return argument_error("attention_mask", f"{bad_rows(rows)} {verb} with padding, and {problem}", fix)
    # a callable without padding_side (or one that says otherwise) is named by what its rows show
    says = " (tokenizer.padding_side='left')" if side == "left" else ""
    return argument_error("tokenizer", f"pads on the left{says}, so {bad_rows(rows)} {verb} with padding, and "
                          f"{problem}", fix)


def check_first_column_is_real(model: nn.Module, attention_mask: Int[Tensor, "batch pos"] | None,
                               spec: ArchitectureSpec | None = None) -> None:
    """Refuse left padding where it would change a row's numbers, the one check of left padding:

    - where the classifier reads the first column's hidden state (the registry's ``first_column_pooling``: BERT,
      DistilBERT, RoBERTa, ModernBERT with ``classifier_pooling="cls"``): on a left-padded row that is a padding
      token's, so the logits are not the row's (they change with the padding);
    - where the positions come from a learned table (the registry's ``position_table``: BERT, DistilBERT,
      RoBERTa) and the forward takes no ``position_ids``: positions would count from the padded first column.
      Every such class of transformers >= 5.9 takes them, and :func:`model_call_kwargs` passes ids that count
      real tokens (:func:`real_token_position_ids`), so a base model or masked LM explains a left-padded row as
      it explains the row alone; this refusal guards a forward that cannot be given them.

    Decoders and rotary encoders (ModernBERT: attention depends on distances only) are not refused.

    The one check of every path that runs a classifier on a padded batch: ``explain`` and the adapters (through
    :func:`model_call_kwargs`), ``perturbation_curves``, ``predict`` and ``fine_tune_classifier``. ``spec``: the
    model's registry entry when the caller has it; otherwise it is looked up by class name, and a model outside
    the registry (any callable a metric takes) is not checked. The error names the rows through
    :func:`~bcos_plugins._checks.bad_rows`: a path that batches its caller's texts in another order or in chunks
    wraps its call (or :func:`model_call_kwargs`') in :func:`~bcos_plugins._checks.rows_named_as`.
    """
    if attention_mask is None or attention_mask.ndim != 2 or attention_mask.shape[1] == 0:
        return
    spec = spec if spec is not None else registry_spec(model)
    if spec is None:
        return
    first_column = spec.classifies_from_first_column(getattr(model, "config", None))
    if not first_column and (spec.position_table is None or gets_real_token_position_ids(model, spec)):
        return
    # the first column read on the host (the one sync, no kernel: a classifier pays this on every explain call)
    if not any(value == 0 for value in attention_mask[:, 0].tolist()):
        return
    padded_first = attention_mask[:, 0] == 0
    if first_column:
        setting = (f" with config.{spec.first_column_pooling[0]}={spec.first_column_pooling[1]!r}"
                   if isinstance(spec.first_column_pooling, tuple) else "")
        problem = (f"{architecture_name(model)}{setting} classifies from the first column's hidden state, a padding "
                   "token's there (the logits, and so any explanation or score of them, are not the row's)")
    else:
        problem = (f"{architecture_name(model)} reads its position embeddings from a table counted from the first "
                   "column and its forward takes no position_ids to count real tokens instead, so the row's "
                   "positions (and every number of it) would be shifted by its padding")
    raise _left_padding_error(padded_first, problem, "Pad on the right (tokenizer.padding_side = 'right')")


def _check_per_token_ids(model: nn.Module, spec: ArchitectureSpec, input_ids: Int[Tensor, "batch pos"],
                         forward_kwargs: dict) -> None:
    """Refuse ``token_type_ids`` / ``position_ids`` given by the caller that do not fit the batch: not a tensor, not
    integers (position ids; segment ids are checked by :func:`check_forward_kwargs`), not one entry per token
    (``(batch, pos)``, or one row for every row: ``(1, pos)`` or ``(pos,)`` for segment ids, which transformers
    broadcasts), or position ids outside a learned position table (its ``config`` rows). Each failed inside the model
    with torch's words, naming neither the argument nor the fix (a size mismatch, "embedding(): argument 'indices' must
    be Tensor, not list", an index out of bounds: a device-side assert on a GPU)."""
    batch, length = input_ids.shape
    for name, what in (("token_type_ids", "segment id"), ("position_ids", "position")):
        value = forward_kwargs.get(name)
        if value is None:
            continue
        if not isinstance(value, Tensor):
            raise argument_error(name, f"is a {type(value).__name__}, not a tensor", f"Pass a tensor of one {what} per "
                                 f"token, e.g. torch.tensor({name})", kind=BcosTypeError)
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise argument_error(name, f"is a {value.dtype} tensor; {what}s are integers",
                                 f"Pass integer {what}s (torch.long)", kind=BcosTypeError)
        # position ids index one row per batch row (a 1-d tensor failed inside the model's gather); segment ids of
        # (pos,) broadcast like (1, pos)
        one_d = value.ndim == 1 and name == "token_type_ids"
        if not (one_d or value.ndim == 2) or value.shape[-1] != length or (value.ndim == 2
                                                                           and value.shape[0] not in (1, batch)):
            raise argument_error(name, f"has shape {tuple(value.shape)} for input_ids of shape {(batch, length)}",
                                 f"Pass one {what} per token: ({batch}, {length}), or (1, {length}) for every row")
    positions, table = forward_kwargs.get("position_ids"), spec.position_table
    rows = getattr(getattr(model, "config", None), table.size_key, None) if table is not None else None
    if positions is not None and type(rows) is int and positions.numel():
        _refuse_ids_outside_table("position_ids", positions, rows, f"positions (config.{table.size_key})",
                                  "Leave position_ids out (explain counts each row's real tokens from 0), or pass "
                                  "positions inside the table")


def _attention_window(config) -> int | None:
    """The sliding (local) attention window of a registry model, ``config.sliding_window``, where a layer attends
    within it (``config.layer_types`` lists ``"sliding_attention"``: Gemma 2, ModernBERT's local layers, Qwen2 with
    ``use_sliding_window``; Mistral's config has no layer types and slides in every layer), else ``None``."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if type(window) is not int or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return window


def _refuse_padding_between_tokens_in_a_window(model: nn.Module, attention_mask: Tensor | None) -> None:
    """Refuse a row with padding between its real tokens (a 0 of the mask inside the row) where the model attends
    within a sliding window (:func:`_attention_window`) shorter than the row: the window counts columns, the padding
    ones included, while the position ids count real tokens (:func:`real_token_position_ids`), so such a row was
    computed as neither the row alone nor the row with its padding as tokens (0.46 against 0.53 alone on a tiny
    Mistral, complete and silent). Padding at a row's start or end does not move the distances between its real
    tokens; a model without a window computes a row with inner padding as the row alone. One sync, for a padded batch
    of such a model only."""
    window = _attention_window(getattr(model, "config", None))
    if window is None or attention_mask is None or attention_mask.shape[1] <= window:
        return
    first = attention_mask.to(torch.long).argmax(1)
    span = attention_mask.shape[1] - attention_mask.flip(1).to(torch.long).argmax(1) - first
    # a row whose real tokens span more columns than it has real tokens has padding between them; within the window's
    # width every pair of its tokens is inside the window either way
    inner = (attention_mask.sum(1) < span) & (span > window)
    if not bool(inner.any()):
        return
    one = int(inner.sum()) == 1
    raise argument_error(
        "attention_mask", f"{bad_rows(inner)} {'has' if one else 'have'} padding between real tokens, and "
        f"{architecture_name(model)} attends within a sliding window of config.sliding_window={window} columns: the "
        "window counts the padding columns while the positions count real tokens, so "
        f"{'the row' if one else 'those rows'} would be computed as neither alone nor with the padding as tokens",
        "Pass each row's real tokens next to each other (padding at the start or end only), e.g. "
        "ids[row][mask[row].bool()] padded again")


def model_call_kwargs(model: nn.Module, spec: ArchitectureSpec, input_ids: Int[Tensor, "batch pos"],
                      attention_mask: Int[Tensor, "batch pos"] | None, forward_kwargs: dict, *,
                      padded: bool | None = None) -> dict:
    """Keyword arguments for ``model(...)`` so that every row is computed as it would be alone.

    Decoders and encoders with a learned position table (BERT, DistilBERT, RoBERTa): position ids count real
    tokens (:func:`real_token_position_ids`, as ``generate`` does for decoders), so left padding does not shift
    them (a ``position_ids`` of ``forward_kwargs`` is kept as given).
    Decoder classifiers (GPT-2 / Llama ``ForSequenceClassification``) pick the last token that is not
    ``config.pad_token_id``; padding written with another id would make them read a padding position, so
    padded positions are rewritten to ``pad_token_id`` (the model never attends to them).
    ``padded=False``: the caller's check found no padding (:func:`token_inputs_and_padding`), so the refusal of left
    padding and the decoder classifier's rewrite are skipped without their syncs, and a rotary encoder gets no
    position ids (:func:`position_ids_as_alone`); ``None``: not known.
    """
    if not isinstance(spec, ArchitectureSpec):  # failed with "'NoneType' object has no attribute 'position_table'"
        raise argument_error("spec", f"must be the model's ArchitectureSpec, got {type(spec).__name__}",
                             "Pass spec_for(model) (bcos_plugins.convert.architectures), or call rows_as_alone_call("
                             "model, input_ids, attention_mask), which looks it up", kind=BcosTypeError)
    forward_kwargs = {} if forward_kwargs is None else forward_kwargs
    # first: a cache under transformers' old name (past_key_values, which its forwards still read) was refused as an
    # argument the forward "would silently ignore", naming neither the cause nor the fix
    _check_explained_output_kwargs(forward_kwargs)
    check_forward_kwargs(model, forward_kwargs)
    _check_per_token_ids(model, spec, input_ids, forward_kwargs)
    kwargs = dict(forward_kwargs)
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    if padded is not False:
        check_first_column_is_real(model, attention_mask, spec)
        refuse_length_dependent_rotary(model, mask)
        _refuse_padding_between_tokens_in_a_window(model, attention_mask)
    forget_grown_rotary_frequencies(model)
    position_ids = (None if "position_ids" in kwargs
                    else position_ids_as_alone(model, spec, mask, padded=padded, input_ids=input_ids))
    if position_ids is not None:  # made here, so an inference tensor under the caller's inference_mode
        kwargs["position_ids"] = outside_inference(position_ids)
    if (spec.kind == "decoder" and spec.is_classifier and attention_mask is not None and padded is not False
            and (mask == 0).any()):
        pad = getattr(model.config, "pad_token_id", None)
        if pad is None:
            raise BcosValueError(
                "attention_mask: the batch is padded but the decoder classifier has no config.pad_token_id, "
                "so it cannot find each row's last token. Set model.config.pad_token_id = "
                "tokenizer.pad_token_id (or explain one row at a time)."
            )
        input_ids = outside_inference(torch.where(mask == 0, torch.full_like(input_ids, pad), input_ids))
    if (spec.kind == "decoder" and spec.is_classifier and input_ids.shape[0] > 1
            and getattr(model.config, "pad_token_id", None) is None):
        # an unpadded batch: transformers refuses any batch of more than one row there ("Cannot handle batch sizes > 1 if
        # no padding token is defined"), a message without the fix
        raise BcosValueError(
            f"input_ids: a batch of {input_ids.shape[0]} rows, and the decoder classifier has no config.pad_token_id, "
            "without which transformers cannot find each row's last token (it refuses batches of more than one row). Set "
            "model.config.pad_token_id = tokenizer.pad_token_id (or explain one row at a time).")
    kwargs["input_ids"] = input_ids
    kwargs["attention_mask"] = attention_mask
    return with_output_object(model, kwargs)


def explained_outputs_only(spec: ArchitectureSpec, call: dict, positions: Int[Tensor, " batch"] | None,
                           length: int) -> dict:
    """``call`` (:func:`model_call_kwargs`' keywords) for ``explain``'s forward, so that the model computes no output
    that is not explained (the same explained values; docs/benchmarks.md, 2026-11-28 04:15 UTC, measured 0.88-0.95 of
    before at 4 x 32 for the head, 0.985 for the cache):

    - a decoder builds no key/value cache (``use_cache=False``, unless the caller passed ``use_cache``): nothing reads
      it, and building it cost 1.5 % of a small decoder's explanation (Qwen2, Gemma 2);
    - a causal LM explained at ``positions`` (one column per row of a batch of ``length`` columns) with fewer rows than
      columns runs its LM head on the explained columns only (``logits_to_keep=positions``, read with
      :func:`logits_at_positions`), as ``generate`` runs it on the last one: the other columns' logits are never
      explained (the head maps each column's hidden state alone), and at 4 x 32 tokens, hidden 128 and 1000 tokens the
      head's product with the vocabulary was about a third of the arithmetic. Not with ``labels`` (the model's loss
      reads every column's logits). ``positions`` stay on the device (no sync).
    """
    extra: dict = {}
    if spec.kind == "decoder" and "use_cache" not in call:
        extra["use_cache"] = False
    if (spec.head == "causal_lm" and positions is not None and positions.shape[0] < length
            and "labels" not in call):
        extra["logits_to_keep"] = positions
    return {**call, **extra} if extra else call


def logits_at_positions(outputs: Tensor, positions: Int[Tensor, " batch"], length: int) -> Tensor:
    """Each row's ``outputs`` (logits or hidden states, ``(batch, columns, n)``) at its column of ``positions`` among
    the ``length`` input columns, where ``outputs`` holds every column, or (after :func:`explained_outputs_only`, with
    fewer rows than columns) the columns of ``positions`` in their order, so that row ``i``'s is its ``i``-th. A forward
    that ignored ``logits_to_keep`` returns every column: read as such."""
    if outputs.shape[1] == length:
        return outputs[torch.arange(outputs.shape[0], device=outputs.device), positions]
    if outputs.shape[1] == outputs.shape[0] < length:
        # outputs[rows, rows] as the diagonal's copy: the same values and layout without building the row indices or
        # an index kernel (this function 44 -> 38 us per explain of a 2-layer Qwen2 with 1000 logits;
        # docs/benchmarks.md, 2026-11-28 07:42 UTC)
        return outputs.diagonal(dim1=0, dim2=1).T.contiguous()
    raise BcosRuntimeError(f"the model returned {outputs.shape[1]} columns of outputs for {length} input columns and "
                           f"{outputs.shape[0]} explained positions; explain reads the logits of every row's explained "
                           "position (all columns, or logits_to_keep's one per row).")


def padded_float64_nan_cause(dtype: torch.dtype, attention_mask: Tensor | None, fix: str, *,
                             masked: str = "the batch is padded") -> str:
    """The likely cause of a NaN output of a float64 model on a padded batch, as a sentence ending with ``fix`` (what
    the caller's user should do), or "" where it does not apply (another dtype, or no padding). Built on a failure
    only (it reads the mask).

    transformers' eager attention (Gemma 2's default: its scores are soft-capped) computes the softmax in float32, where
    the float64 mask value ``finfo(float64).min`` is -inf: a query whose keys are all masked (a padding position of a
    left-padded row, or one beyond a sliding window on a right-padded row) gets NaN, and the next layer spreads it to
    every token of the row (a zero attention weight times NaN is NaN). In float32 the same row is finite. ``masked``
    says how the caller's mask holds zeros (``perturbation_curves`` removes tokens through it)."""
    if dtype != torch.float64 or attention_mask is None or not bool((attention_mask == 0).any()):
        return ""
    return (f"The model runs in float64 and {masked}: attention that computes its softmax in float32 "
            "(transformers' eager attention, Gemma 2's default) turns the float64 mask value into -inf, so a padding "
            "position whose keys are all masked (left padding, or right padding beyond a sliding window) gets NaN, "
            f"which the next layer spreads to the real tokens. {fix}")


def non_finite_embedding_cause(model, input_ids, attention_mask: Tensor | None) -> str:
    """The sentence naming the padding token of ``input_ids`` (an id at masked positions only, or
    ``config.pad_token_id``) when its input embedding row is NaN or infinite, or "" (built on a failure only: it reads
    the ids and the rows). Its positions are masked, but a masked key's attention weight 0 times its NaN value is NaN,
    so every padded row's output was NaN and the refusal pointed at the rows' tokens without saying that the one broken
    row is the padding's embedding (a real token's broken row keeps that message, which fits it)."""
    embeddings = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    weight = getattr(embeddings, "weight", None)
    if not isinstance(weight, Tensor) or not isinstance(input_ids, Tensor) or input_ids.is_floating_point():
        return ""
    with torch.no_grad():
        ids = input_ids.to(weight.device).unique()
        ids = ids[(ids >= 0) & (ids < weight.shape[0])]
        bad = set(ids[~torch.isfinite(weight[ids]).all(-1)].tolist())
        if not bad:
            return ""
        real = input_ids if attention_mask is None else input_ids[attention_mask.to(input_ids.device) != 0]
        real_ids = set(real.unique().tolist())
    pad_token_id = getattr(getattr(model, "config", None), "pad_token_id", None)
    # the padding: an id at masked positions only, or the config's padding id (unmasked padding is attended to)
    padding = sorted(i for i in bad if i not in real_ids or i == pad_token_id)
    if not padding:  # a real token's row: the generic message, which points at the rows' tokens, says it
        return ""
    row = "model.get_input_embeddings().weight"
    return (f"The padding token's input embedding ({row}[{padding[0]}]"
            f"{', ids ' + str(padding[:8]) if len(padding) > 1 else ''}) is NaN or infinite: padding positions are "
            "masked, but a masked key's attention weight 0 times NaN is NaN, so every padded row becomes NaN. Set that "
            f"row to finite values ({row}.data[{padding[0]}] = 0) or pad with another id.")


def refuse_nan_logits(who: str, nan: Tensor, row_names: Sequence[int], noun: str, dtype: torch.dtype,
                      attention_mask: Tensor | None, fix: str, *, what: str = "NaN",
                      masked: str = "the batch is padded", model=None, input_ids: Tensor | None = None) -> None:
    """Refuse a batch whose rows ``nan`` (a ``(batch,)`` boolean) have NaN logits, naming them by ``row_names`` (the
    caller's index of each batch row, each named once; ``noun`` says what they are) and the float64 + padding cause
    where it applies (:func:`padded_float64_nan_cause`, ending with the sentence ``fix``; ``masked`` says how the mask
    holds zeros): a NaN score would be returned as one, and an arg-max read as class 0. ``what``: what the rows hold
    (``"NaN or infinite"`` where the caller refuses infinite logits too). ``model`` and ``input_ids``: name an input
    embedding row of the batch's tokens that is NaN or infinite (:func:`non_finite_embedding_cause`), the padding's
    above all. One sync when every row is finite."""
    if not bool(nan.any()):
        return
    named = list(dict.fromkeys(row_names[int(i)] for i in nan.nonzero().flatten()))
    cause = " ".join(part for part in (non_finite_embedding_cause(model, input_ids, attention_mask),
                                        padded_float64_nan_cause(dtype, attention_mask, fix, masked=masked)) if part)
    raise BcosValueError(f"{who}: the model's logits are {what} for {noun} {named[:8]}"
                         f"{', ...' if len(named) > 8 else ''}. " + (cause or "Check their inputs, the embedding rows of their tokens and the weights (an "
                                 "input or weight of NaN, inf or a huge value overflows inside the model)."))


def registry_spec(model) -> ArchitectureSpec | None:
    """``model``'s entry in the architecture registry, looked up by its class name (:func:`architecture_name`, which
    reads through a ``torch.compile(model)`` wrapper: a compiled registry model is called as the model itself), or
    ``None`` for a model outside it or any callable that is not a module (a metric takes any function)."""
    if not isinstance(model, nn.Module):
        return None
    refuse_stock_loaded_bcos(model)  # predict, the metrics and fine-tuning look their model up here
    return SPECS.get(architecture_name(model))


def learned_position_table(model: nn.Module) -> nn.Embedding | None:
    """The learned position table of a model outside the registry, found by its name (the first ``nn.Embedding``
    whose own name holds "position" or is ``wpe``: BERT's and ELECTRA's ``position_embeddings``, OPT's
    ``embed_positions``, GPT-Neo's ``wpe``), or ``None`` (rotary, ALiBi or relative positions: no table whose rows a
    shift by left padding would change)."""
    for name, module in model.named_modules():
        own_name = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Embedding) and ("position" in own_name or own_name == "wpe"):
            return module
    return None


def _causal_lm_gets_position_ids(model: nn.Module, causal_lm: bool) -> bool:
    """``generate``'s rule for a causal LM outside the registry whose forward names ``position_ids`` (the caller
    checks that): a model transformers generates with (not an encoder-decoder), or any model its caller reads
    next-token logits of (``causal_lm``), gets ids counting real tokens from the mask. Except a position table with a
    padding row (RoBERTa's family, as a causal LM): its forward counts its positions from ``pad_token_id + 1`` over
    the ids that are not padding, so ids counting from 0 (``generate``'s) would shift every row, unpadded ones too; it
    is called as given."""
    can_generate = getattr(model, "can_generate", None)
    if not causal_lm and not (callable(can_generate) and bool(can_generate())
                              and not getattr(getattr(model, "config", None), "is_encoder_decoder", False)):
        return False
    table = learned_position_table(model)
    return table is None or table.padding_idx is None


def refuse_left_padding_shifting_positions(model: nn.Module, input_ids: Tensor | None,
                                           attention_mask: Int[Tensor, "batch pos"], *, role: str = "model") -> None:
    """Refuse left padding for a ``model`` outside the architecture registry (no rule for its positions is known, so
    it is given no position ids) that reads a learned position table (:func:`learned_position_table`): its positions
    count from the first column, so a left-padded row would run on other positions than alone, silently. A table with
    a padding row (RoBERTa's family) is not refused where every padding token holds its id: that forward counts the
    real tokens itself. ``role`` names the model in the message (the Space model's ``"encoder"``)."""
    padded_first = attention_mask[:, 0] == 0
    if not padded_first.any():
        return
    table = learned_position_table(model)
    if table is None:
        return
    if (table.padding_idx is not None and input_ids is not None
            and bool((input_ids[attention_mask == 0] == table.padding_idx).all())):
        return
    fix = "Pad on the right (tokenizer.padding_side = 'right')"
    # position ids counting real tokens are a fix only where the caller can pass them (a path that padded its
    # caller's texts itself, explain_dataset, predict, predict_labels, fine_tune_classifier, takes none), the forward
    # takes them, and they make each row as alone: a sequence classifier may read the first column, padding on a
    # left-padded row whatever its positions (ELECTRA's does), so it is pointed at right padding alone
    if (_CALLERS_PADDING_SIDE.get() is None and _forward_takes_position_ids(model)
            and type(model).__name__ not in _sequence_classifier_names()):
        fix += (", or pass position_ids= counting each row's real tokens "
                "(bcos_plugins.attribution.real_token_positions(attention_mask))")
    raise _left_padding_error(
        padded_first, f"the {role} {architecture_name(model)} (outside the architecture registry, so it is given no "
        "position ids) reads learned position embeddings counted from the first column: the row's positions, and so "
        "its numbers, would be shifted by its padding", fix)


@functools.cache  # read on every batch call of a model outside the registry: the static mapping, read once
def _sequence_classifier_names() -> frozenset[str]:
    """transformers' sequence-classifier class names (its auto mapping's): which token each one classifies from (the
    first column, or the last that is not padding) is not known outside the registry."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    return frozenset(name for names in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values()
                     for name in ((names,) if isinstance(names, str) else names))


def rows_as_alone_call(model, input_ids: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None,
                       forward_kwargs: dict | None = None, *, tokenizer_outputs=None,
                       spec: ArchitectureSpec | None = None, causal_lm: bool = False,
                       padded: bool | None = None) -> dict:
    """Keyword arguments for ``model(...)`` on a (padded) batch, so that every row is computed as it would be alone:
    the one decision of every path that calls a text model on a batch (``explain``, ``perturbation_curves``,
    ``next_token_contrast``, ``predict``, ``predict_labels``, ``fine_tune_classifier``'s collator).

    - A model of the architecture registry (``spec``; looked up with :func:`registry_spec` when not given):
      :func:`model_call_kwargs` (position ids counting real tokens, the refusals of left padding, a decoder
      classifier's padding written as ``config.pad_token_id``, ``forward_kwargs`` it does not read refused). Of
      ``tokenizer_outputs`` (a tokenizer's encoding; its ids and mask are not read from it) only what the forward
      reads is passed (:func:`readable_tokenizer_outputs`).
    - Anything else is called with the batch as given (every tokenizer output and ``forward_kwargs``), except a
      causal LM (one transformers generates with, or any model when the caller reads its next-token logits:
      ``causal_lm=True``) whose forward names ``position_ids``: it gets position ids counting real
      tokens (:func:`~bcos_plugins.attribution.real_token_positions`), as ``generate`` gives them, so left padding
      does not shift its positions (a ``position_ids`` passed in ``forward_kwargs`` is kept), unless its position
      table has a padding row (RoBERTa's family counts its own positions from the padding index, see
      :func:`_causal_lm_gets_position_ids`). Any other model whose forward names ``position_ids`` (a transformers
      model outside the registry: ELECTRA, GPT-Neo classifiers) and reads a learned position table is refused left
      padding without them (:func:`refuse_left_padding_shifting_positions`); a forward that names none (a wrapper
      such as the Space model, which gives its encoder the ids) is trusted with it. A transformers sequence classifier
      not known to classify from the last token is refused left padding whatever the caller passes
      (:func:`refuse_left_padding_before_unknown_pooling`: ELECTRA's reads the first column).

    Refusals name rows through :func:`~bcos_plugins._checks.bad_rows`: a caller that batches its caller's texts in
    another order or in chunks wraps this call in :func:`~bcos_plugins._checks.rows_named_as`. ``padded``: whether the
    batch is padded, where the caller's check read it (:func:`token_inputs_and_padding`); ``False`` skips work a
    padded batch needs (:func:`model_call_kwargs`).
    """
    spec = spec if spec is not None else registry_spec(model)
    forward_kwargs = dict(forward_kwargs or {})
    if spec is not None:
        if tokenizer_outputs is not None:
            forward_kwargs = {**readable_tokenizer_outputs(tokenizer_outputs, forward_keywords(model)),
                              **forward_kwargs}
        return model_call_kwargs(model, spec, input_ids, attention_mask, forward_kwargs, padded=padded)
    if tokenizer_outputs is not None:
        forward_kwargs = {**readable_tokenizer_outputs(tokenizer_outputs, None), **forward_kwargs}
    call = {"input_ids": input_ids, "attention_mask": attention_mask, **forward_kwargs}
    if (attention_mask is not None and "position_ids" not in call and isinstance(model, nn.Module)
            and _forward_takes_position_ids(model)):
        if _causal_lm_gets_position_ids(model, causal_lm):
            call["position_ids"] = outside_inference(real_token_positions(attention_mask))
        else:
            refuse_left_padding_shifting_positions(model, input_ids, attention_mask)
    if attention_mask is not None and isinstance(model, nn.Module):
        refuse_left_padding_before_unknown_pooling(model, attention_mask)
    return with_output_object(model, call)


def _pools_last_token(model: nn.Module) -> bool:
    """Whether a sequence classifier is known to classify from each row's last token (on a left-padded row, a real
    one): transformers' generic decoder classifier, a forward that finds the last token that is not padding
    (GPT-2's, GPT-Neo's, OPT's: ``last_non_pad_token``), or a sequence summary of the last column (XLNet's)."""
    from transformers.modeling_layers import GenericForSequenceClassification

    if isinstance(model, GenericForSequenceClassification):
        return True
    if getattr(getattr(model, "config", None), "summary_type", None) == "last":
        return True
    return _forward_reads_last_non_pad_token(type(model))


@functools.lru_cache(maxsize=256)
def _forward_reads_last_non_pad_token(model_type: type) -> bool:
    """Whether ``model_type.forward``'s source finds the last token that is not padding; once per class (cached):
    :func:`_pools_last_token` runs on every batch of a left-padded classifier outside the registry, and reading the
    source each time read and parsed its file each time."""
    try:
        return "last_non_pad_token" in inspect.getsource(model_type.forward)
    except (OSError, TypeError):
        return False


def refuse_left_padding_before_unknown_pooling(model: nn.Module, attention_mask: Tensor) -> None:
    """Refuse left padding for a transformers sequence classifier outside the architecture registry that is not
    known to classify from the last token (:func:`_pools_last_token`): which token such a classifier reads is not
    known, and ELECTRA's reads the first column, a padding token's on a left-padded row, so its logits (and every
    score of them) were the padding's, silently, where the caller's own ``position_ids`` (or a rotary model) let the
    batch past :func:`refuse_left_padding_shifting_positions`. One sync, for such a model alone."""
    model = uncompiled(model)
    if (attention_mask.ndim != 2 or attention_mask.shape[1] == 0
            or type(model).__name__ not in _sequence_classifier_names()):
        return
    padded_first = attention_mask[:, 0] == 0
    if not bool(padded_first.any()) or _pools_last_token(model):
        return
    raise _left_padding_error(
        padded_first, f"{type(model).__name__} is a sequence classifier outside the architecture registry, so which "
        "token it classifies from is not known (ELECTRA's reads the first column: a padding token's there, so the "
        "logits would not be the row's)", "Pad on the right (tokenizer.padding_side = 'right')")
