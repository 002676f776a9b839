"""Caches filled under the caller's forward hooks: TransformerLens' decompositions refuse where a hook broke their sums.

TransformerLens runs the caller's forward hooks (``model.hooks(...)``, ``add_hook``) before the hooks that fill a
``run_with_cache`` cache, so the cache holds what they left. A hook that patched or ablated the residual stream, a
block's ``hook_attn_out`` / ``hook_mlp_out`` or ``ln_final.hook_normalized`` left the components TransformerLens sums
(embeddings, attention and MLP outputs, per-head / per-neuron results from ``z`` / ``post``, the stack over the cached
final-norm scale) out of step with the value there: ``decompose_resid`` + ``logit_attrs`` missed a logit by 0.014 on a
tiny B-cos GPT-2 (0.041 on its bridge), ``stack_head_results`` kept a zero-ablated ``attn_out``'s heads (0.67 off),
without a word. :class:`HookCheckedCache` (a mixin of TransformerLens' ``ActivationCache``) refuses those
decompositions, naming the hook: ``hooked_at_run`` holds the hooked points (set by ``run_with_cache`` of
``ExactCacheHookedTransformer`` and of the bridges from ``transformer_bridge_from_hf``), and each refusal first rebuilds
the hooked value from the cached values before it, so hooks that only read, or that change what the components are
computed from (``hook_z``, ``hook_post``, a scale, the embeddings), pass. TransformerLens 3.x and 4.x alike: only
hook names and the ``ActivationCache`` methods are used.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch import Tensor

from bcos_plugins._checks import require_int, require_tensor
from bcos_plugins.errors import BcosValueError, argument_error

from .model_changes import ModelSnapshot, refuse_cfg_unlike_built

__all__ = ["HookCheckedCache", "check_logit_tokens", "hook_checked_cache_class", "hooked_points",
           "cache_block_index", "require_cache_layer"]

_STREAM_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")


def hooked_points(model) -> tuple[str, ...]:
    """The names of ``model``'s hook points that carry forward hooks now (the caller's, before a run adds its own)."""
    return tuple(name for name, point in model.hook_dict.items() if getattr(point, "_forward_hooks", None))


def _block_hook(name: str) -> tuple[int, str] | None:
    """(layer, hook suffix) of a hook name ``blocks.{layer}.{suffix}``; None for the others."""
    head, _, rest = name.partition(".")
    layer, _, suffix = rest.partition(".")
    return (int(layer), suffix) if head == "blocks" and layer.isdigit() else None


def _target_layer(model, layer) -> int:
    """TransformerLens' reading of a decomposition's ``layer``: None and -1 are the unembedding's input."""
    return model.cfg.n_layers if layer is None or layer == -1 else int(layer) % (model.cfg.n_layers + 1)


def _cached(cache, names: list[str], hooked: str, method: str) -> list[Tensor]:
    missing = [n for n in names if n not in cache.cache_dict]
    if missing:
        raise argument_error(
            "cache", f"{method}: the forward that filled it ran with a hook at {hooked}, which may have changed the "
            f"value there, and {missing[0]} (needed to check that the components still sum to it) was left out of "
            "the cache (names_filter)", "Run run_with_cache without a names_filter, or without that hook",
            kind=BcosValueError)
    return [cache.cache_dict[n] for n in names]


def _rebuilt_final_normalized(cache, method: str) -> Tensor:
    """The value the forward handed to ``ln_final.hook_normalized``, rebuilt from the cached stream and scale by
    TransformerLens' own operations (LayerNorm centres, RMSNorm does not; the final norm is weightless here)."""
    cfg = cache.model.cfg
    name = "ln_final.hook_normalized"
    x, scale = _cached(cache, [f"blocks.{cfg.n_layers - 1}.hook_resid_post", "ln_final.hook_scale"], name, method)
    x = x.float() if x.dtype not in (torch.float32, torch.float64) else x
    if cfg.normalization_type in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    return x / scale


