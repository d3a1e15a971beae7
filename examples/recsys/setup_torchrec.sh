#!/usr/bin/env bash
# Installs TorchRec for the torch 2.x environment (scripts/torch2-env.sh) into a folder
# of its own, without touching that environment, and builds the one-function library
# fbgemm-gpu-cpu needs on torch 2.15 (report_overflow_shim.cpp). Prints the two
# environment lines a job then needs:
#   eval "$(examples/recsys/setup_torchrec.sh)"
# Usage: examples/recsys/setup_torchrec.sh [DIR]   (default .torchrec in the checkout)
# Idempotent: quick when DIR holds them already. Packages from PyPI only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir=${1:-$root/.torchrec}
py=$("$root/scripts/torch2-env.sh")
site=$dir/site shim=$dir/libreport_overflow_shim.so
# --no-deps: each of these asks for torch, which pip would install a second time.
packages=(torchrec==1.9.2 fbgemm-gpu-cpu==1.9.0 tensordict 'pyvers>=0.2,<0.3' torchmetrics==1.0.3
          lightning-utilities pyre-extensions typing-inspect mypy-extensions tqdm iopath portalocker
          cloudpickle orjson importlib_metadata zipp)
if [[ ! -f $site/torchrec/__init__.py || ! -d $site/fbgemm_gpu ]]; then
  echo "setup_torchrec: installing torchrec 1.9.2 and fbgemm-gpu-cpu 1.9.0 into $site" >&2
  "$py" -m pip install -q --disable-pip-version-check --target "$site" --no-deps "${packages[@]}" >&2
fi
if [[ ! -f $shim || $shim -ot $root/examples/recsys/report_overflow_shim.cpp ]]; then
  g++ -O2 -shared -fPIC -o "$shim" "$root/examples/recsys/report_overflow_shim.cpp"
fi
# The library only where torch no longer exports the symbol (torch 2.15 and later).
if ! nm -D --defined-only "$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))')" |
    grep -q '_ZN3c1015report_overflowEPKc'; then
  echo "export LD_PRELOAD=$shim"
fi
echo "export PYTHONPATH=$root/build-torch2/python:$site"
echo "export CHORUS_TORCHREC_PYTHON=$py"
