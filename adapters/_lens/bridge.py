"""``TransformerBridge`` (TransformerLens 3.x and 4.x) on B-cos, bilinear and plain transformers models.

``TransformerBridge.boot_transformers(name, hf_model=model)`` wraps the model it is given *in place*: it
swaps the model's submodules for bridge components (so the user's model changes), and for GPT-2 it splits
the fused ``c_attn`` into plain ``nn.Linear`` q/k/v built from the raw weights, which for a B-cos ``c_attn``
is a different model. :func:`transformer_bridge_from_hf` instead:

1. boots the bridge on a deep copy, so the user's model is never modified (parameters bit-identical);
2. replaces the split q/k/v of a B-cos ``c_attn`` by :class:`~bcos_plugins.nn.BcosLinear` layers with the same
   maths: a B-cos unit is one weight row normalised on its own, so splitting the output units into three
   groups changes nothing (MaxOut groups could straddle the split and are refused); the query and key
   parts keep ``c_attn``'s ``constant_outputs`` (detached in explanation mode);
3. makes the bridge explainable: the hook points whose values are dynamic weights of the bridge's own
   computations (``hook_pattern`` where the bridge computes attention itself, the norms' ``hook_scale``, a
   gated MLP's gate branch ``mlp.gate.hook_out``) become :class:`~.hook_point.DynamicHookPoint` s, so
   :func:`bcos_plugins.nn.explanation_mode` makes the bridged model linear in its embeddings (B-cos and
   bilinear models; on plain models with biases the biases' share is missing, as for ``make_explainable``).

Everything this module relies on in TransformerLens' bridge internals (private attributes, component
classes, hook names) is listed in :func:`check_bridge_internals`, which runs on every conversion and in the
tests, so a TransformerLens release that changes them fails loudly instead of giving a different model.

Decompositions through a bridge: TransformerLens' ``ActivationCache`` reads ``W_O``/``W_out`` through the
bridge's compatibility shims (raw weights), so ``stack_head_results``, ``stack_neuron_results`` and the other
helpers in :data:`~.boot_guard.CACHE_WEIGHT_READERS` would not be exact for B-cos models there. The boot guard
makes the per-head and per-neuron ones exact on bridges holding B-cos projections (or refuses them where it
cannot); their fused ``apply_ln`` + ``project_output_onto`` path raises, naming ``token_component_decomposition``
(which works on both TransformerLens versions) and ``hooked_transformer_from_hf`` (3.x). Bilinear and plain
bridges keep them. ``logit_attrs`` multiplies the normalised residual by ``W_U`` alone: the final norm's gain is
folded into the copy's LM head (:func:`~.final_norm.fold_final_norm_into_unembedding`), and on a B-cos bridge
where it cannot be (Gemma 2's soft-capped head) ``logit_attrs`` is refused by the boot guard.
"""

from __future__ import annotations

import copy
import functools
import inspect
import tempfile

import torch
from torch import nn
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

from bcos_plugins._checks import (
    refuse_a_model_as_the_tokenizer,
    refuse_meta_model,
    require_model_object,
    warn_if_unmasked_padding,
)
from bcos_plugins.attribution.rotary_length import forget_grown_rotary_frequencies
from bcos_plugins.attribution.text import refuse_stock_loaded_bcos
from bcos_plugins.convert.architectures import architecture_name, specs_where, vocabulary_size
from bcos_plugins.convert.query_key import StockQueryKeyConv1D
from bcos_plugins.corpus import require_tokenizer_fits
from bcos_plugins.errors import BcosRuntimeError, BcosTypeError, BcosValueError, argument_error
from bcos_plugins.nn.dynamic import DynamicWeightModule
from bcos_plugins.nn.linear import BcosConv1D, BcosLinear
from bcos_plugins.nn.norm import BcosLayerNorm, DetachableRMSNorm

from .boot_guard import (
    BRIDGE_COPY_MARKER,
    EXPLAINABLE_BRIDGE_MARKER,
    FINAL_NORM_FOLDED_MARKER,
    is_bcos_bridge,
    is_explainable_bridge,
)
from .final_norm import fold_final_norm_into_unembedding
from .hook_checks import hook_checked_cache_class, hooked_points
from .hook_point import DynamicHookPoint
from .inputs import FORWARD_WARNS_ABOUT_PADDING, lens_padding_keywords, refuse_bos_less_left_padding

__all__ = [
    "SUPPORTED_BRIDGE_ARCHITECTURES",
    "check_bridge_internals",
    "is_explainable_bridge",
    "linear_normalized",
    "make_bridge_explainable",
    "native_norm_input_hook",
    "transformer_bridge_from_hf",
]

# the registry's classes the bridge accepts (ArchitectureSpec.bridge)
SUPPORTED_BRIDGE_ARCHITECTURES = specs_where(lambda spec: spec.bridge)


def _bridge_classes():
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.generalized_components import (
        AttentionBridge,
        GatedMLPBridge,
        JointQKVAttentionBridge,
        LinearBridge,
        NormalizationBridge,
    )

    return TransformerBridge, AttentionBridge, GatedMLPBridge, JointQKVAttentionBridge, LinearBridge, \
        NormalizationBridge


