#!/usr/bin/env bash
# Installs what slimpi needs from Debian 12's packages (apt-get only). Idempotent:
# a second run installs nothing and only re-checks the BLAS alternatives.
set -euo pipefail

packages=(
  g++ make cmake pkg-config ccache lld
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libtorch-dev libtrilinos-kokkos-dev
  libtomlplusplus-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas0-openmp libopenblas-openmp-dev
  libxxhash-dev
  munge slurm-wlm
  python3-h5py python3-numpy python3-matplotlib
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

# Debian's default libblas is the reference BLAS (~30x slower). Point all three
# alternatives at the OpenMP OpenBLAS: switching only one gives a mixed process.
arch=x86_64-linux-gnu
dir=/usr/lib/$arch/openblas-openmp
for alt in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  if [ -e "$dir/$alt" ] && [ "$(readlink -f /etc/alternatives/$alt-$arch 2>/dev/null)" != "$dir/$alt" ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO update-alternatives --set "$alt-$arch" "$dir/$alt"
  fi
done
