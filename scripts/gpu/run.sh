#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/stage.sh: takes the bundle's prebuilt addon when it was made
# against this very PyTorch, else builds the addon against the local PyTorch with plain cmake (no
# cmake-js there: the bundled Node's headers stand in for what it passes), then
# runs the GPU checks (dist/bench/gpu-checks.js) and, after `--`, any further command in the same
# environment (a benchmark, say). Results and logs go to $OUT (default outputs/gpu).
#   bash scripts/gpu/run.sh [gpu-checks args | --no-checks] [-- command...]
# An addon this script built or copied in an earlier call on the same (still warm) machine is used
# again when it was made from these native sources against this torch: a later call can run
# benchmarks alone (--no-checks -- bash scripts/gpu/session.sh) without building again.
#   LIBTORCH=<folder>   another libtorch (default: python3's PyTorch, torch.utils.cmake_prefix_path)
#   PRIME_GPU_BUILD_ADDON=1  build the addon here even where the bundle's prebuilt one matches
#   PRIME_GPU_SECONDS=N the whole command's time, the build included: exported as PRIME_GPU_DEADLINE
#                       (epoch seconds), which the GPU plan (bench/gpu/plan.ts) and session.sh keep to
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
if [ -n "${PRIME_GPU_SECONDS:-}" ]; then export PRIME_GPU_DEADLINE=$(($(date +%s) + PRIME_GPU_SECONDS)); fi
STAGE=${PRIME_GPU_STAGE:-/opt/prime-gpu}
OUT=${OUT:-$ROOT/outputs/gpu}
mkdir -p "$OUT"
log() { printf '\033[1m[gpu-run]\033[0m %s\n' "$*"; }
die() { echo "gpu-run: $*" >&2; exit 1; }

[ -f "$STAGE/env.sh" ] || die "$STAGE/env.sh not found: run scripts/gpu/stage.sh with the bundle's last call first"
# shellcheck disable=SC1091
source "$STAGE/env.sh"
[ -d node_modules ] && [ -f dist/bench/gpu-checks.js ] || die "node_modules/ or dist/ missing: run scripts/gpu/stage.sh with a call folder (once every part is staged, a folder holding only the bundle's MANIFEST relinks them: a new call's transfer drops the links)"
# dist/ must be compiled from these sources (the bundle records their hash).
source scripts/gpu/hashes.sh
[ "$(ts_sources_hash)" = "$(cat dist/.sources-hash)" ] || die "dist/ was compiled from other sources than this tree: run scripts/gpu/bundle.sh again"

checks=() run_checks=1
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  if [ "$1" = --no-checks ]; then run_checks=0; else checks+=("$1"); fi
  shift
done
[ "${1:-}" = -- ] && shift

# The addon: the bundle's prebuilt one, or built against PyTorch's libtorch (native/cmake/torch.cmake).
# One import of torch for what the checks below compare: version and commit, its lib/ folder.
# (With LIBTORCH given and no torch in python3: nothing prebuilt matches, the addon is built.)
torch_facts=$(python3 -c 'import torch, os; print(torch.__version__, torch.version.git_version, os.path.join(os.path.dirname(torch.__file__), "lib"))') ||
  [ -n "${LIBTORCH:-}" ] || die "python3 cannot import torch; set LIBTORCH"
read -r version commit torch_lib <<<"$torch_facts"
torch_version="$version $commit"
if [ -z "${LIBTORCH:-}" ]; then LIBTORCH=$(dirname "$torch_lib")/share/cmake; fi
export LIBTORCH
log "node $(node --version), libtorch: $LIBTORCH"
addon=build/native/Release/prime_native.node
# loads_with_cuda: the addon in build/native loads (finding libtorch through LD_LIBRARY_PATH,
# exported: child processes load it too) and sees CUDA.
loads_with_cuda() {
  export LD_LIBRARY_PATH=$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  node -e "process.exit(require('./$addon').info().cuda ? 0 : 1)"
}
# The bundle's prebuilt addon, when it was built from these sources against this very torch.
prebuilt() {
  local dir=$STAGE/addon
  [ -f "$dir/prime_native.node" ] || return 1
  [ "$(cat "$dir/torch-version")" = "$torch_version" ] || { log "prebuilt addon is for torch $(cat "$dir/torch-version"), not $torch_version"; return 1; }
  [ "$(cat "$dir/sources-hash")" = "$(native_sources_hash)" ] || { log "prebuilt addon: other native sources"; return 1; }
  mkdir -p "$(dirname "$addon")" && cp "$dir/prime_native.node" "$addon"
  loads_with_cuda || { log "prebuilt addon does not load or sees no CUDA: building"; return 1; }
  log "using the bundle's prebuilt addon (torch $torch_version)"
}
# What the addon in build/native was made from: these native sources, this torch.
addon_key="$(native_sources_hash) $torch_version"
earlier() { # the addon of an earlier call, if it is still the one these sources make
  [ -f "$addon" ] && [ "$(cat build/native/.prime-addon-key 2>/dev/null)" = "$addon_key" ] || return 1
  loads_with_cuda || return 1
  log "using the addon built or copied by an earlier call"
}

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
configure() { # configure [cmake -D args]: build/native from scratch
  rm -rf build/native
  cmake -S native -B build/native "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLIBTORCH="$LIBTORCH" \
    -DCMAKE_JS_INC="$PRIME_NODE_INCLUDE" -DCMAKE_CXX_FLAGS=-DBUILDING_NODE_EXTENSION \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$ROOT/build/native/Release" "$@"
}
build_here=${PRIME_GPU_BUILD_ADDON:-0}
if [ "$build_here" != 1 ] && earlier; then
  :
elif [ "$build_here" = 1 ] || ! prebuilt; then
  {
    # PyTorch's CMake config (it reads the CUDA toolkit); where it does not configure, PyTorch's
    # libraries linked directly, CUDA's included (native/cmake/torch.cmake, PRIME_TORCH_DIRECT).
    configure || {
      echo "[gpu-run] PyTorch's CMake config failed: linking its libraries directly (PRIME_TORCH_DIRECT)"
      configure -DPRIME_TORCH_DIRECT=ON
    }
    cmake --build build/native -j "$(nproc)"
  } > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; die "the addon failed to build (log: $OUT/build.log)"; }
  grep 'prime_native: building against\|PRIME_TORCH_DIRECT\|CUDA graphs\|NCCL' "$OUT/build.log" || true
fi
echo "$addon_key" > build/native/.prime-addon-key

status=0
# PRIME_GPU_CHECKS_SECONDS bounds the checks (default 0: no bound).
if [ "$run_checks" = 1 ]; then
  timeout --kill-after=10 "${PRIME_GPU_CHECKS_SECONDS:-0}" node dist/bench/gpu-checks.js --out "$OUT" "${checks[@]}" || status=$?
fi
if [ $# -gt 0 ]; then
  log "running: $*"
  "$@" || status=$?
fi
exit $status
