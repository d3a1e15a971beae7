#!/usr/bin/env bash
# The main job: the seed job (chorus-mnist: MLP 784-512-512-10 on Fashion-MNIST, 5 epochs,
# DistributedDataParallel) on 2 local workers started by chorusrun. Extra arguments go to
# chorus-mnist (e.g. --epochs 1).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHORUS_TORCH2=${CHORUS_TORCH2:-0} "$root/scripts/build.sh"  # the main job needs Debian's torch only
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$root/build/bin/chorusrun" --standalone --nproc-per-node 2 --tee 3 \
    "$root/build/bin/chorus-mnist" --epochs 5 "$@"
