# The optional libtorch adapter: INTERFACE target replay_torch (alias
# replay::torch) = replay::replay + Torch, for include/replay/torch.hpp.
#
#   -DREPLAY_WITH_TORCH=ON                   Torch is required (configure fails without it)
#   -DCMAKE_PREFIX_PATH=<torch cmake prefix> Torch is used when found (the default looks quietly;
#                                            as a subproject only if the parent already found Torch)
#   -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON    never look for Torch
#
# With a pip wheel the prefix is `python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'`.
# Without Torch nothing else changes: the adapter's test, example and benchmark
# are simply not defined (REPLAY_TORCH_FOUND is FALSE).
#
# Torch's CMake config (Caffe2Config.cmake -> public/cuda.cmake) has side
# effects on the calling scope that would change how every other CUDA target
# of this project is built: it enables CUDA, sets CMAKE_CUDA_ARCHITECTURES to
# OFF ("pytorch is not compatible with CMAKE_CUDA_ARCHITECTURES") and appends
# -gencode flags for a dozen architectures, --expt-relaxed-constexpr and more
# to CMAKE_CUDA_FLAGS. find_package cannot run in a function (the imported
# targets and enable_language must be at directory scope), so the variables it
# touches are saved before and restored after.
set(REPLAY_TORCH_FOUND FALSE)

if(CMAKE_DISABLE_FIND_PACKAGE_Torch AND NOT REPLAY_WITH_TORCH)
  return()
endif()
# As a subproject (FetchContent, add_subdirectory) replay looks for Torch only
# when asked (REPLAY_WITH_TORCH) or when the parent has already found it:
# finding it on its own would add Torch's targets and CUDA settings to a
# parent that never asked for them.
if(NOT PROJECT_IS_TOP_LEVEL AND NOT REPLAY_WITH_TORCH AND NOT TARGET torch)
  return()
endif()

# Saves <var>'s normal (non-cache) binding, if it has one that differs from the cache.
macro(_replay_torch_save var)
  if(DEFINED ${var} AND NOT "${${var}}" STREQUAL "$CACHE{${var}}")
    set(_replay_torch_saved_${var} "${${var}}")
    set(_replay_torch_had_${var} TRUE)
  else()
    set(_replay_torch_had_${var} FALSE)
  endif()
endmacro()
macro(_replay_torch_restore var)
  if(_replay_torch_had_${var})
    set(${var} "${_replay_torch_saved_${var}}")
  else()
    unset(${var})  # the cache value (if any) shows through again
  endif()
  unset(_replay_torch_saved_${var})
  unset(_replay_torch_had_${var})
endmacro()

set(_replay_torch_vars
    CMAKE_CUDA_ARCHITECTURES CMAKE_CUDA_FLAGS CMAKE_CUDA_STANDARD CMAKE_CUDA_STANDARD_REQUIRED
    CMAKE_MODULE_PATH CUDA_NVCC_FLAGS)
if(DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(_replay_torch_arch_was_defined TRUE)
else()
  set(_replay_torch_arch_was_defined FALSE)
endif()
foreach(_replay_torch_var IN LISTS _replay_torch_vars)
  _replay_torch_save(${_replay_torch_var})
endforeach()

if(REPLAY_WITH_TORCH)
  find_package(Torch REQUIRED)
else()
  find_package(Torch QUIET)
endif()

foreach(_replay_torch_var IN LISTS _replay_torch_vars)
  _replay_torch_restore(${_replay_torch_var})
endforeach()
# When Torch enabled CUDA before the project chose architectures, CMake put
# the compiler's default in the cache; drop it so that the project's own
# default (CMakeLists.txt: 90 for the tests, benchmarks and examples) applies,
# as it would have without Torch. A parent project that consumes replay and
# has not enabled CUDA keeps CMake's default.
if(NOT _replay_torch_arch_was_defined AND PROJECT_IS_TOP_LEVEL
   AND (REPLAY_BUILD_TESTS OR REPLAY_BUILD_BENCHMARKS OR REPLAY_BUILD_EXAMPLES))
  unset(CMAKE_CUDA_ARCHITECTURES CACHE)
endif()
unset(_replay_torch_arch_was_defined)
unset(_replay_torch_var)
unset(_replay_torch_vars)

if(NOT (Torch_FOUND OR TORCH_FOUND))
  message(STATUS "replay: Torch not found: the libtorch adapter (replay::torch) is not built "
                 "(add Torch's CMake prefix to CMAKE_PREFIX_PATH, or set REPLAY_WITH_TORCH=ON to require it)")
  return()
endif()
set(REPLAY_TORCH_FOUND TRUE)
message(STATUS "replay: Torch ${Torch_VERSION} found (${TORCH_INSTALL_PREFIX}): building the libtorch adapter")

# In the build tree the adapter links exactly what TorchConfig.cmake says to
# (${TORCH_LIBRARIES}, which carries TORCH_CXX_FLAGS, the C++11 ABI setting,
# through the imported targets). Installed, it names the imported target
# `torch`, which links the rest; the consumer's find_package(Torch) (run by
# replayConfig.cmake for the torch component) defines it, so no path of this
# machine is baked into the installed files.
add_library(replay_torch INTERFACE)
add_library(replay::torch ALIAS replay_torch)
set(_replay_torch_build_libs)
foreach(_replay_torch_lib IN LISTS TORCH_LIBRARIES)
  list(APPEND _replay_torch_build_libs "$<BUILD_INTERFACE:${_replay_torch_lib}>")
endforeach()
# Not replay::replay: libtorch links the shared CUDA runtime, so the adapter
# takes replay's headers and C++20 with CUDA::cudart (the same libcudart.so),
# never cudart_static beside it. A target that links replay::replay as well
# sets CUDA_RUNTIME_LIBRARY Shared (see docs/packaging.md).
target_include_directories(replay_torch INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(replay_torch INTERFACE cxx_std_20)
target_link_libraries(replay_torch INTERFACE CUDA::cudart ${_replay_torch_build_libs} "$<INSTALL_INTERFACE:torch>")
if(TORCH_CXX_FLAGS)
  separate_arguments(_replay_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(replay_torch INTERFACE "$<$<COMPILE_LANGUAGE:CXX>:${_replay_torch_cxx_flags}>")
  unset(_replay_torch_cxx_flags)
endif()
unset(_replay_torch_build_libs)
unset(_replay_torch_lib)
