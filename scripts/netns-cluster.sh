#!/usr/bin/env bash
# A cluster on one machine: N network namespaces, each a "host" with its own address,
# hostname, CHORUS_NODE_ID and private /dev/shm, joined through a bridge that lives in a
# namespace of its own (the machine's own network is never touched). Needs root.
#
# Usage: scripts/netns-cluster.sh up N [--rate RATE] [--two-if HOST]... [--id ID]
#        scripts/netns-cluster.sh run N [up options] -- COMMAND...
#        scripts/netns-cluster.sh exec [--id ID] HOST COMMAND...
#        scripts/netns-cluster.sh addr [--id ID] HOST
#        scripts/netns-cluster.sh link [--id ID] HOST up|down
#        scripts/netns-cluster.sh list
#        scripts/netns-cluster.sh down [--id ID] | down --all
#   up      makes hosts 0..N-1 and prints the cluster's id; host i is namespace
#           chorusnet-ID-hI, hostname chorus-hI, address 10.77.0.(I+1)/24 on eth0,
#           CHORUS_NODE_ID chorus-hI, its own tmpfs as /dev/shm.
#   --rate  shape every link with tbf to RATE (tc's units: 1gbit, 500mbit), both ways:
#           each host's eth0 and the bridge's port towards it, like a switch port
#   --two-if HOST  also give HOST a second interface eth1, address 10.78.0.(HOST+1)/24,
#           cabled to a switch port on no bridge: it is up and reaches nobody
#           (for tests of interface choice)
#   --id    the cluster's id, [a-z0-9]{1,12} (default: random)
#   run     up, COMMAND with CHORUS_NETNS_ID set, then down whatever COMMAND did;
#           exits with COMMAND's status
#   exec    COMMAND on HOST: its network namespace, a mount namespace with the host's
#           /dev/shm, a UTS namespace with its hostname, and CHORUS_NODE_ID set
#   link    takes HOST's eth0 down or up (a cable pulled)
#   list    the ids of every cluster of this script on the machine, also killed runs'
#   down    removes the cluster: kills what still runs in its namespaces, removes
#           them, unmounts its /dev/shm filesystems. --all: every cluster of this script.
# --id defaults to $CHORUS_NETNS_ID. Every namespace, mount and state directory is
# named chorusnet-ID, so the leftovers of a killed run are found by `list` and removed
# by `down --all`; a failed `up` removes what it made.
set -euo pipefail

readonly PREFIX=chorusnet
readonly STATE_ROOT=/run/$PREFIX
readonly SUBNET=10.77.0 DEAD_SUBNET=10.78.0

die() { echo "netns-cluster: $*" >&2; exit 1; }
usage() { sed -n '6,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

check_id() { [[ $1 =~ ^[a-z0-9]{1,12}$ ]] || { echo "netns-cluster: bad id '$1' (want [a-z0-9]{1,12})" >&2; exit 2; }; }
host_ns() { echo "$PREFIX-$1-h$2"; }
switch_ns() { echo "$PREFIX-$1-sw"; }
state_dir() { echo "$STATE_ROOT/$1"; }

# Number of hosts of cluster $1, or an error naming the id.
host_count() {
  local f
  f=$(state_dir "$1")/hosts
  [[ -r $f ]] || die "no cluster with id '$1' (netns-cluster.sh list shows them)"
  cat "$f"
}

check_host() {  # ID HOST
  [[ $2 =~ ^[0-9]+$ ]] || { echo "netns-cluster: bad host '$2' (a number)" >&2; exit 2; }
  local n
  n=$(host_count "$1")
  (($2 < n)) || die "no host $2 in cluster $1 (hosts 0..$((n - 1)))"
}

require_root() {
  ((EUID == 0)) || die "needs root (ip netns, mount)"
  command -v ip >/dev/null || die "needs ip (iproute2)"
}

# Shapes interface $2 in namespace $1 to rate $3. burst: 1 ms at the rate and at least
# 32 KiB; tbf needs more than one MTU, and a bigger burst lets short messages pass
# faster than the rate. latency 20 ms bounds the queue (2.5 MB at 1 Gbit/s): TCP's
# window fills it without drops.
shape() {
  local ns=$1 dev=$2 rate=$3 bits burst
  bits=$(rate_bits "$rate")
  burst=$((bits / 8 / 1000))
  ((burst >= 32768)) || burst=32768
  ip -n "$ns" link set "$dev" gso_max_size 65536 2>/dev/null || true
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms ||
    die "tc refused to shape $dev in $ns to --rate $rate"
}

# Bits per second of a tc rate (bit, kbit, mbit, gbit; decimal as tc counts them).
rate_bits() {
  [[ ${1,,} =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || { echo "netns-cluster: bad rate '$1' (e.g. 1gbit, 500mbit)" >&2; exit 2; }
  local n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in kbit) n=$((n * 1000)) ;; mbit) n=$((n * 1000000)) ;; gbit) n=$((n * 1000000000)) ;; esac
  echo "$n"
}

