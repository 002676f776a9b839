"""TransformerLens' decomposition tools made exact on B-cos and bilinear models.

TransformerLens' ``ActivationCache`` helpers read *parameters*, not activations, in these places:

- ``logit_attrs`` (and ``accumulated_resid``/``decompose_resid`` followed by it) divides by the cached final
  norm scale and multiplies by ``W_U``: it assumes the final norm's weight is folded into ``W_U``.
  :func:`fold_final_norm_weight` does that fold (exact for every model: ``(x̂ * w) @ W_U = x̂ @ (w ⊙ W_U)``),
  and the conversions (:func:`hooked_transformer_from_hf`, ``BcosHookedTransformer``) apply it, so
  ``ln_final`` is a weightless ``LayerNormPre`` / ``RMSNormPre``.
- ``compute_head_results`` / ``stack_head_results`` multiply the cached ``z`` by ``W_O``, and
  ``get_neuron_results`` / ``stack_neuron_results`` / ``get_full_resid_decomposition(expand_neurons=True)``
  multiply the cached ``post`` by ``W_out``. A B-cos projection uses ``ŵ`` (unit-norm) times an
  input-dependent scale, so the raw parameters give the wrong per-head and per-neuron results.
  :class:`BcosActivationCache` (what ``BcosHookedTransformer.run_with_cache`` returns) computes them from the
  forward's own values: ``result_h = scale_o ⊙ (z_h @ ŵ_O[h])`` and ``result_n = post_n * ŵ_out[n] ⊙ scale_out``
  with the cached ``hook_bcos_scale_o`` / ``hook_bcos_scale_out``. Where a norm follows the projection (Gemma 2's
  ``ln1_post`` / ``ln2_post``) each share is also multiplied by that norm's gain over its cached ``hook_scale``
  (the forward's value, a constant in explanation mode). They sum to ``hook_attn_out`` / ``hook_mlp_out`` exactly.
- A cache filled under the caller's forward hooks (``model.hooks(...)``, ``add_hook``) that patched or ablated the
  residual stream, a block's ``hook_attn_out`` / ``hook_mlp_out`` or ``ln_final.hook_normalized``: the components
  (computed before the hook) no longer sum to the value there, so the decompositions that read past it
  (``decompose_resid``, ``get_full_resid_decomposition``, ``stack_head_results``, ``stack_neuron_results``,
  ``apply_ln_to_stack`` and so ``logit_attrs``) are refused, naming the hook (:mod:`.hook_checks`, shared with the
  bridges' caches). ``run_with_cache`` records the hooked points (``hooked_at_run``) and each refusal first checks the
  sum against the cached value, so hooks that only read, or that change what the components are computed from
  (``hook_z``, ``hook_post``, a scale, the embeddings), pass: the sums still hold.
- ``logit_attrs`` of a soft-capped model (``bcos_output_logits_soft_cap``, Gemma 2) would sum to the uncapped
  logit: it is refused, naming ``token_component_decomposition``, whose shares sum to the capped logit.

What cannot be exact: analyses of the raw weights alone (``model.W_O``, ``model.OV``, ``model.QK``, any
``FactoredMatrix`` built from parameters, ``SVDInterpreter``) describe ``ŵ`` up to the per-unit norms, not the
map the forward applied; a B-cos map depends on the input. :func:`effective_weight` gives the weight the
forward used at each (batch, position) of a cache, e.g. an exact OV circuit of head ``h`` at position ``p``::

    W_V = effective_weight(cache, 0, "W_V")[b, p, h]     # (d_model, d_head), at the value's position p
    W_O = effective_weight(cache, 0, "W_O")[b, q, h]     # (d_head, d_model), at the query position q
    FactoredMatrix(W_V, W_O)
"""

from __future__ import annotations

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedTransformer
from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from transformer_lens.utilities.activation_functions import softcap_enabled

from bcos_plugins.errors import BcosRuntimeError, BcosTypeError, BcosValueError, argument_error
from bcos_plugins.nn.functional import unit_norm

