"""B-cosify and briefly train a tiny GPT-2, then score contrastive next-token explanations on BLiMP (MRR).

Reproduces the *plumbing* of the B-cos LM paper's §7 on a CPU in a few minutes (`make blimp-mrr`): the model is
tiny and trained for a moment, so the numbers say nothing about GPT-2 small; what they show is the pipeline
and how the explanation methods compare on one and the same model.

1. a tiny GPT-2 (real GPT-2 tokenizer, shipped in bcos_plugins/data/files/gpt2_tokenizer; the embedding keeps only the
   GPT-2 ids the slice uses) is built from a config and converted with ``bcosify(model, b=1.1)`` (the paper's
   B for decoders);
2. it is trained with plain cross-entropy (``train_causal_lm``: Trainer, padding excluded from the loss) on the
   grammatical sentences of BLiMP pairs 100-299 of the nine paradigms (bcos_plugins/data/files/blimp);
3. on pairs 0-99 of each paradigm, the contrastive quantity logit(good) - logit(bad) at the prefix's last token
   is explained by B-cos (``explain``, exact: contributions sum to it) and, on the same model and at the same
   attribution point (word + position embedding), by Captum's Saliency (L1 norm of the gradient, the paper's
   "Grad Norm"), InputXGradient and Occlusion (each token replaced by the end-of-text embedding at the same
   position, the paper's in-distribution [PAD] choice), as benchmarks/common/decoder_baselines.py computes them
   for ``make bench-decoders`` too;
4. MRR against the evidence tokens (bcos_plugins.data.blimp documents the rules), the paper's random baseline,
   and the probability gap p(good) - p(bad) are printed per paradigm and written to outputs/blimp_mrr/.

Environment variables: BLIMP_EPOCHS (default 8), BLIMP_EVAL (pairs per paradigm, default 100), BLIMP_SEED
(default 0), BLIMP_THREADS (torch threads, default 1: for a model this small, more threads mostly wait on each
other, and on a shared CPU a step took 2-6 s with two threads against 0.25 s with one). BLIMP_EPOCHS is a number
above 0, BLIMP_EVAL a whole number from 1 to 299 (the pairs after it train the model), BLIMP_SEED >= 0,
BLIMP_THREADS >= 1. They are read when the run starts (``BlimpSettings.from_env()`` at the start of ``main``),
not when the module is imported; any other value stops the script before any work, naming the variable, the value
and the fix.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer
from transformers.utils import logging as hf_logging

from bcos_plugins import bcosify, explain
from bcos_plugins.data import SHIPPED_DATA
from bcos_plugins.data.blimp import BLIMP_SUBSETS, encode_blimp, load_blimp
from bcos_plugins.metrics.decoder import mean_reciprocal_rank, probability_gap
from bcos_plugins.train_decoder import real_token_positions, train_causal_lm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.decoder_baselines import CompactVocabulary, captum_scores, seconds_per_explanation
from benchmarks.common.settings import env_float, env_int, epochs_text, no_command_line_arguments

OUT = Path("outputs") / "blimp_mrr"


@dataclass(frozen=True)
class BlimpSettings:
    epochs: float = 8.0
    n_eval: int = 100  # pairs per paradigm; the shipped slice's pairs after them train the model
    seed: int = 0
    threads: int = 1

    @classmethod
    def from_env(cls) -> BlimpSettings:
        """The BLIMP_* variables (module docstring), the defaults above for unset ones; a bad value stops the
        script before any work, naming the variable, the value and the fix."""
        # the shipped slice holds 300 pairs per paradigm; those after the evaluation pairs are the training data
        return cls(epochs=env_float("BLIMP_EPOCHS", cls.epochs, minimum=0, exclusive_minimum=True),
                   n_eval=env_int("BLIMP_EVAL", cls.n_eval, minimum=1, maximum=299),
                   seed=env_int("BLIMP_SEED", cls.seed, minimum=0),
                   threads=env_int("BLIMP_THREADS", cls.threads, minimum=1))


def blimp_settings() -> BlimpSettings:
    """The BLIMP_* variables as the run reads them at its start (``BlimpSettings.from_env()``)."""
    return BlimpSettings.from_env()


METHODS = ["B-cos", "Saliency", "InputXGradient", "Occlusion"]


def build_model(vocab_size: int, eos_id: int, seed: int = BlimpSettings.seed) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=96, n_layer=2, n_head=4, n_positions=64, n_ctx=64,
                        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    return bcosify(GPT2LMHeadModel(config), b=1.1)


def training_sentences(tokenizer, n_eval: int = BlimpSettings.n_eval) -> list[torch.Tensor]:
    """The grammatical sentences of each paradigm's pairs after the first ``n_eval`` (the evaluation pairs)."""
    eos = tokenizer.eos_token_id
    rows = []
    for subset in BLIMP_SUBSETS:
        for pair in load_blimp(subset)[n_eval:]:
            sentence = f"{pair.prefix} {pair.target}."
            rows.append(torch.tensor([eos, *tokenizer(sentence)["input_ids"], eos]))
    return rows


