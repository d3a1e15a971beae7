#!/usr/bin/env bash
# The shared memory that N ranks of one node take while they run an 8-byte allreduce:
# two chorus-bench builds (old, new: --np N, shared memory inside the node) and Open
# MPI (mpirun, btl self,vader: bench/mpi_allreduce.c), one after the other for every N,
# in one run. A sampler reads, every -i milliseconds, what /dev/shm's tmpfs has in use
# (statvfs: blocks in use, so pages reserved or touched, also those of files already
# unlinked, as chorus's segment is once every rank mapped it) and Shmem in
# /proc/meminfo (all shared memory: /dev/shm, memfd and the like); the table gives
# each run's peak over what was in use just before it started. Both are the whole
# machine's: other jobs that use shared memory meanwhile add to a run's peak.
# Every result is checked (chorus-bench -c 1, mpi_allreduce's check); a wrong element
# fails the run.
#
# Usage: bench/compare_shm_memory.sh OLD_BIN NEW_BIN [-p "16 64 128 256"] [-n ITERS]
#            [-w WARMUP] [-i INTERVAL_MS] [-t TIMEOUT_S] [-M]
#   OLD_BIN, NEW_BIN  chorus-bench binaries (or the bin/ folders holding them)
#   -p  local rank counts (default "16 64 128 256")
#   -n/-w  timed and warm-up allreduces (default 200, 20: each run lasts seconds, which
#          the sampler needs on a loaded machine)
#   -i  sampling interval, ms (default 5)      -t  deadline of each run, s (default 900)
#   -M  leave Open MPI out (no mpirun needed)
set -euo pipefail
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { sed -n '14,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }
die() { echo "compare_shm_memory: $*" >&2; exit 1; }
(($# >= 2)) || usage 2
bin_of() { if [[ -d $1 ]]; then echo "$1/chorus-bench"; else echo "$1"; fi; }
OLD=$(bin_of "$1") NEW=$(bin_of "$2")
shift 2
sizes="16 64 128 256" iters=200 warmup=20 interval_ms=5 timeout_s=900 mpi=1
while getopts "p:n:w:i:t:Mh" opt; do
  case $opt in
    p) sizes=$OPTARG ;; n) iters=$OPTARG ;; w) warmup=$OPTARG ;; i) interval_ms=$OPTARG ;;
    t) timeout_s=$OPTARG ;; M) mpi=0 ;; h) usage 0 ;; *) usage 2 ;;
  esac
done
for b in "$OLD" "$NEW"; do [[ -x $b ]] || die "no chorus-bench at $b"; done
max_ranks=0
for v in $sizes "$iters" "$warmup" "$interval_ms" "$timeout_s"; do
  [[ $v =~ ^[0-9]+$ ]] || die "'$v' is not a number"
done
for n in $sizes; do
  ((n >= 2 && n <= 1024)) || die "-p: $n local ranks (chorus-bench --np takes 2 to 1024)"
  ((n > max_ranks)) && max_ranks=$n
done
PY=$(command -v python3) || die "no python3"

# Limits that N processes of one node run into: open files (every rank holds sockets to
# the others and its store connection), processes and threads.
files=$(ulimit -n)
[[ $files == unlimited ]] || ((files >= 2 * max_ranks + 64)) ||
  die "ulimit -n is $files: $max_ranks ranks need at least $((2 * max_ranks + 64)) (raise it: ulimit -n 65536)"
procs=$(ulimit -u)
[[ $procs == unlimited ]] || ((procs >= 8 * max_ranks)) ||
  die "ulimit -u is $procs: $max_ranks ranks with their threads need about $((8 * max_ranks))"
pids_max=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || echo max)
[[ $pids_max == max ]] || ((pids_max >= 8 * max_ranks)) ||
  die "this cgroup allows $pids_max tasks (pids.max): $max_ranks ranks with their threads need about $((8 * max_ranks))"
[[ -d /dev/shm ]] && stat -f /dev/shm >/dev/null || die "no /dev/shm to measure"