from .final_norm import fold_final_norm_weight_in_state_dict
from .hook_checks import HookCheckedCache, cache_block_index
from .shares import head_shares, neuron_shares

__all__ = [
    "BcosActivationCache",
    "check_cache_internals",
    "effective_weight",
    "fold_final_norm_weight",
    "fold_final_norm_weight_in_state_dict",
]

# projection -> (module attribute "attn"/"mlp", scale hook suffix, axes of the weight normalised per unit)
_PROJECTIONS = {
    "W_Q": ("attn", "q", 1), "W_K": ("attn", "k", 1), "W_V": ("attn", "v", 1), "W_O": ("attn", "o", (0, 1)),
    "W_in": ("mlp", "in", 0), "W_gate": ("mlp", "gate", 0), "W_out": ("mlp", "out", 0),
}


def _weightless(norm: nn.Module, cfg) -> nn.Module:
    return RMSNormPre(cfg) if isinstance(norm, RMSNorm | RMSNormPre) else LayerNormPre(cfg)


def fold_final_norm_weight(model) -> None:
    """Fold the final norm's weight (and bias) into the unembedding, in place; ``ln_final`` becomes weightless.

    Exact: the logits do not change. Afterwards ``cache.logit_attrs`` (which multiplies the normalised
    residual by ``W_U`` alone) sums to the logit. Idempotent; a model without a final norm is left alone.
    Call :func:`~.model.make_explainable` afterwards (the new norm's ``hook_scale`` must be detachable).
    """
    norm = getattr(model, "ln_final", None)
    if not isinstance(norm, LayerNorm | RMSNorm):
        return
    params = {"ln_final.w": norm.w.detach()}
    if isinstance(norm, LayerNorm):
        params["ln_final.b"] = norm.b.detach()
    unembed = model.unembed
    folded = fold_final_norm_weight_in_state_dict(
        {**params, "unembed.W_U": unembed.W_U.detach(), "unembed.b_U": unembed.b_U.detach()})
    with torch.no_grad():
        unembed.W_U.copy_(folded["unembed.W_U"])
        if not torch.equal(folded["unembed.b_U"], unembed.b_U):
            if not isinstance(unembed.b_U, nn.Parameter):
                raise BcosValueError(
                    "ln_final.b: a model without biases has a non-zero final-norm bias. Zero it before folding")
            unembed.b_U.copy_(folded["unembed.b_U"])
    model.ln_final = _weightless(norm, model.cfg).to(unembed.W_U.device)


def _scale(cache: ActivationCache, layer: int, part: str, short: str) -> Tensor:
    name = f"blocks.{layer}.{part}.hook_bcos_scale_{short}"
    if name not in cache.cache_dict:
        raise BcosRuntimeError(
            f"{name} is not in the cache; the exact per-{'head' if part == 'attn' else 'neuron'} result of a "
            "B-cos projection needs the scale the forward used. Run run_with_cache without a names_filter, or "
            f"include names ending in 'hook_bcos_scale_{short}'"
        )
    return cache.cache_dict[name]


# the norm TransformerLens applies to a block's attention / MLP output before hook_attn_out / hook_mlp_out
# (use_normalization_before_and_after: Gemma 2), and the output projection it follows
_POST_NORMS = {"attn": ("ln1_post", "W_O", "o"), "mlp": ("ln2_post", "W_out", "out")}


