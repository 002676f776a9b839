"""Decoders evaluated as the B-cos LM paper does (its Tables 5 and 6), on a small GPT-2 trained here on a CPU.

`make bench-decoders`. The two models of the IOI recipe (benchmarks/common/ioi_recipe.py: a conventional GPT-2
and its B-cosified copy, trained until both solve IOI with held-out templates and held-out names, or loaded from
the recipe's cache) are evaluated on a *different* draw of held-out IOI prompts (another seed): perplexity on the
TinyStories slice's held-out 10%, IOI accuracy, logit difference and probability gap, BLiMP accuracy and
probability gap (pairs 0-49 of each paradigm), and MRR of contrastive explanations against the evidence (IOI:
the IO's earlier mention; BLiMP: bcos_plugins.data.blimp's rules) for B-cos (``explain`` with ``foil=``, B-cos
model only), Grad Norm, IxG and Occlusion (Captum at the combined embedding, as ``captum_scores`` of
benchmarks/common/decoder_baselines.py computes them) and the random baseline, with seconds per explanation.
The measured tables and the search that led to the recipe: docs/benchmarks.md#ioi-recipe-search.

Writes results.md and results.json to BENCH_OUT (default outputs/bench_decoders). Every setting is a BENCH_*
variable read when the run starts (listed in benchmarks/common/ioi_recipe.py); a bad value stops the run before
any work, naming the variable, the value and the fix.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from bcos_plugins import explain
from bcos_plugins.metrics.decoder import mean_reciprocal_rank, next_token_contrast, perplexity

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.decoder_baselines import captum_scores, seconds_per_explanation
from benchmarks.common.ioi_recipe import (
    CONTEXT,
    DecoderData,
    Settings,
    make_data,
    trained_models,
)
from benchmarks.common.settings import no_command_line_arguments

NAMES = {"Saliency": "Grad Norm", "InputXGradient": "IxG", "Occlusion": "Occlusion", "B-cos": "B-cos"}
# B-cos LM paper, Table 6 (GPT-2 small, IOI MRR)
PAPER_IOI_MRR = {"Random": 0.236, "Grad Norm": 0.860, "IxG": 0.111, "Occlusion": 0.852, "B-cos": 1.0}


# ---------------------------------------------------------------- evaluation


def explanation_scores(model, batch, with_bcos: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Token scores and the seconds each method took for the whole ``batch`` (B-cos only on a B-cos model)."""
    scores, seconds = {}, {}
    if with_bcos:
        start = time.perf_counter()
        expl = explain(model, batch.input_ids, batch.attention_mask, target=batch.target_ids, foil=batch.foil_ids)
        seconds["B-cos"] = time.perf_counter() - start
        scores["B-cos"] = expl.contributions.detach()
        scores["completeness_error"] = expl.completeness_error.detach()
    captum, timings = captum_scores(model, batch)
    scores.update(captum)
    seconds.update(timings)
    return scores, seconds


def evaluate(model, data: DecoderData, is_bcos: bool) -> dict:
    with torch.no_grad():
        ppl = perplexity(model, data.heldout_text, bos_token_id=data.eos, max_length=CONTEXT)
    ioi = next_token_contrast(model, data.ioi_test.input_ids, data.ioi_test.attention_mask,
                              target=data.ioi_test.target_ids, foil=data.ioi_test.foil_ids)
    row = {"perplexity": ppl.perplexity, "heldout_tokens": ppl.n_tokens, "ioi_accuracy": ioi.accuracy,
           "ioi_logit_difference": ioi.mean_logit_difference, "ioi_probability_gap": ioi.mean_probability_gap}
    blimp = {s: next_token_contrast(model, b.input_ids, b.attention_mask, target=b.target_ids, foil=b.foil_ids)
             for s, b in data.blimp.items()}
    row["blimp_accuracy"] = sum(c.accuracy for c in blimp.values()) / len(blimp)
    row["blimp_probability_gap"] = sum(c.mean_probability_gap for c in blimp.values()) / len(blimp)
    mrr: dict[str, dict[str, float]] = {"IOI": {}, "BLiMP": {}}
    seconds: dict[str, list[tuple[float, int]]] = {}
    completeness = []
    # every method once, untimed, on the smallest batch: its first call's lazy set-up (autograd, the allocator)
    # was timed with the IOI batch, B-cos and Grad Norm first in line
    explanation_scores(model, min(data.blimp.values(), key=len), is_bcos)
    scores, secs = explanation_scores(model, data.ioi_test, is_bcos)
    completeness += scores.pop("completeness_error", torch.zeros(0)).tolist()
    for method, s in scores.items():
        result = mean_reciprocal_rank(s, data.ioi_test.evidence, data.ioi_test.candidates)
        mrr["IOI"][NAMES[method]], mrr["IOI"]["Random"] = result.mrr, result.random
        seconds.setdefault(NAMES[method], []).append((secs[method], len(data.ioi_test)))
    per_subset: dict[str, dict[str, float]] = {}
    for subset, batch in data.blimp.items():
        scores, secs = explanation_scores(model, batch, is_bcos)
        completeness += scores.pop("completeness_error", torch.zeros(0)).tolist()
        per_subset[subset] = {}
        for method, s in scores.items():
            result = mean_reciprocal_rank(s, batch.evidence, batch.candidates)
            per_subset[subset][NAMES[method]], per_subset[subset]["Random"] = result.mrr, result.random
            seconds.setdefault(NAMES[method], []).append((secs[method], len(batch)))
    for method in next(iter(per_subset.values())):
        mrr["BLiMP"][method] = sum(r[method] for r in per_subset.values()) / len(per_subset)
    row.update(mrr=mrr, blimp_mrr_per_subset=per_subset,
               seconds_per_explanation=seconds_per_explanation(seconds),
               completeness_error_max=max(completeness) if completeness else None)
    return row


