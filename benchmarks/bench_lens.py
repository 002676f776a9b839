"""TransformerLens benchmarks: B-cos forward vs plain (goal: ratio <= 1.5) and the token x component decomposition.

1. Forward (``--what forward``): B-cos TransformerLens forward vs a plain TransformerLens forward of the same size.

Both models are ``HookedTransformer``s with the same config (GPT-2 layout: LayerNorm, GELU, learned
positions; or the Llama layout: RMSNorm, SiLU gated MLP, rotary, grouped-query attention) and the same
weights; the B-cos one (:class:`BcosHookedTransformer`, B = 1.5, every projection B-cos) computes the
B-cos scales on every forward (its unit-norm weights are cached while gradients are off, as in analysis
workloads). Timings alternate between the two models (``--repeats`` rounds, each timing both) so that
machine load hits both alike; the ratio of the medians is printed for wall-clock time and for the
process' CPU time, along with tokens per second and the peak memory of one forward (CUDA only).

On CPU the run uses one thread by default (``--threads``): on a shared machine multi-threaded wall-clock
timings swing by 2x between runs, single-threaded ones by a few percent.

2. Token x component decomposition (``--what components``): a 6-layer, 8-head B-cos model over 64 tokens;
   :func:`token_component_decomposition` (one top-down batched backward) timed next to one ``explain_logits``
   call and next to the plain loop of one backward pass per component, each from that component's own scalar
   (goal: >= 3x faster than the loop), alternating the three in each round; the tables of the two
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
import statistics
import time
import warnings

import torch
from bcos_plugins.adapters.transformer_lens import (
    BcosHookedTransformer,
    BcosTransformerConfig,
    explain_logits,
    token_component_decomposition,
)
from torch.utils.flop_counter import FlopCounterMode
from transformer_lens import HookedTransformer, HookedTransformerConfig

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


def _time(model, tokens, device) -> tuple[float, float]:
    """(wall-clock seconds, process CPU seconds) of one forward."""
    if device == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    model(tokens)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


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
    times: dict[str, list[float]] = {name: [] for name in calls}
    product_times = []
    for _ in range(args.repeats):
        for name, call in calls.items():
            times[name].append(_time_call(call, args.device))
        product_times.append(_time_call(lambda: a @ b, args.device))
    wall = {name: statistics.median(t) for name, t in times.items()}
    print(f"\nToken x component decomposition: 6 layers x 8 heads (d_model 256, {len(batched.labels)} components), "
          f"64 tokens, B={args.b}, device={args.device}, threads={torch.get_num_threads()}, {args.repeats} rounds; "
          f"completeness error {float(batched.completeness_error.max()):.1e}")
    for name in calls:
        print(f"  {name:28s}: median {wall[name] * 1e3:8.1f} ms, {flops[name] / 1e9:6.2f} GFLOP "
              f"({flops[name] / wall[name] / 1e9:5.1f} GFLOP/s)")
    ratio = wall["loop, 1 backward/component"] / wall["decomposition (batched)"]
    print(f"loop / batched = {ratio:.2f}x (goal >= 3: {'met' if ratio >= 3 else 'NOT met'}); "
          f"batched / one explain call = {wall['decomposition (batched)'] / wall['explain_logits']:.2f}x")
    peak = 2 * rows * d_model * d_mlp / statistics.median(product_times)
    loop_rate = flops["loop, 1 backward/component"] / wall["loop, 1 backward/component"]
    print(f"device matrix-product rate ({rows}x{d_model} @ {d_model}x{d_mlp}): {peak / 1e9:.1f} GFLOP/s; the loop "
          f"runs at {loop_rate / 1e9:.1f}, so doing its arithmetic at the device's peak would be "
          f"{peak / loop_rate:.2f}x the loop at most")


def _time_call(call, device) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


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
    times = {"plain": [], "bcos": []}
    with torch.inference_mode(not args.grad):
        for model in (plain, bcos):  # warm-up
            model(tokens)
        for _ in range(args.repeats):
            times["plain"].append(_time(plain, tokens, args.device))
            times["bcos"].append(_time(bcos, tokens, args.device))
        peaks = {name: _peak_mib(m, tokens, args.device) for name, m in (("plain", plain), ("bcos", bcos))}
    n_tokens = args.batch * args.seq
    print(f"TransformerLens forward, {args.layout} layout, d_model={args.d_model}, layers={args.layers}, "
          f"batch={args.batch}x{args.seq}, device={args.device}, threads={torch.get_num_threads()}, B={args.b}, "
          f"{args.repeats} alternating rounds, gradients {'on' if args.grad else 'off'}")
    wall = {name: statistics.median(t[0] for t in times[name]) for name in times}
    cpu = {name: statistics.median(t[1] for t in times[name]) for name in times}
    for name in ("plain", "bcos"):
        peak = f", peak {peaks[name]:.0f} MiB" if peaks[name] is not None else ""
        print(f"  {name:5s}: median {wall[name] * 1e3:8.2f} ms wall, {cpu[name] * 1e3:8.2f} ms CPU  "
              f"({n_tokens / wall[name]:8.0f} tokens/s){peak}")
    ratio = wall["bcos"] / wall["plain"]
    print(f"ratio B-cos / plain = {ratio:.2f} wall, {cpu['bcos'] / cpu['plain']:.2f} CPU time  "
          f"(goal <= 1.5 wall: {'met' if ratio <= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
