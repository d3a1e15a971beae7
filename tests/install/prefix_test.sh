#!/usr/bin/env bash
# Install.Prefix (ctest): `cmake --install` of the build tree into an empty prefix, then,
# from that prefix only:
#   - the files of every component are where docs/install.md says;
#   - chorusrun and the other programs print the project's version;
#   - examples/allreduce, configured with only CMAKE_PREFIX_PATH=PREFIX, builds against
#     chorus::comm (the shared library) and chorus::comm_static, and each runs on 3
#     ranks under the installed chorusrun;
#   - a program compiled with `pkg-config --cflags --libs chorus` runs on 2 ranks;
#   - with libtorch: examples/cnn_fashion, examples/grad_accumulation and examples/recsys
#     (dlrm_sharded) build against chorus::torch in the prefix; the CNN's replicas end
#     equal after 20 steps on 2 ranks, 30 steps of gradient accumulation end with the
#     same parameters whether run straight or stopped after 20 and resumed from the
#     checkpoint, and the DLRM's MLP replicas end equal after 3 steps on 2 ranks;
#   - with the Python module: PYTHONPATH=PREFIX/lib/python3/dist-packages imports it.
# Usage: prefix_test.sh SOURCE_DIR BUILD_DIR VERSION
set -euo pipefail
src="$1" build="$2" version="$3"
work="$(mktemp -d /tmp/chorus-install-test.XXXXXX)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
fail() { echo "prefix_test: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install failed"; }
libdir="$(cd "$prefix" && ls -d lib/x86_64-linux-gnu 2>/dev/null || echo lib)"
minor="${version%.*}"
for f in include/chorus/chorus.h include/chorus/version.h include/chorus/torch/ddp.h \
         "$libdir/libchorus_comm.so.$version" "$libdir/libchorus_comm.so.$minor" "$libdir/libchorus_comm.so" \
         "$libdir/libchorus_comm.a" "$libdir/cmake/chorus/chorusConfig.cmake" \
         "$libdir/cmake/chorus/chorusConfigVersion.cmake" "$libdir/pkgconfig/chorus.pc" \
         bin/chorusrun bin/chorus-bench bin/chorus-trace; do
  [ -e "$prefix/$f" ] || fail "the install lacks $f (it has: $(cd "$prefix" && find . -type f | sort | tr '\n' ' '))"
done
soname="$(objdump -p "$prefix/$libdir/libchorus_comm.so.$version" | awk '/SONAME/ {print $2}')"
[ "$soname" = "libchorus_comm.so.$minor" ] || fail "libchorus_comm's SONAME is '$soname', not libchorus_comm.so.$minor"
grep -q "#define CHORUS_VERSION \"$version\"" "$prefix/include/chorus/version.h" || fail "version.h does not say $version"
progs=(chorusrun chorus-bench chorus-trace)
[ -e "$prefix/bin/chorus-mnist" ] && progs+=(chorus-mnist)
for p in "${progs[@]}"; do
  out="$("$prefix/bin/$p" --version)"
  [ "$out" = "$p $version" ] || fail "$p --version printed '$out', not '$p $version'"
done
echo "prefix_test: installed files, SONAME $soname and --version of ${progs[*]}: ok"

# The programs must not need the build tree: run them from a copy of the prefix only.
run_ranks() {  # NP PROGRAM ARGS...: the installed chorusrun, loopback only
  local np="$1"
  shift
  "$prefix/bin/chorusrun" --standalone --nproc-per-node "$np" "$@"
}

for lib in comm comm_static; do
  sed "s/chorus::comm)/chorus::$lib)/" "$src/examples/allreduce/CMakeLists.txt" > "$work/CMakeLists.txt"
  mkdir -p "$work/ex-$lib"
  cp "$src/examples/allreduce/main.cc" "$work/ex-$lib/"
  mv "$work/CMakeLists.txt" "$work/ex-$lib/"
  cmake -S "$work/ex-$lib" -B "$work/ex-$lib/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cfg.log" 2>&1 ||
    { cat "$work/cfg.log"; fail "examples/allreduce (chorus::$lib) did not configure against the prefix"; }
  cmake --build "$work/ex-$lib/build" >"$work/bld.log" 2>&1 || { cat "$work/bld.log"; fail "examples/allreduce (chorus::$lib) did not build"; }
  out="$(run_ranks 3 "$work/ex-$lib/build/allreduce" 1001 2>&1)" || { echo "$out"; fail "examples/allreduce (chorus::$lib) failed"; }
  grep -q "rank 2 of 3: allreduce of 1001 doubles, 0 wrong (chorus $version)" <<<"$out" || { echo "$out"; fail "examples/allreduce (chorus::$lib): unexpected output"; }
  if [ "$lib" = comm ]; then
    # Not `ldd | grep -q`: grep stops reading at the match, and under pipefail ldd's
    # SIGPIPE then fails the check (it did in CI).
    libs="$(ldd "$work/ex-$lib/build/allreduce")"
    grep -q "libchorus_comm.so.$minor => $prefix/" <<<"$libs" || fail "the example does not load the prefix's libchorus_comm.so.$minor"
  fi
done
echo "prefix_test: examples/allreduce with chorus::comm and chorus::comm_static, 3 ranks: ok"

export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
[ "$(pkg-config --modversion chorus)" = "$version" ] || fail "pkg-config --modversion chorus is not $version"
# shellcheck disable=SC2046
g++ -O1 -o "$work/pc-allreduce" "$src/examples/allreduce/main.cc" $(pkg-config --cflags --libs chorus) \
    -Wl,-rpath,"$prefix/$libdir" || fail "compiling with pkg-config's flags failed"
