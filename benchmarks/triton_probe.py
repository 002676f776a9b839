"""One short GPU probe of the opt-in Triton kernel (bcos_plugins.nn.triton_kernels): training memory at llama-1b's shape,
and the kernel's own time per tile configuration at the linear layers of minilm, bert-base and gpt2 (issue 30).

Two parts, in this order, within ``--budget-s`` seconds (default 125, counted once torch, transformers and the
package are imported, about 10 s before: a configuration does not start when the longest one so far would end past
it, so that a run ends within about 140 s; the kernel part says which configurations the budget cut):

1. memory: a B-cos llama-1b (benchmarks/bench_gpu.py's FULL_SHAPES: 16 layers, hidden 2048, 4 x 512 tokens,
   float32, AdamW) trained for ``--steps`` steps with the kernel on, then bench_gpu's ``saved_for_backward_bytes``
   count (whose pack hook leaked each counted graph until 2026-11-28, the cause of the H200 run's out-of-memory
   llama-1b rows) and one more step, then the model freed: ``torch.cuda.memory_allocated`` and
   ``max_memory_allocated`` after each, and the allocation after ``gc.collect()``; then one step with the kernel off
   (the PyTorch path) for comparison. Without a leak the allocation after each step is the same (parameters,
   gradients freed, AdamW state) and falls back to the start's once the model is freed, and the steps' peaks with
   and without the kernel agree (its training node saves what the PyTorch path's saves).
2. kernel: for every linear layer shape of minilm, bert-base and gpt2 (M = batch x tokens rows = 8192, the layers'
   K inputs and N units; GPT-2's ``Conv1D`` weights are ``(K, N)``, read transposed), in bfloat16 autocast
   (bfloat16 activations, float32 weights, as in the model) and float32 (IEEE: TF32 off, as bench_gpu sets it), the
   median time (``triton.testing.do_bench``) of the kernel's inference launch per configuration, next to
   ``F.linear`` (the matrix product alone; bfloat16: with the weight cast beforehand) and the PyTorch B-cos layer
   (``BcosLinear`` / ``BcosConv1D`` without the kernel: norms, division, product, scale; ``||x||`` computed in every
   call, where a model's query, key and value projections share it). Every configuration's
   output is checked against the PyTorch B-cos layer's (largest difference relative to the largest value: 3e-2
   bfloat16, 1e-4 float32); a cell that fails is marked ``!`` and listed. A configuration is
   ``BMxBNxBK/wWARPS/sSTAGES`` (output tile, K step, ``num_warps``, ``num_stages``; powers of two, stages 1-8),
   optionally ``/late`` (the sums of squares for the norms reduced once after the K loop instead of at every step:
   ``KernelTiles.late_norms``) or ``/first`` (the sums of squares in a K loop of their own before the product's,
   which then reads its tiles for the dot alone: ``KernelTiles.norms_first``), then ``/nfast`` (the programs
   ordered units first, so that those running together share their rows of x: ``KernelTiles.units_fastest``), and ``/tf32x3`` (float32 layers only: ``tl.dot``'s three-pass TF32 products on tensor
   cores instead of IEEE products on the CUDA cores) or ``/bf16w`` (bfloat16 layers only: the weight cast to bfloat16
   beforehand, untimed as for ``F.linear``, so that no tile is converted inside the loop and ``||w||`` is that of the
   rounded weight: what a per-layer cached bfloat16 copy of the weight would give); ``default`` is the kernel's own
   tiles for each layer's dtype (``triton_linear.default_tiles``: what the layers launch with), measured first.
   Each configuration's kernels are compiled in parallel threads first (``triton.AsyncCompileMode``; the compile
   time is printed), so that compiling is not timed and costs one wait per configuration.

``--device cpu --quick`` runs both parts on tiny shapes under Triton's interpreter (start the process with
``TRITON_INTERPRET=1``; tests/test_triton_linear.py runs it): it checks the script and the configurations' values,
its times say nothing about a GPU, and a CPU has no allocation statistics (memory n/a).
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers as T

from bcos_plugins import bcos_loss, bcosify
from bcos_plugins.nn import BcosConv1D, BcosLinear, triton_kernels
from bcos_plugins.nn import triton_linear as tlin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.bench_gpu import FULL_SHAPES, QUICK_SHAPES, Shape, saved_for_backward_bytes
from benchmarks.common.device_option import parse_device_option

START = time.perf_counter()  # (after the imports of torch, transformers and the package: about 10 s before it)

# the default configurations in the order they are measured (the budget may cut the last): the kernel's own per-dtype
# tiles first ("default": triton_linear.default_tiles, since 2026-11-28 the first H200 run's best IEEE choices,
# 128x128x32/w4/s3/late for bfloat16 and 128x128x32/w8/s3 for float32), then its earlier default (the first run's
# baseline), then variations of the first run's best (docs/benchmarks.md#gpu; 128x128x32/w8/s3/late/tf32x3 for
# float32); /tf32x3 on float32 layers only, /bf16w on bfloat16 ones
DEFAULT_CONFIGS = ("default", "64x64x32/w4/s3", "128x128x32/w4/s3/late/nfast",
                   "128x128x32/w4/s3/late/bf16w", "128x128x32/w4/s3/late/nfast/bf16w", "128x128x32/w4/s3/first",
                   "128x128x32/w4/s3/first/nfast/bf16w", "128x128x64/w8/s3/first/nfast/bf16w",
                   "128x128x32/w8/s3/late/tf32x3", "128x128x32/w8/s3/late/nfast/tf32x3", "64x64x32/w4/s3/late",
                   "128x256x32/w8/s3/late/nfast/bf16w", "128x128x32/w4/s4/late/nfast",
                   "128x128x32/w4/s3/late/tf32x3")
QUICK_CONFIGS = ("default", "64x64x32/w4/s3", "32x32x16/w4/s3/late/nfast", "64x64x32/w4/s3/tf32x3", "64x64x32/w4/s3/bf16w",
                 "32x32x16/w4/s3/first")
TOL = {torch.bfloat16: 3e-2, torch.float32: 1e-4}
_CONFIG = re.compile(r"(\d+)x(\d+)x(\d+)/w(\d+)/s(\d+)(?:/(late|first))?(/nfast)?(?:/(tf32x3|bf16w))?")


@dataclass(frozen=True)
class Config:
    text: str
    tiles: tlin.KernelTiles | None  # None ("default"): the kernel's own tiles for the layer's dtype
    precision: str | None  # tl.dot's input_precision for float32 layers; None: the kernel's own choice (IEEE here)
    bf16_weights: bool = False  # bfloat16 layers only: the weight cast to bfloat16 beforehand (untimed, as F.linear's)

    def applies(self, dtype: torch.dtype) -> bool:
        """Whether the configuration is measured on layers of ``dtype`` (``/tf32x3``: float32; ``/bf16w``: bf16)."""
        return (self.precision is None or dtype == torch.float32) and (not self.bf16_weights
                                                                       or dtype == torch.bfloat16)


def parse_config(text: str) -> Config:
    """``BMxBNxBK/wW/sS[/late or /first][/nfast][/tf32x3 or /bf16w]``, or ``default`` (the kernel's own tiles for
    each layer's dtype, ``triton_linear.default_tiles``), as a :class:`Config`; ``ValueError`` naming what is wrong."""
    if text == "default":
        return Config(text, None, None)
    match = _CONFIG.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not BMxBNxBK/wWARPS/sSTAGES[/late or /first][/nfast][/tf32x3 or /bf16w], e.g. "
                         "128x128x32/w4/s3, nor default (the kernel's own tiles per dtype)")
    *numbers, norms, units_fastest, option = match.groups()
    tiles = tlin.KernelTiles(*map(int, numbers), late_norms=norms == "late", norms_first=norms == "first",
                             units_fastest=units_fastest is not None)
    for name, value in tiles._asdict().items():
        if isinstance(value, bool):
            continue
        if name == "num_stages":
            if not 1 <= value <= 8:
                raise ValueError(f"{text!r}: num_stages must lie in [1, 8], got {value}")
            continue
        low = 16 if name.startswith("block") else 1  # (tl.dot's smallest tile side is 16)
        if value < low or value & (value - 1):
            raise ValueError(f"{text!r}: {name} must be a power of two >= {low}, got {value}")
    return Config(text, tiles, "tf32x3" if option == "tf32x3" else None, option == "bf16w")


