"""Recipe search: B-cos fine-tuning recipes against conventional fine-tuning at the benchmark's CPU budget.

Every recipe fine-tunes all-MiniLM-L6-v2 (``bcos_plugins.pretrained.minilm_path()``) on the first BENCH_TRAIN
(1200) shipped SST-2 training rows, batch 16, max length 64, and reports accuracy on the shipped SST-2 test
rows (600) next to the conventional model (cross-entropy, lr 1e-4, 2 epochs: the faithfulness benchmark's
baseline). BENCH_DATA=ag_news runs the same on AG News (4 classes; the first BENCH_TRAIN, default 600, shipped
training rows, as the faithfulness benchmark trains its AG News models; accuracy on the 800 shipped test rows). One line per recipe with its wall time; results are appended to
``outputs/bench_recipes/results.jsonl`` (a recipe already there is not run again unless BENCH_RETRAIN=1), and
the table of everything run so far is printed at the end.

Usage::

    python benchmarks/bench_recipes.py                  # every recipe (about 2-4 minutes each on 1 thread)
    python benchmarks/bench_recipes.py conv b1.25-head  # only these

Environment: BENCH_DATA=sst2 (or ag_news), BENCH_TRAIN=1200 training rows (600 for ag_news), BENCH_EPOCHS=2 (the
budget; recipes named "-4ep" use 4),
BENCH_THREADS=1 torch threads, BENCH_OUT=outputs/bench_recipes, BENCH_RETRAIN=1 reruns cached recipes,
BENCH_SEED=0 (seeds the head's initialisation and the training order; each seed has its own cached conventional
model, from which that seed's task-then-B-cos recipes start; rows are kept per seed),
BENCH_MLM_TEXTS=4000 unlabelled texts for the B-cos masked-LM pre-training (SST-2 training rows after the
labelled ones, then RT polarity sentences; labels are never read), BENCH_MLM_EPOCHS=1. BENCH_DATA is sst2 or
ag_news, counts are whole numbers >= 1 (BENCH_SEED >= 0; BENCH_TRAIN=0 is not the whole split as in
bench_faithfulness: the rows after the labelled ones are the transfer and masked-LM texts), epochs numbers > 0, BENCH_RETRAIN 0 or 1. They are read
when the run starts (``Settings.from_env()`` at the start of ``main``), not when the module is imported; any other
value stops the run before any work, naming the variable, the value and the fix (benchmarks.common.settings).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertForSequenceClassification
from transformers.utils import logging as hf_logging

from bcos_plugins import bcosify
from bcos_plugins.data import load_ag_news, load_sst2, shipped_data
from bcos_plugins.pretrained import minilm_path
from bcos_plugins.train import accuracy, fine_tune_classifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.settings import env_choice, env_flag, env_float, env_int, env_path

BATCH = 16
MAX_LENGTH = 64
BASE_LR = 1e-4
DEFAULT_TRAIN = {"sst2": 1200, "ag_news": 600}  # BENCH_TRAIN's default per BENCH_DATA


@dataclass(frozen=True)
class Settings:
    """One run's settings (module docstring). ``n_train`` is taken as given; ``from_env`` defaults it by ``data``
    (``DEFAULT_TRAIN``)."""

    data: str = "sst2"
    n_train: int = DEFAULT_TRAIN["sst2"]
    epochs: float = 2.0  # the budget; recipes named "-4ep" use 4
    threads: int = 1
    n_mlm: int = 4000  # unlabelled texts for the B-cos masked-LM pre-training
    mlm_epochs: float = 1.0
    retrain: bool = False
    seed: int = 0
    out: Path = Path("outputs/bench_recipes")

    @classmethod
    def from_env(cls) -> Settings:
        """The BENCH_* variables (module docstring), the defaults above for unset ones; a bad value stops the run
        before any work, naming the variable, the value and the fix."""
        data = env_choice("BENCH_DATA", cls.data, ("sst2", "ag_news"))
        return cls(data=data, n_train=env_int("BENCH_TRAIN", DEFAULT_TRAIN[data], minimum=1),
                   epochs=env_float("BENCH_EPOCHS", cls.epochs, minimum=0, exclusive_minimum=True),
                   threads=env_int("BENCH_THREADS", cls.threads, minimum=1),
                   n_mlm=env_int("BENCH_MLM_TEXTS", cls.n_mlm, minimum=1),
                   mlm_epochs=env_float("BENCH_MLM_EPOCHS", cls.mlm_epochs, minimum=0, exclusive_minimum=True),
                   retrain=env_flag("BENCH_RETRAIN", cls.retrain), seed=env_int("BENCH_SEED", cls.seed, minimum=0),
                   out=env_path("BENCH_OUT", cls.out))


def base_classifier(cfg: Settings) -> BertForSequenceClassification:
    torch.manual_seed(cfg.seed)
    return BertForSequenceClassification.from_pretrained(minilm_path(), num_labels=2 if cfg.data == "sst2" else 4)


def tune(model, tok, data, cfg: Settings, **kwargs):
    settings = dict(epochs=cfg.epochs, batch_size=BATCH, learning_rate=BASE_LR, max_length=MAX_LENGTH,
                    progress=False, seed=cfg.seed)
    settings.update(kwargs)
    fine_tune_classifier(model, tok, data.texts, data.labels, **settings)
    return model


_CONVENTIONAL: dict[Path, BertForSequenceClassification] = {}


def conventional(tok, data, cfg: Settings):
    """The baseline (also the teacher and the starting point of task-then-B-cos; trained once per process and
    setting)."""
    folder = cfg.out / "models" / f"conv-n{cfg.n_train}-e{cfg.epochs:g}" if cfg.data == "sst2" else \
        cfg.out / "models" / f"conv-{cfg.data}-n{cfg.n_train}-e{cfg.epochs:g}"
    if cfg.seed:
        folder = folder.with_name(f"{folder.name}-s{cfg.seed}")
    if folder not in _CONVENTIONAL:
        if (folder / "config.json").exists() and not cfg.retrain:
            _CONVENTIONAL[folder] = BertForSequenceClassification.from_pretrained(folder).eval()
        else:
            _CONVENTIONAL[folder] = tune(base_classifier(cfg), tok, data, cfg)
            _CONVENTIONAL[folder].save_pretrained(folder)
    return _CONVENTIONAL[folder]


def direct(b: float, head_lr: float | None = None, bcos_query_key: bool = True, **kwargs) -> Callable:
    def run(tok, data, cfg: Settings):
        model = bcosify(base_classifier(cfg), b=b, bcos_query_key=bcos_query_key, verbose=False)
        return tune(model, tok, data, cfg, head_learning_rate=head_lr, **kwargs)
    return run


def _layer_inputs(model, layer, enc) -> torch.Tensor:
    """The inputs ``layer`` sees when ``model`` runs on ``enc`` (real tokens only, rows of features)."""
    seen = []
    hook = layer.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    with torch.no_grad():
        model.eval()(**enc)
    hook.remove()
    x = seen[0]
    return x[enc["attention_mask"].bool()] if x.dim() == 3 else x


@torch.no_grad()
def fold_biases(model: BertForSequenceClassification, enc, ridge: float = 1e-3) -> None:
    """Prototype for post-LN BERT: make the stock encoder bias-free (except query/key) before bcosify, nearly
    without changing it. 1. Exact: every LayerNorm shift moves into the biases of the layers after it (a value bias
    passes through attention unchanged, since attention rows sum to 1, into the output dense's bias; the residual
    path's shift into the next output dense's bias). 2. Approximate: each remaining bias b of a linear layer is folded
    into its weight, W' = W + b c^T with c the ridge least-squares solution of x . c = 1 over the layer's inputs on
    calibration texts (layer by layer, each on the already-folded model's inputs)."""
    bert = model.bert

    def shift_into_block(beta, block):
        att = block.attention
        for proj in (att.self.query, att.self.key, att.self.value):
            proj.bias += proj.weight @ beta
        att.output.dense.bias += att.output.dense.weight @ att.self.value.bias + beta
        att.self.value.bias.zero_()

    beta = bert.embeddings.LayerNorm.bias.clone()
    bert.embeddings.LayerNorm.bias.zero_()
    for block in bert.encoder.layer:
        shift_into_block(beta, block)
        shift = block.attention.output.LayerNorm.bias.clone()
        block.attention.output.LayerNorm.bias.zero_()
        block.intermediate.dense.bias += block.intermediate.dense.weight @ shift
        block.output.dense.bias += shift
        beta = block.output.LayerNorm.bias.clone()
        block.output.LayerNorm.bias.zero_()
    bert.pooler.dense.bias += bert.pooler.dense.weight @ beta
    for name, layer in list(bert.named_modules()):
        if isinstance(layer, torch.nn.Linear) and not name.endswith(("query", "key")):
            x = _layer_inputs(model, layer, enc).double()
            gram = x.T @ x + ridge * x.shape[0] * torch.eye(x.shape[1], dtype=x.dtype)
            c = torch.linalg.solve(gram, x.sum(0))
            layer.weight += torch.outer(layer.bias.double(), c).to(layer.weight.dtype)
            layer.bias.zero_()


def folded(b: float, head_lr: float | None, n_calibration: int = 256, **kwargs) -> Callable:
    def run(tok, data, cfg: Settings):
        model = base_classifier(cfg)
        enc = tok(data.texts[:n_calibration], padding=True, truncation=True, max_length=MAX_LENGTH,
                  return_tensors="pt")
        fold_biases(model, enc)
        bcosify(model, b=b, bcos_query_key=False, verbose=False)
        return tune(model, tok, data, cfg, head_learning_rate=head_lr, **kwargs)
    return run


def diagnostic(drop_biases: str | None, unit_rows: str | None) -> Callable:
    """Conventional fine-tuning from a stock model changed like bcosify changes it, to see what costs accuracy:
    biases zeroed at the start (they stay trainable; "all", "linear" or "layernorm" ones of the encoder) and/or
    weight rows rescaled to unit norm at the start ("all" linear layers of the encoder, or "no-qk": all but
    query/key)."""
    kinds = {"all": (torch.nn.Linear, torch.nn.LayerNorm), "linear": (torch.nn.Linear,),
             "layernorm": (torch.nn.LayerNorm,), None: ()}[drop_biases]

    def run(tok, data, cfg: Settings):
        model = base_classifier(cfg)
        with torch.no_grad():
            for name, module in model.bert.named_modules():
                if isinstance(module, kinds):
                    module.bias.zero_()
                if isinstance(module, torch.nn.Linear) and unit_rows and not (
                        unit_rows == "no-qk" and name.endswith(("query", "key"))):
                    module.weight.div_(module.weight.norm(dim=1, keepdim=True))
        return tune(model, tok, data, cfg)
    return run


def distilled(b: float, head_lr: float, weight: float, kind: str = "kl", **kwargs) -> Callable:
    def run(tok, data, cfg: Settings):
        teacher = conventional(tok, data, cfg)
        model = bcosify(base_classifier(cfg), b=b, verbose=False)
        return tune(model, tok, data, cfg, head_learning_rate=head_lr, teacher=teacher, distill_weight=weight,
                    distill_loss=kind, **kwargs)
    return run


def task_then_bcos(b: float, head_lr: float | None, bcos_query_key: bool = True, distill_weight: float | None = None,
                   train: bool = True, **kwargs) -> Callable:
    """B-cosify the cached conventional model and fine-tune it (with ``distill_weight``: plus KL to that same
    conventional model; ``train=False``: the converted model as it is, to see what the conversion costs)."""
    def run(tok, data, cfg: Settings):
        import copy

        teacher = conventional(tok, data, cfg)
        model = bcosify(copy.deepcopy(teacher), b=b, bcos_query_key=bcos_query_key, verbose=False)
        if not train:
            return model.eval()
        if distill_weight is not None:
            kwargs.update(teacher=teacher, distill_weight=distill_weight)
        return tune(model, tok, data, cfg, head_learning_rate=head_lr, **kwargs)
    return run


def transfer_texts(n: int, cfg: Settings) -> list[str]:
    """``n`` texts of the task's own shipped training split after the labelled rows (their labels are never read)."""
    rows = (load_sst2 if cfg.data == "sst2" else load_ag_news)("train").texts[cfg.n_train:]
    if len(rows) < n:
        raise SystemExit(f"only {len(rows)} shipped {cfg.data} training rows after the first {cfg.n_train}, "
                         f"asked for {n}")
    return rows[:n]


def task_then_bcos_transfer(b: float, n_extra: int, distill_weight: float = 1.0, **kwargs) -> Callable:
    """Task then B-cos with distillation on a transfer set: the labelled rows plus ``n_extra`` unlabelled texts
    that the conventional model labels (its argmax as the task label, its logits as the distillation target)."""
    def run(tok, data, cfg: Settings):
        import copy
        from types import SimpleNamespace

        from bcos_plugins.train import predict

        teacher = conventional(tok, data, cfg)
        extra = transfer_texts(n_extra, cfg)
        pseudo = predict(teacher, tok, extra, max_length=MAX_LENGTH).argmax(-1).tolist()
        both = SimpleNamespace(texts=list(data.texts) + extra, labels=list(data.labels) + pseudo)
        model = bcosify(copy.deepcopy(teacher), b=b, bcos_query_key=False, verbose=False)
        return tune(model, tok, both, cfg, teacher=teacher, distill_weight=distill_weight, **kwargs)
    return run


def task_then_bcos_features(b: float, n_extra: int, hidden_weight: float, learning_rate: float = 2e-4,
                            epochs: float = 0.8, temperature: float = 2.0) -> Callable:
    """Prototype: task then B-cos where the B-cos stage also matches the conventional model's hidden states.

    Loss: bcos_loss + KL (``temperature``) to the conventional model's logits + ``hidden_weight`` x the mean
    squared difference of every layer's token states (real tokens) to the conventional model's, minus the bias of
    the conventional LayerNorm that wrote them (B-cos LayerNorms have none: with equal inputs this is exactly what
    they output). On the labelled rows and ``n_extra`` transfer texts (conventional argmax as their labels)."""
    def run(tok, data, cfg: Settings):
        import copy
        import tempfile

        import torch.nn.functional as F
        from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

        from bcos_plugins.encoded_texts import EncodedTexts
        from bcos_plugins.train import bcos_loss, predict

        teacher = conventional(tok, data, cfg).eval()
        extra = transfer_texts(n_extra, cfg)
        pseudo = predict(teacher, tok, extra, max_length=MAX_LENGTH).argmax(-1).tolist()
        texts, labels = list(data.texts) + extra, list(data.labels) + pseudo
        bert = teacher.bert
        shifts = [bert.embeddings.LayerNorm.bias.detach()] + [
            layer.output.LayerNorm.bias.detach() for layer in bert.encoder.layer]
        model = bcosify(copy.deepcopy(teacher), b=b, bcos_query_key=False, verbose=False)

        class FeatureTrainer(Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                labels = inputs.pop("labels")
                out = model(**inputs, output_hidden_states=True)
                with torch.no_grad():
                    ref = teacher(**inputs, output_hidden_states=True)
                mask = inputs["attention_mask"].bool()
                hidden = sum(F.mse_loss(h[mask], (r - shift)[mask]) for h, r, shift in
                             zip(out.hidden_states, ref.hidden_states, shifts, strict=True)) / len(shifts)
                t = temperature
                kl = t * t * F.kl_div(F.log_softmax(out.logits / t, -1), F.log_softmax(ref.logits / t, -1),
                                      log_target=True, reduction="batchmean")
                loss = bcos_loss(out.logits, labels) + kl + hidden_weight * hidden
                return (loss, out) if return_outputs else loss

        args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="bench_features_"), num_train_epochs=epochs,
                                 per_device_train_batch_size=BATCH, learning_rate=learning_rate, seed=cfg.seed,
                                 disable_tqdm=True, report_to=[], save_strategy="no", logging_steps=10, dataloader_pin_memory=False,
                                 remove_unused_columns=False)
        FeatureTrainer(model=model, args=args, train_dataset=EncodedTexts(tok, texts, labels, MAX_LENGTH),
                       data_collator=DataCollatorWithPadding(tok)).train()
        return model.eval()
    return run


