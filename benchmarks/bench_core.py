"""Core speed ratios, measured side by side in one run on the same inputs (issue 3 targets).

- explanation: B-cos ``explain`` on the B-cos model / Captum InputXGradient at the same attribution point
  (the combined embedding, ``LayerGradientXActivation`` on the embedding LayerNorm's input) on the
  conventional model of the same architecture. Goal <= 1.3.
- forward: B-cos forward / conventional forward. Goal <= 1.5.

The architecture is all-MiniLM-L6-v2's (a 6-layer BERT, hidden 384) built from its config with random
weights, so the benchmark needs no download. Timings interleave the two models and report medians.
Environment: BENCH_BATCH (16), BENCH_LEN (64), BENCH_REPEATS (7), BENCH_THREADS (1: single-threaded
timings are stable on a shared machine; 0 keeps torch's default).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from captum.attr import LayerGradientXActivation
from transformers import BertConfig, BertForSequenceClassification

from bcos_plugins import bcosify, explain
from bcos_plugins.pretrained import minilm_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.settings import env_int


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    batch = env_int("BENCH_BATCH", 16, minimum=1)
    length = env_int("BENCH_LEN", 64, minimum=1)
    repeats = env_int("BENCH_REPEATS", 7, minimum=1)
    threads = env_int("BENCH_THREADS", 1, minimum=0)
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    try:
        config = BertConfig.from_pretrained(minilm_path())
    except ImportError:
        config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    config.num_labels = 2
    conventional = BertForSequenceClassification(config).eval()
    bcos = bcosify(BertForSequenceClassification(config), b=1.5, verbose=False).eval()
    ids = torch.randint(1000, config.vocab_size, (batch, length))
    mask = torch.ones_like(ids)

    ixg = LayerGradientXActivation(lambda i, m: conventional(input_ids=i, attention_mask=m).logits,
                                   conventional.bert.embeddings.LayerNorm)
    with torch.no_grad():
        target = conventional(input_ids=ids, attention_mask=mask).logits.argmax(-1)

    def run_ixg():
        ixg.attribute(ids, target=target, additional_forward_args=(mask,), attribute_to_layer_input=True)

    def run_bcos():
        explain(bcos, ids, mask)

    def fwd(model):
        def f():
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask)
        return f

    for f in (run_ixg, run_bcos, fwd(conventional), fwd(bcos)):  # warm-up
        f()
    t = {k: [] for k in ("ixg", "bcos", "fwd_conv", "fwd_bcos")}
    for _ in range(repeats):  # interleaved so that machine load affects both sides alike
        t["ixg"] += _time(run_ixg, 1)
        t["bcos"] += _time(run_bcos, 1)
        t["fwd_conv"] += _time(fwd(conventional), 1)
        t["fwd_bcos"] += _time(fwd(bcos), 1)
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"MiniLM-L6 architecture, batch {batch} x {length} tokens, median of {repeats} interleaved runs, "
          f"{torch.get_num_threads()} thread(s)")
    print("| measurement | seconds | ratio | goal |")
    print("|---|---|---|---|")
    print(f"| Captum IxG, conventional | {med['ixg']:.4f} | | |")
    print(f"| B-cos explain, B-cos | {med['bcos']:.4f} | {med['bcos'] / med['ixg']:.2f} | <= 1.3 |")
    print(f"| forward, conventional | {med['fwd_conv']:.4f} | | |")
    print(f"| forward, B-cos | {med['fwd_bcos']:.4f} | {med['fwd_bcos'] / med['fwd_conv']:.2f} | <= 1.5 |")


if __name__ == "__main__":
    main()
