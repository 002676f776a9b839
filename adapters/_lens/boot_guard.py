"""The one place that patches TransformerLens: its own bridge construction refuses B-cos models.

TransformerLens' ``TransformerBridge.boot_transformers(name, hf_model=model)`` (and every other way it builds a
bridge) wraps the model it is given *in place*, and for GPT-2 splits the fused ``c_attn`` into plain ``nn.Linear``
q/k/v built from the raw weights: on a B-cos model that is another model (the logits move, explanations lose
completeness) and the user's model has been rewritten. :func:`install_boot_guard` (run once ``bcos_plugins`` and
TransformerLens are both imported, in either order: ``bcos_plugins._host_import_guard``; and by importing
``bcos_plugins.adapters.transformer_lens``) makes those calls fail loudly on a model that holds B-cos
(dynamic-weight) modules or carries B-cos settings, before TransformerLens touches it, with the fix:
:func:`~.bridge.transformer_bridge_from_hf`, which builds an exact, explainable bridge over a copy.

What this relies on in TransformerLens (3.9 and 4.x), checked by :func:`check_boot_guard` (and in the tests, so
a release that moves any of it fails loudly instead of leaving B-cos models unguarded):

- every bridge is built by ``TransformerBridge.__init__(self, model, adapter, tokenizer)``, before any submodule
  of ``model`` is swapped (``sources.transformers.boot``, ``boot_transformers``, ``build_bridge_from_module``);
- ``transformer_lens.model_bridge.sources.transformers.boot(model_name, ..., hf_model=...)`` (a module in 3.9, a
  package re-exporting it from ``.source`` in 4.x) is the function behind ``TransformerBridge.boot_transformers``; guarding it up front keeps even the model's config untouched
  (``boot`` switches ``config._attn_implementation`` to eager before it builds the bridge).

It also guards TransformerLens' cache decompositions on bridges over B-cos models: ``ActivationCache``'s
:data:`CACHE_WEIGHT_READERS` multiply cached activations by the bridge's raw ``W_O`` / ``W_out``, but a B-cos
projection's weight depends on the input, so their per-head and per-neuron results do not sum to ``attn_out`` /
``mlp_out`` (wrong numbers, silently). On a ``TransformerBridge`` that holds B-cos projections the head methods
(:data:`_HEAD_RESULT_METHODS`) first cache each head's exact share (:func:`_cache_exact_head_results`), which
TransformerLens then reads instead of ``hook_z @ W_O`` (it keeps batched ``hook_result`` entries in 3.9 and 4.x);
``get_neuron_results`` is replaced by :func:`_exact_neuron_results`, which ``stack_neuron_results`` stacks
(except on its fused ``apply_ln`` + ``project_output_onto`` path, refused, naming the exact alternatives), and
``get_full_resid_decomposition`` stacks those. Every other model keeps TransformerLens' behaviour. Relied on:
those methods are defined on ``transformer_lens.ActivationCache`` and are the only ones that read ``W_O`` /
``W_out`` besides the private helpers in :data:`_PRIVATE_WEIGHT_READERS`, which only they call (checked from the
methods' source, so a release that adds another reader fails loudly); a cached batched ``hook_result`` is used as
it is; the bridge's output projections are ``blocks[i].attn.o`` / ``blocks[i].mlp.out`` (``original_component``;
a bridge without them is refused, not approximated).

On the bridges :func:`~.bridge.transformer_bridge_from_hf` builds, TransformerLens' tokenizer reassignment
(``bridge.tokenizer = tok``, the ``TransformerBridge.tokenizer`` property's setter) refuses a tokenizer with more
tokens than the model's embedding rows, as ``transformer_bridge_from_hf(tokenizer=)`` does (TransformerLens resized
``cfg.d_vocab`` to it, and text then failed in the embedding); where a release has no such setter nothing is patched.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys

import torch
from torch import nn

from bcos_plugins.convert.architectures import SPECS, architecture_name
from bcos_plugins.errors import BcosRuntimeError, BcosTypeError
from bcos_plugins.nn.functional import bcos_scale, input_norm
from bcos_plugins.nn.linear import AlignmentPressure, BcosLinear

from .shares import head_shares, neuron_shares

__all__ = ["BRIDGE_COPY_MARKER", "CACHE_UNEMBEDDING_READERS", "CACHE_WEIGHT_READERS", "EXPLAINABLE_BRIDGE_MARKER",
           "FINAL_NORM_FOLDED_MARKER", "check_boot_guard", "install_boot_guard", "is_bcos_bridge", "is_explainable_bridge",
           "is_guarded",
           "refuse_bcos_model",
           "refuse_post_norm_decomposition", "refuse_raw_weight_decomposition", "refuse_unfolded_logit_attrs"]

# set on the copy transformer_bridge_from_hf boots: the one B-cos model TransformerLens may wrap (it is made exact)
BRIDGE_COPY_MARKER = "_bcos_plugins_bridge_copy"
# set on bridges whose final norm gain transformer_bridge_from_hf folded into the LM head (logit_attrs is exact there)
FINAL_NORM_FOLDED_MARKER = "_bcos_plugins_final_norm_folded"
# set by bridge.make_bridge_explainable on the bridges transformer_bridge_from_hf builds (is_explainable_bridge reads
# it); here, not in bridge.py, which imports this module
EXPLAINABLE_BRIDGE_MARKER = "_bcos_explainable_bridge"
_GUARDED = "__bcos_plugins_guard__"

# ActivationCache methods that multiply cached activations by the model's raw W_O / W_out (directly or through
# _PRIVATE_WEIGHT_READERS), each with the norm a block applies to that attention / MLP output before hook_attn_out /
# hook_mlp_out (Gemma 2's ln1_post / ln2_post), which their per-head / per-neuron results are taken before; guarded
# on bridges over B-cos models (get_full_resid_decomposition reaches W_O / W_out only through these, so it is exact or
# refused with them)
_POST_NORM_OF = {"compute_head_results": "ln1_post", "stack_head_results": "ln1_post",
                 "get_neuron_results": "ln2_post", "stack_neuron_results": "ln2_post"}
CACHE_WEIGHT_READERS = tuple(_POST_NORM_OF)
# private helpers that read them too and are reached only through CACHE_WEIGHT_READERS (4.x has both)
_PRIVATE_WEIGHT_READERS = ("_ensure_head_results", "_stack_neuron_results_apply_ln_projected")
_READS_OUTPUT_WEIGHTS = re.compile(r"\.W_(O|out)\b")
# ActivationCache methods that multiply the normalised residual by W_U alone (the final norm's gain folded into it):
# refused on B-cos bridges where transformer_bridge_from_hf could not fold it (a soft-capped head is not linear)
CACHE_UNEMBEDDING_READERS = ("logit_attrs",)
# the ones that use cached per-head results (hook_result) when present: made exact on B-cos bridges
_HEAD_RESULT_METHODS = tuple(method for method, post in _POST_NORM_OF.items() if post == "ln1_post")


def refuse_bcos_model(model, entry: str) -> None:
    """Raise when ``model`` is a B-cos model that TransformerLens' ``entry`` would turn into another model."""
    if not isinstance(model, nn.Module) or getattr(model, BRIDGE_COPY_MARKER, False):
        return
    from bcos_plugins.attribution import has_dynamic_weights

    settings = getattr(getattr(model, "config", None), "bcos", None)
    if has_dynamic_weights(model):
        what = "holds B-cos (dynamic-weight) modules"
    elif isinstance(settings, dict):
        what = "carries B-cos settings (config.bcos) but stock modules (a B-cos checkpoint loaded as a stock model)"
    else:
        return
    raise BcosTypeError(
        f"hf_model: {type(model).__name__} {what}; TransformerLens' {entry} would wrap it in place and rebuild its "
        "layers as plain ones from the raw weights (for GPT-2 the fused c_attn becomes plain q/k/v), which changes "
        "your model and its logits. Use bcos_plugins.adapters.transformer_lens.transformer_bridge_from_hf(model, "
        "tokenizer=tokenizer): an exact, explainable TransformerBridge over a copy"
        + (" (load the checkpoint with bcos_plugins.load_bcos_model first)" if "config.bcos" in what else ""))


