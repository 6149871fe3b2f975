#!/usr/bin/env bash
# Installs what slimpi needs: Debian 12's packages (apt-get), and LibTorch from PyPI's
# torch wheel (the only LibTorch with CUDA the registries offer) into a virtual
# environment outside the checkout, /opt/slimpi/torch-<version>, which every clone and
# CI run on this machine reuses (~5 GB with the CUDA libraries the wheel depends on; the
# CPU build runs on it too). Idempotent: a second run installs nothing.
# Without root (a cluster login node): it says what it would install instead of
# installing it, and installs torch into SLIMPI_TORCH_VENV when that is set to a
# directory you can write (CMake finds it there too: docs/building.md).
set -euo pipefail

# Whether we can install system packages: root, or sudo without a password prompt.
can_sudo() { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }

packages=(
  g++ make cmake pkg-config ccache lld
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libtomlplusplus-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev libzstd-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  munge slurm-wlm
  python3-h5py python3-numpy python3-matplotlib python3-venv
)

missing=()
if ! command -v dpkg-query >/dev/null; then
  echo "install_deps: not a Debian system (no dpkg-query): provide MPI, parallel HDF5, toml++, nlohmann-json, fmt," \
       "spdlog, CLI11, GoogleTest, Google Benchmark, xxHash, zstd, PCRE2 and utf8proc yourself (modules or a prefix;" \
       "docs/building.md says how CMake finds them)"
else
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
fi

if ((${#missing[@]})) && ! can_sudo; then
  echo "install_deps: not root and no password-less sudo, so nothing is installed; these Debian packages are missing:"
  echo "  apt-get install ${missing[*]}"
  echo "install_deps: ask for them, or load the site's modules that provide them (MPI, parallel HDF5, ...):"
  echo "  CMake finds module prefixes through CMAKE_PREFIX_PATH, MPI_HOME and HDF5_ROOT (docs/building.md)"
elif ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
elif command -v dpkg-query >/dev/null; then
  echo "install_deps: all ${#packages[@]} packages present"
fi

# LibTorch: the torch wheel pinned in cmake/SlimpiTorch.cmake (one place), in its own
# venv. The marker file is written last, so an interrupted install is redone, not trusted.
root=$(cd "$(dirname "$0")/.." && pwd)
torch_version=$(sed -n 's/^set(SLIMPI_TORCH_PIN \(.*\))$/\1/p' "$root/cmake/SlimpiTorch.cmake")
[ -n "$torch_version" ] || { echo "install_deps: no SLIMPI_TORCH_PIN in cmake/SlimpiTorch.cmake" >&2; exit 1; }
venv=${SLIMPI_TORCH_VENV:-/opt/slimpi/torch-$torch_version}
if [ -f "$venv/.slimpi-complete" ]; then
  echo "install_deps: torch $torch_version present in $venv"
else
  SUDO=""
  parent=$(dirname "$venv")
  while [ ! -d "$parent" ]; do parent=$(dirname "$parent"); done
  if [ ! -w "$parent" ]; then
    if ! can_sudo; then
      echo "install_deps: would install torch $torch_version into $venv, but $parent is not writable and there is" \
           "no password-less sudo; choose a directory you can write:" >&2
      echo "  SLIMPI_TORCH_VENV=\$HOME/slimpi-torch-$torch_version scripts/install_deps.sh" >&2
      echo "  (then build with the same SLIMPI_TORCH_VENV set, or -DSLIMPI_TORCH_DIR=<venv>/lib/python3.*/site-packages/torch)" >&2
      exit 1
    fi
    [ "$(id -u)" = 0 ] || SUDO="sudo"
  fi
  echo "install_deps: installing torch $torch_version (with its CUDA libraries) into $venv"
  $SUDO rm -rf "$venv"
  $SUDO mkdir -p "$(dirname "$venv")"
  py=/usr/bin/python3; [ -x "$py" ] || py=$(command -v python3)
  $SUDO "$py" -m venv "$venv"
  $SUDO "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "torch==$torch_version"
  $SUDO touch "$venv/.slimpi-complete"
fi

# The agent tests' clients (tests/regression/agent_runs.sh, test_agent_endpoint): the real
# `openai` and `anthropic` Python packages, pinned, in a venv of their own beside torch's
# (developer-only: nothing of slimpi's runtime imports them; an agent brings its own).
clients=${SLIMPI_AGENT_CLIENTS_VENV:-/opt/slimpi/agent-clients}
clients_pins="openai==3.63.0 anthropic==2.17.0"
if [ -f "$clients/.slimpi-complete" ] && [ "$(cat "$clients/.slimpi-complete")" = "$clients_pins" ]; then
  echo "install_deps: agent clients ($clients_pins) present in $clients"
elif [ -w "$(dirname "$clients")" ] || can_sudo; then
  echo "install_deps: installing the agent tests' clients ($clients_pins) into $clients"
  SUDO=""; [ -w "$(dirname "$clients")" ] || SUDO="sudo"
  $SUDO rm -rf "$clients"
  py=/usr/bin/python3; [ -x "$py" ] || py=$(command -v python3)
  $SUDO "$py" -m venv "$clients"
  # shellcheck disable=SC2086
  $SUDO "$clients/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check $clients_pins
  echo "$clients_pins" | $SUDO tee "$clients/.slimpi-complete" >/dev/null
else
  echo "install_deps: cannot write $(dirname "$clients"): the agent tests' clients are not installed" \
       "(set SLIMPI_AGENT_CLIENTS_VENV to a directory you can write)"
fi
