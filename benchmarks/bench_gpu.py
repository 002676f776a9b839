"""B-cos / conventional speed and memory ratios on a GPU (issue 30), measured side by side in one run.

For float32 and bfloat16 autocast, eager and compiled (``torch.compile``), at four shapes built from configs
with random weights (no download):

| shape | architecture | batch x tokens |
|---|---|---|
| minilm | all-MiniLM-L6-v2 (6-layer BERT, hidden 384) | 64 x 128 |
| bert-base | BERT base (12 layers, hidden 768) | 32 x 256 |
| gpt2 | GPT-2 small (12 layers, hidden 768) | 16 x 512 |
| llama-1b | Llama 3.2 1B shape (16 layers, hidden 2048, GQA 32/8) | 4 x 512 |

it prints the B-cos / conventional ratio of

- forward: a no-grad forward of the B-cos model / of the conventional one (sequence classifiers, 2 labels);
- explain / IxG: :func:`bcos_plugins.explain` on the B-cos model / Captum ``LayerGradientXActivation`` on the
  conventional model at the same point (the combined embedding). Compiled, Captum's layer hooks cannot take
  gradients inside a compiled graph, so the conventional side is the same input x gradient through the
  package's probe (:func:`bcos_plugins.attribution.capture_point`), which ``explain`` uses too;
- train step: forward + backward + AdamW step (B-cos: ``bcos_loss``; conventional: cross-entropy);
- peak train memory: the model's own parameters and AdamW state plus the peak of
  ``torch.cuda.max_memory_allocated`` above what was allocated before a training step (both models share the
  device, so the raw peak would count the other one too); n/a on CPU.
- saved for backward: the bytes autograd keeps for the backward pass of a training forward and its loss
  (:func:`saved_for_backward_bytes`: distinct storages, parameters and buffers excluded), the activation part
  of training memory, on any device (on a CPU, which has no peak-memory statistics, the one memory column).

Each time cell is the median [interquartile range] of ``--repeats`` paired per-round B-cos / conventional ratios
(wall clock, each call between two device synchronisations), every round in a fresh seeded random order after
two warm-up calls each (benchmarks/common/paired_timing.py; until 2026-11-28, the ratio of the two sides' medians
over a fixed alternation, which docs/benchmarks.md#bench-core-method found flattering to B-cos), then each side's
median time. Compiled cells run after all eager
ones and are skipped (and say so) once ``--budget-s`` seconds have passed, so that a run ends in time: with the
default (230 s) a run took 394 s on one H100, the compiled cells past MiniLM skipped (compiling one GPT-2 pair
takes over 4 minutes there; docs/benchmarks.md#gpu). ``--device cpu --quick`` runs tiny shapes on the CPU (the test suite does).

``--triton`` adds, after each eager row, the same cells with the B-cos model's linear layers run as one Triton kernel
each (:func:`bcos_plugins.nn.triton_kernels`, mode "eager + triton"; the conventional side unchanged), and with
``--profile`` the kernel count of that forward too. CUDA only: on a CPU the kernel runs in Triton's interpreter,
whose timings say nothing about a GPU, so ``--triton`` with ``--device cpu`` is refused.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers as T
from captum.attr import LayerGradientXActivation

from bcos_plugins import bcos_loss, bcosify, explain
from bcos_plugins.attribution.gradient import capture_point
from bcos_plugins.convert.architectures import spec_for
from bcos_plugins.nn import triton_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds benchmarks
from benchmarks.common.device_option import parse_device_option
from benchmarks.common.paired_timing import RatioSpread, paired_rounds


@dataclass(frozen=True)
class Shape:
    name: str
    make_config: Callable[[], T.PretrainedConfig]
    model_class: str
    batch: int
    tokens: int


def _bert(hidden: int, layers: int, heads: int, intermediate: int, vocab: int = 30522) -> T.BertConfig:
    return T.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=intermediate, num_labels=2)


def _gpt2(hidden: int, layers: int, heads: int, vocab: int = 50257) -> T.GPT2Config:
    # GPT-2's end of text (its BOS and EOS) is its last id: 50256 in the full vocabulary, inside a quick one too
    return T.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=1024,
                        num_labels=2, pad_token_id=0, bos_token_id=vocab - 1, eos_token_id=vocab - 1)


def _llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
           vocab: int = 128256) -> T.LlamaConfig:
    return T.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=2048,
                         num_labels=2, pad_token_id=0, tie_word_embeddings=True)


FULL_SHAPES = [
    Shape("minilm", lambda: _bert(384, 6, 12, 1536), "BertForSequenceClassification", 64, 128),
    Shape("bert-base", lambda: _bert(768, 12, 12, 3072), "BertForSequenceClassification", 32, 256),
    Shape("gpt2", lambda: _gpt2(768, 12, 12), "GPT2ForSequenceClassification", 16, 512),
    Shape("llama-1b", lambda: _llama(2048, 16, 32, 8, 8192), "LlamaForSequenceClassification", 4, 512),
]
QUICK_SHAPES = [
    Shape("minilm", lambda: _bert(32, 1, 4, 64, vocab=100), "BertForSequenceClassification", 2, 16),
    Shape("bert-base", lambda: _bert(32, 1, 4, 64, vocab=100), "BertForSequenceClassification", 2, 16),
    Shape("gpt2", lambda: _gpt2(32, 1, 4, vocab=100), "GPT2ForSequenceClassification", 2, 16),
    Shape("llama-1b", lambda: _llama(32, 1, 4, 2, 64, vocab=100), "LlamaForSequenceClassification", 2, 16),
]
PRECISIONS = ("float32", "bf16 autocast")
MEASUREMENTS = ("forward", "explain / IxG", "train step", "peak train memory", "saved for backward")


class Bench:
    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device = device
        self.repeats = repeats

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def pair(self, bcos_fn: Callable[[], object], conv_fn: Callable[[], object]) -> tuple[RatioSpread, float, float]:
        """The B-cos / conventional wall-clock ratio (median [IQR] of the per-round ratios) and the median seconds of
        ``bcos_fn`` and ``conv_fn``: two untimed warm-up calls each (the first compiled call compiles), then
        ``repeats`` paired rounds in a fresh seeded order (benchmarks/common/paired_timing.py), each call between two
        device synchronisations (on a GPU a call returns once its kernels are queued)."""
        timed = paired_rounds({"bcos": bcos_fn, "conv": conv_fn}, self.repeats, warm_up=2, synchronize=self.sync)
        return timed.ratio("bcos", "conv", "wall"), timed.median("bcos", "wall"), timed.median("conv", "wall")

    def peak_memory(self, fn: Callable[[], object]) -> float | None:
        """Peak bytes allocated while ``fn`` runs, above what was allocated before (CUDA only)."""
        if self.device.type != "cuda":
            return None
        self.sync()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        fn()
        self.sync()
        return float(torch.cuda.max_memory_allocated(self.device) - before)


@dataclass
class Pair:
    """The conventional model and its B-cos twin (same initial weights), and what the conversion cost."""

    conventional: torch.nn.Module
    bcos: torch.nn.Module
    bcosify_s: float
    bcosify_extra_bytes: float | None  # peak CUDA memory above the stock model during bcosify (None on CPU)
    model_bytes: int


def _models(shape: Shape, device: torch.device, b: float) -> Pair:
    config = shape.make_config()
    cls = getattr(T, shape.model_class)
    torch.manual_seed(0)
    with torch.device(device):
        conventional = cls(config).eval()
        torch.manual_seed(0)
        stock = cls(config)
    model_bytes = sum(t.numel() * t.element_size() for t in [*stock.parameters(), *stock.buffers()])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    bcos = bcosify(stock, b=b, verbose=False).eval()
    extra = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        extra = float(torch.cuda.max_memory_allocated(device) - before)
    return Pair(conventional, bcos, time.perf_counter() - start, extra, model_bytes)


def _ixg_captum(model, ids, mask, target):
    module, where = spec_for(model).embedding_module(model)
    ixg = LayerGradientXActivation(lambda i, m: model(input_ids=i, attention_mask=m).logits, module)

    def run():
        ixg.attribute(ids, target=target, additional_forward_args=(mask,), attribute_to_layer_input=where == "input")
    return run


def _ixg_probe(model, ids, mask, target):
    """Input x gradient at the combined embedding of a (compiled) conventional model, through the probe."""
    module, where = spec_for(model).embedding_module(model)
    weight = model.get_input_embeddings().weight
    rows = torch.arange(ids.shape[0], device=ids.device)

    def run():
        probe = torch.ones(*ids.shape, weight.shape[-1], dtype=weight.dtype, device=weight.device,
                           requires_grad=True)
        with capture_point(module, where, probe=probe):
            logits = model(input_ids=ids, attention_mask=mask).logits
        torch.autograd.grad(logits[rows, target].sum(), probe)
    return run


def _loss(model, ids, mask, labels, bcos: bool, autocast) -> torch.Tensor:
    """The training loss (B-cos: ``bcos_loss``; conventional: cross-entropy) of one forward pass."""
    with autocast():
        out = model(input_ids=ids, attention_mask=mask)
        return bcos_loss(out, labels) if bcos else torch.nn.functional.cross_entropy(out.logits.float(), labels)


def _train_step(model, ids, mask, labels, bcos: bool, autocast):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def run():
        loss = _loss(model, ids, mask, labels, bcos, autocast)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return run, optimizer


def saved_for_backward_bytes(model: torch.nn.Module, forward_and_loss: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct storages that autograd saves for the backward pass while ``forward_and_loss()``
    builds the graph, ``model``'s parameters and buffers excluded (they are resident anyway).

    Counted with ``torch.autograd.graph.saved_tensors_hooks``: a tensor that several operations save (a
    layer's output that the next layer keeps as its input), or a view of one, counts once. The storages are
    held until the count is done, so that no freed address is reused and missed. The graph is freed unused.

    The pack hook keeps a detached alias, not the tensor it is handed: for a node that saves its own output
    (softmax, B-cos training nodes) that tensor's ``grad_fn`` is the node itself, and a node holding it is a
    reference cycle inside autograd's C++ graph, which ``gc`` cannot see: the whole graph, and the parameters its
    leaves point at, stayed allocated for the rest of the process (every row leaked its two graphs, until the
    llama-1b rows of an H200 run ran out of memory at 138 GiB, docs/benchmarks.md#gpu, 2026-11-28).
    """
    saved: dict[int, torch.UntypedStorage] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if tensor.device.type != "meta" and storage.nbytes() > 0:
            saved.setdefault(storage.data_ptr(), storage)
        return tensor.detach()

    resident = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward_and_loss()
    return sum(storage.nbytes() for ptr, storage in saved.items() if ptr not in resident)


