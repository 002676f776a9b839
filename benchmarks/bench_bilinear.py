"""Interaction spectra of a bilinear layer: our streamed path vs the naive einsum that builds the tensor.

Task: the eigenvalues of ``Q(u)`` for ``n`` output directions of a layer with ``d_in = 512``,
``d_hidden = 2048`` (``d_out = d_in``, as in a transformer MLP), ``n = 64``.

- ours: :func:`bcos_plugins.bilinear.interaction_spectra`: ``Q(u) = W^T diag(P^T u) V`` for a few
  directions at a time, symmetrised, ``eigvalsh``; never more than ``chunk`` matrices alive.
- naive: ``B = einsum("oh,hi,hj->oij", P, W, V)`` (the full ``d_out x d_in x d_in`` tensor), symmetrised,
  ``Q = einsum("ko,oij->kij", U, B)``, ``eigvalsh``.

Each path runs in its own subprocess so that peak memory is its own: peak resident memory (Linux
``VmHWM``, reset through ``/proc/self/clear_refs`` just before the work) minus resident memory at that
point. Torch allocates tensors through malloc, which ``tracemalloc`` does not see, so RSS is the honest
measure on CPU. Both paths get the same weights and directions; their spectra are compared.

    python benchmarks/bench_bilinear.py                 # the configuration above
    python benchmarks/bench_bilinear.py --d-in 128 --d-hidden 512 --directions 16   # quick
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (needs Linux)")


def _setup(args):
    g = torch.Generator().manual_seed(0)
    scale = args.d_in ** -0.5
    W = torch.randn(args.d_hidden, args.d_in, generator=g) * scale
    V = torch.randn(args.d_hidden, args.d_in, generator=g) * scale
    P = torch.randn(args.d_out, args.d_hidden, generator=g) * args.d_hidden ** -0.5
    U = torch.randn(args.directions, args.d_out, generator=g)
    return W, V, P, U / U.norm(dim=1, keepdim=True)


def _ours(W, V, P, U, chunk, clock):
    """``interaction_spectra`` unrolled so that building Q and eigvalsh are timed apart."""
    from bcos_plugins.bilinear import iter_interaction_matrices

    spectra = []
    stream = iter_interaction_matrices((W, V, P), U, chunk_size=chunk)
    while True:
        with clock("build"):
            q = next(stream, None)
        if q is None:
            return torch.cat(spectra)
        with clock("eigvalsh"):
            spectra.append(torch.linalg.eigvalsh(q))


def _naive(W, V, P, U, chunk, clock):
    with clock("build"):
        tensor = torch.einsum("oh,hi,hj->oij", P, W, V)
        tensor = 0.5 * (tensor + tensor.mT)
        q = torch.einsum("ko,oij->kij", U, tensor)
    with clock("eigvalsh"):
        return torch.linalg.eigvalsh(q)


class _Clock:
    def __init__(self):
        self.seconds = {"build": 0.0, "eigvalsh": 0.0}

    def __call__(self, part):
        clock = self

        class _Part:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                clock.seconds[part] += time.perf_counter() - self.start

        return _Part()


def _worker(args) -> None:
    W, V, P, U = _setup(args)
    run = {"ours": _ours, "naive": _naive}[args.worker]
    run(W[:8, :8], V[:8, :8], P[:8, :8], U[:2, :8], args.chunk, _Clock())  # imports, first calls: untimed
    clock = _Clock()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter
    base = _rss_kib("VmRSS")
    start = time.perf_counter()
    spectra = run(W, V, P, U, args.chunk, clock)
    seconds = time.perf_counter() - start
    peak = _rss_kib("VmHWM") - base
    torch.save(spectra, args.result)
    print(json.dumps({"seconds": seconds, "peak_mib": peak / 1024, **clock.seconds}))


def _run_worker(args, which: str, result: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", which, "--result", str(result),
           "--d-in", str(args.d_in), "--d-hidden", str(args.d_hidden), "--d-out", str(args.d_out),
           "--directions", str(args.directions), "--chunk", str(args.chunk), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-in", type=int, default=512)
    parser.add_argument("--d-hidden", type=int, default=2048)
    parser.add_argument("--d-out", type=int, default=None, help="default: d_in")
    parser.add_argument("--directions", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=8)
    # One thread by default: on a shared machine, multi-threaded LAPACK spin-waits and timings become noise.
    parser.add_argument("--threads", type=int, default=1, help="torch threads in both paths; 0 = torch's default")
    parser.add_argument("--worker", choices=["ours", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.d_out = args.d_out or args.d_in
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        _worker(args)
        return

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ours = _run_worker(args, "ours", Path(tmp) / "ours.pt")
        naive = _run_worker(args, "naive", Path(tmp) / "naive.pt")
        difference = (torch.load(Path(tmp) / "ours.pt") - torch.load(Path(tmp) / "naive.pt")).abs().max().item()
    tensor_mib = args.d_out * args.d_in ** 2 * 4 / 2**20
    print(f"interaction spectra: d_in={args.d_in} d_hidden={args.d_hidden} d_out={args.d_out} "
          f"directions={args.directions} (float32, {torch.get_num_threads()} threads; full tensor = {tensor_mib:.0f} MiB)")
    for name, r in ((f"ours  (streamed Q(u), chunk={args.chunk})", ours), ("naive (einsum, full tensor)", naive)):
        print(f"  {name:34s} total {r['seconds']:7.2f} s (build Q {r['build']:6.2f} s, eigvalsh {r['eigvalsh']:6.2f} s)"
              f"   peak +{r['peak_mib']:8.1f} MiB")
    flop_ratio = (args.d_out * args.d_hidden + args.directions * args.d_out) / (args.directions * args.d_hidden)
    print(f"  speed-up end to end x{naive['seconds'] / ours['seconds']:.1f} (goal >= 10); building Q "
          f"x{naive['build'] / ours['build']:.1f} (FLOP ratio {flop_ratio:.1f}); "
          f"memory 1/{naive['peak_mib'] / max(ours['peak_mib'], 1e-9):.1f} (goal <= 1/10); "
          f"max |spectrum difference| = {difference:.2e}")


if __name__ == "__main__":
    main()