def is_bcos_bridge(model) -> bool:
    """Whether ``model`` is a ``TransformerBridge`` whose forward runs B-cos layers (any :class:`AlignmentPressure`
    module): the one test of the guard's refusals and of the bridge's weight-processing refusal. The layers, not
    ``original_model.config.bcos``: a B-cos model whose config has no ``bcos`` record still normalises its weight
    rows (``enable_compatibility_mode()`` was allowed on it and changed its logits, silently), and a stock-loaded
    checkpoint whose config has one runs plain layers, which TransformerLens' processing rewrites exactly."""
    bridge_cls, _source = _targets()
    return isinstance(model, bridge_cls) and any(isinstance(m, AlignmentPressure) for m in model.modules())


def refuse_raw_weight_decomposition(model, method: str, reason: str = "") -> None:
    """Raise when ``model`` is a ``TransformerBridge`` over a B-cos model, whose raw ``W_O`` / ``W_out`` are not
    the weights its forward applied, so ``ActivationCache.<method>`` would return wrong numbers."""
    if not is_bcos_bridge(model):
        return
    raise BcosTypeError(
        f"ActivationCache.{method}: this cache comes from a TransformerBridge over a B-cos model{reason}. "
        "TransformerLens computes per-neuron results as hook_post times the raw W_out (and per-head results as "
        "hook_z times the raw W_O where it cannot use exact ones), but a B-cos projection's weight depends on the "
        "input, so those results would not sum to mlp_out / attn_out (wrong numbers). For an exact split use "
        "bcos_plugins.adapters.transformer_lens."
        "token_component_decomposition(bridge, tokens, target=...) (input token x component shares that sum to "
        "the logit) or explain_logits(bridge, tokens, target=...)" + _hooked_transformer_route(model, method))


