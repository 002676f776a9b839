"""Training and persistence of B-cos models.

- :func:`bcos_loss`: binary cross-entropy on one-hot targets, from logits (numerically stable, unlike
  sigmoid-then-BCE), with transformers ``Trainer``'s ``compute_loss_func`` signature.
- :func:`load_bcos_model`: rebuild a model saved with ``save_pretrained`` after :func:`bcosify`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .convert.architectures import SPECS
from .convert.bcosify import BCOS_CONFIG_KEY, bcosify

__all__ = ["BWarmupCallback", "accuracy", "bcos_loss", "fine_tune_classifier", "load_bcos_model", "predict"]


def bcos_loss(outputs, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """Binary cross-entropy from logits on one-hot targets (B-cos training objective).

    Usable directly as ``Trainer(..., compute_loss_func=bcos_loss)``. ``outputs`` is a model output with
    ``.logits`` (or the logits tensor); ``labels`` are class ids ``(batch,)``. The loss is the mean over
    rows and classes; with ``num_items_in_batch`` (gradient accumulation) rows are summed and divided by it.
    """
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    if logits.ndim != 2:
        raise ValueError(f"bcos_loss expects classifier logits of shape (batch, classes); got {tuple(logits.shape)}")
    if labels.is_floating_point() or labels.shape != logits.shape[:1]:
        raise ValueError(f"labels must be integer class ids of shape ({logits.shape[0]},); got "
                         f"{tuple(labels.shape)} {labels.dtype}")
    n_classes = logits.shape[-1]
    if (labels < 0).any() or (labels >= n_classes).any():
        raise ValueError(f"labels must lie in [0, {n_classes}); got {labels.tolist()}")
    one_hot = F.one_hot(labels.to(logits.device), n_classes).to(logits.dtype)
    if num_items_in_batch is None:
        return F.binary_cross_entropy_with_logits(logits, one_hot)
    per_row = F.binary_cross_entropy_with_logits(logits, one_hot, reduction="none").mean(-1)
    return per_row.sum() / num_items_in_batch


def load_bcos_model(path: str | Path, **from_pretrained_kwargs) -> nn.Module:
    """Reload a B-cos model written by ``model.save_pretrained(path)`` (safetensors only).

    The stock architecture recorded in ``config.bcos`` is loaded with transformers' own
    ``from_pretrained`` (sharding, dtype and device options work), converted again with the recorded B,
    and checked: the only weights transformers may report missing are the biases B-cos removes.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    settings = getattr(config, BCOS_CONFIG_KEY, None)
    if not isinstance(settings, dict) or "architecture" not in settings:
        raise ValueError(f"{path} has no B-cos settings in config.json (config.bcos); it was not saved from a "
                         "model converted with bcosify. Load it with transformers and call bcosify instead.")
    name = settings["architecture"]
    if name not in SPECS:
        raise ValueError(f"{path}: unknown B-cos architecture {name!r}; supported: {sorted(SPECS)}")
    import transformers

    cls = getattr(transformers, name)
    hf_logger = logging.getLogger("transformers.modeling_utils")
    level = hf_logger.level
    hf_logger.setLevel(logging.ERROR)  # the missing biases are expected; checked below instead
    try:
        model, info = cls.from_pretrained(path, config=config, use_safetensors=True,
                                          output_loading_info=True, **from_pretrained_kwargs)
    finally:
        hf_logger.setLevel(level)
    bcosify(model, b=settings["b"], verbose=False)
    dropped = set(model.bcos_report.dropped_biases)
    unexpected_missing = [k for k in info["missing_keys"] if k not in dropped]
    if unexpected_missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise ValueError(
            f"{path} does not match a B-cos {name}: missing {unexpected_missing}, unexpected "
            f"{info['unexpected_keys']}, mismatched {info.get('mismatched_keys')}"
        )
    model.eval()
    return model



class _EncodedTexts(torch.utils.data.Dataset):
    """Tokenised texts for ``Trainer`` (padding is left to the collator)."""

    def __init__(self, tokenizer, texts: list[str], labels: list[int] | None, max_length: int):
        self.encodings = tokenizer(list(texts), truncation=True, max_length=max_length)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.encodings["input_ids"])

    def __getitem__(self, i: int) -> dict:
        item = {k: v[i] for k, v in self.encodings.items()}
        if self.labels is not None:
            item["labels"] = int(self.labels[i])
        return item


def _is_bcos(model: nn.Module) -> bool:
    from .nn.dynamic import DynamicWeightModule

    return any(isinstance(m, DynamicWeightModule) for m in model.modules())


