// at::parallel_for for the kernels that split their work between threads. ATen's
// OpenMP backend is an inline `#pragma omp parallel` compiled in the caller's file: a
// file built without -fopenmp runs it on one thread whatever run.threads says (the
// kernels did until 2026-12-04). Include this instead of <ATen/Parallel.h>; the file
// must be listed in slimpi_openmp_sources (src/CMakeLists.txt), or it does not compile.
#pragma once

#include <ATen/Config.h>
#include <ATen/Parallel.h>

#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "kernels/parallel_for.h: this file calls at::parallel_for and must be built with -fopenmp (slimpi_openmp_sources in src/CMakeLists.txt)"
#endif
