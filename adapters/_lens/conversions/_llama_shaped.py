"""The converter of a Llama-shaped decoder family (rotary positions, RMSNorm, gated MLP, q/k/v/o projections),
from TransformerLens' weight conversion for it and what its TransformerLens config cannot express."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from bcos_plugins.errors import BcosValueError

from . import LensConversion

__all__ = ["check_no_dropped_biases", "check_rope", "llama_shaped_conversion"]


def _check_head_dim(hf_config, family: str) -> None:
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    if head_dim * heads != hf_config.hidden_size:
        raise BcosValueError(
            f"{family} head_dim={head_dim} with {heads} heads != hidden_size={hf_config.hidden_size}: "
            f"TransformerLens' {family} conversion assumes d_head = hidden_size // num_attention_heads."
        )


def check_rope(hf_config, family: str, rope_types: tuple[str, ...]) -> None:
    """Refuse a rotary type other than ``rope_types`` (those TransformerLens' config for ``family`` expresses)."""
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = (rope.get("rope_type") or rope.get("type") or "default").lower()
    if rope_type not in rope_types:
        raise BcosValueError(
            f"rope_type={rope_type!r} is not expressed by TransformerLens' {family} config "
            f"({' and '.join(rope_types)} are); convert a model with standard rotary embeddings, or use "
            "transformer_bridge_from_hf(hf_model), whose bridge runs the model's own rotary embedding."
        )


def _check_no_sliding_window(hf_config, family: str) -> None:
    if "sliding_attention" in (getattr(hf_config, "layer_types", None) or ()):
        raise BcosValueError(
            f"{family} with sliding-window layers (use_sliding_window=True): TransformerLens' {family} config has "
            "no window, so its attention would differ. Use transformer_bridge_from_hf(model), or a model without "
            "sliding windows.")


def check_no_dropped_biases(hf_config, bcos: dict | None, family: str, options: tuple[str, ...]) -> None:
    """Refuse a plain model with any of the bias ``options`` set, which TransformerLens' conversion drops."""
    # a B-cos model has no biases (bcosify removed them); a plain one with biases would lose them
    present = [option for option in options if getattr(hf_config, option, False)]
    if bcos is None and present:
        raise BcosValueError(
            f"{family} with {'/'.join(present)}=True: TransformerLens' {family} conversion drops biases, so the "
            "logits would differ. B-cosify the model (it removes biases) or use one without.")


def llama_shaped_conversion(family: str, convert_weights: Callable[[object, object], dict], *,
                            rope_types: tuple[str, ...] = ("default",), fixed_head_dim: bool = True,
                            refuse_sliding_windows: bool = False, dropped_biases: tuple[str, ...] = (),
                            view: Callable[[nn.Module], object] | None = None) -> LensConversion:
    """The :class:`~.LensConversion` of a Llama-shaped family.

    Args:
        family: its name in error messages ("Llama", "Mistral", ...).
        convert_weights: TransformerLens' ``convert_<family>_weights(hf_model, cfg)``.
        rope_types: the rotary types TransformerLens' config for the family expresses (others are refused).
        fixed_head_dim: whether TransformerLens' conversion assumes ``d_head = hidden_size // heads`` (a config
            whose ``head_dim`` differs is refused).
        refuse_sliding_windows: whether models with sliding-window layers are refused (TransformerLens' config for
            the family has no window).
        dropped_biases: config options (``attention_bias``, ``mlp_bias``) whose biases TransformerLens' conversion
            drops: plain models with them are refused.
        view: ``hf_model -> object`` the conversion reads instead of the model (e.g. zero biases where B-cos
            removed them); default the model itself.
    """

    def refuse_inexpressible(hf_config, bcos: dict | None) -> None:
        if fixed_head_dim:
            _check_head_dim(hf_config, family)
        check_rope(hf_config, family, rope_types)
        if refuse_sliding_windows:
            _check_no_sliding_window(hf_config, family)
        check_no_dropped_biases(hf_config, bcos, family, dropped_biases)

    def state_dict(hf_model: nn.Module, cfg) -> dict:
        return convert_weights(hf_model if view is None else view(hf_model), cfg)

    return LensConversion(state_dict=state_dict, refuse_inexpressible=refuse_inexpressible)
