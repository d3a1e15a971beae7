#!/usr/bin/env bash
# Makes (once) the virtual environment in which chorus is built and tested against
# torch 2.x from PyPI: Debian's /usr/bin/python3 with torch 2.15.0, its torchvision
# (0.29.2, which asks for torch >= 2.14), numpy, and scikit-build-core for
# `pip install --no-build-isolation .` (docs/pytorch.md). PyPI's Linux torch is a CUDA
# build (about 3.5 GB with its nvidia-* packages); it runs on the CPU.
# Prints the environment's python. Idempotent: quick when the environment is there.
# Environment: CHORUS_TORCH2_VENV (default .venv-torch2 in the checkout).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv=${CHORUS_TORCH2_VENV:-$root/.venv-torch2}
torch_version=2.15.0 torchvision_version=0.29.2
py="$venv/bin/python"
have() {
  [[ -x $py ]] && "$py" -c "
import sys, torch, torchvision, scikit_build_core
sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null
}
if ! have; then
  "$root/scripts/install-deps.sh" python3-venv >&2
  [[ -x $py ]] || /usr/bin/python3 -m venv "$venv" >&2
  echo "torch2-env: installing torch $torch_version into $venv (about 3.5 GB the first time)" >&2
  "$py" -m pip install -q --disable-pip-version-check "torch==$torch_version" \
    "torchvision==$torchvision_version" numpy scikit-build-core >&2
  have || { echo "torch2-env: torch $torch_version did not install into $venv" >&2; exit 1; }
fi
echo "$py"
