"""The B frontier of the B-cos recipe: accuracy against Comp / Suff / SeqPG per setting, decided on enough examples.

For every setting of the grid, B in BENCH_FRONTIER_B x query/key in BENCH_FRONTIER_QK (``stock``: kept stock;
``bcos``: B-cos query/key) x start in BENCH_FRONTIER_START (``task-then-bcos``: `fine_tune_task_then_bcos`'s two
stages, the conventional stage shared by every setting of a seed; ``bcos-directly``: bcosify the pretrained MiniLM
and fine-tune it with BCE, the head at BENCH_BCOS_HEAD_LR), and for every seed of BENCH_FRONTIER_SEEDS (training
data order and head initialisation vary with it), an all-MiniLM-L6-v2 classifier is fine-tuned on SST-2 and on AG
News. The conventional MiniLM of the same seed (cross-entropy, lr BENCH_CONV_LR) is explained by the best post-hoc methods
of docs/benchmarks.md (IG with the [MASK] baseline, Shapley value sampling, LIME, Occlusion); the B-cos models by
their own W(x)x (benchmarks.common.faithfulness: the methods and loops of bench_faithfulness.py).

Data (nothing the project evaluates on elsewhere, no GLUE validation): SST-2 from BENCH_FRONTIER_SST2 (default
../shared/data/sst2 next to the repository): training on the first BENCH_TRAIN rows of its ``train.tsv``,
accuracy on its ``dev.tsv`` (BENCH_ACC_TEST rows, 0: all), comprehensiveness and sufficiency on the first BENCH_EVAL
``dev`` sentences of at least BENCH_FRONTIER_MIN_WORDS words (most ``dev`` rows are GLUE-train phrases of one or
two words, on which removing 10-90 % of the tokens is one token). AG News from BENCH_FRONTIER_AG_NEWS (default
../shared/data/ag_news ``dev.tsv``, 10,001 rows): training on its first BENCH_AG_TRAIN rows, accuracy and SeqPG on
its last BENCH_AG_EVAL rows (disjoint from the training rows; the run refuses an overlap). SeqPG examples are built
from segments the *conventional* model of the seed classifies correctly with probability >= BENCH_SEQPG_MIN_CONF,
so that every setting of a seed is scored on the same examples as the post-hoc methods and the differences pair
example by example; a B-cos model is not excused its own errors on those segments (its accuracy column shows
them).

Per setting (means over seeds): accuracy on SST-2 and AG News with the paired difference to the conventional model
(``paired_accuracy_difference``: an interval over seeds with two or more, else over examples); Comp and Suff (AOPC
x100, the paper-compatible unnormalised area) and SeqPG (x100) of the B-cos explanation; for each metric the best
post-hoc method (highest mean Comp / SeqPG, lowest mean Suff, pooled over the seeds; exact ties go to the first by
name and are named in the report, ``best_posthoc``) and the paired bootstrap
interval of B-cos minus it over the sentences / examples, the seeds' pairs pooled (``paired_bootstrap_difference``:
evaluation-sample noise, not training noise); the explanations' entropy on SST-2 and the SeqPG wrong-segment share.

Resumable: each (setting, seed, dataset) result is a JSON file under BENCH_OUT/cells/<dataset>/<settings key>/ (the
key is a hash of every setting that changes a number on that data set; another configuration starts other cells), and
the conventional models are kept under BENCH_OUT/models/<dataset>/<key>/ for the B-cos cells of their seed. A rerun computes only the missing cells,
then rewrites results.csv, results.md (the frontier table) and frontier.png (accuracy against each faithfulness
metric, one point per setting, the post-hoc methods as reference lines) from all finished cells. Before any work
the run prints its cells and a CPU budget: from the CPU seconds measured by this configuration's finished cells of
the same kind where there are any, else from ESTIMATE below (on a CUDA device it says that this is CPU time and
that the GPU run is much shorter).

``--quick`` (or BENCH_FRONTIER_QUICK=1): one setting, one seed, 3 epochs on 32 SST-2 / 64 AG News rows, 6
sentences, 3 SeqPG examples, few samples (QUICK below; a variable set explicitly wins): a smoke test of the whole
pipeline, about 2 CPU-minutes with MiniLM (tests/test_bench_frontier.py runs it on a tiny random BERT).

Settings (unset: the default; a bad or empty value stops the run naming the variable; benchmarks.common.settings):
  BENCH_FRONTIER_B=1.1,1.25,1.5,2   BENCH_FRONTIER_QK=stock,bcos   BENCH_FRONTIER_START=task-then-bcos,bcos-directly
  BENCH_FRONTIER_SEEDS=0,1,2   BENCH_FRONTIER_DATA=sst2,ag_news   BENCH_FRONTIER_MIN_WORDS=5
  BENCH_FRONTIER_SCHEDULE=default (the B-cos stage's schedule, SCHEDULES below: ``default`` the recipe's,
  ``long-distilled`` twice BENCH_EPOCHS for the B-cos stage only, distilled from the seed's conventional model; a
  schedule other than ``default`` is a setting of its own, named e.g. B1.5-stockqk-task-then-bcos-long-distilled,
  in the same cell folders: the default cells and the conventional models are reused, not recomputed)
  BENCH_FRONTIER_BOOTSTRAP=2000 resamples   BENCH_FRONTIER_MODEL (a stock BERT classifier folder; default MiniLM)
  BENCH_TRAIN=1200   BENCH_AG_TRAIN=600   BENCH_AG_EVAL=2000   BENCH_EPOCHS=2   BENCH_TRAIN_BATCH=16
  BENCH_CONV_LR=1e-4   BENCH_BCOS_LR=2e-4   BENCH_BCOS_HEAD_LR=1e-3 (B-cos directly only)   BENCH_EVAL=400   BENCH_SEQPG=200
  BENCH_SEGMENT=20   BENCH_BATCH=8   BENCH_IG_STEPS=50   BENCH_SHAPLEY_SAMPLES=10   BENCH_LIME_SAMPLES=100
  BENCH_SEQPG_MIN_CONF=0.75   BENCH_ACC_TEST=0   BENCH_THREADS=0   BENCH_OUT=outputs/bench_frontier
  BENCH_PERTURBATIONS_PER_EVAL=0 perturbed copies of a sentence per forward call for Shapley sampling, LIME, Occlusion
  and the Comp/Suff curves (0: the CPU values 16 / 32 / 16 / 64 rows, 256 on a CUDA device; benchmarks.common.
  faithfulness). It groups the same perturbations into fewer, larger forward calls and changes no number beyond
  floating-point rounding, so like BENCH_THREADS it is not part of the settings key: a GPU run resumes CPU cells.
"""
# ruff: noqa: E402 (sys.path first: run as a file, the repository root holds benchmarks)