def _hooked_transformer_route(bridge, method: str) -> str:
    """The HookedTransformer alternative for the bridged class, as the registry has it: offered only where
    ``hooked_transformer_from_hf`` takes the class (for a class without a converter, naming it would send users to
    an error)."""
    name = architecture_name(getattr(bridge, "original_model", bridge))
    spec = SPECS.get(name)
    if spec is not None and spec.lens_conversion is None:
        return f" (hooked_transformer_from_hf does not take a {name}: the bridge is its TransformerLens route)"
    return (f"; on TransformerLens 3.x, hooked_transformer_from_hf(hf_model) gives a HookedTransformer whose "
            f"run_with_cache makes {method} exact")


def is_explainable_bridge(model: nn.Module) -> bool:
    """Whether :func:`~bcos_plugins.adapters._lens.bridge.make_bridge_explainable` has been applied to ``model`` (as
    ``transformer_bridge_from_hf`` does): its cache decompositions are the adapter's promise, plain models' included."""
    return bool(getattr(model, EXPLAINABLE_BRIDGE_MARKER, False))


def refuse_unfolded_logit_attrs(model, method: str) -> None:
    """Raise when ``model`` is a ``TransformerBridge`` over a B-cos model (or one ``transformer_bridge_from_hf`` built
    over any model) whose logits are not ``W_U`` applied to the gain-free normalised residual, so
    ``ActivationCache.<method>``'s terms would not sum to the logit."""
    cap = getattr(getattr(getattr(model, "original_model", None), "config", None), "final_logit_softcapping", None)
    # a plain soft-capped Gemma 2's head is a plain linear layer, so its gain was folded, but the cap still bends
    # each logit: logit_attrs' terms summed to the uncapped z (0.065 off a tiny model's logits), without a word
    if not (is_bcos_bridge(model) or (is_explainable_bridge(model) and cap is not None)) \
            or (getattr(model, FINAL_NORM_FOLDED_MARKER, False) and cap is None):
        return
    reason = (f"whose LM head soft-caps the logits ({cap} * tanh(z / {cap})), so a logit is not a sum of one term "
              "per residual component" if cap is not None else
              "whose final norm gain is not folded into W_U (its LM head is not a plain linear layer, or the bridge "
              "was not built by transformer_bridge_from_hf), which logit_attrs assumes")
    kind = "B-cos model" if is_bcos_bridge(model) else "model"
    raise BcosTypeError(
        f"ActivationCache.{method}: this cache comes from a TransformerBridge over a {kind} {reason}; its terms "
        "would not add up to the logit (wrong numbers). For an exact split use bcos_plugins.adapters."
        "transformer_lens.token_component_decomposition(bridge, tokens, target=...) (input token x component "
        "shares that sum to the logit) or explain_logits(bridge, tokens, target=...)")


