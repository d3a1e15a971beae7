#!/usr/bin/env bash
# chorus against gloo on the recommendation jobs of examples/recsys, in one run on this
# machine, every rank a process over env:// on 127.0.0.1, at 2 and 4 ranks, on 1 node
# and on 2 simulated nodes:
#   1. TorchRec's DLRM (examples/recsys/torchrec_dlrm.py, table-wise and row-wise, its
#      defaults: 8 tables of 20,000 x 64, batch 64 a rank, 30 steps): samples/s;
#   2. the hand-sharded DLRM (examples/recsys/dlrm_sharded.py, its defaults: 8 tables of
#      100,000 x 64, global batch 1024, 10 steps): samples/s;
#   3. the collectives of those jobs alone at their sizes (bench/recsys_collectives.py):
#      every all_to_all_single TorchRec and the hand-sharded job issue, row-wise's
#      reduce-scatter and all-gather, and the sparse all_reduce of one table's gradient
#      in a data-parallel version of the hand-sharded job: the median call's time;
#   4. where each job's step goes (examples/recsys/step_profile.py): every job run
#      writes its phases, and the report (bench/recsys_report.py) keeps the best run's,
#      splits each collective's time into waiting for the last rank to arrive and the
#      rest, prints the table and draws recsys_profile.png (gnuplot).
# Simulated nodes: with 2 nodes, rank r gets CHORUS_NODE_ID=simnode<r*2/W> (the ranks
# of a node share memory, chorus talks tcp between the nodes), as chorus-bench --nodes
# and tests/torch_py do. gloo has no such notion: it talks tcp over loopback whatever
# the node count, so it runs once per rank count and its numbers serve both node rows.
# The backends alternate, gloo first in odd rounds and chorus first in even ones, and
# each keeps its best of -R rounds. Prints one table with x = chorus's speed over
# gloo's and the targets (the jobs' samples/s >= 1.5x on 2 simulated nodes, all_to_all
# at the jobs' sizes >= 3x): met or missed, never a failure. TorchRec's rows are
# skipped, saying why, where TorchRec is not installed (examples/recsys/setup_torchrec.sh).
#
# Usage: bench/compare_recsys.sh [--python PY] [--pythonpath DIR] [--torchrec DIR]
#            [-w "2 4"] [-N "1 2"] [-R ROUNDS] [--quick] [-t TIMEOUT_S] [--lock FILE]
#            [-o OUTDIR]
#   --python      the python with torch 2.x        (default .venv-torch2/bin/python)
#   --pythonpath  the folder holding torch_chorus   (default build-torch2/python)
#   --torchrec    setup_torchrec.sh's folder        (default .torchrec)
#   -w            rank counts                       (default "2 4")
#   -N            simulated node counts             (default "1 2")
#   -R            rounds, round robin; each keeps its best (default 3; 1 with --quick)
#   --quick       fewer steps and calls, 1 round: a check that everything runs
#   -t            deadline of each run, seconds     (default 300)
#   --lock FILE   hold FILE exclusively (flock) while each job runs on both backends,
#                 and only then: others may use the machine between the pairs
#   -o            keep the logs, profiles, table and plot in OUTDIR (default: a
#                 temporary folder; the table and plot are copied to the current
#                 folder as recsys_table.txt and recsys_profile.png)
# Every rank computes on 1 thread (OMP_NUM_THREADS=1); each run gets a free port. A
# run that fails shows its error in its rows and the rest goes on.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/processes.sh
source "$ROOT/bench/processes.sh"
PY=$ROOT/.venv-torch2/bin/python PYPATH=$ROOT/build-torch2/python TREC_DIR=$ROOT/.torchrec
worlds="2 4" node_counts="1 2" rounds="" quick=0 timeout_s=300 lock="" outdir=""

usage() { sed -n '28,43p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }
die() { echo "compare_recsys: $*" >&2; exit 1; }

while (($#)); do
  case $1 in
    --python) PY=${2:?--python needs a value}; shift 2 ;;
    --pythonpath) PYPATH=${2:?--pythonpath needs a value}; shift 2 ;;
    --torchrec) TREC_DIR=${2:?--torchrec needs a value}; shift 2 ;;
    -w) worlds=${2:?-w needs a value}; shift 2 ;;
    -N) node_counts=${2:?-N needs a value}; shift 2 ;;
    -R) rounds=${2:?-R needs a value}; shift 2 ;;
    --quick) quick=1; shift ;;
    -t) timeout_s=${2:?-t needs a value}; shift 2 ;;
    --lock) lock=${2:?--lock needs a value}; shift 2 ;;
    -o) outdir=${2:?-o needs a value}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "compare_recsys: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
rounds=${rounds:-$((quick ? 1 : 3))}
for v in "$rounds" "$timeout_s" $worlds $node_counts; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "compare_recsys: '$v' is not a positive number" >&2; exit 2; }
done
for w in $worlds; do
  for n in $node_counts; do
    ((w % n == 0)) || { echo "compare_recsys: $w ranks do not split into $n nodes" >&2; exit 2; }
  done
done

[[ -x $PY ]] || die "no python at $PY (scripts/torch2-env.sh makes .venv-torch2)"
CORES=$(nproc)  # before OMP_NUM_THREADS=1, which nproc would report instead
export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  MKL_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
TORCH_VERSION=$(timeout 120 "$PY" -c 'import torch, torch_chorus; print(torch.__version__)') ||
  die "$PY cannot import torch and torch_chorus (from $PYPATH)"

