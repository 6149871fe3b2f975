#!/usr/bin/env bash
# Installs what slimpi needs: Debian 12's packages (apt-get), and LibTorch from PyPI's
# torch wheel (the only LibTorch with CUDA the registries offer) into a virtual
# environment outside the checkout, /opt/slimpi/torch-<version>, which every clone and
# CI run on this machine reuses (~5 GB with the CUDA libraries the wheel depends on; the
# CPU build runs on it too). Idempotent: a second run installs nothing.
set -euo pipefail

packages=(
  g++ make cmake pkg-config ccache lld
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libtomlplusplus-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev libpcre2-dev libutf8proc-dev
  munge slurm-wlm
  python3-h5py python3-numpy python3-matplotlib python3-venv
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all ${#packages[@]} packages present"
fi

# LibTorch: the torch wheel pinned in cmake/SlimpiTorch.cmake (one place), in its own
# venv. The marker file is written last, so an interrupted install is redone, not trusted.
root=$(cd "$(dirname "$0")/.." && pwd)
torch_version=$(sed -n 's/^set(SLIMPI_TORCH_PIN \(.*\))$/\1/p' "$root/cmake/SlimpiTorch.cmake")
[ -n "$torch_version" ] || { echo "install_deps: no SLIMPI_TORCH_PIN in cmake/SlimpiTorch.cmake" >&2; exit 1; }
venv=/opt/slimpi/torch-$torch_version
if [ -f "$venv/.slimpi-complete" ]; then
  echo "install_deps: torch $torch_version present in $venv"
else
  echo "install_deps: installing torch $torch_version (with its CUDA libraries) into $venv"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO rm -rf "$venv"
  $SUDO mkdir -p "$(dirname "$venv")"
  $SUDO /usr/bin/python3 -m venv "$venv"
  $SUDO "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "torch==$torch_version"
  $SUDO touch "$venv/.slimpi-complete"
fi
