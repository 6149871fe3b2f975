#!/usr/bin/env bash
# Companion of device_check.sh, run on a machine with Debian 12's package registry:
# downloads (apt-get download: no install) the Debian libraries slimpi builds against
# that a GPU machine's image lacks (Open MPI and its transports, parallel HDF5, the
# header-only and small libraries) into tests/gpu/debs/ (git-ignored; carried to the
# GPU machine with the checkout). LibTorch is not among them: the GPU machine's own
# torch is used. ~40 MB.
set -euo pipefail
dest=$(cd "$(dirname "$0")" && pwd)/debs
packages=(
  openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1
  librdmacm1 ibverbs-providers libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libmunge2
  libnuma1 libpciaccess0 libltdl7
  libhdf5-openmpi-dev libhdf5-openmpi-103-1 libhdf5-openmpi-hl-100 libaec0 libsz2 libcurl3-gnutls
  libtomlplusplus-dev libtomlplusplus3 nlohmann-json3-dev libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libxxhash-dev libxxhash0
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli-dev zlib1g-dev
  libzstd-dev libzstd1 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2
)
mkdir -p "$dest"
cd "$dest"
apt-get download "${packages[@]}" >/dev/null
echo "fetch_debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $dest"
