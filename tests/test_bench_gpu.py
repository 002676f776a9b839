"""benchmarks/bench_gpu.py in its quick CPU mode: every shape, precision and measurement prints a ratio, compiled
cells run through torch.compile, and bad settings are refused by name. The GPU numbers themselves come from
``make bench-gpu`` on a GPU (docs/benchmarks.md)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from benchmarks import bench_gpu
from benchmarks.common import paired_timing

# Captum's note that it set requires_grad on the inputs itself: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")

# the median [IQR] of the paired per-round ratios, then each side's median time
CELL = r"\d+\.\d\dx \[\d+\.\d\d, \d+\.\d\d\] \(\d+\.\d vs \d+\.\d ms\)"


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| shape")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]

def test_quick_cpu_mode_prints_every_shape_precision_and_ratio(capsys):
    assert bench_gpu.main(["--device", "cpu", "--quick", "--modes", "eager", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# B-cos / conventional on CPU")
    rows = _rows(out)
    expected = [(f"{s.name} ({s.batch} x {s.tokens})", p) for s in bench_gpu.QUICK_SHAPES for p in bench_gpu.PRECISIONS]
    assert [(r[0], r[1]) for r in rows] == expected
    for row in rows:
        assert row[2] == "eager"
        assert all(re.fullmatch(CELL, cell) for cell in row[3:6]), row
        assert row[6] == "n/a (CPU)"

def test_quick_cpu_mode_compiled_cells_run_through_torch_compile(capsys):
    torch._dynamo.reset()
    try:
        assert bench_gpu.main(["--device", "cpu", "--quick", "--modes", "compiled", "--shapes", "minilm",
                               "--precisions", "float32", "--repeats", "1", "--compile-backend", "eager"]) == 0
    finally:
        torch._dynamo.reset()
    (row,) = _rows(capsys.readouterr().out)
    assert row[:3] == ["minilm (2 x 16)", "float32", "compiled"]
    assert all(re.fullmatch(CELL, cell) for cell in row[3:6]), row

def test_compiled_cells_past_the_time_budget_say_they_were_skipped(capsys):
    assert bench_gpu.main(["--device", "cpu", "--quick", "--modes", "compiled", "--shapes", "gpt2",
                           "--budget-s", "0"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [r[1] for r in rows] == list(bench_gpu.PRECISIONS)
    assert all(cell == "skipped (time budget)" for r in rows for cell in r[3:])

@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "cpu", "--repeats", "0"], "--repeats: must be >= 1, got 0"),
    (["--device", "nonsense"], "--device"),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "--device cuda: no CUDA device is visible")]))
def test_bad_settings_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_gpu.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def fake_clock(monkeypatch):
    """paired_timing's clocks, moved only by the fake workloads (wall and thread CPU alike)."""
    clock = [0.0]
    monkeypatch.setattr(paired_timing, "time", SimpleNamespace(perf_counter=lambda: clock[0],
                                                               thread_time=lambda: clock[0]))
    return clock


def test_pair_is_the_median_of_paired_ratios_after_an_untimed_warm_up(fake_clock):
    """Bench.pair through benchmarks/common/paired_timing.py: two untimed warm-up calls per side, then the median
    and quartiles of the per-round ratios (2, 3 and 1 here: median 2), not the ratio of the two sides' medians
    (4 ms / 3 ms = 1.33, what the fixed alternation printed before)."""
    costs = {"bcos": iter([50.0, 50.0, 2.0, 9.0, 4.0]), "conv": iter([50.0, 50.0, 1.0, 3.0, 4.0])}

    def side(name):
        def run():
            fake_clock[0] += next(costs[name]) / 1e3
        return run

    timed = bench_gpu.Bench(torch.device("cpu"), repeats=3).pair(side("bcos"), side("conv"))
    spread, bcos_s, conv_s = timed
    assert (spread.median, spread.q1, spread.q3, spread.rounds) == pytest.approx((2.0, 1.5, 2.5, 3))
    assert (bcos_s, conv_s) == pytest.approx((4e-3, 3e-3))
    assert bench_gpu._time_cell(timed) == "2.00x [1.50, 2.50] (4.0 vs 3.0 ms)"
    assert re.fullmatch(CELL, bench_gpu._time_cell(timed))
    assert all(next(c, None) is None for c in costs.values())  # warm-up and rounds: no call more, none fewer
    assert bench_gpu._ratio(None, 1.0) == "n/a" and bench_gpu._ratio(2.0, 0.0) == "n/a"  # the memory cells'


def test_pair_times_each_call_between_two_device_synchronisations(monkeypatch):
    """On a GPU a call returns once its kernels are queued: each timed call runs after a synchronisation (nothing
    earlier still queued) and its clock stops after another (its own kernels done)."""
    events = []
    monkeypatch.setattr(paired_timing, "time", SimpleNamespace(perf_counter=lambda: events.append("clock") or len(events),
                                                               thread_time=lambda: len(events)))
    bench = bench_gpu.Bench(torch.device("cpu"), repeats=2)
    bench.sync = lambda: events.append("sync")
    bench.pair(lambda: events.append("bcos"), lambda: events.append("conv"))
    assert sorted(events[:4]) == ["bcos", "bcos", "conv", "conv"]  # the warm-up: untimed
    timed = [events[4 + 5 * i: 9 + 5 * i] for i in range(4)]
    assert len(events) == 4 + 5 * 4
    assert all(call[:2] + call[3:] == ["sync", "clock", "sync", "clock"] and call[2] in ("bcos", "conv")
               for call in timed), timed


def test_saved_for_backward_counts_each_saved_storage_once_and_not_the_parameters():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4, bias=False)
    x = torch.randn(8, 4)

    def forward_and_loss():
        # Linear saves x (the weight is a parameter: resident), relu its output, mul both of its inputs: the
        # relu output again (counted once) and x's view
        h = layer(x).relu()
        return (h * x.view(8, 4)).sum()

    assert bench_gpu.saved_for_backward_bytes(layer, forward_and_loss) == 2 * 8 * 4 * 4  # x and h, float32
    assert bench_gpu.Bench(torch.device("cpu"), repeats=1).peak_memory(forward_and_loss) is None  # no CPU peak


def test_saved_for_backward_frees_the_graph_it_counts():
    """A node that saves its own output (softmax; a B-cos training layer) held through the pack hook is a reference
    cycle in autograd's C++ graph that ``gc`` cannot collect: every table row leaked its two training graphs (and
    the models their leaves point at), until an H200 run ran out of memory at 138 GiB in the llama-1b rows."""
    import gc
    import weakref

    from bcos_plugins.nn import BcosLinear

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), BcosLinear(6, 5, b=1.5)).train()
    x = torch.randn(8, 4)
    outputs = []

    def forward_and_loss():
        h = torch.softmax(model[0](x), dim=-1)  # (softmax saves its result)
        out = model[1](h)  # (the training node saves its output)
        outputs.extend((weakref.ref(h), weakref.ref(out)))
        return out.sum()

    assert bench_gpu.saved_for_backward_bytes(model, forward_and_loss) > 0
    gc.collect()
    assert [ref() is None for ref in outputs] == [True, True], "the counted graph outlived the count"
