#!/usr/bin/env bash
# Allreduce (f32 sum, local ranks) of chorus, Gloo and Open MPI, measured in one run
# on this machine and printed side by side, with memcpy's bandwidth at each size.
#
# Usage: bench/compare_allreduce.sh [-T tcp|shm] [-m in|out] [-p RANKS] [-b MINBYTES]
#            [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-L LARGE] [-N ITERS_LARGE]
#            [-W WARMUP_LARGE] [-t TIMEOUT_S] [-R REPEATS] [-c CSV] [-P PNG]
#   -T        tcp: chorus and Open MPI over TCP on 127.0.0.1 (btl self,tcp);
#             shm: both through shared memory (chorus's shm transport, Open MPI's
#             vader btl), and chorus once more on buffers from chorus::allocate_shared
#             ("chorus shared": its direct path). Gloo has only TCP and runs over
#             127.0.0.1 in both (default tcp)
#   -m        in: chorus and Open MPI (MPI_IN_PLACE) reduce in place, as DDP does;
#             out: out of place, from a send buffer into a receive buffer (default in)
#   -p        ranks, all on this machine                 (default 2)
#   -b/-e/-f  sizes, K/M/G suffixes allowed            (default 8, 256M, 2)
#   -n/-w     timed and warm-up iterations per size   (default 20, 5)
#   -L        sizes above this use -N/-W instead       (default 32M)
#   -N/-W     iterations for those large sizes        (default ceil(n/4), ceil(w/5))
#   -t        deadline of each program run, seconds   (default 600)
#   -R        runs of the whole set, round robin over the programs; each time is the
#             best of the runs, against load from other processes (default 1)
#   -c        also write the table as CSV: library,transport,ranks,bytes,time_us,
#             busbw_gbs,mode, one row per library and size (library chorus,
#             chorus-shared, gloo, mpi, or memcpy: 1 rank, its GB/s as busbw_gbs;
#             memcpy-cross-core: 2 threads, likewise)
#   -P        also draw busbw against size (scripts/plot busbw) into this PNG
# Every program gets the same sizes and iteration counts. Time is the average per op
# of back-to-back ops, max over the ranks; busbw = size/time * 2(n-1)/n (nccl-tests).
# In place every op reduces what the one before wrote (no input is restored between
# timed ops); torch's all_reduce (Gloo) only runs in place, so it does in both modes.
# memcpy: one process copying the size between two buffers back to back
# (bench/memcpy_bench.cc), GB/s = size/time: the cost of moving the bytes once, on
# this machine at this moment; cs/memcpy = chorus shared's busbw over it. With -T shm
# also xcore: a copy from a buffer that another core has just written (memcpy-bench
# -x 1), the rate at which 2 ranks on 2 cores take each other's bytes, which bounds
# their allreduce's busbw; cs/xcore = chorus shared's busbw over it.
# Each program also checks its results (#wrong elements must be 0).
# Environment: CHORUS_BENCH=path uses that binary, and the memcpy-bench beside it,
# instead of building build/bin/chorus-bench and build/bin/memcpy-bench. Exits
# non-zero when a program fails, times out or returns wrong results.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly PY=/usr/bin/python3   # Debian's python, the one with python3-torch
# shellcheck source=bench/processes.sh
source "$ROOT/bench/processes.sh"
RANKS=2 TRANSPORT=tcp MODE=in

min_bytes=8 max_bytes=256M factor=2 iters=20 warmup=5 large=32M timeout_s=600 repeats=1
iters_large="" warmup_large="" csv="" png=""

die() { echo "compare_allreduce: $*" >&2; exit 1; }

# Prints the usage lines of the header; exits with $1.
usage() { sed -n '5,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }

# Bytes of "N", "NK", "NM" or "NG" (powers of 1024); exits 2 naming the option.
to_bytes() {
  local opt=$1 text=$2
  [[ $text =~ ^([0-9]+)([KkMmGg]?)$ ]] || { echo "compare_allreduce: bad value '$text' for $opt" >&2; exit 2; }
  local n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]^^}
  case $unit in K) n=$((n << 10)) ;; M) n=$((n << 20)) ;; G) n=$((n << 30)) ;; esac
  echo "$n"
}

