#!/usr/bin/env bash
# Hosts of a cluster on one machine, for trying a spread-out run (test/netns.test.ts; docs/cluster.md,
# "Worked example: five hosts on one machine"): one network namespace per role, joined by a bridge,
# each with an address of its own in ${PRIME_NETNS_NET:-10.231.0}.0/24 (the first role .2, the next .3, ...).
# The host gets no address on the bridge, so several sets (distinct tags) never collide.
# Needs root (ip netns, bridges, veth pairs).
#
#   scripts/netns.sh up TAG ROLE...   namespaces prl-TAG-ROLE; prints "ROLE NAMESPACE ADDRESS" per role
#   scripts/netns.sh down TAG         removes the namespaces, veths and bridge of TAG (safe to repeat)
#   scripts/netns.sh cut TAG A B      partitions hosts A and B: each drops what it would send the other
#                                     (a blackhole route): their open TCP connections stall silently,
#                                     as over a failed link, and new ones fail; other links stay up
#   scripts/netns.sh heal TAG A B     ends that partition
#   ip netns exec prl-TAG-ROLE CMD    runs CMD on that "host"
#
# TAG: 1-6 letters or digits (interface names are at most 15 characters). `up` that fails part
# way removes what it made.
set -euo pipefail

usage() {
  echo "usage: $0 up TAG ROLE... | $0 down TAG | $0 cut|heal TAG A B" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
cmd=$1 tag=$2
shift 2
[[ $tag =~ ^[A-Za-z0-9]{1,6}$ ]] || { echo "$0: TAG must be 1-6 letters or digits, got '$tag'" >&2; exit 2; }
net=${PRIME_NETNS_NET:-10.231.0}
bridge="prlb$tag"

down() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^prl-$tag-" || true); do
    ip netns del "$ns" 2>/dev/null || true # its end of each veth pair goes with it, and so the pair
  done
  local link
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^prl$tag[0-9]+$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

# The address of ROLE's host (eth0 in its namespace).
address() { ip -n "prl-$tag-$1" -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1; }

# route add|del for the partition of hosts $2 and $3.
partition() {
  local op=$1 a=$2 b=$3 ia ib
  ia=$(address "$a") && ib=$(address "$b") && [[ -n $ia && -n $ib ]] || { echo "$0: no hosts '$a' and '$b' in set $tag" >&2; exit 2; }
  ip -n "prl-$tag-$a" route "$op" blackhole "$ib/32"
  ip -n "prl-$tag-$b" route "$op" blackhole "$ia/32"
}

case $cmd in
  cut | heal)
    [[ $# -eq 2 ]] || usage
    if [[ $cmd == cut ]]; then partition add "$1" "$2"; else partition del "$1" "$2"; fi
    ;;
  up)
    [[ $# -ge 1 && $# -le 200 ]] || usage
    trap 'down' ERR
    ip link add "$bridge" type bridge
    ip link set "$bridge" up
    i=2
    for role in "$@"; do
      [[ $role =~ ^[a-z0-9-]{1,40}$ ]] || { echo "$0: role '$role': lowercase letters, digits, '-'" >&2; down; exit 2; }
      ns="prl-$tag-$role"
      ip netns add "$ns"
      ip link add "prl$tag$i" type veth peer name eth0 netns "$ns"
      ip link set "prl$tag$i" master "$bridge" up
      ip -n "$ns" addr add "$net.$i/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      echo "$role $ns $net.$i"
      i=$((i + 1))
    done
    ;;
  down)
    [[ $# -eq 0 ]] || usage
    down
    ;;
  *) usage ;;
esac
