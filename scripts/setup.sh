#!/usr/bin/env bash
# Installs and builds what prime-rl needs, by need and idempotently: a second run on a set-up
# machine finishes in seconds. Steps are skipped when a stamp (hash of their inputs) says they are
# done; each step that runs prints its seconds.
#
#   bash scripts/setup.sh [--tests] [--wandb] [--verifiers] [--all] [--only]
#
#   (no flag)    the main job (npm run reverse-text):
#                0. which libtorch: Debian's, or PyTorch's (LIBTORCH, or on a GPU machine)
#                1. Debian packages: libtorch (unless 0. chose PyTorch's) + OpenBLAS + Gloo headers,
#                   compilers, cmake, ninja
#                2. the Temporal CLI v1.5.1, built with `go install` into tools/bin (not onto the system),
#                   in the background beside 1. and 3.
#                3. npm packages, exactly as package-lock.json pins them
#                4. the native addon (cmake-js against libtorch) -> build/native/Release/prime_native.node
#                5. the TypeScript build -> dist/
#   --tests      + what the test suite and `npm run lint` use: clang-format, Chromium (the report's
#                rendering tests), a JRE and Maven, and Temporal's Java test server (the time-skipping
#                workflow tests) fetched into tools/
#   --wandb      + 6. the Weights & Biases SDK (Python `wandb`, scripts/wandb/requirements.txt) -> .venv/
#   --verifiers  + 7. verifiers 0.4.0 (scripts/verifiers/) -> .venv-verifiers/
#   --all        all of the above (npm test, .ci/run). PRIME_RL_VERIFIERS=0 leaves 7. out (the
#                verifiers tests then skip, saying so).
#   --only       only the optional parts named, not the main job's steps: what a run does the first
#                time its config uses one (lib/optional-parts.ts)
#
# A run installs 6. and 7. itself the first time its config uses them ([wandb], a `verifiers:` env),
# so the flags matter where a run cannot download: a GPU machine without network is set up ahead of
# time with the parts its configs use.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
STAMPS=$ROOT/.setup-stamps
mkdir -p "$STAMPS"

usage() { sed -n '/^#   bash scripts/,/^# time with/s/^# \{0,1\}//p' "$0"; }
main=1 tests=0 wandb=0 verifiers=0
for arg in "$@"; do
  case $arg in
    --tests) tests=1 ;;
    --wandb) wandb=1 ;;
    --verifiers) verifiers=1 ;;
    --all) tests=1 wandb=1 verifiers=1 ;;
    --only) main=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown option $arg (bash scripts/setup.sh --help lists them)" >&2; exit 2 ;;
  esac
done
if [ "${PRIME_RL_VERIFIERS:-1}" = 0 ]; then verifiers=0; fi

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
# stamp_ok NAME HASH: true if step NAME last completed with inputs HASH.
stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { echo "$2" > "$STAMPS/$1"; }
# hash_of FILE...: a short hash of the files' contents (stdin too, for extra inputs).
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
# step "WHAT" COMMAND...: says WHAT, runs COMMAND, then says how many seconds it took.
step() {
  local what=$1 t0=$SECONDS
  shift
  log "$what"
  "$@"
  log "  $what: $((SECONDS - t0)) s"
}
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_install() {
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@"
}
setup_start=$SECONDS

# One set-up at a time: a run installing an optional part on first use and a user's set-up (or
# two runs) wait for each other rather than building the same venv twice.
exec 9> "$STAMPS/lock"
flock -w 3600 9 || { echo "error: another scripts/setup.sh has held $STAMPS/lock for an hour" >&2; exit 1; }

# 0. which libtorch ----------------------------------------------------------------------------
# LIBTORCH=<folder> (a libtorch prefix or a PyTorch package folder) or LIBTORCH=pytorch (python3's
# PyTorch) picks one; unset, python3's PyTorch is used when it sees a CUDA device (a GPU machine),
# else Debian's libtorch-dev 1.13, the CPU default. native/cmake/torch.cmake reads the result.
if [ $main = 1 ]; then
  torch_of_python() { python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null; }
  if [ "${LIBTORCH:-}" = pytorch ]; then
    LIBTORCH=$(torch_of_python) || { echo "error: LIBTORCH=pytorch but python3 cannot import torch" >&2; exit 2; }
  elif [ -z "${LIBTORCH:-}" ] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    LIBTORCH=$(torch_of_python)
  fi
  export LIBTORCH=${LIBTORCH:-}
  if [ -n "$LIBTORCH" ]; then log "libtorch: $LIBTORCH"; fi
fi

