# Every external dependency of slimpi, found once. A missing required package stops
# the configure step with the Debian package that provides it.
function(slimpi_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "slimpi needs ${what}: install it with `apt-get install ${package}` "
                        "(or run scripts/install_deps.sh)")
  endif()
endfunction()

set(MPI_CXX_SKIP_MPICXX TRUE)  # Open MPI's old C++ bindings break the link
find_package(MPI COMPONENTS C CXX)
slimpi_require(MPI_FOUND "MPI (Open MPI)" "libopenmpi-dev openmpi-bin")

set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 COMPONENTS C)
slimpi_require(HDF5_FOUND "HDF5" "libhdf5-openmpi-dev")
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "slimpi needs HDF5 with parallel (MPI-IO) support, found a serial "
                      "HDF5 at ${HDF5_INCLUDE_DIRS}: `apt-get install libhdf5-openmpi-dev`")
endif()

include(SlimpiTorch)  # LibTorch from the torch wheel, with its CUDA and NCCL when it has them

find_package(tomlplusplus QUIET)
slimpi_require(tomlplusplus_FOUND "toml++" "libtomlplusplus-dev")
find_package(nlohmann_json QUIET)
slimpi_require(nlohmann_json_FOUND "nlohmann-json" "nlohmann-json3-dev")
find_package(fmt QUIET)
slimpi_require(fmt_FOUND "fmt" "libfmt-dev")
find_package(spdlog QUIET)
slimpi_require(spdlog_FOUND "spdlog" "libspdlog-dev")
find_package(CLI11 QUIET)
slimpi_require(CLI11_FOUND "CLI11" "libcli11-dev")
if(SLIMPI_BUILD_TESTS)
  find_package(GTest QUIET)
  slimpi_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")
endif()
if(SLIMPI_BUILD_PERF)
  find_package(benchmark QUIET)
  slimpi_require(benchmark_FOUND "Google Benchmark" "libbenchmark-dev")
endif()

# xxHash: checksums of checkpoint files (manifest.json).
find_path(SLIMPI_XXHASH_INCLUDE xxhash.h)
find_library(SLIMPI_XXHASH_LIBRARY xxhash)
slimpi_require(SLIMPI_XXHASH_LIBRARY "xxHash" "libxxhash-dev")