def unlabelled_texts(n: int, n_train: int) -> list[str]:
    """The first ``n`` SST-2 training texts after the ``n_train`` labelled ones, then RT polarity sentences."""
    texts = load_sst2("train").texts[n_train:]
    folder = shipped_data("rt_polarity")
    for name in ("rt-polarity.pos", "rt-polarity.neg"):
        texts += (folder / name).read_text(encoding="latin-1").splitlines()
    return [t for t in texts if t.strip()][:n]


def bcos_then_task(b: float, head_lr: float | None, bcos_query_key: bool = True, **kwargs) -> Callable:
    def run(tok, data, cfg: Settings):
        from bcos_plugins.pretrain import classifier_from_masked_lm, pretrain_masked_lm

        qk = "" if bcos_query_key else "-stockqk"
        folder = cfg.out / "models" / f"mlm-B{b:g}-n{cfg.n_mlm}-e{cfg.mlm_epochs:g}{qk}"
        if not (folder / "config.json").exists() or cfg.retrain:
            torch.manual_seed(0)
            trainer = pretrain_masked_lm(str(minilm_path()), tok, unlabelled_texts(cfg.n_mlm, cfg.n_train), b=b,
                                         epochs=cfg.mlm_epochs, batch_size=32, learning_rate=1e-4, max_length=MAX_LENGTH, progress=False,
                                         bcos_query_key=bcos_query_key)
            trainer.model.save_pretrained(folder)
        torch.manual_seed(0)
        model = classifier_from_masked_lm(folder, num_labels=2, pooler_from=str(minilm_path()))
        return tune(model, tok, data, cfg, head_learning_rate=head_lr, **kwargs)
    return run


