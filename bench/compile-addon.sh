#!/usr/bin/env bash
# Clean builds of the native addon as set-up makes it (libtorch's headers precompiled,
# native/src/pch.h, and the sources compiled in unity batches) against the same without the unity
# batches (-DPRIME_UNITY=OFF) and, with --all, without either (-DPRIME_PCH=OFF too), one after the
# other in the same run, ccache off: wall and CPU seconds of each, and the ratios. Built with plain cmake and ninja into temporary
# folders (the tree's build/ is left alone) against the libtorch native/cmake/torch.cmake picks
# (LIBTORCH from the environment, as for setup.sh). Needs the main job's set-up.
#   bash bench/compile-addon.sh [--jobs N] [--all]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=2 variants="default no-unity"
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift ;;
    --all) variants="default no-unity neither" ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (bash bench/compile-addon.sh --help)" >&2; exit 2 ;;
  esac
  shift
done
command -v ninja > /dev/null && [ -d node_modules/node-addon-api ] ||
  { echo "error: run bash scripts/setup.sh first (ninja, node-addon-api)" >&2; exit 2; }
node_include=$(node -p 'require("path").join(process.execPath, "../../include/node")')
[ -f "$node_include/node_api.h" ] || { echo "error: Node's headers are not at $node_include" >&2; exit 2; }
tmp=$(mktemp -d /tmp/prime-compile-addon-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export CCACHE_DISABLE=1
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, ninja -j$jobs, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A cpu=() flags=([default]="" [no-unity]="-DPRIME_UNITY=OFF" [neither]="-DPRIME_UNITY=OFF -DPRIME_PCH=OFF")
for v in $variants; do
  b=$tmp/$v
  # shellcheck disable=SC2086 # flags[$v] is a list of options
  cmake -S native -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release ${flags[$v]} \
    -DCMAKE_JS_INC="$node_include" -DCMAKE_CXX_FLAGS=-DBUILDING_NODE_EXTENSION > "$b.configure.log" 2>&1 ||
    { tail -20 "$b.configure.log"; exit 1; }
  /usr/bin/time -o "$b.time" -f '%e %U %S' ninja -C "$b" -j"$jobs" > "$b.log" 2>&1 || { tail -20 "$b.log"; exit 1; }
  read -r wall user sys < "$b.time"
  cpu[$v]=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
  echo "$v (${flags[$v]:-unity batches and precompiled headers}): ${wall} s wall, ${cpu[$v]} s CPU ($(grep -c 'Building CXX' "$b.log") compiles), load after $(cut -d' ' -f1 /proc/loadavg)"
done
for v in $variants; do
  [ "$v" = default ] || awk -v d="${cpu[default]}" -v o="${cpu[$v]}" -v v="$v" 'BEGIN { printf "set-up'"'"'s build: %.2fx less CPU time for a clean build than %s\n", o / d, v }'
done
