"""Fine-tune a SwiGLU transformer into a bilinear one by annealing the gate (paper App. J).

``Swish_beta(x) = x * sigmoid(beta x)``: ``beta = 1`` is SiLU, ``beta ~= 1.702`` approximates GELU and
``beta = 0`` gives ``x / 2``, a linear gate. Interpolating ``beta`` to 0 during fine-tuning turns
``down(act(gate(x)) * up(x))`` into the bilinear ``down((gate(x) / 2) * up(x))``. At the end the factor
1/2 is folded into ``down_proj`` (its weight is halved, its bias is not), the activation becomes the identity
(transformers' ``"linear"``) and ``config.hidden_act`` (and Gemma's ``hidden_activation``) is set to ``"linear"``,
so that the saved model reloads as a bilinear model with ``from_pretrained`` and
:func:`~bcos_plugins.bilinear.bilinear_weights` reads it.

The paper anneals linearly over the first 30 % of training and keeps ``beta = 0`` for the rest; that is the
default schedule here (``anneal_fraction=0.3``).

While the gates are Swish_beta ones (from the first :func:`set_swish_beta` until :func:`finalize_bilinear`), a
stock model's config records their state, so that every checkpoint the ``Trainer`` saves during training (while
``beta`` anneals, and also at ``beta = 0`` before training ends, the last step's included) says what it holds:
``config.swish_beta`` holds the ``beta`` of the gates and ``down_proj_halved: False`` (the 1/2 is folded only by
:func:`finalize_bilinear`, which removes the record), and ``hidden_act`` (Gemma's ``hidden_activation`` too) is
:data:`ANNEALING_ACTIVATION` (the original one is kept in the record). A stock ``from_pretrained`` of such a
checkpoint raises ``KeyError`` naming :func:`load_annealing_checkpoint`, which rebuilds the model with its gates at the
saved ``beta``, exactly the model saved; before, the checkpoint kept the original ``hidden_act`` and reloaded as the
SiLU / GELU model, silently (logits 6e-4 to 1e-2 off on a tiny Llama). The state is recorded in the config, not
written into the checkpoint's files after the ``Trainer`` wrote them (an ``on_save`` rewrite): the ``Trainer`` saves
with ``model.save_pretrained``, which writes ``model.config`` as it is, so a checkpoint, a ``save_pretrained`` of a
model annealed by hand and a ``push_to_hub`` all carry it, with no file rewritten behind the ``Trainer``. Resuming
(``trainer.train(resume_from_checkpoint=...)`` with the same callback) loads only the weights into the model given and
sets ``beta`` from the step, as an uninterrupted run does (bit-identical). B-cos models (``config.bcos``) are left to
their own record (:func:`~bcos_plugins.bcosify`'s module edits, which ``load_bcos_model`` refuses while gates anneal).
"""

from __future__ import annotations

import math
import warnings

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformers import TrainerCallback
from transformers.activations import ACT2FN, LinearActivation

from .._checks import require_float
from ..b_warmup import refuse_a_second_schedule, refuse_evaluations_compared_during
from ..convert.bcosify import record_module_edits
from ..errors import argument_error
from ..nn.dynamic import DynamicWeightModule

__all__ = ["ANNEALING_ACTIVATION", "SwishBeta", "SwishBetaToBilinear", "finalize_bilinear", "gated_mlps",
           "load_annealing_checkpoint", "set_swish_beta"]

# the config key of the gates' state while they anneal (module docstring)
SWISH_BETA_CONFIG_KEY = "swish_beta"
# hidden_act of a stock model whose gates anneal: no transformers activation has this name, so a stock
# from_pretrained of its checkpoint fails in ACT2FN with a KeyError that shows the name, and with it the fix
ANNEALING_ACTIVATION = ("swish_beta gates annealing (config.swish_beta): load this checkpoint with "
                        "bcos_plugins.bilinear.load_annealing_checkpoint(path)")

