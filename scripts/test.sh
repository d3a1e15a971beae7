#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test with ctest.
# Extra arguments go to ctest (for example -R store to run only the store tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure --timeout 900 -j"$(nproc)" "$@"
