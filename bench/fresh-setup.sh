#!/usr/bin/env bash
# The first set-up as a new user meets it: README.md's "First set-up" table. Builds a fresh Debian 12
# root with debootstrap from Debian's packages, holding what a fresh machine of this kind has and
# nothing else (Node.js 20 and Go copied from this machine; gcc/g++, make, cmake, git, Python 3 with
# pip and venv from Debian; this machine's own certificate authorities, for a network that inspects
# TLS), with empty caches (no apt lists or archives, no npm, pip, Go, Maven or ccache cache). Then, for each scenario, in a copy of that root: clones the repository at COMMIT,
# times the set-up (step by step, as scripts/setup.sh prints it), then times it a second time.
#   main   `bash scripts/setup.sh`, what `npm run reverse-text` runs before its job; then
#          `bash scripts/setup.sh --all` on top (what `npm test` adds)
#   all    `bash scripts/setup.sh --all`, what `npm test` runs before the suite
# The copies are removed after each scenario, the base root at the end unless --keep.
#
#   sudo bash bench/fresh-setup.sh [--scenarios main,all] [--commit REF] [--base DIR] [--keep]
#     --base DIR   where the base root is made (default /var/tmp/prime-fresh/base); one already
#                  there (kept by --keep) is used as it is
#     --keep       keep the base root for a later run (else it is removed at the end)
#     --commit REF the commit to clone (default HEAD; committed work only)
# Needs root (debootstrap, chroot, mounts) and Debian's mirror; prints a table at the end and writes
# it, with each scenario's log, to /var/tmp/prime-fresh/<date>/.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
scenarios=main,all commit=HEAD base=/var/tmp/prime-fresh/base keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --scenarios) scenarios=$2; shift ;;
    --commit) commit=$2; shift ;;
    --base) base=$2; shift ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (bash bench/fresh-setup.sh --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "error: bench/fresh-setup.sh needs root (debootstrap, chroot)" >&2; exit 2; }
sha=$(git rev-parse --verify "$commit^{commit}") || { echo "error: --commit $commit: no such commit" >&2; exit 2; }
for s in ${scenarios//,/ }; do
  case $s in main | all) ;; *) echo "error: --scenarios: unknown scenario '$s' (main, all)" >&2; exit 2 ;; esac
done
[ -x /usr/bin/node ] && [ -d /usr/lib/node_modules/npm ] && [ -x /usr/local/go/bin/go ] ||
  { echo "error: this machine's Node.js (/usr/bin/node, /usr/lib/node_modules/npm) and Go (/usr/local/go) are copied into the root; one is missing" >&2; exit 2; }
OUT=/var/tmp/prime-fresh/$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
say() { printf '\033[1m[fresh-setup]\033[0m %s\n' "$*" | tee -a "$OUT/summary.txt"; }
MARK=.prime-fresh-root

