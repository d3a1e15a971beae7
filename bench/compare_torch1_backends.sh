#!/usr/bin/env bash
# chorus against gloo from Python, in one run on this machine, 2 ranks:
#   1. torch.distributed.all_reduce (f32 sum, in place), -b to -e bytes;
#   2. a DDP training step of seed 000's model with the data in memory (samples/s),
#      beside two processes that train the same on half the batch each and never talk:
#      the most any 2-rank run can reach here;
#   3. seed 000's script as written (examples/seeds), whole (or -S batches an epoch);
#   4. chorus-mnist, the seed job in C++, as the ceiling of the Python path.
# Configs run round robin -R times; each keeps its best. Prints the tables and the
# ratios against the targets (all_reduce >= 5x faster up to 64 KiB, busbw >= 3x from
# 64 KiB to 16 MiB; the DDP step >= 1.25x the samples/s).
#
# Usage: bench/compare_torch1_backends.sh [-b MIN] [-e MAX] [-f F] [-n ITERS] [-R REPEATS]
#                                        [-s DDP_STEPS] [-S SEED_STEPS] [-t TIMEOUT_S]
#   -b/-e/-f  all_reduce sizes (default 8 to 256M, times 2)   -n  timed all_reduces (20)
#   -R        rounds (default 3)                               -s  timed DDP steps (60)
#   -S        seed 000: batches an epoch (default 0, the whole script)
#   -t        deadline of each run, seconds (default 900)
# Every rank computes on 1 thread (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1), talks over
# 127.0.0.1 and uses Debian's /usr/bin/python3.
set -euo pipefail
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly PY=/usr/bin/python3
min=8 max=256M factor=2 iters=20 repeats=3 ddp_steps=60 seed_steps=0 timeout_s=900
while getopts "b:e:f:n:R:s:S:t:h" opt; do
  case $opt in
    b) min=$OPTARG ;; e) max=$OPTARG ;; f) factor=$OPTARG ;; n) iters=$OPTARG ;;
    R) repeats=$OPTARG ;; s) ddp_steps=$OPTARG ;; S) seed_steps=$OPTARG ;; t) timeout_s=$OPTARG ;;
    h) sed -n '13,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
for v in "$factor" "$iters" "$repeats" "$ddp_steps" "$seed_steps" "$timeout_s"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "compare_torch1_backends: '$v' is not a number" >&2; exit 2; }
done
die() { echo "compare_torch1_backends: $*" >&2; exit 1; }

"$ROOT/scripts/install-deps.sh" python3-torchvision >&2
[[ -f $ROOT/build/CMakeCache.txt ]] || "$ROOT/scripts/build.sh" >&2
cmake --build "$ROOT/build" -j "$(nproc)" --target torch_chorus_ext chorusrun chorus-mnist >&2 ||
  die "building torch_chorus, chorusrun and chorus-mnist failed"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DATA=$ROOT/build/seed-run
"$ROOT/examples/seeds/prepare_data.sh" "$DATA"
export PYTHONPATH="$ROOT/build/python" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo

free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ranks2 LOG CMD...: CMD as rank 0 and rank 1 of an env:// job; fails on any failure.
ranks2() {
  local log=$1 port pids=() rank rc=0
  shift
  port=$(free_port)
  for rank in 0 1; do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 10 "$timeout_s" "$@" >>"$log.$rank" 2>&1 &
    pids+=($!)
  done
  for rank in 0 1; do wait "${pids[$rank]}" || rc=$?; done
  ((rc == 0)) || { tail -n 20 "$log".* >&2; die "$* failed (exit $rc)"; }
  cat "$log.0" >>"$log"
  rm -f "$log".[01]
}

allreduce_run() {  # BACKEND
  ranks2 "$WORK/ar.$1.$round" $PY "$ROOT/bench/torch_allreduce.py" --backend "$1" \
    -b "$min" -e "$max" -f "$factor" -n "$iters" -w 5
}

ddp_run() {  # BACKEND
  ranks2 "$WORK/ddp.$1.$round" $PY "$ROOT/bench/torch_ddp_step.py" --backend "$1" \
    --data "$DATA/data" -n "$ddp_steps" -w 10
  grep -h '^samples_per_s' "$WORK/ddp.$1.$round" | awk '{print $2}' >>"$WORK/ddp.$1"
}

ddp_alone_pair() {  # two 1-rank jobs on half the batch each, at once
  local k pids=() rc=0
  for k in 0 1; do
    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) timeout -k 10 "$timeout_s" \
      $PY "$ROOT/bench/torch_ddp_step.py" --backend gloo --data "$DATA/data" --batch 256 \
      -n "$ddp_steps" -w 10 >"$WORK/alone.$k" 2>&1 &
    pids+=($!)
  done
  for k in 0 1; do wait "${pids[$k]}" || rc=$?; done
  ((rc == 0)) || { cat "$WORK"/alone.* >&2; die "the 2 lone processes failed"; }
  cat "$WORK"/alone.[01] | awk '/^samples_per_s/ {s += $2} END {print s}' >>"$WORK/ddp.alone"
}