def _differs(value: Tensor, rebuilt: Tensor, scale: Tensor | None = None) -> bool:
    """Whether ``value`` is not ``rebuilt`` up to the rounding of summing the few terms it is made of (a hook that only
    reads leaves the stream's sums bit-identical; a patch or an ablation moves them by far more)."""
    value, rebuilt = value.to(rebuilt.device), rebuilt.to(value.dtype)
    size = (rebuilt.abs() if scale is None else scale).max().clamp_min(1.0)
    return bool((value - rebuilt).abs().max() > 64 * torch.finfo(value.dtype).eps * size)


def _bind(method, args, kwargs) -> dict:
    """The arguments of a call to the bound method ``method`` by name (positional ones too), defaults left out."""
    return dict(inspect.signature(method).bind(*args, **kwargs).arguments)


def _refuse_changed(method: str, name: str, what: str) -> None:
    raise argument_error(
        "cache", f"{method}: the forward that filled it ran with a hook at {name} that changed the value there (a "
        f"patch or an ablation), so {what} (wrong numbers)", "Decompose a cache run without that hook (model."
        "reset_hooks(), or run_with_cache outside the model.hooks(...) block); hooks at hook_z, mlp.hook_post, "
        "hook_pattern, the embeddings or a scale keep the decompositions exact, and at hook_attn_out / hook_mlp_out "
        "they keep decompose_resid exact", kind=BcosValueError)


def _logit_token_dims(cache, residual_stack: Tensor, batch_slice, has_batch_dim: bool) -> tuple[int, ...]:
    """The (batch, pos) dimensions ``logit_attrs`` multiplies the token directions into: the stack's dimensions
    between its components and ``d_model``, the batch sliced by ``batch_slice`` (as ``apply_ln_to_stack`` slices it)."""
    dims = tuple(residual_stack.shape[1:-1])
    if has_batch_dim and batch_slice is not None and dims:
        from transformer_lens.utilities import Slice

        given = batch_slice.slice if isinstance(batch_slice, Slice) else batch_slice  # logit_attrs passes a Slice on
        given = given.tolist() if hasattr(given, "tolist") else given  # rows as the caller wrote them
        batch_slice = batch_slice if isinstance(batch_slice, Slice) else Slice(batch_slice)
        try:  # the row numbers themselves, not a meta tensor: indexing one with a list of rows checks no bounds
            dims = tuple(batch_slice.apply(torch.arange(dims[0]), dim=0).shape) + dims[1:]
        except IndexError as error:  # TransformerLens' own apply_ln_to_stack fails the same way, with a bare message
            raise argument_error(
                "batch_slice", f"{given!r} names rows the residual stack does not have: its batch axis (dimension 1) "
                f"has {dims[0]} row(s). TransformerLens cuts the stack by batch_slice itself (as it cuts the cached "
                "norm scale; unlike pos_slice, which it assumes already applied), so a stack already cut to those "
                "rows is cut again",
                "Pass the stack of the whole cached batch with batch_slice (it cuts the stack and the scale alike), "
                f"or a batch_slice that indexes the stack's {dims[0]} row(s)") from error
    return dims


