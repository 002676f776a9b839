#!/usr/bin/env bash
# The wheels a GPU session carries so that tests/test_device_hosts.py (TransformerLens, sae-lens, inseq) and
# tests/test_device_paths.py (Captum) run on the device image, which has torch 2.11, transformers 5.17, pytest and
# hypothesis but none of the host libraries. Downloads exactly these into .whl/ (git-ignored), for CPython 3.12 on
# x86-64 Linux (the image's python3), and prints each size and the total. Run it here, from the repository root:
#   bash benchmarks/device_wheels.sh
# A GPU session then names .whl in `carry` and starts its command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
#   export PYTHONPATH=/tmp/site
#   python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1   # bcos_plugins itself
#   BCOS_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/test_device_hosts.py
# (bcos_plugins.adapters lives in adapters/ and imports only installed: benchmarks/gpu_session.sh installs it so).
#
# Which wheels: the four host libraries at the versions the suite is tested with (.ci/tested-versions.txt) and each
# distribution they import, directly or not, while these tests run that the image lacks. Found by running both
# test files here in a copy of .venv's site-packages holding only the image's distributions (the package list in
# the device notes, 2026-11-17) plus the carried ones, adding whatever an import or a metadata lookup then missed
# (2026-11-28: all 57 tests of test_device_hosts, and the Captum and ViT tests of test_device_paths, passed so).
# transformer_lens imports datasets (and so dill and multiprocess; pyarrow, pandas, fsspec and xxhash are on the
# image) and sae_lens imports wandb (and so pydantic and opentelemetry-api) at import time: wandb is 19 of the
# 26 MiB. The other declared requirements (beartype, fancy-einsum, typeguard, plotly, nltk, babe, tenacity,
# python-dotenv, transformers-stream-generator, ...) are not imported by these tests.
# The image's own versions must meet the carried ones' bounds: datasets 5.2 asks for pyarrow >= 24,
# fsspec <= 2026.9.0 and huggingface-hub >= 1.31 (the image had 1.33); not checked there yet.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}

pinned() {  # the version .ci/tested-versions.txt pins
  local version
  version=$(grep -i "^$1==" .ci/tested-versions.txt | cut -d= -f3)
  [ -n "$version" ] || { echo "device_wheels.sh: .ci/tested-versions.txt pins no $1; add it or name a version here" >&2; exit 1; }
  echo "$1==$version"
}

installed() {  # the version .venv runs the suite with (what the tests passed with)
  local version
  version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null) \
    || { echo "device_wheels.sh: $1 is not installed in $PY's environment; run make setup first" >&2; exit 1; }
  echo "$1==$version"
}

wheels=(
  "$(pinned captum)" "$(pinned transformer-lens)" "$(pinned sae-lens)" "$(pinned inseq)" "$(pinned datasets)"
  # transformer_lens -> better_abc; datasets -> dill, multiprocess
  "$(installed better-abc)" "$(installed dill)" "$(installed multiprocess)"
  # sae_lens -> simple_parsing (-> docstring_parser), wandb (-> platformdirs, pydantic, opentelemetry-api)
  "$(installed simple-parsing)" "$(installed docstring-parser)" "$(installed wandb)" "$(installed platformdirs)"
  "$(installed pydantic)" "$(installed pydantic-core)" "$(installed typing-inspection)" "$(installed annotated-types)"
  "$(installed opentelemetry-api)"
)

rm -rf .whl
mkdir -p .whl
for wheel in "${wheels[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$wheel"
done
count=$(ls .whl/*.whl | wc -l)
[ "$count" -eq "${#wheels[@]}" ] || { echo "device_wheels.sh: ${#wheels[@]} wheels asked for, $count in .whl" >&2; exit 1; }
ls -l .whl/*.whl | awk '{printf "%8.2f MiB  %s\n", $5 / 1048576, $9; total += $5} END {printf "%8.2f MiB  total (the carry limit is 64 MiB with the ~9 MiB tree)\n", total / 1048576}'