# beta at which Swish_beta equals (SiLU; quick GELU, x * sigmoid(1.702 x), the same ops) or approximates (GELU,
# Hendrycks & Gimpel's sigmoid approximation) the model's original activation. Every transformers name of GELU has
# it: the erf form (gelu, gelu_python) and the tanh form (gelu_new, gelu_fast, gelu_pytorch_tanh, gelu_python_tanh,
# gelu_accurate). The two forms are 4.7e-4 apart at most, and the beta that fits x * sigmoid(beta x) best moves by
# 0.001 between them (max error: 1.773 / 1.774; Gaussian-weighted squared error: 1.712 / 1.711), against the 0.02
# that the sigmoid form itself is off at 1.702: one start serves both. Not here: gelu_10, whose clip at +-10 the
# annealed gate drops (start_beta= anneals it anyway), and ReLU, which Swish_beta reaches only as beta -> inf.
START_BETA = {"silu": 1.0, "swish": 1.0, "gelu": 1.702, "gelu_python": 1.702, "gelu_new": 1.702,
              "gelu_pytorch_tanh": 1.702, "gelu_python_tanh": 1.702, "gelu_fast": 1.702, "gelu_accurate": 1.702,
              "quick_gelu": 1.702}


class SwishBeta(DynamicWeightModule):
    """``x * sigmoid(beta x)`` with a settable ``beta``; the sigmoid is the dynamic weight in explanation mode."""

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        # beta anneals from 1 (SiLU) or 1.702 (GELU) to 0; NaN would make every gate NaN.
        self.beta = require_float("beta", beta, minimum=0.0)

    def forward(self, x: Float[Tensor, ...]) -> Float[Tensor, ...]:
        return x * self.dynamic_weight(torch.sigmoid(self.beta * x))

    def extra_repr(self) -> str:
        return f"beta={self.beta:.4g}"


def gated_mlps(model: nn.Module) -> list[nn.Module]:
    """Every transformers gated MLP in ``model`` (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``)."""
    return [m for m in model.modules()
            if all(hasattr(m, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))]


def _refuse_bcos_gated_mlps(mlps: list[nn.Module]) -> None:
    """Refuse making B-cos gated MLPs (projections that are dynamic-weight modules, as :func:`~bcos_plugins.bcosify`
    makes them) bilinear: a B-cos projection normalises its weight rows, so halving ``down_proj``'s weight does not
    halve its output and :func:`finalize_bilinear` changed the model (logits 0.13 off on a tiny B-cos Llama, without a
    word); nor is such a layer bilinear (:func:`~bcos_plugins.bilinear.bilinear_weights` refuses it). Annealing their
    Swish_beta gates (:func:`set_swish_beta`) stays possible: only the fold and the finalisation are refused."""
    for i, mlp in enumerate(mlps):
        used = [n for n in ("gate_proj", "up_proj", "down_proj") if isinstance(getattr(mlp, n), DynamicWeightModule)]
        if used:
            raise argument_error(
                "model", f"its gated MLP {i} ({type(mlp).__name__}) has B-cos projections ({', '.join(used)}), which "
                "normalise their weights: the gate's factor 1/2 cannot be folded into down_proj (the outputs would "
                "change), and the layer would not be bilinear", "Anneal the stock model with SwishBetaToBilinear "
                "(finalised at the end of training) before bcosify, or train the B-cos model without Swish_beta gates")


def set_swish_beta(model: nn.Module, beta: float) -> None:
    """Install (first call) or update the :class:`SwishBeta` gate of every gated MLP.

    A model whose gates are already the identity (bilinear, e.g. finalised by :func:`finalize_bilinear`) is
    refused: its ``down_proj`` already holds the gate's factor 1/2.
    """
    beta = require_float("beta", beta, minimum=0.0)
    mlps = gated_mlps(model)
    if not mlps:
        raise ValueError(
            f"{type(model).__name__} has no gated MLP (modules with gate_proj, up_proj, down_proj and act_fn, as in "
            "Llama/Mistral/Qwen); swish-beta annealing only applies to SwiGLU-style models."
        )
    already = [i for i, mlp in enumerate(mlps) if isinstance(mlp.act_fn, LinearActivation)]
    if already:
        # a finalised model's gate is the identity and its down_proj already holds the gate's 1/2: a Swish_beta gate
        # put back on it (a second SwishBetaToBilinear(start_beta=...)) computed another model, and finalising again
        # halved down_proj a second time
        raise argument_error(
            "model", f"is already bilinear: the gates of its gated MLPs {already[:8]} are the identity "
            "(finalize_bilinear replaced them and folded their factor 1/2 into down_proj), so a Swish_beta gate on "
            "them would compute another model", "Fine-tune it as it is, without SwishBetaToBilinear or set_swish_beta")
    for mlp in mlps:
        if isinstance(mlp.act_fn, SwishBeta):
            mlp.act_fn.beta = float(beta)
        else:
            mlp.act_fn = SwishBeta(beta)
    # a B-cos model's config.bcos records each activation, which a load rebuilds from the config: a save made while
    # annealing reloaded with the config's SiLU gates, another model, silently; recorded, the load refuses it
    record_module_edits(model, _act_fn_paths(model, mlps))
    _record_gate_state(model, beta)