def refuse_post_norm_decomposition(model, method: str) -> None:
    """Raise when ``model`` is a bridge built by ``transformer_bridge_from_hf`` over a plain (not B-cos) model whose
    blocks normalise their attention / MLP output again (Gemma 2's ``ln1_post`` / ``ln2_post``): TransformerLens'
    per-head and per-neuron results (``hook_z`` @ ``W_O``, ``hook_post`` @ ``W_out``) are taken before that norm, so
    they do not sum to ``hook_attn_out`` / ``hook_mlp_out`` (B-cos bridges are refused or made exact by the guard)."""
    post = _POST_NORM_OF.get(method)
    if post is None or not is_explainable_bridge(model) or is_bcos_bridge(model):
        return
    blocks = [i for i, block in enumerate(getattr(model, "blocks", [])) if hasattr(block, post)]
    if not blocks:
        return
    what = "attention" if post == "ln1_post" else "MLP"
    raise BcosTypeError(
        f"ActivationCache.{method}: this cache comes from a TransformerBridge over a model that normalises each "
        f"{what} output again (blocks.{blocks[0]}.{post}); TransformerLens computes per-"
        f"{'head' if what == 'attention' else 'neuron'} results from the raw output projection, before that norm, so "
        f"they would not sum to hook_{'attn' if what == 'attention' else 'mlp'}_out (wrong numbers). For an exact "
        "split use bcos_plugins.adapters.transformer_lens.token_component_decomposition(bridge, tokens, target=...) "
        "(input token x component shares that sum to the logit) or explain_logits(bridge, tokens, target=...)"
        + _hooked_transformer_route(model, method))


def _cache_exact_head_results(cache, method: str) -> None:
    """Cache each head's exact share of ``attn_out`` as ``blocks.{layer}.attn.hook_result`` (B-cos bridges).

    A B-cos output projection computes ``y = s(x) * (ŵ x)`` per output unit, where ``x`` is the heads' ``z``
    concatenated and the scale ``s(x)`` depends on the whole of ``x``; head ``h``'s share is ``s(x) * (ŵ x_h)``
    (``x_h``: ``x`` with the other heads zeroed), and the shares sum to ``y``. ``hook_z`` @ raw ``W_O`` has
    neither the scale nor the unit-norm rows.
    """
    model = cache.model
    if not cache.has_batch_dim:  # 3.9 recomputes batchless hook_result entries from the raw W_O
        refuse_raw_weight_decomposition(model, method, " and has no batch dimension (run_with_cache(..., "
                                        "remove_batch_dim=False) gives exact per-head results)")
    for layer in range(model.cfg.n_layers):
        projection = getattr(getattr(model.blocks[layer].attn, "o", None), "original_component", None)
        if not isinstance(projection, BcosLinear) or projection.max_out != 1:
            refuse_raw_weight_decomposition(model, method, f" whose layer {layer} output projection is "
                                            f"{type(projection).__name__}, not a B-cos layer without MaxOut")
        z = cache[("z", layer, "attn")]
        concatenated = z.flatten(-2)
        scale = bcos_scale(projection._linear(concatenated), input_norm(concatenated), projection.b)
        # W_O layout (head, d_head, d_model) of the unit-norm (d_model, head * d_head) weight
        shares = head_shares(z, projection.unit_weight().T.unflatten(0, z.shape[-2:]), scale)
        # the shares are attn_out's only where nothing follows the projection (Gemma 2 normalises it again)
        attn_out = cache.cache_dict.get(f"blocks.{layer}.hook_attn_out")
        tolerance = max(1e-4, 16 * torch.finfo(shares.dtype).eps) * (attn_out.abs().max() if attn_out is not None
                                                                      else 0)
        if attn_out is None or (shares.sum(-2) - attn_out).abs().max() > tolerance:
            refuse_raw_weight_decomposition(model, method, (
                " whose cache lacks hook_attn_out (cache it to get exact per-head results)" if attn_out is None
                else f" whose layer {layer} attention output is not its output projection's (a norm follows it, or "
                     "a forward hook changed hook_attn_out), so per-head shares of the projection do not sum to "
                     "attn_out"))
        cache.cache_dict[f"blocks.{layer}.attn.hook_result"] = shares