def _output_factor(cache: ActivationCache, layer: int, part: str) -> Tensor:
    """What multiplies each output unit of block ``layer``'s attention / MLP output projection on its way to
    ``hook_attn_out`` / ``hook_mlp_out``, per (batch, position): the B-cos scale (``hook_bcos_scale_o`` / ``_out``)
    and, where a norm follows the projection (Gemma 2's ``ln1_post`` / ``ln2_post``), its gain over its cached scale.
    Both are the forward's values (constants in explanation mode), so the per-head / per-neuron shares they multiply
    sum to the block's output exactly."""
    model = cache.model
    post, projection, short = _POST_NORMS[part]
    factor = _scale(cache, layer, part, short) if _is_scaled(model, projection) else None
    norm = getattr(model.blocks[layer], post, None)
    if norm is None:
        return factor
    if not isinstance(norm, RMSNorm | RMSNormPre):
        raise BcosRuntimeError(
            f"blocks.{layer}.{post} is a {type(norm).__name__}; exact per-{'head' if part == 'attn' else 'neuron'} "
            "results through a norm after the output projection are implemented for RMSNorm only (Gemma 2's)")
    name = f"blocks.{layer}.{post}.hook_scale"
    if name not in cache.cache_dict:
        raise BcosRuntimeError(
            f"{name} is not in the cache; the exact per-{'head' if part == 'attn' else 'neuron'} results of a model "
            f"that normalises the {part} output again need the scale that norm used. Run run_with_cache without a "
            "names_filter, or include names ending in 'hook_scale'")
    norm_factor = 1.0 / cache.cache_dict[name]  # RMSNorm: (x / scale) * w
    if isinstance(norm, RMSNorm):
        norm_factor = norm_factor * norm.w
    return norm_factor if factor is None else factor * norm_factor


def _needs_own_results(model, part: str) -> bool:
    """Whether TransformerLens' per-head / per-neuron results (cached ``z`` / ``post`` times raw ``W_O`` /
    ``W_out``) miss a factor of the forward: a B-cos projection's unit-norm rows (at any B: with B = 1 the scale is 1
    but the rows are still normalised, and TransformerLens' raw-weight results missed attn_out by 2.0 on a tiny
    B-cos GPT-2), its scale, or a norm after the projection."""
    post, projection, _ = _POST_NORMS[part]
    return _is_bcos(model, projection) or any(hasattr(block, post) for block in model.blocks)


def _is_bcos(model, projection: str) -> bool:
    cfg = model.cfg
    return bool(getattr(cfg, "bcos_projections", None)) and cfg.is_bcos(projection)


def _is_scaled(model, projection: str) -> bool:
    return _is_bcos(model, projection) and model.cfg.bcos_b != 1.0


def _weight(module: nn.Module, projection: str) -> Tensor:
    name = projection
    if projection in ("W_K", "W_V") and hasattr(module, f"_{projection}") and not module.cfg.ungroup_grouped_query_attention:
        name = f"_{projection}"  # grouped-query attention: the key/value heads the forward used
    weight = getattr(module, name)
    cfg = module.cfg
    if getattr(cfg, "bcos_projections", None) and cfg.is_bcos(projection):
        weight = unit_norm(weight, _PROJECTIONS[projection][2])
    return weight


