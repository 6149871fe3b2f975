# LibTorch, from the torch wheel on PyPI (the only LibTorch with CUDA the registries
# offer). scripts/install_deps.sh installs the pinned wheel into a virtual environment
# at /opt/slimpi/torch-<version>; this file finds it there without flags. Another torch
# (a GPU machine's own) is taken with -DSLIMPI_TORCH_DIR=<…/site-packages/torch>.
#
# The wheel's own TorchConfig.cmake is not used: with a CUDA wheel it insists on a
# system CUDA toolkit (nvcc) even for a CPU build, and links that toolkit's cudart and
# NCCL beside the wheel's, two NCCLs in one process. One imported target instead,
# slimpi::torch, carries the wheel's headers and libraries and, when the wheel has CUDA,
# the wheel's cudart and NCCL (the ones torch itself loads).
#
# Sets: SLIMPI_TORCH_DIR, SLIMPI_TORCH_VERSION_FOUND, SLIMPI_HAVE_CUDA, SLIMPI_HAVE_NCCL.
set(SLIMPI_TORCH_PIN 2.15.0)
set(SLIMPI_TORCH_VENV /opt/slimpi/torch-${SLIMPI_TORCH_PIN})
set(SLIMPI_TORCH_DIR "" CACHE PATH "The torch package directory (…/site-packages/torch). Empty: ${SLIMPI_TORCH_VENV}")

# Where the torch package is looked for, in order: -DSLIMPI_TORCH_DIR; the environment
# variable SLIMPI_TORCH_VENV (a venv scripts/install_deps.sh made where the user can
# write, without root); /opt/slimpi/torch-<pin>; the torch that `python3` on PATH imports
# (a site's module, a user's venv).
if(NOT SLIMPI_TORCH_DIR)
  set(_venvs ${SLIMPI_TORCH_VENV})
  if(DEFINED ENV{SLIMPI_TORCH_VENV})
    list(PREPEND _venvs $ENV{SLIMPI_TORCH_VENV})
  endif()
  set(_slimpi_torch_candidates)
  foreach(_venv ${_venvs})
    file(GLOB _found ${_venv}/lib/python3*/site-packages/torch)
    list(APPEND _slimpi_torch_candidates ${_found})
  endforeach()
  if(NOT _slimpi_torch_candidates)
    find_program(SLIMPI_PYTHON3 python3)
    if(SLIMPI_PYTHON3)
      execute_process(COMMAND ${SLIMPI_PYTHON3} -c "import os, torch; print(os.path.dirname(torch.__file__))"
                      OUTPUT_VARIABLE _py_torch OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
      if(_rc EQUAL 0 AND EXISTS "${_py_torch}/include/ATen/ATen.h")
        list(APPEND _slimpi_torch_candidates ${_py_torch})
        message(STATUS "slimpi: torch from ${SLIMPI_PYTHON3}: ${_py_torch}")
      endif()
    endif()
  endif()
  if(NOT _slimpi_torch_candidates)
    message(FATAL_ERROR "slimpi needs LibTorch ${SLIMPI_TORCH_PIN} from the torch wheel, looked for in "
                        "${_venvs} and in the python3 on PATH: run scripts/install_deps.sh (as a user: "
                        "SLIMPI_TORCH_VENV=$HOME/slimpi-torch scripts/install_deps.sh), or pass "
                        "-DSLIMPI_TORCH_DIR=<…/site-packages/torch> for another torch")
  endif()
  list(GET _slimpi_torch_candidates 0 _dir)
  set(SLIMPI_TORCH_DIR ${_dir} CACHE PATH "The torch package directory (…/site-packages/torch)" FORCE)
endif()

set(_t ${SLIMPI_TORCH_DIR})
if(NOT EXISTS ${_t}/include/ATen/ATen.h OR NOT EXISTS ${_t}/version.py)
  message(FATAL_ERROR "SLIMPI_TORCH_DIR=${_t} is not a torch package with C++ headers "
                      "(no include/ATen/ATen.h or version.py)")
endif()
file(STRINGS ${_t}/version.py _v REGEX "^__version__ = ")  # e.g. '2.15.0+cu132'
string(REGEX REPLACE ".*'(.*)'.*" "\\1" SLIMPI_TORCH_VERSION_FOUND "${_v}")

add_library(slimpi_torch INTERFACE)
add_library(slimpi::torch ALIAS slimpi_torch)
# Only torch's own header trees go on the include path (links in the build tree): the
# wheel's include/ also bundles third-party headers (fmt 12, pybind11, protobuf, ...)
# that must not shadow Debian's (slimpi links Debian's fmt 9).
set(_inc ${CMAKE_BINARY_DIR}/torch_include)
file(MAKE_DIRECTORY ${_inc})
foreach(_tree ATen c10 caffe2 torch)
  file(CREATE_LINK ${_t}/include/${_tree} ${_inc}/${_tree} SYMBOLIC)
endforeach()
target_include_directories(slimpi_torch SYSTEM INTERFACE ${_inc} ${_t}/include/torch/csrc/api/include)
target_compile_features(slimpi_torch INTERFACE cxx_std_20)  # LibTorch 2.15's headers need C++20

# CUDA: the wheel's torch_cuda plus the cudart and NCCL it brings (nvidia/… beside torch/).
set(SLIMPI_HAVE_CUDA OFF)
set(SLIMPI_HAVE_NCCL OFF)
set(_cuda_libs)
if(EXISTS ${_t}/lib/libtorch_cuda.so AND NOT SLIMPI_WITH_CUDA STREQUAL "OFF")
  file(GLOB _nv_include ${_t}/../nvidia/*/include)
  file(GLOB _nv_lib ${_t}/../nvidia/*/lib)
  find_path(SLIMPI_CUDART_INCLUDE cuda_runtime.h HINTS ${_nv_include} NO_DEFAULT_PATH)
  find_library(SLIMPI_CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12 HINTS ${_nv_lib} NO_DEFAULT_PATH)
  find_path(SLIMPI_NCCL_INCLUDE nccl.h HINTS ${_nv_include} NO_DEFAULT_PATH)
  find_library(SLIMPI_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nv_lib} NO_DEFAULT_PATH)
  if(SLIMPI_CUDART_INCLUDE AND SLIMPI_CUDART_LIBRARY)
    set(SLIMPI_HAVE_CUDA ON)
    set(_cuda_libs -Wl,--no-as-needed ${_t}/lib/libtorch_cuda.so ${_t}/lib/libc10_cuda.so -Wl,--as-needed
                   ${SLIMPI_CUDART_LIBRARY})
    target_include_directories(slimpi_torch SYSTEM INTERFACE ${SLIMPI_CUDART_INCLUDE})
    if(SLIMPI_NCCL_INCLUDE AND SLIMPI_NCCL_LIBRARY)
      set(SLIMPI_HAVE_NCCL ON)
      list(APPEND _cuda_libs ${SLIMPI_NCCL_LIBRARY})
      target_include_directories(slimpi_torch SYSTEM INTERFACE ${SLIMPI_NCCL_INCLUDE})
    endif()
    # The linker resolves torch_cuda's own dependencies (cuBLAS, cuDNN, …) in the wheel.
    foreach(_d ${_nv_lib} ${_t}/../nvidia/cudnn/lib)
      target_link_options(slimpi_torch INTERFACE -Wl,-rpath-link,${_d})
    endforeach()
  endif()
