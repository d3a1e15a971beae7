#!/usr/bin/env bash
# chorus at many ranks on one machine, before against after, in one run (issue 42):
#   formation: store-traffic N (ranks as threads, tcp on loopback): the store requests and
#              bytes per rank of a communicator's creation, and how long it takes;
#   sockets:   chorus-bench --np N --nodes N (one process per rank, each its own
#              simulated node, so every message goes over tcp): the established tcp
#              sockets at the run's peak (both ends of a loopback connection count, and
#              the store's connections too), per collective, and the whole run's time;
#   one node:  chorus-bench --np N on one node (shared memory): the whole run's time and
#              the peak of /dev/shm.
# Every run is one 8-byte call after one warm-up: what is measured is the set-up and
# what the ranks hold, not bandwidth. The configs alternate, before then after, at each
# size.
#
# Usage: bench/compare_scale.sh -B OLD_BUILD [-T "16 64 128 256"] [-S "32 64 128"]
#            [-O "64 128 256"] [-c "allreduce broadcast ..."] [-t TIMEOUT_S]
#   -B   the build directory of the chorus to compare against, inside its source tree
#        (its bin/chorus-bench; its lib/libchorus_comm.a and include/ build store-traffic
#        for it)
#   -T   ranks of the formation rows        (default 16 64 128 256)
#   -S   ranks of the socket rows           (default 32 64 128)
#   -O   ranks of the one-node rows         (default 64 128 256)
#   -c   collectives of the socket rows     (default allreduce broadcast reduce_scatter allgather)
#   -t   deadline of each run, seconds      (default 900)
# Environment: NEW_BUILD=dir (default build/). A run that fails is reported in its row
# with its last error line, and the script goes on.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
old="" formation="16 64 128 256" sockets="32 64 128" onenode="64 128 256"
collectives="allreduce broadcast reduce_scatter allgather" timeout_s=900
new=${NEW_BUILD:-$ROOT/build}

die() { echo "compare_scale: $*" >&2; exit 1; }
usage() { sed -n '15,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }

while getopts "B:T:S:O:c:t:h" opt; do
  case $opt in
    B) old=$OPTARG ;; T) formation=$OPTARG ;; S) sockets=$OPTARG ;; O) onenode=$OPTARG ;;
    c) collectives=$OPTARG ;; t) timeout_s=$OPTARG ;; h) usage 0 ;; *) usage 2 ;;
  esac
done
[[ -n $old ]] || usage 2
[[ $timeout_s =~ ^[0-9]+$ ]] || die "'$timeout_s' is not a number"
for n in $formation $sockets $onenode; do [[ $n =~ ^[0-9]+$ ]] || die "'$n' is not a number"; done
for b in "$old" "$new"; do [[ -x $b/bin/chorus-bench ]] || die "no chorus-bench in $b/bin"; done

