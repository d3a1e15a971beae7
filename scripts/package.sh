#!/usr/bin/env bash
# Builds the Debian packages (cpack -G DEB in build/) into build/packages/:
#   chorus_VERSION_amd64.deb          programs and shared libraries
#   chorus-dev_VERSION_amd64.deb      headers, CMake package, pkg-config file, static library
#   python3-chorus_VERSION_amd64.deb  torch_chorus, the torch.distributed backend
#
# scripts/package.sh --test (root or sudo; .ci/run does this) then installs them with
# apt-get, as a user would, and from /usr alone: checks --version, runs the seed job on
# 2 workers for one epoch, builds examples/allreduce with find_package(chorus) and runs
# it, and imports torch_chorus. It purges the packages again afterwards, also when a
# step failed. Packages of chorus that were installed before are refused, not replaced.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
test_them=0
case "${1:-}" in
  --test) test_them=1 ;;
  "") ;;
  *) echo "usage: scripts/package.sh [--test]" >&2; exit 2 ;;
esac
CHORUS_TORCH2=0 "$root/scripts/build.sh" >/dev/null
out="$root/build/packages"
rm -rf "$out"
(cd "$root/build" && cpack -G DEB -B "$out" >"$root/build/cpack.log" 2>&1) ||
  { cat "$root/build/cpack.log" >&2; echo "package.sh: cpack failed" >&2; exit 1; }
rm -rf "$out/_CPack_Packages"
debs=("$out"/*.deb)
for deb in "${debs[@]}"; do
  echo "package.sh: $(basename "$deb"): $(dpkg-deb -f "$deb" Depends)"
done
[ "$test_them" = 1 ] || exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "package.sh: --test needs root or sudo (apt-get install)" >&2; exit 1; }
  sudo="sudo"
fi
names=(chorus chorus-dev python3-chorus)
for n in "${names[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$n" 2>/dev/null || true)" = "install ok installed" ]; then
    echo "package.sh: $n is installed already; remove it first (apt-get remove ${names[*]})" >&2
    exit 1
  fi
done
work="$(mktemp -d /tmp/chorus-package-test.XXXXXX)"
cleanup() {
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "${names[@]}" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "package.sh: $*" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
# apt-get resolves each package's Depends as for any other package (no download: they
# are what scripts/install-deps.sh installed).
$sudo apt-get install -y -q --no-install-recommends "${debs[@]}" >"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log" >&2; fail "apt-get install of the packages failed"; }
version="$(dpkg-query -W -f='${Version}' chorus)"
for p in chorusrun chorus-bench chorus-trace chorus-mnist; do
  [ "$(command -v "$p")" = "/usr/bin/$p" ] || fail "$p is not /usr/bin/$p"
  [ "$("/usr/bin/$p" --version)" = "$p $version" ] || fail "$p --version is not '$p $version'"
done
echo "package.sh: installed; chorusrun, chorus-bench, chorus-trace and chorus-mnist print $version"

# The seed job from /usr: 2 workers, one epoch, checksums of both ranks equal.
cd "$work"
OMP_NUM_THREADS=1 /usr/bin/chorusrun --standalone --nproc-per-node 2 /usr/bin/chorus-mnist --epochs 1 \
  >"$work/seed.log" 2>&1 || { tail -40 "$work/seed.log" >&2; fail "the seed job from /usr/bin failed"; }
sums="$(grep -o 'params [0-9a-f]*$' "$work/seed.log" | sort -u | wc -l)"
ranks="$(grep -c 'rank [01] params ' "$work/seed.log" || true)"
[ "$ranks" = 2 ] && [ "$sums" = 1 ] || { tail -20 "$work/seed.log" >&2; fail "expected one checksum from 2 ranks"; }
echo "package.sh: seed job (2 workers, 1 epoch) from /usr/bin: both ranks' $(grep -m1 -o 'params [0-9a-f]*$' "$work/seed.log")"

cmake -S "$root/examples/allreduce" -B "$work/allreduce" >"$work/cfg.log" 2>&1 ||
  { cat "$work/cfg.log" >&2; fail "examples/allreduce did not find the installed chorus"; }
cmake --build "$work/allreduce" >"$work/bld.log" 2>&1 || { cat "$work/bld.log" >&2; fail "examples/allreduce did not build"; }
/usr/bin/chorusrun --standalone --nproc-per-node 3 "$work/allreduce/allreduce" 501 >"$work/ex.log" 2>&1 ||
  { cat "$work/ex.log" >&2; fail "examples/allreduce failed"; }
grep -q "rank 0 of 3: allreduce of 501 doubles, 0 wrong (chorus $version)" "$work/ex.log" || { cat "$work/ex.log" >&2; fail "examples/allreduce: unexpected output"; }
echo "package.sh: examples/allreduce built with find_package(chorus) from /usr, 3 ranks: ok"

if [ -e "$out"/python3-chorus_*.deb ]; then
  /usr/bin/python3 -c 'import torch_chorus, torch.distributed as d; assert d.Backend("chorus") == "chorus"' ||
    fail "torch_chorus does not import from the package"
  echo "package.sh: torch_chorus imports from $(/usr/bin/python3 -c 'import torch_chorus; print(torch_chorus.__file__)')"
fi
echo "package.sh: passed"
