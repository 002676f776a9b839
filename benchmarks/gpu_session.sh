#!/usr/bin/env bash
# One command for a session with a GPU (issue 30). From the repository root, after `bash benchmarks/device_wheels.sh`
# here (it fills .whl/ with Captum, TransformerLens, sae-lens, inseq and what they import that the image lacks, about
# 26 MiB):
#   carry [".whl"] and run: bash benchmarks/gpu_session.sh          (timeout_s 590)
# Stages, in the order of what the issue needs most:
#   1. the eager B-cos / conventional table with the Triton kernel's rows ("eager + triton") beside the PyTorch path's,
#      the kernel at its per-dtype default tiles (triton_linear.default_tiles, since 2026-11-28: 128x128x32, bf16
#      4 warps with late norms, fp32 8 warps; its whole-model rows were timed only with the earlier 64x64x32), and
#      the kernel counts of one bf16 forward (--profile). This decides the next step: if every bf16 "eager + triton"
#      forward beats the bf16 eager one and stage 2 passes, turn the kernel on by default for CUDA bf16;
#   2. the compiled kernel's checks against the PyTorch path (tests/triton_linear_checks.py: explicit 64x64x32 tiles
#      and the per-dtype defaults, each with partial tiles);
#   3. every family's CUDA paths and the host libraries' own calls;
#   4. the kernel's tile configurations (benchmarks/triton_probe.py --parts kernel, the defaults first);
#   5. compiled MiniLM cells (compiling bert-base did not fit in 347 s on 2026-11-28:
#      `bench_gpu.py --modes compiled --shapes bert-base --budget-s 1e9` needs a call of its own).
# A session's device time is 15 minutes, the machine's start included, so each of stages 1-3 runs under its own
# `timeout` (at most GPU_STAGE_S seconds: table, kernel checks, device tests) and all within GPU_TOTAL_S seconds of the
# start (default 570, for a call's timeout_s of 590); 4 and 5 run only in the time left (over 100 and 90 s). Each
# writes its log to $OUT (the device tool's folder that comes back) as it goes, so a stage cut short still returns
# what it printed. What fits, from what the last run printed (H200, 2026-11-28 19:05-19:14 UTC, this script at
# 71401de: kernel checks, table, device tests, then compiled cells in "the 347 s left"; the probe ran in a call of its
# own): kernel checks 47 s (39 checks; 53 now, the new ones at other tiles to compile: about 15-20 s more), the table
# 104 s (its Llama rows but the first then stopped early, out of memory from a benchmark leak since fixed: about 25 s
# more now), installs and device tests together 570 - 347 - 47 - 104 = 72 s, the probe 65 s (12 configurations; 14
# now). So stages 1-3 take about 270 s, the probe about 80 s, and stage 5 gets about 220 s (MiniLM compiled in under
# 347 s then). The caps (300 + 150 + 150 s) bound a slow run; the deadline cuts stages 4-5 first.
# The image seen had torch 2.11, transformers 5.17 and triton 3.6 and no network.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
read -r table_s kernel_s hosts_s <<<"${GPU_STAGE_S:-300 150 150}"
deadline=$((SECONDS + ${GPU_TOTAL_S:-570}))
within() { local left=$((deadline - SECONDS)); echo $((left < $1 ? (left > 1 ? left : 1) : $1)); }  # a stage's timeout
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/session.log"; }
log "start; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >>"$OUT/session.log" 2>&1 \
    || log "the wheels did not install: the host libraries' tests will fail to import"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# bcos_plugins.adapters lives in adapters/ and is importable only installed. The image's setuptools may be older
# than pyproject's build requirement (>= 77), so where the editable install fails the package is laid out by hand.
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$OUT/session.log" 2>&1; then
  log "pip install -e . failed (see above); laying bcos_plugins out in /tmp/pkg instead"
  rm -rf /tmp/pkg && mkdir -p /tmp/pkg && cp -r bcos_plugins /tmp/pkg/ && cp -r adapters /tmp/pkg/bcos_plugins/adapters
  export PYTHONPATH=/tmp/pkg:$PYTHONPATH
fi
python3 -c "import torch, transformers, triton, bcos_plugins, bcos_plugins.adapters; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())" 2>&1 \
  | tee -a "$OUT/session.log"
status=0
log "1/5 the table: eager rows with and without the kernel (its per-dtype default tiles), the kernel counts of one bf16 forward (--profile)"
timeout "$(within "$table_s")" python3 benchmarks/bench_gpu.py --modes eager --triton --profile 2>&1 | tee "$OUT/bench_gpu.log" \
  || status=1
log "2/5 the compiled kernel against the PyTorch path (tests/triton_linear_checks.py, BCOS_TRITON_KERNEL=compiled)"
timeout "$(within "$kernel_s")" env BCOS_TRITON_KERNEL=compiled python3 -m pytest -q -p no:cacheprovider -rf \
  -W "ignore:divide by zero encountered in log2:RuntimeWarning" tests/triton_linear_checks.py --durations=5 \
  >"$OUT/kernel_checks.log" 2>&1 || status=1
tail -n 25 "$OUT/kernel_checks.log"
log "3/5 every family's CUDA paths and the host libraries' own calls"
timeout "$(within "$hosts_s")" env BCOS_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -rf --durations=5 \
  tests/test_device_paths.py tests/test_device_hosts.py >"$OUT/device_tests.log" 2>&1 || status=1
tail -n 25 "$OUT/device_tests.log"
left=$((deadline - SECONDS))
if [ "$left" -gt 100 ]; then
  log "4/5 the kernel's tile configurations against F.linear and the PyTorch layer (triton_probe.py --parts kernel)"
  timeout $((left - 10)) python3 benchmarks/triton_probe.py --parts kernel --budget-s $((left - 40)) 2>&1 \
    | tee "$OUT/triton_probe.log"
fi
left=$((deadline - SECONDS))
if [ "$left" -gt 90 ]; then
  log "5/5 compiled cells (minilm) in the $left s left"
  timeout "$left" python3 benchmarks/bench_gpu.py --modes compiled --shapes minilm --budget-s $((left - 60)) \
    2>&1 | tee "$OUT/bench_gpu_compiled.log"
fi
log "end, status $status"
exit $status
