"""``dynamic_linear_copy``: a conventional model read as ``W(x) x + bias terms`` (the B-cos LM paper's Table 3
ablation "W(x)x from the conventional model").

A stock transformer is a dynamic linear map once its non-linearities are held constant: the attention
probabilities (through query/key outputs held constant, as ``ConstantQueryKeyProjection`` does for B-cos
models), each activation written ``act(x) = x * (act(x) / x)`` with the ratio as the dynamic weight
(``Phi(x)`` for GELU, ``tanh(x) / x`` for the pooler's tanh, whose limit at 0 is 1), and each LayerNorm's
``1 / std``. Unlike :func:`~bcos_plugins.bcosify` nothing is retrained or made bias-free: every weight and bias
stays, so the copy computes exactly the stock model's outputs. In explanation mode the copy is an affine map of
the combined embedding, ``y = W(x) x + c``, and input x gradient there gives ``W(x) x``; the biases' share
``c`` is not attributed to any token, so the explanation is **not complete**: ``explain(copy, ...).delta`` is
``-c`` per row and ``completeness_error`` is ``|c| / |y|``. This is the ablation that shows what B-cos
training buys over the dynamic-linear reading of a conventional model (for ``HookedTransformer``\\ s,
``adapters.transformer_lens.make_explainable`` gives the same reading).

Supported: BERT (``BertModel``, ``BertForSequenceClassification``, ``BertForMaskedLM``), ``RobertaModel`` and
``DistilBertModel``, whose every non-linearity is a module. ``BertForMaskedLM``'s head is dense, GELU, LayerNorm
(converted like the encoder's) and the decoder tied to the word embeddings, kept with its vocabulary bias (a share
``c`` like every bias); explain it at a ``position``. RoBERTa's and DistilBERT's classifiers apply ``tanh`` / ReLU
inline in their forward, where no module can hold it constant, so they are refused rather than explained wrongly.
"""

from __future__ import annotations

import copy

from jaxtyping import Float
from torch import Tensor, nn

from ..errors import BcosTypeError, BcosValueError, argument_error
from ..nn import BcosLayerNorm, DetachableActivation, has_dynamic_weights
from ..nn.activation import tanh_ratio
from ..nn.dynamic import DynamicWeightModule
from .architectures import SPECS, check_stock_class, spec_for, specs_where
from .bcosify import (
    ACTIVATION_GATES,
    IDENTITY_ACTIVATIONS,
    PASSTHROUGH_MODULES,
    gelu_kind,
    refuse_hooks_on_replaced,
    refuse_unknown_subclass,
    refuse_unread_container,
)
from .query_key import ConstantQueryKeyProjection

__all__ = ["AffineDetachableLayerNorm", "ConstantQueryKeyLinear", "DetachableTanh", "DYNAMIC_LINEAR_ARCHITECTURES",
           "dynamic_linear_copy"]

# Classes whose forward applies no non-linearity outside a module (checked by reading transformers 5's code): the
# registry's specs without a ``dynamic_linear_refusal``.
DYNAMIC_LINEAR_ARCHITECTURES = tuple(sorted(specs_where(lambda spec: spec.dynamic_linear_refusal is None)))

class AffineDetachableLayerNorm(BcosLayerNorm):
    """A stock LayerNorm, bias included, whose ``1 / std`` is the dynamic weight (``BcosLayerNorm`` + bias)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register_parameter("bias", None)

    @classmethod
    def from_layer_norm(cls, ln: nn.LayerNorm) -> AffineDetachableLayerNorm:
        """Copy ``gamma`` and ``beta`` from a stock ``nn.LayerNorm``."""
        new = super().from_layer_norm(ln)
        if ln.bias is not None:
            new.bias = nn.Parameter(ln.bias.detach().clone())
        return new

    def forward(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        y = super().forward(x)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, bias={self.bias is not None}"


class ConstantQueryKeyLinear(ConstantQueryKeyProjection, nn.Linear):
    """A stock query or key ``nn.Linear`` (weights and bias) whose output is constant in explanation mode, which
    holds the attention probabilities constant."""


class DetachableTanh(DynamicWeightModule):
    """``tanh(x) = x * (tanh(x) / x)`` with the ratio as the dynamic weight (1 at ``x = 0``, its limit)."""

    def forward(self, x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
        with self.dynamic_scope():
            gate = tanh_ratio(x)
        return x * self.dynamic_weight(gate)


def _replacement(model: nn.Module, name: str, module: nn.Module, query_key: tuple[str, ...]):
    """What the copy's ``module`` becomes: a module, a class to mix in, or ``None`` (kept as it is)."""
    if isinstance(module, nn.Linear | nn.LayerNorm):
        # a subclass may compute something else: not held constant safely (a LayerNorm's is rebuilt from its weights)
        refuse_unknown_subclass(model, name, module, what="dynamic_linear_copy")
    if isinstance(module, nn.Linear):
        if not any(name.endswith(suffix) for suffix in query_key):
            return None
        return ConstantQueryKeyLinear
    if isinstance(module, nn.LayerNorm):
        return AffineDetachableLayerNorm.from_layer_norm(module)
    if isinstance(module, nn.Tanh):
        return DetachableTanh()
    if isinstance(module, nn.GELU) or type(module).__name__ in ACTIVATION_GATES:
        return DetachableActivation(gelu_kind(module))
    if type(module).__name__ in IDENTITY_ACTIVATIONS or isinstance(module, PASSTHROUGH_MODULES):
        return None
    if next(module.children(), None) is None:
        raise argument_error(
            "model", f"module '{name}' ({type(module).__module__}.{type(module).__qualname__}) is not linear, a "
            "LayerNorm, tanh or a supported activation, so it cannot be held constant",
            "use a model of the classes in DYNAMIC_LINEAR_ARCHITECTURES as transformers builds them",
            kind=BcosTypeError)
    return None


