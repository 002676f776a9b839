"""Explainable and B-cos ``HookedTransformer``s.

``make_explainable(model)`` turns any supported ``HookedTransformer`` (plain, bilinear or B-cos) into one
that :func:`bcos_plugins.nn.explanation_mode` can explain: the hook points that carry a dynamic weight
become :class:`~.hook_point.DynamicHookPoint`\\ s and a non-gated MLP's activation becomes a
:class:`~bcos_plugins.nn.DetachableActivation`:

======================  ==========================================  =====================
component               dynamic weight W(x)                          where
======================  ==========================================  =====================
LayerNorm / RMSNorm     ``1 / scale``                                ``hook_scale``
attention               ``pattern``                                  ``hook_pattern``
gated / bilinear MLP    ``act(x W_gate)`` (the whole gate branch)     ``hook_pre``
MLP                     ``gate(pre)`` of ``act(pre) = pre * gate``    ``mlp.act_fn``
B-cos projection        ``|cos| ** (B - 1)``                          ``hook_bcos_scale_*``
logit soft-cap (B-cos)  ``tanh(z / c) / (z / c)``                     ``unembed.hook_soft_cap``
======================  ==========================================  =====================

Everything else (embeddings, projections, residual sums, unembedding) is linear, so with zero biases the
contributions at ``hook_embed`` (+ ``hook_pos_embed``) sum to the explained logit. On a plain model with
biases the biases' share is missing from the sum (the paper's "W(x)x from a conventional model" ablation).

``BcosHookedTransformer(cfg)`` builds a B-cos model from a :class:`~.config.BcosTransformerConfig`: the
attention and MLP classes become their B-cos subclasses, every bias is removed, and the model is made
explainable. ``bcos_model_class(HookedSAETransformer)`` gives the same for a ``HookedTransformer``
subclass (the B-cos swap runs inside ``HookedTransformer.__init__``, before the subclass wraps modules).
"""

from __future__ import annotations

import functools
import inspect
import types

import torch
from torch import Tensor, nn
from transformer_lens import HookedTransformer
from transformer_lens.components import (
    Attention,
    GroupedQueryAttention,
    LayerNorm,
    LayerNormPre,
    RMSNorm,
    RMSNormPre,
)
from transformer_lens.components.abstract_attention import AbstractAttention
from transformer_lens.components.mlps.gated_mlp import GatedMLP
from transformer_lens.components.mlps.mlp import MLP
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import Slice
from transformer_lens.utilities.activation_functions import softcap_enabled

from bcos_plugins._checks import require_finite_parameters
from bcos_plugins.convert.architectures import vocabulary_size
from bcos_plugins.corpus import require_tokenizer_fits
from bcos_plugins.errors import BcosRuntimeError, BcosTypeError, BcosValueError, argument_error
from bcos_plugins.nn.activation import DetachableActivation

from .attention import HookedBcosAttention, HookedBcosGroupedQueryAttention
from .boot_guard import is_explainable_bridge
from .config import GATE_KINDS, BcosTransformerConfig, check_explainable
from .decomposition import BcosActivationCache, fold_final_norm_weight, fold_final_norm_weight_in_state_dict
from .hook_checks import hooked_points
from .hook_point import DynamicHookPoint
from .inputs import refuse_bos_less_left_padding
from .mlp import HookedBcosGatedMLP, HookedBcosMLP
from .model_changes import weight_version
from .unembed import BcosSoftCappedUnembed

__all__ = ["BcosHookedTransformer", "ExactCacheHookedTransformer", "bcos_model_class", "exact_cache_class",
           "dynamic_hooks_replaced", "is_explainable", "make_explainable", "remove_biases"]

_NORMS = (LayerNorm, LayerNormPre, RMSNorm, RMSNormPre)


def _has_hooks(point: HookPoint) -> bool:
    return bool(point.fwd_hooks or point.bwd_hooks or point._forward_hooks or point._backward_hooks)