from __future__ import annotations

import copy
import csv
import hashlib
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch
from transformers import AutoTokenizer, BertForSequenceClassification
from transformers.utils import logging as hf_logging

from bcos_plugins import bcosify
from bcos_plugins.data import load_sst2
from bcos_plugins.data.ag_news import load_ag_news
from bcos_plugins.metrics import PerturbationCurves, paired_accuracy_difference
from bcos_plugins.metrics.paired import NoSpreadError, constant_difference, paired_bootstrap_difference
from bcos_plugins.pretrain import BCOS_STAGE_SCHEDULE, TASK_THEN_BCOS_PRESET_STAGES
from bcos_plugins.pretrained import minilm_path
from bcos_plugins.train import fine_tune_classifier
from benchmarks.common.faithfulness import (
    DEVICE,
    MAX_LENGTH,
    MethodResult,
    encode,
    evaluate_seqpg,
    evaluate_sst2,
    make_bcos_methods,
    make_methods,
    predictions,
    seqpg_examples,
)
from benchmarks.common.settings import (
    env_choices,
    env_float,
    env_int,
    env_numbers,
    env_path,
    settings_from_argv,
)

SHARED_DATA = ROOT.parent / "shared" / "data"
CONVENTIONAL = "conventional"
POSITIVE = {"minimum": 0, "exclusive_minimum": True}
# --quick: a smoke test of every step (a variable set explicitly wins). 3 epochs: after 1 epoch on 64 rows MiniLM
# predicts one AG News class everywhere, and SeqPG needs correctly classified segments of two classes.
QUICK = {"BENCH_FRONTIER_B": "1.25", "BENCH_FRONTIER_QK": "stock", "BENCH_FRONTIER_START": "task-then-bcos",
         "BENCH_FRONTIER_SEEDS": "0", "BENCH_TRAIN": "32", "BENCH_AG_TRAIN": "64", "BENCH_AG_EVAL": "100",
         "BENCH_EPOCHS": "3", "BENCH_EVAL": "6", "BENCH_SEQPG": "3", "BENCH_SEGMENT": "8", "BENCH_IG_STEPS": "4",
         "BENCH_SHAPLEY_SAMPLES": "2", "BENCH_LIME_SAMPLES": "10", "BENCH_ACC_TEST": "40",
         "BENCH_SEQPG_MIN_CONF": "0", "BENCH_FRONTIER_BOOTSTRAP": "200", "BENCH_FRONTIER_MIN_WORDS": "3"}
# CPU seconds per cell before any cell of a kind is measured (one torch thread). Derived from bench_faithfulness's
# run of 2026-11-25 (docs/benchmarks.md: four MiniLM fine-tunings of 1,200 + 600 rows x 2 epochs in 398 CPU s, about
# 0.055 CPU s per training row and epoch; explaining 16 sentences with 11 methods, Shapley sampling at 10 samples
# dominating, 275 s). Per-sentence costs are rough (SST-2 dev sentences are shorter than the shipped test slice;
# AG News texts are cut to 2 x BENCH_SEGMENT tokens); B-cos training is counted at 1.5x a conventional step.
ESTIMATE = {"train_row_epoch": 0.055, "bcos_training_factor": 1.5, "posthoc_per_sentence": 1.5,
            "posthoc_per_seqpg_example": 3.0, "bcos_per_sentence": 0.05, "accuracy_per_row": 0.003}
POSTHOC_PREFIXES = ("IG (", "ShapSampl", "LIME", "Occlusion")  # IG only with the [MASK] baseline (below)
METRICS = {"comp": ("sst2", "Comp", True), "suff": ("sst2", "Suff", False), "seqpg": ("ag_news", "SeqPG", True)}
# Schedules of the B-cos training (BENCH_FRONTIER_SCHEDULE), as changes to bcos_model's fine_tune_classifier call:
# ``epochs_factor`` multiplies BENCH_EPOCHS for the B-cos stage only (the conventional model is not retrained);
# ``distill_weight`` adds distillation from the seed's conventional model (fine_tune_classifier's teacher=).
# "default" is the recipe's (BCOS_STAGE_SCHEDULE at BENCH_BCOS_LR for BENCH_EPOCHS) and keeps the setting names, so
# its cells are the ones measured before schedules existed; another schedule's name enters the setting's name.
# "long-distilled": twice the epochs and distillation at weight 1, chosen for B = 1.5 on AG News seed 0 on held-out
# training-region rows (600-1600 of ag_news/dev.tsv, conventional 88.6 %): the default schedule's 76 steps over 600
# rows reach 72.7 % there (a faster head too), twice the epochs 83.0 % (81.9 % with a B warm-up from 1), distillation
# alone 78.0 %, both 86.2 % (85.6 % at weight 3; 86.3 % at three times the epochs, so twice suffices).
# It is the B-cos stage of fine_tune_task_then_bcos(preset="faithful"): its epochs are read from the preset table so
# that the two cannot drift apart; weight 1 is fine_tune_classifier's default, which the preset uses.
_PRESET_EPOCHS = {name: stage["epochs"] for name, stage in TASK_THEN_BCOS_PRESET_STAGES.items()}
SCHEDULES = {"default": {}, "long-distilled": {"epochs_factor": _PRESET_EPOCHS["faithful"] / _PRESET_EPOCHS["accurate"],
                                               "distill_weight": 1.0}}


