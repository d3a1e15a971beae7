#!/usr/bin/env bash
# Installs, with apt-get, only the Debian packages chorus needs that are missing.
# Idempotent and quick when everything is there. Usage: scripts/install-deps.sh [EXTRA...]
# EXTRA: packages only some scripts and tests need, which pass them themselves or name
# them when they skip: openmpi-bin libopenmpi-dev (bench/compare_allreduce.sh), slurm-wlm
# munge (tests/run/slurm_test.sh, a real Slurm on this machine).
set -euo pipefail

# python3-torch, python3-dev, pybind11-dev: the torch.distributed backend (python/) for
# Debian's /usr/bin/python3.
# file, dpkg-dev: cpack's Debian packages (scripts/package.sh), whose Depends
# dpkg-shlibdeps computes.
# gnuplot-nox: scripts/plot draws the pictures (docs/images) with it.
# libopenblas0-pthread: Debian's libtorch computes on whichever libblas.so.3 the system
# selects; without it that is the reference BLAS, about 10x slower for the seed job.
packages=(cmake make g++ pkg-config libgtest-dev libgmock-dev zlib1g-dev libcli11-dev libssl-dev
          nlohmann-json3-dev iproute2 procps file dpkg-dev
          libtorch-dev libopenblas0-pthread dataset-fashion-mnist
          python3-torch python3-torchvision python3-dev pybind11-dev gnuplot-nox)
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >/dev/null
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
