# Test helpers.
#   slimpi_add_test(NAME SOURCES...)                       a serial GoogleTest program
#   slimpi_add_mpi_test(NAME NP 1 2 4 SOURCES ... [LABELS ...])
#     one GoogleTest program, registered as NAME_np1, NAME_np2, ... each run under
#     mpirun with that many ranks (--oversubscribe so 4 ranks run on 2 cores,
#     --allow-run-as-root for CI containers). Launch flags live here, not in slimpi.
# odls_base_sigkill_timeout 0: mpirun ends a failed job at once (its default sleeps 2 s
# after a rank exits non-zero, which the suite's ~300 refused jobs would wait out).
set(SLIMPI_MPIRUN_FLAGS --oversubscribe --allow-run-as-root --bind-to none --mca odls_base_sigkill_timeout 0)

function(slimpi_add_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE slimpi_core GTest::gtest GTest::gtest_main)
  slimpi_use_pch(${name})
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS unit TIMEOUT 300)
endfunction()

function(slimpi_add_mpi_test name)
  cmake_parse_arguments(T "" "" "NP;SOURCES;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/mpi/mpi_gtest_main.cpp)
  target_link_libraries(${name} PRIVATE slimpi_core GTest::gtest)
  slimpi_use_pch(${name})
  foreach(np ${T_NP})
    add_test(NAME ${name}_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${SLIMPI_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${np}
                     $<TARGET_FILE:${name}>)
    set_tests_properties(${name}_np${np} PROPERTIES LABELS "mpi;${T_LABELS}" TIMEOUT 300
                         ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
  endforeach()
endfunction()

# The numeric tests once more with the x86-64 kernels of another instruction set, so that
# a CI machine whose CPU picks other kernels cannot surprise us: MKL's AVX2 code (what MKL
# runs on AMD EPYC whatever its AVX-512), ATen's AVX2 kernels and oneDNN without AVX-512
# or AMX (what a Xeon's bf16 matmuls use). Registered as NAME_avx2 (serial) or
# NAME_npN_avx2 (NP N, under mpirun), label "isa".
set(SLIMPI_AVX2_ENV MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
function(slimpi_rerun_on_avx2 name)
  cmake_parse_arguments(T "" "NP" "" ${ARGN})
  if(T_NP)
    add_test(NAME ${name}_np${T_NP}_avx2
             COMMAND ${MPIEXEC_EXECUTABLE} ${SLIMPI_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${T_NP}
                     $<TARGET_FILE:${name}>)
    set_tests_properties(${name}_np${T_NP}_avx2 PROPERTIES LABELS "mpi;isa" TIMEOUT 300
                         ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE;${SLIMPI_AVX2_ENV}")
  else()
    add_test(NAME ${name}_avx2 COMMAND ${name})
    set_tests_properties(${name}_avx2 PROPERTIES LABELS "unit;isa" TIMEOUT 300 ENVIRONMENT "${SLIMPI_AVX2_ENV}")
  endif()
endfunction()