@dataclass(frozen=True)
class Config:
    b_values: tuple = (1.1, 1.25, 1.5, 2.0)
    query_keys: tuple = ("stock", "bcos")
    starts: tuple = ("task-then-bcos", "bcos-directly")
    seeds: tuple = (0, 1, 2)
    datasets: tuple = ("sst2", "ag_news")
    schedules: tuple = ("default",)
    model: Path | None = None
    sst2: Path = SHARED_DATA / "sst2"
    ag_news: Path = SHARED_DATA / "ag_news"
    n_train: int = 1200
    n_ag_train: int = 600
    n_ag_eval: int = 2000
    epochs: float = 2.0
    train_batch: int = 16
    conv_lr: float = 1e-4
    bcos_lr: float = 2e-4
    bcos_head_lr: float = 1e-3
    n_eval: int = 400
    min_words: int = 5
    n_seqpg: int = 200
    segment: int = 20
    batch: int = 8
    ig_steps: int = 50
    shapley_samples: int = 10
    lime_samples: int = 100
    min_confidence: float = 0.75
    n_acc: int = 0
    bootstrap: int = 2000
    threads: int = 0
    perturbations_per_eval: int = 0
    out: Path = Path("outputs/bench_frontier")

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            b_values=env_numbers("BENCH_FRONTIER_B", cls.b_values, minimum=1),
            query_keys=env_choices("BENCH_FRONTIER_QK", cls.query_keys, ("stock", "bcos")),
            starts=env_choices("BENCH_FRONTIER_START", cls.starts, ("task-then-bcos", "bcos-directly")),
            seeds=env_numbers("BENCH_FRONTIER_SEEDS", cls.seeds, kind=int, minimum=0),
            datasets=env_choices("BENCH_FRONTIER_DATA", cls.datasets, ("sst2", "ag_news")),
            schedules=env_choices("BENCH_FRONTIER_SCHEDULE", cls.schedules, tuple(SCHEDULES)),
            model=env_path("BENCH_FRONTIER_MODEL", minilm_path()),
            sst2=env_path("BENCH_FRONTIER_SST2", cls.sst2),
            ag_news=env_path("BENCH_FRONTIER_AG_NEWS", cls.ag_news),
            n_train=env_int("BENCH_TRAIN", cls.n_train, minimum=1),
            n_ag_train=env_int("BENCH_AG_TRAIN", cls.n_ag_train, minimum=1),
            n_ag_eval=env_int("BENCH_AG_EVAL", cls.n_ag_eval, minimum=1),
            epochs=env_float("BENCH_EPOCHS", cls.epochs, **POSITIVE),
            train_batch=env_int("BENCH_TRAIN_BATCH", cls.train_batch, minimum=1),
            conv_lr=env_float("BENCH_CONV_LR", cls.conv_lr, **POSITIVE),
            bcos_lr=env_float("BENCH_BCOS_LR", cls.bcos_lr, **POSITIVE),
            bcos_head_lr=env_float("BENCH_BCOS_HEAD_LR", cls.bcos_head_lr, **POSITIVE),
            n_eval=env_int("BENCH_EVAL", cls.n_eval, minimum=1),
            min_words=env_int("BENCH_FRONTIER_MIN_WORDS", cls.min_words, minimum=1),
            n_seqpg=env_int("BENCH_SEQPG", cls.n_seqpg, minimum=1),
            segment=env_int("BENCH_SEGMENT", cls.segment, minimum=1),
            batch=env_int("BENCH_BATCH", cls.batch, minimum=1),
            ig_steps=env_int("BENCH_IG_STEPS", cls.ig_steps, minimum=1),
            shapley_samples=env_int("BENCH_SHAPLEY_SAMPLES", cls.shapley_samples, minimum=1),
            lime_samples=env_int("BENCH_LIME_SAMPLES", cls.lime_samples, minimum=1),
            min_confidence=env_float("BENCH_SEQPG_MIN_CONF", cls.min_confidence, minimum=0, maximum=1),
            n_acc=env_int("BENCH_ACC_TEST", cls.n_acc, minimum=0),
            bootstrap=env_int("BENCH_FRONTIER_BOOTSTRAP", cls.bootstrap, minimum=100),
            threads=env_int("BENCH_THREADS", cls.threads, minimum=0),
            perturbations_per_eval=env_int("BENCH_PERTURBATIONS_PER_EVAL", cls.perturbations_per_eval, minimum=0),
            out=env_path("BENCH_OUT", cls.out),
        )

    def key(self, dataset: str) -> str:
        """A hash of every setting that changes a cell's numbers on ``dataset`` (not the grid, the output folder,
        the threads, the forward-call grouping, the bootstrap or the other data set's sizes, which only select cells,
        change the report or change a number by floating-point rounding at most)."""
        ignored = {"b_values", "query_keys", "starts", "seeds", "datasets", "schedules", "out", "threads",
                   "perturbations_per_eval", "bootstrap"}
        ignored |= AG_NEWS_ONLY if dataset == "sst2" else SST2_ONLY
        changing = {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name not in ignored}
        return hashlib.sha256(json.dumps(changing, sort_keys=True).encode()).hexdigest()[:12]


SST2_ONLY = {"sst2", "n_train", "n_eval", "min_words"}
AG_NEWS_ONLY = {"ag_news", "n_ag_train", "n_ag_eval", "n_seqpg", "segment", "min_confidence"}


def config_from(argv: list[str]) -> Config:
    """The environment, over the quick preset with --quick / BENCH_FRONTIER_QUICK=1."""
    cfg = settings_from_argv(argv, "bench_frontier.py", "--quick", "BENCH_FRONTIER_QUICK", QUICK, Config.from_env)
    for name, folder, file in (("BENCH_FRONTIER_SST2", cfg.sst2, "train.tsv"), ("BENCH_FRONTIER_SST2", cfg.sst2,
                               "dev.tsv"), ("BENCH_FRONTIER_AG_NEWS", cfg.ag_news, "dev.tsv")):
        if not (folder / file).is_file():
            raise SystemExit(f"{name}={str(folder)!r}: no {file} there. Set {name} to the folder of the shared "
                             f"data set (../shared/data/{folder.name} next to the repository).")
    if not (cfg.model / "config.json").is_file():
        raise SystemExit(f"BENCH_FRONTIER_MODEL={str(cfg.model)!r}: no config.json there. Set it to a folder "
                         "saved by save_pretrained (a stock BERT classifier and its tokenizer), or unset it.")
    return cfg


# ---------------------------------------------------------------- settings and cells


