#!/usr/bin/env bash
# Starts N local ranks of dlrm_sharded.py (env://, 127.0.0.1), waits for them with a
# timeout and fails if any rank fails (then the others are stopped).
#
#   run_dlrm_sharded.sh [-n RANKS] [-b gloo|chorus] [-t TIMEOUT_S] [-o LOGDIR] [-- SCRIPT ARGS]
#
# PYTHON (default /usr/bin/python3) runs the ranks; PYTHONPATH must name the built
# torch_chorus package for -b chorus. Rank R's output goes to LOGDIR/rank<R>.txt (a new
# temporary folder by default); rank 0's stdout (the loss lines) is printed at the end.
set -u
here=$(cd "$(dirname "$0")" && pwd)
n=2 backend=gloo timeout_s=300 logdir=
while getopts n:b:t:o: opt; do
  case $opt in
    n) n=$OPTARG ;; b) backend=$OPTARG ;; t) timeout_s=$OPTARG ;; o) logdir=$OPTARG ;;
    *) sed -n '2,10p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
python=${PYTHON:-/usr/bin/python3}
logdir=${logdir:-$(mktemp -d /tmp/dlrm_sharded.XXXXXX)}
mkdir -p "$logdir"
port=${MASTER_PORT:-$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}

pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
    timeout -k 5 "$timeout_s" "$python" "$here/dlrm_sharded.py" --backend "$backend" "$@" \
    > "$logdir/rank$r.txt" 2> "$logdir/rank$r.err" &
  pids+=($!)
done

# Wait for all; at the first failure stop the others (they would wait on it).
failed=
left=$n
declare -A done_rc
while ((left > 0)); do
  for ((r = 0; r < n; r++)); do
    [[ -n ${done_rc[$r]:-} ]] && continue
    if ! kill -0 "${pids[$r]}" 2>/dev/null; then
      wait "${pids[$r]}"; rc=$?
      done_rc[$r]=$rc
      left=$((left - 1))
      if ((rc != 0)) && [[ -z $failed ]]; then
        failed=$r
        echo "rank $r failed (rc $rc$( ((rc == 124)) && echo ", timed out after ${timeout_s}s"))" >&2
        for ((k = 0; k < n; k++)); do
          [[ -z ${done_rc[$k]:-} ]] && kill "${pids[$k]}" 2>/dev/null
        done
      fi
    fi
  done
  ((left > 0)) && sleep 0.2
done

cat "$logdir/rank0.txt"
if [[ -n $failed ]]; then
  for ((r = 0; r < n; r++)); do
    echo "--- rank $r rc ${done_rc[$r]} ($logdir/rank$r.err)" >&2
    tail -n 20 "$logdir/rank$r.err" >&2
  done
  exit 1
fi
echo "logs: $logdir" >&2