RECIPES: dict[str, tuple[str, Callable]] = {
    "conv": ("conventional: CE, lr 1e-4", conventional),
    "b1.25": ("B-cos B=1.25, lr 1e-4 everywhere", direct(1.25)),
    "b1.25-head": ("B-cos B=1.25, head lr 1e-3 (the old benchmark recipe)", direct(1.25, 1e-3)),
    "b1.1-head": ("B-cos B=1.1, head lr 1e-3", direct(1.1, 1e-3)),
    "b1.5-head": ("B-cos B=1.5, head lr 1e-3", direct(1.5, 1e-3)),
    "b1.0-head": ("diagnostic: B=1 (bias-free, head activations removed, no alignment pressure), head lr 1e-3",
                  direct(1.0, 1e-3)),
    "diag-conv-nobias": ("diagnostic: conventional, encoder biases zeroed at the start", diagnostic("all", None)),
    "diag-conv-nobias-linear": ("diagnostic: conventional, biases of the encoder's linear layers zeroed at the start",
                                diagnostic("linear", None)),
    "diag-conv-nobias-layernorm": ("diagnostic: conventional, LayerNorm biases of the encoder zeroed at the start",
                                   diagnostic("layernorm", None)),
    "diag-conv-unitrows": ("diagnostic: conventional, encoder weight rows unit-norm at the start",
                           diagnostic(None, "all")),
    "diag-conv-unitrows-no-qk": ("diagnostic: conventional, encoder rows unit-norm at the start except query/key",
                                 diagnostic(None, "no-qk")),
    "b1.25-lr3e-4-head": ("B-cos B=1.25, lr 3e-4, head lr 1e-3", direct(1.25, 1e-3, learning_rate=3e-4)),
    "b1.25-head3e-3": ("B-cos B=1.25, head lr 3e-3", direct(1.25, 3e-3)),
    "b1.25-lr2e-4-head": ("B-cos B=1.25, lr 2e-4, head lr 1e-3", direct(1.25, 1e-3, learning_rate=2e-4)),
    "b1.25-head-warm-cos": ("B-cos B=1.25, head lr 1e-3, 10% warm-up + cosine",
                            direct(1.25, 1e-3, warmup_steps=0.1, lr_scheduler_type="cosine")),
    "b1.25-head-ce": ("B-cos B=1.25, head lr 1e-3, cross-entropy instead of BCE", direct(1.25, 1e-3, loss="ce")),
    "b1.1-lr2e-4-head": ("B-cos B=1.1, lr 2e-4, head lr 1e-3", direct(1.1, 1e-3, learning_rate=2e-4)),
    "b1.1-lr2e-4-head-3ep": ("B-cos B=1.1, lr 2e-4, head lr 1e-3, 3 epochs",
                             direct(1.1, 1e-3, learning_rate=2e-4, epochs=3.0)),
    "b1.1-lr2e-4-head-4ep": ("B-cos B=1.1, lr 2e-4, head lr 1e-3, 4 epochs",
                             direct(1.1, 1e-3, learning_rate=2e-4, epochs=4.0)),
    "b1.25-lr2e-4-head-4ep": ("B-cos B=1.25, lr 2e-4, head lr 1e-3, 4 epochs",
                              direct(1.25, 1e-3, learning_rate=2e-4, epochs=4.0)),
    "distill-kl-w5-t2": ("B-cos B=1.25, lr 2e-4, head lr 1e-3, + 5.0 x KL (T=2) to the conventional model",
                         distilled(1.25, 1e-3, 5.0, "kl", learning_rate=2e-4, distill_temperature=2.0)),
    "b1.25-head-4ep": ("B-cos B=1.25, head lr 1e-3, 4 epochs", direct(1.25, 1e-3, epochs=4.0)),
    "b1.25-bwarm": ("B-cos B=1.25, head lr 1e-3, B warm-up from 1 over 50%", direct(1.25, 1e-3, b_warmup=0.5)),
    "distill-kl": ("B-cos B=1.25, head lr 1e-3, + 1.0 x KL to the conventional model",
                   distilled(1.25, 1e-3, 1.0, "kl")),
    "distill-mse": ("B-cos B=1.25, head lr 1e-3, + 1.0 x MSE to the conventional model's logits",
                    distilled(1.25, 1e-3, 1.0, "mse")),
    "task-then-bcos": ("conventional 2 ep (the cached conv model; its 63 s are not in the wall time), bcosify "
                       "B=1.25, B-cos 2 ep (head lr 1e-4)", task_then_bcos(1.25, None)),
    "bcos-then-task": ("B-cos MLM pre-training (B=1.25), then B-cos task 2 ep, head lr 1e-3",
                       bcos_then_task(1.25, 1e-3)),
    "b1.25-head-stockqk": ("B-cos B=1.25, head lr 1e-3, query/key kept stock (bcos_query_key=False)",
                           direct(1.25, 1e-3, bcos_query_key=False)),
    "b1.25-lr2e-4-head-stockqk": ("B-cos B=1.25, lr 2e-4, head lr 1e-3, query/key kept stock",
                                  direct(1.25, 1e-3, bcos_query_key=False, learning_rate=2e-4)),
    "b1.1-lr2e-4-head-stockqk": ("B-cos B=1.1, lr 2e-4, head lr 1e-3, query/key kept stock",
                                 direct(1.1, 1e-3, bcos_query_key=False, learning_rate=2e-4)),
    "b1.25-head-stockqk-fold": ("B-cos B=1.25, head lr 1e-3, query/key kept stock, biases folded into the weights "
                                "before bcosify (LayerNorm shifts moved exactly, linear biases by least squares on "
                                "256 training texts)", folded(1.25, 1e-3)),
    "task-then-bcos-stockqk": ("conventional 2 ep (the cached conv model; not in the wall time), bcosify B=1.25 with "
                               "query/key kept stock, B-cos 2 ep (head lr 1e-4)", task_then_bcos(1.25, None, False)),
    "task-then-bcos-b1.1-stockqk": ("conventional 2 ep (the cached conv model; not in the wall time), bcosify B=1.1 "
                                    "with query/key kept stock, B-cos 2 ep (head lr 1e-4)",
                                    task_then_bcos(1.1, None, False)),
    "task-then-bcos-b1.1-stockqk-0ep": ("diagnostic: the cached conventional model B-cosified (B=1.1, query/key "
                                        "kept stock), not trained further", task_then_bcos(1.1, None, False,
                                                                                           train=False)),
    "task-then-bcos-b1.1-stockqk-lr2e-4": ("task then B-cos, B=1.1, query/key stock, B-cos 2 ep at lr 2e-4",
                                           task_then_bcos(1.1, None, False, learning_rate=2e-4)),
    "task-then-bcos-b1.1-stockqk-3ep": ("task then B-cos, B=1.1, query/key stock, B-cos 3 ep at lr 1e-4",
                                        task_then_bcos(1.1, None, False, epochs=3.0)),
    "task-then-bcos-b1.1-stockqk-4ep": ("task then B-cos, B=1.1, query/key stock, B-cos 4 ep at lr 1e-4",
                                        task_then_bcos(1.1, None, False, epochs=4.0)),
    "task-then-bcos-b1.1-stockqk-kl": ("task then B-cos, B=1.1, query/key stock, B-cos 2 ep at lr 1e-4 + 1.0 x KL "
                                       "(T=2) to the conventional model it started from",
                                       task_then_bcos(1.1, None, False, distill_weight=1.0, distill_temperature=2.0)),
    "task-then-bcos-b1.1-stockqk-warm-cos": ("task then B-cos, B=1.1, query/key stock, B-cos 2 ep at lr 2e-4, 10% "
                                             "warm-up + cosine", task_then_bcos(1.1, None, False, learning_rate=2e-4,
                                                                                warmup_steps=0.1,
                                                                                lr_scheduler_type="cosine")),
    "task-then-bcos-b1.1-stockqk-head1e-3": ("task then B-cos, B=1.1, query/key stock, B-cos 2 ep at lr 1e-4, head "
                                             "lr 1e-3", task_then_bcos(1.1, 1e-3, False)),
    "task-then-bcos-b1.2-stockqk": ("task then B-cos, B=1.2, query/key stock, B-cos 2 ep at lr 1e-4",
                                    task_then_bcos(1.2, None, False)),
    "task-then-bcos-b1.1-stockqk-transfer1800-kl": (
        "task then B-cos, B=1.1, query/key stock, + KL (T=2) to the conventional model on the labelled rows and 1800 "
        "unlabelled training texts it labels; B-cos 2 ep over all 3000 (2.5x the steps) at lr 1e-4",
        task_then_bcos_transfer(1.1, 1800, distill_temperature=2.0)),
    "task-then-bcos-b1.1-stockqk-transfer1800-kl-samesteps": (
        "the same with the B-cos stage's steps of the 2-epoch budget (0.8 ep over the 3000 texts)",
        task_then_bcos_transfer(1.1, 1800, distill_temperature=2.0, epochs=0.8)),
    "task-then-bcos-b1.1-stockqk-lr3e-4": ("task then B-cos, B=1.1, query/key stock, B-cos 2 ep at lr 3e-4",
                                           task_then_bcos(1.1, None, False, learning_rate=3e-4)),
    "task-then-bcos-b1.1-stockqk-lr2e-4-3ep": ("task then B-cos, B=1.1, query/key stock, B-cos 3 ep at lr 2e-4",
                                               task_then_bcos(1.1, None, False, learning_rate=2e-4, epochs=3.0)),
    "task-then-bcos-b1.1-stockqk-lr2e-4-transfer1800-kl-samesteps": (
        "task then B-cos, B=1.1, query/key stock, lr 2e-4, + KL (T=2) to the conventional model on the labelled rows "
        "and 1800 unlabelled training texts it labels, the 2-epoch budget's steps (0.8 ep over the 3000 texts)",
        task_then_bcos_transfer(1.1, 1800, distill_temperature=2.0, epochs=0.8, learning_rate=2e-4)),
    "task-then-bcos-b1.1-stockqk-lr2e-4-transfer1800-features": (
        "prototype: task then B-cos, B=1.1, query/key stock, lr 2e-4; B-cos stage loss = BCE + KL (T=2) to the "
        "conventional model + 1.0 x MSE of every layer's token states to the conventional model's (minus its "
        "LayerNorm biases), on the labelled rows and 1800 transfer texts, the 2-epoch budget's steps (0.8 ep)",
        task_then_bcos_features(1.1, 1800, 1.0)),
    "bcos-then-task-b1.1-stockqk": ("B-cos MLM pre-training (B=1.1, query/key stock, 1 epoch on 4,000 unlabelled "
                                    "sentences, in the wall time), then B-cos task 2 ep, lr 2e-4, head lr 1e-3",
                                    bcos_then_task(1.1, 1e-3, False, learning_rate=2e-4)),
    "b1.25-head-stockqk-3ep": ("B-cos B=1.25, head lr 1e-3, query/key kept stock, 3 epochs",
                               direct(1.25, 1e-3, bcos_query_key=False, epochs=3.0)),
    "b1.25-lr2e-4-head-stockqk-3ep": ("B-cos B=1.25, lr 2e-4, head lr 1e-3, query/key kept stock, 3 epochs",
                                      direct(1.25, 1e-3, bcos_query_key=False, learning_rate=2e-4, epochs=3.0)),
}