# 2. Temporal CLI, started first ----------------------------------------------------------------
# Compiling it is most of the CPU work and steps 1 and 3 are mostly downloads, so it builds in the
# background beside them (it needs only Go, which the machine has); waited for before step 4.
TEMPORAL_VERSION=v1.5.1   # later tags cannot be built with `go install`
temporal_pid=""
if [ $main = 1 ] && { ! stamp_ok temporal "$TEMPORAL_VERSION" || [ ! -x tools/bin/temporal ]; }; then
  command -v go >/dev/null || { echo "error: Go is needed to build the Temporal CLI (go install); install Go >= 1.23" >&2; exit 1; }
  mkdir -p tools/bin
  log "building the Temporal CLI $TEMPORAL_VERSION into tools/bin, in the background (a few minutes the first time)"
  temporal_start=$SECONDS
  GOBIN="$ROOT/tools/bin" GOFLAGS=-trimpath go install "github.com/temporalio/cli/cmd/temporal@$TEMPORAL_VERSION" > "$STAMPS/temporal.log" 2>&1 9>&- &
  temporal_pid=$!
  # A step that fails ends the set-up: the build does not go on behind it.
  trap '[ -z "$temporal_pid" ] || kill "$temporal_pid" 2>/dev/null || true' EXIT
fi
wait_temporal() {
  if [ -z "$temporal_pid" ]; then return; fi
  if ! wait "$temporal_pid"; then
    temporal_pid=""
    cat "$STAMPS/temporal.log" >&2
    echo "error: building the Temporal CLI failed (its output is above)" >&2
    exit 1
  fi
  temporal_pid=""
  log "  building the Temporal CLI: $((SECONDS - temporal_start)) s (beside the steps above)"
  stamp_set temporal "$TEMPORAL_VERSION"
}

# 1. Debian packages --------------------------------------------------------------------------
# libgloo-dev: the Gloo headers that c10d's ProcessGroupGloo.hpp includes (the data-parallel
# trainer, native/src/dist.cc), for either libtorch (PyTorch's wheels ship none).
APT_PACKAGES=()
if [ $main = 1 ]; then
  APT_PACKAGES+=(libopenblas0-pthread build-essential cmake ninja-build git ca-certificates libgloo-dev)
  # libsleef-dev: sleef.h, which libtorch 1.13's vectorised types include for AVX2 and AVX-512
  # (native/src/cpu/kernels.cc; PyTorch 2.x's headers do not need it).
  if [ -z "$LIBTORCH" ]; then APT_PACKAGES+=(libtorch-dev libsleef-dev); fi
fi
# Chromium: test/report.render.test.ts; clang-format: npm run lint; the JRE and Maven: the Java
# test server below.
if [ $tests = 1 ]; then APT_PACKAGES+=(chromium clang-format openjdk-17-jre-headless maven); fi
# python3 with venv + ensurepip (steps 6 and 7), unless python3 already has them.
if [ $((wandb + verifiers)) -gt 0 ] && ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  APT_PACKAGES+=(python3 python3-venv)
fi
missing=()
for p in ${APT_PACKAGES[@]+"${APT_PACKAGES[@]}"}; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then step "installing Debian packages: ${missing[*]}" apt_install "${missing[@]}"; fi

if [ $main = 1 ]; then
  # 3. npm packages -----------------------------------------------------------------------------
  # Node >= 20.19: hyparquet (SFT datasets as parquet) is an ES module that the code loads with require().
  node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)' ||
    { echo "error: Node.js >= 20.19 is needed (this is $(node --version)); install a newer Node.js 20 or 22" >&2; exit 1; }
  lock_hash=$(hash_of package-lock.json)
  if ! stamp_ok npm "$lock_hash" || [ ! -d node_modules ]; then
    # Not `npm ci`: the registries these machines reach serve only this platform's optional binaries
    # (@swc/core-*, ...), and `npm ci` rejects a lock file that lacks the other platforms' entries.
    # `npm install --no-save` installs the versions the lock file pins and leaves it untouched.
    step "npm install (locked versions)" npm install --no-save --no-fund --no-audit --loglevel=error
    stamp_set npm "$lock_hash"
  fi

  wait_temporal

  # 4. native addon -----------------------------------------------------------------------------
  # shellcheck disable=SC2046 # the source paths have no spaces
  native_hash=$(echo "$lock_hash $LIBTORCH" | hash_of - native/CMakeLists.txt $(find native/cmake native/src -type f | sort))
  if ! stamp_ok native "$native_hash" || [ ! -f build/native/Release/prime_native.node ]; then
    step "building the native addon (libtorch)" npx --no-install cmake-js compile --directory native --out build/native --log-level warn
    stamp_set native "$native_hash"
  fi

  # 5. TypeScript -------------------------------------------------------------------------------
  # shellcheck disable=SC2046 # the source paths have no spaces
  ts_hash=$(echo "$lock_hash" | hash_of - tsconfig.json $(find lib workflows activities workers native bench test -name '*.ts' | sort))
  if ! stamp_ok ts "$ts_hash" || [ ! -f dist/workers/cli.js ]; then
    step "compiling TypeScript" bash scripts/build-ts.sh
    stamp_set ts "$ts_hash"
  fi
