"""The Triton kernel of a B-cos linear layer (bcos_plugins.nn.triton_linear) against the PyTorch path.

The kernel checks are in tests/triton_linear_checks.py and run in a child process: on every machine under Triton's
interpreter (``TRITON_INTERPRET=1`` from the child's start, CPU tensors), and with ``BCOS_TEST_DEVICE=cuda`` a second
time compiled, on the GPU. Each check compares the switch on with the switch off on the same layer and input:
inference, explaining (the gradient with respect to x, no parameter gradient) and training (gradients with respect
to x and the weight); float32, and float16 / bfloat16 under autocast and as the weights' dtype; B in {1.25, 1.5, 2}
(square roots) and 1.75 (exp2 / log2); ``BcosLinear`` and GPT-2's ``BcosConv1D`` (units are columns); sizes that are
not multiples of the tiles (74 rows, 72 units, 70 inputs: two row tiles, two unit tiles, three K steps, each with a
partial last tile), padding rows (x = 0: output exactly 0, finite gradients) and a unit whose weights are 0; the calls
the kernel leaves to the PyTorch path; and a tiny B-cos BERT and GPT-2 explained with the switch on and off (complete,
the same contributions). Values agree to the dtype's rounding, not bit for bit (the kernel normalises the weight after
the product), so tolerances are relative to the largest value compared.

Without a GPU the compiled kernel is still compiled here: ``triton.compile`` for an sm_90 target (H100 / H200) from
recorded launches (Triton's wheel carries ptxas), so a kernel change that breaks only the compiler fails on a CPU.

Interpreter facts found with triton 3.6 (a check fails when one changes):
- Triton decorates its library functions (``tl.sum``, ``tl.zeros``) for the interpreter or the compiler when
  ``triton.language`` is first imported: the interpreter works only in a process started with TRITON_INTERPRET=1
  (hence the child process);
- ``triton.jit`` picks the interpreter for a kernel when it decorates it (``triton.knobs.runtime.interpret``);
- the interpreter multiplies bfloat16 tiles in ``tl.dot`` as their raw 16-bit integers (silently wrong values): the
  kernel widens bfloat16 tiles to float32 for the product under the interpreter only (exact products);
- it casts float32 to bfloat16 by truncation (toward 0; compiled kernels and torch round to the nearest): the kernel
  rounds its bfloat16 values by hand under the interpreter only, and a check pins that the interpreted kernel's
  bfloat16 values are as close to float64 as the PyTorch path's (they were 2.4x further, a tiny Llama's
  explanations 3x less complete);
- with NumPy >= 2.4 it cannot loop to a runtime bound (``int()`` of a one-element array; fixed in Triton 3.8): the
  kernel's K is a compile-time constant;
- ``tl.maximum``'s default (``PropagateNan.NONE``) is NumPy's ``maximum`` in 3.6's interpreter (NaN kept) and ``fmax``
  in 3.9's (the other operand, as the compiled ``max.f32``): the kernel asks for ``PropagateNan.ALL`` where a NaN
  must survive (an overflowed row's floored ``|cos|``). The checks pass under both (2026-11-29, helper-190); the CI's
  fresh venv resolves the newest (3.9 then).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bcos_plugins.errors import BcosRuntimeError, BcosTypeError, BcosValueError
from bcos_plugins.nn import triton_kernels, using_triton_kernels
from bcos_plugins.nn import triton_linear as tlin

TESTS = Path(__file__).resolve().parent
DEVICE = os.environ.get("BCOS_TEST_DEVICE", "cpu")


def _checks(kernel: str) -> None:
    """Run tests/triton_linear_checks.py in a child process with the kernel ``kernel``; fail with its report."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["BCOS_TRITON_KERNEL"] = kernel
    env.setdefault("OMP_NUM_THREADS", "1")
    if kernel == "interpreted":
        env["TRITON_INTERPRET"] = "1"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                          "ignore:divide by zero encountered in log2:RuntimeWarning",
                          str(TESTS / "triton_linear_checks.py")],
                         cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600)
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, report
    assert " passed" in report and "skipped" not in report and "deselected" not in report, report


def test_the_kernel_under_triton_s_interpreter():
    _checks("interpreted")