def _make_dynamic(module: nn.Module, attr: str) -> None:
    old = getattr(module, attr)
    if isinstance(old, DynamicHookPoint):
        return
    if not isinstance(old, HookPoint):
        raise BcosTypeError(
            f"{type(module).__name__}.{attr} is a {type(old).__name__}, not a HookPoint (an SAE or another "
            "wrapper is attached there); call make_explainable before attaching it."
        )
    if _has_hooks(old):
        raise BcosRuntimeError(
            f"{type(module).__name__}.{attr} already has hooks; call make_explainable before adding hooks."
        )
    setattr(module, attr, DynamicHookPoint())


def _forward_through_hook_in(self: nn.Module, x):
    return type(self).forward(self, self.hook_in(x))


def _rebind_hook_in_forwards(model: nn.Module) -> None:
    """Make sae-lens' ``hook_in`` routing of each MLP survive ``copy.deepcopy`` (in place, idempotent).

    sae-lens' ``HookedSAETransformer`` gives every MLP a ``hook_in`` by setting ``mlp.forward`` to a lambda over
    ``mlp`` and its bound ``forward`` (sae-lens 6.x ``add_hook_in_to_mlp``). ``copy.deepcopy`` copies no function,
    so a copy's MLPs ran the original model's: its weights and device (a copy moved to a GPU while the original
    stayed on the CPU failed there), its gradients (a copy's explanations missed the MLPs' share: completeness error
    0.35 on a tiny B-cos GPT-2) and its hooks (``blocks.L.mlp.*`` never fired on the copy). The same routing as a
    method of the module itself, which ``deepcopy`` binds to the copy; a ``forward`` set by anything else is left.
    """
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if forward is None or isinstance(forward, types.MethodType) \
                or not isinstance(module.__dict__.get("_modules", {}).get("hook_in"), HookPoint):
            continue
        cells = []
        for cell in getattr(forward, "__closure__", None) or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        if any(getattr(c, "__self__", None) is module and getattr(c, "__func__", None) is type(module).forward
               for c in cells):
            module.forward = types.MethodType(_forward_through_hook_in, module)


def make_explainable(model: HookedTransformer) -> HookedTransformer:
    """Route every dynamic weight of ``model`` through a detachable module (in place, idempotent).

    Hook names and forward values are unchanged. The final norm's weight is folded into ``W_U`` (exact; the
    final norm becomes weightless), so TransformerLens' ``logit_attrs`` sums to the logit. Raises
    ``BcosValueError`` for options whose maths is not dynamic-weight (e.g. SoLU, soft-capped logits, clipped
    values, mixtures of experts, shortformer positions).
    """
    if not isinstance(model, HookedTransformer):
        raise argument_error(
            "model", f"make_explainable takes a TransformerLens HookedTransformer, got {type(model).__name__}",
            "For a transformers model use hooked_transformer_from_hf(model) (it returns an explainable "
            "HookedTransformer) or transformer_bridge_from_hf(model); for a TransformerBridge use "
            "make_bridge_explainable(bridge)", kind=BcosTypeError)
    check_explainable(model.cfg)
    if softcap_enabled(getattr(model.cfg, "bcos_output_logits_soft_cap", None)) \
            and not isinstance(getattr(model, "unembed", None), BcosSoftCappedUnembed):
        raise BcosTypeError(
            f"model: its config sets bcos_output_logits_soft_cap={model.cfg.bcos_output_logits_soft_cap}, which "
            f"only a B-cos model's unembedding applies, but it is a {type(model).__name__}: its logits are not "
            "capped. Build it as BcosHookedTransformer(cfg) (or with hooked_transformer_from_hf)")
    final = getattr(model, "ln_final", None)
    if final is not None and any(_has_hooks(h) for h in final.modules() if isinstance(h, HookPoint)):
        raise BcosRuntimeError("ln_final already has hooks; call make_explainable before adding hooks.")
    fold_final_norm_weight(model)
    for module in model.modules():
        if isinstance(module, _NORMS):
            _make_dynamic(module, "hook_scale")
        elif isinstance(module, AbstractAttention):
            _make_dynamic(module, "hook_pattern")
        elif isinstance(module, GatedMLP):
            _make_dynamic(module, "hook_pre")
        elif isinstance(module, MLP):
            kind = GATE_KINDS[model.cfg.act_fn]
            if kind is not None and not isinstance(module.act_fn, DetachableActivation):
                module.act_fn = DetachableActivation(kind)
        elif type(module).__name__ in ("MoE", "GptOssMoE", "GatedMLP4Bit"):
            raise BcosValueError(f"{type(module).__name__} MLPs are not supported by make_explainable.")
    _restore_marked_dynamic_hooks(model)
    _rebind_hook_in_forwards(model)
    _mark_dynamic_hooks(model)
    model.setup()
    return model


