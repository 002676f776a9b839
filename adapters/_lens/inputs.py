"""The token checks every TransformerLens entry point of the adapter runs (``explain_logits``, the token x
component decomposition): one place, so that each refuses the same inputs with the same words."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bcos_plugins._checks import ids_as_long, require_token_batch, unmasked_padding_keywords
from bcos_plugins.attribution.rotary_length import refuse_length_dependent_rotary
from bcos_plugins.convert.architectures import position_limit, vocabulary_size
from bcos_plugins.errors import argument_error

__all__ = ["FORWARD_WARNS_ABOUT_PADDING", "check_lens_tokens", "lens_padding_keywords",
           "refuse_bos_less_left_padding"]

# a class attribute of models whose own forward warns about a padded token batch given without a mask (the bridges
# transformer_bridge_from_hf builds): check_lens_tokens leaves the warning to it, so one call warns once
FORWARD_WARNS_ABOUT_PADDING = "_bcos_forward_warns_about_unmasked_padding"


def lens_padding_keywords(model: nn.Module, attention_mask) -> dict:
    """The unmasked-padding keywords (:func:`~bcos_plugins._checks.unmasked_padding_keywords`) of ``model`` (a
    ``HookedTransformer`` or ``TransformerBridge``): the pad id of its tokenizer (``model.to_tokens`` pads with it),
    else of its ``cfg``; empty with a mask."""
    tokenizer = getattr(model, "tokenizer", None)
    pad_source = tokenizer if getattr(tokenizer, "pad_token_id", None) is not None else getattr(model, "cfg", None)
    return unmasked_padding_keywords(pad_source, attention_mask)


def refuse_bos_less_left_padding(model: nn.Module, tokens, prepend_bos: bool | None = None,
                                 padding_side: str | None = None, *, takes_a_mask: bool = True,
                                 mask_reads_the_calls_prepend_bos: bool = True, name: str = "tokens") -> None:
    """Refuse a left-padded token batch made without a BOS (``to_tokens(..., prepend_bos=False)``) given without a
    mask to a ``HookedTransformer`` whose tokenizer pads on the left with its BOS id, when the mask TransformerLens
    derives (``utils.get_attention_mask(tokenizer, tokens, prepend_bos)``, ``prepend_bos`` the call's, else
    ``cfg.default_prepend_bos``) assumes a BOS: it unmasks each padded row's last padding token as that row's BOS,
    so the row attended one padding token, and its forward and explanation were not its text's (0.03-0.6 off on
    tiny B-cos GPT-2s), without a word. Told exactly by the batch: with a BOS prepended every row begins with the
    BOS id (the pad id here), so a row beginning with another token was made without one, and then each row that
    begins with padding has a padding token unmasked. ``padding_side`` is the call's (TransformerLens' forward and
    ``generate`` set the tokenizer's to it while they derive the mask), else the tokenizer's. Anything else passes
    unchanged (a correct call's numbers are TransformerLens'). One host sync (none for a single row, which cannot mix rows with and without padding).
    ``takes_a_mask=False`` for a call that has no ``attention_mask`` (TransformerLens' ``generate`` drops one
    without effect): the fixes named are then the others. ``mask_reads_the_calls_prepend_bos=False`` for a call that
    derives its mask with ``cfg.default_prepend_bos`` whatever its own ``prepend_bos`` (a ``TransformerBridge`` given a
    list of texts: pass the batch it tokenized, ``prepend_bos=None``, and ``name="input"``): the call's
    ``prepend_bos=False`` is then not named as a fix, since it is what made the batch."""
    tokenizer = getattr(model, "tokenizer", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None or (padding_side or getattr(tokenizer, "padding_side", None)) != "left" \
            or getattr(tokenizer, "bos_token_id", None) != pad or not isinstance(tokens, Tensor) or tokens.ndim != 2 \
            or 0 in tokens.shape or tokens.is_meta or tokens.is_floating_point() or tokens.is_complex() \
            or tokens.dtype == torch.bool:
        return
    if not (model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos):
        return
    if tokens.shape[0] == 1:
        return  # one row: a BOS, or no padding at all
    begins_with_pad = tokens[:, 0] == pad
    padded_rows = int(begins_with_pad.sum())  # the one sync: "all" and "none" both read from it
    if padded_rows in (0, tokens.shape[0]):
        return  # a BOS on every row (or no padding at all): TransformerLens' mask is the texts'
    row = int((~begins_with_pad).nonzero()[0, 0])
    call_fix = "(on the model's own calls, prepend_bos=False also works)" if mask_reads_the_calls_prepend_bos else \
        "(the bridge derives its mask with it, whatever the call's prepend_bos)"
    raise argument_error(
        name, f"row {row} begins with token {int(tokens[row, 0])}, not the BOS id, so the batch was made without "
        f"a BOS (to_tokens(..., prepend_bos=False)); its tokenizer pads on the left with the BOS id ({pad}), and the "
        "mask TransformerLens derives without an attention_mask assumes a BOS (cfg.default_prepend_bos=True): it "
        "unmasks the last padding token of each padded row as its BOS, so those rows would attend a padding token "
        "and their outputs and explanations would not be their texts' alone",
        "Pass attention_mask= (the tokenizer's own, or 1 on each row's tokens and 0 on its padding), or set "
        f"model.cfg.default_prepend_bos = False for batches made without a BOS {call_fix}, or make the tokens with a "
        "BOS (to_tokens(texts))" if takes_a_mask else
        "Pass prepend_bos=False (this call takes no attention_mask), or set model.cfg.default_prepend_bos = False "
        "for batches made without a BOS, or make the tokens with a BOS (to_tokens(texts))")


def _derived_left_padding_mask(model: nn.Module, tokens) -> Tensor | None:
    """The mask a ``HookedTransformer``'s forward derives itself for a token batch given without one when its tokenizer
    pads on the left (TransformerLens' ``utils.get_attention_mask(tokenizer, tokens, cfg.default_prepend_bos)``), where
    it masks a token; else ``None`` (a bridge derives none, nor does a right-padding tokenizer). Passed on explicitly,
    the forward is the same, positions are read through it (a padding position is refused), and no warning says the
    padding is attended to: it is not (the explanation equalled each text alone, and was warned about)."""
    tokenizer = getattr(model, "tokenizer", None)
    if getattr(tokenizer, "padding_side", None) != "left" or getattr(tokenizer, "pad_token_id", None) is None \
            or not isinstance(tokens, Tensor) or tokens.ndim != 2 or 0 in tokens.shape or tokens.is_meta \
            or tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        return None  # not ids: require_token_batch refuses them with its message
    from .compat import HAS_HOOKED_TRANSFORMER

    if not HAS_HOOKED_TRANSFORMER:
        return None
    from transformer_lens import HookedTransformer
    from transformer_lens import utils as lens_utils

    if not isinstance(model, HookedTransformer):
        return None
    refuse_bos_less_left_padding(model, tokens)
    mask = lens_utils.get_attention_mask(tokenizer, ids_as_long(tokens), model.cfg.default_prepend_bos)
    return mask if bool((mask == 0).any()) else None


def check_lens_tokens(model: nn.Module, tokens, attention_mask) -> tuple[Tensor, Tensor | None]:
    """The package's token-batch check (:func:`~bcos_plugins._checks.require_token_batch`) against ``model``'s
    (a ``HookedTransformer`` or ``TransformerBridge``) vocabulary (its embedding's rows, the package's one reading,
    :func:`~bcos_plugins.convert.architectures.vocabulary_size`) and, for a position table, ``cfg.n_ctx`` (the
    package's one reading of it, :func:`~bcos_plugins.convert.architectures.position_limit`);
    returns the ids as int64 (ids of any integer width convert exactly, as everywhere in the package:
    TransformerLens' ``W_E[tokens]`` would read a uint8 tensor as a mask) and the mask as int64 (``None`` stays
    ``None``): the checked mask, not the caller's, goes on, since a float mask of 0.0 / 1.0 passes the check and
    then failed as an index (``IndexError: tensors used as indices must be long...``)."""
    limit = position_limit(model)
    if attention_mask is None:
        attention_mask = _derived_left_padding_mask(model, tokens)
    # padding without a mask is warned about here, or by the model's own forward where it warns (once per call)
    padding = {} if getattr(type(model), FORWARD_WARNS_ABOUT_PADDING, False) else lens_padding_keywords(
        model, attention_mask)
    tokens, attention_mask = require_token_batch(tokens, attention_mask, vocab_size=vocabulary_size(model),
                                                 max_length=limit.max_length, limit_name=limit.source, name="tokens",
                                                 **padding)
    original = getattr(model, "original_model", None)  # a bridge runs its transformers model's rotary embedding
    if attention_mask is not None and isinstance(original, nn.Module):
        refuse_length_dependent_rotary(original, attention_mask)
    return tokens, attention_mask
