#!/usr/bin/env bash
# Pictures (issue 22): chorus-trace --timeline-data on a synthetic trace of 4 ranks
# (tests/plot/traces: ranks 0 and 1 time out in allreduce #2 waiting for ranks 2 and 3,
# rank 2 calls it late, rank 3 wrote no trace) gives exactly timeline.expected; and
# scripts/plot draws every kind of picture and names bad input.
#
# Usage: tests/plot/plot_test.sh SOURCE_DIR BIN_DIR timeline|pictures
# Exit status: 0 passed, 1 failed, 77 skipped (pictures without gnuplot).
set -uo pipefail

src=$1 bin=$2 what=$3
here=$src/tests/plot
work=$(mktemp -d /tmp/chorus_plot_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_error STATUS TEXT COMMAND...: COMMAND exits STATUS and its stderr contains TEXT.
expect_error() {
  local want=$1 text=$2 rc=0
  shift 2
  "$@" >"$work/out" 2>"$work/err" || rc=$?
  ((rc == want)) || fail "$* exited $rc, not $want: $(cat "$work/err")"
  grep -qF -- "$text" "$work/err" || fail "$* did not say '$text': $(cat "$work/err")"
}

timeline() {
  "$bin/chorus-trace" --timeline-data "$work/timeline.tsv" "$here/traces" >"$work/text" 2>&1 ||
    fail "chorus-trace --timeline-data exited $?: $(cat "$work/text")"
  diff -u "$here/traces/timeline.expected" "$work/timeline.tsv" >&2 ||
    fail "the timeline table differs from tests/plot/traces/timeline.expected"
  # The text report is the same with and without the option.
  "$bin/chorus-trace" "$here/traces" >"$work/plain" 2>&1 || fail "chorus-trace exited $?"
  cmp -s "$work/plain" "$work/text" || fail "--timeline-data changed the text report"
  grep -qF "BEHIND: rank 2 (host node2)" "$work/text" || fail "no BEHIND line: $(cat "$work/text")"
  expect_error 1 "cannot write the --timeline-data file $work/none/t.tsv" \
    "$bin/chorus-trace" --timeline-data "$work/none/t.tsv" "$here/traces"
}

# png FILE: FILE is a PNG image.
png() {
  [[ -s $1 ]] || { fail "no picture $1"; return; }
  [[ $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "$1 is not a PNG"
}

pictures() {
  command -v gnuplot >/dev/null || { echo "SKIP: gnuplot is not installed (scripts/install-deps.sh gnuplot-nox)"; exit 77; }
  local plot=$src/scripts/plot
  "$bin/chorus-trace" --timeline-data "$work/timeline.tsv" "$here/traces" >/dev/null || fail "chorus-trace"
  "$plot" metrics "$here/metrics.jsonl" --out "$work/metrics.png" >/dev/null || fail "plot metrics"
  "$plot" steptime "$here/metrics.jsonl" --out "$work/steptime.png" >/dev/null || fail "plot steptime"
  "$plot" busbw "$here/busbw.csv" --out "$work/busbw.png" --size 640x400 >/dev/null || fail "plot busbw"
  # compare_allreduce.sh's CSV with its mode column, chorus on shared buffers and memcpy.
  "$plot" busbw "$here/busbw_modes.csv" --out "$work/busbw_modes.png" >/dev/null || fail "plot busbw (modes)"
  "$plot" trace "$work/timeline.tsv" --out "$work/trace.png" >/dev/null || fail "plot trace"
  for p in metrics steptime busbw busbw_modes trace; do png "$work/$p.png"; done
  # Bad input names the file.
  expect_error 1 "$work/missing.jsonl: no such file" "$plot" metrics "$work/missing.jsonl" --out "$work/x.png"
  expect_error 1 "$here/busbw.csv line 1: not JSON" "$plot" steptime "$here/busbw.csv" --out "$work/x.png"
  expect_error 1 "$here/metrics.jsonl: not a compare_allreduce.sh CSV" "$plot" busbw "$here/metrics.jsonl" --out "$work/x.png"
  expect_error 1 "$here/busbw.csv line 1: not a chorus-trace --timeline-data line" "$plot" trace "$here/busbw.csv" --out "$work/x.png"
  expect_error 1 "no communicator 'other'" "$plot" trace "$work/timeline.tsv" --comm other --out "$work/x.png"
  printf '{"event":"train","step":1}\n' >"$work/partial.jsonl"
  expect_error 1 "$work/partial.jsonl line 1: a train line without epoch, loss" "$plot" metrics "$work/partial.jsonl" --out "$work/x.png"
  expect_error 1 "cannot write $work/none/x.png" "$plot" busbw "$here/busbw.csv" --out "$work/none/x.png"
  expect_error 2 "bad --size" "$plot" busbw "$here/busbw.csv" --size 10 --out "$work/x.png"
  expect_error 2 "invalid choice" "$plot" pie "$here/busbw.csv"
}

"$what"
((failures == 0)) || { echo "$failures failure(s)" >&2; exit 1; }
echo "passed: $what"