@dataclass(frozen=True)
class Setting:
    b: float | None = None  # None: the conventional model
    query_key: str = ""
    start: str = ""
    schedule: str = "default"

    @property
    def name(self) -> str:
        if self.b is None:
            return CONVENTIONAL
        own_schedule = "" if self.schedule == "default" else f"-{self.schedule}"
        return f"B{self.b:g}-{self.query_key}qk-{self.start}{own_schedule}"


def grid(cfg: Config) -> list[Setting]:
    return [Setting(b, qk, start, schedule) for schedule in cfg.schedules for start in cfg.starts
            for qk in cfg.query_keys for b in cfg.b_values]


def cell_file(cfg: Config, setting: Setting, seed: int, dataset: str) -> Path:
    return cfg.out / "cells" / dataset / cfg.key(dataset) / f"{setting.name}-seed{seed}.json"


def data(cfg: Config, dataset: str):
    """(training texts, labels), (accuracy texts, labels), the explained texts or evaluation pool, number of
    classes."""
    if dataset == "sst2":
        train = load_sst2(path=cfg.sst2 / "train.tsv", n=cfg.n_train)
        dev = load_sst2(path=cfg.sst2 / "dev.tsv")
        acc = (dev.texts, dev.labels) if cfg.n_acc <= 0 else (dev.texts[: cfg.n_acc], dev.labels[: cfg.n_acc])
        explained = [t for t in dev.texts if len(t.split()) >= cfg.min_words][: cfg.n_eval]
        if len(explained) < cfg.n_eval:
            print(f"BENCH_EVAL={cfg.n_eval}: the SST-2 dev split has {len(explained)} sentences of at least "
                  f"{cfg.min_words} words; using all of them")
        return (train.texts, train.labels), acc, explained, 2
    rows = load_ag_news(path=cfg.ag_news / "dev.tsv")
    if cfg.n_ag_train + cfg.n_ag_eval > len(rows.texts):
        raise SystemExit(f"BENCH_AG_TRAIN={cfg.n_ag_train} + BENCH_AG_EVAL={cfg.n_ag_eval} exceed the "
                         f"{len(rows.texts)} rows of {cfg.ag_news / 'dev.tsv'}: training and evaluation rows would "
                         "overlap. Lower one of them.")
    train = (rows.texts[: cfg.n_ag_train], rows.labels[: cfg.n_ag_train])
    pool = type(rows)(rows[-cfg.n_ag_eval:], rows.label_names)
    acc = (pool.texts[: cfg.n_acc], pool.labels[: cfg.n_acc]) if cfg.n_acc > 0 else (pool.texts, pool.labels)
    return train, acc, pool, 4


def conventional_model(cfg: Config, seed: int, dataset: str, train, num_labels: int, tokenizer):
    """The seed's conventional classifier, trained once and kept under BENCH_OUT/models (the B-cos cells of the
    seed start from it or pick SeqPG examples with it); returns (model, trained now)."""
    folder = cfg.out / "models" / dataset / cfg.key(dataset) / f"{CONVENTIONAL}-seed{seed}"
    if (folder / "config.json").is_file():
        return BertForSequenceClassification.from_pretrained(folder, attn_implementation="eager").to(DEVICE).eval(), \
            False
    model = BertForSequenceClassification.from_pretrained(cfg.model, num_labels=num_labels,
                                                          attn_implementation="eager")
    fine_tune_classifier(model, tokenizer, *train, epochs=cfg.epochs, batch_size=cfg.train_batch,
                         learning_rate=cfg.conv_lr, max_length=MAX_LENGTH, progress=False, seed=seed)
    model.save_pretrained(folder)
    return model.to(DEVICE).eval(), True


def bcos_model(cfg: Config, setting: Setting, seed: int, train, num_labels: int, tokenizer, conventional):
    """``task-then-bcos``: the second stage of ``fine_tune_task_then_bcos`` on a copy of the seed's conventional
    model (its first stage, shared); ``bcos-directly``: the pretrained model bcosified and fine-tuned with BCE; either
    under the setting's schedule (SCHEDULES)."""
    if setting.start == "task-then-bcos":
        model, head_lr = copy.deepcopy(conventional).train(), None
    else:
        model = BertForSequenceClassification.from_pretrained(cfg.model, num_labels=num_labels,
                                                              attn_implementation="eager")
        head_lr = cfg.bcos_head_lr  # a fresh head: B-cos logits grow only as it aligns (docs/recipes.md)
    bcosify(model, b=setting.b, bcos_query_key=setting.query_key == "bcos", verbose=False)
    schedule = SCHEDULES[setting.schedule]
    distillation = {"teacher": conventional, "distill_weight": schedule["distill_weight"]} \
        if "distill_weight" in schedule else {}
    fine_tune_classifier(model, tokenizer, *train, epochs=cfg.epochs * schedule.get("epochs_factor", 1.0),
                         batch_size=cfg.train_batch, learning_rate=cfg.bcos_lr, head_learning_rate=head_lr,
                         max_length=MAX_LENGTH, progress=False, seed=seed, **distillation, **BCOS_STAGE_SCHEDULE)
    return model.to(DEVICE).eval()


def posthoc_methods(conv, mask_id: int, cfg: Config) -> dict:
    """The best post-hoc methods of docs/benchmarks.md, from the shared table (IG only with the [MASK] baseline)."""
    every = make_methods(conv, None, mask_id, cfg)
    return {name: m for name, m in every.items()
            if name.startswith(POSTHOC_PREFIXES) and (not name.startswith("IG (") or "[MASK]" in name)}


def method_record(res: MethodResult) -> dict:
    """Per-unit values of one method in one cell (sentences in the shared length order, or SeqPG examples)."""
    record = {"seconds": res.seconds + res.seqpg_seconds}
    if res.curves:
        curves = PerturbationCurves.concatenate(res.curves)
        record.update(comp=(100 * curves.comprehensiveness_aopc).tolist(),
                      suff=(100 * curves.sufficiency_aopc).tolist(), entropy=torch.cat(res.entropy).tolist())
    if res.seqpg:
        split = 100 * torch.cat(res.seqpg)
        record.update(seqpg=split[:, 0].tolist(), seqpg_wrong=split[:, 1].tolist())
    return record


