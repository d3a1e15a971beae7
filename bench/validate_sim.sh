#!/usr/bin/env bash
# The simulator (chorus-sim, docs/simulator.md) against a real cluster: a namespace
# cluster of 8 hosts (scripts/netns-cluster.sh) with links shaped by tbf, once per rate.
# On each cluster it first measures the link model's parameters (ping-pongs between two
# hosts and inside one, the same exchange on all 8 hosts x 1 and 2 ranks for the latency
# under that many processes; the reduction kernels' rate on this CPU), then times
# collectives with chorus-bench under chorusrun at every size, and finally runs
# chorus-sim with the measured parameters on the same layout, size and iteration count,
# timed as chorus-bench times them (--bench-iters), and prints measured, simulated and
# their ratio per row (bench/validate_sim.py). Needs root.
#
# Usage: bench/validate_sim.sh [-B BUILD] [-r RATES] [-R REPEATS] [-b MIN] [-e MAX] [-f F]
#            [-n ITERS] [-L LARGE] [-N ITERS_LARGE] [-c CASES] [-o DIR] [-k LOCK] [-t S]
#        bench/validate_sim.sh -s DIR [-B BUILD]
#   -B      build directory with bin/chorusrun, bin/chorus-bench, bin/chorus-sim and
#           lib/libchorus_comm.a (default build)
#   -r      link rates (tc units), comma-separated (default 1gbit,100mbit)
#   -R      repeats: every measurement runs R times, the cases in alternating order;
#           rows report the median and the spread (default 3)
#   -b/-e/-f  sizes of the collectives, K/M/G suffixes (default 1K, 64M, 4)
#   -n      timed iterations per size up to -L, after 2 warm-up ones (default 10)
#   -L/-N   sizes above L get N timed iterations and no warm-up (default 1M, 1): a
#           warm-up of 64 MiB at 100 Mbit/s takes 10 s and changes nothing that lasts
#   -c      cases, comma-separated, of: ar.ring.8x1 ar.ring.8x2 ar.hier.8x2 ag.ring.8x1
#           ag.bruck.8x1 bc.ring.8x1 (collective.algorithm.HOSTSxRANKS; default all)
#   -o      keep the raw outputs in DIR (default: a new directory under /tmp, printed)
#   -s DIR  no cluster: simulate and print again from DIR's measurements (after a
#           change to the model)
#   -k      hold this lock file (flock -x) during each cluster measurement only
#   -t      deadline of each program run, seconds (default 300)
# Exits non-zero when a run fails, times out or returns wrong results; the cluster is
# removed in every case.
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly PY=/usr/bin/python3
readonly CLUSTER=$ROOT/scripts/netns-cluster.sh
readonly HOSTS=8 MASTER=10.77.0.1

build=$ROOT/build rates=1gbit,100mbit repeats=3 min_bytes=1K max_bytes=64M factor=4
iters=10 large=1M iters_large=1 cases=ar.ring.8x1,ar.ring.8x2,ar.hier.8x2,ag.ring.8x1,ag.bruck.8x1,bc.ring.8x1
out="" resim="" lock="" timeout_s=300

die() { echo "validate_sim: $*" >&2; exit 1; }
bad() { echo "validate_sim: $*" >&2; exit 2; }
# The header's comment from "Usage:" to its end.
usage() { awk 'NR >= 12 && !/^#/ { exit } NR >= 12 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" >&2; exit "$1"; }

# Bytes of a size with an optional K/M/G suffix; $1 names the option for the error.
bytes_of() {
  [[ $2 =~ ^([0-9]+)([KMG]?)$ ]] || bad "bad value '$2' for $1 (a number, K/M/G suffixes)"
  local shift=0
  case ${BASH_REMATCH[2]} in K) shift=10 ;; M) shift=20 ;; G) shift=30 ;; esac
  echo $((BASH_REMATCH[1] << shift))
}

