#!/usr/bin/env bash
# One command for a session with a GPU (issue 30): the compiled Triton kernel's checks, then the eager B-cos /
# conventional table with the Triton kernel's rows beside the PyTorch path's (docs/benchmarks.md#gpu), then every
# family's CUDA paths and the host libraries' own calls. From the repository root, after
# `bash benchmarks/device_wheels.sh` here (it fills .whl/ with Captum, TransformerLens, sae-lens, inseq and what they
# import that the image lacks, about 26 MiB):
#   carry [".whl"] and run: bash benchmarks/gpu_session.sh          (timeout_s 590)
# A session's device time is 15 minutes, the machine's start included, so the stages run in the order of what the
# issue needs most, each under its own `timeout` (at most GPU_STAGE_S seconds each: kernel checks, table, device
# tests) and all of them within GPU_TOTAL_S seconds of the start (default 570, for a call's timeout_s of 590); each
# writes its log to $OUT (the device tool's folder that comes back) as it goes, so a stage cut short still returns
# what it printed. Time left after the three goes to the kernel's tile timings (benchmarks/triton_probe.py, about 65 s
# on an H200) and then to compiled MiniLM cells (stage 5; compiling bert-base did not fit in 347 s on 2026-11-28:
# `bench_gpu.py --modes compiled --shapes bert-base --budget-s 1e9` needs a call of its own).
# The image seen had torch 2.11, transformers 5.17 and triton 3.6 and no network.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
read -r kernel_s table_s hosts_s <<<"${GPU_STAGE_S:-150 300 150}"
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
log "1/5 the compiled kernel against the PyTorch path (tests/triton_linear_checks.py, BCOS_TRITON_KERNEL=compiled)"
timeout "$(within "$kernel_s")" env BCOS_TRITON_KERNEL=compiled python3 -m pytest -q -p no:cacheprovider -rf \
  -W "ignore:divide by zero encountered in log2:RuntimeWarning" tests/triton_linear_checks.py --durations=5 \
  >"$OUT/kernel_checks.log" 2>&1 || status=1
tail -n 25 "$OUT/kernel_checks.log"
log "2/5 the table: eager rows with and without the kernel, the kernel counts of one bf16 forward (--profile)"
timeout "$(within "$table_s")" python3 benchmarks/bench_gpu.py --modes eager --triton --profile 2>&1 | tee "$OUT/bench_gpu.log" \
  || status=1
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
