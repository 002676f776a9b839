"""Core speed ratios, measured side by side in one run on the same inputs (goals of issues 30 and 28).

- explanation: B-cos ``explain`` on the B-cos model / Captum InputXGradient at the same attribution point
  (the combined embedding, ``LayerGradientXActivation`` on the embedding LayerNorm's input) on the
  conventional model of the same architecture. Goal <= 1.05.
- forward: B-cos forward / conventional forward. Goal <= 1.10.
- both again on the reference path (``bcos_plugins.nn.functional.reference_path``: the step-by-step maths the
  fused kernels are tested against), in the same interleaved run, so the fused kernels' gain is measured.

The architecture is all-MiniLM-L6-v2's (a 6-layer BERT, hidden 384) built from its config with random
weights, so the benchmark needs no download. Timings run in paired rounds (``benchmarks/common/paired_timing.py``):
every callable once per round in a fresh, seeded random order, each ratio the median over the rounds of the two
calls' ratio in that round, printed with its interquartile range, on two clocks: the CPU time of the benchmark's
thread (``time.thread_time``: only what the thread ran, the steadier on a shared machine; with BENCH_THREADS=1 all
of the benchmark's work) and wall-clock time. A self-control row (the conventional forward against a second
copy of itself in the same rounds) shows the run's noise floor. The forwards run in rounds of their own before any
explanation (``_forwards_then_explanations`` says why). Until 2026-11-28 the callables ran in one fixed order, the
forwards among the explanations, and the ratio was of separate medians of 7: MiniLM's forward ratio read 1.09 where a
forward-only process measures 1.14-1.16 (docs/benchmarks.md#bench-core-method).
Two more tables have a row per family added with the architecture registry (Mistral, Qwen2, Qwen3, Gemma 2
causal LMs, a ModernBERT classifier), 2 layers each: at a small shape (hidden 128, batch 4 x 32 tokens), where a
forward takes milliseconds and each B-cos layer's extra kernel launches show, and at MiniLM's width and batch (hidden
384, MLP 1536, 16 x 64 tokens), the shape the MiniLM table and the goals are judged at. The same
two ratios, Captum's IxG taken at the conventional model's attribution point. For a causal LM (explained at the
next token after the prompt) IxG's forward passes ``logits_to_keep=1`` and ``use_cache=False``: it computes only
the explained column's logits and no key/value cache, as ``explain`` does, so the ratio is the cost of exactness
and not work the baseline does that ``explain`` skips (until 2026-11-28 IxG computed every column's logits and the
cache: Qwen2's ratio was 0.98 against it, 1.06 against this baseline; docs/benchmarks.md).
Environment: BENCH_BATCH (16), BENCH_LEN (64), BENCH_REPEATS (7: MiniLM's paired rounds), BENCH_FAMILY_ROUNDS (25:
each family's at the small shape; its calls take milliseconds), BENCH_FAMILY_WIDE_ROUNDS (9: at MiniLM's shape), BENCH_SEED (0: the rounds' orders), BENCH_THREADS (1:
single-threaded timings are stable on a shared machine; 0 keeps torch's default).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from captum.attr import LayerGradientXActivation
from transformers import BertConfig, BertForSequenceClassification

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import text_attribution_point
from bcos_plugins.convert.architectures import spec_for
from bcos_plugins.nn.functional import reference_path
from bcos_plugins.pretrained import minilm_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.paired_timing import PairedRounds, paired_rounds
from benchmarks.common.settings import env_int, no_command_line_arguments

FORWARD_GOAL = 1.10
EXPLAIN_GOAL = 1.05
GOALS = "issues 30 and 28"


def _ratio_cells(timed: PairedRounds, numerator: str, denominator: str) -> str:
    """``thread CPU ratio [quartiles] | wall ratio [quartiles]``: two table cells, each the median of the paired
    per-round ratios and their interquartile range."""
    return " | ".join(timed.ratio(numerator, denominator, clock).cell() for clock in ("cpu", "wall"))


def _forwards_then_explanations(forwards: dict, explanations: dict, rounds: int, seed: int) -> PairedRounds:
    """The forward callables' paired rounds, then the explaining ones' (each set paired only within itself).

    Forwards first, in their own rounds: an explanation allocates hundreds of MB, after which glibc keeps a heap that
    serves every later forward without a page fault, while a process that only predicts faults its activations in
    afresh on every call (MiniLM 16 x 64: about 12,000 minor faults per conventional forward, 20,000 per B-cos one,
    whose extra temporaries fault too); interleaved with explanations the forward ratio was 0.03-0.04 lower than a
    forward-only process measures (docs/benchmarks.md#bench-core-method)."""
    forward = paired_rounds(forwards, rounds, seed=seed)
    explaining = paired_rounds(explanations, rounds, seed=seed)
    return PairedRounds({**forward.seconds, **explaining.seconds}, forward.orders + explaining.orders)


# The two shapes of the family table: the registry's small shape, where a forward is a few milliseconds and every
# extra kernel launch shows, and MiniLM's own width and batch (the MiniLM table above), where the matrix products
# dominate as they do in every real model (2026-11-29 decision, docs/benchmarks.md#family-shapes)
FAMILY_SHAPES = {
    "small": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  batch=4, length=32),
    "MiniLM": dict(hidden_size=384, intermediate_size=1536, num_attention_heads=12, num_key_value_heads=4, head_dim=32,
                   batch=16, length=64),
}


