"""``hooked_transformer_from_hf``: a transformers GPT-2 / Llama (B-cos, bilinear or plain) as a TL model.

Offline: the config goes through TransformerLens' own ``convert_hf_model_config`` (pointed at a local
copy of the model's config, never at the hub) and the weights through its ``convert_gpt2_weights`` /
``convert_llama_weights``. The weights are used as they are (no LayerNorm folding or centring: those
rewrite the model into an equivalent one only for plain models, never for B-cos ones), except the final
norm's weight, which is folded into ``W_U`` (exact for every model; TransformerLens' ``logit_attrs`` assumes
it), so ``ln_final`` is a weightless ``LayerNormPre`` / ``RMSNormPre``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.loading_from_pretrained import convert_hf_model_config, fill_missing_keys
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights
from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.nn.dynamic import DynamicWeightModule

from .config import BcosTransformerConfig
from .decomposition import fold_final_norm_weight
from .model import bcos_model_class, make_explainable

__all__ = ["hooked_transformer_from_hf", "SUPPORTED_HF_ARCHITECTURES"]

SUPPORTED_HF_ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM")
_BIAS_KEY = ("b", "b_Q", "b_K", "b_V", "b_O", "_b_K", "_b_V", "b_in", "b_out", "b_U")


def _architecture(hf_model: nn.Module) -> str:
    bcos = getattr(getattr(hf_model, "config", None), "bcos", None)
    name = bcos["architecture"] if isinstance(bcos, dict) else type(hf_model).__name__
    if name not in SUPPORTED_HF_ARCHITECTURES:
        raise BcosTypeError(
            f"hooked_transformer_from_hf supports {', '.join(SUPPORTED_HF_ARCHITECTURES)} (plain, B-cosified "
            f"or bilinear); got {type(hf_model).__name__}. Load causal-LM classes (with their LM head)."
        )
    return name


def _refuse_inexpressible(arch: str, hf_config, bcos: dict | None, hf_model: nn.Module) -> None:
    """Clear errors for transformers options the TransformerLens model would silently get wrong."""
    act = hf_config.activation_function if arch == "GPT2LMHeadModel" else hf_config.hidden_act
    if act not in SUPPORTED_ACTIVATIONS:
        raise BcosValueError(
            f"activation {act!r} of this {arch} has no TransformerLens counterpart; supported: "
            f"{', '.join(sorted(SUPPORTED_ACTIVATIONS))}."
        )
    if arch == "GPT2LMHeadModel":
        if getattr(hf_config, "add_cross_attention", False):
            raise BcosValueError("GPT-2 with add_cross_attention=True cannot be expressed as a HookedTransformer.")
    else:
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        if head_dim * heads != hf_config.hidden_size:
            raise BcosValueError(
                f"Llama head_dim={head_dim} with {heads} heads != hidden_size={hf_config.hidden_size}: "
                "TransformerLens' Llama conversion assumes d_head = hidden_size // num_attention_heads."
            )
        if bcos is None and (getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)):
            raise BcosValueError(
                "Llama with attention_bias/mlp_bias=True: TransformerLens' Llama conversion drops biases, "
                "so the logits would differ. B-cosify the model (it removes biases) or use one without."
            )
        rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
        rope_type = (rope.get("rope_type") or rope.get("type") or "default").lower()
        if rope_type not in ("default", "llama3"):
            raise BcosValueError(
                f"rope_type={rope_type!r} is not expressed by TransformerLens' Llama config (default and llama3 "
                "are); convert a model with standard rotary embeddings."
            )
    if bcos is not None and bcos.get("query_key") == "stock":
        raise BcosValueError(
            "model: it was converted with bcosify(..., bcos_query_key=False) (stock query/key projections with "
            "biases); the B-cos HookedTransformer builds B-cos query/key layers, so its logits would differ. Use "
            "transformer_bridge_from_hf(model) for it, or convert with bcos_query_key=True.")
    if bcos is not None:
        for name, module in hf_model.named_modules():
            if getattr(module, "max_out", 1) != 1:
                raise BcosValueError(
                    f"{name} uses MaxOut (max_out={module.max_out}); TransformerLens stores one weight vector "
                    "per unit, so MaxOut cannot be expressed (bcosify's decoders use max_out=1)."
                )
            if isinstance(module, DynamicWeightModule) and hasattr(module, "b") and module.b != bcos["b"]:
                raise BcosValueError(
                    f"{name} has b={module.b} but the model's config.bcos says b={bcos['b']}; the TransformerLens "
                    "config has one B for all projections."
                )


def _config_dict(arch: str, hf_config) -> dict:
    """TransformerLens' own config conversion, run on a local copy of the config (no hub access)."""
    local = type(hf_config).from_dict(hf_config.to_dict())
    local.architectures = [arch]
    if arch == "GPT2LMHeadModel":
        local.n_ctx = hf_config.n_positions  # TransformerLens reads n_ctx, which GPT2Config may lack
    with tempfile.TemporaryDirectory(prefix="bcos_tl_config_") as folder:
        # convert_hf_model_config picks some architectures by substrings of the name ("llama", "gemma"):
        # the folder name must carry none of them (a fixed prefix plus random letters could).
        if any(s in folder.lower() for s in ("llama", "gemma", "phi", "mistral", "qwen")):
            return _config_dict(arch, hf_config)
        local.save_pretrained(folder)
        cfg = convert_hf_model_config(str(Path(folder)))
    if arch == "GPT2LMHeadModel" and getattr(hf_config, "n_inner", None):
        cfg["d_mlp"] = hf_config.n_inner  # TransformerLens assumes 4 * n_embd
    cfg["tokenizer_name"] = None  # the folder is gone; a tokenizer is attached separately
    return cfg


