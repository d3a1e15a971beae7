#!/usr/bin/env bash
# The main job on 2 local workers. Until the trainer exists this is the collective
# benchmark: allreduce from 8 B to 64 MiB on 2 ranks over TCP loopback, results checked.
# Extra arguments go to chorus-bench.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
exec "$root/build/bin/chorus-bench" --np 2 -b 8 -e 64M -f 4 "$@"