out="$(run_ranks 2 "$work/pc-allreduce" 7 2>&1)" || { echo "$out"; fail "the pkg-config build failed"; }
grep -q "rank 1 of 2: allreduce of 7 doubles, 0 wrong" <<<"$out" || { echo "$out"; fail "pkg-config build: unexpected output"; }
echo "prefix_test: pkg-config build, 2 ranks: ok"

# every_rank_agrees LOG RANKS WORD: RANKS lines "rank R ... WORD HEX", one HEX.
every_rank_agrees() {
  local n sums
  n="$(grep -c "^rank [0-9]* .*$3 [0-9a-f]*$" "$1" || true)"
  sums="$(grep -o "$3 [0-9a-f]*$" "$1" | sort -u | wc -l)"
  [ "$n" = "$2" ] && [ "$sums" = 1 ]
}
if [ -e "$prefix/$libdir/cmake/chorus/chorusTorchTargets.cmake" ]; then
  # Configured one after the other, compiled side by side (one libtorch file each).
  names=(cnn_fashion grad_accumulation recsys)
  for name in "${names[@]}"; do
    cmake -S "$src/examples/$name" -B "$work/ex-$name" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cfg-$name.log" 2>&1 ||
      { cat "$work/cfg-$name.log"; fail "examples/$name did not configure against the prefix"; }
  done
  pids=()
  for name in "${names[@]}"; do
    cmake --build "$work/ex-$name" >"$work/bld-$name.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!names[@]}"; do
    wait "${pids[$i]}" || { cat "$work/bld-${names[$i]}.log"; fail "examples/${names[$i]} did not build"; }
  done
  export OMP_NUM_THREADS=1
  run_ranks 2 "$work/ex-cnn_fashion/cnn_fashion" --epochs 1 --max-steps 20 >"$work/cnn.log" 2>&1 ||
    { cat "$work/cnn.log"; fail "examples/cnn_fashion failed"; }
  every_rank_agrees "$work/cnn.log" 2 checksum || { cat "$work/cnn.log"; fail "examples/cnn_fashion: the replicas' checksums differ"; }
  grep -q '"ranks": 2, "steps": 20, "test_accuracy"' "$work/cnn.log" || { cat "$work/cnn.log"; fail "examples/cnn_fashion: no summary"; }
  echo "prefix_test: examples/cnn_fashion, 2 ranks, 20 steps: equal parameters and buffers ($(grep -o 'test accuracy [0-9.]*%' "$work/cnn.log"))"

  accum="$work/ex-grad_accumulation/grad_accumulation"
  run_ranks 2 "$accum" --steps 30 --checkpoint "$work/ck-straight" >"$work/straight.log" 2>&1 ||
    { cat "$work/straight.log"; fail "examples/grad_accumulation failed"; }
  run_ranks 2 "$accum" --steps 30 --checkpoint "$work/ck-resumed" --stop-after 20 >"$work/first.log" 2>&1 ||
    { cat "$work/first.log"; fail "examples/grad_accumulation (until step 20) failed"; }
  run_ranks 2 "$accum" --steps 30 --checkpoint "$work/ck-resumed" --resume >"$work/resumed.log" 2>&1 ||
    { cat "$work/resumed.log"; fail "examples/grad_accumulation (resumed) failed"; }
  grep -q "resuming at step 20" "$work/resumed.log" || { cat "$work/resumed.log"; fail "grad_accumulation did not resume at step 20"; }
  every_rank_agrees "$work/straight.log" 2 checksum && every_rank_agrees "$work/resumed.log" 2 checksum ||
    fail "examples/grad_accumulation: the replicas' checksums differ"
  straight="$(grep -m1 -o 'step 30 checksum [0-9a-f]*' "$work/straight.log")"
  resumed="$(grep -m1 -o 'step 30 checksum [0-9a-f]*' "$work/resumed.log")"
  [ -n "$straight" ] && [ "$straight" = "$resumed" ] ||
    fail "examples/grad_accumulation: 30 steps straight give '$straight', stopped at 20 and resumed '$resumed'"
  echo "prefix_test: examples/grad_accumulation, 2 ranks: 30 steps straight and 20 + resumed 10 end equal ($straight)"

  run_ranks 2 "$work/ex-recsys/dlrm_sharded" --tables 3 --rows 1000 --dim 16 --batch-size 63 --steps 3 \
    >"$work/dlrm.log" 2>&1 || { cat "$work/dlrm.log"; fail "examples/recsys/dlrm_sharded failed"; }
  every_rank_agrees "$work/dlrm.log" 2 mlp || { cat "$work/dlrm.log"; fail "examples/recsys/dlrm_sharded: the MLP replicas differ"; }
  grep -q '^checksum value=' "$work/dlrm.log" || { cat "$work/dlrm.log"; fail "examples/recsys/dlrm_sharded: no checksum"; }
  echo "prefix_test: examples/recsys/dlrm_sharded, 2 ranks, 3 steps: equal MLP replicas ($(grep -o '^checksum value=.*' "$work/dlrm.log"))"
fi

pydir="$prefix/lib/python3/dist-packages"
if [ -e "$pydir/torch_chorus/__init__.py" ]; then
  out="$(PYTHONPATH="$pydir" /usr/bin/python3 -c 'import torch_chorus, torch.distributed as d; print(torch_chorus.__file__, d.Backend("chorus"))')" ||
    fail "torch_chorus did not import from $pydir"
  case "$out" in "$pydir/torch_chorus/__init__.py chorus") ;; *) fail "unexpected import: $out" ;; esac
  echo "prefix_test: torch_chorus imports from the prefix"
fi
echo "prefix_test: passed"