def _resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of ``model``'s parameters and buffers and of ``optimizer``'s state tensors."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _time_cell(timed: tuple[RatioSpread, float, float]) -> str:
    """``1.23x [1.10, 1.31] (4.0 vs 3.2 ms)``: the median [IQR] of the paired B-cos / conventional ratios, then each
    side's median time (whose quotient may differ from the paired median)."""
    spread, bcos_s, conv_s = timed
    return f"{spread.median:.2f}x [{spread.q1:.2f}, {spread.q3:.2f}] ({bcos_s * 1e3:.1f} vs {conv_s * 1e3:.1f} ms)"


def run_shape(shape: Shape, bench: Bench, precision: str, mode: str, pair: Pair) -> dict[str, str]:
    """One row of the table; ``pair``'s models are shared by the precisions of a shape and mode (compiled: already
    wrapped by ``Module.compile``), so that each is built and converted once."""
    device = bench.device
    conventional, bcos = pair.conventional, pair.bcos
    conventional.eval()
    bcos.eval()
    compiled = mode == "compiled"
    dtype = torch.bfloat16 if precision == "bf16 autocast" else None

    def autocast():
        return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, conventional.config.vocab_size, (shape.batch, shape.tokens), generator=g).to(device)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (shape.batch,), generator=g).to(device)
    with torch.no_grad(), autocast():
        target = conventional(input_ids=ids, attention_mask=mask).logits.argmax(-1)

    def forward(model):
        def run():
            with torch.no_grad(), autocast():
                model(input_ids=ids, attention_mask=mask)
        return run

    row: dict[str, str] = {}
    row["forward"] = _time_cell(bench.pair(forward(bcos), forward(conventional)))

    ixg = (_ixg_probe if compiled else _ixg_captum)(conventional, ids, mask, target)

    def run_explain():
        with autocast():
            explain(bcos, ids, mask, target=target)

    def run_ixg():
        with autocast():
            ixg()

    row["explain / IxG"] = _time_cell(bench.pair(run_explain, run_ixg))

    bcos.train()
    conventional.train()
    step_b, opt_b = _train_step(bcos, ids, mask, labels, True, autocast)
    step_c, opt_c = _train_step(conventional, ids, mask, labels, False, autocast)
    row["train step"] = _time_cell(bench.pair(step_b, step_c))
    mb, mc = bench.peak_memory(step_b), bench.peak_memory(step_c)
    if mb is not None:
        mb, mc = mb + _resident_bytes(bcos, opt_b), mc + _resident_bytes(conventional, opt_c)
    row["peak train memory"] = ("n/a (CPU)" if mb is None else
                                f"{_ratio(mb, mc)} ({mb / 2**20:,.0f} vs {mc / 2**20:,.0f} MiB)")
    try:  # measured last, failing alone: the timed cells above stay in the table
        sb = saved_for_backward_bytes(bcos, lambda: _loss(bcos, ids, mask, labels, True, autocast))
        sc = saved_for_backward_bytes(conventional, lambda: _loss(conventional, ids, mask, labels, False, autocast))
    except Exception as err:
        traceback.print_exc(file=sys.stderr)
        row["saved for backward"] = _error_cell(err)
        return row
    unit, scale = ("MiB", 2**20) if max(sb, sc) >= 2**20 else ("KiB", 2**10)  # the quick shapes save KiBs
    row["saved for backward"] = f"{_ratio(sb, sc)} ({sb / scale:,.1f} vs {sc / scale:,.1f} {unit})"
    return row


