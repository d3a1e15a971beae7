#!/usr/bin/env bash
# gloo against chorus on sparse all_reduce from Python, both in one run on this machine
# (bench/sparse_allreduce.py): a 100,000 x 64 float32 table with 0.1%, 1%, 10% and 50%
# of its rows touched by each rank at random, on 2 and 4 ranks, every rank a process
# over env:// on 127.0.0.1. Prints one table: the median call of each backend (slowest
# rank), chorus's time over gloo's, and whether the results were equal.
#
# Usage: bench/compare_sparse_allreduce.sh [--python PY] [--pythonpath DIR] [-w "2 4"]
#                                          [--quick] [-t TIMEOUT_S]
#   --python      the python with torch       (default /usr/bin/python3, torch 1.13)
#   --pythonpath  the folder of torch_chorus  (default build/python)
#   -w            world sizes                 (default "2 4")
#   --quick       1 round of 3 calls a density (default: 3 rounds of 10)
#   -t            deadline of each run, s      (default 600)
# Every rank computes on 1 thread (OMP_NUM_THREADS=1); each run gets a free port. A run
# that fails prints its ranks' last lines and the script exits non-zero.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=/usr/bin/python3 PYPATH=$ROOT/build/python worlds="2 4" quick=0 timeout_s=600

usage() { sed -n '8,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }
while (($#)); do
  case $1 in
    --python) PY=${2:?--python needs a value}; shift 2 ;;
    --pythonpath) PYPATH=${2:?--pythonpath needs a value}; shift 2 ;;
    -w) worlds=${2:?-w needs a value}; shift 2 ;;
    --quick) quick=1; shift ;;
    -t) timeout_s=${2:?-t needs a value}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "compare_sparse_allreduce: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
for v in "$timeout_s" $worlds; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "compare_sparse_allreduce: '$v' is not a positive number" >&2; exit 2; }
done
[[ -x $PY ]] || { echo "compare_sparse_allreduce: no python at $PY" >&2; exit 1; }

CORES=$(nproc)  # before OMP_NUM_THREADS=1
export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  MKL_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
TORCH_VERSION=$(timeout 120 "$PY" -c 'import torch, torch_chorus; print(torch.__version__)') ||
  { echo "compare_sparse_allreduce: $PY cannot import torch and torch_chorus (from $PYPATH)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/compare_sparse_allreduce.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
args=()
((quick)) && args=(--rounds 1 --iters 3)

# run_ranks WORLD: the driver on WORLD ranks; rank 0's lines in $WORK/WORLD.out.
run_ranks() {
  local world=$1 port rank rc=0 pids=()
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for ((rank = 0; rank < world; rank++)); do
    RANK=$rank WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 10 "$timeout_s" "$PY" "$ROOT/bench/sparse_allreduce.py" "${args[@]}" \
      >"$WORK/$world.$rank.out" 2>"$WORK/$world.$rank.err" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  if ((rc != 0)); then
    echo "compare_sparse_allreduce: $world ranks failed (exit $rc); the end of their stderr:" >&2
    for ((rank = 0; rank < world; rank++)); do tail -n 5 "$WORK/$world.$rank.err" | sed "s/^/  [$rank] /" >&2; done
    exit 1
  fi
}

START=$(date +%s)
for w in $worlds; do
  echo "compare_sparse_allreduce: $w ranks" >&2
  run_ranks "$w"
done
echo "# sparse all_reduce, 100000 x 64 float32, gloo vs chorus, torch $TORCH_VERSION, $CORES cores," \
  "$(($(date +%s) - START)) s; median call (slowest rank), x = chorus time / gloo time"
printf '%6s %9s %12s %10s %10s %7s %6s\n' ranks "rows/rank" "nnz/rank" "gloo ms" "chorus ms" x equal
for w in $worlds; do
  grep -h '^sparse ' "$WORK/$w.0.out" | while read -r _ world density nnz gloo chorus equal; do
    printf '%6s %8s%% %12s %10s %10s %7.2f %6s\n' "$world" \
      "$(awk -v d="$density" 'BEGIN { printf "%g", d * 100 }')" "$nnz" "$gloo" "$chorus" \
      "$(awk -v g="$gloo" -v c="$chorus" 'BEGIN { print c / g }')" "$equal"
  done
done