def check_bridge_internals() -> None:
    """Check the TransformerLens bridge details this module relies on; raise naming the one that changed.

    Relied on: ``TransformerBridge.boot_transformers(name, hf_model=, tokenizer=)``; the component classes
    ``AttentionBridge``, ``JointQKVAttentionBridge`` (with ``q``/``k``/``v`` ``LinearBridge`` children whose
    ``set_original_component`` takes the module to run and whose ``original_component`` holds it),
    ``GatedMLPBridge`` (gate branch in child ``gate``), ``NormalizationBridge``; hook points named
    ``hook_pattern``, ``hook_scale``, ``hook_out``, ``hook_embed``; the wrapped model at
    ``bridge.original_model``.
    """
    try:
        bridge_cls, attention, gated, joint, linear, norm = _bridge_classes()
    except ImportError as error:  # pragma: no cover - message only
        raise BcosRuntimeError(f"TransformerLens' bridge components moved ({error}); this adapter needs updating"
                               ) from error
    problems = []
    if not hasattr(bridge_cls, "boot_transformers"):
        problems.append("TransformerBridge.boot_transformers is gone")
    for cls, attrs in ((linear, ("set_original_component", "original_component")),
                       (joint, ("set_original_component", "_default_split_qkv_matrix")),
                       (attention, ("_softmax_dropout_pattern",))):
        problems += [f"{cls.__name__}.{a} is gone" for a in attrs if not hasattr(cls, a)]
    for cls in (attention, gated, norm, joint):
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            problems.append(f"{cls!r} is not an nn.Module class")
    if problems:
        raise BcosRuntimeError("TransformerLens' bridge internals changed: " + "; ".join(problems)
                               + ". bcos_plugins.adapters.transformer_lens' bridge support needs updating")


def _architecture(hf_model: nn.Module) -> str:
    name = architecture_name(hf_model)
    if name not in SUPPORTED_BRIDGE_ARCHITECTURES:
        raise BcosTypeError(
            f"hf_model: {type(hf_model).__name__} is not supported by transformer_bridge_from_hf. Pass a "
            f"{' or '.join(SUPPORTED_BRIDGE_ARCHITECTURES)} (plain, B-cosified or bilinear), with its LM head")
    return name


def _placeholder_tokenizer(vocab_size: int):
    # TransformerLens' boot loads a tokenizer by the model's name when none is given (hub access). Token-id
    # workflows need none, so an offline word-level tokenizer "t0 t1 ..." over the vocabulary stands in.
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(words, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", bos_token="t0", eos_token="t0")


def _refuse_text(self, *args, **kwargs):
    raise BcosValueError(
        "tokenizer: this bridge was built without tokenizer=, so it has no vocabulary for text (its placeholder "
        "only names ids t0, t1, ...; a string would silently become token 0). Pass token ids (a tensor), or build "
        "the bridge with transformer_bridge_from_hf(hf_model, tokenizer=the_model's_tokenizer)")


def _ids_only(tokenizer):
    """The placeholder tokenizer, refusing text from here on (it was needed as a tokenizer while the bridge booted):
    ids still decode (``to_str_tokens(ids)`` gives ``t<id>``)."""
    refusing = {name: _refuse_text for name in ("__call__", "encode", "tokenize", "_encode_plus")
                if hasattr(tokenizer, name)}
    tokenizer.__class__ = type(f"IdsOnly{type(tokenizer).__name__}", (type(tokenizer),), refusing)
    return tokenizer


def _reloadable(tokenizer, folder: str):
    # TransformerLens re-creates the tokenizer from its name_or_path (to add a BOS token), which an in-memory
    # tokenizer lacks: save it and load it back from `folder`, which must exist while the bridge boots.
    from transformers import AutoTokenizer

    # The sides go along as keywords: save_pretrained writes only the ones given at construction, so a tokenizer
    # set to pad on the left afterwards (tokenizer.padding_side = "left", the usual setting for decoders) came
    # back padding on the right, and bridge.to_tokens(texts) put a pad token at position -1 of each shorter row
    # (the HF tokenizer's batch put its last real token there), silently. Keywords reach init_kwargs, which
    # TransformerLens passes on when it reloads the tokenizer with a BOS token.
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, padding_side=tokenizer.padding_side,
                                         truncation_side=tokenizer.truncation_side)


def _require_same_sides(bridge_tokenizer, tokenizer) -> None:
    """The one check that the booted bridge tokenizes on the sides of the user's tokenizer (TransformerLens' boot
    sets a cfg's ``default_padding_side`` over it, and reloads the tokenizer): a change there fails loudly."""
    for side in ("padding_side", "truncation_side"):
        got, want = getattr(bridge_tokenizer, side, None), getattr(tokenizer, side, None)
        if got != want:
            raise BcosRuntimeError(f"tokenizer: the bridge's tokenizer has {side}={got!r} where the given one has "
                                   f"{want!r} (TransformerLens' boot changed it); bcos_plugins.adapters' bridge "
                                   "support needs updating. Meanwhile pass padding_side= to bridge.to_tokens")