def main(names: list[str]) -> None:
    cfg = Settings.from_env()  # a bad BENCH_* value stops here, before any work
    torch.set_num_threads(cfg.threads)
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise SystemExit(f"unknown recipes {unknown}; known: {', '.join(RECIPES)}")
    cfg.out.mkdir(parents=True, exist_ok=True)
    results_file = cfg.out / "results.jsonl"
    done = {}
    if results_file.exists():
        for line in results_file.read_text().splitlines():
            row = json.loads(line)
            if row["n_train"] == cfg.n_train and row["budget_epochs"] == cfg.epochs \
                    and row.get("data", "sst2") == cfg.data and row.get("seed", 0) == cfg.seed:
                done[row["recipe"]] = row
    tok = AutoTokenizer.from_pretrained(minilm_path())
    if cfg.data == "sst2":
        train, test = load_sst2("train", n=cfg.n_train), load_sst2("test")
    else:
        train, test = load_ag_news("train", n=cfg.n_train), load_ag_news("test")
    for name in names or list(RECIPES):
        if name in done and not cfg.retrain:
            continue
        what, run = RECIPES[name]
        start = time.perf_counter()
        model = run(tok, train, cfg)
        seconds = time.perf_counter() - start
        acc = accuracy(model, tok, test.texts, test.labels, max_length=MAX_LENGTH)
        row = {"recipe": name, "data": cfg.data, "what": what, "accuracy": acc, "seconds": seconds,
               "n_train": cfg.n_train, "budget_epochs": cfg.epochs, "n_test": len(test.texts), "threads": cfg.threads,
               "seed": cfg.seed}
        done[name] = row
        with results_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{name:22s} acc {100 * acc:5.1f}  {seconds:6.0f} s  {what}", flush=True)
    conv_acc = done.get("conv", {}).get("accuracy")
    print(f"\n| recipe | accuracy ({cfg.data} test, {len(test.texts)}) | vs conventional | wall time | what |")
    print("|---|---|---|---|---|")
    for name, row in done.items():
        gap = f"{100 * (row['accuracy'] - conv_acc):+.1f}" if conv_acc is not None else "n/a"
        print(f"| {name} | {100 * row['accuracy']:.1f} | {gap} | {row['seconds']:.0f} s | {row['what']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