def run_cell(cfg: Config, setting: Setting, seed: int, dataset: str, tokenizer) -> dict:
    """Train (or reload) the cell's model, measure its accuracy and its explanations; write the cell's file."""
    cpu, wall = time.process_time(), time.perf_counter()
    torch.manual_seed(seed)
    train, (acc_texts, acc_labels), explained, num_labels = data(cfg, dataset)
    conv, trained = conventional_model(cfg, seed, dataset, train, num_labels, tokenizer)
    if setting.b is None:
        model, kind, methods = conv, "conventional", posthoc_methods(conv, tokenizer.mask_token_id, cfg)
    else:
        model, kind = bcos_model(cfg, setting, seed, train, num_labels, tokenizer, conv), "bcos"
        methods = {"B-cos": make_bcos_methods(model)["B-cos"]}
        trained = True
    ids, mask = encode(tokenizer, acc_texts)
    predicted = predictions(model, ids, mask).tolist()
    file = cell_file(cfg, setting, seed, dataset)
    if dataset == "sst2":
        def evaluate(one: dict, results: dict) -> None:
            evaluate_sst2(one, {kind: model}, tokenizer, explained, cfg, results)
        n_units = len(explained)
    else:
        examples = seqpg_examples(conv, None, tokenizer, explained, cfg)
        if examples is None:
            raise SystemExit(f"seed {seed}: no SeqPG examples from the conventional AG News model (above); lower "
                             "BENCH_SEQPG_MIN_CONF or train longer (BENCH_EPOCHS, BENCH_AG_TRAIN)")

        def evaluate(one: dict, results: dict) -> None:
            evaluate_seqpg(one, {kind: model}, tokenizer, examples, cfg, results)
        n_units = len(examples)
    records, cpu_before = evaluate_resumably(methods, evaluate, file.with_suffix(PROGRESS_SUFFIX))
    cell = {"setting": setting.name, "b": setting.b, "query_key": setting.query_key, "start": setting.start,
            "schedule": setting.schedule, "seed": seed, "dataset": dataset, "n_units": n_units,
            "labels": list(acc_labels), "predictions": predicted,
            "accuracy": sum(p == y for p, y in zip(predicted, acc_labels, strict=True)) / len(acc_labels),
            "trained": trained,
            "methods": records,
            "cpu_seconds": cpu_before + time.process_time() - cpu, "wall_seconds": time.perf_counter() - wall,
            "settings": {k: str(v) for k, v in asdict(cfg).items()}}
    _write_atomically(file, cell)
    file.with_suffix(PROGRESS_SUFFIX).unlink(missing_ok=True)
    return cell


# a cell's methods finished so far (with the random state after the last and their CPU time), next to the cell file
# under another suffix than .json, so that finished_cells never reads it as a cell
PROGRESS_SUFFIX = ".progress"


