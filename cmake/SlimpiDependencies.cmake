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

set(SLIMPI_HDF5_INCLUDE_DIR "" CACHE PATH "HDF5 headers, bypassing FindHDF5 (an unpacked .deb: tests/gpu/device_check.sh)")
set(SLIMPI_HDF5_LIBRARY "" CACHE FILEPATH "libhdf5.so to go with SLIMPI_HDF5_INCLUDE_DIR")
if(SLIMPI_HDF5_INCLUDE_DIR AND SLIMPI_HDF5_LIBRARY)
  set(HDF5_FOUND TRUE)
  set(HDF5_INCLUDE_DIRS ${SLIMPI_HDF5_INCLUDE_DIR})
  set(HDF5_C_LIBRARIES ${SLIMPI_HDF5_LIBRARY})
  file(STRINGS ${SLIMPI_HDF5_INCLUDE_DIR}/H5pubconf.h _parallel REGEX "^#define H5_HAVE_PARALLEL 1")
  set(HDF5_IS_PARALLEL FALSE)
  if(_parallel)
    set(HDF5_IS_PARALLEL TRUE)
  endif()
  file(STRINGS ${SLIMPI_HDF5_INCLUDE_DIR}/H5pubconf.h _v REGEX "^#define H5_VERSION ")
  string(REGEX REPLACE ".*\"(.*)\".*" "\\1" HDF5_VERSION "${_v}")
else()
  set(HDF5_PREFER_PARALLEL TRUE)
  find_package(HDF5 COMPONENTS C)
endif()
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

# zstd: delta weight sync's XOR + zstd bucket form (rollout/weight_delta.h).
find_path(SLIMPI_ZSTD_INCLUDE zstd.h)
find_library(SLIMPI_ZSTD_LIBRARY zstd)
slimpi_require(SLIMPI_ZSTD_LIBRARY "zstd" "libzstd-dev")

# PCRE2 (8-bit, Unicode properties, JIT): the pre-tokenizer regexes of Hugging Face
# tokenizers. utf8proc: their NFC normalizer.
find_path(SLIMPI_PCRE2_INCLUDE pcre2.h)
find_library(SLIMPI_PCRE2_LIBRARY pcre2-8)
slimpi_require(SLIMPI_PCRE2_LIBRARY "PCRE2" "libpcre2-dev")
# cpp-httplib: the agent endpoint's HTTP server (agent/http_server.h). Debian builds it as a
# library with OpenSSL, zlib and Brotli support; its pkg-config file carries the definitions
# the header must be compiled with.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(SLIMPI_HTTPLIB QUIET cpp-httplib)
endif()
if(NOT SLIMPI_HTTPLIB_FOUND)  # no pkg-config file: Debian 12's build definitions
  set(SLIMPI_HTTPLIB_CFLAGS -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT)
endif()
find_path(SLIMPI_HTTPLIB_INCLUDE httplib.h)
find_library(SLIMPI_HTTPLIB_LIBRARY cpp-httplib)
slimpi_require(SLIMPI_HTTPLIB_LIBRARY "cpp-httplib" "libcpp-httplib-dev")
find_path(SLIMPI_UTF8PROC_INCLUDE utf8proc.h)
find_library(SLIMPI_UTF8PROC_LIBRARY utf8proc)
slimpi_require(SLIMPI_UTF8PROC_LIBRARY "utf8proc" "libutf8proc-dev")