endif()
if(SLIMPI_WITH_CUDA STREQUAL "ON" AND NOT SLIMPI_HAVE_CUDA)
  message(FATAL_ERROR "SLIMPI_WITH_CUDA=ON but the torch at ${_t} has no CUDA (libtorch_cuda.so, "
                      "and cudart beside it in nvidia/)")
endif()

# --no-as-needed: torch_cpu registers its operators at load time; the linker must not
# drop it for having no symbol referenced directly.
target_link_libraries(slimpi_torch INTERFACE
  -Wl,--no-as-needed ${_t}/lib/libtorch.so ${_t}/lib/libtorch_cpu.so -Wl,--as-needed ${_t}/lib/libc10.so
  ${_cuda_libs})
target_link_options(slimpi_torch INTERFACE -Wl,-rpath,${_t}/lib)

# OpenMP: ATen's at::parallel_for is an inline `omp parallel` compiled in the caller's
# file, so a file of ours that calls it runs serially unless built with -fopenmp
# (slimpi_openmp_sources in src/CMakeLists.txt). Those files use the wheel's own OpenMP
# runtime, the one thread pool that at::set_num_threads (run.threads) sizes; a wheel
# without one bundled uses the compiler's.
if(EXISTS ${_t}/lib/libgomp.so.1)
  set(SLIMPI_OPENMP_RUNTIME ${_t}/lib/libgomp.so.1)
else()
  set(SLIMPI_OPENMP_RUNTIME -fopenmp)
endif()
message(STATUS "slimpi: LibTorch ${SLIMPI_TORCH_VERSION_FOUND} at ${_t}; CUDA ${SLIMPI_HAVE_CUDA}, NCCL ${SLIMPI_HAVE_NCCL}")
