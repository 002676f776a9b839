"""``bcosify``: turn a stock transformers model into a B-cos model, in place.

What it does to every module (docs/design.md#what-bcosify-changes):

- ``nn.Linear`` / GPT-2 ``Conv1D`` -> :class:`BcosLinear` / :class:`BcosConv1D` from the pretrained weights,
  bias dropped; query/key projections get ``constant_outputs`` so the attention matrix is the constant in
  explanation mode (this works for every attention implementation: eager, sdpa, flash); with
  ``bcos_query_key=False`` they keep their stock weights and biases instead (outputs constant all the same);
- ``nn.LayerNorm`` -> :class:`BcosLayerNorm` (bias dropped); RMSNorm -> :class:`DetachableRMSNorm`;
- GELU (erf / tanh / quick / clipped at 10), SiLU, ReLU -> :class:`DetachableActivation`; identity activations
  stay; every other activation of transformers' ``ACT2FN`` is refused with its reason (``ACTIVATION_REFUSALS``),
  except in a gated MLP's gate branch, which takes the parameter-free ones as they are (``GATE_BRANCH_ACTIVATIONS``:
  tanh, sigmoid, mish, hardswish, laplace, leaky ReLU, relu2, relu6, sqrt-softplus, a clipped GELU);
- tanh / ReLU of prediction heads removed; gated MLPs route the gate branch as the dynamic weight;
- LM heads kept (tied to the embeddings, linear and bias-free already).

Anything else that holds parameters or computes something non-linear raises :class:`UnsupportedModuleError`
with the module path and class, before the model is touched.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from .._checks import require_bool
from ..errors import BcosTypeError, BcosValueError, argument_error
from ..nn import (
    BcosConv1D,
    BcosLayerNorm,
    BcosLinear,
    DetachableActivation,
    DetachableRMSNorm,
    check_b,
    has_dynamic_weights,
)
from .architectures import (
    SPECS,
    ArchitectureSpec,
    UnsupportedModuleError,
    check_stock_class,
    uncompiled,
    unsupported_message,
)
from .checkpoint_format import BCOS_CONFIG_KEY, FORMAT_VERSION, STOCK_QUERY_KEY_FORMAT_VERSION
from .query_key import ConstantQueryKeyProjection, StockQueryKeyConv1D
from .report import ConversionReport

__all__ = ["bcosify", "UnsupportedModuleError", "BCOS_CONFIG_KEY"]

logger = logging.getLogger("bcos_plugins")

# Activation classes by name (transformers' ACT2CLS classes and torch.nn ones) -> gate kind.
ACTIVATION_GATES = {
    "GELUActivation": "gelu",
    "GELU": "gelu",
    "NewGELUActivation": "gelu_tanh",
    # sqrt(2/pi) written as 0.7978845608 and the cubic factored: the tanh GELU to float32 rounding (2.4e-7 apart
    # on |x| < 16, as gelu_new and the detachable form are)
    "FastGELUActivation": "gelu_tanh",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "QuickGELUActivation": "quick_gelu",  # hidden_act "quick_gelu": x * sigmoid(1.702 x)
    # hidden_act "gelu_accurate": NewGELUActivation's formula term for term, so the tanh GELU as gelu_new is
    "AccurateGELUActivation": "gelu_tanh",
    # hidden_act "gelu_10": clip(gelu(x), -10, 10); other clips are refused by gelu_kind
    "ClippedGELUActivation": "gelu_10",
    "SiLUActivation": "silu",
    "SiLU": "silu",
    "ReLU": "relu",
}
IDENTITY_ACTIVATIONS = {"LinearActivation", "Identity"}
# Leaves that are linear (or constant) by themselves and need no change.
PASSTHROUGH_MODULES = (nn.Embedding, nn.Dropout, nn.Identity)


# Why each other activation of transformers' ACT2FN (5.x) has no gate kind: bcosify and the TransformerLens bridge
# refuse it saying so (they said only "not a supported activation"). act(0) != 0 means no form x * gate(x) at all.
_NO_GATE = "has the form x * gate(x) (gate = {}) but no gate kind in bcos_plugins.nn.activation yet"
_NOT_HOMOGENEOUS = "is {} at x = 0, so it is no x * gate(x) and has no dynamic-weight form (its offset would be " \
                   "attributed to no input)"
ACTIVATION_REFUSALS = {
    "Sigmoid": _NOT_HOMOGENEOUS.format("0.5"),
    "LaplaceActivation": _NOT_HOMOGENEOUS.format("0.5 * (1 + erf(-mu / (sigma * sqrt 2))), not 0"),
    "SqrtSoftplusActivation": _NOT_HOMOGENEOUS.format("sqrt(log 2)"),
    "Tanh": _NO_GATE.format("tanh(x) / x"),
    "MishActivation": _NO_GATE.format("tanh(softplus(x))"),
    "Mish": _NO_GATE.format("tanh(softplus(x))"),
    "Hardswish": _NO_GATE.format("relu6(x + 3) / 6"),
    "ReLU6": _NO_GATE.format("min(relu(x), 6) / x"),
    # piecewise linear through 0: x * act'(x) = act(x) already (the TransformerBridge leaves them as they are)
    "LeakyReLU": _NO_GATE.format("1 or the negative slope"),
    "PReLU": _NO_GATE.format("1 or a learned slope, a parameter"),
    "ReLUSquaredActivation": _NO_GATE.format("relu(x)"),
    "XIELUActivation": _NO_GATE.format("xIELU(x) / x, with learned parameters"),
}

PIECEWISE_LINEAR_ACTIVATIONS = {"LeakyReLU", "PReLU"}

# The activations of ACTIVATION_REFUSALS that a gated MLP may hold as its activated gate branch, kept as the stock
# module. There the whole branch act(gate(x)) is the dynamic weight (BcosGatedMLP, BcosFusedGatedMLP hold it constant
# while explaining), so the MLP's output down(act(gate(x)) * up(x)) is linear in x through up whatever act computes of
# gate(x): no x * gate(x) form is needed, and an offset at 0 (sigmoid's 0.5) is part of the constant scale, not a term
# attributed to no input. Each is parameter-free and elementwise. PReLU and xIELU hold learned parameters, which a host
# copy need not carry (TransformerLens' 'xielu' is the fixed-parameter form), so they stay refused there too.
GATE_BRANCH_ACTIVATIONS = frozenset({
    "Sigmoid", "Tanh", "MishActivation", "Mish", "LaplaceActivation", "SqrtSoftplusActivation", "Hardswish", "ReLU6",
    "LeakyReLU", "ReLUSquaredActivation", "ClippedGELUActivation"})
_GATE_BRANCH_WHY = ("the activated gate branch of a gated MLP, whose whole output act(gate(x)) is the dynamic weight "
                    "(a constant scale of up(x) while explaining), so the explanation is exact for this activation; "
                    "kept as it is")



def describe_gate_branch(module: nn.Module) -> str:
    """A gate-branch activation as its class and settings (``LeakyReLU(inplace=False, negative_slope=0.3)``): what
    ``config.bcos['gate_branch_activations']`` records, so a load can tell whether the config rebuilt the same one."""
    settings = {k: v for k, v in vars(module).items()
                if not k.startswith("_") and k != "training" and isinstance(v, bool | int | float | str)}
    return f"{type(module).__name__}({', '.join(f'{k}={v!r}' for k, v in sorted(settings.items()))})"


SUPPORTED_ACTIVATION_NAMES = (
    f"{', '.join(sorted(ACTIVATION_GATES))} (config names 'gelu', 'gelu_python', 'gelu_new', 'gelu_fast', "
    "'gelu_accurate', 'gelu_pytorch_tanh', 'gelu_python_tanh', 'gelu_10', 'quick_gelu', 'relu', 'silu', 'swish', "
    "'linear')")


def activation_refusal(module: nn.Module) -> str | None:
    """Why ``module`` (an activation) cannot be made detachable, or ``None`` if it can or is not an activation
    this table knows."""
    if type(module).__name__ == "ClippedGELUActivation" and (module.min, module.max) != (-10, 10):
        return (f"clips GELU to [{module.min}, {module.max}], and only transformers' gelu_10 clip [-10, 10] has a "
                "gate kind")
    return ACTIVATION_REFUSALS.get(type(module).__name__)


def gelu_kind(module: nn.Module) -> str:
    """The :class:`~bcos_plugins.nn.DetachableActivation` kind of a GELU / SiLU / ReLU module (``bcosify`` and
    ``dynamic_linear_copy`` read activations through this one table)."""
    if isinstance(module, nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    refusal = activation_refusal(module)
    if refusal is not None:  # bcosify and the bridge refuse these first, naming the module's path
        raise UnsupportedModuleError(f"model: its activation {type(module).__name__} {refusal}. Supported: "
                                     f"{SUPPORTED_ACTIVATION_NAMES}.")
    return ACTIVATION_GATES[type(module).__name__]


def norm_epsilon(module: nn.Module) -> float:
    """The epsilon a (B-cos, detachable or Gemma) norm adds to its variance: what ``config.bcos['norm_eps']`` records."""
    eps = getattr(module, "variance_epsilon", None)
    return float(module.eps if eps is None else eps)


def _is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") or isinstance(module, nn.RMSNorm)


# the layer classes whose forward bcosify rebuilds from their weights alone
_KNOWN_LAYER_CLASSES = (nn.Linear, Conv1D, nn.LayerNorm, nn.RMSNorm)
# transformers' RMSNorms of the form x * rsqrt(mean(x^2) + eps) * weight, wherever a family's modelling module takes
# them from (a transformers version may import another family's instead of defining its own); Gemma's is swapped
_WEIGHT_GAIN_RMS_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})


def refuse_unknown_subclass(model: nn.Module, name: str, module: nn.Module, what: str = "bcosify") -> None:
    """Refuse a layer (``nn.Linear``, ``Conv1D``, ``nn.LayerNorm``, an RMSNorm) of another class than the one
    :func:`bcosify` and ``dynamic_linear_copy`` rebuild from its weights: the new module is built from the weights
    alone, so what a subclass's forward adds (a scale, an offset, a parametrised or quantised weight) was dropped
    without a word. An RMSNorm may also be the model's own family's class (``LlamaRMSNorm`` in a Llama: the modelling
    module of the model's class) or one of transformers' of the form ``x * rsqrt(mean(x^2) + eps) * weight``; another
    family's may not be (Gemma's gain is ``1 + weight``)."""
    cls = type(module)
    if cls in _KNOWN_LAYER_CLASSES:
        return
    if _is_rms_norm(module) and cls.__mro__[1] is nn.Module and (
            cls.__module__ == type(model).__module__
            or (cls.__module__.startswith("transformers.models.") and cls.__qualname__ in _WEIGHT_GAIN_RMS_NORMS)):
        return
    base = next((c for c in cls.__mro__[1:] if c in _KNOWN_LAYER_CLASSES), None)
    kind = f"a subclass of {base.__module__}.{base.__qualname__}" if base is not None else \
        f"an RMSNorm of another module than {type(model).__name__}'s ({type(model).__module__})"
    raise UnsupportedModuleError(
        f"model: {what} cannot convert module '{name}' of class {cls.__module__}.{cls.__qualname__}, {kind}, whose "
        f"forward may compute more than the layer {what} rebuilds from its weights alone (a scale, an offset, a "
        "parametrised or quantised weight) and would drop. Put the model's own layer class there "
        "(torch.nn.utils.parametrize.remove_parametrizations for a parametrised weight), or open an issue.")


def refuse_foreign_swap_target(model: nn.Module, name: str, module: nn.Module, swapped: type[nn.Module]) -> None:
    """Refuse a module whose class ``bcosify`` would swap for the B-cos class ``swapped`` (a spec's ``module_swaps`` and
    ``class_swaps``) when it is not a class of the model's own modeling module (``LlamaMLP`` in a Llama,
    ``Gemma2RMSNorm`` in a Gemma 2, ``RobertaClassificationHead``), the class whose forward ``swapped`` restates: a
    subclass's own forward (an MLP that scales its output) was replaced without a word (logits 0.2 off), and another
    family's module computed another function (torch's ``nn.RMSNorm`` in a Gemma 2 got Gemma's ``1 + weight`` gain,
    2.8 off) or failed at the first forward after conversion (Llama's RMSNorm: no attribute 'eps'). A B-cos class
    that runs the module's own forward and changes only its output (``runs_own_forward``: Gemma 2's soft-capped LM
    head) takes any class."""
    cls = type(module)
    if getattr(swapped, "runs_own_forward", False) or cls.__module__ == type(model).__module__:
        return
    raise UnsupportedModuleError(
        f"model: bcosify cannot convert module '{name}' of class {cls.__module__}.{cls.__qualname__}: it swaps in a "
        f"B-cos forward ({swapped.__name__}) written for the {type(model).__name__} family's own class there (of "
        f"{type(model).__module__}), which would replace this class's own forward (a subclass's, or another family's "
        "module's) and compute another function without a word. Put the model's own module class there, or open an "
        "issue.")


_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)  # no forward, or one that only chains its children


def refuse_unread_container(model: nn.Module, name: str, module: nn.Module, spec: ArchitectureSpec,
                            what: str = "bcosify") -> None:
    """Refuse a module holding other modules whose forward ``what`` (bcosify, ``dynamic_linear_copy``) has not read (a
    class from outside the model's own modeling module, and no torch container), and a query/key or gated-MLP input
    projection that is not a linear layer. bcosify converted the modules inside such a wrapper (an adapter's low-rank
    layers, a module put in by hand) and kept its forward: at a query/key path its inner projection was not held
    constant (the report listed no constant output for it), and ``explain`` refused the model as "not exact", naming no
    module; ``dynamic_linear_copy``'s explanation took the attention pattern's gradient into the tokens' shares."""
    is_projection = any(name.endswith(s) for s in (*spec.query_key, *spec.gate_units))
    if is_projection and not isinstance(module, nn.Linear | Conv1D):
        raise UnsupportedModuleError(
            f"model: {what} cannot convert module '{name}' of class {type(module).__module__}."
            f"{type(module).__qualname__}: at this path {type(model).__name__} holds a linear projection whose outputs "
            f"(queries and keys, or a gated MLP's activated units) {what} holds constant in explanation mode, which it "
            "can do for a linear layer only. Merge the wrapper into one linear layer (peft: model.merge_and_unload()) "
            "or put the model's own nn.Linear there.")
    if next(module.children(), None) is None or isinstance(module, _CONTAINERS) \
            or type(module).__module__ == type(model).__module__:
        return
    raise UnsupportedModuleError(
        f"model: {what} cannot convert module '{name}' of class {type(module).__module__}.{type(module).__qualname__}: "
        f"it holds other modules, and its forward, which {what} has not read, would stay as it is around their "
        "conversions (an adapter wrapper such as peft's LoRA layers, a module put in by hand). Merge or remove the "
        "wrapper (peft: model.merge_and_unload()), or put the model's own module class there.")


def mixed_class(target: type[nn.Module], original: type[nn.Module]) -> type[nn.Module]:
    """``target`` if it already subclasses ``original``, else a subclass of both (mixin first)."""
    if issubclass(target, original):
        return target
    key = (target, original)
    if key not in _MIXED:
        _MIXED[key] = type(f"Bcos{original.__name__}", (target, original),
                           {"__module__": __name__, "__reduce_ex__": _reduce_mixed})
    return _MIXED[key]


def _reduce_mixed(module: nn.Module, protocol: int):
    """Pickle a module of a mixed class as its two classes: the mixed class is made at run time, so pickle's lookup
    of its name in this module failed (``torch.save(model)`` and ``pickle.dumps`` of a B-cos Llama, Qwen2, Gemma 2
    raised PicklingError); the reader rebuilds it with :func:`mixed_class`."""
    reduced = object.__reduce_ex__(module, protocol)
    return (_rebuild_mixed, type(module).__bases__, *reduced[2:])


def _rebuild_mixed(target: type[nn.Module], original: type[nn.Module]) -> nn.Module:
    cls = mixed_class(target, original)
    return cls.__new__(cls)


_MIXED: dict[tuple[type, type], type] = {}


_CONSTANT_PARTS = {"all": lambda n: slice(None), "first_two_thirds": lambda n: slice(0, 2 * n // 3),
                   "first_half": lambda n: slice(0, n // 2)}


def _say_tied(model: nn.Module, module: nn.Module, reason: str) -> str:
    """A registry reason with its ``{tied}`` filled in for this model: whether ``module``'s weight is the input
    embeddings' (the report said "tied" of every GPT-2 / BERT masked-LM / Gemma 2 head, untied ones too)."""
    if "{tied}" not in reason:
        return reason
    try:
        embedding = model.get_input_embeddings()
    except NotImplementedError:
        embedding = None
    tied = embedding is not None and getattr(module, "weight", None) is getattr(embedding, "weight", None)
    return reason.replace("{tied}", "tied to the input embeddings" if tied else "not tied to the input embeddings")


def _head_tied(model: nn.Module) -> bool | None:
    """Whether the model's output embedding (its LM head) holds the input embeddings' weight; ``None`` without a head."""
    try:
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    except NotImplementedError:
        return None
    if head is None or embedding is None:
        return None
    return getattr(head, "weight", None) is getattr(embedding, "weight", None)


def _constant_slice(part: str, out_features: int) -> slice:
    """The output units a spec's ``query_key`` / ``gate_units`` part names (``"first_two_thirds"``: 0 to 2n/3)."""
    return _CONSTANT_PARTS[part](out_features)


_STOCK_QK = ("query/key kept as the pretrained affine map (weights and bias; bcos_query_key=False): its output "
             "only shapes the attention pattern, a constant in explanation mode")


def _plan(model: nn.Module, spec: ArchitectureSpec, b: float,
          bcos_query_key: bool) -> tuple[list, ConversionReport]:
    """Decide every replacement (and fail on unsupported modules) before touching the model."""
    report = ConversionReport(architecture=type(model).__name__, b=b, bcos_query_key=bcos_query_key)
    for path, (factory, _) in spec.class_swaps.items():
        if path:  # the model's own class ("") is checked by identity before this
            refuse_foreign_swap_target(model, path, model.get_submodule(path), factory())
    plan: list[tuple[str, object]] = []
    keep = set(spec.keep)
    removed = set(spec.remove_activations)
    skip_below: list[str] = []
    gate_branches: set[str] = set()  # the paths of gated MLPs' activations (their output is the dynamic weight)
    # every path of a module held at two places (a projection shared by two layers, query and key tied): the default
    # walk names it once, so the second place kept the stock module, bias included, without a word in the report
    for name, module in model.named_modules(remove_duplicate=False):
        if name == "":
            continue
        if any(name == s or name.startswith(s + ".") for s in skip_below):
            continue
        if name in keep:
            report.kept[name] = _say_tied(model, module, spec.keep[name])
            skip_below.append(name)
            continue
        if name in removed:
            report.removed_activations.append(f"{name} ({type(module).__name__})")
            plan.append((name, nn.Identity()))
            continue
        swap = next(((factory, why) for suffix, (factory, why) in spec.module_swaps.items()
                     if name == suffix or name.endswith("." + suffix)), None)
        if swap is not None:  # the swapped-in forward is the whole conversion of the module itself
            swapped = swap[0]()
            refuse_foreign_swap_target(model, name, module, swapped)
            plan.append((name, ("swap", swapped, swap[1])))
            report.patched_modules[name] = _say_tied(model, module, swap[1])
            if getattr(swapped, "activated_branch", None):  # a gated MLP: its activation's output is held constant
                gate_branches.add(f"{name}.{swapped.activated_branch}")
            continue
        if isinstance(module, nn.Linear | Conv1D | nn.LayerNorm) or _is_rms_norm(module):
            refuse_unknown_subclass(model, name, module)
        refuse_unread_container(model, name, module, spec)
        if isinstance(module, nn.Linear | Conv1D):
            is_conv = isinstance(module, Conv1D)
            out_features = module.weight.shape[1] if is_conv else module.out_features
            qk = next((p for s, p in spec.query_key.items() if name.endswith(s)), None)
            gate = None if qk else next((p for s, p in spec.gate_units.items() if name.endswith(s)), None)
            const = _constant_slice(qk or gate, out_features) if qk or gate else None
            if qk:
                report.constant_outputs.append(name)
            if gate:
                report.constant_gate_outputs.append(name)
            if qk and not bcos_query_key:
                report.kept[name] = _STOCK_QK
                if qk == "all":
                    plan.append((name, ("swap", ConstantQueryKeyProjection, _STOCK_QK)))
                    continue
                if not is_conv:  # StockQueryKeyConv1D reads Conv1D's (in, out) layout
                    raise UnsupportedModuleError(
                        f"bcos_query_key: False is not supported for {type(model).__name__}, whose fused q|k|v "
                        f"projection '{name}' is an nn.Linear; convert it with bcos_query_key=True.")
                # fused q|k|v (GPT-2): stock query/key columns, B-cos value columns
                report.kept[name] = (f"{_STOCK_QK}; the value outputs {const.stop}: are B-cos units without "
                                     "bias (the bias keeps its stock shape; its value part is unused)")
                report.bcos_layers.append(name)
                plan.append((name, ("stock_qk_conv1d", const.stop)))
                continue
            if module.bias is not None:
                report.dropped_biases.append(f"{name}.bias")
            report.bcos_layers.append(name)
            plan.append((name, ("bcos_conv1d" if is_conv else "bcos_linear", const)))
        elif isinstance(module, nn.LayerNorm):
            if module.bias is not None:
                report.dropped_biases.append(f"{name}.bias")
            report.norms.append(name)
            plan.append((name, "layer_norm"))
        elif _is_rms_norm(module):
            if getattr(module, "weight", None) is None:
                # torch.nn.RMSNorm(elementwise_affine=False): the rebuild read its weight's shape and failed with
                # "'NoneType' object has no attribute 'shape'", naming neither the module nor a fix
                raise UnsupportedModuleError(
                    f"model: bcosify cannot convert module '{name}' ({type(module).__name__}): an RMSNorm without a "
                    "gain (weight None, elementwise_affine=False), which the detachable RMSNorm always has. Give it "
                    "a gain of ones (elementwise_affine=True), which computes the same, then convert.")
            report.norms.append(name)
            plan.append((name, "rms_norm"))
        elif name in gate_branches and type(module).__name__ in GATE_BRANCH_ACTIVATIONS \
                and activation_refusal(module) is not None:  # those with a gate kind stay detachable (below)
            report.gate_branch_activations[name] = f"{type(module).__name__}: {_GATE_BRANCH_WHY}"
        elif activation_refusal(module) is not None:
            where = (f"; as a gated MLP's gate branch bcosify takes any parameter-free activation "
                     f"({', '.join(sorted(GATE_BRANCH_ACTIVATIONS))}), not one with learned parameters (a host copy "
                     "need not carry them: TransformerLens' 'xielu' is the fixed-parameter form)"
                     if name in gate_branches else
                     "; a gated MLP's gate branch (Llama-shaped decoders, ModernBERT) may hold it"
                     if type(module).__name__ in GATE_BRANCH_ACTIVATIONS else "")
            raise UnsupportedModuleError(
                f"model: bcosify cannot convert module '{name}' ({type(module).__name__}): the activation "
                f"{activation_refusal(module)}{where}. Supported: {SUPPORTED_ACTIVATION_NAMES}; build the model with "
                "one of them, or open an issue.")
        elif isinstance(module, nn.GELU) or type(module).__name__ in ACTIVATION_GATES:
            kind = gelu_kind(module)
            report.activations[name] = kind
            plan.append((name, ("activation", kind)))
        elif type(module).__name__ in IDENTITY_ACTIVATIONS or isinstance(module, PASSTHROUGH_MODULES):
            continue
        elif isinstance(module, nn.ModuleList | nn.ModuleDict):
            # containers hold modules but compute nothing: an empty one (num_hidden_layers=0) has no children, and
            # was refused as an unknown leaf ("neither a linear layer, a norm, ...": no fix would have helped)
            continue
        elif next(module.children(), None) is None:  # a leaf we know nothing about
            if type(module).__name__.endswith("RotaryEmbedding"):
                continue  # rotary embeddings only act on query/key, which are constants when explaining
            raise UnsupportedModuleError(
                f"model: bcosify cannot convert module '{name}' of class {type(module).__module__}."
                f"{type(module).__qualname__}: it is neither a linear layer, a norm, nor a supported "
                f"activation ({', '.join(sorted(ACTIVATION_GATES))}). Replace it with a dynamic-weight "
                "equivalent or open an issue."
            )
    refuse_hooks_on_replaced(model, [name for name, action in plan
                                     if not (isinstance(action, tuple) and action[0] == "swap")])
    _refuse_shared_modules_planned_apart(model, plan)
    return plan, report


# the hooks a module holds that run with its forward or backward (torch.nn.Module's own dictionaries)
_HOOK_KINDS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
               "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}


def refuse_hooks_on_replaced(model: nn.Module, paths: list[str], what: str = "bcosify") -> None:
    """Refuse hooks on the modules at ``paths``, which ``what`` replaces by new ones: the new module does not hold
    them, so a hook that read or changed a projection's output (a probe, an intervention) stopped running without a
    word. (``bcosify``: the modules whose class is swapped stay the same objects and keep their hooks.)"""
    hooked = []
    offloaded = [name for name in paths if _offloaded_by_accelerate(model.get_submodule(name))]
    if offloaded:
        # the new module is built from the meta placeholders and holds no hook to load the weights: the converted
        # model (load_bcos_model(..., device_map={"": "disk"}) too) failed at its first forward with "Tensor on device
        # meta is not on the expected device cpu!"
        raise argument_error(
            "model", f"has {len(offloaded)} module(s) offloaded by accelerate (device_map with disk or CPU offload: "
            f"{', '.join(repr(n) for n in offloaded[:4])}{', ...' if len(offloaded) > 4 else ''}), whose weights stay on "
            f"the meta device until accelerate's hook loads them at each forward; {what} replaces them by new modules, "
            "which would hold neither the weights nor the hook", "Load the model onto devices with room for all of its "
            f"weights, without offloading (e.g. device_map={{'': 'cpu'}}, no offload_folder), then call {what}",
            kind=BcosValueError)
    for name in paths:
        module = model.get_submodule(name)
        kinds = [kind for attr, kind in _HOOK_KINDS.items() if getattr(module, attr, None)]
        if kinds:
            hooked.append(f"'{name}' ({type(module).__name__}: {', '.join(kinds)})")
    if hooked:
        raise argument_error(
            "model", f"holds hooks on {len(hooked)} module(s) that {what} replaces by new modules, which would not "
            f"hold them (the hooks would stop running without a word): {', '.join(hooked[:6])}"
            f"{', ...' if len(hooked) > 6 else ''}",
            f"Remove them (handle.remove()), call {what}, then register them again on the new model's modules "
            f"(model.get_submodule(path) after {what})", kind=BcosValueError)


def _offloaded_by_accelerate(module: nn.Module) -> bool:
    """Whether accelerate's hook (``_hf_hook``, put on by ``device_map`` dispatching) holds ``module``'s weights
    elsewhere: offloaded to disk or CPU, its parameters are placeholders on the meta device."""
    return getattr(module, "_hf_hook", None) is not None and any(
        p.is_meta for p in module.parameters(recurse=False))


def _refuse_shared_modules_planned_apart(model: nn.Module, plan: list) -> None:
    """Refuse one module object held at two paths whose conversions differ (query/key at one, a plain projection at
    the other): one replacement cannot be both, and two would untie it."""
    first: dict[int, tuple[str, object]] = {}
    for name, action in plan:
        module = model.get_submodule(name)
        seen = first.setdefault(id(module), (name, action))
        if seen[0] != name and _action_key(seen[1]) != _action_key(action):
            raise UnsupportedModuleError(
                f"model: the module at '{seen[0]}' is also held at '{name}' ({type(module).__name__}), where bcosify "
                "would convert it another way (e.g. a query/key projection at one place and not at the other). Give "
                "each place a module of its own (copy.deepcopy) before converting.")


def _action_key(action) -> object:
    """A plan entry's action, comparable between two paths (a module action by its class)."""
    if isinstance(action, nn.Module):
        return type(action)
    if isinstance(action, tuple) and action[0] == "swap":
        return ("swap", action[1], action[2])
    return action


def _build(module: nn.Module, action, b: float) -> nn.Module:
    if isinstance(action, nn.Module):
        return action
    # each layer holds the very parameter it is built from (_keep_source_parameters): built holding it, not from a
    # copy put aside at once (docs/benchmarks.md, 2026-11-29 05:30 UTC)
    # a weight that is a plain tensor (no parameter) is copied: the from_* constructors refuse to hold one
    hold = isinstance(getattr(module, "weight", None), nn.Parameter)
    if action == "layer_norm":
        return BcosLayerNorm.from_layer_norm(module, hold=hold)
    if action == "rms_norm":
        return DetachableRMSNorm.from_rms_norm(module, hold=hold)
    tag = action[0]
    if tag == "bcos_linear":
        return BcosLinear.from_linear(module, b=b, constant_outputs=action[1], hold=hold)
    if tag == "bcos_conv1d":
        return BcosConv1D.from_conv1d(module, b=b, constant_outputs=action[1], hold=hold)
    if tag == "stock_qk_conv1d":
        return StockQueryKeyConv1D(module, b=b, query_key_features=action[1])
    if tag == "activation":
        return DetachableActivation(action[1])
    raise AssertionError(action)


def _keep_source_parameters(module: nn.Module, replacement: nn.Module) -> None:
    """Put into ``replacement`` the very parameters of ``module`` it is built from (same name, shape, dtype and device),
    whose values it copied: a parameter held by two modules (a projection's weight tied by hand to another layer's,
    ``layer1.dense.weight = layer0.dense.weight``) became two copies, trained apart afterwards without a word, and
    one shared with a module bcosify keeps (an embedding) as well. It keeps each parameter's ``requires_grad`` too (a
    new parameter requires a gradient: a model whose encoder was frozen before converting trained its every B-cos
    layer and norm afterwards); a parameter of another form keeps at least that."""
    for param_name, param in list(replacement.named_parameters(recurse=False)):
        source = module._parameters.get(param_name)
        if source is None:
            continue
        if (source.shape, source.dtype, source.device) == (param.shape, param.dtype, param.device):
            replacement._parameters[param_name] = source
        else:
            param.requires_grad_(source.requires_grad)


def plan_conversion(model: nn.Module, b: float = 1.5, *,
                    bcos_query_key: bool = True) -> tuple[list, ConversionReport]:
    """Every check :func:`bcosify` makes and its plan, without touching the model.

    Returns the planned replacements and the report of what :func:`bcosify` would change, or raises the error
    it would raise. :func:`bcosify` runs it first; a caller that converts only after other work (a recipe that
    trains before it converts) runs it up front, so that an unconvertible model fails before that work.
    """
    if isinstance(b, nn.Module) and not isinstance(model, nn.Module):
        # bcosify(1.5, model): check_b's refusal printed the whole module tree as the value of b
        raise argument_error("b", f"is a model ({type(b).__name__}) and model is {type(model).__name__} {model!r}: "
                             "the arguments are swapped", "Pass the model first: bcosify(model, b=1.5)",
                             kind=BcosTypeError)
    b = check_b(b)
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"must be a transformers model (torch.nn.Module), got "
                             f"{type(model).__name__}", "pass e.g. AutoModelForSequenceClassification"
                             ".from_pretrained(...)", kind=BcosTypeError)
    require_bool("bcos_query_key", bcos_query_key,
                 fix="Pass True (B-cos query/key layers) or False (keep the pretrained query/key maps)")
    config = getattr(model, "config", None)
    made_in_inference = next((n for n, p in model.named_parameters() if p.is_inference()), None)
    if made_in_inference is not None:
        # autograd cannot record an inference tensor: the converted model's explanations failed inside torch where a
        # kept module (an LM head, an embedding) was used ("Inference tensors cannot be saved for backward")
        raise argument_error(
            "model", f"holds parameters made under torch.inference_mode() (inference tensors, e.g. "
            f"'{made_in_inference}'), which autograd cannot record, so its B-cos model could not be explained or "
            "trained", "Build or load the model outside torch.inference_mode() (torch.no_grad() is fine), then "
            "call bcosify (which may itself run under inference_mode)")
    if has_dynamic_weights(model):
        raise argument_error(
            "model", f"{type(model).__name__} is already B-cosified (config.bcos={getattr(config, 'bcos', None)})",
            "convert a stock model, or reload a saved one with load_bcos_model(path)", kind=BcosValueError)
    # The model's own class decides (a stale config.bcos, e.g. a B-cos checkpoint loaded with plain
    # from_pretrained, must not), and by identity: a subclass or a namesake may compute another forward.
    # (read through a torch.compile wrapper only for the name: check_stock_class refuses the wrapper saying why)
    name = type(uncompiled(model)).__name__
    if name not in SPECS:
        raise UnsupportedModuleError(unsupported_message(model, name))
    check_stock_class(model, name, exact=True)
    record = getattr(config, BCOS_CONFIG_KEY, None)
    if isinstance(record, dict):
        # a B-cos checkpoint loaded with plain transformers (stock modules, its record kept): converted again at the b
        # given (1.5 by default), it silently became another model than the one saved (each layer's stored B, the
        # query/key choice; a tiny BERT's logits 0.11 off), where predict, the metrics and explain refuse it
        raise argument_error(
            "model", f"is a stock {name} whose config holds B-cos settings (config.bcos = {record}): a B-cos checkpoint "
            "loaded with plain transformers, which converting again would not rebuild as it was saved (the B each "
            "layer stored, the query/key choice)", "Load it with bcos_plugins.load_bcos_model(path); to convert it as "
            "a new stock model, delete the record first (del model.config.bcos)", kind=BcosTypeError)
    spec = SPECS[name]
    if getattr(config, "add_cross_attention", False):
        # Cross-attention keys/values come from another model's states (encoder_hidden_states), which
        # explain() does not attribute to: measured 63-127 % incomplete on BertModel(is_decoder=True,
        # add_cross_attention=True). GPT-2's fused cross-attention c_attn also holds k|v (no query), so the
        # q/k slice would be wrong.
        raise UnsupportedModuleError(
            f"model: {type(model).__name__} has cross-attention (config.add_cross_attention=True), whose "
            "keys and values come from another model's states that explanations cannot attribute to. Build "
            "the model with add_cross_attention=False (encoder-only or decoder-only)."
        )
    if _head_tied(model) is False and getattr(config, "tie_word_embeddings", False):
        # transformers' tie_weights (bcosify re-ties after converting) and every reload of a save would replace the
        # head's own weights (a separately trained head) by the embeddings: another model, without a word
        raise argument_error(
            "model", "its LM head holds weights of its own, but config.tie_word_embeddings is True, so tying "
            "(bcosify's, and transformers' on every reload of a save) would replace them by the input embeddings",
            "Set model.config.tie_word_embeddings = False to keep the head's weights, or tie it back with "
            "model.tie_weights(), then convert")
    num_labels = getattr(config, "num_labels", None)
    if spec.is_classifier and not (isinstance(num_labels, int) and num_labels >= 1):
        raise argument_error("model", f"config.num_labels is {num_labels!r}, so the classifier has no output",
                             "build the classifier with num_labels >= 1 (e.g. num_labels=2)")
    return _plan(model, spec, b, bcos_query_key)


# under a caller's torch.inference_mode() the new layers' parameters and B buffers would be inference tensors (which
# keep no version counter: the B-cos layer's init failed with torch's "Inference tensors do not track version
# counter", and autograd could not have recorded them): the conversion makes ordinary tensors whatever the caller's mode
@torch.inference_mode(False)
def bcosify(model: nn.Module, b: float = 1.5, *, bcos_query_key: bool = True, verbose: bool = True) -> nn.Module:
    """Convert a stock transformers model into a B-cos model, in place, and return it.

    Args:
        model: one of :func:`~bcos_plugins.convert.supported_architectures` (transformers 5).
        b: alignment pressure B >= 1 (1.25-1.5 recommended for classifiers, 1.1 for decoders).
        bcos_query_key: whether the query/key projections become B-cos layers (bias-free, unit-norm rows).
            ``False`` keeps them as the pretrained affine maps, weights and biases included: their outputs
            only shape the attention pattern, which explanation mode holds constant, so explanations stay
            complete, and the pretrained attention logits are not shrunk by the unit-norm rows
            (docs/recipes.md: the conversion's largest single accuracy cost when fine-tuning briefly).
            The report lists them under ``kept``; ``config.bcos["query_key"]`` records ``"stock"``.
        verbose: log the conversion summary at INFO level (the full report is always at
            ``model.bcos_report``).

    The settings are recorded in ``model.config.bcos`` so that ``save_pretrained`` keeps them and
    :func:`~bcos_plugins.load_bcos_model` rebuilds the same model (the record also lists each activation's gate kind and
    each norm's epsilon by path, so that a load refuses a config that rebuilds another one, e.g. one set by hand). The
    model gets its own copy of its config
    (``model.config`` is a new object), so a config shared with another model is left unchanged. Every module it
    puts in takes the training flag of the module it replaces, so a model in eval mode stays wholly in eval mode, and
    each of its parameters is the parameter it is built from (a frozen encoder stays frozen, a weight two modules
    share stays one parameter). A module held at two paths is converted once and stays shared. The converted model's
    ``state_dict`` (so ``save_pretrained``) refuses, naming them, modules changed afterwards that the record would
    rebuild otherwise (an activation swapped in, a norm's epsilon set; :func:`refuse_stale_record`).

    Every B-cos layer stores its B in the state dict (buffer ``bcos_b``), so checkpoints hold the B each
    layer runs with (also during :class:`~bcos_plugins.train.BWarmupCallback`).

    Raises:
        BcosValueError / BcosTypeError: ``b`` not a finite number in [1, 10] (see
            :func:`~bcos_plugins.nn.check_b`), or the model is already B-cosified.
        UnsupportedModuleError: unsupported model class (checked by identity with the transformers class,
            not by name), cross-attention, or an unsupported module (path and class named; also a subclass of a
            layer class it rebuilds from the weights alone, whose own forward would be dropped, and a module held at
            two paths that would convert differently).
        BcosValueError: hooks on a module it replaces (named): the new module would not run them; parameters made
            under ``torch.inference_mode()``.
        BcosTypeError: a B-cos checkpoint loaded with plain transformers (``config.bcos`` on stock modules): load it
            with :func:`~bcos_plugins.load_bcos_model`, which rebuilds it as saved.
    """
    require_bool("verbose", verbose, fix="Pass verbose=True (the default) to log the conversion summary, or False")
    plan, report = plan_conversion(model, b, bcos_query_key=bcos_query_key)
    b, config, spec = report.b, getattr(model, "config", None), SPECS[type(model).__name__]

    # a module held at several paths is converted once and the one replacement put at each (it stays shared); the
    # original is kept alive with its replacement, so that its id is not reused while the loop runs
    converted: dict[int, tuple[nn.Module, nn.Module]] = {}
    for name, action in plan:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        module = parent._modules[attr]
        if id(module) in converted:
            setattr(parent, attr, converted[id(module)][1])
            continue
        if isinstance(action, tuple) and action[0] == "swap":
            module.__class__ = mixed_class(action[1], type(module))
            converted[id(module)] = (module, module)
            continue
        replacement = _build(module, action, b)
        if replacement is not module:
            # a new module starts in training mode: converting a model in eval mode left every B-cos layer, norm
            # and activation training (model.training False, its layers True), so the replacement takes the
            # training flag of the module it replaces
            replacement.train(module.training)
            _keep_source_parameters(module, replacement)
        converted[id(module)] = (module, replacement)
        setattr(parent, attr, replacement)

    for path, (factory, why) in spec.class_swaps.items():
        target = model.get_submodule(path) if path else model
        target.__class__ = mixed_class(factory(), type(target))
        report.patched_modules[path or "<model>"] = why
    # Re-tie weights the conversion must not have broken (LM heads share the embedding matrix); a head untied by hand
    # under a config that says tied is refused by plan_conversion (tie_weights overwrote it with the embeddings).
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    # The model gets its own copy of its config: a config object shared with another model (two models built
    # from one config) would otherwise mark that stock model as B-cos too.
    own = copy.deepcopy(config)
    for module in model.modules():
        if getattr(module, "config", None) is config:
            module.config = own
    # swapped-in classes that read a setting of the model's config (Gemma 2's soft-capped LM head): the model's own
    # copy, which save_pretrained writes
    for module in model.modules():
        if hasattr(module, "bcos_configure"):
            module.bcos_configure(own)
    own.bcos = {"b": b, "architecture": report.architecture, "format_version": FORMAT_VERSION}
    if report.gate_branch_activations:
        # save_pretrained writes only the config's activation name: one set by hand (a tanh in a silu Llama, a leaky
        # ReLU's slope, a clipped GELU's bounds) was rebuilt from the config on load, another model, silently (logits
        # off); the load compares the rebuilt gate branches with this record (persistence.reconvert_stock_load)
        own.bcos["gate_branch_activations"] = {
            path: describe_gate_branch(model.get_submodule(path)) for path in report.gate_branch_activations}
    if report.activations:
        # the same for activations with a gate kind: one set by hand (a ReLU in a SiLU Llama, a tanh-form GELU in a
        # BERT, a ReLU as ModernBERT's head activation) was rebuilt as the config's on load, another model, silently
        # (logits 0.002-0.33 off); the load compares the rebuilt kinds with this record, as for the gate branches
        own.bcos["activations"] = dict(report.activations)
    norm_eps = {name: norm_epsilon(module) for name, module in model.named_modules(remove_duplicate=False)
                if isinstance(module, BcosLayerNorm) or _is_rms_norm(module)}
    if norm_eps:
        # and for each norm's epsilon: one set by hand (module.eps = 0.5 in a BERT whose config says 1e-12) was
        # rebuilt from the config's layer_norm_eps / rms_norm_eps on load, logits 0.02 off, silently
        own.bcos["norm_eps"] = norm_eps
    if not bcos_query_key:
        # format 3: a reader that did not know stock query/key layers would rebuild B-cos ones from these
        # weights (a different model); it refuses format 3 instead
        own.bcos.update(format_version=STOCK_QUERY_KEY_FORMAT_VERSION, query_key="stock")
    model.bcos_report = report
    # save_pretrained writes the record and the config, not the modules: one changed after this (an activation swapped,
    # an epsilon set) reloaded as the recorded one, another model, silently; checked where it would be saved
    model.register_state_dict_pre_hook(_refuse_stale_record_on_save)
    if verbose:
        logger.info(report.summary())
    return model


# config.bcos's entries that describe a module each, by path (bcosify writes them; the load compares the rebuilt model's)
_PER_MODULE_RECORDS = ("activations", "gate_branch_activations", "norm_eps")
_UNREAD = object()  # a module the record's reading cannot judge (a wrapper put in by a host library)


def recorded_description(key: str, module: nn.Module):
    """What ``config.bcos[key]`` (one of ``"activations"``, ``"gate_branch_activations"``, ``"norm_eps"``) says of
    ``module`` read as :func:`bcosify` reads it: a detachable activation's gate kind, another activation's class and
    settings (:func:`describe_gate_branch`), a norm's epsilon; ``None`` for an identity activation (no entry)."""
    if key == "norm_eps":
        return norm_epsilon(module) if hasattr(module, "variance_epsilon") or hasattr(module, "eps") else _UNREAD
    if type(module).__name__ in IDENTITY_ACTIVATIONS:
        return None
    if next(module.children(), None) is not None:
        return _UNREAD
    if key == "activations" and isinstance(module, DetachableActivation):
        return module.kind
    return describe_gate_branch(module)


def record_module_edits(model: nn.Module, paths) -> None:
    """Rewrite the entries of ``model.config.bcos`` for the modules at ``paths`` as they are now (an entry of an
    identity activation is removed): for code of this package that changes a converted model's activations on
    purpose (``bcos_plugins.bilinear.set_swish_beta``), so that a save records them and a load rebuilds them or
    refuses. A model without a record is left alone."""
    record = getattr(getattr(model, "config", None), BCOS_CONFIG_KEY, None)
    if not isinstance(record, dict):
        return
    for path in paths:
        module = model.get_submodule(path)
        for key in _PER_MODULE_RECORDS:
            entries = record.get(key)
            if isinstance(entries, dict) and path in entries:
                now = recorded_description(key, module)
                if now is None:
                    del entries[path]
                elif now is not _UNREAD:
                    entries[path] = now


def refuse_stale_record(model: nn.Module) -> None:
    """Refuse a converted model whose modules differ from what ``config.bcos`` records of them (an activation or a
    norm epsilon changed after :func:`bcosify`): ``save_pretrained`` writes the record and the config, and
    :func:`~bcos_plugins.load_bcos_model` rebuilds each module from them, so such a save reloaded as another model
    without a word (an activation swapped in after converting: logits 0.014 off; an epsilon set: 0.004)."""
    record = getattr(getattr(model, "config", None), BCOS_CONFIG_KEY, None)
    if not isinstance(record, dict):
        return
    differing = []
    for key in _PER_MODULE_RECORDS:
        entries = record.get(key)
        if not isinstance(entries, dict):
            continue
        for path, saved in entries.items():
            try:
                module = model.get_submodule(path)
            except AttributeError:
                continue  # a module removed: the weights no longer fit, which the load names
            now = recorded_description(key, module)
            if now is not _UNREAD and now != saved:
                differing.append(f"'{path}' recorded as {saved}, now {now or 'the identity'}")
    if differing:
        raise argument_error(
            "model", f"holds {len(differing)} module(s) that differ from what config.bcos records of them at bcosify "
            f"({'; '.join(differing[:3])}{'; ...' if len(differing) > 3 else ''}): changed after converting (an "
            "activation swapped in, an epsilon set by hand), which a state dict does not hold and save_pretrained "
            "does not write, so load_bcos_model would rebuild the recorded ones: another model",
            "Put the recorded modules back before saving (torch.save(model, file) keeps a model as it is); for another "
            "activation or epsilon, build the stock model with it in its config (hidden_act, layer_norm_eps, ...) and "
            "convert that", kind=BcosValueError)


def _refuse_stale_record_on_save(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    refuse_stale_record(module)

