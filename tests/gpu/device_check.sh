#!/usr/bin/env bash
# The GPU check, one prepared script. On a machine with one NVIDIA GPU, nvcc and
# PyTorch but no package registry (the device tool's H200): builds slimpi against that
# machine's own torch, with the Debian libraries it needs unpacked (dpkg -x, never
# installed) from tests/gpu/debs/ (fetched beforehand by tests/gpu/fetch_debs.sh), then
# runs `ctest -L gpu` (tests/gpu/) and the GPU training benchmark, and writes
# $OUT/gpu_summary.txt. Where no GPU is visible (or with --dry-run) the build part runs
# and the GPU part says it skipped and why.
# Usage: [OUT=dir] bash tests/gpu/device_check.sh [--dry-run]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/build-gpu/out}
build=${GPU_BUILD_DIR:-$root/build-gpu}
prefix=${SLIMPI_DEB_PREFIX:-/tmp/slimpi-debs}
dry_run=0; [ "${1:-}" = "--dry-run" ] && dry_run=1
mkdir -p "$out"
summary=$out/gpu_summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
note "device_check: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"

# 1. The Debian libraries, unpacked into $prefix (dpkg-deb, or ar + tar where no dpkg).
debs=("$root"/tests/gpu/debs/*.deb)
if [ -e "${debs[0]}" ]; then
  mkdir -p "$prefix"
  for deb in "${debs[@]}"; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$deb" "$prefix"
    else (cd "$prefix" && ar p "$deb" "$(ar t "$deb" | grep '^data.tar')" | tar -x --auto-compress -f - 2>/dev/null ||
          ar p "$deb" "$(ar t "$deb" | grep '^data.tar')" | tar -xJf - || ar p "$deb" "$(ar t "$deb" | grep '^data.tar')" | tar -x --zstd -f -)
    fi
  done
  note "debs: ${#debs[@]} packages unpacked into $prefix"
else
  note "debs: none in tests/gpu/debs (run tests/gpu/fetch_debs.sh first); using the system's libraries"
fi
usr=$prefix/usr
lib=$usr/lib/x86_64-linux-gnu
cmake_args=()
if [ -x "$usr/bin/mpicxx.openmpi" ]; then
  # Open MPI relocated: OPAL_PREFIX points its wrappers, mpirun and plugins at $usr.
  export OPAL_PREFIX=$usr
  export PATH=$usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$lib/hdf5/openmpi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake_args+=(-DCMAKE_PREFIX_PATH="$usr;$lib/cmake"
    -DMPI_C_COMPILER="$usr/bin/mpicc.openmpi" -DMPI_CXX_COMPILER="$usr/bin/mpicxx.openmpi"
    -DMPIEXEC_EXECUTABLE="$usr/bin/mpirun.openmpi"
    -DSLIMPI_HDF5_INCLUDE_DIR="$usr/include/hdf5/openmpi" -DSLIMPI_HDF5_LIBRARY="$lib/hdf5/openmpi/libhdf5.so")
fi

# 2. This machine's torch (its CUDA and NCCL come with it).
# The python whose torch the build links: $PYTHON, else the first of the GPU machine's
# venv, the project's own torch venv (scripts/install_deps.sh) and python3 that has torch.
find_python() {
  local pin candidates=()
  [ -n "${PYTHON:-}" ] && { echo "$PYTHON"; return; }
  pin=$(sed -n 's/^set(SLIMPI_TORCH_PIN \(.*\))$/\1/p' "$root/cmake/SlimpiTorch.cmake")
  candidates=(/opt/torch/.venv/bin/python "/opt/slimpi/torch-$pin/bin/python" python3 /usr/bin/python3)
  for p in "${candidates[@]}"; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then echo "$p"; return; fi
  done
  echo "device_check: no python with torch found (tried PYTHON, ${candidates[*]}): set PYTHON=/path/to/python of a" \
       "venv with torch (scripts/install_deps.sh makes /opt/slimpi/torch-$pin)" >&2
  return 1
}
python=$(find_python) || exit 1
torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
note "torch: $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)') at $torch_dir"

# 3. Build what the GPU checks run.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSLIMPI_TORCH_DIR="$torch_dir" "${cmake_args[@]}" \
  >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; note "configure: FAILED (configure.log)"; exit 1; }
grep "slimpi: LibTorch" "$out/configure.log" | sed 's/^-- /configure: /' | tee -a "$summary"
cmake --build "$build" -j "$(nproc)" --target slimpi test_gpu bench_train >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; note "build: FAILED (build.log)"; exit 1; }
note "build: ok in $(( $(date +%s) - t0 )) s"
"$build/slimpi" --version | tee -a "$summary"

# 4. The GPU part.
if [ "$dry_run" = 1 ] || "$build/slimpi" --version | grep -q "gpus: *none"; then
  why=$([ "$dry_run" = 1 ] && echo "--dry-run" || echo "no GPU visible: $("$build/slimpi" --version | grep cuda: | xargs)")
  (cd "$build" && ctest -L gpu --output-on-failure >"$out/ctest_gpu.log" 2>&1) || true
  note "gpu part: skipped ($why); ctest -L gpu: $(grep -E 'tests passed|tests failed' "$out/ctest_gpu.log" || echo '?')"
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary" || true
status=0
(cd "$build" && ctest -L gpu --output-on-failure >"$out/ctest_gpu.log" 2>&1) || status=1
grep -E "^grpo_gpu|tests passed|tests failed|Failed|SKIPPED" "$out/ctest_gpu.log" | tee -a "$summary" || true
"$build/perf/bench_train" --benchmark_filter=Gpu --benchmark_counters_tabular=true >"$out/bench_gpu.log" 2>&1 || status=1
grep -E "BM_Gpu|mfu" "$out/bench_gpu.log" | tee -a "$summary" || true
note "device_check: $( [ $status = 0 ] && echo ok || echo FAILED ) in $(( $(date +%s) - t0 )) s"
exit $status
