#!/usr/bin/env bash
# The build without root, from module-style prefixes: torch from a user's venv
# (SLIMPI_TORCH_VENV, what `SLIMPI_TORCH_VENV=... scripts/install_deps.sh` makes as a
# user) and parallel HDF5 from a prefix named by HDF5_ROOT (what a site's module sets),
# both in places the default build never looks. Configures a fresh build tree against
# them, checks that CMake took those and not the defaults, and compiles the translation
# units that include HDF5 and LibTorch. (MPI comes from the system: FindMPI takes a
# module's MPI_HOME or mpicc on PATH the same way.)
# Usage: relocated_build.sh TORCH_DIR ROOT
set -euo pipefail
torch=$(realpath "$1"); root=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
site=$(dirname "$torch")                      # …/site-packages (torch and the nvidia/ libraries beside it)
mkdir -p "$out/venv/lib/python3/" "$out/hdf5"
ln -s "$site" "$out/venv/lib/python3/site-packages"
h5=""  # Debian's parallel HDF5 prefix (include/ and lib/), to be seen through another path
for d in /usr/lib/*/hdf5/openmpi; do [ -e "$d/lib/libhdf5.so" ] && [ -e "$d/include/hdf5.h" ] && h5=$d; done
[ -n "$h5" ] || { echo "relocated_build: no parallel HDF5 prefix to relocate (libhdf5-openmpi-dev)"; exit 1; }
ln -s "$h5/include" "$out/hdf5/include"
ln -s "$h5/lib" "$out/hdf5/lib"

SLIMPI_TORCH_VENV=$out/venv cmake -S "$root" -B "$out/build" -DHDF5_ROOT="$out/hdf5" -DSLIMPI_BUILD_TESTS=OFF \
  -DSLIMPI_BUILD_PERF=OFF >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
cache=$out/build/CMakeCache.txt
grep -q "^SLIMPI_TORCH_DIR:PATH=$out/venv/lib/python3/site-packages/torch$" "$cache" \
  || { echo "relocated_build: torch not taken from SLIMPI_TORCH_VENV"; grep SLIMPI_TORCH_DIR "$cache"; exit 1; }
grep -q "^HDF5_C_INCLUDE_DIR:PATH=$out/hdf5/include$" "$cache" \
  || { echo "relocated_build: HDF5 not taken from HDF5_ROOT"; grep HDF5_C_INCLUDE "$cache"; exit 1; }
make -C "$out/build/src" -s io/h5.cpp.o model/kv_cache.cpp.o >"$out/make.log" 2>&1 \
  || { tail -30 "$out/make.log"; exit 1; }
echo "relocated_build: configured and compiled against torch in a user venv and HDF5 from HDF5_ROOT"