def effective_weight(cache: ActivationCache, layer: int, projection: str) -> Float[Tensor, "batch pos ..."]:
    """The weight a projection of block ``layer`` applied at each (batch, position) of ``cache``'s forward.

    A B-cos projection computes ``scale ⊙ (x @ ŵ)``, so its effective weight is ``ŵ`` with each output unit
    multiplied by that unit's cached scale; a plain one returns its weight, broadcast. Shapes (TransformerLens
    layouts with ``batch, pos`` in front): ``W_Q/W_K/W_V`` ``(b, p, head, d_model, d_head)`` (key/value heads
    for grouped-query attention), ``W_O`` ``(b, p, head, d_head, d_model)``, ``W_in/W_gate/W_out``
    ``(b, p, d_in, d_out)``; ``pos`` alone in front for a cache without its batch dimension
    (``run_with_cache(..., remove_batch_dim=True)``). ``x @ effective_weight`` reproduces the cached projection at
    that position.
    """
    model = getattr(cache, "model", None)
    if not isinstance(model, HookedTransformer):
        # a bridge's cache failed with "'PositionEmbeddingsAttentionBridge' object has no attribute 'cfg'", a cache dict
        # with "'dict' object has no attribute 'model'"
        got = ("the plain dict of run_with_cache(..., return_cache_object=False)" if isinstance(cache, dict) else
               f"a cache of a TransformerBridge ({type(model).__name__})" if model is not None else
               f"a {type(cache).__name__}")
        raise argument_error(
            "cache", f"effective_weight reads a HookedTransformer's run_with_cache cache (its blocks' weights and B-cos "
            f"scales), got {got}", "Run run_with_cache on a HookedTransformer from hooked_transformer_from_hf / "
            "BcosHookedTransformer, or wrap a cache dict: BcosActivationCache(cache_dict, model)", kind=BcosTypeError)
    if projection not in _PROJECTIONS:
        raise argument_error("projection", f"{projection!r} is not a projection name",
                             f"use one of {', '.join(_PROJECTIONS)}")
    if not isinstance(layer, int) or not -model.cfg.n_layers <= layer < model.cfg.n_layers:
        raise argument_error("layer", f"{layer!r} is not a block index of this {model.cfg.n_layers}-layer model",
                             f"use an int in [0, {model.cfg.n_layers})")
    layer %= model.cfg.n_layers
    refuse_model_changed = getattr(cache, "refuse_model_changed", None)  # the scales are the run's, the weight now's
    if refuse_model_changed is not None:
        refuse_model_changed("effective_weight")
    part, short, _ = _PROJECTIONS[projection]
    module = getattr(model.blocks[layer], part)
    if not hasattr(module, projection):
        raise argument_error("projection", f"block {layer}'s {part} has no {projection}",
                             "W_gate exists only in gated MLPs")
    weight = _weight(module, projection)
    # (batch, pos), or (pos,) for a cache without its batch dimension (run_with_cache(..., remove_batch_dim=True)),
    # whose (pos, ...) activations were read as (batch, pos) and failed ("too many indices for tensor of dimension 2")
    batch_pos = cache[f"blocks.{layer}.hook_resid_pre"].shape[:-1]
    if not _is_scaled(model, projection):
        return weight.expand(*batch_pos, *weight.shape)
    scale = _scale(cache, layer, part, short)
    if projection == "W_O":  # scale (..., d_model) per output unit
        return weight * scale[..., None, None, :]
    if part == "attn":  # scale (..., head, d_head)
        return weight * scale[..., :, None, :]
    return weight * scale[..., None, :]  # (..., d_out)


# ActivationCache methods BcosActivationCache overrides: if TransformerLens renames one, TransformerLens' own
# version (which reads raw W_O / W_out) would run instead of ours, silently; check_cache_internals refuses that.
_OVERRIDDEN = ("compute_head_results", "get_neuron_results", "_stack_neuron_results_apply_ln_projected",
               "logit_attrs", "decompose_resid", "get_full_resid_decomposition", "stack_head_results",
               "stack_neuron_results", "apply_ln_to_stack")
_READ = ("cache_dict", "model")
# the residual stream's own hooks: an SAE spliced there without its error term replaces the stream itself
_STREAM_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")


def check_cache_internals() -> None:
    """Check that TransformerLens' ``ActivationCache`` still routes head and neuron results through the methods
    :class:`BcosActivationCache` overrides; raise naming the ones that changed."""
    missing = [name for name in _OVERRIDDEN if not callable(getattr(ActivationCache, name, None))]
    if missing:
        raise BcosRuntimeError(
            f"TransformerLens' ActivationCache no longer has {missing}; BcosActivationCache overrides them to make "
            "per-head and per-neuron results exact for B-cos models. bcos_plugins' TransformerLens adapter needs "
            "updating for this TransformerLens version")


