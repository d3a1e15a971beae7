#!/usr/bin/env bash
# The seed job (MLP 784-512-512-10 on Fashion-MNIST, SGD lr 1e-3, global batch 512) in
# chorus on 2 ranks and on 1 rank, in PyTorch DDP over gloo on 2 ranks, and as a plain
# libtorch loop on 1 process, measured in one run on this machine; prints samples/s
# and the ratios against their targets. A fifth config is the ceiling of any 2-rank run
# here: 2 plain loops side by side, each on half the global batch, that never talk. A
# sixth is the ceiling of any synchronous one: the same 2 loops meeting at a barrier
# after every backward (bench/lockstep.h), as data-parallel ranks must, moving no data.
#
# Usage: bench/compare_mnist.sh [-n STEPS] [-w WARMUP] [-R REPEATS] [-t TIMEOUT_S] [-B BIN]
#   -n  timed optimizer steps per run                        (default 200)
#   -w  warm-up steps before them                            (default 5)
#   -R  runs of the whole set, round robin over the configs;
#       each config keeps its best samples/s                 (default 2)
#   -t  deadline of each run, seconds                        (default 600)
#   -B  another build's bin/ (its chorusrun and chorus-mnist), for before/after:
#       adds config before2, that build on 2 ranks, run right after chorus2 in
#       every round (the order of the two flips each round), and chorus2/before2
# Every config runs -w + -n steps of global batch 512, one intra-op thread per rank (and
# one OpenBLAS thread: all four compute on the same libtorch and BLAS) and one data loader worker per rank (chorus-mnist's --workers 1, the seed's num_workers=1,
# a thread in libtorch, a process in PyTorch). Every program times only the -n steps
# after the -w warm-up steps. Everything talks over 127.0.0.1.
# Environment: PLAIN_LIBTORCH_MNIST=path uses that binary instead of building the
# target plain-libtorch-mnist. Exits non-zero when a config fails or times out.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly PY=/usr/bin/python3   # Debian's python, the one with python3-torch
CONFIGS=(chorus2 pytorch2 chorus1 plain1 plain2 sync2)
# shellcheck source=bench/processes.sh
source "$ROOT/bench/processes.sh"

steps=200 warmup=5 repeats=2 timeout_s=600 before_bin=""

die() { echo "compare_mnist: $*" >&2; exit 1; }

usage() { sed -n '10,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }

parse_args() {
  local opt
  while getopts "n:w:R:t:B:h" opt; do
    case $opt in
      n) steps=$OPTARG ;; w) warmup=$OPTARG ;; R) repeats=$OPTARG ;; t) timeout_s=$OPTARG ;;
      B) before_bin=$OPTARG ;;
      h) usage 0 ;; *) usage 2 ;;
    esac
  done
  local v
  for v in "$steps" "$warmup" "$repeats" "$timeout_s"; do
    [[ $v =~ ^[0-9]+$ ]] || { echo "compare_mnist: '$v' is not a number" >&2; exit 2; }
  done
  ((steps >= 1 && repeats >= 1 && timeout_s >= 1)) ||
    { echo "compare_mnist: -n, -R and -t must be >= 1" >&2; exit 2; }
  if [[ -n $before_bin ]]; then
    local p
    for p in chorusrun chorus-mnist; do
      [[ -x $before_bin/$p ]] || { echo "compare_mnist: -B: no executable $p in '$before_bin'" >&2; exit 2; }
    done
    CONFIGS=(chorus2 before2 pytorch2 chorus1 plain1 plain2 sync2)
  fi
}

# Installs the Debian packages that are missing (none when all are present), with the
# project's own installer.
ensure_packages() {
  "$ROOT/scripts/install-deps.sh" python3-torch python3-torchvision dataset-fashion-mnist || die "installing the benchmark's packages failed"
}

build_programs() {
  local targets=(chorus-mnist chorusrun)
  [[ -n ${PLAIN_LIBTORCH_MNIST:-} ]] || targets+=(plain-libtorch-mnist)
  [[ -f $ROOT/build/CMakeCache.txt ]] ||
    timeout 600 cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >&2 ||
    die "cmake configure failed"
  timeout 3600 cmake --build "$ROOT/build" -j "$(nproc)" --target "${targets[@]}" >&2 ||
    die "building ${targets[*]} failed"
  PLAIN=${PLAIN_LIBTORCH_MNIST:-$ROOT/build/bin/plain-libtorch-mnist}
  [[ -x $PLAIN ]] || die "no plain-libtorch-mnist at $PLAIN"
  timeout 300 $PY -c 'import torch.distributed as d, torchvision; assert d.is_available()' ||
    die "$PY cannot import torch.distributed and torchvision (python3-torch, python3-torchvision)"
}

