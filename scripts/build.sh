#!/usr/bin/env bash
# Installs missing dependencies and builds chorus (Release):
#   build/         against Debian's libtorch and python3-torch 1.13 (/usr/bin/python3);
#   build-torch2/  chorus_torch, chorus-mnist, the examples, torch_chorus and the tests
#                  that use torch, against torch 2.15 from PyPI in the environment
#                  scripts/torch2-env.sh makes (CHORUS_TORCH2=0 skips it).
# Usage: scripts/build.sh [cmake -D options...] (given to both builds)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=/usr/bin/python3 "$@" >/dev/null
cmake --build "$root/build" -j"$(nproc)"
if [[ ${CHORUS_TORCH2:-1} != 0 ]]; then
  py=$("$root/scripts/torch2-env.sh")
  cmake -S "$root" -B "$root/build-torch2" -DCMAKE_BUILD_TYPE=Release -DCHORUS_TORCH_PYTHON="$py" \
    -DCHORUS_TORCH_TESTS_ONLY=ON "$@" >/dev/null
  cmake --build "$root/build-torch2" -j"$(nproc)"
fi
