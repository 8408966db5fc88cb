#!/usr/bin/env bash
# Installs and builds everything prime-rl needs, idempotently: a second run on a set-up machine
# finishes in seconds. Steps are skipped when a stamp (hash of their inputs) says they are done.
#   0. which libtorch: Debian's, or PyTorch's (LIBTORCH, or on a GPU machine)
#   1. Debian packages: libtorch (unless 0. chose PyTorch's) + OpenBLAS, compilers, cmake, ninja,
#      clang-format (npm run lint), a JRE and Maven
#   2. the Temporal CLI v1.5.1, built with `go install` into tools/bin (not onto the system), and
#      Temporal's Java test server (time skipping, for the fast workflow tests) into tools/
#   3. npm packages, exactly as package-lock.json pins them
#   4. the native addon (cmake-js against libtorch) -> build/native/Release/prime_native.node
#   5. the TypeScript build -> dist/
#   6. the Weights & Biases SDK (Python `wandb`, pinned in scripts/wandb/requirements.txt) -> .venv/
#   7. verifiers 0.4.0 for `[[env]] id = "verifiers:<module>"` (scripts/verifiers/) -> .venv-verifiers/
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAMPS=$ROOT/.setup-stamps
mkdir -p "$STAMPS"

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
# stamp_ok NAME HASH: true if step NAME last completed with inputs HASH.
stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { echo "$2" > "$STAMPS/$1"; }
# hash_of FILE...: a short hash of the files' contents (stdin too, for extra inputs).
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# 0. which libtorch ----------------------------------------------------------------------------
# LIBTORCH=<folder> (a libtorch prefix or a PyTorch package folder) or LIBTORCH=pytorch (python3's
# PyTorch) picks one; unset, python3's PyTorch is used when it sees a CUDA device (a GPU machine),
# else Debian's libtorch-dev 1.13, the CPU default. native/cmake/torch.cmake reads the result.
torch_of_python() { python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null; }
if [ "${LIBTORCH:-}" = pytorch ]; then
  LIBTORCH=$(torch_of_python) || { echo "error: LIBTORCH=pytorch but python3 cannot import torch" >&2; exit 2; }
elif [ -z "${LIBTORCH:-}" ] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  LIBTORCH=$(torch_of_python)
fi
export LIBTORCH=${LIBTORCH:-}
if [ -n "$LIBTORCH" ]; then log "libtorch: $LIBTORCH"; fi

# 1. Debian packages --------------------------------------------------------------------------
# libgloo-dev: the Gloo headers that c10d's ProcessGroupGloo.hpp includes (the data-parallel
# trainer, native/src/dist.cc), for either libtorch (PyTorch's wheels ship none).
APT_PACKAGES=(libopenblas0-pthread build-essential cmake ninja-build git ca-certificates chromium clang-format openjdk-17-jre-headless maven libgloo-dev)
if [ -z "$LIBTORCH" ]; then APT_PACKAGES+=(libtorch-dev); fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. Temporal CLI -------------------------------------------------------------------------------
TEMPORAL_VERSION=v1.5.1   # later tags cannot be built with `go install`
if ! stamp_ok temporal "$TEMPORAL_VERSION" || [ ! -x tools/bin/temporal ]; then
  command -v go >/dev/null || { echo "error: Go is needed to build the Temporal CLI (go install); install Go >= 1.23" >&2; exit 1; }
  log "building the Temporal CLI $TEMPORAL_VERSION into tools/bin (takes a few minutes the first time)"
  mkdir -p tools/bin
  GOBIN=$ROOT/tools/bin GOFLAGS=-trimpath go install "github.com/temporalio/cli/cmd/temporal@$TEMPORAL_VERSION"
  stamp_set temporal "$TEMPORAL_VERSION"
fi

# The Java test server's jars (Maven Central), pinned by scripts/temporal-test-server/pom.xml;
# scripts/temporal-test-server/run.sh starts it. Fetched into a temporary folder, then renamed.
TTS=tools/temporal-test-server
tts_hash=$(hash_of scripts/temporal-test-server/pom.xml)
if ! stamp_ok test-server "$tts_hash" || [ ! -d $TTS/lib ]; then
  log "fetching Temporal's Java test server into $TTS (Maven Central)"
  rm -rf $TTS/lib.tmp && mkdir -p $TTS
  mvn -q -B -Dstyle.color=never -f scripts/temporal-test-server/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$ROOT/$TTS/lib.tmp"
  rm -rf $TTS/lib && mv $TTS/lib.tmp $TTS/lib
  stamp_set test-server "$tts_hash"
