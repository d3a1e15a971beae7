#!/usr/bin/env bash
# chorus, Gloo and Open MPI across "hosts" of a namespace cluster (scripts/netns-cluster.sh:
# one network namespace per host, joined by a bridge), over an unshaped veth and over
# links shaped by tbf, measured in one run and printed side by side: allreduce (f32 sum,
# in place) on 2 hosts x 1 and 2 hosts x 2 ranks, and the seed job (chorus-mnist against
# PyTorch DDP over gloo). Needs root.
#
# Usage: bench/compare_cluster.sh [-q] [-r RATES] [-p PER_HOST] [-b MIN] [-e MAX] [-f F]
#            [-n ITERS] [-w WARMUP] [-L LARGE] [-N ITERS_LARGE] [-s STEPS] [-x PARTS]
#            [-k LOCKFILE] [-t TIMEOUT_S]
#   -q      quick: sizes 1K to 64M by 4, 10 iterations (3 above -L), 20 seed-job steps
#   -r      link rates, comma-separated; "none" is the unshaped veth (default none,1gbit)
#   -p      ranks per host, comma-separated (default 1,2)
#   -b/-e/-f  allreduce sizes, K/M/G suffixes        (default 8, 256M, 2)
#   -n/-w   timed and warm-up iterations per size    (default 20, 3)
#   -L/-N   sizes above L get N timed iterations and 1 warm-up (default 4M, 5)
#   -s      timed steps of the seed job, after 5 warm-up steps (default 40)
#   -x      parts: allreduce, mnist or both, comma-separated (default allreduce,mnist)
#   -k      hold this lock file exclusively (flock -x) during each program's run only
#           (all its sizes), on a machine that other jobs share
#   -t      deadline of each program run, seconds   (default 600)
# Programs: chorus-bench under chorusrun (CHORUS_ALGO ring; also hier with more than
# one rank per host), bench/torch_allreduce.py on gloo, bench/mpi_allreduce.c under
# mpirun (btl self,vader,tcp: shared memory inside a host, TCP between hosts; mpirun
# starts its daemons on the other hosts through an rsh agent that runs them with
# netns-cluster.sh exec). busbw = size/time * 2(n-1)/n over the n ranks (nccl-tests);
# link = size/time * 2(h-1)/h over the h hosts, divided by the link rate: the share of
# each host's link (one direction) the allreduce keeps busy, the figure the issue's
# targets are about (it is busbw's fraction of the rate when every host has one rank).
# Exits non-zero when a program fails, times out or returns wrong results.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly PY=/usr/bin/python3   # Debian's python, the one with python3-torch
readonly CLUSTER=$ROOT/scripts/netns-cluster.sh
readonly HOSTS=2 MASTER=10.77.0.1

rates=none,1gbit per_host=1,2 min_bytes=8 max_bytes=256M factor=2 iters=20 warmup=3
large=4M iters_large=5 steps=40 parts=allreduce,mnist lock="" timeout_s=600

die() { echo "compare_cluster: $*" >&2; exit 1; }
usage() { sed -n '8,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "$1"; }

to_bytes() {
  [[ $2 =~ ^([0-9]+)([KkMmGg]?)$ ]] || { echo "compare_cluster: bad value '$2' for $1" >&2; exit 2; }
  local n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]^^} in K) n=$((n << 10)) ;; M) n=$((n << 20)) ;; G) n=$((n << 30)) ;; esac
  echo "$n"
}