def report(results: dict, info: dict, cfg: Settings) -> str:
    def f(x, digits=3):
        return "—" if x is None else f"{x:.{digits}f}"

    lines = ["## Language modelling and task performance", "",
             "| model | perplexity (held-out TinyStories) | IOI acc | IOI logit diff | IOI p gap | BLiMP acc | "
             "BLiMP p gap | training |", "|---|---|---|---|---|---|---|---|"]
    for name, row in results.items():
        t, pre = info[name], info[name].get("constant_rate_phase")
        training = (f"{pre['steps']} + {t['steps']} steps, {pre['train_seconds']:.0f} + {t['train_seconds']:.0f} s"
                    if pre else f"{t['steps']} steps, {t['train_seconds']:.0f} s")
        lines.append(f"| {name} | {row['perplexity']:.2f} | {f(row['ioi_accuracy'])} | "
                     f"{f(row['ioi_logit_difference'], 2)} | {f(row['ioi_probability_gap'])} | "
                     f"{f(row['blimp_accuracy'])} | {f(row['blimp_probability_gap'])} | {training} |")
    unsolved = [name for name in results if not info[name]["solved"]]
    if unsolved:
        lines += ["", f"**Not solved**: {', '.join(unsolved)} stayed below the {cfg.ioi_stop:g} held-out IOI rule "
                  "(the IOI accuracy above is on another draw of held-out prompts)."]
    methods = ["Random", "Grad Norm", "IxG", "Occlusion", "B-cos"]
    lines += ["", "## MRR of contrastive explanations against the evidence (higher is better)", "",
              "| model | task | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for name, row in results.items():
        for task in ("IOI", "BLiMP"):
            lines.append(f"| {name} | {task} | " + " | ".join(f(row["mrr"][task].get(m)) for m in methods) + " |")
    lines.append("| paper (GPT-2 small) | IOI | " + " | ".join(f(PAPER_IOI_MRR[m]) for m in methods) + " |")
    lines += ["", "## Milliseconds per explanation (CPU, 1 thread)", "", "| model | " + " | ".join(methods[1:]) + " |",
              "|---|" + "---|" * (len(methods) - 1)]
    for name, row in results.items():
        sec = row["seconds_per_explanation"]
        lines.append(f"| {name} | " + " | ".join(f(sec[m] * 1e3 if m in sec else None, 2) for m in methods[1:])
                     + " |")
    bcos_err = results.get("bcos", {}).get("completeness_error_max")
    lines += ["", f"B-cos completeness: largest relative error {f(bcos_err, 8)} (contributions sum to the "
              "explained logit difference). IOI: "
              f"{cfg.n_ioi_eval} prompts of the held-out templates and names; BLiMP: pairs 0-{cfg.n_blimp_eval - 1} "
              "of 9 paradigms; held-out perplexity on the last 10% of the TinyStories slice's paragraphs."]
    return "\n".join(lines)


def main() -> None:
    no_command_line_arguments(__doc__)  # --help prints the settings; other arguments are refused
    hf_logging.set_verbosity_error()
    cfg = Settings.from_env()
    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    cfg.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    data = make_data(cfg)
    print(f"data: {len(data.train)} training rows, {len(data.vocab)} GPT-2 ids in use "
          f"({time.perf_counter() - start:.0f} s)")
    conv, bcos, info = trained_models(cfg, data)
    results = {}
    for name, model in (("conventional", conv), ("bcos", bcos)):
        t = time.perf_counter()
        results[name] = evaluate(model, data, is_bcos=name == "bcos")
        print(f"evaluated {name} in {time.perf_counter() - t:.0f} s")
    table = report(results, info, cfg)
    print(table)
    (cfg.out / "results.md").write_text(table + "\n")
    (cfg.out / "results.json").write_text(json.dumps({"settings": cfg.__dict__, "training": info,
                                                  "results": results}, indent=2, default=str))
    print(f"wrote {cfg.out / 'results.md'} and {cfg.out / 'results.json'}")


if __name__ == "__main__":
    main()