if DEVICE == "cuda":  # (BCOS_TEST_DEVICE=cuda: benchmarks/gpu_session.sh)
    def test_the_compiled_kernel_on_the_gpu():
        _checks("compiled")


def test_the_switch_validates_and_restores(monkeypatch):
    with pytest.raises(BcosTypeError, match=r"^enabled: must be True or False, got int 1\. Call triton_kernels\(\) or "
                                            r"triton_kernels\(False\)\.$"):
        with triton_kernels(1):
            pass
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BcosRuntimeError, match=r"enabled: .*needs a CUDA device.*TRITON_INTERPRET=1"):
        with triton_kernels():
            pass
    monkeypatch.setitem(sys.modules, "triton", None)  # (import triton raises ImportError)
    with pytest.raises(BcosRuntimeError, match=r"enabled: .*needs the triton package.*install it"):
        with triton_kernels():
            pass
    assert not using_triton_kernels()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delitem(sys.modules, "triton")
    with triton_kernels():
        assert using_triton_kernels()
        with triton_kernels(False):  # (turning it off needs nothing)
            assert not using_triton_kernels()
        assert using_triton_kernels()
    assert not using_triton_kernels()


def test_triton_picks_the_interpreter_when_it_decorates():
    """The one private detail the module relies on (``decorated_kernel``): in this Triton, ``triton.jit`` chooses between the
    interpreter and the compiler when it decorates, from ``triton.knobs.runtime.interpret``, and the knobs' scope
    restores the environment variable. If this fails, ``decorated_kernel`` must select the interpreter another way."""
    import triton
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    before = os.environ.get("TRITON_INTERPRET")
    assert isinstance(tlin.decorated_kernel(True), InterpretedFunction)
    assert isinstance(tlin.decorated_kernel(False), JITFunction)
    assert os.environ.get("TRITON_INTERPRET") == before
    assert isinstance(triton.knobs.runtime.interpret, bool)


def test_the_gpu_benchmark_refuses_triton_rows_on_a_cpu(capsys):
    """``bench_gpu.py --triton`` measures the kernel on a GPU; on a CPU it would time Triton's interpreter."""
    from benchmarks import bench_gpu

    with pytest.raises(SystemExit):
        bench_gpu.main(["--device", "cpu", "--quick", "--triton"])
    assert "--triton: the kernel is measured on a CUDA device only" in capsys.readouterr().err


def test_the_gpu_scripts_read_device_alike(monkeypatch, capsys):
    """bench_gpu.py and triton_probe.py read ``--device`` through one helper (benchmarks.common.device_option): the
    same refusals with the same messages, each script's own hint for its CPU mode (bench_gpu accepted ``mps`` and
    then ran on a device it has no timing or memory code for)."""
    from benchmarks import bench_gpu, triton_probe

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for main, hint in ((bench_gpu.main, "pass --device cpu (with --quick for a smoke run)"),
                       (triton_probe.main, "pass --device cpu --quick with TRITON_INTERPRET=1")):
        for device, message in (("mps", "--device: cuda or cpu, got 'mps'"), ("nonsense", "--device: "),
                                ("cuda", f"--device cuda: no CUDA device is visible; {hint}")):
            with pytest.raises(SystemExit) as stop:
                main(["--device", device, "--quick"])
            assert stop.value.code == 2
            assert message in capsys.readouterr().err, (main.__module__, device)