def _exact_neuron_results(cache, layer: int, neuron_slice=None, pos_slice=None, project_output_onto=None):
    """``get_neuron_results`` on a B-cos bridge: neuron ``n``'s share of ``mlp_out`` is ``post_n * ŵ_out[:, n] *
    s(post)`` (the B-cos projection's per-unit scale of the whole input), not ``post_n * W_out[n]``; the shares
    sum to ``mlp_out`` (checked). Same arguments and output shapes as TransformerLens'."""
    model = cache.model
    method = "get_neuron_results"
    projection = getattr(getattr(model.blocks[layer].mlp, "out", None), "original_component", None)
    if not isinstance(projection, BcosLinear) or projection.max_out != 1:
        refuse_raw_weight_decomposition(model, method, f" whose layer {layer} MLP output projection is "
                                        f"{type(projection).__name__}, not a B-cos layer without MaxOut")
    post = cache[("post", layer, "mlp")]
    linear = projection._linear(post)
    scale = bcos_scale(linear, input_norm(post), projection.b)
    mlp_out = cache.cache_dict.get(f"blocks.{layer}.hook_mlp_out")
    if mlp_out is None or ((linear * scale - mlp_out).abs().max()
                           > max(1e-4, 16 * torch.finfo(post.dtype).eps) * mlp_out.abs().max()):
        refuse_raw_weight_decomposition(model, method, (
            " whose cache lacks hook_mlp_out (cache it to get exact per-neuron results)" if mlp_out is None
            else f" whose layer {layer} MLP output is not its output projection's (a norm follows it, or a "
                 "forward hook changed hook_mlp_out)"))
    # W_out layout (d_mlp, d_model) of the unit-norm (d_model, d_mlp) weight: neuron n writes column n
    return neuron_shares(post, projection.unit_weight().T, scale, neuron_slice, pos_slice, project_output_onto)


def _targets():
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.sources import transformers as source

    return TransformerBridge, source


def _cache_target():
    from transformer_lens import ActivationCache

    return ActivationCache


def _unguarded_weight_readers(cache_cls) -> list[str]:
    """Functions defined on ``cache_cls`` that read ``W_O`` / ``W_out`` but are neither guarded nor known helpers."""
    known = set(CACHE_WEIGHT_READERS) | set(_PRIVATE_WEIGHT_READERS)
    found = []
    for name, value in vars(cache_cls).items():
        function = inspect.unwrap(getattr(value, "__func__", value))
        if name in known or not inspect.isfunction(function):
            continue
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):  # pragma: no cover - source not shipped: nothing to scan
            continue
        if _READS_OUTPUT_WEIGHTS.search(source):
            found.append(name)
    return found


def check_boot_guard() -> None:
    """Check what the guard relies on in the installed TransformerLens; raise naming what changed."""
    try:
        bridge_cls, source = _targets()
    except ImportError as error:
        raise BcosRuntimeError(f"TransformerLens' bridge modules moved ({error}); the B-cos boot guard "
                               "(bcos_plugins.adapters._lens.boot_guard) needs updating") from error
    problems = []
    init = inspect.signature(bridge_cls.__init__)
    if list(init.parameters)[1:2] != ["model"]:
        problems.append(f"TransformerBridge.__init__{init} no longer takes the model first")
    boot = getattr(source, "boot", None)
    if boot is None or "hf_model" not in inspect.signature(boot).parameters:
        problems.append("transformer_lens.model_bridge.sources.transformers.boot(..., hf_model=) is gone")
    cache_cls = _cache_target()
    for guarded in (CACHE_WEIGHT_READERS, CACHE_UNEMBEDDING_READERS):
        missing = [name for name in guarded if not inspect.isfunction(vars(cache_cls).get(name))]
        if missing:
            problems.append(f"ActivationCache no longer defines {missing}")
    unguarded = _unguarded_weight_readers(cache_cls)
    if unguarded:
        problems.append(f"ActivationCache.{unguarded} now read W_O / W_out (add them to CACHE_WEIGHT_READERS or "
                        "_PRIVATE_WEIGHT_READERS)")
    if problems:
        raise BcosRuntimeError("TransformerLens changed what the B-cos boot guard relies on: " + "; ".join(problems)
                               + ". bcos_plugins.adapters._lens.boot_guard needs updating")


def _guarded_init(init):
    @functools.wraps(init)
    def __init__(self, model, *args, **kwargs):
        refuse_bcos_model(model, "TransformerBridge")
        init(self, model, *args, **kwargs)

    setattr(__init__, _GUARDED, True)
    return __init__


def _guarded_boot(boot):
    @functools.wraps(boot)
    def guarded(*args, **kwargs):
        bound = inspect.signature(boot).bind_partial(*args, **kwargs)
        refuse_bcos_model(bound.arguments.get("hf_model"), "TransformerBridge.boot_transformers")
        return boot(*args, **kwargs)

    setattr(guarded, _GUARDED, True)
    return guarded


def _folds_norm_into_projection(method, cache, args, kwargs) -> bool:
    # stack_neuron_results(apply_ln=True, project_output_onto=p) bypasses get_neuron_results for a fused path
    # that reads W_out (and 4.x's mlp_input=True reads other activations): refused on B-cos bridges
    bound = inspect.signature(method).bind(cache, *args, **kwargs).arguments
    return bool(bound.get("apply_ln") and bound.get("project_output_onto") is not None) or bool(
        bound.get("mlp_input"))