class BcosActivationCache(HookCheckedCache, ActivationCache):
    """An ``ActivationCache`` whose per-head and per-neuron results are the forward's own (see module docstring).

    ``BcosHookedTransformer.run_with_cache`` returns one; wrap a cache dict yourself with
    ``BcosActivationCache(cache_dict, model)``. On models without B-cos output projections it behaves
    exactly like ``ActivationCache``.
    """

    def __init__(self, cache_dict, model, *args, **kwargs) -> None:
        check_cache_internals()
        super().__init__(cache_dict, model, *args, **kwargs)
        missing = [name for name in _READ if not hasattr(self, name)]
        if missing:
            raise BcosRuntimeError(f"TransformerLens' ActivationCache no longer stores {missing}; "
                                   "bcos_plugins' TransformerLens adapter needs updating")
        # sae-lens' HookedSAETransformer: an SAE spliced in replaces the hook point, so its hook's value is cached
        # only as the SAE's "<hook>.hook_sae_output" (the value the model carried on with): decompose_resid /
        # accumulated_resid failed with a KeyError on it. That value stands for the hook. An SAE that ran without
        # its error term (no "<hook>.hook_sae_error" cached) put a reconstruction there, which no component carries
        suffix = ".hook_sae_output"
        spliced = {name[:-len(suffix)] for name in self.cache_dict if name.endswith(suffix)}
        transcoder_inputs = set(getattr(model, "_transcoder_output_hooks", None) or {})  # not replaced: read only
        spliced |= set(getattr(model, "acts_to_saes", None) or {}) - transcoder_inputs
        for hook_name in spliced:
            if hook_name not in self.cache_dict and f"{hook_name}{suffix}" in self.cache_dict:
                self.cache_dict[hook_name] = self.cache_dict[f"{hook_name}{suffix}"]
        self._saes_without_error_term = sorted(name for name in spliced
                                               if f"{name}.hook_sae_error" not in self.cache_dict)
        # the run is this cache's making (run_with_cache, or a cache dict wrapped by hand); run_with_cache of
        # ExactCacheHookedTransformer sets the hooked points after
        self.record_run(())

    def _refuse_spliced_saes(self, method: str, kinds: tuple[str, ...]) -> None:
        """Refuse ``method`` when an SAE without its error term replaced a hook of ``kinds`` (hook name endings): the
        residual stream then holds the SAE's reconstruction, which none of the components carries, so they would not
        sum to it (the stack's logit_attrs missed up to all of the logit, without a word)."""
        spliced = [name for name in self._saes_without_error_term if name.endswith(kinds)]
        if spliced:
            raise argument_error(
                "cache", f"{method}: it comes from a model with SAEs spliced in without their error terms at "
                f"{spliced} (no hook_sae_error cached there); the residual stream there is the SAE's reconstruction, which none of the components "
                "(embeddings, attention and MLP outputs) carries, so they would not sum to it (wrong numbers)",
                "Splice them with their error terms (model.add_sae(sae, use_error_term=True): the same logits "
                "as without the SAE, decomposed exactly), or split the logit with bcos_plugins.adapters."
                "transformer_lens.token_component_decomposition(model, tokens, target=...), which reports each "
                "SAE's error share", kind=BcosTypeError)

    def decompose_resid(self, *args, **kwargs):
        self._refuse_spliced_saes("decompose_resid", _STREAM_HOOKS)
        return super().decompose_resid(*args, **kwargs)

    def get_full_resid_decomposition(self, *args, **kwargs):
        # per-head and per-neuron results sum to attn_out / mlp_out before an SAE spliced there
        self._refuse_spliced_saes("get_full_resid_decomposition", _STREAM_HOOKS + ("hook_attn_out", "hook_mlp_out"))
        return super().get_full_resid_decomposition(*args, **kwargs)

    def stack_head_results(self, *args, **kwargs):
        # each head's result is its share of the attention's own output, which an SAE spliced at hook_attn_out without
        # its error term replaced by its reconstruction in the stream: the stacked "residual stream contributions" then
        # missed the SAE's error (0.3 of attn_out on a tiny B-cos GPT-2), without a word
        self._refuse_spliced_saes("stack_head_results", ("hook_attn_out",))
        return super().stack_head_results(*args, **kwargs)

    def stack_neuron_results(self, *args, **kwargs):
        self._refuse_spliced_saes("stack_neuron_results", ("hook_mlp_out",))  # as stack_head_results
        return super().stack_neuron_results(*args, **kwargs)

    def compute_head_results(self) -> None:
        with self._model_unchanged_through("compute_head_results"):  # the own results below read W_O as it is now
            if not _needs_own_results(self.model, "attn"):
                return super().compute_head_results()
            first = "blocks.0.attn.hook_result"
            if first in self.cache_dict and self.cache_dict[first].ndim >= 4:
                if getattr(self, "_exact_head_results", False) \
                        or not any(hasattr(block, "ln1_post") for block in self.model.blocks):
                    return None  # computed below by an earlier call, or cached by the forward (use_attn_result=True)
                raise BcosValueError(
                    "model: it normalises each attention output again (ln1_post) and ran with use_attn_result=True: the "
                    "forward's hook_result holds each head's share before that norm, which does not sum to hook_attn_out."
                    " Set model.cfg.use_attn_result = False before run_with_cache; stack_head_results then computes the "
                    "shares through the norm (exact)")
            for layer in range(self.model.cfg.n_layers):
                self.cache_dict[f"blocks.{layer}.attn.hook_result"] = head_shares(
                    self[("z", layer, "attn")], _weight(self.model.blocks[layer].attn, "W_O"),
                    _output_factor(self, layer, "attn"))
            self._exact_head_results = True
            return None

    def get_neuron_results(self, layer: int, neuron_slice=None, pos_slice=None, project_output_onto=None):
        with self._model_unchanged_through("get_neuron_results"):  # the own results below read W_out as it is now
            layer = cache_block_index(self, layer)  # -1: the last block, as TransformerLens reads it
            if not _needs_own_results(self.model, "mlp"):
                return super().get_neuron_results(layer, neuron_slice, pos_slice, project_output_onto)
            return neuron_shares(self[("post", layer, "mlp")], _weight(self.model.blocks[layer].mlp, "W_out"),
                                 _output_factor(self, layer, "mlp"), neuron_slice, pos_slice, project_output_onto)

    def logit_attrs(self, residual_stack, *args, **kwargs):
        # the B-cos unembedding's cap, or TransformerLens' own in its forward (a cfg.output_logits_soft_cap set on the
        # built model: the terms summed to the uncapped logit, 0.010 off, without a word)
        caps = [getattr(self.model.cfg, name, None) for name in ("bcos_output_logits_soft_cap", "output_logits_soft_cap")]
        cap = next((c for c in caps if softcap_enabled(c)), None)
        if cap is not None:
            raise BcosTypeError(
                f"ActivationCache.logit_attrs: this model soft-caps its logits ({cap} * tanh(z / "
                f"{cap})), so a logit is not a sum of one term per residual component: logit_attrs' terms would sum "
                "to the uncapped z (wrong numbers). For an exact split use bcos_plugins.adapters.transformer_lens."
                "token_component_decomposition(model, tokens, target=...) (input token x component shares that sum "
                "to the capped logit) or explain_logits(model, tokens, target=...)")
        return super().logit_attrs(residual_stack, *args, **kwargs)

    def _stack_neuron_results_apply_ln_projected(self, layer, pos_slice, neuron_slice, project_2d):
        if not _needs_own_results(self.model, "mlp"):
            return super()._stack_neuron_results_apply_ln_projected(layer, pos_slice, neuron_slice, project_2d)
        # TransformerLens' fused path reads W_out; ours goes through the exact per-neuron results.
        stacks = [self.get_neuron_results(i, neuron_slice=neuron_slice, pos_slice=pos_slice) for i in range(layer)]
        if not stacks:
            shape = pos_slice.apply(self["hook_embed"], dim=-2).shape[:-1]
            return torch.zeros(0, *shape, project_2d.shape[1], device=project_2d.device, dtype=project_2d.dtype)
        stack = einops.rearrange(torch.cat(stacks, dim=-2), "... n m -> n ... m")
        return self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice) @ project_2d