parse_args() {
  local opt c
  while getopts "B:r:R:b:e:f:n:L:N:c:o:s:k:t:h" opt; do
    case $opt in
      B) build=$OPTARG ;; r) rates=$OPTARG ;; R) repeats=$OPTARG ;; b) min_bytes=$OPTARG ;;
      e) max_bytes=$OPTARG ;; f) factor=$OPTARG ;; n) iters=$OPTARG ;; L) large=$OPTARG ;;
      N) iters_large=$OPTARG ;; c) cases=$OPTARG ;; o) out=$OPTARG ;; s) resim=$OPTARG ;;
      k) lock=$OPTARG ;; t) timeout_s=$OPTARG ;; h) usage 0 ;; *) usage 2 ;;
    esac
  done
  ((OPTIND > $#)) || bad "unexpected argument '${!OPTIND}'"
  min_bytes=$(bytes_of -b "$min_bytes") max_bytes=$(bytes_of -e "$max_bytes") factor=$(bytes_of -f "$factor")
  large=$(bytes_of -L "$large")
  local n
  for n in "-R $repeats" "-n $iters" "-N $iters_large" "-t $timeout_s"; do
    [[ ${n#* } =~ ^[1-9][0-9]*$ ]] || bad "${n% *} must be a positive whole number, not '${n#* }'"
  done
  ((factor >= 2)) || bad "-f must be at least 2"
  ((min_bytes >= 64 && min_bytes <= max_bytes)) || bad "need 64 <= -b <= -e"
  IFS=, read -ra RATES <<<"$rates"
  IFS=, read -ra CASES <<<"$cases"
  local r
  for r in "${RATES[@]}"; do
    [[ ${r,,} =~ ^[0-9]+(k|m|g)bit$ ]] || bad "bad rate '$r' (e.g. 1gbit, 200mbit)"
  done
  for c in "${CASES[@]}"; do
    [[ $c =~ ^(ar\.(ring|hier)|ag\.(ring|bruck)|bc\.ring)\.8x[12]$ ]] || bad "bad case '$c' (see -h)"
  done
  [[ -z $lock || -e $lock ]] || bad "no lock file $lock"
  [[ -z $resim || -d $resim ]] || bad "no directory $resim (-s)"
  local p
  for p in chorusrun chorus-bench chorus-sim; do
    [[ -x $build/bin/$p ]] || die "no $build/bin/$p (make -C $build chorusrun chorus-bench chorus-sim; -B names the build)"
  done
}

lock_take() { [[ -z $lock ]] || { exec 9>>"$lock"; flock -x 9; }; }
lock_drop() { [[ -z $lock ]] || exec 9>&-; }

PORT=29700

# "DROPS RETRANS TIMEOUTS": packets tbf dropped on the cluster's links (each host's eth0
# and the switch's ports), TCP segments its hosts retransmitted, and their TCP
# retransmission timeouts, so far. A loss is repaired by a retransmit, at worst after a
# timeout (200 ms at least): time that no link model has.
net_counters() {
  local h drops=0 retrans=0 timeouts=0 qdisc tcp
  for ((h = 0; h <= UP_HOSTS; h++)); do
    if ((h == UP_HOSTS)); then
      qdisc=$(ip netns exec "chorusnet-$CHORUS_NETNS_ID-sw" tc -s qdisc show) tcp="0 0"
    else
      qdisc=$(ip netns exec "chorusnet-$CHORUS_NETNS_ID-h$h" tc -s qdisc show dev eth0)
      tcp=$(ip netns exec "chorusnet-$CHORUS_NETNS_ID-h$h" awk '
        /^Tcp:/ { if (t++) r = $13 }
        /^TcpExt:/ { if (!x++) { for (i = 2; i <= NF; i++) if ($i == "TCPTimeouts") c = i } else o = $c }
        END { print r + 0, o + 0 }' /proc/net/snmp /proc/net/netstat)
    fi
    drops=$((drops + $(sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' <<<"$qdisc" | awk '{ s += $1 } END { print s + 0 }')))
    retrans=$((retrans + ${tcp% *})) timeouts=$((timeouts + ${tcp#* }))
  done
  echo "$drops $retrans $timeouts"
}

# run_job TAG HOSTS PER_HOST ENV -- BENCH_ARGS...: chorus-bench on hosts 0..HOSTS-1 with
# PER_HOST ranks each, one chorusrun per host (ENV: extra environment, "-" for none);
# host 0's JSON rows are appended to TAG.json. A failing host stops the others and the
# run fails naming TAG, with the failing host's last lines.
run_job() {
  local tag=$1 hosts=$2 per=$3 env=$4 h pids=() failed="" pid i
  shift 5
  PORT=$((PORT + 1))
  lock_take
  local before first=0 a
  before=$(net_counters)
  for a in "$@"; do [[ $first != next ]] || first=$a; [[ $a != -b ]] || first=next; done
  for ((h = 0; h < hosts; h++)); do
    # shellcheck disable=SC2046
    # The launchers' heartbeat deadline is raised from 5 s: other jobs' compiles on this
    # machine (load 30 to 50) once held a launcher's heartbeat back for 8 s.
    timeout -k 10 "$timeout_s" "$CLUSTER" exec "$h" env CHORUS_JOB_TOKEN=validate-sim CHORUS_HEARTBEAT_TIMEOUT=60s \
      $([[ $env == - ]] || echo "$env") "$build/bin/chorusrun" --nnodes "$hosts" --node-rank "$h" \
      --master-addr "$MASTER" --master-port "$PORT" --nproc-per-node "$per" \
      --local-addr "10.77.0.$((h + 1))" "$build/bin/chorus-bench" --json -c 1 "$@" \
      >"$RUN/$tag.h$h.out" 2>"$RUN/$tag.h$h.err" &
    pids+=($!)
  done
  # The first host to fail ends the run: the others would wait for it until their deadline.
  while ((${#pids[@]} > 0)) && [[ -z $failed ]]; do
    for i in "${!pids[@]}"; do
      pid=${pids[$i]}
      kill -0 "$pid" 2>/dev/null && continue
      wait "$pid" || failed=$i
      unset "pids[$i]"
    done
    ((${#pids[@]} == 0)) || sleep 0.1
  done
  if [[ -n $failed ]]; then
    ((${#pids[@]} == 0)) || kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    lock_drop
    echo "validate_sim: $tag failed on host $failed; its last lines:" >&2
    tail -n 15 "$RUN/$tag.h$failed.err" >&2
    exit 1
  fi
  lock_drop
  local after b0 b1 b2 a0 a1 a2
  after=$(net_counters)
  read -r b0 b1 b2 <<<"$before"
  read -r a0 a1 a2 <<<"$after"
  # The band's first size, and its drops, retransmits and timeouts.
  echo "$first $((a0 - b0)) $((a1 - b1)) $((a2 - b2))" >>"$RUN/$tag.net"
  grep '^{' "$RUN/$tag.h0.out" >>"$RUN/$tag.json" || die "$tag: host 0 printed no rows"
}

# The collectives' sizes in two bands: up to -L with -n iterations after 2 warm-ups,
# above with -N and none.
bands() {
  local s=$min_bytes small="" big=""
  while ((s <= max_bytes)); do
    if ((s <= large)); then small=${small:-$s}; SMALL_END=$s; else big=${big:-$s}; BIG_END=$s; fi
    s=$((s * factor))
  done
  BANDS=()
  [[ -z $small ]] || BANDS+=("-b $small -e $SMALL_END -f $factor -n $iters -w 2")
  [[ -z $big ]] || BANDS+=("-b $big -e $BIG_END -f $factor -n $iters_large -w 0")
}

# The unshaped veth's own line rate and latency (what passes while tbf's bucket holds
# tokens): a ping-pong between two hosts of a cluster with no --rate, 8 B to 16 MiB.
measure_wire() {
  local r
  CHORUS_NETNS_ID=$("$CLUSTER" up 2) || die "netns-cluster.sh up 2 failed"
  export CHORUS_NETNS_ID
  CLUSTER_UP=$CHORUS_NETNS_ID UP_HOSTS=2
  RUN=$out/wire
  mkdir -p "$RUN"
  for ((r = 1; r <= repeats; r++)); do
    run_job "cal.inter.r$r" 2 1 - -- -o sendrecv -m out -b 8 -e 16M -f 8 -n 20 -w 3
  done
  "$CLUSTER" down
  CLUSTER_UP=""
}

# The parameters' measurements (repeat $1): ping-pongs (chorus-bench's sendrecv on two
# ranks is one: each rank runs its send and its receive in turn) between hosts 0 and 1
# and between two ranks of host 0 over shared memory, 8 B to 16 MiB; and the same
# exchange at small sizes on 8 hosts x 1 and x 2 ranks, for the latency when all the
# cases' processes share this machine's cores.
calibrate() {
  local r=$1
  run_job "cal.inter.r$r" 2 1 - -- -o sendrecv -m out -b 8 -e 256K -f 8 -n 20 -w 3
  run_job "cal.inter.r$r" 2 1 - -- -o sendrecv -m out -b 2M -e 16M -f 8 -n 2 -w 1
  run_job "cal.intra.r$r" 1 2 - -- -o sendrecv -m out -b 8 -e 16M -f 8 -n 20 -w 3
  run_job "cal.load8x1.r$r" 8 1 - -- -o sendrecv -m out -b 8 -e 4K -f 8 -n 50 -w 5
  run_job "cal.load8x2.r$r" 8 2 - -- -o sendrecv -m out -b 8 -e 4K -f 8 -n 50 -w 5
}

# One case (collective.algorithm.HxP) at every size, repeat $2.
measure_case() {
  local c=$1 r=$2 coll algo layout op b
  IFS=. read -r coll algo layout <<<"$c"
  case $coll in ar) op=allreduce ;; ag) op=allgather ;; bc) op=broadcast ;; esac
  for b in "${BANDS[@]}"; do
    # shellcheck disable=SC2086
    run_job "$c.r$r" "${layout%x*}" "${layout#*x}" "CHORUS_ALGO=$algo" -- -o "$op" -m in -d f32 -r sum $b
  done
}

measure_rate() {
  local rate=$1 r i order
  echo "validate_sim: link $rate: cluster of $HOSTS hosts" >&2
  CHORUS_NETNS_ID=$("$CLUSTER" up "$HOSTS" --rate "$rate") || die "netns-cluster.sh up $HOSTS --rate $rate failed"
  export CHORUS_NETNS_ID
  CLUSTER_UP=$CHORUS_NETNS_ID UP_HOSTS=$HOSTS
  RUN=$out/$rate
  mkdir -p "$RUN"
  for ((r = 1; r <= repeats; r++)); do
    echo "validate_sim: link $rate, repeat $r of $repeats ($(cut -d' ' -f1-3 /proc/loadavg))" >&2
    cut -d' ' -f1-3 /proc/loadavg >>"$RUN/load"
    calibrate "$r"
    # Alternate the order, so that a drift in the machine's load spreads over the cases.
    order=("${CASES[@]}")
    if ((r % 2 == 0)); then
      order=()
      for ((i = ${#CASES[@]} - 1; i >= 0; i--)); do order+=("${CASES[$i]}"); done
    fi
    for i in "${order[@]}"; do measure_case "$i" "$r"; done
  done
  cut -d' ' -f1-3 /proc/loadavg >>"$RUN/load"
  "$CLUSTER" down
  CLUSTER_UP=""
}

# reduce-bench's f32 figure on this CPU (its kernels as chorus picks them); built here
# from the build's library when the build has none (bench/ is built only with torch).
measure_reduce() {
  local rb=$build/bin/reduce-bench
  if [[ ! -x $rb ]]; then
    rb=$out/reduce-bench
    c++ -O2 -std=c++20 -I"$ROOT/include" -I"$ROOT/src" -I"$build/include" -I"$build/generated" \
      "$ROOT/bench/reduce_bench.cc" "$build/lib/libchorus_comm.a" -lpthread -o "$rb" ||
      die "building reduce-bench from $build/lib/libchorus_comm.a failed"
  fi
  "$rb" >"$out/reduce.txt" || die "reduce-bench failed"
}

main() {
  parse_args "$@"
  if [[ -n $resim ]]; then
    exec "$PY" "$ROOT/bench/validate_sim.py" "$resim" "$build/bin/chorus-sim"
  fi
  ((EUID == 0)) || die "needs root (network namespaces)"
  if [[ -z $out ]]; then out=$(mktemp -d /tmp/validate_sim.XXXXXX); else mkdir -p "$out"; fi
  CLUSTER_UP=""
  trap '[[ -z $CLUSTER_UP ]] || "$CLUSTER" down --id "$CLUSTER_UP"' EXIT
  trap 'exit 130' INT TERM
  bands
  measure_reduce
  printf '%s\n' "${RATES[@]}" >"$out/rates"
  printf '%s\n' "${CASES[@]}" >"$out/cases"
  echo "$iters $iters_large $large 0" >"$out/iters"  # the last: warm-ups above -L
  measure_wire
  local rate
  for rate in "${RATES[@]}"; do measure_rate "$rate"; done
  echo "validate_sim: measurements in $out (-s $out simulates them again)" >&2
  "$PY" "$ROOT/bench/validate_sim.py" "$out" "$build/bin/chorus-sim"
}

main "$@"