def _family_models(shape: str = "small") -> dict:
    """(stock class, tiny config) per family the registry added, 2 layers at one of ``FAMILY_SHAPES``' widths."""
    import transformers as T

    size = FAMILY_SHAPES[shape]
    common = dict(vocab_size=1000, hidden_size=size["hidden_size"], intermediate_size=size["intermediate_size"],
                  num_attention_heads=size["num_attention_heads"], num_hidden_layers=2, max_position_embeddings=256,
                  pad_token_id=0)
    rotary = dict(common, num_key_value_heads=size["num_key_value_heads"], bos_token_id=1, eos_token_id=2)
    return {
        "Mistral": (T.MistralForCausalLM, T.MistralConfig(**rotary)),
        "Qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**rotary)),
        "Qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(**rotary, head_dim=size["head_dim"])),
        "Gemma 2": (T.Gemma2ForCausalLM, T.Gemma2Config(**rotary, head_dim=size["head_dim"])),
        "ModernBERT": (T.ModernBertForSequenceClassification,
                       T.ModernBertConfig(**common, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                          num_labels=2)),
    }


def _family_rounds(cls, config, rounds: int, batch: int, length: int, seed: int) -> PairedRounds:
    """One family's paired rounds: B-cos and conventional forward, B-cos explain and Captum IxG, and the
    conventional forward and IxG a second time (the self-control)."""
    torch.manual_seed(0)
    conventional = cls(config).eval()
    bcos = bcosify(cls(config), b=1.25, verbose=False).eval()
    ids = torch.randint(3, config.vocab_size, (batch, length))
    mask = torch.ones_like(ids)
    point = text_attribution_point(conventional)
    # a causal LM is explained at the next token after the prompt: IxG computes that column's logits only and builds
    # no key/value cache, as a user explaining the next token would call it (and as explain does)
    only_explained = ({"logits_to_keep": 1, "use_cache": False} if spec_for(conventional).head == "causal_lm"
                      else {})

    def logits(i, m):
        out = conventional(input_ids=i, attention_mask=m, **only_explained).logits
        return out if out.ndim == 2 else out[:, -1]

    with torch.no_grad():
        target = logits(ids, mask).argmax(-1)
    ixg = LayerGradientXActivation(logits, point.module)

    def fwd(model):
        return torch.no_grad()(lambda: model(input_ids=ids, attention_mask=mask))

    def run_ixg():
        ixg.attribute(ids, target=target, additional_forward_args=(mask,),
                      attribute_to_layer_input=point.where == "input")

    # the *_again callables are the conventional model's calls a second time in the same rounds: the noise floor
    return _forwards_then_explanations(
        {"fwd_conv": fwd(conventional), "fwd_conv_again": fwd(conventional), "fwd_bcos": fwd(bcos)},
        {"ixg": run_ixg, "ixg_again": run_ixg, "bcos": lambda: explain(bcos, ids, mask, target=target)}, rounds, seed)


def family_rows(rounds: int, shape: str = "small", seed: int = 0) -> list[str]:
    """Markdown rows at one of ``FAMILY_SHAPES``: family, then B-cos forward / conventional forward, B-cos explain /
    Captum IxG, conventional forward / itself and IxG / itself, each the median of paired per-round ratios
    [interquartile range] in thread CPU time, then the first two in wall-clock time."""
    batch, length = FAMILY_SHAPES[shape]["batch"], FAMILY_SHAPES[shape]["length"]
    rows = []
    for family, (cls, config) in _family_models(shape).items():
        timed = _family_rounds(cls, config, rounds, batch, length, seed)
        cpu = [timed.ratio(n, d, "cpu").cell() for n, d in (("fwd_bcos", "fwd_conv"), ("bcos", "ixg"),
                                                            ("fwd_conv_again", "fwd_conv"), ("ixg_again", "ixg"))]
        wall = [f"{timed.ratio(n, d, 'wall').median:.2f}" for n, d in (("fwd_bcos", "fwd_conv"), ("bcos", "ixg"))]
        rows.append(f"| {family} | {' | '.join(cpu)} | {' / '.join(wall)} |")
    return rows


