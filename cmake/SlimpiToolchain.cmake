# Compiler launcher, precompiled header and linker choices that keep builds cheap
# (DESIGN.md §6): ccache makes a rebuild ~48x faster; lld/gold link in ~0.3 s against
# ~1.6 s for bfd. SLIMPI_PCH: <ATen/ATen.h> (12 s of parsing in each of the ~100 files
# that include it) is compiled once and re-used by every target (slimpi_use_pch);
# ccache caches such compiles with the sloppiness its manual asks for.
option(SLIMPI_PCH "precompile <ATen/ATen.h> once for every target" ON)
find_program(SLIMPI_CCACHE ccache)
if(SLIMPI_CCACHE)
  set(slimpi_launcher ${SLIMPI_CCACHE})
  if(SLIMPI_PCH)
    set(slimpi_launcher ${CMAKE_COMMAND} -E env
        CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime ${SLIMPI_CCACHE})
  endif()
  set(CMAKE_CXX_COMPILER_LAUNCHER ${slimpi_launcher})
  set(CMAKE_C_COMPILER_LAUNCHER ${slimpi_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${slimpi_launcher})
endif()

# A target's C++ files take slimpi_core's precompiled <ATen/ATen.h> (when SLIMPI_PCH).
function(slimpi_use_pch target)
  if(SLIMPI_PCH)
    target_precompile_headers(${target} REUSE_FROM slimpi_core)
  endif()
endfunction()

include(CheckCXXSourceCompiles)
foreach(linker lld gold)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fuse-ld=${linker})
  check_cxx_source_compiles("int main(){return 0;}" SLIMPI_HAS_LD_${linker})
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(SLIMPI_HAS_LD_${linker})
    add_link_options(-fuse-ld=${linker})
    set(SLIMPI_LINKER ${linker})
    break()
  endif()
endforeach()
if(NOT SLIMPI_LINKER)
  set(SLIMPI_LINKER default)
endif()