cmd_up() {
  local n="" rate="" id="" two=()
  while (($#)); do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --two-if) two+=("${2:?--two-if needs a host}"); shift 2 ;;
      --id) id=${2:?--id needs a value}; shift 2 ;;
      -*) echo "netns-cluster: unknown option $1" >&2; usage ;;
      *) [[ -z $n ]] || usage; n=$1; shift ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || { echo "netns-cluster: up needs a host count 1..200, not '$n'" >&2; exit 2; }
  [[ -z $rate ]] || rate_bits "$rate" >/dev/null
  local h
  for h in "${two[@]}"; do
    [[ $h =~ ^[0-9]+$ ]] && ((h < n)) || { echo "netns-cluster: --two-if $h is not a host 0..$((n - 1))" >&2; exit 2; }
  done
  require_root
  [[ -n $id ]] || id=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
  check_id "$id"
  local dir sw
  dir=$(state_dir "$id") sw=$(switch_ns "$id")
  ! cluster_exists "$id" || die "a cluster with id '$id' exists already"
  mkdir -p "$dir"
  # From here a failure removes what was made.
  UP_ID=$id  # global: the trap runs after this function's locals are gone
  trap 'cmd_down_id "$UP_ID" >/dev/null 2>&1' EXIT
  echo "$n" >"$dir/hosts.tmp"
  echo "${rate:-none}" >"$dir/rate"
  echo "$$ $(date -u +%FT%TZ)" >"$dir/created"
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge stp_state 0 forward_delay 0
  ip -n "$sw" link set br0 up
  local i ns
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$id" "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [[ -n $rate ]]; then
      shape "$ns" eth0 "$rate"
      shape "$sw" "p$i" "$rate"
    fi
    mkdir -p "$dir/h$i/shm"
    mount -t tmpfs -o mode=1777 "$PREFIX-$id-h$i" "$dir/h$i/shm"
  done
  for h in "${two[@]}"; do
    ns=$(host_ns "$id" "$h")
    # A cable to a port of the switch that is on no bridge: up, and going nowhere.
    ip -n "$sw" link add "d$h" type veth peer name eth1 netns "$ns"
    ip -n "$sw" link set "d$h" up
    ip -n "$ns" addr add "$DEAD_SUBNET.$((h + 1))/24" dev eth1
    ip -n "$ns" link set eth1 up
  done
  mv "$dir/hosts.tmp" "$dir/hosts"
  # Every link is up (carrier on both ends) before `up` returns; 5 s at most.
  local waited=0
  until links_up "$id" "$n"; do
    ((waited < 50)) || die "the links of cluster $id did not come up within 5 s"
    sleep 0.1
    waited=$((waited + 1))
  done
  trap - EXIT
  echo "$id"
}

cluster_exists() { [[ -e $(state_dir "$1") ]] || ip netns list | grep -q "^$PREFIX-$1-"; }

# True when every host's eth0 and the switch's port towards it are up.
links_up() {
  local id=$1 n=$2 i
  for ((i = 0; i < n; i++)); do
    ip -n "$(host_ns "$id" "$i")" -br link show eth0 | grep -qw UP || return 1
    ip -n "$(switch_ns "$id")" -br link show "p$i" | grep -qw UP || return 1
  done
}