def config_text(tiles: tlin.KernelTiles) -> str:
    """``tiles`` written as a configuration (:func:`parse_config`'s syntax, IEEE products)."""
    return (f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}/w{tiles.num_warps}/s{tiles.num_stages}"
            + "/late" * tiles.late_norms + "/first" * tiles.norms_first + "/nfast" * tiles.units_fastest)


@dataclass(frozen=True)
class Problem:
    """One linear layer shape: ``rows`` x ``inputs`` activations times ``units`` units (weight ``(units, inputs)``, or
    ``(inputs, units)`` for GPT-2's ``Conv1D``: ``columns``)."""

    model: str
    layer: str
    rows: int
    inputs: int
    units: int
    columns: bool


def problems(shapes: list[Shape]) -> list[Problem]:
    """The distinct linear layer shapes of the BERT and GPT-2 shapes (attention projections, MLP up and down)."""
    found = []
    for shape in shapes:
        config = shape.make_config()
        rows = shape.batch * shape.tokens
        if isinstance(config, T.BertConfig):
            h, inner = config.hidden_size, config.intermediate_size
            layers = [("q/k/v/out", h, h), ("mlp up", h, inner), ("mlp down", inner, h)]
            columns = False
        elif isinstance(config, T.GPT2Config):
            h = config.n_embd
            inner = config.n_inner or 4 * h
            layers = [("c_attn", h, 3 * h), ("attn c_proj", h, h), ("c_fc", h, inner), ("mlp c_proj", inner, h)]
            columns = True
        else:
            continue
        found += [Problem(shape.name, name, rows, k, n, columns) for name, k, n in layers]
    return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds of ``fn``: ``triton.testing.do_bench`` on a GPU (L2 cleared between calls), the median
    of one call after a warm-up on a CPU (the interpreter: a smoke test of the script, not a time)."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


