#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (AddressSanitizer and
# UndefinedBehaviorSanitizer on, the library code they reach instrumented too) in
# build-fuzz/, and runs each for a bounded number of inputs, starting from the seeds in
# tests/fuzz/corpus/<target>/, all targets at once. Any crash, sanitizer report or
# failed check fails the script (exit status 1, after the others finish, with the end of
# each failed target's log); the input that caused it is left in build-fuzz/.
#
#   scripts/fuzz.sh               every target, the default number of runs (CI)
#   scripts/fuzz.sh idx_fuzz 1e6  one target, more runs
#   FUZZ_RUNS=N scripts/fuzz.sh   every target, N runs each
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh" clang libclang-rt-14-dev
build="$root/build-fuzz"

# Inputs per target in CI: each about a quarter of a minute of one core on the machines
# CI runs on (2-core EPYC guests); the four run at once, in about a minute. (Halved when
# .ci/run passed 45 minutes: at twice these, the four took 47-113 s each.)
declare -A runs=(
  [store_protocol_fuzz]=1000000
  [handshake_fuzz]=2500000
  [launcher_fuzz]=25000
  [idx_fuzz]=50000
)
targets=("${!runs[@]}")
if [[ $# -ge 1 ]]; then
  targets=("$1")
  [[ $# -ge 2 ]] && runs[$1]=$(printf '%.0f' "$2")
fi
if [[ -n "${FUZZ_RUNS:-}" ]]; then
  for t in "${targets[@]}"; do runs[$t]=$FUZZ_RUNS; done
fi

flags="-O1 -g1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="" \
  -DCHORUS_FUZZ=ON -DCHORUS_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:malloc_limit_mb=2048"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# The targets run side by side (each is one process on one core): with as many cores
# as targets this takes as long as the slowest one.
fuzz_one() {
  local t="$1" seeds="$root/tests/fuzz/corpus/$1"
  local work="$build/corpus/$1"   # grows as the fuzzer finds new paths; never in the source tree
  mkdir -p "$work"
  local start=$SECONDS
  (cd "$build" && "$build/bin/$t" -runs="${runs[$t]}" -max_len=4096 -rss_limit_mb=2048 \
      -print_final_stats=1 "$work" "$seeds" 2>"$build/$t.log") || return 1
  echo "== $t: ${runs[$t]} runs (seeds: tests/fuzz/corpus/$t): $(grep -E "^stat::number_of_executed_units|^Done" "$build/$t.log" | tr '\n' ' ')($((SECONDS - start)) s)"
}
declare -A pids=()
for t in "${targets[@]}"; do
  fuzz_one "$t" &
  pids[$t]=$!
done
failed=()
for t in "${targets[@]}"; do
  wait "${pids[$t]}" || failed+=("$t")
done
for t in "${failed[@]}"; do
  tail -n 60 "$build/$t.log"
  echo "fuzz: $t FAILED (log: $build/$t.log)" >&2
done
[[ ${#failed[@]} -eq 0 ]] || exit 1
echo "fuzz: ${#targets[@]} targets clean"