seed_run() {  # BACKEND: seed 000's script, wall seconds of the whole job
  local log=$WORK/seed.$1.$round start
  start=$(date +%s.%N)
  (cd "$DATA" && CHORUS_SEED_BACKEND=$1 CHORUS_SEED_STEPS=$seed_steps timeout -k 10 "$timeout_s" \
    "$ROOT/build/bin/chorusrun" --standalone --nproc-per-node 2 \
    $PY "$ROOT/examples/seeds/run_seed.py" "$ROOT/examples/seeds/seed000_ddp_test.py") >"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "seed 000 on $1 failed"; }
  echo "$(date +%s.%N) $start" | awk '{print $1 - $2}' >>"$WORK/seed.$1"
  grep -q "loss: 2.309577" "$log" || die "seed 000 on $1: the first loss is not 2.309577"
  [[ $(grep -c '^param-hash' "$log") == 2 &&
     $(grep '^param-hash' "$log" | awk '{print $NF}' | sort -u | wc -l) == 1 ]] ||
    die "seed 000 on $1: the ranks' parameters differ"
}

mnist_run() {
  local log=$WORK/mnist.$round
  timeout -k 10 "$timeout_s" "$ROOT/build/bin/chorusrun" --standalone --nproc-per-node 2 \
    "$ROOT/build/bin/chorus-mnist" --data-dir /usr/share/datasets/fashion-mnist --epochs 1 \
    --threads 1 --workers 1 >"$log" 2>&1 || { tail -n 20 "$log" >&2; die "chorus-mnist failed"; }
  grep -m1 '^{' "$log" | $PY -c 'import json, sys; print(json.load(sys.stdin)["samples_per_second"])' \
    >>"$WORK/mnist"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for ((round = 1; round <= repeats; round++)); do
  echo "compare_torch1_backends: round $round of $repeats" >&2
  allreduce_run gloo; allreduce_run chorus
  ddp_run gloo; ddp_run chorus; ddp_alone_pair
  seed_run gloo; seed_run chorus
  mnist_run
done

$PY - "$WORK" "$repeats" "$seed_steps" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PYEOF'
import glob, sys
work, repeats, seed_steps, load_before, load_after = sys.argv[1:]
def best_times(backend):
    best = {}
    for f in glob.glob(f"{work}/ar.{backend}.*"):
        for line in open(f):
            if line.startswith("#") or not line.strip():
                continue
            size, us, wrong = line.split()
            assert wrong == "0", f"{backend} all_reduce of {size} B: {wrong} wrong elements"
            best[int(size)] = min(best.get(int(size), 1e30), float(us))
    return best
gloo, chorus = best_times("gloo"), best_times("chorus")
def fmt(n):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n // v} {unit}"
    return f"{n} B"
print(f"# all_reduce f32 sum from Python, 2 ranks, best of {repeats}; load before {load_before}, after {load_after}")
print(f"{'size':>9} {'gloo us':>10} {'chorus us':>10} {'time x':>8} {'gloo busbw':>11} {'chorus busbw':>13} {'busbw x':>8}")
low, mid = [], []
for size in sorted(gloo):
    g, c = gloo[size], chorus[size]
    bg, bc = size / g / 1e3, size / c / 1e3  # GB/s; busbw = algbw * 2(n-1)/n = algbw for 2 ranks
    print(f"{fmt(size):>9} {g:>10.1f} {c:>10.1f} {g / c:>8.2f} {bg:>11.3f} {bc:>13.3f} {bc / bg:>8.2f}")
    if size <= 64 << 10:
        low.append(g / c)
    if 64 << 10 <= size <= 16 << 20:
        mid.append(bc / bg)
def read(name):
    try:
        return [float(x) for x in open(f"{work}/{name}")]
    except FileNotFoundError:
        return []
ddp = {k: read(f"ddp.{k}") for k in ("gloo", "chorus", "alone")}
seed = {k: read(f"seed.{k}") for k in ("gloo", "chorus")}
mnist = read("mnist")
print()
print(f"# DDP step of seed 000's model, data in memory, global batch 512, samples/s (best of {repeats}; all runs)")
for k, label in (("gloo", "gloo, 2 ranks"), ("chorus", "chorus, 2 ranks"), ("alone", "2 lone processes, 256 each")):
    print(f"{label:<28} {max(ddp[k]):>10.1f}   " + " ".join(f"{x:.1f}" for x in ddp[k]))
print()
what = "the whole script (5 epochs)" if seed_steps == "0" else f"{seed_steps} batches an epoch"
print(f"# seed 000's script as written under chorusrun, 2 ranks, {what}: wall seconds (best of {repeats}; all runs)")
for k in ("gloo", "chorus"):
    print(f"{k:<28} {min(seed[k]):>10.2f}   " + " ".join(f"{x:.2f}" for x in seed[k]))
print()
print(f"# chorus-mnist (C++), 2 ranks, 1 epoch: samples/s (best of {repeats}; all runs)")
print(f"{'chorus-mnist':<28} {max(mnist):>10.1f}   " + " ".join(f"{x:.1f}" for x in mnist))
print()
ddp_x = max(ddp["chorus"]) / max(ddp["gloo"])
print("# targets")
print(f"all_reduce up to 64 KiB, time gloo/chorus: min {min(low):.2f} (target >= 5): {'met' if min(low) >= 5 else 'NOT met'}")
print(f"busbw 64 KiB..16 MiB, chorus/gloo: min {min(mid):.2f} (target >= 3): {'met' if min(mid) >= 3 else 'NOT met'}")
print(f"DDP step samples/s, chorus/gloo: {ddp_x:.2f} (target >= 1.25): {'met' if ddp_x >= 1.25 else 'NOT met'}"
      f"; the 2 lone processes bound it at {max(ddp['alone']) / max(ddp['gloo']):.2f}")
print(f"seed 000 script, gloo/chorus wall time: {min(seed['gloo']) / min(seed['chorus']):.2f}")
print(f"chorus-mnist (C++) / chorus DDP step (Python) samples/s: {max(mnist) / max(ddp['chorus']):.2f}")
PYEOF