def dynamic_linear_copy(model: nn.Module) -> nn.Module:
    """A copy of the conventional ``model`` whose non-linearities are dynamic weights, biases kept (module
    docstring). The user's model is not modified.

    The copy's forward values equal the stock model's (same weights and biases; GELU computed as
    ``x * Phi(x)``, LayerNorm as ``(x - mean) * rsqrt(var + eps) * gamma + beta``: float rounding apart).
    :func:`~bcos_plugins.explain` on it takes input x gradient in explanation mode at the combined embedding,
    where B-cos models are explained, and reports the biases' share as ``-delta`` (``completeness_error`` =
    ``|bias share| / |logit|``). The copy is returned in eval mode, on the model's device.

    Raises:
        BcosTypeError: ``model`` is not one of :data:`DYNAMIC_LINEAR_ARCHITECTURES` (transformers' class
            itself), or holds a module that is not linear, a LayerNorm, tanh or a supported activation.
        BcosValueError: ``model`` is a B-cos model (already dynamic-linear and bias-free: explain it directly).
    """
    if not isinstance(model, nn.Module):
        raise argument_error("model", f"expected a transformers model (torch.nn.Module), got {type(model).__name__}",
                             "pass e.g. BertForSequenceClassification.from_pretrained(...)", kind=BcosTypeError)
    config = getattr(model, "config", None)
    if has_dynamic_weights(model) or isinstance(getattr(config, "bcos", None), dict):
        raise argument_error("model", f"{type(model).__name__} is a B-cos model (it has dynamic-weight modules or "
                             "config.bcos), whose explanations are already W(x) x and complete",
                             "explain it with bcos_plugins.explain; dynamic_linear_copy is for conventional "
                             "models", kind=BcosValueError)
    name = type(model).__name__
    if name not in DYNAMIC_LINEAR_ARCHITECTURES:
        reason = SPECS[name].dynamic_linear_refusal if name in SPECS else "it is not in the architecture registry"
        raise argument_error(
            "model", f"{type(model).__module__}.{type(model).__qualname__} is not supported by dynamic_linear_copy: "
            f"{reason}", f"pass one of {', '.join(DYNAMIC_LINEAR_ARCHITECTURES)}", kind=BcosTypeError)
    check_stock_class(model, name, exact=True)
    spec = spec_for(model)
    query_key = tuple(suffix for suffix, part in spec.query_key.items() if part == "all")
    for path, module in model.named_modules():
        if path:  # a wrapper's forward (an adapter's, one put in by hand) is not read: refused before the copy is made
            refuse_unread_container(model, path, module, spec, what="dynamic_linear_copy")
    # plan on the user's model (nothing touched if a module is refused), apply on the copy; every path of a module held
    # at two (a LayerNorm shared by two layers): the default walk names it once, and the second place kept the stock
    # module, a non-linearity not held constant, in the copy's explanation without a word (as bcosify's plan does)
    planned: dict[int, object] = {}
    plan = []
    for path, module in model.named_modules(remove_duplicate=False):
        if path:
            if id(module) not in planned:
                planned[id(module)] = _replacement(model, path, module, query_key)
            plan.append((path, planned[id(module)]))
    # the copy's hooks are the model's (deepcopy): those on a module the copy gets anew would be lost, and the copy
    # would compute another function than the hooked model's
    refuse_hooks_on_replaced(model, [path for path, action in plan if isinstance(action, nn.Module)],
                             what="dynamic_linear_copy")
    clone = copy.deepcopy(model)
    for path, action in plan:
        if action is None:
            continue
        if isinstance(action, type):
            clone.get_submodule(path).__class__ = action  # same parameters and state-dict keys
            continue
        parent_path, _, attr = path.rpartition(".")
        parent = clone.get_submodule(parent_path) if parent_path else clone
        setattr(parent, attr, action)  # built from the user's module: its own parameters, on their device
    return clone.eval()
