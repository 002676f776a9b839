"""benchmarks/bench_gpu.py in its quick CPU mode: every shape, precision and measurement prints a ratio, compiled
cells run through torch.compile, and bad settings are refused by name. The GPU numbers themselves come from
``make bench-gpu`` on a GPU (docs/benchmarks.md)."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks import bench_gpu

# Captum's note that it set requires_grad on the inputs itself: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Input Tensor 0 did not already require gradients")

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
        assert all(re.fullmatch(r"\d+\.\d\dx \(\d+\.\d vs \d+\.\d ms\)", cell) for cell in row[3:6]), row
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
    assert all(re.fullmatch(r"\d+\.\d\dx \(\d+\.\d vs \d+\.\d ms\)", cell) for cell in row[3:6]), row

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


def test_pair_medians_skip_the_warm_up_and_keep_b_cos_first(monkeypatch):
    """Bench.pair on a fake clock: the two warm-up rounds are not timed, the medians are per side."""
    clock = [0.0]
    monkeypatch.setattr(bench_gpu, "time", type("FakeTime", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    costs = {"bcos": iter([50.0, 50.0, 2.0, 6.0, 4.0]), "conv": iter([50.0, 50.0, 1.0, 3.0, 2.0])}

    def side(name):
        def run():
            clock[0] += next(costs[name])
        return run

    bcos, conv = bench_gpu.Bench(torch.device("cpu"), repeats=3).pair(side("bcos"), side("conv"))
    assert (bcos, conv) == (4.0, 2.0)
    assert bench_gpu._ratio(bcos, conv) == "2.00x" and bench_gpu._ratio(conv, bcos) == "0.50x"
    assert bench_gpu._ratio(None, conv) == "n/a" and bench_gpu._ratio(bcos, 0.0) == "n/a"


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