# per module, the names of its hook points that carry a dynamic weight once the model is explainable: a hook point
# replaced afterwards (sae-lens' reset_saes puts a plain HookPoint where an SAE was) is named by what it was
_DYNAMIC_HOOKS = "_bcos_dynamic_hooks"


def _mark_dynamic_hooks(model: nn.Module) -> None:
    for module in model.modules():
        names = {name for name, child in module.named_children() if isinstance(child, DynamicHookPoint)}
        if names:
            module.__dict__[_DYNAMIC_HOOKS] = frozenset(names | module.__dict__.get(_DYNAMIC_HOOKS, frozenset()))


def _restore_marked_dynamic_hooks(model: nn.Module) -> None:
    """Put a ``DynamicHookPoint`` back where a marked one was replaced by a plain, hookless ``HookPoint`` (the B-cos
    ``hook_bcos_scale_*``, which the loop of :func:`make_explainable` does not cover, after sae-lens' reset_saes)."""
    for module in model.modules():
        for name in module.__dict__.get(_DYNAMIC_HOOKS, ()):
            now = module._modules.get(name)
            if type(now) is HookPoint and not _has_hooks(now):
                setattr(module, name, DynamicHookPoint())


def dynamic_hooks_replaced(model: nn.Module) -> list[tuple[str, str]]:
    """(hook name, type of what is there now) of each hook point that carried a dynamic weight after
    :func:`make_explainable` and was replaced since: an SAE attached there (sae-lens ``add_sae``) or the plain
    ``HookPoint`` sae-lens' ``reset_saes`` leaves in its place."""
    replaced = []
    for prefix, module in model.named_modules():
        for name in sorted(module.__dict__.get(_DYNAMIC_HOOKS, ())):
            now = module._modules.get(name)
            if not isinstance(now, DynamicHookPoint):
                replaced.append((f"{prefix}.{name}" if prefix else name, type(now).__name__))
    return replaced


def _fixed_dynamic_weights(model: nn.Module) -> list[str]:
    """The modules whose dynamic weight :func:`make_explainable` would route through a detachable module but that
    do not have one: norms added afterwards (TransformerLens' ``process_weights_(fold_ln=True)`` puts in fresh
    ``LayerNormPre`` / ``RMSNormPre`` modules), or attention / MLPs swapped in by hand."""
    act_fn = getattr(getattr(model, "cfg", None), "act_fn", None)
    missing = []
    for name, module in model.named_modules():
        if isinstance(module, _NORMS):
            dynamic = isinstance(module.hook_scale, DynamicHookPoint)
        elif isinstance(module, AbstractAttention):
            dynamic = isinstance(module.hook_pattern, DynamicHookPoint)
        elif isinstance(module, GatedMLP):
            dynamic = isinstance(module.hook_pre, DynamicHookPoint)
        elif isinstance(module, MLP):
            dynamic = GATE_KINDS.get(act_fn) is None or isinstance(module.act_fn, DetachableActivation)
        else:
            continue
        if not dynamic:
            missing.append(name)
    return missing