# TorchRec: its folder's environment (setup_torchrec.sh installs nothing when the folder
# has it already; without it the TorchRec rows are skipped rather than installed here).
TREC_SKIP="" TREC_PRELOAD="" TREC_PATH=""
if [[ ! -f $TREC_DIR/site/torchrec/__init__.py ]]; then
  TREC_SKIP="TorchRec is not installed in $TREC_DIR (examples/recsys/setup_torchrec.sh $TREC_DIR)"
else
  trec_env=$("$ROOT/examples/recsys/setup_torchrec.sh" "$TREC_DIR") || die "setup_torchrec.sh failed"
  TREC_PRELOAD=$(sed -n 's/^export LD_PRELOAD=//p' <<<"$trec_env")
  TREC_PATH=$TREC_DIR/site
  why=$(LD_PRELOAD=$TREC_PRELOAD PYTHONPATH=$PYTHONPATH:$TREC_PATH timeout 300 "$PY" \
    -c 'import torchrec, fbgemm_gpu' 2>&1 | tail -n 1) || TREC_SKIP="import torchrec: $why"
fi
[[ -z $TREC_SKIP ]] || echo "compare_recsys: skipping TorchRec's rows: $TREC_SKIP" >&2

WORK=${outdir:-$(mktemp -d /tmp/compare_recsys.XXXXXX)}
mkdir -p "$WORK"
[[ -n $outdir ]] || trap 'rm -rf "$WORK"' EXIT
if [[ -n $lock ]]; then exec 9>>"$lock"; fi

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_all_or_fail (processes.sh) calls this for a run with a failed rank, having
# stopped the others: the failure goes into the run's .failed file for the report.
fail_run() {
  local why="exit $2"
  (($2 != 124 && $2 != 137)) || why="timed out after ${timeout_s}s"
  echo "$why: $(grep -iE 'error|exception|abort|fault' "$3" | tail -n 1 | cut -c1-240)" >"$WORK/$1.failed"
  echo "compare_recsys: $1: $why; the end of its log ($3):" >&2
  tail -n 5 "$3" | sed 's/^/  /' >&2
}

# run_job JOB BACKEND WORLD NODES ROUND: one run of JOB on WORLD ranks in NODES simulated
# nodes. Rank K's output (stdout and stderr) goes to $WORK/NAME.K.log, its profile to
# $WORK/NAME.prof/, NAME being JOB.BACKEND.WORLDxNODES.ROUND.
run_job() {
  local job=$1 backend=$2 world=$3 nodes=$4 round=$5 port rank
  local name=$job.$backend.${world}x$nodes.$round
  local cmd=() env=()
  case $job in
    coll) cmd=("$ROOT/bench/recsys_collectives.py" --backend "$backend")
          ((quick)) && cmd+=(--warmup 2 --iters 5) ;;
    sharded) cmd=("$ROOT/examples/recsys/dlrm_sharded.py" --backend "$backend" --profile "$WORK/$name.prof")
             ((quick)) && cmd+=(--steps 4) ;;
    trec_tw | trec_rw)
      cmd=("$ROOT/examples/recsys/torchrec_dlrm.py" --backend "$backend" --profile "$WORK/$name.prof")
      [[ $job == trec_tw ]] && cmd+=(--sharding table_wise) || cmd+=(--sharding row_wise)
      ((quick)) && cmd+=(--steps 6)
      env=(PYTHONPATH="$PYTHONPATH:$TREC_PATH" ${TREC_PRELOAD:+LD_PRELOAD=$TREC_PRELOAD}) ;;
  esac
  echo "compare_recsys: round $round: $job on $backend, $world ranks, $nodes node(s)" >&2
  port=$(free_port)
  pids=()
  for ((rank = 0; rank < world; rank++)); do
    local node_env=()
    ((nodes > 1)) && node_env=(CHORUS_NODE_ID=simnode$((rank * nodes / world)))
    env "${env[@]}" "${node_env[@]}" RANK=$rank LOCAL_RANK=$((rank % (world / nodes))) \
      WORLD_SIZE=$world LOCAL_WORLD_SIZE=$((world / nodes)) MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 10 "$timeout_s" "$PY" "${cmd[@]}" >"$WORK/$name.$rank.log" 2>&1 &
    pids+=($!)
  done
  wait_all_or_fail "$name"
}

jobs=(coll sharded)
[[ -n $TREC_SKIP ]] || jobs+=(trec_tw trec_rw)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)
for ((round = 1; round <= rounds; round++)); do
  backends=(gloo chorus)
  ((round % 2)) || backends=(chorus gloo)
  for w in $worlds; do
    for job in "${jobs[@]}"; do
      [[ -z $lock ]] || flock -x -w 1800 9 || die "could not take the lock $lock in 30 minutes"
      for backend in "${backends[@]}"; do
        for n in $node_counts; do
          # gloo ignores CHORUS_NODE_ID: one run serves every node count.
          [[ $backend == gloo && $n != "${node_counts%% *}" ]] && continue
          run_job "$job" "$backend" "$w" "$n" "$round"
        done
      done
      [[ -z $lock ]] || flock -u 9
    done
  done
done
ELAPSED=$(($(date +%s) - START))

kind=full
((quick)) && kind=quick
header="torch $TORCH_VERSION, $CORES cores, $kind run, best of $rounds round(s), $ELAPSED s;"
header+=" load before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" "$ROOT/bench/recsys_report.py" "$WORK" --worlds "$worlds" --nodes "$node_counts" \
  --header "$header" ${TREC_SKIP:+--skip-torchrec "$TREC_SKIP"} | tee "$WORK/recsys_table.txt"
if [[ -z $outdir ]]; then
  cp "$WORK/recsys_table.txt" recsys_table.txt
  [[ ! -f $WORK/recsys_profile.png ]] || cp "$WORK/recsys_profile.png" recsys_profile.png
fi
