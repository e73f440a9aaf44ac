# Conan build module: included at the end of the replay-config.cmake that
# Conan's CMakeDeps writes (conanfile.py names it in cmake_build_modules).
# It gives the Conan-made replay::replay what cmake/replayConfig.cmake.in
# gives the installed one: the system CUDA toolkit (CUDA::cudart), C++20 for
# .cu files, replay::decode when COMPONENTS decode is requested, and
# replay::torch when COMPONENTS torch is.
# conanfile.py's package() fills in the minimum CUDA version from CMakeLists.txt.
set(_replay_cuda_min "@REPLAY_CUDATOOLKIT_MIN_VERSION@")

find_package(CUDAToolkit ${_replay_cuda_min} QUIET)
if(NOT CUDAToolkit_FOUND)
  set(replay_FOUND FALSE)
  string(CONCAT replay_NOT_FOUND_MESSAGE
      "replay needs the CUDA toolkit (CUDAToolkit) ${_replay_cuda_min} or newer from the system, and "
      "find_package(CUDAToolkit) found none. Install it and put its nvcc on PATH, or point "
      "CUDAToolkit_ROOT at it.")
  return()
endif()

get_target_property(_replay_links replay::replay REPLAY_USAGE_ADDED)
if(NOT _replay_links)
  set_property(TARGET replay::replay PROPERTY REPLAY_USAGE_ADDED TRUE)
  # One CUDA runtime, the one the consumer's target asks for (as CMakeLists.txt does).
  set(_replay_rt "$<UPPER_CASE:$<TARGET_PROPERTY:CUDA_RUNTIME_LIBRARY>>")
  set_property(TARGET replay::replay APPEND PROPERTY INTERFACE_LINK_LIBRARIES
    "$<$<STREQUAL:${_replay_rt},SHARED>:CUDA::cudart>"
    "$<$<OR:$<STREQUAL:${_replay_rt},STATIC>,$<STREQUAL:${_replay_rt},>>:CUDA::cudart_static>")
  unset(_replay_rt)
  # CMake hands C++20 to nvcc only from 3.25.2 on; see replayConfig.cmake.in.
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.25.2)
    set_property(TARGET replay::replay APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20 cuda_std_20)
  else()
    set_property(TARGET replay::replay APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
  endif()
endif()
unset(_replay_links)

# COMPONENTS decode: replay::decode, the DecodeScheduler (its headers are in
# the package), links the threads library for its worker thread.
if("decode" IN_LIST replay_FIND_COMPONENTS AND NOT TARGET replay::decode)
  set(replay_decode_FOUND FALSE)
  find_package(Threads QUIET)
  if(Threads_FOUND)
    add_library(replay::decode INTERFACE IMPORTED)
    set_property(TARGET replay::decode PROPERTY INTERFACE_LINK_LIBRARIES replay::replay Threads::Threads)
    set(replay_decode_FOUND TRUE)
  elseif(replay_FIND_REQUIRED_decode)
    set(replay_FOUND FALSE)
    set(replay_NOT_FOUND_MESSAGE "replay: the decode component needs the threads library, and find_package(Threads) found none")
  elseif(NOT replay_FIND_QUIETLY)
    message(STATUS "replay: optional component decode not available: find_package(Threads) found no threads library")
  endif()
endif()

# COMPONENTS torch: replay::torch links Torch (libtorch) found on the system.
if("torch" IN_LIST replay_FIND_COMPONENTS AND NOT TARGET replay::torch)
  set(replay_torch_FOUND FALSE)
  set(_replay_torch_problem "")
  if(NOT EXISTS "${CMAKE_CURRENT_LIST_DIR}/../../../include/replay/torch.hpp")
    set(_replay_torch_problem "this version of replay has no torch adapter (include/replay/torch.hpp)")
  else()
    find_package(Torch QUIET)
    if(NOT (Torch_FOUND OR TORCH_FOUND))
      set(_replay_torch_problem "the torch component needs Torch (libtorch) from the system: set Torch_DIR")
    else()
      add_library(replay::torch INTERFACE IMPORTED)
      # libtorch's shared CUDA runtime only (see cmake/ReplayTorch.cmake).
      set_property(TARGET replay::torch PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart torch)
      set_property(TARGET replay::torch PROPERTY INTERFACE_INCLUDE_DIRECTORIES
                   "$<TARGET_PROPERTY:replay::replay,INTERFACE_INCLUDE_DIRECTORIES>")
      set_property(TARGET replay::torch PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
      if(TORCH_CXX_FLAGS)  # as cmake/ReplayTorch.cmake does (the C++11 ABI setting)
        separate_arguments(_replay_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
        set_property(TARGET replay::torch PROPERTY INTERFACE_COMPILE_OPTIONS
                     "$<$<COMPILE_LANGUAGE:CXX>:${_replay_torch_cxx_flags}>")
        unset(_replay_torch_cxx_flags)
      endif()
      set(replay_torch_FOUND TRUE)
    endif()
  endif()
  if(NOT replay_torch_FOUND AND replay_FIND_REQUIRED_torch)
    set(replay_FOUND FALSE)
    set(replay_NOT_FOUND_MESSAGE "replay: ${_replay_torch_problem}")
  elseif(NOT replay_torch_FOUND AND NOT replay_FIND_QUIETLY)
    message(STATUS "replay: optional component torch not available: ${_replay_torch_problem}")
  endif()
  unset(_replay_torch_problem)
endif()
unset(_replay_cuda_min)
