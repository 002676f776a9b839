"""A B-cos model trained with transformers' ``Trainer(bf16=True)`` (bfloat16 autocast, here on the CPU) learns a
small task as well as in float32 (issue 30)."""

from __future__ import annotations

import math

import numpy as np
import torch
import transformers as T
from conftest import VOCAB, tiny_config
from datasets import Dataset

from bcos_plugins import bcos_loss, bcosify, explain
from bcos_plugins.nn import BcosLinear

CLS_ID = 2


def cue_word_task(n: int, seed: int, length: int = 10, cue_words: int = 2) -> Dataset:
    """Label 1 rows hold ``cue_words`` words of the set 16-23, label 0 rows words of 8-15, at random positions
    after [CLS]; the rest is noise from 24 up. Balanced, deterministic, learnable in a few dozen steps."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(24, VOCAB, (n, length), generator=g)
    ids[:, 0] = CLS_ID
    labels = torch.arange(n) % 2
    cues = torch.randint(0, 8, (n, cue_words), generator=g) + 8 + 8 * labels[:, None]
    positions = torch.rand(n, length - 1, generator=g).argsort(dim=1)[:, :cue_words] + 1
    ids.scatter_(1, positions, cues)
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(),
                              "labels": labels.tolist()})


def train_and_score(bf16: bool, output_dir: str, seed: int = 0, steps: int = 30):
    """Train a tiny B-cos BERT for ``steps`` steps (batch 32) with ``bcos_loss``; accuracy on 512 held-out rows, the
    logged losses, the dtypes the classifier's output had while training, and the trainer."""
    config = tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # the runs differ only by precision
    torch.manual_seed(seed)
    model = bcosify(T.BertForSequenceClassification(config), b=1.25, verbose=False)
    args = T.TrainingArguments(output_dir=output_dir, per_device_train_batch_size=32, max_steps=steps,
                               learning_rate=3e-3, lr_scheduler_type="constant", bf16=bf16, use_cpu=True,
                               seed=seed, logging_steps=5, report_to=[], save_strategy="no", disable_tqdm=True)
    trainer = T.Trainer(model=model, args=args, train_dataset=cue_word_task(256, seed=1), compute_loss_func=bcos_loss)
    seen_dtypes = set()
    hook = model.classifier.register_forward_hook(lambda module, inputs, out: seen_dtypes.add(out.dtype))
    try:
        trainer.train()
    finally:
        hook.remove()
    prediction = trainer.predict(cue_word_task(512, seed=2))
    accuracy = float(np.mean(prediction.predictions.argmax(-1) == prediction.label_ids))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return accuracy, losses, seen_dtypes, trainer


def test_trainer_bf16_reaches_the_float32_accuracy(tmp_path):
    # Noise bound, measured once (this task and settings, seeds 0-7, 2-core CPU): float32 accuracies 0.969-1.0,
    # bfloat16 0.975-1.0, the largest bfloat16 - float32 gap of one seed 0.031 (seed 3); at 12 steps instead of
    # 30 the same seeds still ranged 0.92-1.0 where both learnt. 0.05 is that largest gap with a margin, and a
    # tenth of the distance to chance.
    fp32_accuracy, fp32_losses, fp32_dtypes, _ = train_and_score(False, str(tmp_path / "fp32"))
    bf16_accuracy, bf16_losses, bf16_dtypes, trainer = train_and_score(True, str(tmp_path / "bf16"))
    assert fp32_dtypes == {torch.float32}
    assert bf16_dtypes == {torch.bfloat16}, "Trainer(bf16=True) did not run the B-cos layers in bfloat16"
    for losses in (fp32_losses, bf16_losses):
        assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0] / 2
    assert fp32_accuracy >= 0.9 and bf16_accuracy >= 0.9, (fp32_accuracy, bf16_accuracy)  # chance is 0.5
    assert abs(bf16_accuracy - fp32_accuracy) <= 0.05, (fp32_accuracy, bf16_accuracy)
    # bf16 training keeps float32 weights (autocast) and each layer's B in float64
    model = trainer.model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(m.bcos_b.dtype == torch.float64 for m in model.modules() if isinstance(m, BcosLinear))


def test_explain_after_trainer_bf16_follows_the_autocast_left_in_the_forward(tmp_path):
    # After Trainer(bf16=True), accelerate leaves model.forward wrapped in bfloat16 autocast (and its outputs cast
    # to float32), so the model keeps computing in bfloat16 outside any autocast block of the caller. explain
    # raised "a module of the model is not exact in explanation mode" there (completeness error 1e-3 against
    # float32's 3.5e-4): it now holds the contributions to bfloat16's rounding, as under an explicit autocast,
    # and unwrapping the forward gives float32 completeness back.
    *_, trainer = train_and_score(True, str(tmp_path), steps=5)
    model = trainer.model
    rows = cue_word_task(4, seed=3)
    ids, mask = torch.tensor(rows["input_ids"]), torch.tensor(rows["attention_mask"])
    in_bf16 = explain(model, ids, mask)
    assert 1e-5 < in_bf16.completeness_error.max() < torch.finfo(torch.bfloat16).eps ** 0.5
    model = trainer.accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    in_fp32 = explain(model, ids, mask)
    assert in_fp32.completeness_error.max() < 1e-5
    torch.testing.assert_close(in_fp32.contributions, in_bf16.contributions, rtol=0.05, atol=0.05)