def _check_bridge_input_for_unmasked_padding(bridge: nn.Module, tokens) -> None:
    """Warn when ``tokens`` (a bridge forward's input, given without a mask) is a batch whose rows are padded to
    different lengths: TransformerLens derives a mask only for a list of texts, so the padding is attended to as
    tokens, and with right padding position -1 of a shorter row is a pad token (its logits and cache entries there
    are not the row's last token's). The package's one detection (:func:`~bcos_plugins._checks.token_batch_and_padding`'s)."""
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.shape[0] < 2 \
            or tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool or tokens.is_meta:
        return  # one row, embeddings or not ids: nothing to read (TransformerLens refuses what it cannot take)
    padding = lens_padding_keywords(bridge, None)
    if not padding:
        return
    pad = padding["pad_token_id"]
    warn_if_unmasked_padding(tokens, "tokens", **padding, fix=(
        f"attention_mask: not given, but the tokens have rows of different lengths padded with the pad id ({pad}) at "
        "their start or end. TransformerLens' bridge derives a mask only for a list of texts, so this batch's padding "
        "is attended to as tokens (left padding changes every real token's logits and activations), and with right "
        "padding position -1 of a shorter row is a pad token, not the row's last one (logits[:, -1], a cache's "
        "pos_slice=-1). Pass attention_mask=transformer_lens.utils.get_attention_mask(bridge.tokenizer, tokens, "
        "prepend_bos=bridge.cfg.default_prepend_bos) to run_with_cache / run_with_hooks / the bridge, and read "
        "each row at its last real token (position -1 with left padding), or pass the texts themselves"))


def _refuse_bos_less_text_batch(bridge: nn.Module, texts, prepend_bos, padding_side) -> None:
    """Refuse a list of texts that a bridge forward or ``generate`` / ``generate_stream`` (given no mask; these pad a
    list on the left whatever the tokenizer's side, ``padding_side="left"``) would tokenize without a BOS (the call's
    ``prepend_bos=False``) and pad on the left with the BOS id: TransformerLens' bridge derives the mask of a batched
    list with ``cfg.default_prepend_bos``, not the call's ``prepend_bos``, so with a default of ``True`` it unmasked
    each padded row's last padding token as its BOS (a B-cos GPT-2's last logits 0.2 off each text alone, a stock one
    0.06-0.08), without a word. The HookedTransformer's check (:func:`~.inputs.refuse_bos_less_left_padding`) reads
    the batch the bridge will tokenize; nothing is tokenized twice unless the call asks for no BOS over a default
    BOS."""
    tokenizer = getattr(bridge, "tokenizer", None)
    default_bos = getattr(getattr(bridge, "cfg", None), "default_prepend_bos", True)
    if isinstance(texts, list) and len(texts) > 1 and prepend_bos and not default_bos \
            and (padding_side or getattr(tokenizer, "padding_side", None)) == "left" \
            and getattr(tokenizer, "pad_token_id", None) is not None \
            and getattr(tokenizer, "bos_token_id", None) == tokenizer.pad_token_id:
        # the mirror case: a BOS on every row, and a mask derived as if none, which masks each row's BOS as padding
        # (every row 0.11-0.24 off its text alone with a BOS on a tiny B-cos GPT-2, silently)
        raise argument_error(
            "prepend_bos", "True puts a BOS on every row, but the bridge derives a list's mask with "
            "cfg.default_prepend_bos (False here), whatever the call's prepend_bos; its tokenizer pads on the left "
            f"with the BOS id ({tokenizer.pad_token_id}), so that mask masks each row's BOS as padding and every row "
            "would run without it", "Pass attention_mask= (the tokenizer's own, or 1 on each row's tokens and 0 on "
            "its padding), or set model.cfg.default_prepend_bos = True and leave prepend_bos out")
    if not isinstance(texts, list) or len(texts) < 2 or prepend_bos is None or prepend_bos or not default_bos \
            or tokenizer is None:
        return  # no batched list, or every row gets a BOS, or the mask derived reads no BOS: the texts' own mask
    tokens = bridge.to_tokens(texts, prepend_bos=prepend_bos, padding_side=padding_side)
    refuse_bos_less_left_padding(bridge, tokens, None, padding_side, mask_reads_the_calls_prepend_bos=False,
                                 name="input")


@functools.cache
def _padding_checked_class(base: type) -> type:
    """``base`` (TransformerLens' ``TransformerBridge``) whose ``forward`` first warns about a padded token batch
    given without a mask (:func:`_check_bridge_input_for_unmasked_padding`): the one place every call goes through (``bridge(
    tokens)``, ``run_with_cache`` and ``run_with_hooks`` call ``forward``), and puts back a ``"dynamic"`` rotary
    embedding's frequencies that an earlier, longer call grew (:func:`~bcos_plugins.attribution.rotary_length.
    forget_grown_rotary_frequencies`, the transformers path's reset: the bridge runs its transformers model's rotary
    embedding, which kept them, so a row gave another number after a longer row than fresh). The name stays
    ``base``'s."""
    names = list(inspect.signature(base.forward).parameters)[1:]  # after self
    mask_at = names.index("attention_mask") if "attention_mask" in names else None
    input_name = names[0] if names else "input"
    base_forward = base.forward

    def argument(args: tuple, kwargs: dict, name: str):
        at = names.index(name) if name in names else None
        return args[at] if at is not None and len(args) > at else kwargs.get(name)

    def forward(self, *args, **kwargs):
        mask = kwargs.get("attention_mask", kwargs.get("one_zero_attention_mask"))
        if mask is None and mask_at is not None and len(args) > mask_at:
            mask = args[mask_at]
        if mask is None:
            given = args[0] if args else kwargs.get(input_name)
            _check_bridge_input_for_unmasked_padding(self, given)
            _refuse_bos_less_text_batch(self, given, argument(args, kwargs, "prepend_bos"),
                                        argument(args, kwargs, "padding_side"))
        forget_grown_rotary_frequencies(getattr(self, "original_model", None))  # nothing read without dynamic rope
        return base_forward(self, *args, **kwargs)

    forward.__doc__ = base_forward.__doc__
    base_run_with_cache = base.run_with_cache

    def run_with_cache(self, *args, **kwargs):
        # the caller's hooks, which the cache records the edits of: its decompositions refuse where they broke the
        # sums (hook_checks; decompose_resid + logit_attrs under a patched resid_pre were 0.041 off, silently). Every
        # cache gets the checked class, hooked or not: its logit_attrs also checks the tokens against the stack
        # (check_logit_tokens), and without hooks nothing else is checked
        hooked = hooked_points(self)
        out = base_run_with_cache(self, *args, **kwargs)
        cache = out[1] if isinstance(out, tuple) and len(out) == 2 else None
        if hasattr(cache, "cache_dict") and hasattr(cache, "decompose_resid"):
            cache.__class__ = hook_checked_cache_class(type(cache))
            cache.record_run(hooked)  # its decompositions refuse once the model changes
        return out

    run_with_cache.__doc__ = base_run_with_cache.__doc__
    methods = {"forward": forward, "run_with_cache": run_with_cache, FORWARD_WARNS_ABOUT_PADDING: True,
               "__module__": __name__}
    for name in ("process_weights", "enable_compatibility_mode"):  # TransformerLens 3.x and 4.x bridges have both
        if callable(getattr(base, name, None)):
            methods[name] = _refusing_bcos_weight_processing(getattr(base, name))
    for name in ("generate", "generate_stream"):
        method = getattr(base, name, None)
        if callable(method) and "use_past_kv_cache" in inspect.signature(method).parameters:
            methods[name] = _without_kv_cache(method)
    return type(base.__name__, (base,), methods)


