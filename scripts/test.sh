#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test with ctest:
# build/ (everything, Debian's torch 1.13), then build-torch2/ (what uses torch, on
# torch 2.15 from PyPI; CHORUS_TORCH2=0 skips it). Extra arguments go to both ctest
# runs (for example -R store to run only the store tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure --timeout 900 -j"$(nproc)" "$@"
if [[ ${CHORUS_TORCH2:-1} != 0 ]]; then
  echo "test.sh: the tests that use torch, against torch 2.15 (build-torch2)"
  cd "$root/build-torch2"
  ctest --output-on-failure --timeout 900 -j"$(nproc)" "$@"
fi
