#!/usr/bin/env bash
# Two builds of chorus-bench against each other, alternating in one run on this
# machine: the same collectives, sizes and iterations, old and new taking turns (the
# order flips every round), over tcp (CHORUS_TRANSPORT=tcp) and shared memory, out of
# place and in place, on ordinary buffers and (shared memory only) on node-shared ones
# (--buffers shared: the direct path). Prints, per row, each build's best time, the
# new build's time over the old one's, and the run-to-run spread of each build (its
# worst round over its best, minus 1): a change is within the noise when new/old - 1 is
# below the larger spread. Every result is checked (-c 1); a wrong element fails.
#
# Usage: bench/compare_builds.sh OLD_BIN NEW_BIN [-o "allreduce broadcast ..."]
#            [-T "tcp shm"] [-B "ordinary shared"] [-p RANKS] [-b MIN] [-e MAX] [-f F]
#            [-n ITERS] [-w WARMUP] [-R ROUNDS] [-t TIMEOUT_S]
#   OLD_BIN, NEW_BIN  chorus-bench binaries (or the bin/ folders holding them)
#   -o  collectives (default allreduce)      -T  transports (default "tcp shm")
#   -B  buffers (default "ordinary shared")  -p  ranks (default 2)
#   -b/-e/-f  sizes (default 8 to 16M, times 4)
#   -n/-w     timed and warm-up iterations per size (default 2000, 100; chorus-bench
#             scales nothing: pick what the largest size affords)
#   -R  rounds (default 3)                   -t  deadline of each run, s (default 600)
set -euo pipefail
usage() { sed -n '11,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }
(($# >= 2)) || usage 2
bin_of() { if [[ -d $1 ]]; then echo "$1/chorus-bench"; else echo "$1"; fi; }
OLD=$(bin_of "$1") NEW=$(bin_of "$2")
shift 2
ops=allreduce transports="tcp shm" buffers="ordinary shared" ranks=2 min=8 max=16M factor=4
iters=2000 warmup=100 rounds=3 timeout_s=600
while getopts "o:T:B:p:b:e:f:n:w:R:t:h" opt; do
  case $opt in
    o) ops=$OPTARG ;; T) transports=$OPTARG ;; B) buffers=$OPTARG ;; p) ranks=$OPTARG ;;
    b) min=$OPTARG ;; e) max=$OPTARG ;; f) factor=$OPTARG ;; n) iters=$OPTARG ;;
    w) warmup=$OPTARG ;; R) rounds=$OPTARG ;; t) timeout_s=$OPTARG ;; h) usage 0 ;; *) usage 2 ;;
  esac
done
for b in "$OLD" "$NEW"; do [[ -x $b ]] || { echo "compare_builds: no chorus-bench at $b" >&2; exit 2; }; done
for v in "$ranks" "$factor" "$iters" "$warmup" "$rounds" "$timeout_s"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "compare_builds: '$v' is not a number" >&2; exit 2; }
done
for t in $transports; do [[ $t == tcp || $t == shm ]] || { echo "compare_builds: -T: '$t' (tcp, shm)" >&2; exit 2; }; done

WORK=$(mktemp -d /tmp/compare_builds.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)
for ((round = 1; round <= rounds; round++)); do
  order="old new"
  ((round % 2 == 0)) && order="new old"
  for op in $ops; do
    for transport in $transports; do
      for buf in $buffers; do
        [[ $transport == tcp && $buf == shared ]] && continue  # the direct path needs shared memory
        for build in $order; do
          bin=$OLD
          [[ $build == new ]] && bin=$NEW
          echo "compare_builds: round $round/$rounds: $build $op $transport $buf" >&2
          env_transport=()
          [[ $transport == tcp ]] && env_transport=(CHORUS_TRANSPORT=tcp)
          if ! env "${env_transport[@]}" timeout -k 10 "$timeout_s" "$bin" --np "$ranks" -o "$op" -b "$min" \
            -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c 1 -m both --buffers "$buf" --json \
            >"$WORK/run.out" 2>"$WORK/run.err"; then
            echo "compare_builds: $build $op $transport $buf failed:" >&2
            tail -n 5 "$WORK/run.err" >&2
            exit 1
          fi
          grep '^{' "$WORK/run.out" | sed "s/^{/{\"build\":\"$build\",\"transport\":\"$transport\",\"round\":$round,/" \
            >>"$WORK/rows.jsonl"
        done
      done
    done
  done
done
ELAPSED=$(($(date +%s) - START))

python3 - "$WORK/rows.jsonl" "$OLD" "$NEW" "$rounds" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ELAPSED" <<'PYEOF'
import json, sys
path, old, new, rounds, load_before, load_after, elapsed = sys.argv[1:]
times = {}  # (op, transport, buffers, mode, size, build) -> [us per round]
wrong = 0
for line in open(path):
    r = json.loads(line)
    key = (r["collective"], r["transport"], r["buffers"], r["mode"], r["size"])
    times.setdefault(key + (r["build"],), []).append(r["time_us"])
    wrong += r["wrong"] or 0

def size(n):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n // v} {unit}"
    return f"{n} B"

print(f"# chorus-bench, old {old} against new {new}: best of {rounds} alternating rounds, {elapsed} s;"
      f" load before {load_before}, after {load_after}")
print("# new/old: time ratio (below 1: new faster); spread: a build's worst round over its best, minus 1")
print(f"{'collective':<14} {'transport':<9} {'buffers':<9} {'mode':<4} {'size':>8} {'old us':>10} {'new us':>10}"
      f" {'new/old':>8} {'spread old':>10} {'spread new':>10}  verdict")
slower = []
for key in sorted({k[:5] for k in times}, key=lambda k: (k[0], k[1], k[2], k[3], k[4])):
    o, n = times.get(key + ("old",)), times.get(key + ("new",))
    if not o or not n:
        continue
    bo, bn = min(o), min(n)
    so, sn = max(o) / bo - 1, max(n) / bn - 1
    ratio = bn / bo
    verdict = "within spread" if ratio - 1 <= max(so, sn) else "SLOWER beyond spread"
    if ratio < 1 and 1 - ratio > max(so, sn):
        verdict = "faster beyond spread"
    if verdict.startswith("SLOWER"):
        slower.append(key)
    op, transport, buffers, mode, nbytes = key
    print(f"{op:<14} {transport:<9} {buffers:<9} {mode:<4} {size(nbytes):>8} {bo:>10.2f} {bn:>10.2f}"
          f" {ratio:>8.3f} {so:>10.3f} {sn:>10.3f}  {verdict}")
print()
print(f"# wrong elements: {wrong}; rows slower beyond the spread: {len(slower)}")
sys.exit(1 if wrong else 0)
PYEOF
