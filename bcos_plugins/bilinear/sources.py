"""Reading the weights ``(W, V, P)`` of a bilinear layer from any of the places they live.

Where the weights come from:

- :class:`~bcos_plugins.bilinear.module.BilinearMLP` (this package): ``W``, ``V``, ``P`` as named.
- a TransformerLens ``GatedMLP`` with the identity activation (``act_fn="linear"``, see
  ``bcos_plugins.adapters.transformer_lens``). TransformerLens computes
  ``post = act_fn(x @ W_gate) * (x @ W_in) + b_in``, ``out = post @ W_out + b_out`` with ``hook_pre`` on
  the gate branch ``x @ W_gate`` and ``hook_pre_linear`` on ``x @ W_in``. Mapping:
  ``W = W_gate.T`` (the ``hook_pre`` branch), ``V = W_in.T`` (the ``hook_pre_linear`` branch),
  ``P = W_out.T``, ``b_h = b_in`` (added after the product), ``c = b_out``.
- a transformers gated MLP (Llama/Mistral/Qwen layout: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``)
  whose activation is the identity, e.g. after :class:`~bcos_plugins.bilinear.swish_beta.SwishBetaToBilinear`:
  ``W = gate_proj.weight``, ``V = up_proj.weight``, ``P = down_proj.weight``; where gate and up are one
  ``gate_up_proj`` (Phi-3, GLM: ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``), ``W`` and ``V`` are its two halves
  of rows.
- B-cos gated MLPs (TransformerLens ``HookedBcosGatedMLP``, a B-cosified transformers Llama MLP) are refused:
  their outputs carry an input-dependent scale, so they are not bilinear in their weights.
- plain tensors: a tuple ``(W, V, P)`` in the ``(d_hidden, d_in)``, ``(d_hidden, d_in)``,
  ``(d_out, d_hidden)`` layout above.

The input the weights describe is the layer's own input. In a TransformerLens model that is ``ln2``'s output,
which no hook records: ``blocks.L.ln2.hook_normalized`` is recorded before ``ln2`` multiplies by its weight (a
LayerNorm then adds its bias). ``bilinear_weights(mlp, input_norm=model.blocks[L].ln2)`` (:func:`fold_input_norm`)
is the layer as a function of that hook's activations, exactly.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..errors import BcosTypeError, argument_error
from ..nn.dynamic import DynamicWeightModule, evaluating
from ..nn.functional import at_least_float32
from .module import BilinearMLP
from .weights import BilinearWeights

__all__ = ["bilinear_weights"]


# the probe of _is_identity: a clamp outside [-3, 3] (nn.Hardtanh(-3, 3)) equalled the identity on linspace(-3, 3) and
# was read as bilinear (outputs off by 84 at inputs of 10), so the probe reaches far past any activation's scale
_IDENTITY_PROBE = torch.cat([torch.linspace(-3.0, 3.0, 13), torch.tensor([-1e30, -1e6, -100.0, 1e-20, 100.0, 1e6,
                                                                           1e30])])


def _is_identity(act_fn) -> bool:
    probe = _IDENTITY_PROBE.clone()
    try:
        return torch.equal(act_fn(probe), probe)
    except Exception:  # an activation that cannot even run on a probe is not the identity
        return False


_NOT_BILINEAR_BCOS = (
    "its {which} are B-cos projections: a B-cos projection uses unit-norm weight rows and multiplies each "
    "output by |cos(x, w)| ** (B - 1), a factor that depends on the input, so the layer is not the bilinear form P((W x) * (V x)) of any fixed "
    "weights and an analysis of its weights would describe a different function. Analyse a bilinear model "
    "(bcos_plugins.adapters.transformer_lens.bilinear_config, or a Llama with hidden_act='linear' that is not "
    "B-cosified); a B-cos model is explained exactly by bcos_plugins.explain instead"
)


def _refuse_bcos_tl(mlp: nn.Module) -> None:
    cfg = getattr(mlp, "cfg", None)
    projections = getattr(cfg, "bcos_projections", None) or ()
    used = [p for p in ("W_gate", "W_in", "W_out") if p in projections]
    if used:
        raise BcosTypeError("source: this TransformerLens gated MLP is not bilinear: "
                            + _NOT_BILINEAR_BCOS.format(which=", ".join(used)) + ".")


def _refuse_bcos_hf(mlp: nn.Module, projections: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")) -> None:
    used = [n for n in projections if isinstance(getattr(mlp, n), DynamicWeightModule)]
    if used:
        raise BcosTypeError(f"source: this gated MLP ({type(mlp).__name__}) is not bilinear: "
                            + _NOT_BILINEAR_BCOS.format(which=", ".join(used)) + ".")


def _from_transformer_lens(mlp: nn.Module) -> BilinearWeights:
    _refuse_bcos_tl(mlp)
    act_name = getattr(getattr(mlp, "cfg", None), "act_fn", None)
    if not _is_identity(mlp.act_fn):
        raise argument_error(
            "source", f"this TransformerLens GatedMLP has act_fn={act_name!r}, so it is not bilinear (its gate "
            "branch passes through a non-linearity, so the layer is no fixed quadratic form P((W x) * (V x)))",
            "Build the model with bcos_plugins.adapters.transformer_lens.bilinear_config(...) (act_fn='linear'), "
            "or fine-tune the gate away first (bcos_plugins.bilinear.SwishBetaToBilinear)")
    with torch.no_grad():
        return BilinearWeights(
            W=mlp.W_gate.detach().T, V=mlp.W_in.detach().T, P=mlp.W_out.detach().T,
            hidden_bias=mlp.b_in.detach(), out_bias=mlp.b_out.detach(),
        )


def _from_hf_gated(mlp: nn.Module) -> BilinearWeights:
    _refuse_bcos_hf(mlp)
    if not _is_identity(mlp.act_fn):
        raise argument_error(
            "source", f"this gated MLP ({type(mlp).__name__}) has activation {mlp.act_fn!r}, so it is not "
            "bilinear (its gate branch passes through a non-linearity)", "Convert it with "
            "bcos_plugins.bilinear.SwishBetaToBilinear (a transformers TrainerCallback) first, or build the model "
            "with hidden_act='linear'")
    return BilinearWeights.from_linears(mlp.gate_proj, mlp.up_proj, mlp.down_proj)


def _from_hf_fused_gated(mlp: nn.Module) -> BilinearWeights:
    """A gated MLP whose gate and up projections are one ``gate_up_proj`` (Phi-3, GLM: ``gate, up =
    gate_up_proj(x).chunk(2, dim=-1)``, then ``down_proj(up * activation_fn(gate))``): its first half of rows is the
    gate ``W``, the second half the up projection ``V``. Refused as "cannot read bilinear weights" before, though it is
    the transformers gated MLP with the identity activation that refusal asked for."""
    _refuse_bcos_hf(mlp, ("gate_up_proj", "down_proj"))
    act = getattr(mlp, "activation_fn", None) or getattr(mlp, "act_fn", None)
    if not _is_identity(act):
        raise argument_error(
            "source", f"this gated MLP ({type(mlp).__name__}) has activation {act!r}, so it is not bilinear (its gate "
            "branch passes through a non-linearity)", "Build the model with hidden_act='linear', or fine-tune the "
            "gate away first")
    fused, down = mlp.gate_up_proj, mlp.down_proj
    if fused.weight.shape[0] % 2:
        raise argument_error("source", f"its gate_up_proj has an odd number of rows ({fused.weight.shape[0]}), so "
                             "it holds no gate and up half each", "Pass the layer's weights as BilinearWeights(W, V, "
                             "P, ...)")
    weight = fused.weight.detach()
    bias = None if fused.bias is None else fused.bias.detach()
    half = weight.shape[0] // 2
    return BilinearWeights(W=weight[:half], V=weight[half:], P=down.weight.detach(),
                           w_bias=None if bias is None else bias[:half], v_bias=None if bias is None else bias[half:],
                           out_bias=None if down.bias is None else down.bias.detach())


def bilinear_weights(source, *, input_norm=None) -> BilinearWeights:
    """Read ``(W, V, P)`` (and biases) from ``source``; see the module docstring for what is accepted.

    Tensors are detached views of the parameters (no copy): analyses never build autograd graphs.

    Args:
        source: the layer (see the module docstring).
        input_norm: the TransformerLens norm in front of ``source`` (``model.blocks[L].ln2`` for
            ``model.blocks[L].mlp``), to analyse the layer on activations read at ``blocks.L.ln2.hook_normalized``:
            TransformerLens records that hook before the norm multiplies by its weight (a LayerNorm also adds its
            bias), so inputs taken there are not the layer's. The result is ``x -> source(x * w + b)``, exactly
            (:func:`fold_input_norm`); pass it as the ``source`` of any analysis. Without it, inputs must be the
            layer's own (e.g. ``cache["blocks.L.mlp.hook_in"]`` of sae-lens' ``HookedSAETransformer``).
    """
    if input_norm is not None:
        return fold_input_norm(bilinear_weights(source), input_norm, source)
    if isinstance(source, BilinearWeights):
        return source
    if isinstance(source, BilinearMLP):
        return _computing_the_module(source, source.weights())
    if _is_bridge_component(source):
        raise argument_error(
            "source", f"this is a TransformerBridge component ({type(source).__name__}), whose weights are the "
            "transformers module's it wraps (read here as a HookedTransformer MLP, its missing biases failed with an "
            "AttributeError)", "Pass the wrapped module, bridge.blocks[L].mlp.original_component; its exact input is "
            "recorded at blocks.L.mlp.hook_in (blocks.L.ln2.hook_normalized is before ln2's weight)",
            kind=BcosTypeError)
    if isinstance(source, nn.Module) and all(hasattr(source, n) for n in ("W_gate", "W_in", "W_out")):
        return _computing_the_module(source, _from_transformer_lens(source))
    if isinstance(source, nn.Module) and all(hasattr(source, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return _computing_the_module(source, _from_hf_gated(source))
    if isinstance(source, nn.Module) and all(isinstance(getattr(source, n, None), nn.Linear)
                                             for n in ("gate_up_proj", "down_proj")):
        return _computing_the_module(source, _from_hf_fused_gated(source))
    if isinstance(source, tuple | list) and len(source) == 3 and all(isinstance(t, Tensor) for t in source):
        W, V, P = (t.detach() for t in source)
        return BilinearWeights(W, V, P)
    if isinstance(source, nn.Module) and hasattr(source, "experts"):
        # the generic refusal below asked for "a transformers gated MLP with the identity activation", which a
        # hidden_act='linear' MoE block looks like to its user; its router makes it no single quadratic form
        raise argument_error(
            "source", f"{type(source).__name__} is a mixture-of-experts block: its router picks and weighs experts per "
            "token, so it is no single bilinear form P((W x) * (V x)), even with the identity activation",
            "Analyse one expert: its gated MLP if it has one (e.g. the block's shared_expert), or BilinearWeights(W, V, "
            "P) of expert e from fused weights (transformers' experts.gate_up_proj[e] holds W and V as its two halves "
            "of rows, experts.down_proj[e] is P)", kind=BcosTypeError)
    raise argument_error(
        "source", f"cannot read bilinear weights from {_described(source)}", "Pass a BilinearMLP, a TransformerLens "
        "GatedMLP (model.blocks[i].mlp of a bilinear HookedTransformer), a transformers gated MLP with the identity "
        "activation, a BilinearWeights, or a tuple of three tensors (W, V, P) shaped (d_hidden, d_in), "
        "(d_hidden, d_in), (d_out, d_hidden)", kind=BcosTypeError)


# the probe's share of the layer's size that the read weights may miss: far above float32 rounding (TF32 matmuls on
# a GPU included, about 1e-3 of it), far below what a wrapper, a hook or another forward changes (the whole output)
_PROBE_TOLERANCE = 1e-2


def _computing_the_module(module: nn.Module, weights: BilinearWeights) -> BilinearWeights:
    """``weights`` if they compute what ``module`` computes, checked on a fixed random probe; else a refusal.

    The weights are read from the projections' ``.weight`` / ``.bias``, which says nothing of what runs around them:
    an adapter wrapper that forwards ``.weight`` to its base layer (peft's LoRA layers: the low-rank update left
    out), a subclass or a wrapper with a forward of its own. Each analysis then described another function than the
    layer's, off by the whole update, without a word. The probe runs with the layer's forward hooks held back (its
    TransformerLens hook points' too): a hook that records activations must not record the probe, and the weights
    describe the layer without its hooks, as every analysis of them does."""
    if weights.W.device.type == "meta":  # no numbers to compare; every analysis of meta weights fails anyway
        return weights
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(1, 4, weights.d_in, generator=generator, dtype=torch.float64)
    probe = probe.to(dtype=weights.W.dtype, device=weights.W.device)
    try:
        with torch.no_grad(), evaluating(module), _forward_hooks_held_back(module):
            computed = module(probe)
    except Exception as error:
        raise argument_error(
            "source", f"its forward failed on a probe input of shape {tuple(probe.shape)} ({type(error).__name__}: "
            f"{error}), so the weights read from {type(module).__name__} could not be checked against what it "
            "computes", "Pass the layer's weights as BilinearWeights(W, V, P, ...) or a (W, V, P) tuple") from error
    # the layer's size at the probe, by Cauchy-Schwarz: |out_o| <= ||P_o|| ||g(x)|| + |c_o| (a float64 copy of the
    # weights, or their absolute values, cost 3 times the probe itself on a 768 x 3072 layer)
    wide = at_least_float32(weights.W.dtype)
    x = probe.to(wide)
    left, right = x @ weights.W.T.to(wide), x @ weights.V.T.to(wide)
    if weights.w_bias is not None:
        left = left + weights.w_bias.to(wide)
    if weights.v_bias is not None:
        right = right + weights.v_bias.to(wide)
    hidden = left * right
    if weights.hidden_bias is not None:
        hidden = hidden + weights.hidden_bias.to(wide)
    P = weights.P.to(wide)
    expected = (hidden @ P.T).double()
    size = hidden.norm(dim=-1, keepdim=True).double() * P.norm(dim=1).double()
    if weights.out_bias is not None:
        expected = expected + weights.out_bias.double()
        size = size + weights.out_bias.double().abs()
    if not isinstance(computed, Tensor) or computed.shape != expected.shape:
        raise argument_error(
            "source", f"its forward returned {getattr(computed, 'shape', type(computed).__name__)} on a probe "
            f"of shape {tuple(probe.shape)}, where a bilinear layer of these weights returns {tuple(expected.shape)}",
            "Pass the layer's weights as BilinearWeights(W, V, P, ...) or a (W, V, P) tuple")
    tolerance = max(_PROBE_TOLERANCE, math.sqrt(torch.finfo(weights.W.dtype).eps))
    gap = (computed.double() - expected).abs()
    finite = torch.isfinite(expected) & torch.isfinite(computed)
    off = torch.where(finite, gap > tolerance * size, torch.isfinite(expected) != torch.isfinite(computed))
    if bool(off.any()):
        worst = float(torch.where(finite, gap / size.clamp_min(torch.finfo(torch.float64).tiny), 0).max())
        raise argument_error(
            "source", f"the weights read from {type(module).__name__} (its projections' .weight and .bias) do not "
            f"compute its output: on a probe input they are off by up to {worst:.3g} of the layer's size, so an "
            "analysis of them would describe another function. Something runs around the projections: an adapter "
            "wrapper (peft's LoRA layers forward .weight to the base layer), a module spliced in (an SAE in one of "
            "its hook points), or a forward of its own",
            "Merge the adapter into the weights (peft: model.merge_and_unload()), take the spliced module out, or "
            "pass the weights the layer computes with as BilinearWeights(W, V, P, ...)")
    return weights


@contextmanager
def _forward_hooks_held_back(module: nn.Module) -> Iterator[None]:
    """``module`` and its submodules without their forward (pre-)hooks inside, restored afterwards."""
    held = [(m, m._forward_pre_hooks, m._forward_hooks) for m in module.modules()]
    try:
        for m, _, _ in held:
            m._forward_pre_hooks, m._forward_hooks = OrderedDict(), OrderedDict()
        yield
    finally:
        for m, pre_hooks, hooks in held:
            m._forward_pre_hooks, m._forward_hooks = pre_hooks, hooks


def _is_bridge_component(source) -> bool:
    """A TransformerBridge component (TransformerLens 3.x / 4.x ``model_bridge``), by its class's module: the core
    imports no host library."""
    return isinstance(source, nn.Module) and any(
        cls.__module__.startswith("transformer_lens.model_bridge") for cls in type(source).__mro__)


def _described(source) -> str:
    """What ``source`` is, in the words of the refusal: a sequence says what it holds, since a tuple of the wrong
    length or with a non-tensor entry is the usual near miss."""
    if isinstance(source, tuple | list):
        return f"a {type(source).__name__} of {len(source)} ({', '.join(type(t).__name__ for t in source)})"
    return type(source).__name__


def lens_mlp_prefix(layer) -> str | None:
    """``"blocks.L"`` of a TransformerLens MLP inside a set-up model (read from its ``hook_pre``'s name); ``None``
    if unknown (a layer outside a model, or not a TransformerLens MLP)."""
    name = getattr(getattr(layer, "hook_pre", None), "name", None)
    return name.split(".mlp.")[0] if isinstance(name, str) and ".mlp." in name else None


# TransformerLens' norms by class name (bcos_plugins' core imports no host library): LayerNorm and RMSNorm record
# hook_normalized before they multiply by their weight (a LayerNorm then adds its bias); their weightless forms
# (LayerNormPre, RMSNormPre) record their output there
_LENS_NORMS = {"LayerNorm": ("w", "b"), "RMSNorm": ("w",), "LayerNormPre": (), "RMSNormPre": ()}


def _lens_norm_parameters(norm) -> tuple[str, ...] | None:
    """The parameters a TransformerLens norm applies after ``hook_normalized``; ``None`` if ``norm`` is not one."""
    for cls in type(norm).__mro__:
        if cls.__module__.startswith("transformer_lens.") and cls.__name__ in _LENS_NORMS:
            return _LENS_NORMS[cls.__name__]
    return None


def fold_input_norm(weights: BilinearWeights, norm, layer=None) -> BilinearWeights:
    """The layer as a function of ``norm``'s ``hook_normalized`` ``x``: ``x -> layer(x * w + b)`` (``b``: a
    LayerNorm's bias), exactly: ``W (x * w + b) = (W diag(w)) x + W b``, and the same for ``V``.

    ``norm`` must be a TransformerLens LayerNorm / RMSNorm (or their weightless forms, which change nothing); when
    ``layer`` is a TransformerLens MLP inside a model, it must be that block's ``ln2``.
    """
    parameters = _lens_norm_parameters(norm)
    if parameters is None:
        raise argument_error("input_norm", f"expected the TransformerLens LayerNorm / RMSNorm in front of the layer, "
                             f"got {type(norm).__name__}", "Pass model.blocks[L].ln2 for model.blocks[L].mlp",
                             kind=BcosTypeError)
    prefix, norm_hook = lens_mlp_prefix(layer), getattr(getattr(norm, "hook_normalized", None), "name", None)
    if prefix is not None and norm_hook is not None and norm_hook != f"{prefix}.ln2.hook_normalized":
        raise argument_error("input_norm", f"it is {norm_hook.rsplit('.', 1)[0]}, not the norm in front of "
                             f"{prefix}.mlp", f"Pass {prefix.replace('blocks.', 'model.blocks[')}].ln2")
    if not parameters:  # weightless: hook_normalized is the layer's input
        return weights
    w = norm.w.detach()
    if tuple(w.shape) != (weights.d_in,):
        raise argument_error("input_norm", f"its weight has shape {tuple(w.shape)}, but the layer reads vectors of "
                             f"width {weights.d_in}", "Pass the norm in front of this layer (model.blocks[L].ln2 for "
                             "model.blocks[L].mlp)")
    w = w.to(dtype=weights.W.dtype, device=weights.W.device)
    w_bias, v_bias = weights.w_bias, weights.v_bias
    if "b" in parameters:
        b = norm.b.detach().to(dtype=weights.W.dtype, device=weights.W.device)
        w_bias = weights.W @ b if w_bias is None else w_bias + weights.W @ b
        v_bias = weights.V @ b if v_bias is None else v_bias + weights.V @ b
    return BilinearWeights(W=weights.W * w, V=weights.V * w, P=weights.P, w_bias=w_bias, v_bias=v_bias,
                           hidden_bias=weights.hidden_bias, out_bias=weights.out_bias)