# Mounts of a root, undone on exit; a root is removed only with nothing mounted in it, and rm never
# leaves its file system.
mounted=()
mount_root() {
  local r=$1
  mount --bind /dev "$r/dev" && mounted+=("$r/dev")
  mount -t devpts devpts "$r/dev/pts" && mounted+=("$r/dev/pts")
  mount -t proc proc "$r/proc" && mounted+=("$r/proc")
  mount -t sysfs sysfs "$r/sys" && mounted+=("$r/sys")
  cp -L /etc/resolv.conf "$r/etc/resolv.conf"
}
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}"; done
  mounted=()
}
remove_root() {
  local r=$1
  [ -e "$r" ] || return 0
  [ -f "$r/$MARK" ] || { echo "error: $r is not a root this script made (no $MARK): not removing it" >&2; return 1; }
  if findmnt -rn -o TARGET | grep -q "^$r/"; then echo "error: something is still mounted under $r: not removing it" >&2; return 1; fi
  rm -rf --one-file-system "$r"
}
work=""
cleanup() {
  unmount_all
  if [ -n "$work" ]; then remove_root "$work" || true; fi
  if [ $keep = 0 ]; then remove_root "$base" || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# This machine's network: the certificate authorities it trusts beside Debian's (a network that
# inspects TLS has its own), and the variables that point programs at the bundle (Node.js and uv,
# for one, read no system store by default). No other settings: no package caches or mirrors.
CA_VARS=(SSL_CERT_FILE SSL_CERT_DIR NODE_EXTRA_CA_CERTS PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE GIT_SSL_CAINFO)
ca_env=()
for v in "${CA_VARS[@]}"; do if [ -n "${!v:-}" ]; then ca_env+=("$v=${!v}"); fi; done
# in_root ROOT COMMAND: runs COMMAND (a bash script) in ROOT as a fresh login of root would.
in_root() {
  chroot "$1" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 ${ca_env[@]+"${ca_env[@]}"} \
    PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c "$2"
}
# trust_host_cas ROOT: this machine's own certificate authorities, added to ROOT's store.
trust_host_cas() {
  local crts=(/usr/local/share/ca-certificates/*.crt)
  [ -e "${crts[0]}" ] || return 0
  cp "${crts[@]}" "$1/usr/local/share/ca-certificates/"
  in_root "$1" 'update-ca-certificates > /dev/null'
}

# The base root ------------------------------------------------------------------------------------
if [ "$(cat "$base/$MARK" 2>/dev/null)" = complete ]; then
  say "base root: $base (kept from an earlier run)"
else
  if [ -f "$base/$MARK" ]; then remove_root "$base"; fi # an unfinished one
  [ ! -e "$base" ] || { echo "error: --base $base exists and is not a root this script made" >&2; exit 2; }
  command -v debootstrap > /dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap > /dev/null 2>&1; }
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  say "base root: debootstrap bookworm from $mirror into $base"
  mkdir -p "$base" && touch "$base/$MARK"
  debootstrap --variant=minbase bookworm "$base" "$mirror" > "$OUT/debootstrap.log" 2>&1 ||
    { tail -20 "$OUT/debootstrap.log"; echo "error: debootstrap failed (log: $OUT/debootstrap.log)" >&2; exit 1; }
  # What the machine's image has besides a minimal Debian, from Debian's packages; no services start.
  printf '#!/bin/sh\nexit 101\n' > "$base/usr/sbin/policy-rc.d" && chmod 755 "$base/usr/sbin/policy-rc.d"
  cp /etc/apt/sources.list.d/debian.sources "$base/etc/apt/sources.list.d/" 2>/dev/null && rm -f "$base/etc/apt/sources.list"
  mount_root "$base"
  in_root "$base" 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    ca-certificates git build-essential cmake python3 python3-pip python3-venv curl xz-utils procps > /dev/null' \
    > "$OUT/base-packages.log" 2>&1 || { tail -20 "$OUT/base-packages.log"; echo "error: the base packages failed to install" >&2; exit 1; }
  # Empty caches: no package lists or archives, as on a fresh machine.
  in_root "$base" 'apt-get clean && rm -rf /var/lib/apt/lists/* /root/.cache'
  unmount_all
  # Node.js 20 with its npm, as this machine has them (Debian 12's own Node.js is 18), and Go.
  tar -C / -cf - usr/bin/node usr/bin/npm usr/bin/npx usr/include/node usr/lib/node_modules | tar -C "$base" -xf -
  mkdir -p "$base/usr/local" && cp -a /usr/local/go "$base/usr/local/go"
  echo complete > "$base/$MARK"
fi

# The scenarios --------------------------------------------------------------------------------
# run_setup NAME ARGS: times `bash scripts/setup.sh ARGS` in the work root; its output to the log.
declare -A total=() cpu=()
run_setup() {
  local name=$1 args=$2 t0
  say "$name: bash scripts/setup.sh $args (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  t0=$(date +%s%3N)
  # `times` last: the CPU time of the set-up's processes (user and system), which load changes far
  # less than wall time.
  if ! in_root "$work" "cd /root/prime-rl && bash scripts/setup.sh $args && times" > "$OUT/$name.log" 2>&1; then
    tail -30 "$OUT/$name.log"
    echo "error: $name failed (log: $OUT/$name.log)" >&2
    exit 1
  fi
  total[$name]=$(awk -v ms=$(($(date +%s%3N) - t0)) 'BEGIN { printf "%.1f", ms / 1000 }')
  cpu[$name]=$(tail -1 "$OUT/$name.log" | awk '{ for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); s += t[1] * 60 + t[2] } printf "%.0f", s }')
  sed 's/\x1b\[[0-9;]*m//g' "$OUT/$name.log" | grep -E '^\[setup\]   |^\[setup\] ready' | sed 's/^\[setup\] */    /' | tee -a "$OUT/summary.txt"
  say "$name: ${total[$name]} s wall, ${cpu[$name]} s of CPU (load after: $(cut -d' ' -f1-3 /proc/loadavg))"
}
for s in ${scenarios//,/ }; do
  work=$(dirname "$base")/work-$s
  remove_root "$work"
  say "scenario $s: copying the base root to $work, cloning $sha"
  cp -a "$base" "$work"
  git clone --quiet --no-local "$REPO" "$work/root/prime-rl"
  git -C "$work/root/prime-rl" checkout --quiet "$sha"
  mount_root "$work"
  trust_host_cas "$work"
  say "$s: $(in_root "$work" 'echo node $(node --version), npm $(npm --version), $(go version | cut -d" " -f3), $(python3 --version), pip $(python3 -m pip --version | cut -d" " -f2), $(cmake --version | head -1), gcc $(gcc -dumpversion)')"
  case $s in
    main)
      run_setup main-first ""
      run_setup main-second ""
      run_setup main-then-all "--all"
      ;;
    all)
      run_setup all-first "--all"
      run_setup all-second "--all"
      ;;
  esac
  unmount_all
  remove_root "$work"
  work=""
done

{
  echo
  echo "commit $sha, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
  for name in main-first main-second main-then-all all-first all-second; do
    if [ -n "${total[$name]:-}" ]; then printf '%-14s %8s s wall %6s s CPU\n' "$name" "${total[$name]}" "${cpu[$name]}"; fi
  done
} | tee -a "$OUT/summary.txt"
say "logs and summary: $OUT"