WORK=$(mktemp -d /tmp/compare_shm_memory.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if ((mpi)); then
  command -v mpirun >/dev/null && command -v mpicc >/dev/null ||
    die "no mpirun/mpicc: install Open MPI (apt-get install openmpi-bin libopenmpi-dev) or pass -M"
  timeout 300 mpicc -O2 -o "$WORK/mpi_allreduce" "$ROOT/bench/mpi_allreduce.c" || die "mpicc failed"
fi

# The sampler: prints "baseline_shm baseline_shmem peak_shm peak_shmem" (bytes) when
# it gets SIGTERM. The baseline is what was in use when it started.
cat >"$WORK/sampler.py" <<'EOF'
import os, signal, sys, time
interval = float(sys.argv[1]) / 1000.0
def now():
    st = os.statvfs("/dev/shm")
    shm = (st.f_blocks - st.f_bfree) * st.f_frsize
    shmem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                shmem = int(line.split()[1]) * 1024
                break
    return shm, shmem
base = now()
peak = list(base)
stop = False
def done(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, done)
print("ready", flush=True)
while not stop:
    s = now()
    peak = [max(a, b) for a, b in zip(peak, s)]
    time.sleep(interval)
s = now()
peak = [max(a, b) for a, b in zip(peak, s)]
print(base[0], base[1], peak[0], peak[1], flush=True)
EOF

# measure NAME N COMMAND...: runs COMMAND under the sampler; appends
# "NAME N base_shm base_shmem peak_shm peak_shmem seconds" to $WORK/rows.
measure() {
  local name=$1 n=$2 rc=0 start
  shift 2
  # Ahead of the ranks (nice -10 where allowed), so that a loaded machine still samples.
  local nice_sampler=()
  nice -n -10 true 2>/dev/null && nice_sampler=(nice -n -10)
  "${nice_sampler[@]}" "$PY" "$WORK/sampler.py" "$interval_ms" >"$WORK/sample.out" &
  local sampler=$!
  until [[ -s $WORK/sample.out ]]; do
    kill -0 "$sampler" 2>/dev/null || die "the sampler did not start"
    sleep 0.05
  done
  start=$(date +%s.%N)
  timeout -k 10 "$timeout_s" "$@" >"$WORK/run.out" 2>"$WORK/run.err" || rc=$?
  local elapsed
  elapsed=$("$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
  kill -TERM "$sampler"
  wait "$sampler" || die "the sampler failed"
  if ((rc != 0)); then
    local why="exit status $rc"
    ((rc == 124 || rc == 137)) && why="timed out after ${timeout_s} s"
    echo "compare_shm_memory: $name with $n ranks failed ($why); last lines of its output:" >&2
    tail -n 20 "$WORK/run.err" "$WORK/run.out" >&2
    exit 1
  fi
  case $name in
    mpi) "$PY" -c '
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
if not rows or any(int(r[2]) != 0 for r in rows):
    sys.exit("compare_shm_memory: mpi: wrong elements or no result: %s" % rows)
' "$WORK/run.out" ;;
    *) "$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not rows or any(r["wrong"] for r in rows):
    sys.exit("compare_shm_memory: %s: wrong elements or no result" % sys.argv[2])
' "$WORK/run.out" "$name" ;;
  esac
  echo "$name $n $(tail -n 1 "$WORK/sample.out") $elapsed" >>"$WORK/rows"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for n in $sizes; do
  for build in old new; do
    bin=$OLD
    [[ $build == new ]] && bin=$NEW
    echo "compare_shm_memory: $build, $n ranks" >&2
    measure "$build" "$n" env -u CHORUS_ALGO -u CHORUS_NODE_ID -u CHORUS_TRANSPORT "$bin" --np "$n" \
      --timeout "$timeout_s" -o allreduce -d f32 -r sum -b 8 -e 8 -n "$iters" -w "$warmup" -c 1 -m out --json
  done
  if ((mpi)); then
    echo "compare_shm_memory: Open MPI, $n ranks" >&2
    measure mpi "$n" mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 \
      --mca btl self,vader --mca oob_tcp_if_include lo -np "$n" "$WORK/mpi_allreduce" -b 8 -e 8 \
      -n "$iters" -w "$warmup"
  fi
done

"$PY" - "$WORK/rows" "$OLD" "$NEW" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import sys
path, old, new, before, after = sys.argv[1:]
runs = {}
for line in open(path):
    name, n, b_shm, b_shmem, p_shm, p_shmem, secs = line.split()
    runs[(name, int(n))] = (int(p_shm) - int(b_shm), int(p_shmem) - int(b_shmem), float(secs))
names = [x for x in ("old", "new", "mpi") if any(k[0] == x for k in runs)]
def mib(b):
    return f"{b / 2**20:.1f}"
print(f"# peak shared memory of an 8-byte allreduce run, MiB over what was in use before it;"
      f" old {old}, new {new}, mpi: Open MPI btl vader")
print(f"# /dev/shm: its tmpfs's blocks in use; Shmem: /proc/meminfo (all shared memory);"
      f" load before {before}, after {after}")
head = ["ranks"] + [f"{x} /dev/shm" for x in names] + [f"{x} Shmem" for x in names] + ["new/old", "new/mpi"][:len(names) - 1] + [f"{x} s" for x in names]
print(" ".join(f"{h:>14}" for h in head))
for n in sorted({k[1] for k in runs}):
    r = {x: runs[(x, n)] for x in names}
    cols = [str(n)] + [mib(r[x][0]) for x in names] + [mib(r[x][1]) for x in names]
    cols.append(f"{r['new'][0] / r['old'][0]:.4f}" if r["old"][0] > 0 else "-")
    if "mpi" in r:
        cols.append(f"{r['new'][0] / r['mpi'][0]:.1f}" if r["mpi"][0] > 0 else "-")
    cols += [f"{r[x][2]:.1f}" for x in names]
    print(" ".join(f"{c:>14}" for c in cols))
EOF
