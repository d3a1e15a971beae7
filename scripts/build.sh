#!/usr/bin/env bash
# Installs missing dependencies and builds chorus (Release) into build/.
# Usage: scripts/build.sh [cmake -D options...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=/usr/bin/python3 "$@" >/dev/null
cmake --build "$root/build" -j"$(nproc)"
