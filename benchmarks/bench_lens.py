"""TransformerLens benchmarks: B-cos forward vs plain (goal: ratio <= 1.5) and the token x component decomposition.

1. Forward (``--what forward``): B-cos TransformerLens forward vs a plain TransformerLens forward of the same size.

Both models are ``HookedTransformer``s with the same config (GPT-2 layout: LayerNorm, GELU, learned
positions; or the Llama layout: RMSNorm, SiLU gated MLP, rotary, grouped-query attention) and the same
weights; the B-cos one (:class:`BcosHookedTransformer`, B = 1.5, every projection B-cos) computes the
B-cos scales on every forward (its unit-norm weights are cached while gradients are off, as in analysis
workloads). ``--repeats`` paired rounds, each calling both once in a fresh seeded random order after one
warm-up call each (benchmarks/common/paired_timing.py; on CUDA each call between two device synchronisations);
the ratio printed is the median [interquartile range] of the per-round ratios, on the wall clock and on the
benchmark thread's CPU time (until 2026-11-28: the ratio of the two medians over a fixed alternation, plain
first, and the process' CPU time; docs/benchmarks.md#bench-core-method says why that changed), along with each
side's median time, tokens per second and the peak memory of one forward (CUDA only).

On CPU the run uses one thread by default (``--threads``): on a shared machine multi-threaded wall-clock
timings swing by 2x between runs, single-threaded ones by a few percent.

2. Token x component decomposition (``--what components``): a 6-layer, 8-head B-cos model over 64 tokens;
   :func:`token_component_decomposition` (one top-down batched backward) timed next to one ``explain_logits``
   call and next to the plain loop of one backward pass per component, each from that component's own scalar
   (goal: >= 3x faster than the loop), in paired rounds of the three (and a bare matrix product, and a second copy
   of the batched decomposition as the self-control), each round in a fresh seeded order, ratios the median [IQR]
   of the per-round ratios (wall clock; on CPU also the thread's CPU time); the tables of the two
   decompositions are checked equal. The floating-point operations of each call are counted too
   (``torch.utils.flop_counter``): both decompositions do the same arithmetic (each component's gradient
   crosses the blocks below it once), so their time ratio is what batching alone buys on the device.

    python benchmarks/bench_lens.py                     # both; forward: GPT-2-small width, 4 layers, 1 thread
    python benchmarks/bench_lens.py --what components   # the decomposition only
    python benchmarks/bench_lens.py --layout llama
    python benchmarks/bench_lens.py --threads 0         # torch's default thread count
    python benchmarks/bench_lens.py --device cuda --batch 16 --seq 512 --layers 12
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from bcos_plugins.adapters.transformer_lens import (
    BcosHookedTransformer,
    BcosTransformerConfig,
    explain_logits,
    token_component_decomposition,
)
from torch.utils.flop_counter import FlopCounterMode
from transformer_lens import HookedTransformer, HookedTransformerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.paired_timing import paired_rounds

warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)

LAYOUTS = {
    "gpt2": dict(act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard"),
    "llama": dict(act_fn="silu", gated_mlp=True, normalization_type="RMS", positional_embedding_type="rotary",
                  final_rms=True),
}


def _models(args):
    size = dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, d_head=args.d_model // args.heads,
                d_mlp=4 * args.d_model if args.layout == "gpt2" else 8 * args.d_model // 3, d_vocab=args.vocab,
                n_ctx=args.seq, device=args.device, seed=0)
    if args.layout == "llama":
        size["n_key_value_heads"] = args.heads // 2
    plain = HookedTransformer(HookedTransformerConfig(**size, **LAYOUTS[args.layout])).eval()
    bcos = BcosHookedTransformer(BcosTransformerConfig(**size, **LAYOUTS[args.layout], bcos_b=args.b)).eval()
    # same weights (the B-cos model has no biases; the plain model's are zero after init)
    bcos.load_state_dict({k: v for k, v in plain.state_dict().items() if k in bcos.state_dict()})
    return plain, bcos


def _synchronize(device: str):
    """What paired_rounds runs around each timed call: a CUDA call returns once its kernels are queued."""
    return torch.cuda.synchronize if device == "cuda" else None


def _peak_mib(model, tokens, device) -> float | None:
    if device != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    model(tokens)
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def bench_components(args) -> None:
    """Token x component decomposition of a 6-layer, 8-head model over 64 tokens vs explain and the loop."""
    cfg = BcosTransformerConfig(d_model=256, n_layers=6, n_heads=8, d_head=32, d_mlp=1024, d_vocab=args.vocab,
                                n_ctx=64, device=args.device, seed=0, bcos_b=args.b, **LAYOUTS["gpt2"])
    model = BcosHookedTransformer(cfg).eval()
    tokens = torch.randint(0, args.vocab, (1, 64), generator=torch.Generator().manual_seed(0)).to(args.device)
    calls = {
        "explain_logits": lambda: explain_logits(model, tokens, target=5),
        "decomposition (batched)": lambda: token_component_decomposition(model, tokens, target=5),
        "loop, 1 backward/component": lambda: token_component_decomposition(model, tokens, target=5, batched=False),
    }
    results = {name: call() for name, call in calls.items()}  # warm-up, and the numbers to compare
    flops = {}
    for name, call in calls.items():
        with FlopCounterMode(display=False) as counter:
            call()
        flops[name] = counter.get_total_flops()
    batched, loop = results["decomposition (batched)"], results["loop, 1 backward/component"]
    torch.testing.assert_close(batched.table, loop.table, rtol=1e-4, atol=1e-5)
    # The ceiling for any method that does the loop's arithmetic: the device's own matrix-product rate on the
    # largest product of the batched sweep (every component's gradient through an MLP: 54 x 64 rows, 256 -> 1024),
    # timed in the same rounds
    rows, d_model, d_mlp = (len(batched.labels) - 1) * tokens.shape[1], cfg.d_model, cfg.d_mlp
    a = torch.randn(rows, d_model, device=args.device)
    b = torch.randn(d_model, d_mlp, device=args.device)
    a @ b  # warm-up, as the three calls' results above
    product = "matrix product"
    # the self-control: the batched decomposition against a second copy of itself, the noise floor of the ratios
    control = "decomposition (batched), again"
    timed = paired_rounds({**calls, control: calls["decomposition (batched)"], product: lambda: a @ b}, args.repeats,
                          warm_up=0, synchronize=_synchronize(args.device))  # warmed up above
    wall = {name: timed.median(name, "wall") for name in calls}
    print(f"\nToken x component decomposition: 6 layers x 8 heads (d_model 256, {len(batched.labels)} components), "
          f"64 tokens, B={args.b}, device={args.device}, threads={torch.get_num_threads()}, {args.repeats} rounds; "
          f"completeness error {float(batched.completeness_error.max()):.1e}")
    for name in calls:
        print(f"  {name:28s}: median {wall[name] * 1e3:8.1f} ms, {flops[name] / 1e9:6.2f} GFLOP "
              f"({flops[name] / wall[name] / 1e9:5.1f} GFLOP/s)")
    ratio = timed.ratio("loop, 1 backward/component", "decomposition (batched)", "wall")
    per_explain = timed.ratio("decomposition (batched)", "explain_logits", "wall")
    print(f"loop / batched = {ratio.cell()}x (median [IQR] of paired ratios; goal >= 3: "
          f"{'met' if ratio.median >= 3 else 'NOT met'}); batched / one explain call = {per_explain.cell()}x")
    peak = 2 * rows * d_model * d_mlp / timed.median(product, "wall")
    loop_rate = flops["loop, 1 backward/component"] / wall["loop, 1 backward/component"]
    print(f"device matrix-product rate ({rows}x{d_model} @ {d_model}x{d_mlp}): {peak / 1e9:.1f} GFLOP/s; the loop "
          f"runs at {loop_rate / 1e9:.1f}, so doing its arithmetic at the device's peak would be "
          f"{peak / loop_rate:.2f}x the loop at most")
    if args.device == "cpu":  # the thread's CPU time: steadier than the wall clock on a shared machine (a GPU's
        # work is not the thread's, so there the wall clock above is the one to read)
        cpu = {name: timed.median(name, "cpu") for name in (*calls, product)}
        cpu_peak = 2 * rows * d_model * d_mlp / cpu[product]
        cpu_loop_rate = flops["loop, 1 backward/component"] / cpu["loop, 1 backward/component"]
        print(f"thread CPU: loop / batched = "
              f"{timed.ratio('loop, 1 backward/component', 'decomposition (batched)', 'cpu').cell()}x, batched / "
              f"one explain call = {timed.ratio('decomposition (batched)', 'explain_logits', 'cpu').cell()}x, "
              f"self-control (batched / batched again) = "
              f"{timed.ratio('decomposition (batched)', control, 'cpu').cell()}x; matrix-product rate "
              f"{cpu_peak / 1e9:.1f} GFLOP/s, the loop {cpu_loop_rate / 1e9:.1f} ({cpu_peak / cpu_loop_rate:.2f}x "
              f"at most); " + ", ".join(f"{name} {cpu[name] * 1e3:.1f} ms" for name in calls))
    print(f"self-control (batched / batched again), wall: {timed.ratio('decomposition (batched)', control, 'wall').cell()}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=("all", "forward", "components"), default="all")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="gpt2")
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--b", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch's default)")
    parser.add_argument("--grad", action="store_true",
                        help="forward with gradients on (training / explaining: unit weights recomputed)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.what in ("all", "forward"):
        bench_forward(args)
    if args.what in ("all", "components"):
        bench_components(args)


def bench_forward(args) -> None:
    plain, bcos = _models(args)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
    with torch.inference_mode(not args.grad):
        timed = paired_rounds({"plain": lambda: plain(tokens), "bcos": lambda: bcos(tokens)}, args.repeats,
                              warm_up=1, synchronize=_synchronize(args.device))
        peaks = {name: _peak_mib(m, tokens, args.device) for name, m in (("plain", plain), ("bcos", bcos))}
    n_tokens = args.batch * args.seq
    print(f"TransformerLens forward, {args.layout} layout, d_model={args.d_model}, layers={args.layers}, "
          f"batch={args.batch}x{args.seq}, device={args.device}, threads={torch.get_num_threads()}, B={args.b}, "
          f"{args.repeats} paired rounds in seeded random order, gradients {'on' if args.grad else 'off'}")
    for name in ("plain", "bcos"):
        wall, cpu = timed.median(name, "wall"), timed.median(name, "cpu")
        peak = f", peak {peaks[name]:.0f} MiB" if peaks[name] is not None else ""
        print(f"  {name:5s}: median {wall * 1e3:8.2f} ms wall, {cpu * 1e3:8.2f} ms thread CPU  "
              f"({n_tokens / wall:8.0f} tokens/s){peak}")
    print(f"ratio B-cos / plain, median [IQR] of paired ratios = {_forward_ratio_line(timed)}")


def _forward_ratio_line(timed) -> str:
    """The forward's B-cos / plain ratios (wall, then thread CPU) and the goal, judged on the wall median."""
    wall, cpu = timed.ratio("bcos", "plain", "wall"), timed.ratio("bcos", "plain", "cpu")
    return (f"{wall.cell()} wall, {cpu.cell()} thread CPU  "
            f"(goal <= 1.5 wall: {'met' if wall.median <= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
