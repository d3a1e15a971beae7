#!/usr/bin/env bash
# chorus allreduce (f32 sum) inside one machine, in one run, two comparisons:
#   ranks:  4 ranks against 2 in shared memory, as time per byte (4 ranks on a 2-core
#           machine share the cores, so the ratio shows what oversubscription costs);
#   hier:   4 ranks as 2 simulated nodes of 2 (CHORUS_NODE_ID), the hierarchical
#           algorithm (shared memory inside a node, tcp between) against the flat ring.
# Every run is out of place (chorus-bench -m out), as these comparisons were made.
#
# Usage: bench/compare_shm_scaling.sh [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS]
#            [-w WARMUP] [-R REPEATS] [-t TIMEOUT_S]
#   -b/-e/-f  sizes, K/M suffixes allowed                   (default 64K, 256M, 4)
#   -n/-w     timed and warm-up iterations per size          (default 20, 5)
#   -R        runs of every config, round robin; best time   (default 2)
#   -t        deadline of each chorus-bench run, seconds     (default 900)
# Environment: CHORUS_BENCH=path uses that binary instead of building build/bin/chorus-bench.
# Exits non-zero when a run fails or reports wrong results.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
min=64K max=256M factor=4 iters=20 warmup=5 repeats=2 timeout_s=900

die() { echo "compare_shm_scaling: $*" >&2; exit 1; }
usage() { sed -n '8,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }

while getopts "b:e:f:n:w:R:t:h" opt; do
  case $opt in
    b) min=$OPTARG ;; e) max=$OPTARG ;; f) factor=$OPTARG ;; n) iters=$OPTARG ;;
    w) warmup=$OPTARG ;; R) repeats=$OPTARG ;; t) timeout_s=$OPTARG ;; h) usage 0 ;; *) usage 2 ;;
  esac
done
for v in "$iters" "$warmup" "$repeats" "$timeout_s"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "compare_shm_scaling: '$v' is not a number" >&2; exit 2; }
done
((repeats >= 1 && iters >= 1)) || { echo "compare_shm_scaling: -R and -n must be >= 1" >&2; exit 2; }

if [[ -z ${CHORUS_BENCH:-} ]]; then
  CHORUS_BENCH=$ROOT/build/bin/chorus-bench
  [[ -f $ROOT/build/CMakeCache.txt ]] ||
    timeout 600 cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >&2 || die "cmake configure failed"
  timeout 1800 cmake --build "$ROOT/build" -j "$(nproc)" --target chorus-bench >&2 || die "building chorus-bench failed"
fi
[[ -x $CHORUS_BENCH ]] || die "no chorus-bench at $CHORUS_BENCH"

WORK=$(mktemp -d /tmp/compare_shm_scaling.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# run NAME ARGS...: appends chorus-bench's JSON rows to $WORK/NAME.
run() {
  local name=$1 rc=0
  shift
  env -u CHORUS_ALGO -u CHORUS_NODE_ID -u CHORUS_TRANSPORT timeout -k 10 "$timeout_s" \
    "$CHORUS_BENCH" -o allreduce -d f32 -r sum -c 1 --json -m out -b "$min" -e "$max" -f "$factor" \
    -n "$iters" -w "$warmup" "$@" >>"$WORK/$name" 2>>"$WORK/log" || rc=$?
  ((rc == 0)) || { tail -n 20 "$WORK/log" >&2; die "$name failed (exit status $rc)"; }
}

for ((r = 1; r <= repeats; r++)); do
  echo "compare_shm_scaling: run $r/$repeats" >&2
  run shm2 --np 2
  run shm4 --np 4
  run ring2x2 --np 4 --nodes 2 -a ring
  run hier2x2 --np 4 --nodes 2 -a hier
done

/usr/bin/python3 - "$WORK" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, sys
work, before, after = sys.argv[1:4]

def rows(name):
    out = {}
    for line in open(f"{work}/{name}"):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r["wrong"]:
            sys.exit(f"compare_shm_scaling: {name}: {r['wrong']} wrong elements at {r['size']} bytes")
        best = out.get(r["size"], (float("inf"), r["algo"]))
        out[r["size"]] = (min(best[0], r["time_us"]), r["algo"])
    return out

d = {n: rows(n) for n in ("shm2", "shm4", "ring2x2", "hier2x2")}
print("# chorus allreduce f32 sum on this machine; time in us (best of the runs)")
print(f"# load average (1/5/15 min) before: {before}, after: {after}")
print("# 4/2 ranks: (time of 4 ranks) / (time of 2 ranks) for the same bytes per rank")
print("# ring/hier: flat ring time / hierarchical time on 2 simulated nodes x 2 ranks (> 1: hier faster)")
head = ("size", "2ranks_us", "4ranks_us", "4/2ranks", "ring_us", "hier_us", "ring/hier")
print("".join(f"{h:>12}" for h in head))
for s in sorted(d["shm2"]):
    t2, t4 = d["shm2"][s][0], d["shm4"][s][0]
    tr, th = d["ring2x2"][s][0], d["hier2x2"][s][0]
    print(f"{s:>12}{t2:12.1f}{t4:12.1f}{t4 / t2:12.2f}{tr:12.1f}{th:12.1f}{tr / th:12.2f}")
EOF
