#!/usr/bin/env bash
# chorus-sim's command line against the model's arithmetic: sendrecv:shift (chorus-bench's
# sendrecv; a ping-pong on 2 ranks), --bench-iters/--bench-warmup (chorus-bench's timing)
# and --nic-burst (a token bucket per NIC). Usage: chorus_sim_cli_test.sh CHORUS_SIM
set -euo pipefail
sim=${1:?usage: chorus_sim_cli_test.sh CHORUS_SIM}
failures=0

# time_us ARGS...: the simulated microseconds of a ping-pong between 2 nodes, 10 us
# latency, free reductions.
time_us() {
  "$sim" --json -o sendrecv -a shift -n 2 --ranks-per-node 1 --inter-alpha-us 10 --reduce-gbs 0 "$@" |
    sed -n 's/.*"time_us": \([0-9.]*\).*/\1/p'
}

# expect WHAT GOT LOW HIGH
expect() {
  if awk -v g="$2" -v lo="$3" -v hi="$4" 'BEGIN { exit !(g != "" && g >= lo && g <= hi) }'; then
    echo "ok: $1: $2 us"
  else
    echo "FAILED: $1: got '$2' us, want $3..$4" >&2
    failures=$((failures + 1))
  fi
}

# A round is two one-way trips of alpha + n / beta: 2 (10 + 1,000) us for 1 MB at 1 GB/s,
# whether timed once or as chorus-bench times it.
expect "ping-pong, one round" "$(time_us --bytes 1000000 --inter-gbs 1 --nic-gbs 0)" 2019.99 2020.01
expect "ping-pong, 4 rounds after 2" \
  "$(time_us --bytes 1000000 --inter-gbs 1 --nic-gbs 0 --bench-iters 4 --bench-warmup 2)" 2019.99 2020.01
# A NIC of 100 MB/s: 100 KB take 1,000 us each way; with a bucket of 1 MiB the quiet link
# passes them at the 1 GB/s line (100 us).
expect "100 KB, NIC 0.1 GB/s" "$(time_us --bytes 100000 --inter-gbs 1 --nic-gbs 0.1)" 2019.99 2020.01
expect "100 KB, NIC 0.1 GB/s, 1 MiB bucket" \
  "$(time_us --bytes 100000 --inter-gbs 1 --nic-gbs 0.1 --nic-burst 1M)" 219.99 220.01
# 100 rounds send 10 MB each way: at least (10 MB - 1 MiB of tokens) / 100 MB/s, 895.1 us
# a round; at most a round with both trips at the rate (1,000 us) and its 2 latencies.
expect "100 rounds of 100 KB, 1 MiB bucket" \
  "$(time_us --bytes 100000 --inter-gbs 1 --nic-gbs 0.1 --nic-burst 1M --bench-iters 100)" 895.1 1020

if ! out=$("$sim" -o sendrecv -a ring -n 2 2>&1); then
  grep -q "no algorithm ring for sendrecv" <<<"$out" && echo "ok: a wrong algorithm is named" ||
    { echo "FAILED: a wrong algorithm: $out" >&2; failures=$((failures + 1)); }
else
  echo "FAILED: chorus-sim -o sendrecv -a ring succeeded" >&2
  failures=$((failures + 1))
fi
((failures == 0))
