"""Training and persistence of B-cos classifiers, in one namespace.

The names live in modules of their own, one job each, and are gathered here so that
``from bcos_plugins.train import ...`` keeps working:

- :func:`bcos_loss` (:mod:`bcos_plugins.losses`): binary cross-entropy on one-hot targets, from logits, with
  transformers ``Trainer``'s ``compute_loss_func`` signature.
- :func:`fine_tune_classifier` and :func:`two_rate_adamw` (:mod:`bcos_plugins.fine_tuning`): ``Trainer``
  fine-tuning with a separate head rate and distillation.
- :func:`predict` and :func:`accuracy` (:mod:`bcos_plugins.prediction`): batched logits for lists of texts.
- :class:`BWarmupCallback` (:mod:`bcos_plugins.b_warmup`): anneal B during training.
- :func:`load_bcos_model` (:mod:`bcos_plugins.persistence`): rebuild a model saved with ``save_pretrained``
  after :func:`~bcos_plugins.bcosify`.
"""

from __future__ import annotations

from ._checks import require_labels as check_labels  # noqa: F401  (its name here before the split)
from .b_warmup import BWarmupCallback
from .fine_tuning import fine_tune_classifier, two_rate_adamw
from .losses import bcos_loss
from .persistence import (
    load_bcos_model,
    reconvert_stock_load,  # noqa: F401  (its home before the split)
)
from .prediction import accuracy, predict

__all__ = ["BWarmupCallback", "accuracy", "bcos_loss", "fine_tune_classifier", "load_bcos_model", "predict",
           "two_rate_adamw"]