def _without_kv_cache(method):
    """``method`` (the bridge's ``generate`` / ``generate_stream``) run without TransformerLens' key-value cache,
    refusing ``use_past_kv_cache=True``. The bridge's cached path generated other tokens than its model computes: on
    tiny B-cos GPT-2, Llama, Mistral, Qwen2, Qwen3 and Gemma 2 bridges and plain ones (TransformerLens 3.9) greedy
    decoding left the transformers model's own greedy tokens from the second new token on (GPT-2: a token outside
    the model's top 3), without a word; without the cache each step is a full forward of the bridge, which is the
    model's. The default is therefore no cache (slower, the model's tokens). Checked again 2026-11-29 on six prompts
    of 8 new tokens per tiny model: the cached path left the model's greedy tokens on every B-cos family (GPT-2,
    Llama, Mistral, Qwen2, Qwen3, Gemma 2: 5-6 of 6 prompts) and on plain Llama, Mistral, Qwen2, Qwen3 and Gemma 2
    (6 of 6); plain GPT-2 matched on those configurations (left them on 0 of 6) but not on every one: a tiny plain
    GPT-2 over the GPT-2 tokenizer's vocabulary leaves the model's tokens too, booted by TransformerLens
    (tests/test_host_library_behaviour.py item 1, the booted model's empty ``DynamicCache``:
    docs/hosts/upstream-issues.md) and built by transformer_bridge_from_hf (2026-11-29: prompt [464, 3797, 3332],
    the cached path's second new token 15181 against the model's 38387). The refusal is one rule for every bridge:
    its cost on a tiny plain GPT-2 is in docs/benchmarks.md (#bench-bridge-generate-kv-cache); for
    speed, generate with the transformers model itself (``hf_model.generate``, its own cache)."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def generate(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs).arguments
        if bound.get("use_past_kv_cache", False):
            raise argument_error(
                "use_past_kv_cache", f"bridge.{method.__name__} with TransformerLens' key-value cache generates other "
                "tokens than the model computes on bridges from transformer_bridge_from_hf (greedy decoding left the "
                "transformers model's own tokens from the second new token on, on tiny B-cos GPT-2 / Llama / Mistral / "
                "Qwen / Gemma 2 bridges and plain ones, GPT-2 included, TransformerLens 3.9)",
                "Leave it out (these bridges generate without the cache by default: each step a full forward, the "
                "model's tokens), or generate with the transformers model itself (hf_model.generate)")
        if bound.get("attention_mask") is None:  # a batched list: left-padded, its mask by cfg.default_prepend_bos
            _refuse_bos_less_text_batch(self, bound.get("input"), bound.get("prepend_bos"), "left")
        if "use_past_kv_cache" not in bound:
            kwargs["use_past_kv_cache"] = False
        return method(self, *args, **kwargs)

    return generate


def _refusing_bcos_weight_processing(method):
    """``method`` (the bridge's ``process_weights`` / ``enable_compatibility_mode``) refusing to process a B-cos
    model's weights. TransformerLens' processing (fold_ln, centring, value-bias folding, and the processed-weights
    forward it switches the bridge to) rewrites a plain model into an equivalent one, but not a B-cos one, whose
    projections normalise their weight rows and scale by |cos| ** (B - 1): ``bridge.enable_compatibility_mode()``
    moved a tiny B-cos GPT-2's logits by 0.04 and a Llama's by 0.16 (0.15 with every option off), and the bridge
    still explained the changed model, exactly and without a word. ``enable_compatibility_mode(no_processing=True)``
    (the legacy hook names, the weights as they are) stays allowed."""
    signature = inspect.signature(method)

    def refusing(self, *args, **kwargs):
        if is_bcos_bridge(self):
            processes = method.__name__ == "process_weights" \
                or not signature.bind(self, *args, **kwargs).arguments.get("no_processing", False)
            if processes:
                raise BcosValueError(
                    f"bridge.{method.__name__}: TransformerLens' weight processing (fold_ln, centring, the processed-"
                    "weights forward) is exact only for plain models; on this B-cos model it changes the logits (0.04-"
                    "0.16 on tiny B-cos GPT-2 / Llama bridges) and the explanations would explain that other model. "
                    "Use bridge.enable_compatibility_mode(no_processing=True) for the legacy hook names with the "
                    "weights unchanged; the final norm is already folded into the LM head, so logit_attrs sums to "
                    "the logit")
        return method(self, *args, **kwargs)

    refusing.__name__, refusing.__doc__ = method.__name__, method.__doc__
    return refusing


def _bcos_qkv_parts(c_attn: BcosConv1D, n_parts: int = 3) -> list[BcosLinear]:
    if c_attn.max_out != 1:
        raise BcosValueError(
            f"hf_model: c_attn uses MaxOut (max_out={c_attn.max_out}); its MaxOut groups are not q/k/v units, "
            "so the bridge's q/k/v split cannot express it. Use max_out=1 (bcosify's default for decoders)")
    out = c_attn.out_features
    if out % n_parts:
        raise BcosValueError(f"hf_model: c_attn has {out} outputs, not divisible into q, k, v")
    size = out // n_parts
    constant = torch.zeros(out, dtype=torch.bool)
    if c_attn.constant_outputs is not None:
        constant[c_attn.constant_outputs] = True
    parts = []
    for i in range(n_parts):
        flags = constant[i * size:(i + 1) * size]
        if flags.any() and not flags.all():
            raise BcosValueError("hf_model: c_attn.constant_outputs splits a q/k/v part; it must cover whole parts")
        layer = BcosLinear(c_attn.in_features, size, b=c_attn.b, constant_outputs=slice(None) if flags.all() else None,
                           device=c_attn.weight.device, dtype=c_attn.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(c_attn.weight[:, i * size:(i + 1) * size].T)  # Conv1D stores (in, out)
        parts.append(layer.train(c_attn.training))
    return parts


def _stock_query_key_parts(c_attn: StockQueryKeyConv1D) -> list[nn.Module]:
    """The q/k/v of a fused ``c_attn`` converted with ``bcosify(..., bcos_query_key=False)``: q and k the stock
    affine maps (weights and biases) whose outputs are constants in explanation mode, v a B-cos layer. The bridge
    refused it ('expected BcosConv1D') while ``hooked_transformer_from_hf`` named the bridge as the way to take it."""
    from bcos_plugins.convert.bcosify import mixed_class
    from bcos_plugins.convert.query_key import ConstantQueryKeyProjection

    size = c_attn.out_features // 3
    if c_attn.out_features % 3 or c_attn.query_key_features != 2 * size:
        raise BcosValueError(f"hf_model: c_attn has {c_attn.out_features} outputs of which "
                             f"{c_attn.query_key_features} stock query/key ones, not two thirds: not a q | k | v split")
    weight, bias = c_attn.weight, c_attn.bias  # Conv1D layout (in, out)
    parts = []
    for i in range(2):
        layer = nn.Linear(c_attn.in_features, size, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(weight[:, i * size:(i + 1) * size].T)
            layer.bias.copy_(bias[i * size:(i + 1) * size])
        layer.__class__ = mixed_class(ConstantQueryKeyProjection, nn.Linear)  # as bcosify does for Llama's q/k
        parts.append(layer.train(c_attn.training))
    values = BcosLinear(c_attn.in_features, size, b=c_attn.b, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        values.weight.copy_(weight[:, 2 * size:].T)
    return [*parts, values.train(c_attn.training)]


def _refuse_inexpressible(hf_model: nn.Module, arch: str) -> None:
    """Refuse settings the bridge's own computations ignore (its logits would differ from ``hf_model``'s)."""
    if arch == "GPT2LMHeadModel" and getattr(hf_model.config, "scale_attn_weights", True) is False:
        # the bridge splits c_attn and recomputes attention itself, its scores always scaled by 1/sqrt(d_head):
        # measured logits 47 % off a tiny GPT-2's, silently
        raise BcosValueError(
            "hf_model: GPT-2 with scale_attn_weights=False: TransformerLens' bridge recomputes GPT-2's attention "
            "with scores scaled by 1/sqrt(d_head), so its logits would differ. Use hooked_transformer_from_hf(hf_model) "
            "(TransformerLens 3.x), which takes the setting, or a model with scale_attn_weights=True.")


def _fold_final_norm(bridge: nn.Module, wrapped: nn.Module) -> None:
    """Fold the final norm's gain into the LM head of the wrapped copy, so that ``logit_attrs`` is exact; record
    whether it could (a soft-capped or non-linear head cannot: the boot guard refuses ``logit_attrs`` there)."""
    norm = getattr(getattr(bridge, "ln_final", None), "original_component", None)
    head = getattr(getattr(bridge, "unembed", None), "original_component", None)
    folded = norm is not None and head is not None and fold_final_norm_into_unembedding(
        norm, head, gain_offset=bool(getattr(bridge.cfg, "rmsnorm_uses_offset", False)))
    if folded and getattr(wrapped.config, "tie_word_embeddings", False):
        wrapped.config.tie_word_embeddings = False  # a later tie_weights() would undo the fold
    setattr(bridge, FINAL_NORM_FOLDED_MARKER, folded)


def _move_soft_cap_into_head(copied: nn.Module) -> None:
    """A plain model whose forward soft-caps its logits inline (Gemma 2's ``final_logit_softcapping``): the copy gets
    bcosify's uncapped forward and soft-capped LM head (the same values), so that the cap is a dynamic weight held
    constant in explanation mode. Inline, its tanh was in the gradient: explain_logits' contributions missed up to
    0.8 % of a tiny model's logit, without a word, and token_component_decomposition blamed non-zero biases. Both
    classes are the architecture spec's (its class swap of the model itself and its module swap of the LM head), so
    another soft-capped family needs its spec alone."""
    from bcos_plugins.convert.architectures import SPECS
    from bcos_plugins.convert.bcosify import mixed_class

    spec = SPECS.get(architecture_name(copied))
    head = copied.get_output_embeddings() if hasattr(copied, "get_output_embeddings") else None
    if spec is None or "" not in spec.class_swaps or type(head) is not nn.Linear \
            or getattr(getattr(copied, "config", None), "final_logit_softcapping", None) is None:
        return  # no cap, or no class of the spec that takes it out of the forward
    path = next(name for name, module in copied.named_modules() if module is head)
    capped_head = next((factory for suffix, (factory, _) in spec.module_swaps.items()
                        if path == suffix or path.endswith("." + suffix)), None)
    uncapped = spec.class_swaps[""][0]()
    if capped_head is None or isinstance(copied, uncapped):
        return  # no head of the spec to take the cap, or a B-cos model's (already in its head)
    copied.__class__ = mixed_class(uncapped, type(copied))
    head.__class__ = mixed_class(capped_head(), type(head))
    head.bcos_configure(copied.config)


def _swap_to_dynamic(point: nn.Module) -> None:
    from transformer_lens.hook_points import HookPoint

    if isinstance(point, DynamicHookPoint):
        return
    if type(point) is not HookPoint:
        raise BcosTypeError(f"{type(point).__name__} at a dynamic-weight hook is not a plain HookPoint; call "
                            "make_bridge_explainable before attaching SAEs or other wrappers")
    # In place, so the bridge's hook registry (which holds these objects) keeps working.
    point.__class__ = DynamicHookPoint


def _runs_original_norm(norm_bridge: nn.Module) -> bool:
    # NormalizationBridge.forward: the "native" path runs the wrapped HF norm (and falls back to its own maths
    # when a hook returns a different tensor than it was given); the other path computes the norm itself,
    # dividing by hook_scale's output.
    config = getattr(norm_bridge, "config", None)
    return bool(getattr(norm_bridge, "use_native_layernorm_autograd", False)
                or getattr(config, "layer_norm_folding", False))


def _make_norm_explainable(norm_bridge: nn.Module) -> None:
    if not _runs_original_norm(norm_bridge):
        _swap_to_dynamic(norm_bridge.hook_scale)
        return
    # Detaching hook_scale would make the native path take its no-grad fallback: make the wrapped norm
    # itself detachable instead (B-cos models' norms already are).
    original = norm_bridge.original_component
    if isinstance(original, DynamicWeightModule | nn.Identity):
        return
    if isinstance(original, nn.LayerNorm):
        if original.bias is not None and original.bias.detach().abs().max() > 0:
            raise BcosValueError(f"{type(original).__name__}: a LayerNorm with a bias the bridge runs natively "
                                 "cannot be made detachable without changing the model; B-cosify it first")
        replacement = BcosLayerNorm.from_layer_norm(original)
    elif isinstance(original, Gemma2RMSNorm):
        # gain 1 + weight: DetachableRMSNorm (gain weight) computed another model, a plain Gemma 2's bridge gave
        # logits of exactly 0 (its gains start at 0), silently; bcosify's Gemma mixin keeps the stock maths
        from bcos_plugins.convert.bcosify import mixed_class
        from bcos_plugins.convert.gemma import BcosGemmaRMSNorm

        replacement = copy.deepcopy(original)
        replacement.__class__ = mixed_class(BcosGemmaRMSNorm, type(original))
    elif hasattr(original, "weight") and (hasattr(original, "variance_epsilon") or hasattr(original, "eps")):
        replacement = DetachableRMSNorm.from_rms_norm(original)
    else:
        raise BcosTypeError(f"{type(original).__name__}: a normalisation the bridge runs natively and "
                            "bcos_plugins cannot make detachable; supported: LayerNorm and RMSNorm")
    _check_same_norm(original, replacement)
    norm_bridge.set_original_component(replacement.train(original.training))


def _check_same_norm(original: nn.Module, replacement: nn.Module) -> None:
    """Refuse a detachable replacement that computes another function than the norm it replaces (a gain kept in
    another form, as Gemma's ``1 + weight`` was): the bridge would run another model without an error."""
    weight = original.weight
    probe = torch.randn(2, weight.shape[-1], generator=torch.Generator().manual_seed(0)).to(weight)
    with torch.no_grad():
        want, got = original(probe), replacement(probe)
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max().clamp_min(1))):
        raise BcosTypeError(f"{type(original).__name__}: a normalisation the bridge runs natively whose detachable "
                            f"form ({type(replacement).__name__}) computes another function; B-cosify the model first")


