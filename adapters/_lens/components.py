"""Token x component decomposition of a logit: which input token reaches the logit through which component.

In explanation mode (:func:`bcos_plugins.nn.explanation_mode`) every dynamic weight is a constant, so an
explainable model (B-cos, bilinear) is linear in its embeddings, and so is the output of every component.
With ``g = d explained / d resid_final`` (a constant: the final norm's scale is held fixed) the explained
value splits over the residual stream's components, ``explained = sum_c out_c . g`` (direct logit
attribution: each attention head, each MLP, and the direct path ``embed + pos_embed``), and each
``out_c . g`` splits over the input tokens by input x gradient. The table ``T[t, c]``:

- sums exactly to the explained value (float rounding);
- row sums over tokens ``sum_t T[t, c]`` are each component's direct logit attribution;
- column sums over components ``sum_c T[t, c]`` are the token contributions of ``explain_logits``.

A head's direct share needs its per-head output; it is taken from the forward's own values without reading
weights: the attention output at the explained position is linear in that position's ``z`` (the output
projection's B-cos scale is a constant in explanation mode), so ``out_attn . g = sum_h z_h . u_h`` with
``u = d (out_attn . g) / d z``. All components' token splits come from one batched backward sweep
(``torch.autograd.grad(..., is_grads_batched=True)``) instead of one backward per component: going down the
blocks, the gradients of all components above are carried together, so each crosses only the blocks below
it (the loop's arithmetic, batched; ``benchmarks/bench_lens.py`` times the two).

Works on explainable ``HookedTransformer`` s (TransformerLens 3.x) and ``TransformerBridge`` s from
:func:`~.bridge.transformer_bridge_from_hf` (3.x and 4.x): only standard hook names are used.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from bcos_plugins._checks import require_bool
from bcos_plugins.attribution import as_leaf, resolve_explained, resolve_positions
from bcos_plugins.attribution.gradient import outside_inference
from bcos_plugins.attribution.results import relative_completeness_error
from bcos_plugins.errors import BcosRuntimeError, BcosTypeError, BcosValueError
from bcos_plugins.explain import completeness_tolerance
from bcos_plugins.nn.dynamic import explanation_mode
from bcos_plugins.nn.functional import at_least_float32

from .explain import require_explainable, require_finite_lens_weights, user_hooked_points
from .inputs import check_lens_tokens
from .sae_error import SAEErrorShares

__all__ = ["TokenComponentDecomposition", "plot_token_components", "token_component_decomposition"]

_EMBED_HOOKS = ("hook_embed", "hook_pos_embed")


@dataclass
class TokenComponentDecomposition(SAEErrorShares):
    """Result of :func:`token_component_decomposition` (see the module docstring).

    Attributes:
        table: ``(batch, pos, n_components)``: token ``t``'s share of the explained value through component ``c``.
        labels: component names, ``"direct"`` (embed + pos_embed), ``"L{l}H{h}"`` per head, ``"L{l}MLP"``.
        explained: the explained value per row (a logit, or ``target - foil``).
        target, foil, position: what was explained, per row.
        sae_error_shares: with SAEs spliced in (sae-lens ``add_sae(sae, use_error_term=True)``), per SAE hook the
            share of ``explained`` its error term carries (computed without gradient, so no token's column holds
            it; the same numbers as ``explain_logits``' ``sae_error_shares``). Then ``table`` sums to
            ``explained - sae_error_share`` (minus the SAEs' biases' share, if they have biases), and
            ``completeness_error`` measures the table alone, so it shows that share instead of hiding it.
    """

    table: Float[Tensor, "batch pos n_components"]
    labels: list[str]
    explained: Float[Tensor, " batch"]
    target: object
    foil: object | None
    position: Int[Tensor, " batch"]
    sae_error_shares: dict[str, Float[Tensor, " batch"]] | None = None

    @property
    def component_totals(self) -> Float[Tensor, "batch n_components"]:
        """Direct logit attribution of each component (sums of the table over tokens)."""
        return self.table.sum(1)

    @property
    def token_totals(self) -> Float[Tensor, "batch pos"]:
        """Each token's contribution to the explained value (sums over components): ``explain_logits``'."""
        return self.table.sum(2)

    @property
    def delta(self) -> Float[Tensor, " batch"]:
        """Signed ``sum(table) - explained`` per row."""
        return self.table.sum((1, 2)) - self.explained

    @property
    def completeness_error(self) -> Float[Tensor, " batch"]:
        """``|delta| / |explained|`` per row (float rounding for B-cos and bilinear models)."""
        return relative_completeness_error(self.delta, self.explained)


def _layers(model: nn.Module) -> tuple[int, bool]:
    cfg = model.cfg
    return cfg.n_layers, bool(getattr(cfg, "attn_only", False))


def _check_inputs(model: nn.Module, tokens, attention_mask) -> tuple[Tensor, Tensor | None]:
    require_explainable(model)
    return check_lens_tokens(model, tokens, attention_mask)


def _top_down_table(shares: list[list[Tensor]], resid_pre: list[Tensor], inputs: list[Tensor]) -> Tensor:
    """Token split of every block's component shares, carried down the residual stream in one pass.

    ``shares[l]`` is a list of ``(batch, k)`` groups of block ``l``'s components (its heads, its MLP), functions of
    ``resid_pre[l]``. Going from the last block down, the gradients of all components at or above block ``l``
    w.r.t. ``resid_pre[l]`` are one batched tensor: the new block's are added, and the whole stack is pulled
    through block ``l - 1`` in one batched backward (``is_grads_batched``). Each component's gradient thus
    crosses only the blocks below it, as in one backward per component, but all of them travel together.

    A block's own groups are differentiated separately: the heads' shares depend on ``resid_pre[l]`` through the
    value path alone and the MLP's through one position, so batching them with each other would push the heads'
    all-zero gradients through the MLP (and the MLP's through nothing cheaper): separately, each group's backward
    runs only its own path.
    """
    carried = None  # (n_components so far, batch, pos, d_model): gradients w.r.t. resid_pre[layer + 1]
    for layer in range(len(shares) - 1, -1, -1):
        here = resid_pre[layer]
        if carried is not None:  # pull the upper components' gradients through block `layer`
            carried = torch.autograd.grad(resid_pre[layer + 1], here, grad_outputs=carried,
                                          is_grads_batched=True, retain_graph=True)[0]
        new = []
        for group in shares[layer]:
            k = group.shape[-1]
            eye = torch.eye(k, dtype=group.dtype, device=group.device)
            new.append(torch.autograd.grad(group, here, grad_outputs=eye[:, None, :].expand(k, *group.shape),
                                           is_grads_batched=True, retain_graph=True)[0])
        carried = torch.cat(new if carried is None else [*new, carried])  # block order: lower blocks first
    # resid_pre[0] is the sum of the embedding leaves: the same gradient reaches each of them
    first = sum(inputs)
    # summed over d_model in at least float32, as explain's token scores (half precision keeps 3 digits)
    return (first[None] * carried).sum(-1, dtype=at_least_float32(first.dtype)).permute(1, 2, 0)  # (batch, pos, comp)


def token_component_decomposition(
    model: nn.Module,
    tokens: Int[Tensor, "batch pos"],
    *,
    target=None,
    foil=None,
    position=None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    batched: bool = True,
) -> TokenComponentDecomposition:
    """Split a logit (or logit difference) into input token x component shares that sum to it exactly.

    Args:
        model: an explainable ``HookedTransformer`` or ``TransformerBridge`` without biases (B-cos, bilinear).
            A model whose biases make the table miss part of the logit (e.g. a plain GPT-2) is refused with a
            ``BcosValueError``; SAEs spliced in are allowed, and their error terms' share is reported
            (``sae_error_shares``).
        tokens: token ids ``(batch, pos)`` (``torch.long``), at most ``n_ctx`` positions.
        target, foil, position, attention_mask: as for ``explain_logits`` (ids per row or
            ``Direction``; default target: the top prediction; default position: each row's last real token).
        batched: one batched backward sweep for all components (default), or one backward per component
            (the reference loop the benchmark compares against; same numbers).
    """
    batched = require_bool("batched", batched)  # "no" read as True
    tokens, attention_mask = _check_inputs(model, tokens, attention_mask)
    # normal copies of what was made under the caller's inference_mode (autograd cannot save inference tensors)
    tokens, attention_mask = outside_inference(tokens), outside_inference(attention_mask)
    batch, _ = tokens.shape
    n_layers, attn_only = _layers(model)
    if n_layers == 0:  # was "lacks the standard hook points ['blocks.-1.hook_resid_post']"
        raise BcosValueError("model: it has no blocks (cfg.n_layers=0), so no component carries a share of the logit: "
                             "the embeddings' share is all of it. Explain it with explain_logits(model, tokens, ...) "
                             "(its token shares are the whole table).")
    mask = attention_mask if attention_mask is not None else torch.ones_like(tokens)
    pos = outside_inference(resolve_positions(position, mask, default="last"))
    rows = outside_inference(torch.arange(batch, device=tokens.device))
    hooked = user_hooked_points(model)  # the caller's, before the decomposition adds its own
    embed_names = [n for n in _EMBED_HOOKS if n in model.hook_dict]
    leaves: dict[str, Tensor] = {}
    kept: dict[str, Tensor] = {}

    def make_leaf(name):
        def hook(activation: Tensor, hook) -> Tensor:
            leaves[name] = as_leaf(activation)
            return leaves[name]
        return hook

    def keep(name):
        def hook(activation: Tensor, hook) -> Tensor:
            kept[name] = activation
            return activation
        return hook

    watched = [f"blocks.{n_layers - 1}.hook_resid_post"]
    for layer in range(n_layers):
        watched += [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.hook_attn_out"]
        if not attn_only:
            watched.append(f"blocks.{layer}.hook_mlp_out")
    missing = [n for n in embed_names + watched if n not in model.hook_dict] or (not embed_names and ["hook_embed"])
    # sae-lens' add_sae replaces the hook point it splices at by the SAE: that name leaves hook_dict (its value is
    # now the SAE's reconstruction plus its error term), which read "lacks the standard hook points", as if the model
    # were not a TransformerLens model
    spliced = sorted(set(missing or ()) & set(getattr(model, "acts_to_saes", None) or {}))
    if spliced:
        raise BcosValueError(
            f"model: SAEs are spliced in at {spliced}, hooks the decomposition reads (component outputs, the "
            "residual stream or hook_z), and sae-lens replaces those hook points by the SAEs. Splice SAEs inside a "
            "component (e.g. blocks.L.ln2.hook_normalized, blocks.L.ln1.hook_normalized) for this decomposition, "
            "or use explain_logits / bcos_plugins.adapters.sae_lens.sae_error_share for token contributions with "
            "the error terms' share")
    if missing:
        raise BcosTypeError(f"model: it lacks the standard hook points {missing}; the decomposition needs them")
    hooks = [(n, make_leaf(n)) for n in embed_names] + [(n, keep(n)) for n in watched]

    with torch.inference_mode(False), torch.enable_grad(), explanation_mode(model):
        logits = model.run_with_hooks(tokens, attention_mask=attention_mask, fwd_hooks=hooks)
        explained, target, foil = resolve_explained(logits[rows, pos], target, foil)
        embed_names = [n for n in embed_names if n in leaves]  # a bridge lists hook_pos_embed for rotary models too
        if not embed_names or any(n not in kept for n in watched):
            raise BcosRuntimeError(
                "model: the forward did not run through the standard hook points "
                f"{[n for n in watched if n not in kept] or ['hook_embed']}; the decomposition needs them")
        resid = kept[watched[0]]
        # the direct unembedding direction per row: a constant in explanation mode (final norm scale fixed)
        direction = torch.autograd.grad(explained.sum(), resid, retain_graph=True)[0]
        inputs = [leaves[n] for n in embed_names]
        shares, labels = [], []  # per block: the (batch,) direct shares of its heads and MLP
        for layer in range(n_layers):
            z, attn_out = kept[f"blocks.{layer}.attn.hook_z"], kept[f"blocks.{layer}.hook_attn_out"]
            if z.ndim != 4:
                raise BcosRuntimeError(f"blocks.{layer}.attn.hook_z has shape {tuple(z.shape)}, expected "
                                       "(batch, pos, head, d_head)")
            # per-head directions: attn_out . g is linear in z (output projection scale constant)
            u = torch.autograd.grad((attn_out * direction).sum(), z, retain_graph=True)[0]
            block = [(z * u).sum((1, 3))]  # (batch, head): functions of the embeddings
            names = [f"L{layer}H{h}" for h in range(z.shape[2])]
            if not attn_only:
                block.append((kept[f"blocks.{layer}.hook_mlp_out"] * direction).sum((1, 2))[:, None])
                names.append(f"L{layer}MLP")
            shares.append(block)
            labels += names
        direct = sum((leaf * direction).sum(-1, dtype=at_least_float32(leaf.dtype))
                     for leaf in inputs)  # embed + pos_embed: (batch, pos)
        if batched:
            table = _top_down_table(shares, [kept[f"blocks.{layer}.hook_resid_pre"] for layer in range(n_layers)],
                                    inputs)
        else:
            # each component's own scalar (not a column of one stacked tensor: a backward from a column would
            # also run every other component's graph with zero gradients)
            per_component = [column for block in shares for group in block for column in group.unbind(-1)]
            columns = []
            for c, share in enumerate(per_component):
                grads = torch.autograd.grad(share.sum(), inputs, retain_graph=c < len(per_component) - 1,
                                            allow_unused=True)
                columns.append(sum((leaf * g).sum(-1, dtype=at_least_float32(leaf.dtype))
                                   for leaf, g in zip(inputs, grads, strict=True) if g is not None))
            table = torch.stack(columns, dim=-1)
        table = torch.cat([direct[..., None], table], dim=-1)
        labels = ["direct"] + labels
    table, explained = table.detach(), explained.detach()
    # 0 x a value is NaN only for a NaN / inf one (no overflow of large finite sums): one sync. A NaN weight gave a
    # table of NaN without a word, where explain_logits refused
    if not bool(torch.isfinite((table * 0).sum() + (explained * 0).sum())):
        require_finite_lens_weights(model)
        raise BcosValueError(
            "model: the decomposition is NaN or infinite (its weights are finite): an input or an embedding row of "
            "NaN, inf or a huge value overflows inside the model. Check the tokens' embedding rows, or decompose in "
            "float32")
    if getattr(model, "acts_to_saes", None):
        sae_error_shares = _sae_error_shares(model, tokens, target, foil, pos, attention_mask, table)
    else:
        sae_error_shares = {}
        _refuse_untracked_terms(model, table, explained, hooked)
    return TokenComponentDecomposition(table=table, labels=labels, explained=explained, target=target, foil=foil,
                                       position=pos, sae_error_shares=sae_error_shares)


def _tolerance(table: Tensor, reference: Tensor) -> Tensor:
    # float rounding of the model's dtype (the explained value's: the table is summed in at least float32), or of
    # an enclosing autocast's, as explain allows it (sqrt(eps)), relative to the magnitudes summed per row: 100 eps
    # was 0.78 of that scale in bfloat16, so a bfloat16 table missing the whole bias share passed
    rounding, _ = completeness_tolerance(reference)
    return max(1e-4, rounding) * (reference.abs() + table.abs().sum((1, 2)))


def _sae_error_shares(model, tokens, target, foil, position, attention_mask, table: Tensor) -> dict[str, Tensor]:
    """The spliced SAEs' error terms' shares, as ``explain_logits`` measures them, after checking that the table's
    token totals are that explanation's token contributions (they are not when an SAE sits on the residual stream).

    What the error terms carry (computed without gradient by sae-lens) is in no token's column, and it is exactly
    the share ``explain_logits`` reports, as long as the components' shares add up to the logit as functions of the
    tokens. An SAE on the residual stream breaks that: the components below it reach the logit through its
    reconstruction, not directly, while their direct shares count their whole outputs.
    """
    from .explain import explain_logits

    reference = explain_logits(model, tokens, target=target, foil=foil, position=position,
                               attention_mask=attention_mask)
    gap = (table.sum(2) - reference.contributions).abs().sum(1)
    if (gap > _tolerance(table, reference.explained)).any():
        hooks = sorted(model.acts_to_saes)
        raise BcosValueError(
            f"model: with the SAEs spliced in at {hooks} the components' shares do not add up to the logit (an SAE "
            "on the residual stream replaces the sum of the component outputs below it by its reconstruction, so "
            "those components reach the logit only through the SAE). Splice SAEs inside a component (e.g. blocks.L.ln2.hook_normalized, "
            "blocks.L.ln1.hook_normalized) for this decomposition, or use explain_logits / "
            "bcos_plugins.adapters.sae_lens.sae_error_share for token contributions with the error terms' share")
    return reference.sae_error_shares


def _nonzero_bias_names(model: nn.Module, limit: int = 4) -> list[str]:
    names = [name for name, p in model.named_parameters()
             if (name.rsplit(".", 1)[-1] in ("b", "bias") or name.rsplit(".", 1)[-1].startswith("b_"))
             and p.detach().abs().max() > 0]
    return names[:limit] + (["..."] if len(names) > limit else [])


def _refuse_untracked_terms(model: nn.Module, table: Tensor, explained: Tensor, hooked: list[str]) -> None:
    """Refuse a table that does not sum to the explained value: the model adds terms no input token carries (its
    biases, or the caller's ``hooked`` points patching an activation: named, where the refusal blamed "e.g. non-zero
    biases" of a bias-free B-cos model and sent users to B-cosify it)."""
    gap = explained - table.sum((1, 2))
    bound = _tolerance(table, explained)
    off = (gap.abs() > bound).nonzero().flatten()
    if not off.numel():
        _warn_unverified_completeness(table, explained, bound)
    if off.numel():
        row = int(off[0])
        biases = _nonzero_bias_names(model)
        if hooked and not biases:
            raise BcosValueError(
                f"model: the token x component table sums to {float(table[row].sum()):.4g} but the explained value is "
                f"{float(explained[row]):.4g} (row {row}): the forward hooks on {', '.join(hooked[:3])}"
                f"{' ...' if len(hooked) > 3 else ''} add terms that no input token carries (a patched activation or a "
                "mean-ablated one, or the residual stream scaled: the table splits the logit over the components' "
                "outputs, which no longer sum to the stream), so the table cannot be exact. Remove the hooks "
                "(model.reset_hooks()); zero-ablating a head's z or an MLP's post keeps the table exact")
        raise BcosValueError(
            f"model: the token x component table sums to {float(table[row].sum()):.4g} but the explained value is "
            f"{float(explained[row]):.4g} (row {row}): the model adds terms that no input token carries, "
            f"{'non-zero biases (' + ', '.join(biases) + ')' if biases else 'e.g. non-zero biases'}, so the table "
            "cannot be exact. Decompose a bias-free model: B-cosify it (bcos_plugins.bcosify) or use a bilinear one; "
            "explain_logits works on models with biases (its completeness_error shows their share)")


def _warn_unverified_completeness(table: Tensor, explained: Tensor, bound: Tensor) -> None:
    """Warn where the completeness check passed but verified too little to mean it: the allowance for rounding
    (:func:`_tolerance`, relative to the magnitudes summed) is more than half the explained value. That happens when
    the entries cancel in a low precision (in bfloat16 a row whose entries' absolute sum is 11x the value is allowed an
    error of the value itself), and a term no token carries, as large as half the value, would then pass without a
    word: the table is likely exact (the model is), but the check cannot say so."""
    weak = bound > 0.5 * explained.abs()
    if not bool(weak.any()):
        return
    row = int((bound / explained.abs().clamp_min(torch.finfo(torch.float64).tiny) * weak).argmax())
    _, precision = completeness_tolerance(explained)
    rows = weak.nonzero().flatten().tolist()
    magnitude = float(table[row].abs().sum())
    warnings.warn(
        f"token_component_decomposition: the table of row(s) {rows} sums to the explained value only as far as "
        f"{precision} rounding can tell, which is not far: row {row}'s entries cancel (their absolute sum, "
        f"{magnitude:.3g}, is {magnitude / max(float(explained[row].abs()), 1e-300):.3g}x the value "
        f"{float(explained[row]):.3g}), so the check allows an error of {float(bound[row]):.3g}, and a term no token "
        f"carries (a bias) as large as half the value would pass unnoticed. Decompose in float32 (model.float()) to "
        "verify completeness to 3.5e-4 of that absolute sum.", UserWarning, stacklevel=4)


def plot_token_components(decomposition: TokenComponentDecomposition, row: int = 0, *, token_labels=None,
                          ax=None, max_abs: float | None = None):
    """Heatmap of one row's table: components down, tokens across, diverging colours centred at 0.

    Returns the matplotlib ``AxesImage``; ``token_labels`` (e.g. ``model.to_str_tokens(tokens[row])``)
    label the columns. Needs matplotlib.
    """
    import matplotlib.pyplot as plt

    if not 0 <= row < decomposition.table.shape[0]:
        raise BcosValueError(f"row: {row} is outside the batch of {decomposition.table.shape[0]}. Pick a row index")
    data = decomposition.table[row].T.float().cpu().numpy()  # (component, pos)
    if token_labels is not None and len(token_labels) != data.shape[1]:
        raise BcosValueError(f"token_labels: {len(token_labels)} labels for {data.shape[1]} tokens. Pass one per "
                             "token")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.4 * data.shape[1]), max(3, 0.25 * data.shape[0])))
    scale = max_abs if max_abs is not None else float(abs(data).max()) or 1.0
    image = ax.imshow(data, cmap="RdBu_r", vmin=-scale, vmax=scale, aspect="auto")
    ax.set_yticks(range(len(decomposition.labels)), decomposition.labels, fontsize=7)
    if token_labels is not None:
        ax.set_xticks(range(data.shape[1]), token_labels, rotation=90, fontsize=7)
    ax.set_xlabel("input token")
    ax.set_ylabel("component")
    ax.set_title(f"token x component shares (sum {float(decomposition.explained[row]):.3g})")
    ax.figure.colorbar(image, ax=ax)
    return image