def fine_tune_classifier(
    model: nn.Module,
    tokenizer,
    texts: list[str],
    labels: list[int],
    *,
    epochs: float = 1.0,
    batch_size: int = 32,
    learning_rate: float = 5e-5,
    head_learning_rate: float | None = None,
    max_length: int = 64,
    output_dir: str | Path | None = None,
    loss: str = "auto",
    seed: int = 0,
    progress: bool = True,
    b_warmup: float | None = None,
    **training_args,
):
    """Fine-tune a sequence classifier with transformers' ``Trainer`` and return the trainer.

    ``loss="auto"`` uses :func:`bcos_loss` (BCE on one-hot targets) for B-cos models and the model's own
    cross-entropy otherwise; ``"bce"`` / ``"ce"`` force one. Padding is dynamic (``DataCollatorWithPadding``).

    ``head_learning_rate`` (default: ``learning_rate``) applies to the freshly initialised head (every
    parameter outside the encoder, plus the pooler). B-cos logits are bounded by the norm of their input
    and grow only as the head's weights align with it, so a short CPU fine-tuning converges much faster
    with a larger head rate (the paper trains 5 epochs on GPUs instead). ``b_warmup=f`` anneals B from 1 to
    the model's B over the first fraction ``f`` of the steps (:class:`BWarmupCallback`). Extra keyword
    arguments go to ``TrainingArguments``.
    """
    import tempfile

    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    if loss not in ("auto", "bce", "ce"):
        raise ValueError(f"loss must be 'auto', 'bce' or 'ce', got {loss!r}")
    use_bce = loss == "bce" or (loss == "auto" and _is_bcos(model))
    args = TrainingArguments(
        output_dir=str(output_dir or tempfile.mkdtemp(prefix="bcos_finetune_")),
        num_train_epochs=epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        report_to=[],
        save_strategy="no",
        logging_steps=max(1, len(texts) // batch_size // 10),
        disable_tqdm=not progress,
        dataloader_pin_memory=torch.cuda.is_available(),
        **training_args,
    )
    optimizers = (None, None)
    if head_learning_rate is not None:
        optimizers = (_two_rate_adamw(model, learning_rate, head_learning_rate, args.weight_decay), None)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_EncodedTexts(tokenizer, texts, labels, max_length),
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_loss_func=bcos_loss if use_bce else None,
        optimizers=optimizers,
        callbacks=[BWarmupCallback(model, fraction=b_warmup)] if b_warmup else None,
    )
    trainer.train()
    model.eval()
    return trainer


def _two_rate_adamw(model: nn.Module, lr: float, head_lr: float, weight_decay: float):
    """AdamW with one rate for the pretrained encoder and another for the head (and pooler)."""
    prefix = getattr(model, "base_model_prefix", "")
    head, body = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        in_body = name.startswith(prefix + ".") and ".pooler." not in name
        (body if in_body else head).append(p)
    return torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": head_lr}],
                             lr=lr, weight_decay=weight_decay)


@torch.no_grad()
def predict(model: nn.Module, tokenizer, texts: list[str], *, batch_size: int = 64,
            max_length: int = 64) -> Tensor:
    """Logits ``(n, classes)`` for a list of texts, batched, in eval mode."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[start : start + batch_size]), padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt").to(device)
        out.append(model(**enc).logits.float().cpu())
    return torch.cat(out)


def accuracy(model: nn.Module, tokenizer, texts: list[str], labels: list[int], **kwargs) -> float:
    """Share of texts whose predicted class equals the label."""
    pred = predict(model, tokenizer, texts, **kwargs).argmax(-1)
    return (pred == torch.as_tensor(labels)).float().mean().item()


class BWarmupCallback:
    """Anneal the alignment pressure B of every B-cos layer from ``start`` to the model's B during training.

    A pretrained model B-cosified with B > 1 starts far from its pretrained function: every B-cos layer scales
    its output by ``|cos|^(B-1)`` (about 0.3 for B = 1.5 and typical cosines), so the sub-layers' share of the
    residual stream collapses and short fine-tunings cannot recover. With B = 1 the converted model is close
    to the pretrained one (only biases removed); raising B linearly over the first ``fraction`` of the
    training steps lets the weights align as the pressure grows. At the end every layer has the target B
    recorded in ``model.config.bcos["b"]``, so saved models are ordinary B-cos models. Measured so far: on a
    48-step fine-tuning of MiniLM on SST-2 (head rate 1e-3) warming up to B = 1.5 did not train better than
    B = 1.25 from the start, so treat it as an option to experiment with, not a recommendation.

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
        from .nn.linear import BcosLinear, check_b

        settings = getattr(model.config, BCOS_CONFIG_KEY, None)
        if not isinstance(settings, dict):
            raise ValueError("BWarmupCallback needs a model converted with bcosify (config.bcos is missing)")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
        self.start = check_b(start)
        self.target = float(settings["b"])
        if self.start > self.target:
            raise ValueError(f"start B {self.start} is larger than the model's B {self.target}")
        self.fraction = fraction
        self.layers = [m for m in model.modules() if isinstance(m, BcosLinear)]
        self._set(self.start)

    def _set(self, b: float) -> None:
        for layer in self.layers:
            layer.b = b

    def on_step_begin(self, args, state, control, **kwargs):
        warm_steps = max(1, int(state.max_steps * self.fraction))
        t = min(1.0, state.global_step / warm_steps)
        self._set(self.start + t * (self.target - self.start))

    def on_train_end(self, args, state, control, **kwargs):
        self._set(self.target)