def _make_activation_explainable(mlp_bridge: nn.Module) -> None:
    """Make the activation of a non-gated MLP the bridge runs natively (GPT-2's ``act``) detachable: its gate
    ``act(x) / x`` is a dynamic weight, and with it in the gradient a plain GPT-2's contributions missed up to 4 %
    of the logit (completeness error 0.038 with ``gelu_new``) while the bridge was reported explainable. B-cos
    models' activations already are; an activation without a detachable form is refused."""
    from bcos_plugins.convert.bcosify import (
        ACTIVATION_GATES,
        IDENTITY_ACTIVATIONS,
        PIECEWISE_LINEAR_ACTIVATIONS,
        SUPPORTED_ACTIVATION_NAMES,
        activation_refusal,
        gelu_kind,
    )
    from bcos_plugins.nn.activation import DetachableActivation

    original = getattr(mlp_bridge, "original_component", None)
    if original is None:
        return
    for name, child in original.named_children():
        kind = type(child).__name__
        if isinstance(child, DetachableActivation | nn.Dropout | nn.Identity) or kind in IDENTITY_ACTIVATIONS \
                or kind in PIECEWISE_LINEAR_ACTIVATIONS:
            continue  # detachable or linear pieces need nothing; a leaky ReLU's gradient is its gate already
        refusal = activation_refusal(child)
        # before the parameter test below: an activation with learned parameters (xIELU) was taken for a
        # projection and left with its gate in the gradient (completeness error 0.19-0.22, silently)
        if refusal is None and (any(True for _ in child.parameters()) or any(True for _ in child.children())):
            continue  # projections (LinearBridge, Conv1D) hold parameters
        if refusal is not None or kind not in ACTIVATION_GATES:
            raise BcosTypeError(
                f"hf_model: its MLP activation {kind} ({name}) has no detachable form"
                f"{f' (it {refusal})' if refusal else ''}, so no explanation of the bridge would be exact. "
                f"Supported: {SUPPORTED_ACTIVATION_NAMES}")
        setattr(original, name, DetachableActivation(gelu_kind(child)).train(child.training))