def main() -> None:
    no_command_line_arguments(__doc__)  # --help prints the settings; other arguments are refused
    batch = env_int("BENCH_BATCH", 16, minimum=1)
    length = env_int("BENCH_LEN", 64, minimum=1)
    rounds = env_int("BENCH_REPEATS", 7, minimum=1)
    family_rounds = env_int("BENCH_FAMILY_ROUNDS", 25, minimum=1)
    family_wide_rounds = env_int("BENCH_FAMILY_WIDE_ROUNDS", 9, minimum=1)
    seed = env_int("BENCH_SEED", 0, minimum=0)
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

    def on_reference_path(f):  # the plain, step-by-step B-cos maths the fused kernels are tested against
        def g():
            with reference_path():
                f()
        return g

    # fwd_conv_again: the conventional forward a second time in the same rounds, the self-control (noise floor)
    timed = _forwards_then_explanations(
        {"fwd_conv": fwd(conventional), "fwd_conv_again": fwd(conventional), "fwd_bcos": fwd(bcos),
         "fwd_bcos_ref": on_reference_path(fwd(bcos))},
        {"ixg": run_ixg, "bcos": run_bcos, "bcos_ref": on_reference_path(run_bcos)}, rounds, seed)
    print(f"MiniLM-L6 architecture, batch {batch} x {length} tokens, {rounds} paired rounds (each callable once per "
          f"round, in a fresh random order, seed {seed}; the forwards' rounds first, then the explanations'), "
          f"{torch.get_num_threads()} thread(s); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}")
    print("Ratio: the median over the rounds of the two calls' ratio in that round [its interquartile range], in the "
          "thread's CPU time (the steadier on a shared machine"
          + ("" if torch.get_num_threads() == 1 else "; with several threads it misses the other threads' work")
          + ") and in wall-clock time. The self-control row is the conventional forward against itself: a ratio "
          "that far from 1 is noise.")
    print("| measurement | median seconds, thread CPU / wall | ratio, thread CPU | ratio, wall | goal |")
    print("|---|---|---|---|---|")
    rows = [("Captum IxG, conventional", "ixg", None, ""), ("B-cos explain, B-cos", "bcos", "ixg", EXPLAIN_GOAL),
            ("B-cos explain, B-cos, reference path", "bcos_ref", "ixg", ""),
            ("forward, conventional", "fwd_conv", None, ""),
            ("forward, conventional again (self-control)", "fwd_conv_again", "fwd_conv", ""),
            ("forward, B-cos", "fwd_bcos", "fwd_conv", FORWARD_GOAL),
            ("forward, B-cos, reference path", "fwd_bcos_ref", "fwd_conv", "")]
    for label, key, base, goal in rows:
        ratio = _ratio_cells(timed, key, base) if base else " | "
        print(f"| {label} | {timed.median(key, 'cpu'):.4f} / {timed.median(key, 'wall'):.4f} | {ratio} | "
              f"{f'<= {goal:.2f} ({GOALS})' if goal else ''} |")
    for shape, rounds_here in (("small", family_rounds), ("MiniLM", family_wide_rounds)):
        size = FAMILY_SHAPES[shape]
        print()
        print(f"Families added with the architecture registry at the {shape} shape (2 layers, hidden "
              f"{size['hidden_size']}, MLP {size['intermediate_size']}, batch {size['batch']} x {size['length']} "
              f"tokens, random weights, B = 1.25), {rounds_here} paired rounds each (forwards, then explanations)")
        print(f"Thread-CPU ratios, median of paired rounds [interquartile range]; the wall-clock medians last; goals <= "
              f"{FORWARD_GOAL:.2f} forward, <= {EXPLAIN_GOAL:.2f} explain ({GOALS}); self-control: the conventional "
              "model's forward and IxG against themselves")
        print("| family | forward B-cos / conventional | B-cos explain / Captum IxG | self-control forward | "
              "self-control IxG | wall: forward / explain |")
        print("|---|---|---|---|---|---|")
        for row in family_rows(rounds_here, shape, seed=seed):
            print(row)

if __name__ == "__main__":
    main()