parse_args() {
  local opt
  while getopts "qr:p:b:e:f:n:w:L:N:s:x:k:t:h" opt; do
    case $opt in
      q) min_bytes=1K max_bytes=64M factor=4 iters=10 iters_large=3 steps=20 ;;
      r) rates=$OPTARG ;; p) per_host=$OPTARG ;; b) min_bytes=$OPTARG ;; e) max_bytes=$OPTARG ;;
      f) factor=$OPTARG ;; n) iters=$OPTARG ;; w) warmup=$OPTARG ;; L) large=$OPTARG ;;
      N) iters_large=$OPTARG ;; s) steps=$OPTARG ;; x) parts=$OPTARG ;; k) lock=$OPTARG ;;
      t) timeout_s=$OPTARG ;; h) usage 0 ;; *) usage 2 ;;
    esac
  done
  min_bytes=$(to_bytes -b "$min_bytes") max_bytes=$(to_bytes -e "$max_bytes")
  factor=$(to_bytes -f "$factor") large=$(to_bytes -L "$large")
  iters=$(to_bytes -n "$iters") warmup=$(to_bytes -w "$warmup")
  iters_large=$(to_bytes -N "$iters_large") steps=$(to_bytes -s "$steps") timeout_s=$(to_bytes -t "$timeout_s")
  ((factor >= 2 && iters >= 1 && iters_large >= 1 && steps >= 1)) || { echo "compare_cluster: -f must be >= 2, -n, -N and -s >= 1" >&2; exit 2; }
  ((min_bytes >= 4 && min_bytes <= max_bytes)) || { echo "compare_cluster: need 4 <= -b <= -e" >&2; exit 2; }
  IFS=, read -ra RATES <<<"$rates"
  IFS=, read -ra PER_HOST <<<"$per_host"
  IFS=, read -ra PARTS <<<"$parts"
  local r
  for r in "${RATES[@]}"; do
    [[ $r == none || ${r,,} =~ ^[0-9]+(k|m|g)?bit$ ]] || { echo "compare_cluster: bad rate '$r' (none, 1gbit, 500mbit)" >&2; exit 2; }
  done
  for r in "${PER_HOST[@]}"; do [[ $r =~ ^[1-8]$ ]] || { echo "compare_cluster: bad -p value '$r' (1..8)" >&2; exit 2; }; done
  for r in "${PARTS[@]}"; do [[ $r == allreduce || $r == mnist ]] || { echo "compare_cluster: bad part '$r'" >&2; exit 2; }; done
  [[ -z $lock || -e $lock ]] || { echo "compare_cluster: no lock file $lock" >&2; exit 2; }
}

ensure_ready() {
  ((EUID == 0)) || die "needs root (network namespaces)"
  "$ROOT/scripts/install-deps.sh" openmpi-bin libopenmpi-dev python3-torch python3-torchvision dataset-fashion-mnist ||
    die "installing the benchmark's packages failed"
  local p
  for p in chorusrun chorus-bench chorus-mnist; do
    [[ -x $ROOT/build/bin/$p ]] || die "no build/bin/$p (cmake --build build --target chorusrun chorus-bench chorus-mnist)"
  done
  timeout 300 mpicc -O2 -o "$WORK/mpi_allreduce" "$ROOT/bench/mpi_allreduce.c" || die "mpicc failed"
  # Open MPI's rsh agent: "AGENT HOST COMMAND" runs COMMAND on HOST (10.77.0.I+1 is host I).
  cat >"$WORK/rsh_agent" <<EOF
#!/bin/sh
host=\$1; shift
exec "$CLUSTER" exec "\$((\${host##*.} - 1))" /bin/sh -c "\$*"
EOF
  chmod +x "$WORK/rsh_agent"
  # Every config computes with the BLAS kernels chorus-mnist picks (compare_mnist.sh).
  local core
  core=$(OPENBLAS_VERBOSE=2 timeout 60 "$ROOT/build/bin/chorus-mnist" --help 2>&1 >/dev/null | sed -n 's/^Core: //p' | tail -n 1)
  [[ -z $core || -n ${OPENBLAS_CORETYPE:-} ]] || export OPENBLAS_CORETYPE=$core
}

# Reports a failed run ($1 = what, $2 = status, $3 = log) and exits.
fail_run() {
  local why="exit status $2"
  ((${2} == 124 || ${2} == 137)) && why="timed out after ${timeout_s} s"
  echo "compare_cluster: $1 failed ($why); last lines of its output:" >&2
  tail -n 20 "$3" >&2
  exit 1
}

PORT=29600

# -k's lock, held for one program's run (both bands of sizes): each hold is under 5 min
# at 1 Gbit/s, and other users of the machine get it between programs.
lock_take() { [[ -z $lock ]] || { exec 9>>"$lock"; flock -x 9; }; }
lock_drop() { [[ -z $lock ]] || exec 9>&-; }

