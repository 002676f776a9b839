#!/usr/bin/env bash
# Build the wheel, install it the way the README tells users to (torch first, then the wheel with extras,
# then inseq the README way) into a fresh virtual environment, and run .ci/wheel_smoke.py there, from a
# folder outside the repository so that nothing resolves to the source tree. `make wheel-smoke` runs it;
# `make test` too. pip's cache (~/.cache/pip) is reused between runs, so only the first run downloads.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
BUILD_PY=${BUILD_PY:-.venv/bin/python}   # any Python with pip: the build runs isolated, as pyproject.toml asks
[ -x "$BUILD_PY" ] || BUILD_PY=$PYTHON
WORK=$(realpath -m "${WHEEL_SMOKE_DIR:-build/wheel-smoke}")
EXTRAS=${WHEEL_SMOKE_EXTRAS:-captum,lens,inseq-runtime,demo}
# Combinations of extras the README's support matrix states and the real install below does not cover:
# resolved with pip's dry run (its resolver costs about 20 s of CPU each, so only these).
COMBOS=${WHEEL_SMOKE_COMBOS:-"inseq"}
if grep -q '^lens4 *=' pyproject.toml; then COMBOS="$COMBOS lens4"; fi
start=$(date +%s)

rm -rf "$WORK"
mkdir -p "$WORK/dist" "$WORK/run"
"$BUILD_PY" -m pip wheel -q --no-deps -w "$WORK/dist" . 2>"$WORK/build.log" \
    || { cat "$WORK/build.log"; exit 1; }
wheel=$(ls "$WORK"/dist/bcos_plugins-*.whl)
echo "built $(basename "$wheel") in $(( $(date +%s) - start )) s"

"$PYTHON" -m venv "$WORK/venv"
# pip warns once per package that a configured local index has no folder for it: noise, filtered out.
pip_quiet() {
    "$WORK/venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}
# The local CPU build; any other torch pulls multi-GB CUDA wheels (README "Install").
pip_quiet install torch==2.13.0

# Each combination of extras resolves with plain pip next to that torch. .ci/check_resolution.py reads pip's
# reports (these dry runs and the real install): no second torch, no CUDA wheels, and the host-library
# versions the README's support matrix states.
mkdir -p "$WORK/resolve"
pids=()
for combo in $COMBOS; do
    spec="$wheel[$combo]"; [ "$combo" = core ] && spec="$wheel"
    pip_quiet install --dry-run --report "$WORK/resolve/$combo.json" "$spec" \
        >"$WORK/resolve/$combo.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { cat "$WORK"/resolve/*.log; exit 1; }; done
echo "resolved $(echo $COMBOS | wc -w) more combination(s) of extras in $(( $(date +%s) - start )) s"

pip_quiet install --report "$WORK/resolve/$EXTRAS.json" "$wheel[$EXTRAS]"
# The extras resolve with plain pip and agree with each other before inseq joins them.
"$WORK/venv/bin/python" -m pip check
"$WORK/venv/bin/python" .ci/check_resolution.py "$WORK/resolve"
# inseq pins typeguard<=2.13.3 against TransformerLens' >=4.2 and neither imports it (README recipe).
pip_quiet install --no-deps inseq==0.7.1
echo "installed into a fresh environment in $(( $(date +%s) - start )) s"

(cd "$WORK/run" && BCOS_REPO="$REPO" "$WORK/venv/bin/python" "$REPO/.ci/wheel_smoke.py")
echo "wheel smoke test took $(( $(date +%s) - start )) s"