WORK=$(mktemp -d /tmp/compare_scale.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# store-traffic for each build: the new build has it; the old one is built here from this
# tree's source against the old library (public API only).
declare -A traffic=([before]="$WORK/store-traffic-before" [after]="$new/bin/store-traffic")
[[ -x ${traffic[after]} ]] || die "no store-traffic in $new/bin (build it: cmake --build $new --target store-traffic)"
g++ -O2 -std=c++20 -I"$old/../include" -I"$old/include" "$ROOT/bench/store_traffic.cc" \
  -o "${traffic[before]}" "$old/lib/libchorus_comm.a" -lcrypto -lpthread ||
  die "building store-traffic against $old failed"
declare -A build=([before]="$old" [after]="$new")

# The descriptors a full mesh of 256 ranks in one process would take are more than the
# hard limit allows here: what fails is reported as such.
ulimit -n "$(ulimit -Hn)"

# sample_peak FILE CMD...: runs CMD, sampling every 50 ms the established tcp sockets
# and /dev/shm's used KiB; writes "seconds sockets shm_kib rc" to FILE.
sample_peak() {
  local out=$1 rc=0 peak_sockets=0 peak_shm=0 s m start end
  shift
  local base_shm
  base_shm=$(df -k --output=used /dev/shm | tail -1)
  start=$(date +%s.%N)
  "$@" >"$out.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    s=$(ss -Htn state established 2>/dev/null | wc -l)
    m=$(($(df -k --output=used /dev/shm | tail -1) - base_shm))
    ((s > peak_sockets)) && peak_sockets=$s
    ((m > peak_shm)) && peak_shm=$m
    sleep 0.05
  done
  wait "$pid" || rc=$?
  end=$(date +%s.%N)
  echo "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') $peak_sockets $peak_shm $rc" >"$out"
}

echo "compare_scale: formation rows" >&2
for n in $formation; do
  for cfg in before after; do
    rc=0
    timeout -k 10 "$timeout_s" "${traffic[$cfg]}" "$n" 60 >"$WORK/formation.$cfg.$n" \
      2>"$WORK/formation.$cfg.$n.err" || rc=$?
    ((rc == 0)) || echo "{\"ranks\": $n, \"failed\": $rc}" >"$WORK/formation.$cfg.$n"
  done
done

echo "compare_scale: socket rows" >&2
for n in $sockets; do
  for c in $collectives; do
    for cfg in before after; do
      sample_peak "$WORK/sockets.$cfg.$n.$c" env -u CHORUS_ALGO -u CHORUS_NODE_ID -u CHORUS_TRANSPORT \
        timeout -k 10 "$timeout_s" "${build[$cfg]}/bin/chorus-bench" --np "$n" --nodes "$n" -o "$c" \
        -b 8 -e 8 -n 1 -w 1 -c 1 -m out --timeout "$timeout_s"
    done
  done
done

echo "compare_scale: one-node rows" >&2
for n in $onenode; do
  for cfg in before after; do
    sample_peak "$WORK/onenode.$cfg.$n" env -u CHORUS_ALGO -u CHORUS_NODE_ID -u CHORUS_TRANSPORT \
      timeout -k 10 "$timeout_s" "${build[$cfg]}/bin/chorus-bench" --np "$n" -o allreduce \
      -b 8 -e 8 -n 1 -w 1 -c 1 -m out --timeout "$timeout_s"
  done
done

/usr/bin/python3 - "$WORK" "$formation" "$sockets" "$onenode" "$collectives" "$LOAD_BEFORE" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, os, sys
work, formation, sockets, onenode, collectives, before_load, after_load = sys.argv[1:8]
ints = lambda s: [int(x) for x in s.split()]

def last_error(path):
    try:
        lines = [l.strip() for l in open(path) if l.strip()]
    except OSError:
        return ""
    return (lines[-1] if lines else "")[:160]

print("## Communicator creation (store-traffic: ranks as threads, tcp on loopback)\n")
print("| ranks | build | formed (ms) | store requests per rank | most (rank) | bytes per rank | most bytes | all requests | all bytes |")
print("|---|---|---|---|---|---|---|---|---|")
for n in ints(formation):
    row = {}
    for cfg in ("before", "after"):
        r = json.loads(open(f"{work}/formation.{cfg}.{n}").read().strip().splitlines()[-1])
        row[cfg] = r
        if "failed" in r:
            print(f"| {n} | {cfg} | failed ({last_error(f'{work}/formation.{cfg}.{n}.err')}) | | | | | | |")
            continue
        print(f"| {n} | {cfg} | {r['formed_ms']:.0f} | {r['requests_per_rank']:.1f} | {r['max_requests']} ({r['busiest_rank']}) "
              f"| {r['bytes_per_rank']:.0f} | {r['max_bytes']} | {r['total_requests']} | {r['total_bytes']} |")
    if all("formed_ms" in row[c] for c in row):
        print(f"| {n} | before/after | {row['before']['formed_ms'] / row['after']['formed_ms']:.2f}x | | | | | | |")

def sample(path):
    secs, socks, shm, rc = open(path).read().split()
    return float(secs), int(socks), int(shm), int(rc)

print("\n## Sockets: one process per rank, each its own node (chorus-bench --np N --nodes N, 8 B)\n")
print("| ranks | collective | build | established sockets (peak) | per rank | whole run (s) |")
print("|---|---|---|---|---|---|")
for n in ints(sockets):
    for c in collectives.split():
        for cfg in ("before", "after"):
            secs, socks, shm, rc = sample(f"{work}/sockets.{cfg}.{n}.{c}")
            status = "" if rc == 0 else f" (failed {rc}: {last_error(f'{work}/sockets.{cfg}.{n}.{c}.log')})"
            print(f"| {n} | {c} | {cfg} | {socks} | {socks / n:.1f} | {secs:.1f}{status} |")

print("\n## One node (chorus-bench --np N, shared memory, allreduce 8 B)\n")
print("| ranks | build | /dev/shm peak (MiB) | established sockets (peak) | whole run (s) |")
print("|---|---|---|---|---|")
for n in ints(onenode):
    times = {}
    for cfg in ("before", "after"):
        secs, socks, shm, rc = sample(f"{work}/onenode.{cfg}.{n}")
        times[cfg] = secs if rc == 0 else None
        status = "" if rc == 0 else f" (failed {rc}: {last_error(f'{work}/onenode.{cfg}.{n}.log')})"
        print(f"| {n} | {cfg} | {shm / 1024:.1f} | {socks} | {secs:.1f}{status} |")
    if all(times.values()):
        print(f"| {n} | before/after | | | {times['before'] / times['after']:.2f}x |")
print(f"\nload average before {before_load}, after {after_load}")
EOF