# ---------------------------------------------------------------------------------------------------------------
# 1. memory

def _memory_row(label: str, device: torch.device, start_bytes: int) -> str:
    _sync(device)
    if device.type != "cuda":
        return f"| {label} | n/a (CPU) | n/a | n/a |"
    allocated = torch.cuda.memory_allocated(device)
    peak = torch.cuda.max_memory_allocated(device)
    gc.collect()
    collected = torch.cuda.memory_allocated(device)
    gib = 2**30
    return (f"| {label} | {(allocated - start_bytes) / gib:,.2f} | {(peak - start_bytes) / gib:,.2f} | "
            f"{(collected - start_bytes) / gib:,.2f} |")


def memory_part(shape: Shape, device: torch.device, steps: int, b: float) -> None:
    print(f"## 1. memory: B-cos {shape.name} ({shape.batch} x {shape.tokens}), float32, AdamW, triton_kernels() on; "
          "GiB above the start")
    print("| after | allocated | peak since the last row | allocated after gc.collect() |")
    print("|---|---|---|---|")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    start_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    config = shape.make_config()
    torch.manual_seed(0)
    with torch.device(device):
        stock = getattr(T, shape.model_class)(config)
    model = bcosify(stock, b=b, verbose=False).train()
    del stock
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, config.vocab_size, (shape.batch, shape.tokens), generator=g).to(device)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (shape.batch,), generator=g).to(device)

    def loss(of: torch.nn.Module) -> torch.Tensor:
        return bcos_loss(of(input_ids=ids, attention_mask=mask), labels)

    def row(label: str) -> None:
        print(_memory_row(label, device, start_bytes), flush=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    row("model built")
    launches = _count_launches()
    with triton_kernels(), launches:
        for step in range(1, steps + 2):
            loss(model).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            row(f"train step {step}")
            if step == steps:
                saved = saved_for_backward_bytes(model, functools.partial(loss, model))
                row(f"saved_for_backward_bytes ({saved / 2**20:,.1f} MiB counted)")
    # the PyTorch path's step for comparison: the kernel's training node saves the same tensors, so the same peak
    loss(model).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    row(f"train step {steps + 2}, kernel off")
    del model, optimizer
    row("model and optimizer freed")
    print(f"# {launches.count} kernel launches ({launches.count // (steps + 2)} per forward); part 1 done at "
          f"{time.perf_counter() - START:.0f} s", flush=True)


class _count_launches:  # noqa: N801 (a context manager used like a function)
    """Counts ``triton_linear.launch_bcos_kernel`` calls while active: the memory rows are the kernel's, not the PyTorch
    path's."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self):
        self.launch_bcos_kernel = tlin.launch_bcos_kernel

        def counted(*args, **kwargs):
            self.count += 1
            return self.launch_bcos_kernel(*args, **kwargs)

        tlin.launch_bcos_kernel = counted
        return self

    def __exit__(self, *exc) -> None:
        tlin.launch_bcos_kernel = self.launch_bcos_kernel


# ---------------------------------------------------------------------------------------------------------------
# 2. kernel

@dataclass
class Case:
    """One problem in one dtype: its tensors, the reference output and the reference times."""

    problem: Problem
    dtype: torch.dtype
    x: torch.Tensor
    view: torch.Tensor  # (units, inputs), any strides
    low_view: torch.Tensor  # the same in the case's dtype (F.linear's operand, and /bf16w's)
    want: torch.Tensor
    mm_ms: float
    bcos_ms: float
    kernel_ms: dict[str, str]
    errors: dict[str, float] = field(default_factory=dict)  # largest difference / largest value, per configuration

    @property
    def label(self) -> str:
        p = self.problem
        name = "bf16" if self.dtype == torch.bfloat16 else "fp32"
        return f"{p.model} {p.layer} ({p.rows} x {p.inputs} -> {p.units}) {name}"


def _autocast(device: torch.device, dtype: torch.dtype):
    return torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()


def make_case(problem: Problem, dtype: torch.dtype, device: torch.device, b: float) -> Case:
    torch.manual_seed(0)
    layer = (BcosConv1D if problem.columns else BcosLinear)(problem.inputs, problem.units, b=b).to(device)
    # bfloat16 autocast: bfloat16 activations (the previous layer's output) and float32 weights, as in the model
    x = torch.randn(problem.rows, problem.inputs, device=device).to(dtype)
    weight = layer.weight.detach()
    view = weight.T if problem.columns else weight
    with torch.no_grad(), _autocast(device, dtype):
        want = layer(x)

    def bcos():
        # a fresh view each call: the layers share ||x|| of the last input they read (functional._derived_from, by
        # tensor identity), which would leave the norm out of every call after the first
        with torch.no_grad(), _autocast(device, dtype):
            layer(x.view(x.shape))

    w = view.to(dtype)  # (the conventional product alone: the weight cast once, outside the timing)

    def mm():
        with torch.no_grad():
            torch.nn.functional.linear(x, w)

    return Case(problem, dtype, x, view, w, want, _time_ms(mm, device), _time_ms(bcos, device), {})


def _kernel_call(case: Case, config: Config, b: float) -> Callable[[], torch.Tensor]:
    precision = config.precision if case.dtype == torch.float32 else None
    view = case.low_view if config.bf16_weights else case.view

    def run() -> torch.Tensor:
        return tlin.launch_bcos_kernel(case.x, view, b, case.dtype, floor=False, store_dyn=False,
                                       store_norms=False, tiles=config.tiles, precision=precision)[0]
    return run


class _WarmUp:
    """Stands in for the decorated kernel while :func:`_compile` runs: ``kernel[grid](...)`` compiles (``warmup``)
    with the launch's own arguments, so the compiled kernel is the one the launch finds, and launches nothing."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel.warmup(*args, grid=grid, **kwargs)


@contextmanager
def _warm_ups():
    real = tlin.decorated_kernel
    tlin.decorated_kernel = lambda interpreted: _WarmUp(real(interpreted))
    try:
        yield
    finally:
        tlin.decorated_kernel = real


def _compile(cases: list[Case], config: Config, b: float, threads: int) -> str:
    """Compile ``config``'s kernels for ``cases`` in parallel threads; a note on how it went."""
    import triton

    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(threads) as pool, triton.AsyncCompileMode(pool, ignore_errors=True), _warm_ups():
            for case in cases:
                _kernel_call(case, config, b)()
    except Exception as err:  # (the launches below then compile one by one, and fail per cell if they must)
        # a mode left active would send every later launch to the closed pool
        from triton.runtime import _async_compile

        _async_compile.active_mode.set(None)
        return f"parallel compile failed ({type(err).__name__}: {str(err)[:80]}), compiled at first launch"
    return f"compiled in {time.perf_counter() - start:.1f} s"


def kernel_part(cases: list[Case], configs: list[Config], device: torch.device, b: float, budget_s: float,
                threads: int) -> list[Config]:
    """Time every configuration on every case (``case.kernel_ms``) until ``budget_s`` from the start; the
    configurations measured."""
    done = []
    longest = 0.0  # (the longest configuration so far: one that would end past the budget does not start)
    for index, config in enumerate(configs):
        began = time.perf_counter()
        elapsed = began - START
        if elapsed + longest > budget_s:
            print(f"# budget: {elapsed:.0f} s of {budget_s:.0f} s spent, a configuration took up to {longest:.0f} s: "
                  f"configurations {index + 1}-{len(configs)} not measured", flush=True)
            break
        mine = [case for case in cases if config.applies(case.dtype)]
        note = "interpreted"
        if device.type == "cuda":
            note = "compiled at first launch"
            if threads > 1:
                print(f"# c{index + 1} = {config.text}: compiling {len(mine)} kernels in {threads} threads",
                      flush=True)
                note = _compile(mine, config, b, threads)
        for case in mine:
            run = _kernel_call(case, config, b)
            try:
                got = run()
                _sync(device)
                scale = case.want.abs().max().float().item()
                error = (got.float() - case.want.float()).abs().max().item()
                wrong = not (error <= TOL[case.dtype] * scale)  # (NaN: wrong)
                cell = f"{_time_ms(run, device) * 1e3:,.0f}"
                case.kernel_ms[config.text] = cell + ("!" if wrong else "")
                case.errors[config.text] = error / scale if scale else error
                if wrong:
                    print(f"# WRONG VALUES: c{index + 1} {config.text} on {case.label}: largest difference "
                          f"{error:.3g}, largest value {scale:.3g}", flush=True)
            except Exception as err:  # (a configuration the GPU cannot run, e.g. out of shared memory)
                case.kernel_ms[config.text] = f"error: {type(err).__name__}"
                print(f"# c{index + 1} {config.text} on {case.label}: {type(err).__name__}: {str(err)[:160]}",
                      flush=True)
        done.append(config)
        longest = max(longest, time.perf_counter() - began)
        print(f"# c{index + 1} = {config.text}: {note}; done at {time.perf_counter() - START:.0f} s", flush=True)
    return done


def print_table(cases: list[Case], configs: list[Config]) -> None:
    print("## 2. kernel: median microseconds per call (inference launch); ! = values off the PyTorch B-cos layer's")
    names = [f"c{i + 1}" for i in range(len(configs))]
    print("| layer (rows x K -> N) | F.linear | B-cos PyTorch | " + " | ".join(names) + " | best: kernel / F.linear, "
          "/ B-cos |")
    print("|---" * (4 + len(configs)) + "|")
    for case in cases:
        cells = [case.kernel_ms.get(config.text, "-") for config in configs]
        timed = [(float(cell.replace(",", "")), name) for cell, name in zip(cells, names, strict=True)
                 if cell[:1].isdigit() and not cell.endswith("!")]
        best = "-"
        if timed:
            us, name = min(timed)
            best = f"{name}: {us / (case.mm_ms * 1e3):.2f}x, {us / (case.bcos_ms * 1e3):.2f}x"
        print(f"| {case.label} | {case.mm_ms * 1e3:,.0f} | {case.bcos_ms * 1e3:,.0f} | " + " | ".join(cells)
              + f" | {best} |")
    # one configuration for every layer: the geometric mean of kernel / F.linear per dtype
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        means = []
        for index, config in enumerate(configs):
            ratios = [float(case.kernel_ms[config.text].replace(",", "")) / (case.mm_ms * 1e3) for case in cases
                      if case.dtype == dtype and case.kernel_ms.get(config.text, "-")[:1].isdigit()
                      and not case.kernel_ms[config.text].endswith("!")]
            if ratios and len(ratios) == sum(case.dtype == dtype for case in cases):
                means.append(f"c{index + 1} {math.exp(statistics.fmean(map(math.log, ratios))):.2f}x")
        print(f"# {name}, geometric mean of kernel / F.linear over every layer: " + (", ".join(means) or "n/a"))
    # how close each configuration comes to the PyTorch B-cos layer (IEEE or TF32 products, summation orders)
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        worst = []
        for index, config in enumerate(configs):
            errors = [case.errors[config.text] for case in cases if case.dtype == dtype and config.text in case.errors]
            if errors:
                worst.append(f"c{index + 1} {max(errors):.1e}")
        print(f"# {name}, largest difference from the PyTorch B-cos layer / its largest value: "
              + (", ".join(worst) or "n/a"))
    print("# configurations: " + ", ".join(f"c{i + 1} = {c.text}" for i, c in enumerate(configs)))


# ---------------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda (default when available) or cpu (needs TRITON_INTERPRET=1; with --quick)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (bench_gpu's QUICK_SHAPES)")
    parser.add_argument("--parts", nargs="+", choices=["memory", "kernel"], default=["memory", "kernel"])
    parser.add_argument("--steps", type=int, default=3, help="training steps before the saved-bytes count (3)")
    parser.add_argument("--configs", nargs="+", default=None,
                        help="BMxBNxBK/wWARPS/sSTAGES[/late or /first][/nfast][/tf32x3 or /bf16w] or default (the "
                             "kernel's own tiles per dtype) each (default: 14, default first)")
    parser.add_argument("--budget-s", type=float, default=125.0,
                        help="seconds after the imports by which the kernel part ends: a configuration does not "
                             "start when the longest so far would end past it (125)")
    parser.add_argument("--compile-threads", type=int, default=16,
                        help="threads compiling a configuration's kernels before it is timed (16); 1: each kernel "
                             "compiles at its first (untimed) launch, without triton.AsyncCompileMode")
    parser.add_argument("--b", type=float, default=1.5, help="alignment pressure (1.5)")
    args = parser.parse_args(argv)
    device = parse_device_option(parser, args.device, "pass --device cpu --quick with TRITON_INTERPRET=1")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--device cpu: the kernel runs on CPU tensors only in Triton's interpreter; start the process "
                     "with TRITON_INTERPRET=1 (set before triton is imported)")
    if args.steps < 1 or args.compile_threads < 1:
        parser.error("--steps and --compile-threads: must be >= 1")
    try:
        configs = [parse_config(text) for text in (args.configs or (QUICK_CONFIGS if args.quick else
                                                                     DEFAULT_CONFIGS))]
    except ValueError as err:
        parser.error(f"--configs: {err}")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means IEEE float32, as in bench_gpu
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton's interpreter: no GPU times)"
    import triton

    print(f"# triton_probe on {name}, torch {torch.__version__}, triton {triton.__version__}, B = {args.b}, "
          "kernel default (c1 'default'): " + ", ".join(f"{str(dtype).removeprefix('torch.')} {config_text(tiles)}"
                                                      for dtype, tiles in tlin.DEFAULT_TILES.items()))
    if "memory" in args.parts:
        memory_part(next(s for s in shapes if s.name == "llama-1b"), device, args.steps, args.b)
    if "kernel" in args.parts:
        cases = [make_case(problem, dtype, device, args.b) for dtype in (torch.bfloat16, torch.float32)
                 for problem in problems([s for s in shapes if s.name in ("minilm", "bert-base", "gpt2")])]
        print(f"# {len(cases)} layer shapes timed with F.linear and the PyTorch B-cos layer at "
              f"{time.perf_counter() - START:.0f} s", flush=True)
        done = kernel_part(cases, configs, device, args.b, args.budget_s, args.compile_threads)
        print_table(cases, done)
    print(f"# total {time.perf_counter() - START:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