def evaluate_resumably(methods: dict, evaluate, progress: Path) -> tuple[dict, float]:
    """({method: method_record}, CPU seconds of the methods an earlier, stopped run finished) for ``methods``,
    evaluated one at a time by ``evaluate({name: method}, results)`` in their order.

    After each method its record, torch's random state and the CPU time so far are saved to ``progress``; a rerun
    takes the finished methods from there and restores the random state before the next one, so a cell stopped
    between methods (a post-hoc cell of AG News costs CPU-hours) resumes at the next method with the numbers an
    uninterrupted run gives. Evaluating the methods one call each draws the same random numbers as one call for
    all of them (the calls share nothing else), so the cells measured before this existed are the same kind.
    """
    cpu = time.process_time()
    saved = json.loads(progress.read_text(encoding="utf-8")) if progress.is_file() else {}
    records = {name: record for name, record in saved.get("methods", {}).items() if name in methods}
    cpu_before = float(saved.get("cpu_seconds", 0.0))
    if records:
        print(f"  resuming: {', '.join(records)} finished by an earlier run", flush=True)
        torch.set_rng_state(torch.tensor(saved["rng_state"], dtype=torch.uint8))
        if saved.get("cuda_rng_states"):
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in saved["cuda_rng_states"]])
    for name, method in methods.items():
        if name in records:
            continue
        results: dict[str, MethodResult] = {}
        evaluate({name: method}, results)
        records.update({n: method_record(res) for n, res in results.items()})
        cuda_states = [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
        _write_atomically(progress, {"methods": records, "rng_state": torch.get_rng_state().tolist(),
                                     "cuda_rng_states": cuda_states,
                                     "cpu_seconds": cpu_before + time.process_time() - cpu})
    return {name: records[name] for name in methods}, cpu_before


def _write_atomically(file: Path, content: dict) -> None:
    """A run stopped mid-write leaves no half file that a rerun would take as finished."""
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_suffix(".partial")
    partial.write_text(json.dumps(content), encoding="utf-8")
    partial.replace(file)


# ---------------------------------------------------------------- budget


def estimate_seconds(cfg: Config, setting: Setting, dataset: str) -> float:
    rows = cfg.n_train if dataset == "sst2" else cfg.n_ag_train
    train = ESTIMATE["train_row_epoch"] * rows * cfg.epochs
    acc_rows = cfg.n_acc if cfg.n_acc > 0 else (6735 if dataset == "sst2" else cfg.n_ag_eval)
    seconds = ESTIMATE["accuracy_per_row"] * acc_rows
    units = cfg.n_eval if dataset == "sst2" else 2 * cfg.n_seqpg
    if setting.b is None:
        per_unit = ESTIMATE["posthoc_per_sentence" if dataset == "sst2" else "posthoc_per_seqpg_example"]
        return seconds + train + per_unit * units
    train *= SCHEDULES[setting.schedule].get("epochs_factor", 1.0)
    return seconds + ESTIMATE["bcos_training_factor"] * train + ESTIMATE["bcos_per_sentence"] * units


def budget(cfg: Config, todo: list[tuple[Setting, int, str]], done: list[dict]) -> tuple[float, str]:
    """CPU seconds for the cells to do: the mean measured per (model kind, dataset, schedule) where a finished cell
    of this configuration measured one, else the documented estimate (cells written before schedules existed are
    the default schedule's)."""
    measured: dict[tuple[bool, str, str], list[float]] = {}
    for cell in done:
        kind = (cell["b"] is None, cell["dataset"], cell.get("schedule", "default"))
        measured.setdefault(kind, []).append(cell["cpu_seconds"])
    total, sources = 0.0, set()
    for setting, _, dataset in todo:
        seen = measured.get((setting.b is None, dataset, setting.schedule))
        total += sum(seen) / len(seen) if seen else estimate_seconds(cfg, setting, dataset)
        sources.add("measured" if seen else "estimated")
    return total, " and ".join(sorted(sources)) or "nothing to do"


def budget_wording(seconds: float, source: str, device: torch.device = DEVICE) -> str:
    """How the budget reads: its seconds are CPU seconds of one torch thread (ESTIMATE, and what finished cells
    measured with process_time), about the wall time of a CPU run but far more than a GPU run takes."""
    if device.type == "cuda":
        return (f"about {seconds / 3600:.2f} CPU-hours ({source}; a CPU-time estimate for one torch thread: this run "
                f"is on {device.type}, so it takes much less wall time)")
    return f"about {seconds / 3600:.2f} CPU-hours ({source}; one torch thread, so about the wall time on an idle core)"


# ---------------------------------------------------------------- report


def aggregate(cells: list[dict], cfg: Config) -> tuple[list[dict], list[dict]]:
    """(one row per B-cos setting, one row per post-hoc method) from the finished cells."""
    by = {(c["setting"], c["seed"], c["dataset"]): c for c in cells}
    conv = {(seed, ds): by[(CONVENTIONAL, seed, ds)] for (s, seed, ds) in by if s == CONVENTIONAL}
    posthoc_rows = []
    names = sorted({name for c in conv.values() for name in c["methods"]})
    means = {}
    for name in names:
        row = {"setting": f"post-hoc: {name}", "model": "conventional MiniLM"}
        for metric, (ds, _, _) in METRICS.items():
            values = [v for (seed, d), c in conv.items() if d == ds for v in c["methods"].get(name, {}).get(metric, [])]
            row[metric] = sum(values) / len(values) if values else float("nan")
            means[(name, metric)] = row[metric]
        for ds in ("sst2", "ag_news"):
            accs = [c["accuracy"] for (seed, d), c in conv.items() if d == ds]
            row[f"{ds}_accuracy"] = 100 * sum(accs) / len(accs) if accs else float("nan")
        ent = [v for (seed, d), c in conv.items() if d == "sst2" for v in c["methods"].get(name, {}).get("entropy", [])]
        wrong = [v for (seed, d), c in conv.items() if d == "ag_news"
                 for v in c["methods"].get(name, {}).get("seqpg_wrong", [])]
        row["entropy"] = sum(ent) / len(ent) if ent else float("nan")
        row["seqpg_wrong_segment"] = sum(wrong) / len(wrong) if wrong else float("nan")
        posthoc_rows.append(row)
    best, tied = {}, {}
    for metric, (_, _, higher) in METRICS.items():
        found, others = best_posthoc({n: means[(n, metric)] for n in names}, higher)
        if found is not None:
            best[metric], tied[metric] = found, others
    rows = []
    for setting in grid(cfg):
        row = {"setting": setting.name, "b": setting.b, "query_key": setting.query_key, "start": setting.start,
               "schedule": setting.schedule}
        seeds_done = sorted({seed for (s, seed, ds) in by if s == setting.name})
        if not seeds_done:
            continue
        row["seeds"] = " ".join(map(str, seeds_done))
        for ds in ("sst2", "ag_news"):
            pairs = [(conv[(seed, ds)], by[(setting.name, seed, ds)]) for seed in seeds_done
                     if (setting.name, seed, ds) in by and (seed, ds) in conv]
            row[f"{ds}_accuracy"] = row[f"{ds}_accuracy_diff"] = row[f"{ds}_accuracy_low"] = \
                row[f"{ds}_accuracy_high"] = float("nan")
            if pairs:
                row.update(_accuracy_columns(pairs, ds))
        for metric, (ds, _, _) in METRICS.items():
            pairs = [(conv[(seed, ds)], by[(setting.name, seed, ds)]) for seed in seeds_done
                     if (setting.name, seed, ds) in by and (seed, ds) in conv]
            bcos_values = [v for _, b in pairs for v in b["methods"]["B-cos"][metric]]
            row[metric] = sum(bcos_values) / len(bcos_values) if bcos_values else float("nan")
            row[f"best_posthoc_{metric}"] = best.get(metric, "")
            row[f"best_posthoc_{metric}_tied"] = "; ".join(tied.get(metric, []))
            row.update(_metric_columns(pairs, metric, best.get(metric), cfg))
        ent = [v for s in seeds_done if (setting.name, s, "sst2") in by
               for v in by[(setting.name, s, "sst2")]["methods"]["B-cos"]["entropy"]]
        wrong = [v for s in seeds_done if (setting.name, s, "ag_news") in by
                 for v in by[(setting.name, s, "ag_news")]["methods"]["B-cos"]["seqpg_wrong"]]
        row["entropy"] = sum(ent) / len(ent) if ent else float("nan")
        row["seqpg_wrong_segment"] = sum(wrong) / len(wrong) if wrong else float("nan")
        rows.append(row)
    return rows, posthoc_rows


def best_posthoc(means: dict[str, float], higher: bool) -> tuple[str | None, list[str]]:
    """The best post-hoc method on one metric from its pooled means (``higher``: Comp / SeqPG; else Suff, lower is
    better), and the methods tied with it; ``(None, [])`` when no mean is a number (NaN means are skipped).

    Tie rule: methods whose pooled means equal the best exactly are tied; the first of them by name is the best,
    whichever direction the metric runs (``max`` over (mean, name) took the last name, ``min`` the first), and the
    others are returned so that the report names them (``best_posthoc_<metric>_tied`` and the notes under the
    table). A tie moves no mean but can move the Δ's interval, which is paired with the chosen method's units.
    """
    finite = {name: mean for name, mean in means.items() if mean == mean}
    if not finite:
        return None, []
    top = (max if higher else min)(finite.values())
    tied = sorted(name for name, mean in finite.items() if mean == top)
    return tied[0], tied[1:]


def _accuracy_columns(pairs: list[tuple[dict, dict]], dataset: str) -> dict:
    """B-cos accuracy and its paired difference from the conventional model over ``pairs`` ((conventional cell,
    B-cos cell) of the same seed): an interval over seeds (t) with two or more, else over examples."""
    labels = pairs[0][0]["labels"]
    try:
        paired = paired_accuracy_difference([a["predictions"] for a, _ in pairs], [b["predictions"] for _, b in pairs],
                                            labels)
    except NoSpreadError:
        # two or more seeds with the same difference leave no spread over seeds for an interval: the accuracy is
        # reported, the difference and its interval are not ("–"). Only that refusal: any BcosValueError showed an
        # input error (a label of -1, predictions of another length) as "–" and the run went on
        accuracy = [sum(p == y for p, y in zip(b["predictions"], labels, strict=True)) / len(labels) for _, b in pairs]
        nan = float("nan")
        return {f"{dataset}_accuracy": 100 * sum(accuracy) / len(pairs), f"{dataset}_accuracy_diff": nan,
                f"{dataset}_accuracy_low": nan, f"{dataset}_accuracy_high": nan}
    return {f"{dataset}_accuracy": 100 * sum(paired.accuracy_b) / len(pairs),
            f"{dataset}_accuracy_diff": 100 * paired.difference,
            f"{dataset}_accuracy_low": 100 * paired.ci_low, f"{dataset}_accuracy_high": 100 * paired.ci_high}


def _metric_columns(pairs: list[tuple[dict, dict]], metric: str, best: str | None, cfg: Config) -> dict:
    """B-cos minus the post-hoc method ``best`` on ``metric`` over the pooled (seed, unit) pairs of ``pairs``, with
    its paired bootstrap interval (NaN without B-cos values or a best method)."""
    columns = {f"{metric}_diff": float("nan"), f"{metric}_low": float("nan"), f"{metric}_high": float("nan")}
    bcos_values = [v for _, b in pairs for v in b["methods"]["B-cos"][metric]]
    if bcos_values and best:
        reference = [v for a, _ in pairs for v in a["methods"][best][metric]]
        constant = constant_difference(reference, bcos_values)
        if constant is not None:
            # the same difference on every unit (a saturated metric), to the library's rounding tolerance, which
            # paired_bootstrap_difference refuses: the difference without an interval, which would have zero width
            # ("–", as _accuracy_columns reports seeds without spread)
            columns.update({f"{metric}_diff": constant, f"{metric}_units": len(bcos_values)})
            return columns
        interval = paired_bootstrap_difference(reference, bcos_values, n_resamples=cfg.bootstrap)
        columns.update({f"{metric}_diff": interval.difference, f"{metric}_low": interval.ci_low,
                        f"{metric}_high": interval.ci_high, f"{metric}_units": interval.n_units})
    return columns


def seed_rows(rows: list[dict], cells: list[dict], cfg: Config) -> list[dict]:
    """One row per (B-cos setting, seed) of ``rows``: the same differences as the pooled row, each seed's cells
    alone, against the pooled best post-hoc method, so that training noise shows (the pooled interval covers the
    sampling of sentences only)."""
    by = {(c["setting"], c["seed"], c["dataset"]): c for c in cells}
    out = []
    for row in rows:
        for seed in map(int, row["seeds"].split()):
            seed_row = {"setting": row["setting"], "seed": seed}
            for ds in ("sst2", "ag_news"):
                pair = [(by[(CONVENTIONAL, seed, ds)], by[(row["setting"], seed, ds)])] \
                    if (CONVENTIONAL, seed, ds) in by and (row["setting"], seed, ds) in by else []
                seed_row.update(_accuracy_columns(pair, ds) if pair else {f"{ds}_accuracy_diff": float("nan")})
                for metric in (m for m, (d, _, _) in METRICS.items() if d == ds):
                    seed_row.update(_metric_columns(pair, metric, row.get(f"best_posthoc_{metric}"), cfg))
            out.append(seed_row)
    return out


def _num(value, digits: int = 1) -> str:
    return "–" if not isinstance(value, int | float) or value != value else f"{value:.{digits}f}"


def _interval(row: dict, key: str) -> str:
    if row.get(f"{key}_diff") != row.get(f"{key}_diff"):
        return "–"
    if row.get(f"{key}_low") != row.get(f"{key}_low"):  # the same difference on every unit: no interval to give
        return f"{row[f'{key}_diff']:+.1f} [no interval]"
    return f"{row[f'{key}_diff']:+.1f} [{row[f'{key}_low']:+.1f}, {row[f'{key}_high']:+.1f}]"


def write_report(rows: list[dict], posthoc: list[dict], cfg: Config, cells: list[dict]) -> None:
    cfg.out.mkdir(parents=True, exist_ok=True)
    everything = rows + posthoc
    columns = list(dict.fromkeys(k for r in everything for k in r))
    with (cfg.out / "results.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(everything)
    lines = ["| setting | seeds | acc SST-2 (Δ conv.) | acc AG News (Δ conv.) | Comp ↑ | Δ Comp vs best [95 %] | "
             "Suff ↓ | Δ Suff vs best [95 %] | SeqPG ↑ | Δ SeqPG vs best [95 %] | entropy | SeqPG wrong segment |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['seeds']} | {_num(r['sst2_accuracy'])} ({_interval(r, 'sst2_accuracy')}) "
                     f"| {_num(r['ag_news_accuracy'])} ({_interval(r, 'ag_news_accuracy')}) | {_num(r['comp'], 2)} | "
                     f"{_interval(r, 'comp')} | {_num(r['suff'], 2)} | {_interval(r, 'suff')} | "
                     f"{_num(r['seqpg'])} | {_interval(r, 'seqpg')} | {_num(r['entropy'], 2)} | "
                     f"{_num(r['seqpg_wrong_segment'])} |")
    for r in posthoc:
        lines.append(f"| {r['setting']} | | {_num(r['sst2_accuracy'])} | {_num(r['ag_news_accuracy'])} | "
                     f"{_num(r['comp'], 2)} | | {_num(r['suff'], 2)} | | {_num(r['seqpg'])} | | "
                     f"{_num(r['entropy'], 2)} | {_num(r['seqpg_wrong_segment'])} |")
    best = {m: rows[0].get(f"best_posthoc_{m}", "") + (f" (tied with {tied}; the first by name)"
                                                       if (tied := rows[0].get(f"best_posthoc_{m}_tied")) else "")
            for m in METRICS} if rows else {}
    units = {ds: sorted({c["n_units"] for c in cells if c["dataset"] == ds}) for ds in ("sst2", "ag_news")}
    notes = (
        f"\nSettings keys {', '.join(f'{d} {cfg.key(d)}' for d in cfg.datasets)}; {len(cells)} cells. Δ: B-cos minus the best post-hoc method on the "
        f"conventional MiniLM of the same seeds ({', '.join(f'{m}: {n}' for m, n in best.items() if n)}), mean over "
        f"the pooled (seed, sentence) pairs with a {cfg.bootstrap}-resample paired bootstrap 95 % interval (sampling of "
        "the sentences only, not training noise). Suff: lower is better, so a negative Δ is a B-cos lead. Accuracy Δ: "
        "points against the conventional model, interval over seeds (t) with two or more seeds, else over examples. "
        f"Comp/Suff: AOPC x100 (unnormalised area, p = 0.1..0.9) on {units['sst2']} SST-2 dev sentences of at least "
        f"{cfg.min_words} words; SeqPG x100 on {units['ag_news']} AG News examples of 2 x {cfg.segment} tokens "
        f"(segments the conventional model classifies with probability >= {cfg.min_confidence:g}). Entropy: of the "
        "SST-2 explanations (bcos_plugins.metrics.explanation_entropy over each sentence's tokens without "
        "[CLS]/[SEP]). Wrong segment: the share (x100) of the positive SeqPG evidence on the other class's segment.\n")
    if len({seed for r in rows for seed in r["seeds"].split()}) > 1:  # with one seed the table repeats the above
        per_seed = seed_rows(rows, cells, cfg)
        notes += ("\nPer seed (the same Δ, each seed's cells alone, against the pooled best post-hoc method):\n\n"
                  "| setting | seed | Δ acc SST-2 | Δ acc AG News | Δ Comp [95 %] | Δ Suff [95 %] | Δ SeqPG [95 %] |\n"
                  "|---|---|---|---|---|---|---|\n")
        notes += "".join(f"| {r['setting']} | {r['seed']} | {_interval(r, 'sst2_accuracy')} | "
                         f"{_interval(r, 'ag_news_accuracy')} | {_interval(r, 'comp')} | {_interval(r, 'suff')} | "
                         f"{_interval(r, 'seqpg')} |\n" for r in per_seed)
    (cfg.out / "results.md").write_text("\n".join(lines) + "\n" + notes, encoding="utf-8")


def plot(rows: list[dict], posthoc: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (metric, (ds, label, higher)) in zip(axes, METRICS.items(), strict=True):
        acc_key = f"{ds}_accuracy"
        for r in rows:
            if r[metric] == r[metric] and r[acc_key] == r[acc_key]:
                ax.scatter(r[metric], r[acc_key], marker="o" if r["start"] == "task-then-bcos" else "s",
                           color="tab:green" if r["query_key"] == "stock" else "tab:purple")
                own_schedule = "" if r["schedule"] == "default" else f" {r['schedule']}"
                ax.annotate(f"B{r['b']:g}{own_schedule}", (r[metric], r[acc_key]), fontsize=7)
        for i, r in enumerate(posthoc):
            if r[metric] == r[metric]:
                ax.axvline(r[metric], color=colours[i % len(colours)], linestyle="--", linewidth=1,
                           label=r["setting"].removeprefix("post-hoc: "))
        conv_acc = [r[acc_key] for r in posthoc if r[acc_key] == r[acc_key]]
        if conv_acc:
            ax.axhline(conv_acc[0], color="gray", linestyle=":", label="conventional accuracy")
        ax.set_xlabel(f"{label} x100 ({'higher' if higher else 'lower'} is better)")
        ax.set_ylabel(f"accuracy {'SST-2' if ds == 'sst2' else 'AG News'} (%)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("B-cos settings (green: stock query/key, purple: B-cos query/key; o task then B-cos, "
                 "■ B-cos directly) against post-hoc methods on the conventional MiniLM (dashed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "frontier.png", dpi=110)
    plt.close(fig)


def finished_cells(cfg: Config) -> list[dict]:
    return [json.loads(f.read_text(encoding="utf-8")) for dataset in cfg.datasets
            for f in sorted((cfg.out / "cells" / dataset / cfg.key(dataset)).glob("*.json"))]


def main(argv: list[str]) -> dict:
    cfg = config_from(argv)
    warnings.filterwarnings("ignore", message="Input Tensor 0 did not already require gradients")
    warnings.filterwarnings("ignore", message="You are providing multiple inputs for Lime")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    hf_logging.set_verbosity_error()
    settings = [Setting(), *grid(cfg)]
    wanted = [(s, seed, ds) for seed in cfg.seeds for ds in cfg.datasets for s in settings]
    todo = [cell for cell in wanted if not cell_file(cfg, *cell).is_file()]
    done = finished_cells(cfg)
    seconds, source = budget(cfg, todo, done)
    print(f"config: {cfg}\n{len(wanted)} cells ({len(settings)} settings x {len(cfg.seeds)} seeds x "
          f"{len(cfg.datasets)} data sets), {len(wanted) - len(todo)} finished, {len(todo)} to do: "
          f"{budget_wording(seconds, source)}")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    trained = 0
    for i, (setting, seed, dataset) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {setting.name} seed {seed} {dataset}", flush=True)
        cell = run_cell(cfg, setting, seed, dataset, tokenizer)
        trained += cell["trained"]
        print(f"  accuracy {100 * cell['accuracy']:.1f}, {cell['cpu_seconds']:.0f} CPU s", flush=True)
    cells = finished_cells(cfg)
    rows, posthoc = aggregate([c for c in cells if (c["setting"], c["seed"], c["dataset"]) in
                               {(s.name, seed, ds) for s, seed, ds in wanted}], cfg)
    write_report(rows, posthoc, cfg, cells)
    plot(rows, posthoc, cfg.out)
    print((cfg.out / "results.md").read_text(encoding="utf-8"))
    print(f"wrote {cfg.out}/results.md, results.csv, frontier.png")
    return {"rows": rows, "posthoc": posthoc, "computed": len(todo), "trained": trained}


if __name__ == "__main__":
    main(sys.argv[1:])
