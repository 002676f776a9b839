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
  ``W = gate_proj.weight``, ``V = up_proj.weight``, ``P = down_proj.weight``.
- B-cos gated MLPs (TransformerLens ``HookedBcosGatedMLP``, a B-cosified transformers Llama MLP) are refused:
  their outputs carry an input-dependent scale, so they are not bilinear in their weights.
- plain tensors: a tuple ``(W, V, P)`` in the ``(d_hidden, d_in)``, ``(d_hidden, d_in)``,
  ``(d_out, d_hidden)`` layout above.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import BcosTypeError, argument_error
from ..nn.dynamic import DynamicWeightModule
from .module import BilinearMLP
from .weights import BilinearWeights

__all__ = ["bilinear_weights"]


def _is_identity(act_fn) -> bool:
    probe = torch.linspace(-3.0, 3.0, 13)
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


def _refuse_bcos_hf(mlp: nn.Module) -> None:
    used = [n for n in ("gate_proj", "up_proj", "down_proj") if isinstance(getattr(mlp, n), DynamicWeightModule)]
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


def bilinear_weights(source) -> BilinearWeights:
    """Read ``(W, V, P)`` (and biases) from ``source``; see the module docstring for what is accepted.

    Tensors are detached views of the parameters (no copy): analyses never build autograd graphs.
    """
    if isinstance(source, BilinearWeights):
        return source
    if isinstance(source, BilinearMLP):
        return source.weights()
    if isinstance(source, nn.Module) and all(hasattr(source, n) for n in ("W_gate", "W_in", "W_out")):
        return _from_transformer_lens(source)
    if isinstance(source, nn.Module) and all(hasattr(source, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return _from_hf_gated(source)
    if isinstance(source, tuple | list) and len(source) == 3 and all(isinstance(t, Tensor) for t in source):
        W, V, P = (t.detach() for t in source)
        return BilinearWeights(W, V, P)
    raise argument_error(
        "source", f"cannot read bilinear weights from {_described(source)}", "Pass a BilinearMLP, a TransformerLens "
        "GatedMLP (model.blocks[i].mlp of a bilinear HookedTransformer), a transformers gated MLP with the identity "
        "activation, a BilinearWeights, or a tuple of three tensors (W, V, P) shaped (d_hidden, d_in), "
        "(d_hidden, d_in), (d_out, d_hidden)", kind=BcosTypeError)


def _described(source) -> str:
    """What ``source`` is, in the words of the refusal: a sequence says what it holds, since a tuple of the wrong
    length or with a non-tensor entry is the usual near miss."""
    if isinstance(source, tuple | list):
        return f"a {type(source).__name__} of {len(source)} ({', '.join(type(t).__name__ for t in source)})"
    return type(source).__name__
