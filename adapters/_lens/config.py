"""``BcosTransformerConfig``: a ``HookedTransformerConfig`` plus the B-cos settings.

Fields added to TransformerLens' config:

- ``bcos_b``: alignment pressure B >= 1 of every B-cos projection (1.1 is the decoders' recommendation);
- ``bcos_max_out``: MaxOut group size; only 1 can be expressed with TransformerLens' weight shapes;
- ``bcos_projections``: which projections are B-cos, a subset of ``W_Q W_K W_V W_O W_in W_gate W_out``
  (default: all the model has). The others are plain, bias-free linear maps;
- ``bcos_output_logits_soft_cap``: the final-logit soft-cap ``c * tanh(z / c)`` (Gemma 2), applied by the B-cos
  unembedding as the dynamic scale ``z * g``, ``g = tanh(z / c) / (z / c)`` (``unembed.hook_soft_cap``), which
  explanation mode holds constant. TransformerLens' forward applies its own ``output_logits_soft_cap`` inline,
  where it cannot be held constant, so a positive ``output_logits_soft_cap`` (TransformerLens' Gemma 2 configs
  set it) moves here and reads -1 (disabled) afterwards: the logits are the same, capped once.

Options whose maths is not dynamic-weight (or that the B-cos attention does not implement) are refused at
construction with the option named, so a model that cannot be explained exactly is never built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformer_lens import HookedTransformerConfig
from transformer_lens.utilities.activation_functions import SOFTCAP_DISABLED, softcap_enabled

from bcos_plugins.errors import BcosValueError
from bcos_plugins.nn.linear import check_b

from . import activation as _activation  # noqa: F401  (registers "linear" before any config is built)

__all__ = ["ALL_PROJECTIONS", "BcosTransformerConfig", "GATE_KINDS", "check_explainable"]

ALL_PROJECTIONS = ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out")

# TransformerLens activation name -> DetachableActivation gate kind (None: identity, nothing to detach).
GATE_KINDS: dict[str, str | None] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "relu": "relu",
    "linear": None,
}

_OLMO = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")


def check_explainable(cfg: HookedTransformerConfig, *, logits: bool = True) -> None:
    """Refuse options under which ``W(x) x`` explanations of a TransformerLens model are not exact; ``logits=False``
    for an explanation of a value read inside the model (an SAE feature), which a final-logit soft-cap leaves exact."""
    if cfg.positional_embedding_type == "shortformer":
        # Shortformer adds the position embeddings to queries and keys only: in explanation mode they reach
        # the logit through the attention pattern alone (a constant), and TransformerLens' decompose_resid /
        # get_full_resid_decomposition still count hook_pos_embed as a residual-stream component.
        raise BcosValueError(
            "positional_embedding_type='shortformer' is not supported: its position embeddings enter only the "
            "queries and keys, so they are not part of the residual stream that explanations and TransformerLens' "
            "decompose_resid split up (the decomposition would count them twice). Use 'standard' (learned "
            "positions added to the residual stream) or 'rotary'."
        )
    if not cfg.attn_only and cfg.gated_mlp is False and cfg.act_fn not in GATE_KINDS:
        raise BcosValueError(
            f"act_fn={cfg.act_fn!r} has no dynamic-weight form x * gate(x) in bcos_plugins; supported: "
            f"{', '.join(sorted(GATE_KINDS))}."
        )
    if cfg.gated_mlp and cfg.act_fn is not None and cfg.act_fn.endswith("_ln"):
        raise BcosValueError(f"act_fn={cfg.act_fn!r} (an activation followed by a LayerNorm) is not supported.")
    if logits and softcap_enabled(cfg.output_logits_soft_cap):
        # a BcosTransformerConfig moves the cap to its unembedding (bcos_output_logits_soft_cap) in __post_init__
        raise BcosValueError(
            f"output_logits_soft_cap={cfg.output_logits_soft_cap} applies tanh to the logits inline in "
            "TransformerLens' forward, so the logits are not W(x) x of the input. Use a B-cos model (bcosify the "
            "transformers model, or a BcosTransformerConfig: its unembedding applies the cap as a dynamic scale), "
            "or set output_logits_soft_cap=-1 to explain the uncapped logits."
        )
    if cfg.clip_qkv is not None:
        raise BcosValueError(
            f"clip_qkv={cfg.clip_qkv} clamps the values, which is not dynamic-weight; set clip_qkv=None."
        )
    if cfg.num_experts:
        raise BcosValueError("mixture-of-experts MLPs (num_experts) are not supported; use a dense MLP.")


_BCOS_REFUSED = {
    # option: (is it set?, why B-cos attention cannot do it)
    "positional_embedding_type": (
        lambda c: c.positional_embedding_type in ("alibi", "relative_positional_bias"),
        "position biases in the attention scores are not implemented by the B-cos attention; use "
        "'standard' or 'rotary'",
    ),
    "use_attention_sinks": (lambda c: c.use_attention_sinks, "set use_attention_sinks=False"),
    "use_logn_attn": (lambda c: c.use_logn_attn, "set use_logn_attn=False"),
    "load_in_4bit": (lambda c: c.load_in_4bit, "B-cos weights are renormalised each forward; load in float"),
    "original_architecture": (
        lambda c: c.original_architecture in _OLMO, "OLMo's post-norm attention is not supported"),
}


@dataclass
class BcosTransformerConfig(HookedTransformerConfig):
    """TransformerLens config of a B-cos transformer (see the module docstring for the added fields)."""

    bcos_b: float = 1.5
    bcos_max_out: int = 1
    bcos_projections: tuple[str, ...] | None = None
    bcos_output_logits_soft_cap: float = SOFTCAP_DISABLED

    def __post_init__(self) -> None:
        super().__post_init__()
        self._move_soft_cap_to_unembedding()
        self.bcos_b = check_b(self.bcos_b)
        if self.bcos_max_out != 1:
            raise BcosValueError(
                f"bcos_max_out={self.bcos_max_out}: TransformerLens stores one weight vector per unit "
                "(W_in is (d_model, d_mlp)), so MaxOut groups cannot be expressed; use bcos_max_out=1 (as "
                "bcosify does for decoders) or the transformers model with BcosLinear(max_out=...)."
            )
        available = [p for p in ALL_PROJECTIONS if p != "W_gate" or self.gated_mlp]
        if self.attn_only:
            available = [p for p in available if p in ("W_Q", "W_K", "W_V", "W_O")]
        if self.bcos_projections is None:
            self.bcos_projections = tuple(available)
        else:
            self.bcos_projections = tuple(self.bcos_projections)
            unknown = [p for p in self.bcos_projections if p not in available]
            if unknown:
                raise BcosValueError(
                    f"bcos_projections {unknown} are not projections of this model; choose from {available}."
                )
        for option, (is_set, fix) in _BCOS_REFUSED.items():
            if is_set(self):
                raise BcosValueError(
                    f"{option}={getattr(self, option)!r} cannot be expressed by a B-cos TransformerLens model: "
                    f"{fix}."
                )
        check_explainable(self)

    def _move_soft_cap_to_unembedding(self) -> None:
        inline, own = self.output_logits_soft_cap, self.bcos_output_logits_soft_cap
        if softcap_enabled(inline):
            if softcap_enabled(own) and own != inline:
                raise BcosValueError(
                    f"output_logits_soft_cap={inline} and bcos_output_logits_soft_cap={own} disagree; a B-cos model "
                    "applies one final-logit soft-cap (in its unembedding). Set only one of them")
            self.bcos_output_logits_soft_cap, self.output_logits_soft_cap = inline, SOFTCAP_DISABLED

    def is_bcos(self, projection: str) -> bool:
        """Whether ``projection`` (e.g. ``"W_O"``) is a B-cos projection."""
        return projection in self.bcos_projections  # type: ignore[operator]

    @property
    def bcos_settings(self) -> dict[str, Any]:
        return {"b": self.bcos_b, "max_out": self.bcos_max_out, "projections": list(self.bcos_projections)}