cmd_exec() {
  local id=${CHORUS_NETNS_ID:-}
  [[ ${1:-} != --id ]] || { id=${2:?--id needs a value}; shift 2; }
  [[ -n $id ]] || die "exec: no cluster id (--id or CHORUS_NETNS_ID)"
  check_id "$id"
  (($# >= 2)) || usage
  local host=$1
  shift
  check_host "$id" "$host"
  require_root
  local shm
  shm=$(state_dir "$id")/h$host/shm
  # ip netns exec runs the command in a mount namespace of its own already (a slave of
  # the machine's), so the bind mount on /dev/shm is seen by this command only.
  exec ip netns exec "$(host_ns "$id" "$host")" unshare --uts --mount --propagation private \
    /bin/sh -c 'hostname "$1" && mount --bind "$2" /dev/shm && shift 2 && exec "$@"' sh \
    "chorus-h$host" "$shm" env CHORUS_NODE_ID="chorus-h$host" "$@"
}

cmd_addr() {
  local id=${CHORUS_NETNS_ID:-}
  [[ ${1:-} != --id ]] || { id=${2:?--id needs a value}; shift 2; }
  [[ -n $id && $# == 1 ]] || usage
  check_host "$id" "$1"
  echo "$SUBNET.$(($1 + 1))"
}

cmd_link() {
  local id=${CHORUS_NETNS_ID:-}
  [[ ${1:-} != --id ]] || { id=${2:?--id needs a value}; shift 2; }
  [[ -n $id && $# == 2 && ($2 == up || $2 == down) ]] || usage
  check_host "$id" "$1"
  require_root
  ip -n "$(host_ns "$id" "$1")" link set eth0 "$2"
}

# Ids of every cluster: namespaces and state directories both count (a killed `up`
# may have left either).
cluster_ids() {
  {
    ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$PREFIX-\([a-z0-9]*\)-.*/\1/p"
    [[ ! -d $STATE_ROOT ]] || ls -1 "$STATE_ROOT"
  } | sort -u
}

cmd_down_id() {
  local id=$1 ns dir pid mnt
  dir=$(state_dir "$id")
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-$id-" || true); do
    # What still runs in the namespace (ours: started through exec) is killed by pid.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" || echo "netns-cluster: could not remove namespace $ns" >&2
  done
  if [[ -d $dir ]]; then
    for mnt in $(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts); do
      umount -l "$mnt" || echo "netns-cluster: could not unmount $mnt" >&2
    done
    rm -rf "$dir"
  fi
  rmdir "$STATE_ROOT" 2>/dev/null || true
}

cmd_down() {
  require_root
  if [[ ${1:-} == --all ]]; then
    local id
    for id in $(cluster_ids); do cmd_down_id "$id"; done
    return
  fi
  local id=${CHORUS_NETNS_ID:-}
  [[ ${1:-} != --id ]] || id=${2:?--id needs a value}
  [[ -n $id ]] || die "down: no cluster id (--id, CHORUS_NETNS_ID or --all)"
  check_id "$id"
  cmd_down_id "$id"
}

cmd_run() {
  local up_args=()
  while (($#)) && [[ $1 != -- ]]; do up_args+=("$1"); shift; done
  [[ ${1:-} == -- ]] || usage
  shift
  (($#)) || usage
  # The id is known before up, so that a signal during up removes what it made.
  local id="" rc=0 i
  for ((i = 0; i < ${#up_args[@]}; i++)); do [[ ${up_args[i]} != --id ]] || id=${up_args[i + 1]:-}; done
  if [[ -z $id ]]; then
    id=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
    up_args+=(--id "$id")
  fi
  check_id "$id"
  ! cluster_exists "$id" || die "a cluster with id '$id' exists already"
  UP_ID=$id RUN_CHILD=""
  trap '[[ -z $UP_ID ]] || cmd_down_id "$UP_ID"' EXIT
  # The command runs in the background so that a signal ends this script's wait at
  # once (bash runs traps only between foreground commands); it is stopped with us.
  trap '[[ -z $RUN_CHILD ]] || kill -TERM "$RUN_CHILD" 2>/dev/null; exit 130' INT
  trap '[[ -z $RUN_CHILD ]] || kill -TERM "$RUN_CHILD" 2>/dev/null; exit 143' TERM
  cmd_up "${up_args[@]}" >/dev/null || { UP_ID=""; exit 1; }
  trap '[[ -z $UP_ID ]] || cmd_down_id "$UP_ID"' EXIT  # up cleared its own
  CHORUS_NETNS_ID=$id "$@" &
  RUN_CHILD=$!
  wait "$RUN_CHILD" || rc=$?
  exit "$rc"
}

main() {
  (($#)) || usage
  local what=$1
  shift
  case $what in
    up) cmd_up "$@" ;;
    run) cmd_run "$@" ;;
    exec) cmd_exec "$@" ;;
    addr) cmd_addr "$@" ;;
    link) cmd_link "$@" ;;
    list) cluster_ids ;;
    down) cmd_down "$@" ;;
    -h | --help) sed -n '2,33p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
}

main "$@"