fi

# Temporal's Java test server (time-skipping, for the fast workflow tests): its jars from Maven
# Central, pinned by scripts/temporal-test-server/pom.xml; scripts/temporal-test-server/run.sh
# starts it. Fetched into a temporary folder, then renamed.
fetch_test_server() {
  rm -rf "$TTS/lib.tmp" && mkdir -p "$TTS"
  mvn -q -B -Dstyle.color=never -f scripts/temporal-test-server/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$ROOT/$TTS/lib.tmp"
  rm -rf "${TTS:?}/lib" && mv "$TTS/lib.tmp" "$TTS/lib"
}
if [ $tests = 1 ]; then
  TTS=tools/temporal-test-server
  tts_hash=$(hash_of scripts/temporal-test-server/pom.xml)
  if ! stamp_ok test-server "$tts_hash" || [ ! -d $TTS/lib ]; then
    step "fetching Temporal's Java test server into $TTS (Maven Central)" fetch_test_server
    stamp_set test-server "$tts_hash"
  fi
fi

# venv DIR PIP_ARGS...: installs PIP_ARGS into the venv DIR. A new venv is built in DIR.partial and
# renamed into place when complete, so an install that is killed or fails leaves no DIR (a run takes
# an existing DIR as installed: lib/optional-parts.ts); the next try starts DIR.partial afresh. An
# existing DIR is updated in place, keeping what else was installed into it (an env's package).
venv() {
  local dir=$1 tmp=$1.partial
  shift
  if [ -x "$dir/bin/python" ]; then
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@"
    return
  fi
  rm -rf "$tmp"
  python3 -m venv "$tmp"
  "$tmp/bin/python" -m pip install -q --disable-pip-version-check "$@"
  # The venv's scripts (bin/pip, bin/activate, ...) name its folder: point them at DIR first.
  { grep -rlIZ -- "$ROOT/$tmp" "$tmp/bin" "$tmp/pyvenv.cfg" || true; } | xargs -0 -r sed -i "s|$ROOT/$tmp|$ROOT/$dir|g"
  # A link or a damaged venv without bin/python in the way: moved aside, then removed.
  if [ -e "$dir" ] || [ -L "$dir" ]; then rm -rf "$dir.old" && mv -T "$dir" "$dir.old"; fi
  mv -T "$tmp" "$dir"
  rm -rf "$dir.old"
}

# 6. W&B SDK -----------------------------------------------------------------------------------
# The official SDK is Python; [wandb] runs it as a sidecar (lib/run/wandb.ts) from this venv.
if [ $wandb = 1 ]; then
  wandb_hash=$(hash_of scripts/wandb/requirements.txt)
  if ! stamp_ok wandb "$wandb_hash" || [ ! -x .venv/bin/python ]; then
    step "installing the W&B SDK into .venv" venv .venv -r scripts/wandb/requirements.txt
    stamp_set wandb "$wandb_hash"
  fi
fi

# 7. verifiers ---------------------------------------------------------------------------------
# A verifiers environment's env server runs in this venv (lib/envs/verifiers/README.md), unless an
# env's args.python names another Python. verifiers needs Python >= 3.11. About 560 MB.
if [ $verifiers = 1 ]; then
  vf_hash=$(hash_of scripts/verifiers/requirements.txt scripts/verifiers/constraints.txt)
  if ! stamp_ok verifiers "$vf_hash" || [ ! -x .venv-verifiers/bin/python ]; then
    python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' ||
      { echo "error: verifiers needs Python >= 3.11 (python3 is $(python3 -V 2>&1)); install one, or PRIME_RL_VERIFIERS=0 to skip" >&2; exit 1; }
    step "installing verifiers into .venv-verifiers (about 560 MB)" \
      venv .venv-verifiers -r scripts/verifiers/requirements.txt -c scripts/verifiers/constraints.txt
    stamp_set verifiers "$vf_hash"
  fi
fi

log "ready ($((SECONDS - setup_start)) s)"