fi

# 3. npm packages -------------------------------------------------------------------------------
# Node >= 20.19: hyparquet (SFT datasets as parquet) is an ES module that the code loads with require().
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)' ||
  { echo "error: Node.js >= 20.19 is needed (this is $(node --version)); install a newer Node.js 20 or 22" >&2; exit 1; }
lock_hash=$(hash_of package-lock.json)
if ! stamp_ok npm "$lock_hash" || [ ! -d node_modules ]; then
  # Not `npm ci`: the registries these machines reach serve only this platform's optional binaries
  # (@swc/core-*, ...), and `npm ci` rejects a lock file that lacks the other platforms' entries.
  # `npm install --no-save` installs the versions the lock file pins and leaves it untouched.
  log "npm install (locked versions)"
  npm install --no-save --no-fund --no-audit --loglevel=error
  stamp_set npm "$lock_hash"
fi

# 4. native addon -------------------------------------------------------------------------------
native_hash=$(echo "$lock_hash $LIBTORCH" | hash_of - native/CMakeLists.txt $(find native/cmake native/src -type f | sort))
if ! stamp_ok native "$native_hash" || [ ! -f build/native/Release/prime_native.node ]; then
  log "building the native addon (libtorch)"
  npx --no-install cmake-js compile --directory native --out build/native --log-level warn
  stamp_set native "$native_hash"
fi

# 5. TypeScript ---------------------------------------------------------------------------------
ts_hash=$(echo "$lock_hash" | hash_of - tsconfig.json $(find lib workflows activities workers native bench test -name '*.ts' | sort))
if ! stamp_ok ts "$ts_hash" || [ ! -f dist/workers/cli.js ]; then
  log "compiling TypeScript"
  bash scripts/build-ts.sh
  stamp_set ts "$ts_hash"
fi

# python3 with venv + ensurepip (steps 6 and 7).
ensure_python_venv() {
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    log "installing Debian packages: python3 python3-venv"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3 python3-venv
  fi
}

# 6. W&B SDK -----------------------------------------------------------------------------------
# The official SDK is Python; [wandb] runs it as a sidecar (lib/run/wandb.ts) from this venv.
wandb_hash=$(hash_of scripts/wandb/requirements.txt)
if ! stamp_ok wandb "$wandb_hash" || [ ! -x .venv/bin/python ]; then
  ensure_python_venv
  log "installing the W&B SDK into .venv"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/wandb/requirements.txt
  stamp_set wandb "$wandb_hash"
fi

# 7. verifiers ---------------------------------------------------------------------------------
# A verifiers environment's env server runs in this venv (lib/envs/verifiers/README.md), unless an
# env's args.python names another Python. verifiers needs Python >= 3.11. About 560 MB and a few
# minutes, once; PRIME_RL_VERIFIERS=0 skips it (the verifiers tests then skip, saying so).
if [ "${PRIME_RL_VERIFIERS:-1}" != 0 ]; then
  vf_hash=$(hash_of scripts/verifiers/requirements.txt scripts/verifiers/constraints.txt)
  if ! stamp_ok verifiers "$vf_hash" || [ ! -x .venv-verifiers/bin/python ]; then
    ensure_python_venv
    python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' ||
      { echo "error: verifiers needs Python >= 3.11 (python3 is $(python3 -V 2>&1)); install one, or PRIME_RL_VERIFIERS=0 to skip" >&2; exit 1; }
    log "installing verifiers into .venv-verifiers (once, a few minutes)"
    [ -x .venv-verifiers/bin/python ] || python3 -m venv .venv-verifiers
    .venv-verifiers/bin/python -m pip install -q --disable-pip-version-check \
      -r scripts/verifiers/requirements.txt -c scripts/verifiers/constraints.txt
    stamp_set verifiers "$vf_hash"
  fi
fi

log "ready"