parse_args() {
  local opt
  while getopts "T:m:p:b:e:f:n:w:L:N:W:t:R:c:P:h" opt; do
    case $opt in
      T) TRANSPORT=$OPTARG ;; m) MODE=$OPTARG ;; p) RANKS=$OPTARG ;;
      b) min_bytes=$OPTARG ;; e) max_bytes=$OPTARG ;; f) factor=$OPTARG ;;
      n) iters=$OPTARG ;; w) warmup=$OPTARG ;; L) large=$OPTARG ;;
      N) iters_large=$OPTARG ;; W) warmup_large=$OPTARG ;; t) timeout_s=$OPTARG ;;
      R) repeats=$OPTARG ;; c) csv=$OPTARG ;; P) png=$OPTARG ;; h) usage 0 ;;
      *) usage 2 ;;
    esac
  done
  min_bytes=$(to_bytes -b "$min_bytes"); max_bytes=$(to_bytes -e "$max_bytes")
  large=$(to_bytes -L "$large"); factor=$(to_bytes -f "$factor")
  iters=$(to_bytes -n "$iters"); warmup=$(to_bytes -w "$warmup")
  timeout_s=$(to_bytes -t "$timeout_s"); repeats=$(to_bytes -R "$repeats")
  iters_large=$(to_bytes -N "${iters_large:-$(( (iters + 3) / 4 ))}")
  warmup_large=$(to_bytes -W "${warmup_large:-$(( (warmup + 4) / 5 ))}")
  [[ $TRANSPORT == tcp || $TRANSPORT == shm ]] || { echo "compare_allreduce: -T must be tcp or shm" >&2; exit 2; }
  [[ $MODE == in || $MODE == out ]] || { echo "compare_allreduce: -m must be in or out" >&2; exit 2; }
  RANKS=$(to_bytes -p "$RANKS")
  ((RANKS >= 2)) || { echo "compare_allreduce: -p must be >= 2" >&2; exit 2; }
  ((repeats >= 1)) || { echo "compare_allreduce: -R must be >= 1" >&2; exit 2; }
  ((factor >= 2)) || { echo "compare_allreduce: -f must be >= 2" >&2; exit 2; }
  ((iters >= 1 && iters_large >= 1)) || { echo "compare_allreduce: -n and -N must be >= 1" >&2; exit 2; }
  ((min_bytes >= 4 && min_bytes <= max_bytes)) || { echo "compare_allreduce: need 4 <= -b <= -e" >&2; exit 2; }
  # Output files are checked now, not after the runs.
  if [[ -n $csv ]]; then
    : 2>/dev/null >"$csv" || { echo "compare_allreduce: cannot write the -c file $csv" >&2; exit 2; }
    csv=$(realpath "$csv")
  fi
  if [[ -n $png ]]; then
    [[ -d $(dirname "$png") ]] || { echo "compare_allreduce: cannot write the -P file $png (no directory $(dirname "$png"))" >&2; exit 2; }
    png=$(realpath -m "$png")
  fi
}

# Installs the Debian packages that are missing (none when all are present), with the
# project's own installer.
ensure_packages() {
  "$ROOT/scripts/install-deps.sh" openmpi-bin libopenmpi-dev python3-torch || die "installing the benchmark's packages failed"
}

build_programs() {
  if [[ -z ${CHORUS_BENCH:-} ]]; then
    CHORUS_BENCH=$ROOT/build/bin/chorus-bench
    [[ -f $ROOT/build/CMakeCache.txt ]] ||
      timeout 600 cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >&2 ||
      die "cmake configure failed"
    # memcpy-bench is a target of bench/, which needs libtorch (CMakeLists.txt).
    timeout 1800 cmake --build "$ROOT/build" -j "$(nproc)" --target chorus-bench memcpy-bench >&2 ||
      die "building chorus-bench and memcpy-bench failed"
  fi
  MEMCPY_BENCH=$(dirname "$CHORUS_BENCH")/memcpy-bench
  [[ -x $CHORUS_BENCH ]] || die "no chorus-bench at $CHORUS_BENCH"
  [[ -x $MEMCPY_BENCH ]] || die "no memcpy-bench at $MEMCPY_BENCH (beside chorus-bench)"
  timeout 300 mpicc -O2 -o "$WORK/mpi_allreduce" "$ROOT/bench/mpi_allreduce.c" || die "mpicc failed"
  timeout 300 $PY -c 'import torch.distributed as d; assert d.is_available()' ||
    die "$PY cannot import torch.distributed (python3-torch)"
}