# Every config computes with the same BLAS kernels: the ones chorus-mnist and
# plain-libtorch-mnist pick for themselves (apps/chorus-mnist/process_tuning.h: on a
# CPU that Debian's OpenBLAS does not know, its AVX-512 or AVX2 kernels instead of the
# generic ones), exported as OPENBLAS_CORETYPE so that PyTorch loads them too. A value
# already set is kept.
choose_blas_kernels() {
  [[ -z ${OPENBLAS_CORETYPE:-} ]] || return 0
  local core
  core=$(OPENBLAS_VERBOSE=2 timeout 60 "$PLAIN" --help 2>&1 >/dev/null | sed -n 's/^Core: //p' | tail -n 1)
  [[ -z $core ]] || export OPENBLAS_CORETYPE=$core
}

free_port() {
  timeout 60 $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Reports a failed run ($1 = config, $2 = exit status or why, $3 = its log) and exits.
fail_run() {
  local why=$2
  [[ $why =~ ^[0-9]+$ ]] && why="exit status $2"
  [[ $2 == 124 || $2 == 137 ]] && why="timed out after ${timeout_s} s"
  echo "compare_mnist: $1 failed ($why); last lines of its output:" >&2
  tail -n 20 "$3" >&2
  exit 1
}

# Appends the JSON line of the run's output ($2) to $WORK/$1.out, or fails the config.
keep_json() {
  grep -m1 '^{' "$2" >>"$WORK/$1.out" || fail_run "$1" "printed no JSON line" "$2"
}

# run_chorus CONFIG RANKS [BIN]: BIN/chorusrun and BIN/chorus-mnist (this build's by default)
run_chorus() {
  local log=$WORK/$1.log rc=0 bin=${3:-$ROOT/build/bin}
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout -k 10 "$timeout_s" "$bin/chorusrun" --standalone \
    --local-addr 127.0.0.1 --nproc-per-node "$2" "$bin/chorus-mnist" \
    --max-steps $((warmup + steps)) --warmup-steps "$warmup" --threads 1 --workers 1 \
    >"$log" 2>&1 || rc=$?
  ((rc == 0)) || fail_run "$1" "$rc" "$log"
  keep_json "$1" "$log"
}

# plain_loop [ARGS...]: one plain-libtorch-mnist run with the configs' common settings.
plain_loop() {
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout -k 10 "$timeout_s" "$PLAIN" --max-steps $((warmup + steps)) \
    --warmup-steps "$warmup" --threads 1 --workers 1 "$@"
}

run_plain() {
  local log=$WORK/plain1.log rc=0
  plain_loop >"$log" 2>&1 || rc=$?
  ((rc == 0)) || fail_run plain1 "$rc" "$log"
  keep_json plain1 "$log"
}

# Two plain loops at once, batch 256 each (a rank's share of 512): the samples/s of both
# together bound what any 2-rank data-parallel run can reach here. plain2 never
# communicates; sync2 meets at a barrier after every backward (--lockstep), and so
# bounds any synchronous 2-rank run: what remains between it and plain2 is the time a
# rank waits for the slower one, the machine's, not a library's.
run_plain_pair() {
  local config=$1 k pids=() extra=()
  if [[ $config == sync2 ]]; then
    head -c 64 /dev/zero >"$WORK/lockstep"
  fi
  for k in 0 1; do
    [[ $config == sync2 ]] && extra=(--lockstep "$WORK/lockstep" --lockstep-rank "$k" --lockstep-size 2)
    plain_loop --batch-size 256 "${extra[@]}" >"$WORK/$config.$k.log" 2>&1 &
    pids+=($!)
  done
  wait_all_or_fail "$config"
  $PY - "$WORK/$config.0.log" "$WORK/$config.1.log" >>"$WORK/$config.out" <<'EOF'
import json, sys
runs = [json.loads(next(l for l in open(f) if l.startswith("{"))) for f in sys.argv[1:]]
print(json.dumps({"samples_per_second": sum(r["samples_per_second"] for r in runs),
                  "blas": runs[0]["blas"] if len({r["blas"] for r in runs}) == 1 else "mixed"}))
EOF
}

# One python process per rank; when one fails the others are stopped.
run_pytorch() {
  local ranks=2 port rank pids=() log=$WORK/pytorch2.log
  port=$(free_port)
  : >"$log"
  for ((rank = 0; rank < ranks; rank++)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout -k 10 "$timeout_s" \
      $PY "$ROOT/bench/pytorch_ddp_mnist.py" --max-steps $((warmup + steps)) \
      --warmup-steps "$warmup" --threads 1 --workers 1 >>"$log" 2>&1 &
    pids+=($!)
  done
  wait_all_or_fail pytorch2 "$log"
  keep_json pytorch2 "$log"
}

run_all() {
  local run config order
  for ((run = 1; run <= repeats; run++)); do
    order=("${CONFIGS[@]}")
    # Before/after: the two builds swap places every other round.
    if [[ -n $before_bin ]] && ((run % 2 == 0)); then order[0]=before2 order[1]=chorus2; fi
    for config in "${order[@]}"; do
      echo "compare_mnist: running $config ($run/$repeats)" >&2
      case $config in
        chorus2) run_chorus chorus2 2 ;; chorus1) run_chorus chorus1 1 ;;
        before2) run_chorus before2 2 "$before_bin" ;;
        pytorch2) run_pytorch ;; plain1) run_plain ;; plain2 | sync2) run_plain_pair "$config" ;;
      esac
    done
  done
}