def _error_cell(err: Exception) -> str:
    return f"error: {type(err).__name__}: {str(err).splitlines()[0][:60] if str(err) else ''}"


def _conversion_line(shape: Shape, pair: Pair) -> str:
    memory = ("" if pair.bcosify_extra_bytes is None else
              f", peak memory above the stock model {pair.bcosify_extra_bytes / 2**20:,.0f} MiB")
    return (f"# bcosify {shape.name}: {pair.bcosify_s:.2f} s for a {pair.model_bytes / 2**20:,.0f} MiB model"
            f"{memory}")


def _profile(shape: Shape, device: torch.device, b: float, triton: bool = False) -> None:
    """The kernels of one no-grad forward of each model of ``shape`` under bfloat16 autocast, most time first (with
    ``triton``, the B-cos model's also with :func:`~bcos_plugins.nn.triton_kernels` on)."""
    from torch.profiler import ProfilerActivity, profile

    pair = _models(shape, device, b)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, pair.conventional.config.vocab_size, (shape.batch, shape.tokens), generator=g).to(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    runs = [("B-cos", pair.bcos, nullcontext), ("conventional", pair.conventional, nullcontext)]
    if triton:
        runs.insert(1, ("B-cos + triton", pair.bcos, triton_kernels))
    for name, model, switch in runs:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16), switch():
            for _ in range(2):
                model(input_ids=ids)
            with profile(activities=activities) as prof:
                model(input_ids=ids)
        events = prof.key_averages()
        launches = sum(e.count for e in events if e.device_type.name == "CUDA")
        print(f"# profile, {name} {shape.name} forward, bf16 autocast: {launches} kernel launches")
        print(events.table(sort_by=sort, row_limit=15))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda (default when available) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (1 layer, hidden 32, 2 x 16 tokens)")
    parser.add_argument("--shapes", nargs="+", choices=[s.name for s in FULL_SHAPES],
                        default=[s.name for s in FULL_SHAPES])
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per cell (default 6; quick: 2)")
    parser.add_argument("--budget-s", type=float, default=230.0,
                        help="compiled cells are skipped after this many seconds (default 230)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--profile", action="store_true",
                        help="print the top kernels of one bf16 forward of each model of the first shape")
    parser.add_argument("--b", type=float, default=1.5, help="alignment pressure of the B-cos models (1.5)")
    parser.add_argument("--triton", action="store_true",
                        help="add eager rows with the B-cos linear layers as Triton kernels (CUDA only)")
    args = parser.parse_args(argv)
    device = parse_device_option(parser, args.device, "pass --device cpu (with --quick for a smoke run)")
    if args.triton and device.type != "cuda":
        parser.error("--triton: the kernel is measured on a CUDA device only (on a CPU it runs in Triton's "
                     "interpreter, whose timings say nothing about a GPU); pass --device cuda, or drop --triton")
    if args.triton and "eager" not in args.modes:
        parser.error("--triton: adds eager rows (compiled models take inductor's kernels); include --modes eager")
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 6)
    if repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {repeats}")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on both sides
    # two models of one class, train/eval and explanation mode each get their own graph; the default limit (8)
    # would send the later ones back to eager mode silently
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, 64)
    bench = Bench(device, repeats)
    shapes = [s for s in (QUICK_SHAPES if args.quick else FULL_SHAPES) if s.name in args.shapes]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"# B-cos / conventional on {name}, torch {torch.__version__}, transformers {T.__version__}, "
          f"B = {args.b}, median [IQR] of {repeats} paired ratios, rounds in seeded random order{', quick shapes' if args.quick else ''}")
    start = time.perf_counter()
    print("| shape (batch x tokens) | precision | mode | " + " | ".join(MEASUREMENTS) + " |")
    print("|---" * (3 + len(MEASUREMENTS)) + "|")
    conversions: list[str] = []
    failed = 0
    for mode in args.modes:  # eager first: the compiled cells are the ones the budget may cut
        for shape in shapes:
            pair = None
            # (the Triton rows right after the eager ones, on the same models: side by side in one run)
            variants = [(mode, nullcontext)] + ([("eager + triton", triton_kernels)]
                                               if args.triton and mode == "eager" else [])
            for precision in args.precisions:
                for label_mode, switch in variants:
                    label = f"| {shape.name} ({shape.batch} x {shape.tokens}) | {precision} | {label_mode} | "
                    if mode == "compiled" and time.perf_counter() - start > args.budget_s:
                        print(label + " | ".join(["skipped (time budget)"] * len(MEASUREMENTS)) + " |", flush=True)
                        continue
                    try:
                        if pair is None:
                            if mode == "compiled":
                                torch._dynamo.reset()
                            pair = _models(shape, device, args.b)
                            if mode == "eager":
                                conversions.append(_conversion_line(shape, pair))
                            else:
                                for model in (pair.conventional, pair.bcos):
                                    model.compile(backend=args.compile_backend)
                        with switch():
                            row = run_shape(shape, bench, precision, mode, pair)
                    except Exception as err:  # one failing cell (e.g. out of memory) must not cost the whole table
                        traceback.print_exc(file=sys.stderr)
                        row = dict.fromkeys(MEASUREMENTS, _error_cell(err))
                    failed += any(cell.startswith("error: ") for cell in row.values())
                    print(label + " | ".join(row[m] for m in MEASUREMENTS) + " |", flush=True)
            pair = None
            gc.collect()  # the two models and their optimizers go before the next shape is built
            if device.type == "cuda":
                torch.cuda.empty_cache()
    for line in conversions:
        print(line)
    if args.profile:
        try:
            _profile(shapes[0], device, args.b, triton=args.triton)
        except Exception:  # the table above is the result; a profiler failure must not hide it
            traceback.print_exc(file=sys.stderr)
    print(f"# total {time.perf_counter() - start:.0f} s" + (f"; {failed} row(s) failed (tracebacks above)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