free_port() {
  timeout 60 $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Reports a failed run ($1 = library, $2 = exit status, $3 = its log) and exits.
fail_run() {
  local why="exit status $2"
  ((${2} == 124 || ${2} == 137)) && why="timed out after ${timeout_s} s"
  echo "compare_allreduce: $1 failed ($why); last lines of its output:" >&2
  tail -n 20 "$3" >&2
  exit 1
}

# run_LIB BAND_ARGS... : appends "size time_us wrong" (or JSON) lines to $WORK/LIB.out.
# chorus_bench LIB ARGS...: chorus-bench in -m's mode, as LIB.
chorus_bench() {
  local lib=$1 rc=0
  shift
  env -u CHORUS_ALGO -u CHORUS_NODE_ID -u CHORUS_SHM_DIRECT CHORUS_TRANSPORT="$TRANSPORT" \
    timeout -k 10 "$timeout_s" "$CHORUS_BENCH" --np "$RANKS" -o allreduce -d f32 -r sum -c 1 \
    --json -m "$MODE" "$@" >>"$WORK/$lib.out" 2>>"$WORK/$lib.log" || rc=$?
  ((rc == 0)) || fail_run "$lib" "$rc" "$WORK/$lib.log"
}

run_chorus() { chorus_bench chorus "$@"; }
run_shared() { chorus_bench shared --buffers shared "$@"; }

# copy_bench NAME ARGS...: memcpy-bench with ARGS, its output in $WORK/NAME.out.
copy_bench() {
  local name=$1 rc=0
  shift
  timeout -k 10 "$timeout_s" "$MEMCPY_BENCH" "$@" >>"$WORK/$name.out" 2>>"$WORK/$name.log" || rc=$?
  ((rc == 0)) || fail_run "$name" "$rc" "$WORK/$name.log"
}

run_memcpy() { copy_bench memcpy "$@"; }
run_xcore() { copy_bench xcore -x 1 "$@"; }

run_mpi() {
  local rc=0
  local btl=(--mca btl self,tcp --mca btl_tcp_if_include lo)
  [[ $TRANSPORT == shm ]] && btl=(--mca btl self,vader)
  timeout -k 10 "$timeout_s" mpirun --allow-run-as-root --oversubscribe --mca pml ob1 \
    "${btl[@]}" --mca oob_tcp_if_include lo \
    -np "$RANKS" "$WORK/mpi_allreduce" -m "$MODE" "$@" >>"$WORK/mpi.out" 2>>"$WORK/mpi.log" || rc=$?
  ((rc == 0)) || fail_run mpi "$rc" "$WORK/mpi.log"
}

# Starts one python process per rank; when one fails the others are stopped.
run_gloo() {
  local port rank pids=()
  port=$(free_port)
  for ((rank = 0; rank < RANKS; rank++)); do
    RANK=$rank WORLD_SIZE=$RANKS MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=lo \
      OMP_NUM_THREADS=1 timeout -k 10 "$timeout_s" $PY "$ROOT/bench/torch_allreduce.py" "$@" \
      >>"$WORK/gloo.out.$rank" 2>>"$WORK/gloo.log" &
    pids+=($!)
  done
  wait_all_or_fail gloo "$WORK/gloo.log"
  cat "$WORK/gloo.out.0" >>"$WORK/gloo.out"
  rm -f "$WORK"/gloo.out.*
}

# Runs every program over the sizes up to -L, then over the larger ones.
run_all() {
  local size=$min_bytes first_large=0 last_small=0
  while ((size <= max_bytes)); do
    if ((size <= large)); then last_small=$size; elif ((first_large == 0)); then first_large=$size; fi
    size=$((size * factor))
  done
  local lib run
  for ((run = 1; run <= repeats; run++)); do
    for lib in "${LIBS[@]}"; do
      echo "compare_allreduce: running $lib ($run/$repeats)" >&2
      ((last_small == 0)) || "run_$lib" -b "$min_bytes" -e "$last_small" -f "$factor" -n "$iters" -w "$warmup"
      ((first_large == 0)) || "run_$lib" -b "$first_large" -e "$max_bytes" -f "$factor" \
        -n "$iters_large" -w "$warmup_large"
    done
  done
}

# Joins the outputs by size and prints the table; exits 1 on missing sizes or wrong
# results.
print_table() {
  $PY - "$WORK" "$RANKS" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$TRANSPORT" "$MODE" \
    "$1" "${LIBS[@]}" <<'EOF'
import csv, json, sys
work, ranks, load_before, load_after = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
transport, mode, csv_path, libs = sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8:]
shared = "shared" in libs

def rows(lib):
    """{size: (best time_us over the runs, wrong elements summed over the runs)}"""
    out = {}
    for line in open(f"{work}/{lib}.out"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            r = json.loads(line)
            if r["mode"] != mode:
                sys.exit(f"compare_allreduce: {lib}: a row of mode {r['mode']}, not {mode}")
            size, time_us, wrong = r["size"], r["time_us"], r["wrong"]
        else:
            size, time_us, wrong = line.split()
        size, time_us, wrong = int(size), float(time_us), int(wrong)
        best, bad = out.get(size, (time_us, 0))
        out[size] = (min(best, time_us), bad + wrong)
    return out

data = {lib: rows(lib) for lib in libs}
sizes = sorted(set().union(*data.values()))
missing = [(lib, s) for lib in libs for s in sizes if s not in data[lib]]
if missing:
    sys.exit(f"compare_allreduce: missing results: {missing[:5]}")
factor = 2 * (ranks - 1) / ranks
busbw = lambda size, us: size / (us * 1e3) * factor  # GB/s
gbs = lambda size, us: size / (us * 1e3) if us > 0 else float("inf")  # memcpy: bytes copied per second
copies = ("memcpy", "xcore")
allreduces = [lib for lib in libs if lib not in copies]
xcore = "xcore" in libs
short = {"chorus": "chorus", "shared": "c_shared", "gloo": "gloo", "mpi": "mpi"}
head = (["size"] + [f"{short[l]}_us" for l in allreduces] + [f"{short[l]}_bw" for l in allreduces]
        + ["memcpy_bw", "c/gloo_bw", "c/mpi_bw", "c/mpi_lat"]
        + (["xcore_bw"] if xcore else [])
        + (["cs/mpi_bw", "cs/memcpy"] if shared else []) + (["cs/xcore"] if shared and xcore else []))
where = ("TCP over 127.0.0.1" if transport == "tcp" else
         "chorus and Open MPI (vader) in shared memory, Gloo over TCP on 127.0.0.1")
layout = ("in place (Open MPI: MPI_IN_PLACE)" if mode == "in" else
          "out of place (Gloo: in place, its only form)")
print(f"# allreduce f32 sum, {ranks} ranks, {layout}, {where}")
print("# time in us (avg per op, max over ranks); busbw in GB/s; memcpy_bw: GB/s of one "
      "process copying the size (memcpy-bench); ratios of busbw, latency c/mpi_lat")
if shared:
    print("# c_shared: chorus on buffers from chorus::allocate_shared (its direct path)")
if xcore:
    print("# xcore_bw: GB/s of a copy from a buffer that another core just wrote (memcpy-bench -x 1), "
          "the rate at which ranks on 2 cores can take each other's bytes")
print("# c/gloo_bw, c/mpi_bw > 1 and c/mpi_lat < 1 (sizes up to 64 KiB) favour chorus")
print(f"# load average (1/5/15 min) before: {load_before}, after: {load_after}")
print("".join(f"{h:>12}" for h in head))
for s in sizes:
    t = {lib: data[lib][s][0] for lib in libs}
    bw = {lib: busbw(s, t[lib]) for lib in allreduces}
    copy = gbs(s, t["memcpy"])
    lat = f"{t['chorus'] / t['mpi']:12.2f}" if s <= 64 * 1024 else f"{'-':>12}"
    line = (f"{s:>12}" + "".join(f"{t[l]:12.1f}" for l in allreduces)
            + "".join(f"{bw[l]:12.3f}" for l in allreduces) + f"{copy:12.3f}"
            + f"{bw['chorus'] / bw['gloo']:12.2f}{bw['chorus'] / bw['mpi']:12.2f}" + lat)
    cross = gbs(s, t["xcore"]) if xcore else None
    if xcore:
        line += f"{cross:12.3f}"
    if shared:
        line += f"{bw['shared'] / bw['mpi']:12.2f}{bw['shared'] / copy:12.2f}"
    if shared and xcore:
        line += f"{bw['shared'] / cross:12.2f}"
    print(line)
if csv_path:
    names = {"shared": "chorus-shared"}
    with open(csv_path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(("library", "transport", "ranks", "bytes", "time_us", "busbw_gbs", "mode"))
        for lib in libs:
            for s in sizes:
                us = data[lib][s][0]
                if lib in copies:
                    row = ("memcpy" if lib == "memcpy" else "memcpy-cross-core", "memory", 1 if lib == "memcpy" else 2,
                           s, f"{us:.3f}", f"{gbs(s, us):.6f}", "copy")
                else:
                    row = (names.get(lib, lib), "tcp" if lib == "gloo" else transport, ranks, s,
                           f"{us:.3f}", f"{busbw(s, us):.6f}", "in" if lib == "gloo" else mode)
                out.writerow(row)
bad = {lib: sum(w for _, w in data[lib].values()) for lib in libs}
if any(bad.values()):
    sys.exit(f"compare_allreduce: wrong elements: {bad}")
EOF
}

main() {
  parse_args "$@"
  # The programs, in the order of each round and of the table's columns.
  LIBS=(chorus gloo mpi memcpy)
  [[ $TRANSPORT == shm ]] && LIBS=(chorus shared gloo mpi memcpy xcore)
  LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
  ensure_packages
  WORK=$(mktemp -d /tmp/compare_allreduce.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
  build_programs
  run_all
  local table_csv=$csv  # -P without -c: scripts/plot reads a CSV among the work files
  [[ -n $table_csv || -z $png ]] || table_csv=$WORK/busbw.csv
  print_table "$table_csv"
  if [[ -n $png ]]; then
    "$ROOT/scripts/plot" busbw "$table_csv" --out "$png" >/dev/null || die "scripts/plot busbw failed"
    echo "compare_allreduce: drew $png" >&2
  fi
}

main "$@"
