"""``hooked_transformer_from_hf``: a transformers causal LM (B-cos, bilinear or plain) as a TL model.

Offline: the config goes through TransformerLens' own ``convert_hf_model_config`` (pointed at a local
copy of the model's config, never at the hub) and the weights through its per-family weight conversion,
called by the converter module the architecture registry names (``ArchitectureSpec.lens_conversion``,
modules in ``conversions/``). The weights are used as they are (no LayerNorm folding or centring: those
rewrite the model into an equivalent one only for plain models, never for B-cos ones), except the final
norm's weight, which is folded into ``W_U`` (exact for every model; TransformerLens' ``logit_attrs`` assumes
it), so ``ln_final`` is a weightless ``LayerNormPre`` / ``RMSNormPre``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.loading_from_pretrained import convert_hf_model_config, fill_missing_keys
from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

from bcos_plugins._checks import refuse_a_model_as_the_tokenizer, refuse_meta_model, require_model_object
from bcos_plugins.convert.architectures import SPECS, architecture_name, specs_where, stock_class
from bcos_plugins.corpus import require_tokenizer_fits
from bcos_plugins.errors import BcosRuntimeError, BcosTypeError, BcosValueError, argument_error
from bcos_plugins.nn.dynamic import DynamicWeightModule

from .config import BcosTransformerConfig
from .conversions import conversion_for, vocabulary_sizes
from .decomposition import fold_final_norm_weight
from .model import bcos_model_class, exact_cache_class, make_explainable

__all__ = ["hooked_transformer_from_hf", "SUPPORTED_HF_ARCHITECTURES"]

# the registry's classes with a TransformerLens converter
SUPPORTED_HF_ARCHITECTURES = specs_where(lambda spec: spec.lens_conversion is not None)
_BIAS_KEY = ("b", "b_Q", "b_K", "b_V", "b_O", "_b_K", "_b_V", "b_in", "b_out", "b_U")
# the substrings of a config folder's path by which TransformerLens' convert_hf_model_config (3.9) picks an
# architecture ahead of the config it reads (a Qwen2 config under /home/gemma/ fails there as an unsupported Gemma)
_SNIFFED_NAMES = ("llama", "gemma")
# transformers activation names that TransformerLens has under another name, the same function: "gelu_accurate"
# (AccurateGELUActivation) is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), TransformerLens' gelu_new term for
# term (bit-identical in float32 and float64 on [-20, 20] and 10^6 normal draws x 4, 2026-11-28), and the B-cos
# form of both is the tanh GELU's gate (bcosify's AccurateGELUActivation -> "gelu_tanh", as gelu_new's)
_LENS_ACTIVATION_NAMES = {"gelu_accurate": "gelu_new"}


def _lens_activation(name):
    """The TransformerLens name of the transformers activation ``name`` (unchanged where both say the same)."""
    return _LENS_ACTIVATION_NAMES.get(name, name)


_HEAD_KINDS = {"base": "a base model (hidden states, no LM head)", "classifier": "a sequence classifier",
               "masked_lm": "a masked LM"}


def _fix_without_converter(name: str) -> str:
    """What to use for a class ``hooked_transformer_from_hf`` cannot convert: it follows from the class, since a
    causal LM may still go through the bridge, and a TransformerLens model is always a causal LM."""
    spec = SPECS.get(name)
    if spec is None:
        return f"The architecture registry has no {name}: pass a model of one of those classes"
    if spec.bridge:
        return f"Use transformer_bridge_from_hf(hf_model): TransformerLens' TransformerBridge takes {name}"
    transformers_path = f"explain {name} with bcos_plugins.explain (the transformers path)"
    if spec.head == "causal_lm":
        return f"Neither TransformerLens path takes {name}: {transformers_path}"
    family_lm = [lm for lm in SUPPORTED_HF_ARCHITECTURES if stock_class(lm).config_class is stock_class(name).config_class]
    if spec.head == "base" and family_lm:
        return (f"{name} is {_HEAD_KINDS['base']}, and a TransformerLens model ends in an LM head: use "
                f"{family_lm[0]} (the base model with its LM head), or {transformers_path}")
    return f"{name} is {_HEAD_KINDS[spec.head]}, and a TransformerLens model is a causal LM: {transformers_path}"


def _architecture(hf_model: nn.Module) -> str:
    name = architecture_name(hf_model)
    if name not in SUPPORTED_HF_ARCHITECTURES:
        raise argument_error("hf_model", f"hooked_transformer_from_hf supports {', '.join(SUPPORTED_HF_ARCHITECTURES)} "
                             f"(plain, B-cosified or bilinear); got {type(hf_model).__name__}",
                             _fix_without_converter(name), kind=BcosTypeError)
    return name


def _refuse_hand_set_activation(hf_model: nn.Module, act: str) -> None:
    """The TransformerLens model runs the config's activation in every MLP: one set by hand on the transformers model
    (a tanh in a SiLU Llama's layer 0, which bcosify keeps as a gate branch) was replaced by it, logits 0.08 off,
    silently. Each MLP activation is compared with TransformerLens' ``act`` on a grid of inputs."""
    lens_fn = SUPPORTED_ACTIVATIONS[act]
    probe = torch.linspace(-8.0, 8.0, 321)
    want = lens_fn(probe)
    for name, module in hf_model.named_modules():
        if name.rpartition(".")[2] not in ("act", "act_fn") or any(True for _ in module.parameters()):
            continue
        with torch.no_grad():
            got = module(probe)
        # the tolerance of float32 rounding (TransformerLens' gelu_new and a detachable tanh GELU are 2.4e-7 apart)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max().clamp_min(1))):
            raise BcosValueError(
                f"hf_model: its MLP activation '{name}' ({type(module).__name__}) computes another function than the "
                f"config's {act!r}, which the TransformerLens model would run in its place (an activation set by "
                "hand on the model), so its logits would differ. Use transformer_bridge_from_hf(hf_model), which runs "
                "the model's own modules, or build the model with the activation in its config.")


def _refuse_inexpressible(conversion, arch: str, hf_config, bcos: dict | None, hf_model: nn.Module) -> None:
    """Clear errors for transformers options the TransformerLens model would silently get wrong."""
    act = _lens_activation(conversion.activation(hf_config))
    if act not in SUPPORTED_ACTIVATIONS:
        raise BcosValueError(
            f"activation {act!r} of this {arch} has no TransformerLens counterpart; supported: "
            f"{', '.join(sorted(SUPPORTED_ACTIVATIONS))}."
        )
    _refuse_hand_set_activation(hf_model, act)
    conversion.refuse_inexpressible(hf_config, bcos)
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


def _config_dict(conversion, arch: str, hf_config) -> dict:
    """TransformerLens' own config conversion, run on a local copy of the config (no hub access), or the
    converter's where TransformerLens converts the family's config only by hub name."""
    if conversion.config_dict is not None:
        cfg = conversion.config_dict(hf_config)
        conversion.adjust_config(cfg, hf_config)
        return cfg
    local = type(hf_config).from_dict(hf_config.to_dict())
    local.architectures = [arch]
    conversion.prepare_config(local)
    with tempfile.TemporaryDirectory(prefix="bcos_tl_config_") as folder:
        # the folder's path must carry none of _SNIFFED_NAMES: its random letters could (then a new folder is
        # drawn), the temporary directory above it cannot be redrawn (a retry would recurse without end)
        parent = str(Path(folder).parent)
        sniffed = [s for s in _SNIFFED_NAMES if s in parent.lower()]
        if sniffed:
            raise BcosRuntimeError(
                f"the temporary directory {parent!r} contains {sniffed[0]!r}: TransformerLens' convert_hf_model_config "
                "reads the config folder's path as a model name and takes that architecture instead of the config's. "
                f"Set TMPDIR to a folder whose path has none of {', '.join(_SNIFFED_NAMES)}")
        if any(s in folder.lower() for s in _SNIFFED_NAMES):
            return _config_dict(conversion, arch, hf_config)
        local.save_pretrained(folder)
        cfg = convert_hf_model_config(str(Path(folder)))
    conversion.adjust_config(cfg, hf_config)
    cfg["tokenizer_name"] = None  # the folder is gone; a tokenizer is attached separately
    return cfg


def _state_dict(conversion, hf_model: nn.Module, cfg: HookedTransformerConfig, bcos: bool) -> dict:
    state = conversion.state_dict(hf_model, cfg)
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
        hf_model: a transformers causal LM of :data:`SUPPORTED_HF_ARCHITECTURES` (``GPT2LMHeadModel``,
            ``LlamaForCausalLM``, ...): B-cosified (:func:`bcos_plugins.bcosify`), bilinear (gated MLP with
            ``hidden_act="linear"``) or plain.
        tokenizer: optional tokenizer to attach (``model.to_tokens`` etc.); in-memory ones work.
        model_class: ``HookedTransformer`` or a subclass such as sae-lens' ``HookedSAETransformer``.

    Returns:
        a ``model_class`` instance (its B-cos version for B-cos models, see ``bcos_model_class``; for plain models
        the subclass of ``exact_cache_class``, whose ``run_with_cache`` gives exact per-head / per-neuron results where
        blocks normalise their outputs again, Gemma 2, and whose ``.double()`` / ``.half()`` keep ``cfg.dtype`` in
        step) on the device and dtype of ``hf_model``, made explainable (:func:`make_explainable`), in the same
        train/eval mode. TransformerLens' own tokenizer attach on it (``model.set_tokenizer``) refuses a tokenizer
        with more tokens than the model's embedding rows, as ``tokenizer=`` does.

    Raises:
        TypeError: other architectures. ValueError: options TransformerLens cannot express (named).
    """
    # a tokenizer where the model goes (the arguments swapped), ids, a pipeline: named with the fix, as everywhere
    require_model_object(hf_model, "hf_model", only_stand_ins=True)
    arch = _architecture(hf_model)
    refuse_meta_model(hf_model, "hf_model")
    if tokenizer is not None:  # TransformerLens' own model("text") failed in the embedding (IndexError)
        refuse_a_model_as_the_tokenizer(tokenizer, call="hooked_transformer_from_hf(model, tokenizer=tokenizer)")
        require_tokenizer_fits(hf_model, tokenizer)  # refuses a hub name too (require_tokenizer_object)
    if not (isinstance(model_class, type) and issubclass(model_class, HookedTransformer)):
        # was TypeError: Module.__init__() got an unexpected keyword argument 'move_to_device'
        raise argument_error("model_class", f"expected HookedTransformer or a subclass, got {model_class!r}",
                             "Pass the class itself, e.g. HookedTransformer or sae_lens.HookedSAETransformer",
                             kind=BcosTypeError)
    conversion = conversion_for(SPECS[arch].lens_conversion)
    hf_config = hf_model.config
    bcos = getattr(hf_config, "bcos", None)
    _refuse_inexpressible(conversion, arch, hf_config, bcos, hf_model)
    param = next(hf_model.parameters())
    cfg_dict = _config_dict(conversion, arch, hf_config)
    if "act_fn" in cfg_dict:
        cfg_dict["act_fn"] = _lens_activation(cfg_dict["act_fn"])  # TransformerLens copies the transformers name
    cfg_dict.update(device=str(param.device), dtype=param.dtype, init_weights=False, **vocabulary_sizes(hf_model))
    if bcos is not None:
        cfg = BcosTransformerConfig(**cfg_dict, bcos_b=bcos["b"])
        model = bcos_model_class(model_class)(cfg, move_to_device=True)
    else:
        cfg = HookedTransformerConfig(**cfg_dict)
        # ExactCache's subclass for every plain model too: its run_with_cache gives exact per-head / per-neuron results
        # where blocks normalise their outputs again (Gemma 2) and is TransformerLens' own elsewhere; its .double() /
        # .half() / .bfloat16() keep cfg.dtype in step (the weightless final norm casts to cfg.dtype, so a plain
        # model's .double() failed in the unembedding: "mat1 and mat2 must have the same dtype"); and TransformerLens'
        # own tokenizer attach (set_tokenizer, sae-lens' HookedSAETransformer) refuses a tokenizer larger than the
        # vocabulary, as tokenizer= here does
        model = exact_cache_class(model_class)(cfg, move_to_device=True)
    # TransformerLens' converters leave out buffers (masks, rotary tables) and some zero biases (GPT-2's
    # b_U); its fill_missing_keys takes those from the freshly built model and fails on missing weights.
    state = _state_dict(conversion, hf_model, cfg, bcos is not None)
    model.load_state_dict(fill_missing_keys(model, state), strict=True)  # a B-cos model folds ln_final.w here
    fold_final_norm_weight(model)  # the others' final norm (a no-op on an already weightless one)
    make_explainable(model)
    if tokenizer is not None:
        _attach_tokenizer(model, tokenizer)
    return model.train(hf_model.training)
