#!/usr/bin/env bash
# Runs one of the seeds' own PyTorch scripts on chorus under chorusrun, from a work
# folder whose ./data holds Fashion-MNIST (and MNIST, with --mnist) as torchvision
# expects it. Each rank prints the script's own output and, at the end, a hash of its
# DDP model's parameters (run_seed.py), equal on every rank.
#
# Usage: examples/seeds/run.sh [--seed 000|001] [--nodes N] [--nproc-per-node P]
#                              [--mnist DIR] [--backend chorus|gloo] [--steps S]
#   --seed            000: the MLP on Fashion-MNIST (default); 001: the linear model
#   --nodes           simulated nodes on this machine, each its own chorusrun (default 1)
#   --nproc-per-node  workers per node (default 2)
#   --mnist DIR       seed 001 on MNIST, from DIR's four IDX files (.gz or not)
#   --backend         the process group the script gets (default: the one it names, chorus)
#   --steps S         stop every epoch after S batches (a short run; default: the whole epoch)
# Environment: CHORUS_SEED_WORKDIR (default build/seed-run) is the work folder;
# CHORUS_SEED_PYTHON (default /usr/bin/python3, Debian's torch) the Python that runs the
# script and CHORUS_SEED_BUILD (default build) the build whose torch_chorus it imports:
# for torch 2.x, the virtual environment's python and build-torch2 (scripts/build.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/examples/seeds"
seed=000 nodes=1 nproc=2 mnist="" backend="" steps=0
while (($#)); do
  case $1 in
    --seed) seed=$2; shift 2 ;; --nodes) nodes=$2; shift 2 ;;
    --nproc-per-node) nproc=$2; shift 2 ;; --mnist) mnist=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;; --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '7,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $seed in
  000) script=$here/seed000_ddp_test.py ;; 001) script=$here/seed001_train.py ;;
  *) echo "run.sh: --seed must be 000 or 001, not '$seed'" >&2; exit 2 ;;
esac
[[ $nodes =~ ^[1-9][0-9]*$ && $nproc =~ ^[1-9][0-9]*$ && $steps =~ ^[0-9]+$ ]] ||
  { echo "run.sh: --nodes, --nproc-per-node and --steps take whole numbers" >&2; exit 2; }
python=${CHORUS_SEED_PYTHON:-/usr/bin/python3}
build=${CHORUS_SEED_BUILD:-$root/build}
[[ -x $build/bin/chorusrun && -d $build/python/torch_chorus ]] || "$root/scripts/build.sh"
"$root/scripts/install-deps.sh" python3-torchvision

work=${CHORUS_SEED_WORKDIR:-$root/build/seed-run}
"$here/prepare_data.sh" "$work" "$mnist"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export CHORUS_SEED_STEPS=$steps
[[ -z $backend ]] || export CHORUS_SEED_BACKEND=$backend
[[ -z $mnist ]] || export SEED001_DATASET=mnist
cd "$work"
if ((nodes == 1)); then
  exec "$build/bin/chorusrun" --standalone --nproc-per-node "$nproc" --tee 3 \
    "$python" "$here/run_seed.py" "$script"
fi
# Several simulated nodes: one launcher each, meeting on a free port of 127.0.0.1. The
# port is picked here and bound by node 0's launcher a moment later; when something
# else took it in between, node 0 fails at once ("address already in use") and the
# others would wait out their connect timeout: they are stopped and all start again on
# another port (three tries).
node0_log=$(mktemp)
trap 'rm -f "$node0_log"' EXIT
for attempt in 1 2 3; do
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pids=()
  for ((node = 0; node < nodes; node++)); do
    if ((node == 0)); then
      CHORUS_NODE_ID="seed-node$node" "$build/bin/chorusrun" --nnodes "$nodes" --node-rank "$node" \
        --master-addr 127.0.0.1 --master-port "$port" --nproc-per-node "$nproc" --tee 3 \
        "$python" "$here/run_seed.py" "$script" 2> >(tee "$node0_log" >&2) &
    else
      CHORUS_NODE_ID="seed-node$node" "$build/bin/chorusrun" --nnodes "$nodes" --node-rank "$node" \
        --master-addr 127.0.0.1 --master-port "$port" --nproc-per-node "$nproc" --tee 3 \
        "$python" "$here/run_seed.py" "$script" &
    fi
    pids+=($!)
  done
  rc=0
  wait "${pids[0]}" || rc=$?
  if ((rc != 0)) && grep -q "already in use" "$node0_log" && ((attempt < 3)); then
    echo "run.sh: port $port was taken before node 0 bound it; starting again on another" >&2
    kill -KILL "${pids[@]:1}" 2>/dev/null || true  # still connecting: SIGTERM waits for that
    for pid in "${pids[@]:1}"; do wait "$pid" 2>/dev/null || true; done
    continue
  fi
  for pid in "${pids[@]:1}"; do wait "$pid" || rc=$?; done
  exit $rc
done
