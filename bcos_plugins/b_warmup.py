"""Annealing the alignment pressure B during training (a transformers ``TrainerCallback``)."""

from __future__ import annotations

from torch import nn

from ._checks import require_number
from .convert.checkpoint_format import BCOS_CONFIG_KEY
from .errors import argument_error
from .nn.linear import AlignmentPressure, check_b

__all__ = ["BWarmupCallback"]


class BWarmupCallback:
    """Anneal the alignment pressure B of every B-cos layer from ``start`` to the model's B during training.

    A pretrained model B-cosified with B > 1 starts far from its pretrained function: every B-cos layer scales
    its output by ``|cos|^(B-1)`` (about 0.3 for B = 1.5 and typical cosines), so the sub-layers' share of the
    residual stream collapses and short fine-tunings cannot recover. With B = 1 the converted model is close
    to the pretrained one (only biases removed); raising B linearly over the first ``fraction`` of the
    training steps lets the weights align as the pressure grows. At the end every layer has the target B
    recorded in ``model.config.bcos["b"]``, so saved models are ordinary B-cos models. Every layer stores the B
    it runs with in its checkpoint entry ``bcos_b``, so a Trainer checkpoint written during the warm-up (or a
    model saved after an interrupted one) reloads at the B it was running with, not the final one. It is an
    option to experiment with, not a recommendation (docs/benchmarks.md has what it measured). The layers keep
    the model's B until training begins (an evaluation or a save before ``train()`` runs at the model's B).

    Built lazily as a ``transformers.TrainerCallback`` subclass so that importing this module stays cheap.
    """

    def __new__(cls, *args, **kwargs):
        from transformers import TrainerCallback

        klass = type("BWarmupCallback", (_BWarmup, TrainerCallback), {})
        instance = object.__new__(klass)
        instance.__init__(*args, **kwargs)
        return instance


class _BWarmup:
    def __init__(self, model: nn.Module, start: float = 1.0, fraction: float = 0.5) -> None:
        config = getattr(model, "config", None)
        settings = getattr(config, BCOS_CONFIG_KEY, None)
        if isinstance(settings, dict):
            target, where = settings.get("b"), "config.bcos['b']"
        elif getattr(config, "model_type", None) == "bcos_vit":
            target, where = config.b, "config.b"
        else:
            raise argument_error("model", "has no config.bcos: BWarmupCallback needs a model converted with "
                                 "bcosify (or a BcosViT)", "call bcosify(model, b=...) first")
        self.fraction = require_number("fraction", fraction, low=0.0, low_open=True, high=1.0)
        self.start = check_b(start, name="start")
        self.target = check_b(target, name=where)
        if self.start > self.target:
            raise argument_error("start", f"{self.start} is larger than the model's B {self.target}",
                                 "warm up from a smaller B (default 1.0)")
        self.layers = [m for m in model.modules() if isinstance(m, AlignmentPressure)]
        if not self.layers:
            raise argument_error("model", "has no B-cos layers", "call bcosify(model, b=...) first")
        # B is first lowered when training begins, not here: constructing the callback set every layer to start,
        # so a trainer.evaluate() or a save_pretrained before train() ran at B = start, not the model's B

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # built for one model and handed to the Trainer of another, it annealed the B of the model it was built for
        # while the trained one ran at its full B throughout, without a word
        trained = {id(m) for m in model.modules()} if isinstance(model, nn.Module) else None
        if trained is not None and not all(id(layer) in trained for layer in self.layers):
            raise argument_error("model", "BWarmupCallback was built for another model than the one the Trainer "
                                 "trains: it would anneal B in that model's layers while the trained one runs at its "
                                 "full B", "build the callback with the model passed to the Trainer: "
                                 "BWarmupCallback(model) and Trainer(model=model, ...)")
        self.on_step_begin(args, state, control)  # from the global step: a resumed run continues its warm-up

    def _set(self, b: float) -> None:
        for layer in self.layers:
            layer.b = b

    def on_step_begin(self, args, state, control, **kwargs):
        warm_steps = max(1, int(state.max_steps * self.fraction))
        t = min(1.0, state.global_step / warm_steps)
        self._set(self.start + t * (self.target - self.start))

    def on_train_end(self, args, state, control, **kwargs):
        self._set(self.target)