def make_bridge_explainable(bridge: nn.Module) -> nn.Module:
    """Route the bridge's own dynamic weights through detachable hook points (in place, idempotent).

    See the module docstring for which hook points; the forward values do not change. Returns ``bridge``.
    """
    check_bridge_internals()
    bridge_cls, attention, gated, joint, _linear, norm = _bridge_classes()
    from transformer_lens.model_bridge.generalized_components import MLPBridge as mlp

    if not isinstance(bridge, bridge_cls):
        raise BcosTypeError(f"bridge: expected a TransformerBridge, got {type(bridge).__name__}. Build one with "
                            "transformer_bridge_from_hf(hf_model)")
    for module in bridge.modules():
        if isinstance(module, attention):
            _swap_to_dynamic(module.hook_pattern)
        elif isinstance(module, norm) and hasattr(module, "hook_scale"):
            _make_norm_explainable(module)
        elif isinstance(module, gated) and hasattr(module, "gate"):
            # the whole gate branch act(x W_gate) is the dynamic weight of act(...) * (x W_in): its output hook
            # (before the activation) detaches the branch; the activation of a detached input is constant too
            _swap_to_dynamic(module.gate.hook_out)
        elif type(module) is mlp:  # a non-gated MLP run natively (GPT-2): its activation's gate
            _make_activation_explainable(module)
    setattr(bridge, EXPLAINABLE_BRIDGE_MARKER, True)
    return bridge