def _check_scale_lines_up(cache, bound: dict) -> None:
    """Refuse an ``apply_ln_to_stack`` (``logit_attrs``, the stacks' ``apply_ln``) whose cached norm scale, sliced by
    ``pos_slice`` / ``batch_slice``, does not have the stack's (batch, pos) dimensions: TransformerLens assumes the
    stack was sliced as the scale is and divides by broadcasting, so a full stack with ``pos_slice=-1`` was divided by
    the last position's scale everywhere (a batch of one: the right shape, other values) or had its rows paired with
    positions, and a stack sliced at -1 with no ``pos_slice`` became a table over every position's scale. A scale with
    an extra leading 1 (a batch of one, the stack given without it, ``has_batch_dim=False``) lines up."""
    if cache.model.cfg.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre"):
        return  # TransformerLens returns the stack unchanged
    layer = _target_layer(cache.model, bound.get("layer"))
    if bound.get("recompute_ln") and layer == cache.model.cfg.n_layers:
        return  # the final norm recomputed per component: no cached scale
    stack = bound.get("residual_stack")
    scale_of = getattr(cache, "_get_cached_ln_scale", None)
    if not isinstance(stack, Tensor) or scale_of is None:
        return
    from transformer_lens.utilities import Slice

    pos_slice, batch_slice = bound.get("pos_slice"), bound.get("batch_slice")
    try:
        scale = scale_of(layer, bound.get("mlp_input", False),
                         pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice),
                         batch_slice if isinstance(batch_slice, Slice) else Slice(batch_slice))
    except (KeyError, TypeError):
        return  # not cached (names_filter) or another signature: TransformerLens' own call says so
    has_batch_dim = bound.get("has_batch_dim", True)
    dims, scale_dims = _logit_token_dims(cache, stack, batch_slice, has_batch_dim), tuple(scale.shape[:-1])
    while len(scale_dims) > len(dims) and scale_dims[0] == 1:
        scale_dims = scale_dims[1:]
    if scale_dims != dims:
        raise argument_error(
            "pos_slice", f"the cached norm scale sliced by pos_slice={pos_slice!r}"
            f"{f', batch_slice={batch_slice!r}' if batch_slice is not None else ''} has the dimensions "
            f"{tuple(scale.shape[:-1])}, but the residual stack's between its components and d_model are {dims}; "
            "TransformerLens would divide them by broadcasting, each component by another row's or position's "
            "scale (wrong numbers)", "Pass the pos_slice the stack was made with (decompose_resid(pos_slice=-1) "
            "and logit_attrs(..., pos_slice=-1)), or none to both")


def check_logit_tokens(cache, name: str, tokens, residual_stack, batch_slice=None, has_batch_dim: bool = True) -> None:
    """Refuse ``tokens`` (``logit_attrs``' ``tokens`` / ``incorrect_tokens``) that are not ids of the unembedding's
    columns, or a tensor of them whose shape does not line up with the stack's (batch, pos) dimensions.
    TransformerLens multiplies ``W_U[:, tokens]`` ((*tokens.shape, d_model)) into the stack by broadcasting, which
    aligns trailing dimensions: one token per row, ``(batch,)``, against a stack with a position axis was read as one
    token per position (0.41 off the logits with batch == pos, silently); a negative id read W_U's columns from the
    end (-1: the last token's logit) and a boolean tensor indexed them as a mask. A string is TransformerLens' (one
    token of its tokenizer)."""
    if isinstance(tokens, str) or not isinstance(tokens, int | Tensor):
        return  # TransformerLens reads a string through the tokenizer and refuses other types itself
    if isinstance(tokens, bool):
        raise argument_error(name, "got a boolean; token ids must be integers", "Pass an int or an integer tensor")
    ids = require_tensor(name, tokens, kind="int")
    vocab = getattr(cache.model.cfg, "d_vocab_out", None)
    if not isinstance(vocab, int) or vocab <= 0:
        vocab = cache.model.W_U.shape[-1]
    bad = (ids < 0) | (ids >= vocab)
    if bool(bad.any()):
        raise argument_error(name, f"ids must lie in [0, {vocab}), got {ids[bad].unique().tolist()[:8]}",
                             f"Pass ids of the model's {vocab} output tokens; negative ids are not counted from the "
                             "end (an ignored label's -100 is no token)")
    if ids.ndim == 0:
        return
    dims = _logit_token_dims(cache, residual_stack, batch_slice, has_batch_dim)
    if ids.ndim == len(dims) and all(size in (1, dim) for size, dim in zip(ids.shape, dims, strict=True)):
        return
    if ids.numel() == 1 and ids.ndim <= len(dims):
        return  # one token for every row and position, however it is shaped
    axes = "(batch, pos)" if has_batch_dim and len(dims) == 2 else "(batch,)" if has_batch_dim else "(pos,)"
    raise argument_error(
        name, f"has shape {tuple(ids.shape)}, but the residual stack's dimensions between its components and d_model "
        f"are {dims} {axes if len(dims) in (1, 2) else ''}; TransformerLens broadcasts the tokens against the stack's "
        "trailing dimensions, so they would be read at other rows or positions (wrong numbers)",
        f"Pass one token per entry, shape {dims} ((batch, 1) for one token per row), an int for every entry, or slice "
        "the stack's positions (decompose_resid(pos_slice=-1) and logit_attrs(..., pos_slice=-1)) to pass one token "
        "per row, shape (batch,)")


