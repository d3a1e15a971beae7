#!/usr/bin/env bash
# gloo against chorus from Python on torch 2.x, both in one run on this machine, every
# rank a process started over env:// on 127.0.0.1 (bench/torch_backends.py):
#   1. torch.distributed.all_reduce (SUM, float32, in place), 8 B and 16 B to 256 MiB
#      times 4, 2 ranks: time per call, busbw = 2(n-1)/n * bytes / time, and chorus's
#      speed over gloo's;
#   2. a DDP training step of seed 000's model (MLP 784-512-512-10, batch 64 a rank,
#      random data in memory, SGD lr 1e-3), 2 ranks: samples/s; torch's DDP on gloo,
#      torch_chorus.DistributedDataParallel on chorus;
#   3. an FSDP2 training step (fully_shard on every Linear and the root) of the same MLP
#      with hidden width 2048, on each -p rank count: samples/s.
# Prints one table and the targets (all_reduce >= 5x up to 64 KiB, busbw >= 3x from
# 64 KiB to 16 MiB, DDP >= 1.25x, FSDP2 >= 1.3x): met or missed, never a failure.
# With --gloo1, also runs 1 and 2 on gloo under another torch (say Debian's 1.13) in
# the same rounds, and prints how much faster gloo is on torch 2.x than on that one.
#
# Usage: bench/compare_torch_backends.sh [--python PY] [--pythonpath DIR] [-p "2 4"]
#                                        [--gloo1 PY] [--quick] [-R ROUNDS] [-t TIMEOUT_S]
#   --python      the python with torch 2.x      (default .venv-torch2/bin/python)
#   --pythonpath  the folder holding torch_chorus (default build-torch2/python)
#   --gloo1       a python with another torch, for gloo there too (say /usr/bin/python3)
#   -p            rank counts of the FSDP2 step  (default "2 4")
#   --quick       fewer iterations and steps, 1 round (under 3 minutes on 2 cores)
#   -R            rounds, round robin over the backends; each keeps its best
#                 (default 3; 1 with --quick)
#   -t            deadline of each run, seconds  (default 120 with --quick, else 420)
# Every rank computes on 1 thread (OMP_NUM_THREADS=1); each run gets a free port. A run
# or a call that fails (say, an op chorus does not have yet) shows its error in its
# row and the rest goes on; exits non-zero only when it cannot start at all.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=$ROOT/.venv-torch2/bin/python
PYPATH=$ROOT/build-torch2/python
fsdp_worlds="2 4" quick=0 rounds="" timeout_s="" PY1=""

usage() { sed -n '17,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }
die() { echo "compare_torch_backends: $*" >&2; exit 1; }

while (($#)); do
  case $1 in
    --python) PY=${2:?--python needs a value}; shift 2 ;;
    --pythonpath) PYPATH=${2:?--pythonpath needs a value}; shift 2 ;;
    --gloo1) PY1=${2:?--gloo1 needs a value}; shift 2 ;;
    -p) fsdp_worlds=${2:?-p needs a value}; shift 2 ;;
    --quick) quick=1; shift ;;
    -R) rounds=${2:?-R needs a value}; shift 2 ;;
    -t) timeout_s=${2:?-t needs a value}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "compare_torch_backends: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
rounds=${rounds:-$((quick ? 1 : 3))}
timeout_s=${timeout_s:-$((quick ? 120 : 420))}
for v in "$rounds" "$timeout_s" $fsdp_worlds; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "compare_torch_backends: '$v' is not a number" >&2; exit 2; }
done
((rounds >= 1 && timeout_s >= 1)) || { echo "compare_torch_backends: -R and -t must be >= 1" >&2; exit 2; }
for w in $fsdp_worlds; do ((w >= 1)) || { echo "compare_torch_backends: -p: $w ranks" >&2; exit 2; }; done

[[ -x $PY ]] || die "no python at $PY (scripts/torch2-env.sh makes .venv-torch2)"
CORES=$(nproc)  # before OMP_NUM_THREADS=1, which nproc would report instead
export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  MKL_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
TORCH_VERSION=$(timeout 120 "$PY" -c 'import torch, torch.distributed as d; assert d.is_available(); print(torch.__version__)') ||
  die "$PY cannot import torch.distributed"