# on_hosts WHAT LOG FUNC: runs "FUNC HOST" for every host at once (FUNC starts its
# processes there with in_host); when one fails the others are stopped and the run
# fails naming WHAT.
on_hosts() {
  local what=$1 log=$2 func=$3 h pids=() remaining pid rc=0
  PORT=$((PORT + 1))
  for ((h = 0; h < HOSTS; h++)); do
    "$func" "$h" >>"$log" 2>&1 &
    pids+=($!)
  done
  # Polled rather than `wait -n -p`, which left its variable unset here when a host's
  # part (mpirun_on on host 1) had ended at once. Each part has its own deadline.
  while ((${#pids[@]} > 0)); do
    remaining=()
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then remaining+=("$pid"); else wait "$pid" || rc=$?; fi
    done
    pids=("${remaining[@]}")
    if ((rc != 0)); then
      ((${#pids[@]} == 0)) || kill "${pids[@]}" 2>/dev/null || true
      wait "${pids[@]}" 2>/dev/null || true
      break
    fi
    ((${#pids[@]} == 0)) || sleep 0.1
  done
  ((rc == 0)) || fail_run "$what" "$rc" "$log"
}

# in_host H COMMAND...: COMMAND on host H with the deadline.
in_host() {
  local h=$1
  shift
  timeout -k 10 "$timeout_s" "$CLUSTER" exec "$h" env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$@"
}

# Sets BANDS: the size and iteration options of the two bands, up to -L and above.
band() {
  local size=$min_bytes last_small=0 first_large=0
  while ((size <= max_bytes)); do
    if ((size <= large)); then last_small=$size; elif ((first_large == 0)); then first_large=$size; fi
    size=$((size * factor))
  done
  BANDS=()
  ((last_small == 0)) || BANDS+=("-b $min_bytes -e $last_small -f $factor -n $iters -w $warmup")
  ((first_large == 0)) || BANDS+=("-b $first_large -e $max_bytes -f $factor -n $iters_large -w 1")
}

# One chorusrun per host: HOST, then its program and arguments (TAG P and the rest set
# by the caller: RUN_TAG, RUN_P, RUN_ENV).
chorusrun_on() {
  local h=$1
  shift
  # shellcheck disable=SC2086
  in_host "$h" $RUN_ENV "$ROOT/build/bin/chorusrun" --nnodes "$HOSTS" --node-rank "$h" \
    --master-addr "$MASTER" --master-port "$PORT" --nproc-per-node "$RUN_P" \
    --local-addr "10.77.0.$((h + 1))" "$@" >"$WORK/$RUN_TAG.h$h.out"
}

# One python process per rank of host HOST: RUN_SCRIPT with RUN_ARGS.
python_on() {
  local h=$1 l pids=() rc=0 pid
  for ((l = 0; l < RUN_P; l++)); do
    # shellcheck disable=SC2086
    in_host "$h" RANK=$((h * RUN_P + l)) LOCAL_RANK=$l WORLD_SIZE=$((HOSTS * RUN_P)) \
      MASTER_ADDR=$MASTER MASTER_PORT=$PORT GLOO_SOCKET_IFNAME=eth0 \
      "$PY" "$RUN_SCRIPT" $RUN_ARGS >"$WORK/$RUN_TAG.h$h.l$l.out" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  return "$rc"
}

bench_on() { chorusrun_on "$1" "$ROOT/build/bin/chorus-bench" -o allreduce -d f32 -r sum -c 1 --json -m in $RUN_ARGS; }
mnist_on() { chorusrun_on "$1" "$ROOT/build/bin/chorus-mnist" $(mnist_args); }
mnist_args() { echo "--max-steps $((5 + steps)) --warmup-steps 5 --threads 1 --workers 1"; }

# run_chorus TAG P ALGO: chorus-bench on HOSTS x P ranks with CHORUS_ALGO=ALGO.
run_chorus() {
  local b
  RUN_TAG=$1 RUN_P=$2 RUN_ENV="CHORUS_ALGO=$3"
  lock_take
  for b in "${BANDS[@]}"; do
    RUN_ARGS=$b
    on_hosts "chorus $3 ($1)" "$WORK/$1.log" bench_on
    grep -h '^{' "$WORK/$1.h0.out" >>"$WORK/$1.out" || fail_run "chorus $3 ($1): no rows" 1 "$WORK/$1.log"
  done
  lock_drop
}

# run_gloo TAG P: bench/torch_allreduce.py on gloo, one process per rank.
run_gloo() {
  local b
  RUN_TAG=$1 RUN_P=$2 RUN_SCRIPT=$ROOT/bench/torch_allreduce.py
  lock_take
  for b in "${BANDS[@]}"; do
    RUN_ARGS=$b
    on_hosts "gloo ($1)" "$WORK/$1.log" python_on
    grep -hv '^#' "$WORK/$1.h0.l0.out" >>"$WORK/$1.out"
  done
  lock_drop
}

# run_mpi TAG P: mpirun from host 0, P slots per host, daemons started by the agent.
mpirun_on() {
  ((${1} == 0)) || return 0
  # shellcheck disable=SC2086
  in_host 0 mpirun --allow-run-as-root --hostfile "$WORK/hostfile" -np $((HOSTS * RUN_P)) \
    --mca plm_rsh_agent "$WORK/rsh_agent" --mca pml ob1 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    "$WORK/mpi_allreduce" -m in $RUN_ARGS >>"$WORK/$RUN_TAG.out"
}

run_mpi() {
  local b h
  RUN_TAG=$1 RUN_P=$2
  : >"$WORK/hostfile"
  for ((h = 0; h < HOSTS; h++)); do echo "10.77.0.$((h + 1)) slots=$2" >>"$WORK/hostfile"; done
  lock_take
  for b in "${BANDS[@]}"; do
    RUN_ARGS=$b
    on_hosts "mpi ($1)" "$WORK/$1.log" mpirun_on
  done
  lock_drop
}

# The seed job: chorus-mnist under chorusrun, and bench/pytorch_ddp_mnist.py on gloo.
run_mnist_chorus() {
  RUN_TAG=$1 RUN_P=$2 RUN_ENV=""
  lock_take
  on_hosts "chorus seed job ($1)" "$WORK/$1.log" mnist_on
  lock_drop
  grep -m1 -h '^{' "$WORK/$1.h0.out" >>"$WORK/$1.out" || fail_run "chorus seed job ($1): no JSON" 1 "$WORK/$1.log"
}

run_mnist_pytorch() {
  RUN_TAG=$1 RUN_P=$2 RUN_SCRIPT=$ROOT/bench/pytorch_ddp_mnist.py RUN_ARGS=$(mnist_args)
  lock_take
  on_hosts "PyTorch seed job ($1)" "$WORK/$1.log" python_on
  lock_drop
  grep -m1 -h '^{' "$WORK/$1.h0.l0.out" >>"$WORK/$1.out" || fail_run "PyTorch seed job ($1): no JSON" 1 "$WORK/$1.log"
}

# One link rate: its cluster, every part on it, the cluster removed.
run_rate() {
  local rate=$1 p args=(up "$HOSTS")
  [[ $rate == none ]] || args+=(--rate "$rate")
  CHORUS_NETNS_ID=$("$CLUSTER" "${args[@]}") || die "netns-cluster.sh ${args[*]} failed"
  export CHORUS_NETNS_ID
  CLUSTER_UP=$CHORUS_NETNS_ID
  for p in "${PER_HOST[@]}"; do
    if [[ " ${PARTS[*]} " == *" allreduce "* ]]; then
      echo "compare_cluster: allreduce, link $rate, $HOSTS x $p" >&2
      run_chorus "ar.$rate.$p.ring" "$p" ring
      ((p == 1)) || run_chorus "ar.$rate.$p.hier" "$p" hier
      run_gloo "ar.$rate.$p.gloo" "$p"
      run_mpi "ar.$rate.$p.mpi" "$p"
    fi
    if [[ " ${PARTS[*]} " == *" mnist "* ]]; then
      echo "compare_cluster: seed job, link $rate, $HOSTS x $p" >&2
      run_mnist_chorus "mn.$rate.$p.chorus" "$p"
      run_mnist_pytorch "mn.$rate.$p.pytorch" "$p"
    fi
  done
  "$CLUSTER" down
  CLUSTER_UP=""
}

# Joins the outputs and prints the tables; exits 1 on missing sizes or wrong results.
print_tables() {
  $PY - "$WORK" "$HOSTS" "${RATES[*]}" "${PER_HOST[*]}" "${PARTS[*]}" "$LOAD_BEFORE" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, os, re, sys
work, hosts = sys.argv[1], int(sys.argv[2])
rates, per_host, parts = [a.split() for a in sys.argv[3:6]]
load_before, load_after = sys.argv[6:8]
KIB, MIB = 1 << 10, 1 << 20

def rate_gbs(rate):  # tc's decimal units, in GB/s
    m = re.fullmatch(r"(\d+)(k|m|g)?bit", rate.lower())
    return int(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8e9

def rows(tag):
    out = {}
    for line in open(f"{work}/{tag}.out"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            r = json.loads(line)
            size, us, wrong = r["size"], r["time_us"], r["wrong"] or 0
        else:
            size, us, wrong = line.split()[:3]
        out[int(size)] = (float(us), int(wrong))
    return out

bad, verdicts = [], []
print(f"# load average (1/5/15 min) before: {load_before}, after: {load_after}")
if "allreduce" in parts:
    for rate in rates:
        for p in map(int, per_host):
            n = hosts * p
            libs = ["ring"] + (["hier"] if p > 1 else []) + ["gloo", "mpi"]
            data = {l: rows(f"ar.{rate}.{p}.{l}") for l in libs}
            sizes = sorted(set().union(*data.values()))
            miss = [(l, s) for l in libs for s in sizes if s not in data[l]]
            if miss:
                sys.exit(f"compare_cluster: missing results: {miss[:5]}")
            bad += [f"{l} {rate} {p}: {data[l][s][1]} wrong" for l in libs for s in sizes if data[l][s][1]]
            link = None if rate == "none" else rate_gbs(rate)
            chor = [l for l in libs if l in ("ring", "hier")]
            print(f"\n# allreduce f32 sum in place, {hosts} hosts x {p} rank(s), link "
                  f"{'unshaped veth' if link is None else rate}; time us (avg per op, max over "
                  f"ranks); busbw GB/s over the {n} ranks" +
                  ("" if link is None else f"; *_link: size/time*2(h-1)/h over the {hosts} hosts "
                   f"as a fraction of {rate} ({link:.3f} GB/s)"))
            head = (["size"] + [f"{l}_us" for l in libs] + [f"{l}_bw" for l in libs]
                    + ([] if link is None else [f"{c}_link" for c in chor] + ["mpi_link"])
                    + [f"{c}/{o}" for c in chor for o in ("gloo", "mpi")])
            print("".join(f"{h:>11}" for h in head))
            for s in sizes:
                t = {l: data[l][s][0] for l in libs}
                bw = {l: s / (t[l] * 1e3) * 2 * (n - 1) / n for l in libs}
                hostbw = {l: s / (t[l] * 1e3) * 2 * (hosts - 1) / hosts for l in libs}
                line = f"{s:>11}" + "".join(f"{t[l]:11.1f}" for l in libs) + "".join(f"{bw[l]:11.4f}" for l in libs)
                if link is not None:
                    line += "".join(f"{hostbw[l] / link:11.3f}" for l in chor + ["mpi"])
                line += "".join(f"{bw[c] / bw[o]:11.2f}" for c in chor for o in ("gloo", "mpi"))
                print(line)
            if link is None:
                continue
            for c in chor:
                t = lambda lib, s: data[lib][s][0]
                low = [f"{s}: {s / (t(c, s) * 1e3) * 2 * (hosts - 1) / hosts / link:.3f}"
                       for s in sizes if s >= MIB and s / (t(c, s) * 1e3) * 2 * (hosts - 1) / hosts / link < 0.93]
                vs_mpi = [f"{s}: {t('mpi', s) / t(c, s):.2f}" for s in sizes if t(c, s) > t("mpi", s)]
                vs_gloo = [f"{s}: {t('gloo', s) / t(c, s):.2f}" for s in sizes
                           if s >= 64 * KIB and t("gloo", s) / t(c, s) < 1.5]
                for what, missed in ((">= 0.93 of the link from 1 MiB", low),
                                     (">= Open MPI at every size", vs_mpi),
                                     (">= 1.5x Gloo from 64 KiB", vs_gloo)):
                    verdicts.append(f"{rate} {hosts}x{p} chorus {c}: {what}: "
                                    + ("met" if not missed else "MISSED at " + ", ".join(missed)))
if "mnist" in parts:
    print("\n# seed job, global batch 512, 5 warm-up steps then the timed ones, 1 thread per rank")
    print(f"{'link':>10}{'ranks':>8}{'chorus/s':>12}{'pytorch/s':>12}{'ratio':>8}")
    for rate in rates:
        for p in map(int, per_host):
            c = json.loads(open(f"{work}/mn.{rate}.{p}.chorus.out").readline())["samples_per_second"]
            t = json.loads(open(f"{work}/mn.{rate}.{p}.pytorch.out").readline())["samples_per_second"]
            print(f"{rate:>10}{f'{hosts}x{p}':>8}{c:12.1f}{t:12.1f}{c / t:8.2f}")
            if rate != "none":
                verdicts.append(f"{rate} {hosts}x{p} seed job: chorus samples/s >= PyTorch DDP's: "
                                + ("met" if c >= t else f"MISSED ({c / t:.2f})"))
if verdicts:
    print("\n# targets (issue 25); ratios in MISSED lists: other's time / chorus's")
    print("\n".join(verdicts))
if bad:
    sys.exit("compare_cluster: wrong results: " + "; ".join(bad))
EOF
}

main() {
  parse_args "$@"
  WORK=$(mktemp -d /tmp/compare_cluster.XXXXXX)
  CLUSTER_UP=""
  trap '[[ -z $CLUSTER_UP ]] || "$CLUSTER" down --id "$CLUSTER_UP"; rm -rf "$WORK"' EXIT
  ensure_ready
  band
  LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
  local rate
  for rate in "${RATES[@]}"; do run_rate "$rate"; done
  print_tables
}

main "$@"