def is_explainable(model: nn.Module) -> bool:
    """Whether :func:`make_explainable` (or, for a ``TransformerBridge``, ``make_bridge_explainable``) has been
    applied and still holds: every norm scale, attention pattern and activation gate is detachable. A model whose
    norms were replaced afterwards (TransformerLens' ``process_weights_(fold_ln=True)``) is not: its norm scales
    would take part in the gradient and the contributions would miss part of the logit."""
    if is_explainable_bridge(model):
        return True
    attentions = [m for m in model.modules() if isinstance(m, AbstractAttention)]
    # a model without blocks (cfg.n_layers=0: embeddings, final norm, unembedding) has no attention to check; it was
    # refused as "not detachable, call make_explainable" right after make_explainable
    no_blocks = getattr(getattr(model, "cfg", None), "n_layers", None) == 0
    return (bool(attentions) or no_blocks) and not _fixed_dynamic_weights(model) \
        and not dynamic_hooks_replaced(model)


def _bias_names(module: nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters(recurse=False) if n == "b" or n.startswith(("b_", "_b_"))]


def remove_biases(model: nn.Module) -> list[str]:
    """Replace every bias parameter by a zero, non-persistent, non-trainable buffer (in place).

    TransformerLens' code that reads biases (``model.b_U``, ``attn.b_O``...) keeps working and sees zeros;
    state dicts no longer contain biases. Returns the dotted names of the removed biases; raises if a bias
    is not zero (it would change the model's output).
    """
    removed = []
    for prefix, module in model.named_modules():
        for name in _bias_names(module):
            param = module._parameters.pop(name)
            full = f"{prefix}.{name}" if prefix else name
            if param.detach().abs().max() > 0:
                module._parameters[name] = param
                raise BcosValueError(f"bias {full} is not zero; a B-cos model has no biases.")
            module.register_buffer(name, torch.zeros_like(param.detach()), persistent=False)
            removed.append(full)
    return removed


def _require_bcos_config(cfg) -> None:
    if not isinstance(cfg, BcosTransformerConfig):
        raise BcosTypeError(
            f"a B-cos HookedTransformer needs a BcosTransformerConfig, got {type(cfg).__name__}; build one "
            "with BcosTransformerConfig(..., bcos_b=...) or convert a model with hooked_transformer_from_hf."
        )


def _to_bcos(model: HookedTransformer) -> None:
    cfg = model.cfg
    _require_bcos_config(cfg)
    remove_biases(model)  # TransformerLens creates its biases as zeros
    fold_final_norm_weight(model)  # ln_final becomes weightless, so logit_attrs is exact
    if softcap_enabled(cfg.bcos_output_logits_soft_cap):
        # the cap as a dynamic scale in the unembedding (BcosTransformerConfig took it off TransformerLens' forward)
        model.unembed.__class__ = BcosSoftCappedUnembed
        model.unembed.convert_to_soft_capped()
    for block in model.blocks:
        attn = block.attn
        if type(attn) is GroupedQueryAttention:
            attn.__class__ = HookedBcosGroupedQueryAttention
        elif type(attn) is Attention:
            attn.__class__ = HookedBcosAttention
        else:
            raise BcosTypeError(f"no B-cos version of {type(attn).__name__}")
        attn.convert_to_bcos()
        if cfg.attn_only:
            continue
        mlp = block.mlp
        if type(mlp) is GatedMLP:
            mlp.__class__ = HookedBcosGatedMLP
        elif type(mlp) is MLP:
            mlp.__class__ = HookedBcosMLP
        else:
            raise BcosTypeError(f"no B-cos version of {type(mlp).__name__}")
        mlp.convert_to_bcos()
    make_explainable(model)


def _rows_without_batch(hook_name: str) -> bool:
    """Whether TransformerLens caches ``hook_name`` as rows with no batch dimension: the hooks of QK-norm's RMSNorms
    (``attn.q_norm`` / ``attn.k_norm``), which normalise the queries and keys flattened to (batch * pos * heads)."""
    return ".attn.q_norm." in hook_name or ".attn.k_norm." in hook_name


@functools.cache
def _signature(function) -> inspect.Signature:
    return inspect.signature(function)  # 0.1 ms a call: read once per function, not at every forward


def _named_arguments(method, args: tuple, kwargs: dict) -> dict | None:
    """The arguments of a call to the bound method ``method`` (the TransformerLens method an override hands them to)
    by name, read from the installed release's own signature (a release that adds or reorders parameters is read
    right); ``None`` where they do not bind (the host's own call then raises its own error)."""
    try:
        return _signature(method.__func__).bind(method.__self__, *args, **kwargs).arguments
    except TypeError:
        return None