def test_calls_whose_offsets_overflow_int32_take_the_pytorch_path():
    # the kernel's offsets are int32 index x stride products: 2^31 elements or more in the output, the input or the
    # weight would wrap around (silently wrong memory), so those calls are not covered
    assert tlin._int32_offsets_suffice(17_000, 128_256, 4096) is False  # a Llama 3 head over 17k tokens: 2.18e9 outputs
    assert tlin._int32_offsets_suffice(2**20, 4096, 2048) is False  # the input: 2^31 elements
    assert tlin._int32_offsets_suffice(2, 2**16, 2**15) is False  # the weight: 2^31 elements
    assert tlin._int32_offsets_suffice(16_000, 32_000, 4096) is True
    assert tlin._int32_offsets_suffice(2**31 // 4096 - 1, 4096, 4096) is True


def test_the_gpu_probe_runs_on_tiny_shapes_under_the_interpreter():
    """benchmarks/triton_probe.py (one short GPU call: llama-1b training memory with the kernel, the kernel's time per
    tile configuration) with ``--device cpu --quick`` in a child process under Triton's interpreter: both parts run,
    every configuration's values match the PyTorch B-cos layer's (a wrong tile configuration is marked, not timed as
    if right), and the memory rows are the kernel's (it launched)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(TESTS.parent / "benchmarks" / "triton_probe.py"), "--device", "cpu",
                          "--quick"], cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600)
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, report
    out = run.stdout
    assert "| train step 3 |" in out and "| train step 5, kernel off |" in out, report
    assert "| model and optimizer freed |" in out, report
    assert "WRONG VALUES" not in out and "error:" not in out and "not measured" not in out, report
    errors = re.search(r"# fp32, largest difference from the PyTorch B-cos layer / its largest value: (.*)", out)
    assert errors and all(float(cell.split()[1]) <= 1e-4 for cell in errors.group(1).split(", ")), report
    launches = re.search(r"# (\d+) kernel launches \((\d+) per forward\)", out)
    assert launches and int(launches.group(2)) > 0, report
    rows = [line for line in out.splitlines() if line.startswith("| ") and (" bf16 |" in line or " fp32 |" in line)]
    assert len(rows) == 20, report  # minilm and bert-base 3 layer shapes each, gpt2 4; bfloat16 and float32
    assert "c1 = default" in out and ("kernel default (c1 'default'): bfloat16 128x128x32/w4/s3/late, float16 "
                                      "128x128x32/w4/s3/late, float32 128x128x32/w8/s3\n") in out, report
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        # c1 (default: the kernel's own tiles per dtype), c2, c3 (/late), c4 (/tf32x3: float32 layers only),
        # c5 (/bf16w: bfloat16 layers only), c6 (/first)
        kernel = cells[3:9]
        skipped = 4 if " fp32 |" in row else 3
        assert kernel[skipped] == "-", row
        assert all(cell.replace(",", "").isdigit() for cell in kernel[:skipped] + kernel[skipped + 1:]), row


def test_the_gpu_probe_refuses_a_cpu_without_the_interpreter_and_bad_configurations(monkeypatch, capsys):
    from benchmarks import triton_probe

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit):
        triton_probe.main(["--device", "cpu", "--quick"])
    assert "--device cpu: the kernel runs on CPU tensors only in Triton's interpreter" in capsys.readouterr().err
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for text, message in (("64x64", "is not BMxBNxBK/wWARPS/sSTAGES"), ("64x48x32/w4/s3", "block_n must be a power"),
                          ("64x64x8/w4/s3", "block_k must be a power of two >= 16"),
                          ("64x64x32/w4/s0", "num_stages must lie in")):
        with pytest.raises(SystemExit):
            triton_probe.main(["--device", "cpu", "--quick", "--configs", text])
        assert message in capsys.readouterr().err, text


def test_the_gpu_probe_stops_starting_configurations_at_its_budget(monkeypatch, capsys):
    """The probe must end within one short GPU call: past ``--budget-s`` no configuration starts, and it says so
    (here at once: no kernel launches, so no interpreter is needed)."""
    from benchmarks import triton_probe

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (the CPU check; nothing is launched)
    assert triton_probe.main(["--device", "cpu", "--quick", "--parts", "kernel", "--budget-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "configurations 1-6 not measured" in out
    assert "| minilm q/k/v/out (32 x 32 -> 32) bf16 |" in out and "fp32, geometric mean" in out


def test_the_gpu_probe_s_parallel_compile_only_compiles_and_restores_the_kernel(monkeypatch):
    """The probe compiles a configuration's kernels in threads by standing in for the decorated kernel
    (``kernel[grid](...)`` becomes ``kernel.warmup``, which launches nothing); afterwards the layers' kernel is back,
    and Triton's async compile mode is off again (left on, every later launch would go to the closed pool). Under
    the interpreter ``warmup`` does nothing, so this checks the plumbing; the compiling itself runs on a GPU."""
    from triton.runtime import _async_compile

    from benchmarks import triton_probe

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    config = triton_probe.parse_config("32x32x16/w4/s3/late")
    for text in ("32x32x16/w4/s3/late", "128x64x32/w8/s4/first/nfast"):  # (the probe's header writes tiles so)
        assert triton_probe.config_text(triton_probe.parse_config(text).tiles) == text
    problem = triton_probe.Problem("tiny", "layer", 8, 32, 16, columns=False)
    case = triton_probe.make_case(problem, torch.float32, torch.device("cpu"), 1.5)
    kernel = tlin.decorated_kernel
    decorated = kernel(True)
    warmup, seen = decorated.warmup, []

    def recorded(*args, grid, **kwargs):
        seen.append((grid, kwargs["BLOCK_M"], kwargs["LATE_NORMS"], kwargs["num_stages"]))
        return warmup(*args, grid=grid, **kwargs)

    monkeypatch.setattr(decorated, "warmup", recorded)
    assert triton_probe._compile([case], config, 1.5, threads=2).startswith("compiled in")
    assert seen == [((1, 1), 32, True, 3)]
    assert tlin.decorated_kernel is kernel and _async_compile.active_mode.get() is None

    def fails(self, *exc):
        raise RuntimeError("a compile thread failed")

    monkeypatch.setattr(_async_compile.AsyncCompileMode, "__exit__", fails)
    note = triton_probe._compile([case], config, 1.5, threads=2)
    assert note.startswith("parallel compile failed (RuntimeError: a compile thread failed)"), note
    assert tlin.decorated_kernel is kernel and _async_compile.active_mode.get() is None


def _record_launch(monkeypatch) -> list:
    """``launch_bcos_kernel``'s kernel calls, recorded instead of run: ``(args, kwargs)`` each."""
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((args, kwargs))

    monkeypatch.setattr(tlin, "decorated_kernel", lambda interpreted: Recorder())
    return calls


def _compile_for_sm90(kernel, args, kwargs):
    """The kernel compiled for an H100 / H200 (sm_90) from one recorded launch, as Triton's JIT would specialise it on
    a GPU (tensors 16-byte aligned, integers equal to 1 constant, multiples of 16 marked so); no GPU needed: Triton's
    wheel carries ptxas."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    pointer = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
    signature, constants, attrs = {}, {}, {}
    for name, value in zip(names, args, strict=False):
        if isinstance(value, torch.Tensor):
            signature[name] = pointer[value.dtype]
            attrs[(names.index(name),)] = [["tt.divisibility", 16]]
        elif isinstance(value, int) and value == 1:
            signature[name], constants[name] = "constexpr", 1
        elif isinstance(value, int):
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(names.index(name),)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages")}
    kwargs["INTERPRETED_BF16"] = False  # (what a CUDA launch passes)
    for name, value in kwargs.items():
        signature[name], constants[name] = "constexpr", value
    return triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def test_the_kernel_compiles_for_an_h100_without_a_gpu(monkeypatch):
    """The compiled kernel is otherwise checked only in GPU sessions: here each autograd mode's launch (inference,
    explaining, training; B = 1.5 and the general exponent), GPT-2's transposed weight, and the probe's configurations
    (larger tiles, late or first norms, units-first order, three-pass TF32, bfloat16 weights) compile for sm_90 on the CPU, within its 227 KiB of
    shared memory; bfloat16 products run on the tensor cores (wgmma), IEEE float32 ones do not (why float32 layers
    are slow, docs/benchmarks.md#gpu)."""
    kernel = tlin.decorated_kernel(False)  # (Triton's JIT function, before the launches are recorded)
    calls = _record_launch(monkeypatch)
    torch.manual_seed(0)
    x32 = torch.randn(96, 64)
    w32 = torch.randn(48, 64)
    launches = [  # (x, weight view, B, output dtype, floor, store_dyn, store_norms, tiles (None: the dtype's), precision)
        (x32.bfloat16(), w32, 1.5, torch.bfloat16, False, False, False, None, None),  # inference, autocast
        (x32, w32, 1.75, torch.float32, True, True, False, None, None),  # explaining
        (x32, w32.T.contiguous().T, 1.5, torch.float32, True, False, True, None, None),  # training, Conv1D
        (x32.half(), w32.half(), 1.5, torch.float16, True, True, False, None, None),  # explaining, float16 weights
        (x32.bfloat16(), w32, 1.5, torch.bfloat16, False, False, False, tlin.KernelTiles(64, 64, 32, 4, 3), None),
        (x32.bfloat16(), w32.bfloat16(), 1.5, torch.bfloat16, False, False, False,
         tlin.KernelTiles(128, 128, 64, 8, 3, late_norms=True), None),
        (x32, w32, 1.5, torch.float32, False, False, False, tlin.KernelTiles(128, 128, 32, 8, 3), "tf32x3"),
        (x32.bfloat16(), w32.T.contiguous().T.bfloat16(), 1.25, torch.bfloat16, True, False, True,
         tlin.KernelTiles(128, 128, 64, 8, 3, norms_first=True, units_fastest=True), None),
    ]
    for x, view, b, dtype, floor, store_dyn, store_norms, tiles, precision in launches:
        tlin.launch_bcos_kernel(x, view, b, dtype, floor=floor, store_dyn=store_dyn, store_norms=store_norms,
                                tiles=tiles, precision=precision)
    assert len(calls) == len(launches)
    for (args, kwargs), launch in zip(calls, launches, strict=True):
        compiled = _compile_for_sm90(kernel, args, dict(kwargs))
        assert compiled.metadata.shared <= 227 * 1024, launch[-2:]
        tensor_cores = "wgmma.mma_async" in compiled.asm["ptx"]
        assert tensor_cores == (launch[3] != torch.float32 or launch[-1] == "tf32x3"), launch[-2:]
        # the clamp of ||w|| (every launch) and the floor on |cos| (explaining, training) keep an overflowed unit's or
        # row's NaN: max.NaN, not max.f32, which returns the non-NaN operand (tests/triton_linear_checks.py checks the
        # values under the interpreter)
        ptx = compiled.asm["ptx"]
        assert "max.NaN.f32" in ptx and "max.f32" not in ptx, launch


def test_launches_take_the_default_tiles_of_the_dtype_they_multiply_in(monkeypatch):
    """The kernel's tiles per dtype (docs/benchmarks.md#gpu, H200): 128 x 128 x 32 with 4 warps and the norms reduced
    after the K loop for bfloat16 and float16 products, 8 warps for float32 ones; the dtype is the one the tiles are
    multiplied in (under autocast its dtype, not the weights'), through a layer as through a direct launch."""
    from bcos_plugins.nn import BcosLinear

    sixteen = tlin.KernelTiles(128, 128, 32, num_warps=4, num_stages=3, late_norms=True)
    wide = tlin.KernelTiles(128, 128, 32, num_warps=8, num_stages=3)
    assert dict(tlin.DEFAULT_TILES) == {torch.bfloat16: sixteen, torch.float16: sixteen, torch.float32: wide}
    for dtype, tiles in tlin.DEFAULT_TILES.items():
        assert tlin.default_tiles(dtype) is tiles
    with pytest.raises(TypeError):
        tlin.DEFAULT_TILES[torch.float32] = sixteen  # (read-only: a change would reach every layer silently)
    for bad in (torch.float64, "bfloat16", None):
        with pytest.raises(BcosValueError, match=r"dtype: the kernel multiplies bfloat16, float16 or float32 tiles, "
                                                 r"got .*pass one of torch\.bfloat16"):
            tlin.default_tiles(bad)
    with pytest.raises(TypeError):
        tlin.KernelTiles()  # (no numbers of its own: the defaults depend on the dtype)

    calls = _record_launch(monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (the layers launch on CPU tensors; the kernel is recorded, not run)
    torch.manual_seed(0)
    layer = BcosLinear(64, 48, b=1.5)
    x = torch.randn(96, 64)
    with torch.no_grad(), triton_kernels():
        layer(x)  # float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(x)  # float32 weights, bfloat16 products
        layer.to(torch.float16)(x.half())
    tlin.launch_bcos_kernel(x, layer.weight.float(), 1.5, torch.float32, floor=False, store_dyn=False,
                            store_norms=False)
    seen = [(kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["BLOCK_K"], kwargs["num_warps"], kwargs["num_stages"],
             kwargs["LATE_NORMS"], kwargs["DOT_DTYPE"]) for _, kwargs in calls]
    import triton.language as tl

    assert seen == [(128, 128, 32, 8, 3, False, tl.float32), (128, 128, 32, 4, 3, True, tl.bfloat16),
                    (128, 128, 32, 4, 3, True, tl.float16), (128, 128, 32, 8, 3, False, tl.float32)]