def _record_gate_state(model: nn.Module, beta: float) -> None:
    """Write the gates' state into a stock model's config (module docstring): saved with it, a checkpoint reloads as
    the model it is through :func:`load_annealing_checkpoint` and is refused by a stock ``from_pretrained``."""
    config = _text_config(model)
    if config is None or getattr(getattr(model, "config", None), "bcos", None) is not None:
        return
    state = getattr(config, SWISH_BETA_CONFIG_KEY, None)
    activations = (dict(state["activations"]) if isinstance(state, dict)
                   else {key: getattr(config, key) for key in _activation_keys(config)
                         if getattr(config, key, None) is not None})  # (Gemma 2's config has no hidden_act)
    setattr(config, SWISH_BETA_CONFIG_KEY, {"beta": float(beta), "down_proj_halved": False,
                                            "activations": activations})
    for key in activations:
        setattr(config, key, ANNEALING_ACTIVATION)


def _original_activations(config) -> dict | None:
    state = getattr(config, SWISH_BETA_CONFIG_KEY, None)
    return dict(state["activations"]) if isinstance(state, dict) else None


def load_annealing_checkpoint(path, **from_pretrained_kwargs) -> nn.Module:
    """Load a checkpoint saved while :class:`SwishBetaToBilinear` (or :func:`set_swish_beta`) annealed a stock model's
    gates, as the model it was: the architecture of ``config.architectures`` built with the original activation, its
    weights, then its gates set to the saved ``beta`` (the record stays, so the model saves as it loaded). Keywords go
    to ``from_pretrained``. A folder without the record (a finalised bilinear model, a stock one) is refused: load it
    with ``from_pretrained``."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    text = _text_config_of(config)
    state = getattr(text, SWISH_BETA_CONFIG_KEY, None)
    if not isinstance(state, dict):
        raise argument_error("path", f"{path} holds no Swish_beta annealing state (config.{SWISH_BETA_CONFIG_KEY}): "
                             "it was not saved while gates annealed", "Load it with from_pretrained")
    if state.get("down_proj_halved") is not False or not isinstance(state.get("activations"), dict):
        raise argument_error("path", f"{path}'s config.{SWISH_BETA_CONFIG_KEY} is {state!r}, not a record that "
                             "set_swish_beta writes (down_proj_halved False, the original activations)",
                             "Restore config.json from the checkpoint the Trainer saved")
    beta = require_float(f"config.{SWISH_BETA_CONFIG_KEY}['beta']", state.get("beta"), minimum=0.0)
    for key, value in state["activations"].items():
        setattr(text, key, value)
    architectures = getattr(config, "architectures", None) or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        raise argument_error("path", f"{path}'s config names no transformers architecture ({architectures})",
                             "Load the model class with from_pretrained(path, config=...) and call "
                             f"set_swish_beta(model, {beta})")
    model = model_class.from_pretrained(path, config=config, **from_pretrained_kwargs)
    set_swish_beta(model, beta)
    return model


def _text_config_of(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def finalize_bilinear(model: nn.Module) -> None:
    """Replace the ``beta = 0`` gates by the identity, fold their factor 1/2 into ``down_proj``; outputs unchanged.

    Every gated MLP is checked before any is changed: a refusal leaves the model as it was."""
    mlps = gated_mlps(model)
    if not mlps:
        # the config below was still set to "linear": a BERT saved after it reloaded with identity activations
        raise argument_error("model", f"{type(model).__name__} has no gated MLP (modules with gate_proj, up_proj, "
                             "down_proj and act_fn), so there is nothing to finalise",
                             "Pass the model SwishBetaToBilinear / set_swish_beta annealed (Llama, Mistral, Qwen, "
                             "Gemma layout)")
    _refuse_bcos_gated_mlps(mlps)
    for mlp in mlps:
        # all checked first: a later MLP's refusal left the earlier ones' down_proj halved and gates replaced
        if not isinstance(mlp.act_fn, SwishBeta) or mlp.act_fn.beta != 0.0:
            raise ValueError(
                f"cannot finalise {type(mlp).__name__}: its gate is {mlp.act_fn!r}, not a SwishBeta annealed to beta=0. "
                "Train with SwishBetaToBilinear until the annealing is over (anneal_fraction < 1)."
            )
    # each weight halved once: a down_proj shared by several MLPs (one module, or one tied parameter) was halved once
    # per MLP, a quarter for two, and the finalised model's outputs changed
    halved: set[int] = set()
    for mlp in mlps:
        weight = mlp.down_proj.weight
        if id(weight) not in halved:
            halved.add(id(weight))
            with torch.no_grad():
                weight.mul_(0.5)
        mlp.act_fn = ACT2FN["linear"]
    config = _text_config(model)
    if config is not None:
        # the annealing record goes: the 1/2 is folded and the gates are the identity, which "linear" says
        if hasattr(config, SWISH_BETA_CONFIG_KEY):
            delattr(config, SWISH_BETA_CONFIG_KEY)
        for key in _activation_keys(config):
            setattr(config, key, "linear")


def _act_fn_paths(model: nn.Module, mlps: list[nn.Module]) -> list[str]:
    ids = {id(mlp) for mlp in mlps}
    return [f"{name}.act_fn" for name, module in model.named_modules(remove_duplicate=False) if id(module) in ids]


def _text_config(model: nn.Module):
    config = getattr(model, "config", None)
    return None if config is None else _text_config_of(config)


def _activation_keys(config) -> list[str]:
    """The config attributes that name the MLP's activation, the one the MLP reads first: Gemma 2 / 3's MLPs read
    ``hidden_activation`` (their configs have no ``hidden_act``), so a bilinear model saved with only ``hidden_act``
    set to ``"linear"`` reloaded with GELU gates on its halved ``down_proj``; the others read ``hidden_act``."""
    if getattr(config, "hidden_activation", None) is not None:
        return ["hidden_activation", "hidden_act"]
    return ["hidden_act"]


class SwishBetaToBilinear(TrainerCallback):
    """A ``transformers.TrainerCallback`` that anneals ``beta`` linearly from ``start_beta`` to 0, then keeps 0.

    ``beta(step) = start_beta * max(0, 1 - step / (anneal_fraction * max_steps))``, set before each step. At the
    end of training the model becomes bilinear (:func:`finalize_bilinear`). ``start_beta=None`` reads it from
    ``model.config.hidden_act`` or Gemma's ``hidden_activation`` (SiLU: 1.0, GELU variants and quick GELU: 1.702).

    ``anneal_fraction`` lies in (0, 1): the annealing must end while training goes on, so that the model trains at
    ``beta = 0`` (the bilinear model it becomes) before it is finalised. At 1 every step trained at ``beta > 0`` and
    the finalised model was one no step had trained. A fraction that leaves no step at ``beta = 0`` for the run's
    ``max_steps`` (``anneal_fraction * max_steps > max_steps - 1``, e.g. 0.95 of 10 steps) is refused when training
    begins, naming the largest fraction that fits; nothing is clamped, so the schedule is the one asked for.
    ``load_best_model_at_end`` and any ``metric_for_best_model`` (``EarlyStoppingCallback``, ``save_strategy="best"``,
    ``lr_scheduler_type="reduce_lr_on_plateau"``) are refused when training begins unless no evaluation runs during
    the annealing (``eval_delay`` past it), as :class:`~bcos_plugins.BWarmupCallback` refuses them during its warm-up:
    a checkpoint evaluated with ``beta > 0`` gates would come back finalised at ``beta = 0``, another function than
    the one its metric measured, and evaluations at different ``beta`` compare different functions.

    Examples:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
        >>> from bcos_plugins.bilinear import SwishBetaToBilinear
        >>> llama = LlamaForCausalLM(LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32,
        ...                                      num_hidden_layers=1, num_attention_heads=2))   # SwiGLU
        >>> ds = [{"input_ids": ids, "labels": ids} for ids in torch.randint(60, (8, 12))]
        >>> args = TrainingArguments("swish-beta-run", max_steps=4, per_device_train_batch_size=4,
        ...                          save_strategy="no", report_to="none")
        >>> trainer = Trainer(model=llama, args=args, train_dataset=ds, callbacks=[SwishBetaToBilinear()])
        >>> trainer.train()
        {'train_runtime': ...}
        TrainOutput(global_step=4, ...)
        >>> llama.config.hidden_act                        # bilinear from here on
        'linear'
    """

    def __init__(self, anneal_fraction: float = 0.3, start_beta: float | None = None) -> None:
        anneal_fraction = require_float("anneal_fraction", anneal_fraction)
        if not 0.0 < anneal_fraction < 1.0:
            # at 1 no step trains at beta = 0: the finalised bilinear model is one no step trained (class docstring)
            raise argument_error("anneal_fraction", f"anneal_fraction={anneal_fraction} must lie in (0, 1), the "
                                 "share of the training steps spent annealing before the model trains at beta=0",
                                 "Pass e.g. 0.3 (the paper's)")
        self.anneal_fraction = anneal_fraction
        self.start_beta = None if start_beta is None else require_float("start_beta", start_beta, minimum=0.0)
        self.beta: float | None = None

    def _start_beta(self, model: nn.Module) -> float:
        if self.start_beta is not None:
            return float(self.start_beta)
        config = _text_config(model)
        # a model annealed before (a second run) has the recorded original, not ANNEALING_ACTIVATION
        original = _original_activations(config)
        key = _activation_keys(config)[0] if original is None else next(iter(original))
        act = getattr(config, key, None) if original is None else original[key]
        if act not in START_BETA:
            raise ValueError(
                f"cannot infer the starting beta from {key}={act!r}; pass start_beta= (1.0 for SiLU, 1.702 for "
                f"GELU). Known: {sorted(START_BETA)}"
            )
        return START_BETA[act]

    def beta_at(self, step: int, max_steps: int) -> float:
        anneal_steps = max(1.0, self.anneal_fraction * max_steps)
        return self.start_beta_value * max(0.0, 1.0 - step / anneal_steps)

    def require_bilinear_phase(self, max_steps: int) -> None:
        """Refuse a schedule whose last training step (``max_steps - 1``) still runs at ``beta > 0`` (class
        docstring): the model would be finalised at ``beta = 0`` without a step of training there."""
        anneal_steps = max(1.0, self.anneal_fraction * max_steps)
        if anneal_steps <= max_steps - 1:
            return
        if max_steps < 2:
            fix = "Train for at least 2 steps (max_steps), one annealing and one at beta=0"
        else:
            largest = math.floor((max_steps - 1) / max_steps * 1e4) / 1e4  # rounded down: the bound itself fits
            fix = f"Pass anneal_fraction <= {largest:g} for {max_steps} steps (the paper: 0.3), or train longer"
        raise argument_error("anneal_fraction", f"anneal_fraction={self.anneal_fraction} anneals over {anneal_steps:g} "
                             f"of the {max_steps} training steps, so no step trains at beta=0 before the model is "
                             "made bilinear at the end", fix)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("SwishBetaToBilinear needs the Trainer to pass the model to its callbacks")
        self.model_id = id(model)
        refuse_a_second_schedule(state, self, "SwishBetaToBilinear", "beta",
                                 lambda other: getattr(other, "model_id", None) == self.model_id)
        self.start_beta_value = self._start_beta(model)
        self.require_bilinear_phase(state.max_steps)
        if self.start_beta_value > 0:
            # as the B warm-up's: a best checkpoint chosen from the annealing came back finalised at beta = 0, another
            # function than the one its metric measured (eval_loss 4.105830 at step 1's SiLU gates, 4.105855 as
            # returned on a tiny Llama), and early stopping or a plateau schedule compared evaluations at another beta
            refuse_evaluations_compared_during(
                args, state, math.ceil(max(1.0, self.anneal_fraction * state.max_steps)),
                schedule="Swish_beta annealing", phase="annealing",
                runs_at="with Swish_beta gates (beta > 0), not the bilinear model's",
                end_change="finalising it as bilinear (beta = 0)", worsens="as beta falls")
        # it finalises the model when training ends: a B-cos model is refused before the first step, not after the last
        _refuse_bcos_gated_mlps(gated_mlps(model))
        self.beta = self.beta_at(state.global_step, state.max_steps)
        set_swish_beta(model, self.beta)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.beta = self.beta_at(state.global_step, state.max_steps)
        set_swish_beta(model, self.beta)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.beta = self.beta_at(state.global_step, state.max_steps)
        set_swish_beta(model, self.beta)
        if self.beta == 0.0:
            finalize_bilinear(model)
        else:
            warnings.warn(
                f"training stopped at step {state.global_step} of {state.max_steps} with beta={self.beta:.4g} > 0: the "
                "model still has Swish_beta gates and is not bilinear. Train longer or lower anneal_fraction.",
                stacklevel=2,
            )
