#!/usr/bin/env bash
# One command for a session with a GPU (issue 30): the CUDA tests, then the eager B-cos / conventional table with
# the Triton kernel's rows beside the PyTorch path's (docs/benchmarks.md#gpu). Run from the repository root:
#   bash benchmarks/gpu_session.sh            (about 10 minutes on one H200 with a warm machine; not yet timed)
# The device image seen had torch 2.11, transformers 5.17 and triton 3.6 but no Captum, which bench_gpu.py and the
# tests import: carry a Captum wheel (pip download captum==0.9.0 --no-deps) as wheels/ and it is installed first.
set -euo pipefail
if ls wheels/captum-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps wheels/captum-*.whl
fi
python3 -m pip install -q --no-deps -e . >/dev/null
# first the kernel on the GPU against the PyTorch path (compiled and interpreted), and every family's device paths
BCOS_TEST_DEVICE=cuda python3 -m pytest -q -x tests/test_triton_linear.py tests/test_device_paths.py
# then the speed: eager rows with and without the kernel, side by side, and the kernel counts of one forward
python3 benchmarks/bench_gpu.py --modes eager --triton --profile