TORCH1_VERSION=""
if [[ -n $PY1 ]]; then
  [[ -x $PY1 ]] || die "--gloo1: no python at $PY1"
  TORCH1_VERSION=$(timeout 120 "$PY1" -c 'import torch, torch.distributed as d; assert d.is_available(); print(torch.__version__)') ||
    die "--gloo1: $PY1 cannot import torch.distributed"
fi
CHORUS_IMPORT=$(timeout 120 "$PY" -c 'import torch_chorus; print("ok")' 2>&1 | tail -n 1) || true

WORK=$(mktemp -d /tmp/compare_torch_backends.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# run_ranks NAME WORLD ARGS...: bench/torch_backends.py ARGS on WORLD ranks; rank 0's
# output goes to $WORK/NAME.out, each rank's stderr to $WORK/NAME.K.err. When a rank
# fails the others are stopped; a failure is noted in $WORK/NAME.out as an error line.
run_ranks() {
  local name=$1 world=$2 port rank pid done_pid rc=0 first_rc=0 remaining py=$PY
  shift 2
  [[ $name != *.gloo1.* ]] || py=$PY1
  port=$(free_port)
  local pids=()
  for ((rank = 0; rank < world; rank++)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$world LOCAL_WORLD_SIZE=$world \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 10 "$timeout_s" "$py" "$ROOT/bench/torch_backends.py" "$@" \
      >"$WORK/$name.$rank.log" 2>"$WORK/$name.$rank.err" &
    pids+=($!)
  done
  while ((${#pids[@]} > 0)); do
    rc=0
    wait -n -p done_pid "${pids[@]}" || rc=$?
    remaining=()
    for pid in "${pids[@]}"; do [[ $pid == "$done_pid" ]] || remaining+=("$pid"); done
    pids=("${remaining[@]}")
    if ((rc != 0 && first_rc == 0)); then
      first_rc=$rc
      # give the others a moment to finish on their own (their output is wanted), then stop them
      local waited=0
      while ((${#pids[@]} > 0 && waited < 10)); do
        remaining=()
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && remaining+=("$pid"); done
        pids=("${remaining[@]}")
        ((${#pids[@]} == 0)) || { sleep 1; waited=$((waited + 1)); }
      done
      ((${#pids[@]} == 0)) || kill "${pids[@]}" 2>/dev/null || true
    fi
  done
  cat "$WORK/$name.0.log" >>"$WORK/$name.out"
  if ((first_rc != 0)); then
    local why="exit $first_rc" last
    ((first_rc != 124 && first_rc != 137)) || why="timed out after ${timeout_s}s"
    last=$(cat "$WORK/$name".*.err | grep -v '^\s*$' | grep -iE 'error|exception|abort|fault' | tail -n 1 | cut -c1-300) || true
    echo "run_failed $name $why${last:+: $last}" >>"$WORK/$name.out"
    echo "compare_torch_backends: $name: $why; the end of its ranks' stderr:" >&2
    for ((rank = 0; rank < world; rank++)); do tail -n 5 "$WORK/$name.$rank.err" | sed "s/^/  [$rank] /" >&2; done
  fi
}

quick_arg=()
((quick)) && quick_arg=(--quick)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)
for ((round = 1; round <= rounds; round++)); do
  for backend in gloo chorus ${PY1:+gloo1}; do
    echo "compare_torch_backends: round $round/$rounds: $backend, all_reduce and DDP on 2 ranks" >&2
    run_ranks "ardp.$backend.$round" 2 --backend "${backend%1}" --tests allreduce,ddp "${quick_arg[@]}"
  done
  for w in $fsdp_worlds; do
    for backend in gloo chorus; do
      echo "compare_torch_backends: round $round/$rounds: $backend, FSDP2 on $w ranks" >&2
      run_ranks "fsdp$w.$backend.$round" "$w" --backend "$backend" --tests fsdp "${quick_arg[@]}"
    done
  done
done
ELAPSED=$(($(date +%s) - START))

"$PY" - "$WORK" "$rounds" "$quick" "$fsdp_worlds" "$TORCH_VERSION" "$CHORUS_IMPORT" \
  "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ELAPSED" "$CORES" "$TORCH1_VERSION" <<'PYEOF'
import glob, os, sys
work, rounds, quick, fsdp_worlds, torch_version, chorus_import, load_before, load_after, elapsed, cores, torch1_version = sys.argv[1:]
fsdp_worlds = [int(w) for w in fsdp_worlds.split()]

ar = {}        # (backend, size) -> best us
wrong = {}     # (backend, size) -> max wrong elements
steps = {}     # (test, backend, world) -> best samples/s
errors = {}    # key -> message; key: ("allreduce", backend, size) or (test, backend, world)
run_errors = {}  # (kind, backend, world) -> message
for path in sorted(glob.glob(os.path.join(work, "*.out"))):
    name = os.path.basename(path)[:-4]
    kind, backend, _ = name.split(".")
    for line in open(path):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "allreduce":
            key = (backend, int(f[3]))
            ar[key] = min(ar.get(key, float("inf")), float(f[4]))
            wrong[key] = max(wrong.get(key, 0), int(f[5]))
        elif f[0] in ("ddp", "fsdp"):
            key = (f[0], backend, int(f[2]))
            steps[key] = max(steps.get(key, 0.0), float(f[3]))
        elif f[0] == "error":
            what = f[3]
            msg = " ".join(f[4:])
            if what.startswith("allreduce:"):
                errors[("allreduce", backend, int(what.split(":")[1]))] = msg
            else:
                errors[(what, backend, int(f[2]))] = msg
        elif f[0] == "run_failed":
            world = 2 if kind == "ardp" else int(kind[4:])
            run_errors[(kind, backend, world)] = " ".join(f[2:])

def fmt_size(n):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n // v} {unit}"
    return f"{n} B"

def short(msg, width=90):
    return msg if len(msg) <= width else msg[:width - 3] + "..."

def why_missing(test, backend, world, size=None):
    key = (test, backend, size if test == "allreduce" else world)
    if key in errors:
        return errors[key]
    kind = "ardp" if test in ("allreduce", "ddp") else f"fsdp{world}"
    if (kind, backend, world) in run_errors:
        return "run failed: " + run_errors[(kind, backend, world)]
    return "no result"

label = "quick" if quick == "1" else "full"
print(f"# gloo vs chorus from Python, torch {torch_version}, {cores} cores, {label} run, best of {rounds} round(s), {elapsed} s;"
      f" load before {load_before}, after {load_after}")
if chorus_import != "ok":
    print(f"# import torch_chorus: {chorus_import}")
print()
print("# all_reduce SUM float32 in place, 2 ranks: time per call (max over ranks), busbw = 2(n-1)/n*bytes/time,"
      " x = chorus speed / gloo speed")
print(f"{'size':>9} {'gloo us':>11} {'chorus us':>11} {'gloo GB/s':>10} {'chorus GB/s':>12} {'x':>7}")
expected = [8] + [16 << (2 * k) for k in range(13)]  # bench/torch_backends.py's sizes: 8 B, 16 B .. 256 MiB
sizes = sorted(set(expected) | {s for (_, s) in ar} | {k[2] for k in errors if k[0] == "allreduce"})
ratio = {}
for size in sizes:
    g, c = ar.get(("gloo", size)), ar.get(("chorus", size))
    bus = lambda t: 2 * (2 - 1) / 2 * size / (t * 1e-6) / 1e9
    cells = [f"{g:>11.1f}" if g else f"{'-':>11}", f"{c:>11.1f}" if c else f"{'-':>11}",
             f"{bus(g):>10.3f}" if g else f"{'-':>10}", f"{bus(c):>12.3f}" if c else f"{'-':>12}"]
    row = f"{fmt_size(size):>9} " + " ".join(cells)
    if g and c:
        ratio[size] = g / c
        row += f" {g / c:>7.2f}"
    else:
        row += f" {'-':>7}"
    notes = []
    for b, t in (("gloo", g), ("chorus", c)):
        if not t:
            notes.append(f"{b}: {short(why_missing('allreduce', b, 2, size))}")
        elif wrong.get((b, size)):
            notes.append(f"{b}: {wrong[(b, size)]} WRONG elements")
    if notes:
        row += "   " + "; ".join(notes)
    print(row)

print()
print("# training steps, samples/s over all ranks (slowest rank's time), x = chorus / gloo")
print(f"{'step':<34} {'ranks':>5} {'gloo':>10} {'chorus':>10} {'x':>7}")
step_ratio = {}
rows = [("ddp", 2, "DDP, seed 000 MLP (512), batch 64")] + \
       [("fsdp", w, "FSDP2, MLP hidden 2048, batch 64") for w in fsdp_worlds]
for test, world, name in rows:
    g, c = steps.get((test, "gloo", world)), steps.get((test, "chorus", world))
    row = f"{name:<34} {world:>5} " + (f"{g:>10.1f}" if g else f"{'-':>10}") + " " + \
          (f"{c:>10.1f}" if c else f"{'-':>10}")
    if g and c:
        step_ratio[(test, world)] = c / g
        row += f" {c / g:>7.2f}"
    else:
        row += f" {'-':>7}"
        row += "   " + "; ".join(f"{b}: {short(why_missing(test, b, world))}"
                                 for b, v in (("gloo", g), ("chorus", c)) if not v)
    print(row)

print()
print("# targets (chorus / gloo)")
def target(name, values, goal, expected):
    if not values or len(values) < expected:
        print(f"{name}: target >= {goal}: missed (measured on both backends: {len(values)} of {expected})"
              + (f"; min so far {min(values):.2f}" if values else ""))
        return
    low = min(values)
    print(f"{name}: min {low:.2f} (target >= {goal}): {'met' if low >= goal else 'missed'}")
small = [s for s in sizes if s <= 64 << 10]
mid = [s for s in sizes if 64 << 10 <= s <= 16 << 20]
target("all_reduce speed, 8 B .. 64 KiB", [ratio[s] for s in small if s in ratio], 5, len(small))
target("all_reduce busbw, 64 KiB .. 16 MiB", [ratio[s] for s in mid if s in ratio], 3, len(mid))
target("DDP step samples/s, 2 ranks", [step_ratio[("ddp", 2)]] if ("ddp", 2) in step_ratio else [], 1.25, 1)
for w in fsdp_worlds:
    target(f"FSDP2 step samples/s, {w} ranks",
           [step_ratio[("fsdp", w)]] if ("fsdp", w) in step_ratio else [], 1.3, 1)
if torch1_version:
    print()
    print(f"# gloo on torch {torch_version} against gloo on torch {torch1_version}, the same rounds;"
          f" x = speed on {torch_version} / speed on {torch1_version}")
    print(f"{'size / step':>22} {'gloo ' + torch1_version:>16} {'gloo ' + torch_version:>22} {'x':>7}")
    for size in sizes:
        old, new = ar.get(("gloo1", size)), ar.get(("gloo", size))
        row = f"{fmt_size(size):>22} " + (f"{old:>13.1f} us" if old else f"{'-':>16}") + " " + \
              (f"{new:>19.1f} us" if new else f"{'-':>22}")
        row += f" {old / new:>7.2f}" if old and new else f" {'-':>7}   " + \
            "; ".join(f"{b}: {short(why_missing('allreduce', b, 2, size))}" for b, v in (("gloo1", old), ("gloo", new)) if not v)
        print(row)
    old, new = steps.get(("ddp", "gloo1", 2)), steps.get(("ddp", "gloo", 2))
    row = f"{'DDP step, 2 ranks':>22} " + (f"{old:>11.1f} smp/s" if old else f"{'-':>16}") + " " + \
          (f"{new:>17.1f} smp/s" if new else f"{'-':>22}")
    row += f" {new / old:>7.2f}" if old and new else f" {'-':>7}   " + \
        "; ".join(f"{b}: {short(why_missing('ddp', b, 2))}" for b, v in (("gloo1", old), ("gloo", new)) if not v)
    print(row)
PYEOF
