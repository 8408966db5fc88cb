#!/usr/bin/env bash
# The addon of an earlier commit, built as scripts/check-cuda-build.sh builds this tree's (PyPI's
# torch 2.11+cu130, CUDA libraries linked directly), into .gpu/baseline/prime_native.node:
# scripts/gpu/bundle.sh then carries it to the GPU machine, where PRIME_GPU_BASELINE_ADDON=
# /opt/prime-gpu/baseline/prime_native.node makes scripts/gpu/session.sh run it beside this build
# (before/after in one call). The commit's native/ is exported to a temporary folder (no checkout
# or worktree is touched); what it compiles is that commit's own CMake files and sources.
#   bash scripts/gpu/baseline.sh COMMIT      e.g. daee604, the build the last H200 session measured
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
commit=${1:?usage: baseline.sh COMMIT}
git rev-parse --verify -q "$commit^{commit}" > /dev/null || { echo "baseline: no commit '$commit'" >&2; exit 2; }
source scripts/torch2-pins.sh
install_pinned "$TORCH2_DIR" "${TORCH2_PINS[@]}"
src=$(mktemp -d /tmp/prime-baseline-XXXX)
trap 'rm -rf "$src"' EXIT
git archive "$commit" native | tar -x -C "$src"
# Its CMakeLists asks node for node-addon-api's headers from the folder above native/.
ln -s "$ROOT/node_modules" "$src/node_modules"
echo "[baseline] building $(git rev-parse --short "$commit")'s addon against $TORCH2_DIR/torch"
LIBTORCH=$ROOT/$TORCH2_DIR/torch npx --no-install cmake-js compile --directory "$src/native" --out "$src/build" \
  --log-level warn --CDPRIME_TORCH_DIRECT=ON
mkdir -p .gpu/baseline
cp "$src/build/Release/prime_native.node" .gpu/baseline/prime_native.node
git rev-parse "$commit" > .gpu/baseline/commit
echo "[baseline] .gpu/baseline/prime_native.node ($(git rev-parse --short "$commit"))"