def main() -> None:
    no_command_line_arguments(__doc__)  # --help prints the settings; other arguments are refused
    cfg = blimp_settings()  # a bad BLIMP_* value stops here, before any work
    hf_logging.set_verbosity_error()
    torch.set_num_threads(cfg.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer = GPT2Tokenizer.from_pretrained(SHIPPED_DATA / "gpt2_tokenizer")
    eos = tokenizer.eos_token_id
    batches = {s: encode_blimp(load_blimp(s, n=cfg.n_eval), tokenizer, bos_token_id=eos) for s in BLIMP_SUBSETS}
    train_rows = training_sentences(tokenizer, cfg.n_eval)
    vocab = CompactVocabulary(torch.tensor([eos]), *train_rows,
                              *[t for b in batches.values() for t in (b.input_ids, b.target_ids, b.foil_ids)])
    for batch in batches.values():
        batch.input_ids, batch.target_ids, batch.foil_ids = (vocab(batch.input_ids), vocab(batch.target_ids),
                                                             vocab(batch.foil_ids))
    train = [{"input_ids": vocab(row)} for row in train_rows]
    model = build_model(len(vocab), int(vocab(torch.tensor(eos))), cfg.seed)
    print(model.bcos_report)

    print(f"training on {len(train)} BLiMP sentences (pairs {cfg.n_eval}-299 of 9 paradigms), {epochs_text(cfg.epochs)}, "
          f"{len(vocab)} GPT-2 token ids in use")
    start = time.perf_counter()
    trainer = train_causal_lm(model, train, str(OUT / "trainer"), pad_token_id=model.config.eos_token_id,
                              num_train_epochs=cfg.epochs, per_device_train_batch_size=32, learning_rate=2e-3,
                              warmup_steps=20, logging_steps=50, seed=cfg.seed, disable_tqdm=True)
    train_seconds = time.perf_counter() - start
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    print(f"trained in {train_seconds:.0f} s; loss {losses[0]:.2f} -> {losses[-1]:.2f}")

    results: dict[str, dict] = {}
    seconds: dict[str, list[tuple[float, int]]] = {}
    # every method once, untimed, on the smallest batch: the first call's lazy set-up (autograd, the allocator)
    # was timed with the first subset, B-cos first in line
    smallest = min(batches.values(), key=len)
    explain(model, smallest.input_ids, smallest.attention_mask, target=smallest.target_ids, foil=smallest.foil_ids)
    captum_scores(model, smallest)
    for subset, batch in batches.items():
        start = time.perf_counter()
        expl = explain(model, batch.input_ids, batch.attention_mask, target=batch.target_ids, foil=batch.foil_ids)
        bcos_seconds = time.perf_counter() - start
        scores, timings = captum_scores(model, batch)
        scores = {"B-cos": expl.contributions, **scores}
        timings = {"B-cos": bcos_seconds, **timings}
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           position_ids=real_token_positions(batch.attention_mask)).logits[:, -1]
        row = {"n": len(batch), "dropped": len(batch.dropped),
               "probability_gap": float(probability_gap(logits, batch.target_ids, batch.foil_ids).mean()),
               "accuracy": float((logits.gather(1, batch.target_ids[:, None]) >
                                  logits.gather(1, batch.foil_ids[:, None])).float().mean()),
               "completeness_error_max": float(expl.completeness_error.max()),
               "completeness_abs_error_max": float((expl.total - expl.logits).abs().max()),
               "seconds_per_example": {m: timings[m] / len(batch) for m in METHODS}}
        for method in METHODS:
            seconds.setdefault(method, []).append((timings[method], len(batch)))
        for method in METHODS:
            result = mean_reciprocal_rank(scores[method], batch.evidence, batch.candidates)
            row[method] = result.mrr
            row["Random"] = result.random
        results[subset] = row

    header = f"{'subset':6} {'n':>4} {'Random':>7} " + " ".join(f"{m:>14}" for m in METHODS) + \
        f" {'p gap':>8} {'acc':>5} {'rel.err':>8} {'abs.err':>8}"
    lines = [header]
    for subset, row in results.items():
        lines.append(f"{subset:6} {row['n']:4d} {row['Random']:7.4f} " +
                     " ".join(f"{row[m]:14.4f}" for m in METHODS) +
                     f" {row['probability_gap']:8.4f} {row['accuracy']:5.2f} {row['completeness_error_max']:8.1e}"
                     f" {row['completeness_abs_error_max']:8.1e}")
    means = {m: sum(r[m] for r in results.values()) / len(results) for m in ["Random", *METHODS]}
    lines.append(f"{'mean':6} {'':4} {means['Random']:7.4f} " + " ".join(f"{means[m]:14.4f}" for m in METHODS))
    per_example = seconds_per_explanation(seconds)  # total time over total explanations, not a mean of batch means
    lines.append("seconds per explanation: " + ", ".join(f"{m} {per_example[m] * 1e3:.2f} ms" for m in METHODS))
    table = "\n".join(lines)
    print(table)
    (OUT / "results.txt").write_text(table + "\n")
    (OUT / "results.json").write_text(json.dumps({"epochs": cfg.epochs, "train_sentences": len(train),
                                                  "vocabulary": len(vocab), "train_loss": [losses[0], losses[-1]],
                                                  "train_seconds": train_seconds, "subsets": results,
                                                  "mean": means}, indent=2))
    print(f"wrote {OUT / 'results.txt'} and {OUT / 'results.json'}")


if __name__ == "__main__":
    main()