def native_norm_input_hook(model: nn.Module, hook_name: str) -> tuple[str, bool] | None:
    """For ``hook_name`` the ``hook_normalized`` of a normalisation that ``model`` (a bridge) runs natively: the name
    of that norm's input hook and whether it centres its input (LayerNorm); ``None`` for every other hook.

    On the native path the wrapped (detachable) norm computes the block's output, and TransformerLens computes the
    ``hook_normalized`` value beside it, as ``x * rsqrt(mean(x^2) + eps)``, a scale that never passes through
    ``hook_scale``: in explanation mode the forward stays linear, but a value read at that hook is not (each token's
    input x gradient of a scale-free function of a position is zero, so an SAE feature read there was explained as
    almost nothing, its contributions missing all of it). :func:`linear_normalized` gives the exact value."""
    if not is_explainable_bridge(model) or not hook_name.endswith("hook_normalized"):
        return None
    point = getattr(model, "hook_dict", {}).get(hook_name)
    norm_cls = _bridge_classes()[-1]
    for module in model.modules():
        if isinstance(module, norm_cls) and getattr(module, "hook_normalized", None) is point \
                and _runs_original_norm(module):
            return module.hook_in.name, not module.uses_rms_norm
    return None


def linear_normalized(x: torch.Tensor, normalized: torch.Tensor, centred: bool) -> torch.Tensor:
    """``normalized`` (a native norm's ``hook_normalized``, see :func:`native_norm_input_hook`) as the norm's input
    ``x`` (centred for a LayerNorm) times each position's scale held constant: the same values, linear in ``x``."""
    x = x.to(normalized.dtype)  # TransformerLens upcasts half precision to float32 for the hook's value
    if centred:
        x = x - x.mean(-1, keepdim=True)
    x_norm = x.detach().norm(dim=-1, keepdim=True)
    ratio = normalized.detach().norm(dim=-1, keepdim=True) / x_norm.clamp_min(torch.finfo(x.dtype).tiny)
    out = x * ratio
    tolerance = 1e-4 * float(normalized.detach().abs().max().clamp_min(1e-30))
    if (out.detach() - normalized.detach()).abs().max() > tolerance:
        raise BcosRuntimeError("TransformerLens' native normalisation no longer computes hook_normalized as its input "
                               "times one scale per position; bcos_plugins.adapters' bridge support needs updating")
    return out