def require_cache_layer(cache, layer) -> None:
    """Refuse a decomposition's ``layer`` that TransformerLens does not read as a block index: it takes [0, n_layers],
    with -1 and None for n_layers (the final residual stream), and any other negative one ran ``range(-2)``
    (decompose_resid gave the embeddings alone, stack_head_results an empty stack, without a word); True was read as
    block 1, and a float or a layer past n_layers failed with an empty AssertionError or a KeyError."""
    if layer is None or (type(layer) is int and layer == -1):
        return
    n_layers = cache.model.cfg.n_layers
    require_int("layer", layer, minimum=0, maximum=n_layers, fix=(
        f"Pass the block whose input to decompose, an int in [0, {n_layers}]; {n_layers}, -1 or None is the final "
        "residual stream (the unembedding's input). TransformerLens reads no other negative layer: -2 is not the "
        "last block's input"))


def cache_block_index(cache, layer) -> int:
    """``get_neuron_results``' ``layer`` as a block index: TransformerLens reads it as Python does (its cache and
    ``model.blocks`` both take -1 for the last block), so negative layers count from the end; the exact per-neuron
    results looked ``blocks.-1...`` up and refused, blaming a names_filter. Others are refused naming ``layer``."""
    n_layers = cache.model.cfg.n_layers
    return require_int("layer", layer, minimum=-n_layers, maximum=n_layers - 1, fix=(
        f"Pass a block index in [-{n_layers}, {n_layers - 1}] (-1: the last block)")) % n_layers


def _empty_decomposition(cache, bound: dict) -> Tensor | None:
    """The empty stack ``decompose_resid`` has when no component it includes lies before its layer (``layer=0`` with
    ``incl_embeds=False``; ``mode="mlp"`` with ``mlp_input=True`` there), shaped as the non-empty ones (position
    sliced); TransformerLens stacked an empty list there and failed with torch's "stack expects a non-empty
    TensorList". ``None`` where there is a component."""
    cfg = cache.model.cfg
    mode = bound.get("mode", "all")
    attention, mlp = mode != "mlp", mode != "attn" and not cfg.attn_only
    embeds = bound.get("incl_embeds", True) and ("hook_embed" in cache.cache_dict or "hook_pos_embed" in cache.cache_dict)
    if embeds or (_target_layer(cache.model, bound.get("layer")) > 0 and (attention or mlp)) \
            or (bound.get("mlp_input", False) and attention):
        return None
    from transformer_lens.utilities import Slice

    pos_slice = bound.get("pos_slice")
    pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
    like = pos_slice.apply(cache["blocks.0.hook_resid_pre"], dim=-2)
    return like.new_zeros((0, *like.shape))


