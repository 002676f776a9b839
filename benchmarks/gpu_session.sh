#!/usr/bin/env bash
# One command for a session with a GPU (issue 30): the CUDA tests (the Triton kernel, every family's paths, the host
# libraries' own calls), then the eager B-cos / conventional table with the Triton kernel's rows beside the PyTorch
# path's (docs/benchmarks.md#gpu). From the repository root, after `bash benchmarks/device_wheels.sh` here (it fills
# .whl/ with Captum, TransformerLens, sae-lens, inseq and what they import that the image lacks, about 26 MiB):
#   carry [".whl"] and run: bash benchmarks/gpu_session.sh
# Not yet timed: budget about 3-4 minutes for the tests and 4-6 for the table on one H200 (bench_gpu.py's eager rows
# took about 100 s there; the Triton rows double them, plus the kernel's compilation per layer width).
# The device image seen had torch 2.11, transformers 5.17 and triton 3.6 and no network. The package is installed
# without its dependencies and without build isolation (the image's setuptools builds it): bcos_plugins.adapters
# lives in adapters/ and is importable only installed.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1
status=0
# the kernel on the GPU against the PyTorch path (compiled, and interpreted on the CPU), every family's device paths
BCOS_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/test_triton_linear.py tests/test_device_paths.py \
  tests/test_device_hosts.py || status=1
# the speed, also when a test failed (its rows say whether the kernel ran): eager rows with and without the kernel
# side by side on the same models, and the kernel counts of one bfloat16 forward with --profile
python3 benchmarks/bench_gpu.py --modes eager --triton --profile || status=1
exit $status