def transformer_bridge_from_hf(hf_model: nn.Module, *, tokenizer=None, model_name: str | None = None):
    """A ``TransformerBridge`` over a copy of ``hf_model`` that computes the same logits; ``hf_model`` is untouched.

    Args:
        hf_model: a transformers causal LM of :data:`SUPPORTED_BRIDGE_ARCHITECTURES` (``GPT2LMHeadModel``,
            ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
            ``Gemma2ForCausalLM``): B-cosified (:func:`bcos_plugins.bcosify`), bilinear (a gated MLP with
            ``hidden_act="linear"``) or plain.
        tokenizer: the model's tokenizer (in-memory tokenizers work); needed for text inputs. Without one a
            placeholder that names ids ``t0 t1 ...`` is attached, with no hub access: token-id workflows work,
            and text (``to_tokens("...")``, ``bridge("...")``) raises a ``BcosValueError`` naming ``tokenizer=``.
        model_name: the name the bridge records (default ``hf_model.config.name_or_path`` or the
            architecture); the architecture itself is read from ``hf_model.config``.

    Returns:
        an explainable (:func:`make_bridge_explainable`) ``TransformerBridge`` in ``hf_model``'s train/eval
        mode. It holds its own copy of the weights (about the model's size in memory), with the final norm's gain
        folded into the LM head (so ``cache.logit_attrs`` sums to the logit; a tied head becomes untied there).
    """
    # a tokenizer where the model goes (the arguments swapped), ids, a pipeline: named with the fix, as everywhere
    require_model_object(hf_model, "hf_model", only_stand_ins=True)
    if not isinstance(hf_model, nn.Module):
        raise BcosTypeError(f"hf_model: expected a transformers model, got {type(hf_model).__name__}")
    # a B-cos checkpoint loaded with plain AutoModel runs the stock layers: the bridge wrapped that conventional
    # model (logits 0.79 off the saved B-cos GPT-2's) and explained it as if nothing were wrong
    refuse_stock_loaded_bcos(hf_model, "hf_model")
    if isinstance(hf_model, _bridge_classes()[0]):
        # it was taken for the model it wraps and booted a bridge over the bridge: over a GPT-2 that failed, blaming
        # the MLP activation ("HookPoint (hook_in) has no detachable form"), over a Llama it doubled every hook
        raise argument_error("hf_model", "is a TransformerBridge already, not a transformers model",
                             "Use the bridge as it is, or pass the transformers model it was built from",
                             kind=BcosTypeError)
    arch = _architecture(hf_model)
    refuse_meta_model(hf_model, "hf_model")
    _refuse_inexpressible(hf_model, arch)
    if tokenizer is not None:  # TransformerLens' own bridge("text") failed in the embedding (IndexError)
        refuse_a_model_as_the_tokenizer(tokenizer, call="transformer_bridge_from_hf(model, tokenizer=tokenizer)")
        require_tokenizer_fits(hf_model, tokenizer)  # refuses a hub name too (require_tokenizer_object)
    check_bridge_internals()
    bridge_cls, _attention, _gated, joint, _linear, _norm = _bridge_classes()
    copied = copy.deepcopy(hf_model)
    setattr(copied, BRIDGE_COPY_MARKER, True)  # the boot guard lets this copy through: it is made exact below
    _move_soft_cap_into_head(copied)
    placeholder = tokenizer is None
    if placeholder:
        tokenizer = _placeholder_tokenizer(vocabulary_size(hf_model))
    name = model_name or getattr(hf_model.config, "name_or_path", "") or arch
    with tempfile.TemporaryDirectory(prefix="bcos_bridge_tokenizer_") as folder:
        # device: where the user's model is. Without it TransformerLens moves the copy to its own default device
        # (CUDA whenever one is present), so a model kept on the CPU of a GPU machine became a bridge on the GPU
        # whose cfg.device then mixed devices in the cache's decompositions (found on an H200)
        bridge = bridge_cls.boot_transformers(name, hf_model=copied, tokenizer=_reloadable(tokenizer, folder),
                                              device=next(copied.parameters()).device)
    # before anything runs it: its forward warns about a padded token batch without a mask (run_with_cache(tokens)
    # of such a batch was silently wrong at the shorter rows, where only the adapter's own entry points warned)
    bridge.__class__ = _padding_checked_class(type(bridge))
    if placeholder:
        _ids_only(bridge.tokenizer)
    else:
        _require_same_sides(bridge.tokenizer, tokenizer)
    for module in bridge.modules():
        if not isinstance(module, joint):
            continue
        c_attn = getattr(module.original_component, "c_attn", None)
        c_attn = getattr(c_attn, "original_component", c_attn)  # the bridge wraps it in a LinearBridge
        if isinstance(c_attn, StockQueryKeyConv1D):
            for part, layer in zip((module.q, module.k, module.v), _stock_query_key_parts(c_attn), strict=True):
                part.set_original_component(layer)
        elif isinstance(c_attn, DynamicWeightModule):
            if not isinstance(c_attn, BcosConv1D):
                raise BcosTypeError(f"hf_model: a fused attention projection of type {type(c_attn).__name__} "
                                    "cannot be split into B-cos q/k/v; expected BcosConv1D (GPT-2 via bcosify)")
            for part, layer in zip((module.q, module.k, module.v), _bcos_qkv_parts(c_attn), strict=True):
                part.set_original_component(layer)
    _fold_final_norm(bridge, copied)
    make_bridge_explainable(bridge)
    return bridge.train(hf_model.training)