def _with_zero_biases(module: nn.Module, out_features: int) -> SimpleNamespace:
    bias = getattr(module, "bias", None)
    if bias is None:
        bias = torch.zeros(out_features, dtype=module.weight.dtype, device=module.weight.device)
    return SimpleNamespace(weight=module.weight, bias=bias)


def _gpt2_view(gpt2: nn.Module) -> SimpleNamespace:
    """GPT-2 as TransformerLens' converter reads it, with zero biases where B-cos removed them."""
    t = gpt2.transformer

    def conv(m):
        return _with_zero_biases(m, m.weight.shape[1])

    def norm(m):
        return _with_zero_biases(m, m.weight.shape[0])

    blocks = [
        SimpleNamespace(
            ln_1=norm(h.ln_1), ln_2=norm(h.ln_2),
            attn=SimpleNamespace(c_attn=conv(h.attn.c_attn), c_proj=conv(h.attn.c_proj)),
            mlp=SimpleNamespace(c_fc=conv(h.mlp.c_fc), c_proj=conv(h.mlp.c_proj)),
        )
        for h in t.h
    ]
    return SimpleNamespace(
        transformer=SimpleNamespace(wte=t.wte, wpe=t.wpe, h=blocks, ln_f=norm(t.ln_f)), lm_head=gpt2.lm_head)


def _state_dict(arch: str, hf_model: nn.Module, cfg: HookedTransformerConfig, bcos: bool) -> dict:
    if arch == "GPT2LMHeadModel":
        state = convert_gpt2_weights(_gpt2_view(hf_model), cfg)
    else:
        state = convert_llama_weights(hf_model, cfg)
    if bcos:
        state = {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in _BIAS_KEY}
    return {k: v.detach().clone() for k, v in state.items()}


def _attach_tokenizer(model: HookedTransformer, tokenizer) -> None:
    # TransformerLens reloads the tokenizer by its name_or_path (to add a BOS token); an in-memory
    # tokenizer has none, so it is saved to a folder that exists while TransformerLens reloads it.
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="bcos_tl_tokenizer_") as folder:
        tokenizer.save_pretrained(folder)
        model.set_tokenizer(AutoTokenizer.from_pretrained(folder), default_padding_side=tokenizer.padding_side)


def hooked_transformer_from_hf(
    hf_model: nn.Module,
    *,
    tokenizer=None,
    model_class: type[HookedTransformer] = HookedTransformer,
) -> HookedTransformer:
    """The TransformerLens model computing the same logits as ``hf_model``.

    Args:
        hf_model: a transformers ``GPT2LMHeadModel`` or ``LlamaForCausalLM``: B-cosified
            (:func:`bcos_plugins.bcosify`), bilinear (Llama with ``hidden_act="linear"``) or plain.
        tokenizer: optional tokenizer to attach (``model.to_tokens`` etc.); in-memory ones work.
        model_class: ``HookedTransformer`` or a subclass such as sae-lens' ``HookedSAETransformer``.

    Returns:
        a ``model_class`` instance (its B-cos version for B-cos models, see ``bcos_model_class``) on the
        device and dtype of ``hf_model``, made explainable (:func:`make_explainable`), in the same
        train/eval mode.

    Raises:
        TypeError: other architectures. ValueError: options TransformerLens cannot express (named).
    """
    arch = _architecture(hf_model)
    hf_config = hf_model.config
    bcos = getattr(hf_config, "bcos", None)
    _refuse_inexpressible(arch, hf_config, bcos, hf_model)
    param = next(hf_model.parameters())
    cfg_dict = _config_dict(arch, hf_config)
    cfg_dict.update(device=str(param.device), dtype=param.dtype, init_weights=False)
    if bcos is not None:
        cfg = BcosTransformerConfig(**cfg_dict, bcos_b=bcos["b"])
        model = bcos_model_class(model_class)(cfg, move_to_device=True)
    else:
        cfg = HookedTransformerConfig(**cfg_dict)
        model = model_class(cfg, move_to_device=True)
    # TransformerLens' converters leave out buffers (masks, rotary tables) and some zero biases (GPT-2's
    # b_U); its fill_missing_keys takes those from the freshly built model and fails on missing weights.
    state = _state_dict(arch, hf_model, cfg, bcos is not None)
    model.load_state_dict(fill_missing_keys(model, state), strict=True)  # a B-cos model folds ln_final.w here
    fold_final_norm_weight(model)  # the others' final norm (a no-op on an already weightless one)
    make_explainable(model)
    if tokenizer is not None:
        _attach_tokenizer(model, tokenizer)
    return model.train(hf_model.training)