class HookCheckedCache:
    """Mixin of TransformerLens' ``ActivationCache``: its decompositions refuse where the caller's hooks broke the
    sums they rely on (see the module docstring); without ``hooked_at_run`` those checks cost nothing. The adapter's
    caches (``BcosActivationCache``, every bridge cache) all have it, so it also checks the arguments TransformerLens
    misread without a word: a ``layer`` that is no block index (:func:`require_cache_layer`), ``logit_attrs``' tokens
    (:func:`check_logit_tokens`), a model changed since the run (``at_run``, :mod:`.model_changes`) or whose cfg no
    longer says what its norms do, and it gives ``decompose_resid`` with no component its empty stack."""

    hooked_at_run: tuple[str, ...] = ()
    at_run: ModelSnapshot | None = None  # the model as the run that filled the cache saw it (record_run)
    _model_checked = False  # inside a decomposition that compared the model with at_run already

    def record_run(self, hooked: tuple[str, ...]) -> None:
        """Record the run that filled the cache: the caller's hooked points then, and the model as it was
        (:class:`~.model_changes.ModelSnapshot`), which the decompositions compare the model with."""
        self.hooked_at_run = hooked
        self.at_run = ModelSnapshot.of(self.model)

    def __getstate__(self) -> dict:
        # a copy (copy.deepcopy, pickle, torch.save) holds a copy of the model: the snapshot's tensors are not its
        # (a saved and reloaded cache was refused as "weights changed", and the snapshot's weak references cannot be
        # pickled), so what had changed since the run is noted now and the copy records its own model
        state = self.__dict__.copy()
        if state.get("at_run") is not None:
            state["at_run"] = state["at_run"].for_copy(self.model)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(state.get("at_run"), tuple):
            self.at_run = ModelSnapshot.of(self.model, changed_before_copy=state["at_run"])

    def refuse_model_changed(self, method: str, *, weights: bool = True) -> None:
        """Refuse ``method`` when the model changed since the run that filled the cache
        (:meth:`~.model_changes.ModelSnapshot.refuse_changes`; ``weights``: the method reads them); nothing inside a
        decomposition that checked already."""
        if self.at_run is not None and not self._model_checked:
            self.at_run.refuse_changes(self.model, method, weights=weights)

    @contextlib.contextmanager
    def _model_unchanged_through(self, method: str):
        """Check the model once for a decomposition that reads the weights, not again in the decompositions it calls
        (TransformerLens' get_full_resid_decomposition calls stack_head_results, which calls compute_head_results,
        each checked where called alone: a full decomposition compared every weight a dozen times)."""
        if self._model_checked:
            yield
            return
        self.refuse_model_changed(method)
        self._model_checked = True
        try:
            yield
        finally:
            self._model_checked = False

    def _hooked(self, suffixes: tuple[str, ...], layer: int, mlp_input: bool) -> list[tuple[str, int, str]]:
        """(name, layer, suffix) of each hook of ``suffixes`` that ran with the caller's hooks and lies before the
        input of block ``layer`` (of its MLP with ``mlp_input``), where a decomposition up to there reads it."""
        found = []
        for name in self.hooked_at_run:
            block = _block_hook(name)
            if block is None or block[1] not in suffixes:
                continue
            at, suffix = block
            if at < layer or (at == layer and (suffix == "hook_resid_pre" or (mlp_input and suffix in (
                    "hook_resid_mid", "hook_attn_out")))):
                found.append((name, at, suffix))
        return found

    def _check_stream(self, method: str, layer, mlp_input: bool) -> None:
        """Refuse ``method`` when the residual stream it decomposes (the input of block ``layer``, of its MLP with
        ``mlp_input``, or the final one) is not the sum of the embeddings, attention and MLP outputs before it: a hook
        changed the stream, and the components sum to the stream as the forward built it, not to the patched one
        (decompose_resid + logit_attrs missed a logit by 0.014 on a tiny B-cos GPT-2, without a word). The sum is
        TransformerLens' own, in its order, so an unchanged stream matches it to the bit. On a bridge a hook at
        ``hook_resid_mid`` (an alias of ``ln2.hook_in``) feeds the MLP without changing the stream: no refusal."""
        cfg = self.model.cfg
        target = _target_layer(self.model, layer)
        if target == cfg.n_layers:
            point, mlp_input = f"blocks.{cfg.n_layers - 1}.hook_resid_post", False
        else:
            point = f"blocks.{target}.{'hook_resid_mid' if mlp_input else 'hook_resid_pre'}"
        names = ["hook_embed"] + (["hook_pos_embed"] if getattr(cfg, "positional_embedding_type", None) == "standard"
                                  else [])
        for at in range(target):
            names.append(f"blocks.{at}.hook_attn_out")
            if not cfg.attn_only:
                names.append(f"blocks.{at}.hook_mlp_out")
        if mlp_input:
            names.append(f"blocks.{target}.hook_attn_out")
        at_stream = [name for name, _, _ in self._hooked(_STREAM_HOOKS, target, mlp_input)]
        if point not in self.cache_dict and not at_stream:
            return  # left out by a names_filter, and no hook on the stream before it to have changed it
        hooked = at_stream or list(self.hooked_at_run)
        value, *parts = _cached(self, [point, *names], ", ".join(hooked[:4]), method)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        if _differs(value, total):
            _refuse_changed(method, ", ".join(hooked[:4]) + (" ..." if len(hooked) > 4 else ""),
                            f"the embeddings, attention and MLP outputs do not sum to the residual stream at {point}")

    def _check_outputs(self, method: str, layer, mlp_input: bool, part: str) -> None:
        """Refuse ``method`` when a hook changed ``hook_attn_out`` / ``hook_mlp_out`` of a block it stacks per head /
        per neuron: those shares are computed from ``z`` / ``post`` and sum to the output the block computed, not to
        the patched one (a zero-ablated attn_out kept its heads' shares in stack_head_results, 0.67 off)."""
        suffix = "hook_attn_out" if part == "attn" else "hook_mlp_out"
        for name, at, _ in self._hooked((suffix,), _target_layer(self.model, layer), mlp_input):
            if part == "attn":
                if f"blocks.{at}.attn.hook_result" not in self.cache_dict:
                    self.compute_head_results()
                shares = self.cache_dict[f"blocks.{at}.attn.hook_result"]
                bias = getattr(self.model.blocks[at].attn, "b_O", None)
            else:
                shares = self.get_neuron_results(at)
                bias = getattr(self.model.blocks[at].mlp, "b_out", None)
            rebuilt = shares.sum(-2) if bias is None else shares.sum(-2) + bias.to(shares)
            if _differs(self.cache_dict[name], rebuilt, shares.abs().sum(-2)):
                _refuse_changed(method, name, f"the per-{'head' if part == 'attn' else 'neuron'} results (from "
                                f"{'hook_z' if part == 'attn' else 'mlp.hook_post'}) do not sum to it")

    def _check_final_norm(self, method: str, layer) -> None:
        """Refuse ``method`` when a hook changed the final norm's output: the stack scaled by the cached
        ``ln_final.hook_scale`` sums to the norm's own output, not the patched one (logit_attrs missed a logit by
        0.087 on a tiny B-cos GPT-2, without a word)."""
        name = "ln_final.hook_normalized"
        if name in self.hooked_at_run and _target_layer(self.model, layer) == self.model.cfg.n_layers \
                and _differs(self.cache_dict[name], _rebuilt_final_normalized(self, method)):
            _refuse_changed(method, name, "the residual components scaled by the final norm's cached scale do not sum "
                            "to the normalised stream the unembedding read")

    def decompose_resid(self, *args, **kwargs):
        bound = _bind(super().decompose_resid, args, kwargs)
        require_cache_layer(self, bound.get("layer"))
        if self.hooked_at_run:
            self._check_stream("decompose_resid", bound.get("layer"), bound.get("mlp_input", False))
        empty = _empty_decomposition(self, bound)
        if empty is not None:
            return (empty, []) if bound.get("return_labels", False) else empty
        return super().decompose_resid(*args, **kwargs)

    def get_full_resid_decomposition(self, *args, **kwargs):
        bound = _bind(super().get_full_resid_decomposition, args, kwargs)
        require_cache_layer(self, bound.get("layer"))
        with self._model_unchanged_through("get_full_resid_decomposition"):
            if self.hooked_at_run:  # the heads and neurons are checked by stack_head_results / stack_neuron_results
                self._check_stream("get_full_resid_decomposition", bound.get("layer"), bound.get("mlp_input", False))
            return super().get_full_resid_decomposition(*args, **kwargs)

    def compute_head_results(self, *args, **kwargs):
        with self._model_unchanged_through("compute_head_results"):
            return super().compute_head_results(*args, **kwargs)

    def get_neuron_results(self, layer, *args, **kwargs):
        with self._model_unchanged_through("get_neuron_results"):
            return super().get_neuron_results(cache_block_index(self, layer), *args, **kwargs)

    def stack_activation(self, *args, **kwargs):
        bound = _bind(super().stack_activation, args, kwargs)
        require_cache_layer(self, bound.get("layer", -1))
        if bound.get("layer", -1) == 0:  # no block before layer 0: TransformerLens stacked an empty list and failed
            like = self[(bound["activation_name"], 0, bound.get("sublayer_type"))]
            return like.new_zeros((0, *like.shape))
        return super().stack_activation(*args, **kwargs)

    def accumulated_resid(self, *args, **kwargs):
        require_cache_layer(self, _bind(super().accumulated_resid, args, kwargs).get("layer"))
        return super().accumulated_resid(*args, **kwargs)

    def stack_head_results(self, *args, **kwargs):
        layer = _bind(super().stack_head_results, args, kwargs).get("layer", -1)
        require_cache_layer(self, layer)
        with self._model_unchanged_through("stack_head_results"):
            if self.hooked_at_run:
                self._check_outputs("stack_head_results", layer, False, "attn")
            return super().stack_head_results(*args, **kwargs)

    def stack_neuron_results(self, *args, **kwargs):
        bound = _bind(super().stack_neuron_results, args, kwargs)
        layer = bound.get("layer")
        require_cache_layer(self, layer)
        with self._model_unchanged_through("stack_neuron_results"):
            if bound.get("apply_ln"):  # its fused path (project_output_onto) centres by the cfg, not apply_ln_to_stack
                refuse_cfg_unlike_built(self.model, "stack_neuron_results",
                                        stack_norm=(_target_layer(self.model, layer), False, False))
            if self.hooked_at_run:
                self._check_outputs("stack_neuron_results", layer, False, "mlp")
            return super().stack_neuron_results(*args, **kwargs)

    def logit_attrs(self, *args, **kwargs):
        # TransformerLens' own reading of the tokens broadcast them against the stack (check_logit_tokens)
        bound = _bind(super().logit_attrs, args, kwargs)
        with self._model_unchanged_through("logit_attrs"):
            for name in ("tokens", "incorrect_tokens"):
                check_logit_tokens(self, name, bound.get(name), bound.get("residual_stack"), bound.get("batch_slice"),
                                   bound.get("has_batch_dim", True))
            return super().logit_attrs(*args, **kwargs)

    def apply_ln_to_stack(self, *args, **kwargs):
        # logit_attrs, decompose_resid(apply_ln=True) and the stacks' apply_ln all come through here
        bound = _bind(super().apply_ln_to_stack, args, kwargs)
        require_cache_layer(self, bound.get("layer"))
        self.refuse_model_changed("apply_ln_to_stack", weights=False)  # the stack is cached; the cfg is read now
        refuse_cfg_unlike_built(self.model, "apply_ln_to_stack", stack_norm=(
            _target_layer(self.model, bound.get("layer")), bound.get("mlp_input", False),
            bool(bound.get("recompute_ln", False))))
        _check_scale_lines_up(self, bound)
        if self.hooked_at_run:
            if not bound.get("mlp_input", False):
                self._check_final_norm("apply_ln_to_stack", bound.get("layer"))
        return super().apply_ln_to_stack(*args, **kwargs)


_CHECKED_CLASSES: dict[type, type] = {}


def hook_checked_cache_class(cache_class: type) -> type:
    """``cache_class`` (an ``ActivationCache`` class) with :class:`HookCheckedCache` in front; itself if it has it."""
    if issubclass(cache_class, HookCheckedCache):
        return cache_class
    if cache_class not in _CHECKED_CLASSES:
        _CHECKED_CLASSES[cache_class] = type(cache_class.__name__, (HookCheckedCache, cache_class),
                                             {"__module__": __name__})
    return _CHECKED_CLASSES[cache_class]