print_table() {
  $PY - "$WORK" "$steps" "$warmup" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$before_bin" <<'EOF'
import json, sys
work, steps, warmup, load_before, load_after, before_bin = sys.argv[1:]
names = {"chorus2": "chorus, 2 ranks", "chorus1": "chorus, 1 rank",
         "pytorch2": "PyTorch DDP gloo, 2 ranks", "plain1": "plain libtorch, 1 process",
         "plain2": "2 plain processes, 256 each", "sync2": "the same, a barrier a step"}
if before_bin:
    names["before2"] = "before (-B), 2 ranks"
lines = {c: [json.loads(l) for l in open(f"{work}/{c}.out")] for c in names}
runs = {c: [j["samples_per_second"] for j in v] for c, v in lines.items()}
blas = {c: sorted({j.get("blas") or "not OpenBLAS" for j in v}) for c, v in lines.items()}
best = {c: max(v) for c, v in runs.items()}
print(f"# seed job, global batch 512, {warmup} warm-up + {steps} timed steps per run, "
      "1 thread per rank; best of the runs")
print(f"# load average (1/5/15 min) before: {load_before}, after: {load_after}")
print("# OpenBLAS kernels: " + ", ".join(f"{c} {'/'.join(b)}" for c, b in blas.items()) +
      ("" if len({tuple(b) for b in blas.values()}) == 1 else "  (DIFFERENT: ratios are not comparable)"))
print(f"{'config':<28}{'samples/s':>11}  all runs")
for c, n in names.items():
    print(f"{n:<28}{best[c]:>11.1f}  " + " ".join(f"{x:.1f}" for x in runs[c]))
print()
print(f"{'ratio':<28}{'value':>11}{'target':>9}")
for a, b, target in (("chorus2", "pytorch2", 2.0), ("chorus2", "chorus1", 1.8),
                     ("chorus1", "plain1", 0.95)):
    r = best[a] / best[b]
    print(f"{a + '/' + b:<28}{r:>11.2f}{'>= ' + str(target):>9}  {'met' if r >= target else 'MISSED'}")
print()
print("against the ceiling: 2 plain processes that never communicate")
for a, b, what in (("chorus2", "plain2", "chorus's 2-rank efficiency"),
                   ("plain2", "chorus1", "the most chorus2/chorus1 can be here"),
                   ("plain2", "pytorch2", "the most chorus2/pytorch2 can be here")):
    print(f"{a + '/' + b:<28}{best[a] / best[b]:>11.2f}  {what}")
print()
print("against the synchronous ceiling: the same 2 processes, meeting once a step")
for a, b, what in (("sync2", "plain2", "the most any synchronous 2-rank run can be here"),
                   ("chorus2", "sync2", "chorus's cost beyond waiting for the slower rank")):
    print(f"{a + '/' + b:<28}{best[a] / best[b]:>11.2f}  {what}")
if before_bin:
    # The spread of a build: its worst run over its best, minus 1. A difference is
    # within the noise when |chorus2/before2 - 1| is below the larger spread.
    spread = {c: max(runs[c]) / min(runs[c]) - 1 for c in ("chorus2", "before2")}
    print()
    print(f"before/after: this build against {before_bin}, alternating")
    print(f"{'chorus2/before2':<28}{best['chorus2'] / best['before2']:>11.3f}  "
          f"spread: this build {spread['chorus2']:.3f}, before {spread['before2']:.3f}")
EOF
}

main() {
  parse_args "$@"
  ensure_packages
  WORK=$(mktemp -d /tmp/compare_mnist.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
  build_programs
  choose_blas_kernels
  LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
  run_all
  print_table
}

main "$@"