def _at_the_prompt(past_kv_cache) -> bool:
    """Whether a forward given ``past_kv_cache`` (TransformerLens' key-value cache, or ``None``) runs on whole prompts:
    no cache, or one that holds nothing yet (a cached ``generate_stream``'s first step); later steps pass one new token
    a row, where a row that generated the pad id (GPT-2's eos) would read as padding."""
    if past_kv_cache is None:
        return True
    previous = getattr(past_kv_cache, "previous_attention_mask", None)
    return isinstance(previous, Tensor) and previous.ndim == 2 and previous.shape[1] == 0


# (batch, pos, head, d_head) activations whose names TransformerLens' caching does not read as split into heads
# (it knows hook_q / hook_k / hook_v / hook_z / hook_result): the B-cos scales of q / k / v, and its own rotated q / k
_HEAD_SPLIT_HOOKS = ("hook_bcos_scale_q", "hook_bcos_scale_k", "hook_bcos_scale_v", "hook_rot_q", "hook_rot_k")


class ExactCacheHookedTransformer(HookedTransformer):
    """A ``HookedTransformer`` whose ``run_with_cache`` returns a :class:`~.decomposition.BcosActivationCache`, whose
    per-head and per-neuron results are the forward's own (B-cos scales, norms after the attention / MLP output).
    The base of :class:`BcosHookedTransformer`; ``hooked_transformer_from_hf`` builds plain models whose blocks
    normalise their outputs again (Gemma 2) as one (:func:`exact_cache_class`), since TransformerLens' own cache
    leaves those norms out of the per-head / per-neuron results. ``.double()`` / ``.half()`` / ``.float()`` /
    ``.bfloat16()`` keep ``cfg.dtype`` equal to the weights' dtype, as TransformerLens' own ``.to(dtype)`` does."""

    def _apply(self, fn, recurse: bool = True):
        # TransformerLens updates cfg.dtype only in its own .to(dtype); nn.Module's .double() / .half() / .float() /
        # .bfloat16() / .type() go through _apply and left it behind, and the weightless final norm
        # (LayerNormPre / RMSNormPre) casts its output to cfg.dtype, so a .double() model failed in the unembedding
        # (float32 residual, float64 W_U) and .half() computed its norms otherwise than .to(torch.float16). Keep
        # cfg.dtype equal to the parameters' one dtype after every conversion (left as it is when they mix dtypes).
        out = super()._apply(fn, recurse)
        dtypes = {p.dtype for p in self.parameters() if p.is_floating_point()}
        if len(dtypes) == 1 and getattr(self, "cfg", None) is not None:
            self.cfg.dtype = dtypes.pop()
        return out

    def forward(self, *args, **kwargs):
        # a left-padded batch made without a BOS, given without a mask, to a model whose pad id is its BOS id:
        # TransformerLens derives a mask that attends one padding token per padded row (refused there). Not read with
        # a mask or a residual input (start_at_layer: no mask is derived), nor past the first step of a key-value
        # cache (_at_the_prompt)
        named = _named_arguments(super().forward, args, kwargs)
        if named is not None and named.get("attention_mask") is None and named.get("start_at_layer") is None \
                and _at_the_prompt(named.get("past_kv_cache")):
            refuse_bos_less_left_padding(self, named.get("input"), named.get("prepend_bos"), named.get("padding_side"))
        return super().forward(*args, **kwargs)

    def generate(self, *args, **kwargs):
        # TransformerLens' generate derives the prompt's mask itself (get_attention_mask with the call's prepend_bos)
        # and runs every step from the residual with that mask (cached or not), where forward's check cannot see the
        # tokens: the prompt is checked here, once
        self._refuse_bos_less_prompt(super().generate, args, kwargs)
        return super().generate(*args, **kwargs)

    def generate_stream(self, *args, **kwargs):
        # checked at the call, not at the generator's first step (forward's check would name attention_mask there)
        self._refuse_bos_less_prompt(super().generate_stream, args, kwargs)
        return super().generate_stream(*args, **kwargs)

    def _refuse_bos_less_prompt(self, method, args: tuple, kwargs: dict) -> None:
        # generate / generate_stream take no attention_mask (generate drops one with a warning): the fixes named are
        # the others
        named = _named_arguments(method, args, kwargs)
        if named is not None:
            refuse_bos_less_left_padding(self, named.get("input"), named.get("prepend_bos"), named.get("padding_side"),
                                         takes_a_mask=False)

    def set_tokenizer(self, tokenizer, default_padding_side=None):
        # TransformerLens' own attach (model.set_tokenizer, HookedTransformer(cfg, tokenizer=...), cfg.tokenizer_name,
        # and sae-lens' HookedSAETransformer through them) took a tokenizer with more tokens than the embedding has
        # rows, which hooked_transformer_from_hf(tokenizer=) refuses: model("text") then failed in the embedding
        # (IndexError; a device-side assert on a GPU), or read the ids that happened to fit as this model's tokens.
        # d_vocab=-1 asks TransformerLens to size the vocabulary from this very tokenizer, so it fits.
        if (vocabulary_size(self) or 0) > 0:
            require_tokenizer_fits(self, tokenizer)
        return super().set_tokenizer(tokenizer, default_padding_side=default_padding_side)

    def get_caching_hooks(self, names_filter=None, incl_bwd: bool = False, device=None, remove_batch_dim: bool = False,
                          cache: dict | None = None, pos_slice=None):
        # TransformerLens' caching slices positions at dim -3 only for names ending hook_q / k / v / z / result, and at
        # -2 (the head axis) for the other (batch, pos, head, d_head) activations: with run_with_cache(tokens,
        # pos_slice=-1) the B-cos scales of q / k / v kept the last head at every position, and effective_weight's
        # W_Q / W_V built from them were 1.7 off the cached hook_q (silently; other slices failed in torch's
        # broadcasting, as TransformerLens' own hook_rot_q / hook_rot_k of a rotary model did with more positions
        # than key heads). Those are cached whole and then sliced on their position axis
        pos_slice = Slice.unwrap(pos_slice)
        cache, fwd_hooks, bwd_hooks = super().get_caching_hooks(names_filter, incl_bwd, device, remove_batch_dim,
                                                                cache, pos_slice)
        head_split = {name for name, _ in fwd_hooks if name.endswith(_HEAD_SPLIT_HOOKS)}
        if pos_slice.mode == "identity" or not head_split:
            return cache, fwd_hooks, bwd_hooks
        _, whole_fwd, whole_bwd = super().get_caching_hooks(head_split.__contains__, incl_bwd, device,
                                                            remove_batch_dim, cache, None)

        def then_sliced(save, key: str):
            def save_sliced(tensor: Tensor, hook: HookPoint):
                save(tensor, hook=hook)
                cache[key] = pos_slice.apply(cache[key], dim=-3)
            return save_sliced

        def replaced(hooks: list, whole: list, suffix: str) -> list:
            saves = {name: then_sliced(save, name + suffix) for name, save in whole}
            return [(name, saves.get(name, save)) for name, save in hooks]

        return cache, replaced(fwd_hooks, whole_fwd, ""), replaced(bwd_hooks, whole_bwd, "_grad")

    def run_with_cache(self, *model_args, return_cache_object: bool = True, remove_batch_dim: bool = False,
                       **kwargs):
        # the caller's forward hooks (model.hooks(...), add_hook), which TransformerLens runs before its caching hooks:
        # the cache records what they left, and its decompositions refuse where that is out of step with the sums
        hooked = hooked_points(self)
        if remove_batch_dim and getattr(self.cfg, "use_qk_norm", False):
            # TransformerLens caches QK-norm's hooks (Qwen3's q_norm / k_norm) as (batch * pos * heads, ...) rows, and
            # its remove_batch_dim took row 0 of them and then sliced positions on a dimension they no longer had:
            # run_with_cache(tokens, remove_batch_dim=True) failed with an IndexError inside TransformerLens. The
            # batch dimension is removed here instead, from every entry that has one (the same values TransformerLens
            # gives the others: positions are sliced before, and row 0 taken after)
            out, cache_dict = super().run_with_cache(
                *model_args, return_cache_object=False, remove_batch_dim=False, **kwargs)
            cache_dict = {name: value if _rows_without_batch(name) else value[0] for name, value in cache_dict.items()}
        else:
            out, cache_dict = super().run_with_cache(
                *model_args, return_cache_object=False, remove_batch_dim=remove_batch_dim, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        cache = BcosActivationCache(cache_dict, self, has_batch_dim=not remove_batch_dim)
        cache.hooked_at_run = hooked
        return out, cache


class BcosHookedTransformer(ExactCacheHookedTransformer):
    """A ``HookedTransformer`` whose attention and MLP projections are B-cos (see the module docstring).

    Same arguments as ``HookedTransformer``; ``cfg`` must be a :class:`BcosTransformerConfig`. Weights
    are TransformerLens' (``W_Q (head, d_model, d_head)``, ``W_in (d_model, d_mlp)``...), stored raw and
    used unit-normalised; the state dict has no biases. The final norm is weightless (its weight lives in
    ``W_U``; a state dict with ``ln_final.w`` is folded on loading), and ``run_with_cache`` returns a
    :class:`~.decomposition.BcosActivationCache`, so TransformerLens' ``logit_attrs``, ``stack_head_results``,
    ``stack_neuron_results`` and ``get_full_resid_decomposition`` are exact (norms after the attention / MLP
    output included). A final-logit soft-cap (``bcos_output_logits_soft_cap``) is applied by the unembedding as a
    dynamic scale (:class:`~.unembed.BcosSoftCappedUnembed`); ``logit_attrs`` is refused there.
    """

    def __init__(self, cfg, *args, **kwargs) -> None:
        _require_bcos_config(cfg)
        super().__init__(cfg, *args, **kwargs)
        _to_bcos(self)

    def forward(self, *args, **kwargs):
        _require_finite_query_key_weights(self)
        return super().forward(*args, **kwargs)

    def load_and_process_state_dict(self, state_dict, fold_ln: bool = True, center_writing_weights: bool = True,
                                    center_unembed: bool = True, fold_value_biases: bool = True,
                                    refactor_factored_attn_matrices: bool = False):
        # TransformerLens' folding and centring (also behind process_weights_ and from_pretrained, on by default)
        # rewrite a plain model into an equivalent one; a B-cos projection normalises its weight rows and scales
        # its output by |cos| ** (B - 1), so folding a norm's gain into W_Q / W_in or centring the rows that write
        # to the residual stream changed the logits silently (by 0.09 on a tiny B-cos GPT-2)
        changing = {"fold_ln": fold_ln, "center_writing_weights": center_writing_weights,
                    "refactor_factored_attn_matrices": refactor_factored_attn_matrices}
        refused = [name for name, on in changing.items() if on]
        if refused:
            raise argument_error(
                refused[0], f"{', '.join(f'{n}=True' for n in refused)} would change this B-cos model's outputs "
                "(the folding / centring is exact only for plain models: B-cos projections normalise their weight "
                "rows and scale their outputs by |cos| ** (B - 1))",
                f"Pass {', '.join(f'{n}=False' for n in refused)} (process_weights_, from_pretrained, "
                "load_and_process_state_dict); the final norm is already folded into W_U")
        return super().load_and_process_state_dict(
            state_dict, fold_ln=False, center_writing_weights=False, center_unembed=center_unembed,
            fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=False)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        folded = fold_final_norm_weight_in_state_dict(state_dict)
        if "unembed.b_U" in folded and "unembed.b_U" not in state_dict:
            raise BcosValueError(
                "state_dict['ln_final.b'] is not zero, but a B-cos model has no biases (its unembedding has no "
                "b_U to fold it into). Load a checkpoint of a B-cos model, or zero the final norm's bias")
        return super().load_state_dict(folded, strict=strict, assign=assign)

def _query_key_weights(model: nn.Module):
    """``(name, parameter)`` of every attention's query / key weights and query / key norm: a NaN there makes a
    row of attention scores NaN, which TransformerLens' attention (and ours, restated from it) sets to zero."""
    for i, block in enumerate(getattr(model, "blocks", ())):
        attn = getattr(block, "attn", None)
        if not isinstance(attn, nn.Module):
            continue
        for name in ("W_Q", "W_K", "_W_K"):
            weight = attn._parameters.get(name)
            if weight is not None:
                yield f"blocks.{i}.attn.{name}", weight
        for norm in ("q_norm", "k_norm"):
            module = getattr(attn, norm, None)
            if isinstance(module, nn.Module):
                yield from ((f"blocks.{i}.attn.{norm}.{name}", p) for name, p in module.named_parameters())


def _require_finite_query_key_weights(model: nn.Module) -> None:
    """Refuse a NaN or infinite query / key weight before a forward: TransformerLens' attention sets a NaN attention
    row to zero, so such a weight gave finite logits and a finite explanation, 0.45 off on a tiny model, without a
    word (the lens paths check the weights only once a value comes out non-finite). Checked once per weight version
    (an in-place write, ``load_state_dict`` and an optimiser step make a new one; a replaced parameter is another
    tensor): one device synchronisation then, none while the weights are unchanged (docs/benchmarks.md has its cost).
    Writes that bypass the version counter (``weight.data.copy_``) are not seen, as by the unit-weight cache."""
    if torch.compiler.is_compiling():
        return
    seen = model.__dict__.setdefault("_finite_query_key_versions", {})
    stale = [(name, w) for name, w in _query_key_weights(model) if seen.get(name) != weight_version(w)]
    if not stale:
        return
    require_finite_parameters(model, "model", parameters=stale, consequence=(
        "TransformerLens' attention sets a NaN row of attention scores to zero, so the logits and their explanations "
        "would come out finite and wrong"), fix="Reload the weights (or find the write that broke them)")
    seen.update((name, weight_version(w)) for name, w in stale)


_CLASSES: dict[type, type] = {HookedTransformer: BcosHookedTransformer}
_EXACT_CACHE_CLASSES: dict[type, type] = {HookedTransformer: ExactCacheHookedTransformer}


def exact_cache_class(model_class: type[HookedTransformer]) -> type[HookedTransformer]:
    """``model_class`` (``HookedTransformer`` or a subclass such as ``HookedSAETransformer``) with the
    ``run_with_cache`` of :class:`ExactCacheHookedTransformer`."""
    return _with_mixin(model_class, ExactCacheHookedTransformer, _EXACT_CACHE_CLASSES, "ExactCache")


def _with_mixin(model_class: type[HookedTransformer], mixin: type[HookedTransformer], made: dict,
                prefix: str) -> type[HookedTransformer]:
    """``model_class`` with ``mixin`` next in its MRO (made once per class and kept in ``made``); ``model_class``
    itself when it already has it."""
    if not (isinstance(model_class, type) and issubclass(model_class, HookedTransformer)):
        raise BcosTypeError(f"{model_class!r} is not a HookedTransformer subclass")
    if issubclass(model_class, mixin):
        return model_class
    if model_class not in made:
        def __init__(self, *args, **kwargs) -> None:
            model_class.__init__(self, *args, **kwargs)
            _rebind_hook_in_forwards(self)  # what model_class installs after the mixin's __init__ (sae-lens' hook_in)

        made[model_class] = type(f"{prefix}{model_class.__name__}", (model_class, mixin),
                                 {"__module__": __name__, "__init__": __init__})
    return made[model_class]


def bcos_model_class(model_class: type[HookedTransformer]) -> type[HookedTransformer]:
    """The B-cos version of a ``HookedTransformer`` subclass, e.g. sae-lens' ``HookedSAETransformer``.

    The returned class converts to B-cos inside ``HookedTransformer.__init__`` (it sits between
    ``model_class`` and ``HookedTransformer`` in the MRO), so wrappers the subclass installs afterwards
    wrap the B-cos modules.
    """
    return _with_mixin(model_class, BcosHookedTransformer, _CLASSES, "Bcos")