def _guarded_cache_method(name: str, method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if name in _HEAD_RESULT_METHODS and is_bcos_bridge(getattr(self, "model", None)):
            _cache_exact_head_results(self, name)
            if name == "compute_head_results":  # done; TransformerLens' own would only warn they are cached
                return None
        elif name == "get_neuron_results" and is_bcos_bridge(getattr(self, "model", None)):
            return _exact_neuron_results(self, *args, **kwargs)
        elif (name == "stack_neuron_results" and is_bcos_bridge(getattr(self, "model", None))
              and not _folds_norm_into_projection(method, self, args, kwargs)):
            return method(self, *args, **kwargs)  # it stacks get_neuron_results, exact above
        else:
            refuse_post_norm_decomposition(getattr(self, "model", None), name)
            refuse_raw_weight_decomposition(getattr(self, "model", None), name, (
                " (with apply_ln=True and project_output_onto=, or mlp_input=True, TransformerLens takes a path "
                "that reads W_out; stack without project_output_onto and project the stack yourself)")
                if name == "stack_neuron_results" else "")
        return method(self, *args, **kwargs)

    setattr(guarded, _GUARDED, True)
    return guarded


def _guarded_unembedding_reader(name: str, method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        refuse_unfolded_logit_attrs(getattr(self, "model", None), name)
        return method(self, *args, **kwargs)

    setattr(guarded, _GUARDED, True)
    return guarded


def _guarded_tokenizer_setter(setter):
    @functools.wraps(setter)
    def guarded(self, value):
        # TransformerLens' reassignment (bridge.tokenizer = tok) resizes cfg.d_vocab to the tokenizer and took one with
        # more tokens than the model's embedding rows, which transformer_bridge_from_hf(tokenizer=) refuses: bridge(
        # "text") then failed in the embedding (IndexError; a device-side assert on a GPU). Checked on the bridges
        # transformer_bridge_from_hf builds (flagged by make_bridge_explainable, as is_explainable reads it); the
        # first assignment, while a bridge boots, is TransformerLens' own
        if value is not None and getattr(self, "_tokenizer", None) is not None \
                and is_explainable_bridge(self):
            from bcos_plugins.corpus import require_tokenizer_fits

            require_tokenizer_fits(self, value)
        setter(self, value)

    setattr(guarded, _GUARDED, True)
    return guarded


def is_guarded(function) -> bool:
    """Whether ``function`` is one of the guard's wrappers."""
    return getattr(function, _GUARDED, False)


def install_boot_guard() -> None:
    """Guard TransformerLens' bridge construction against B-cos models (idempotent; see the module docstring)."""
    check_boot_guard()
    bridge_cls, source = _targets()
    if not is_guarded(bridge_cls.__init__):
        bridge_cls.__init__ = _guarded_init(bridge_cls.__init__)
    tokenizer = inspect.getattr_static(bridge_cls, "tokenizer", None)
    if isinstance(tokenizer, property) and tokenizer.fset is not None and not is_guarded(tokenizer.fset):
        bridge_cls.tokenizer = tokenizer.setter(_guarded_tokenizer_setter(tokenizer.fset))
    cache_cls = _cache_target()
    for name in CACHE_WEIGHT_READERS:
        if not is_guarded(vars(cache_cls)[name]):
            setattr(cache_cls, name, _guarded_cache_method(name, vars(cache_cls)[name]))
    for name in CACHE_UNEMBEDDING_READERS:
        if not is_guarded(vars(cache_cls)[name]):
            setattr(cache_cls, name, _guarded_unembedding_reader(name, vars(cache_cls)[name]))
    original = source.boot
    if is_guarded(original):
        return
    guarded = _guarded_boot(original)
    # every name TransformerLens exports boot under: its defining module, the package re-exports (sources,
    # sources.transformers: a module in 3.9, a package in 4.x) and boot_transformers, a staticmethod of it; a
    # boot_transformers method that imports boot at call time finds the guarded one through these names
    for name, module in list(sys.modules.items()):
        if name.startswith("transformer_lens.model_bridge") and module is not None:
            for attribute, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attribute, guarded)
    static = inspect.getattr_static(bridge_cls, "boot_transformers", None)
    if isinstance(static, staticmethod) and static.__func__ is original:
        bridge_cls.boot_transformers = staticmethod(guarded)
