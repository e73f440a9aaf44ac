# Compile-failure tests (label host): each tests/compile_fail/*.cpp (g++) or
# *.cu (nvcc) must fail to compile with an error matching its
# `// expect-error: <regex>` line. For refusals that are part of the API:
# concepts and static_asserts with plain messages for common mistakes.
# torch_*.cpp are registered only where Torch was found.
file(GLOB _replay_compile_fail CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/*.cpp
     ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/*.cu)
set(_replay_cf_work ${CMAKE_CURRENT_BINARY_DIR}/compile_fail)
file(MAKE_DIRECTORY ${_replay_cf_work})
set(_replay_cf_includes "-I${PROJECT_SOURCE_DIR}/include")
foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
  string(APPEND _replay_cf_includes "|-I${dir}")
endforeach()
# torch_*.cpp include the libtorch adapter: only where Torch was found, with its headers and flags.
set(_replay_cf_torch_flags)
if(TARGET replay_torch)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    string(APPEND _replay_cf_torch_flags "|-I${dir}")
  endforeach()
  separate_arguments(_replay_cf_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  foreach(flag IN LISTS _replay_cf_torch_cxx_flags)
    string(APPEND _replay_cf_torch_flags "|${flag}")
  endforeach()
endif()
foreach(source IN LISTS _replay_compile_fail)
  get_filename_component(name ${source} NAME_WE)
  get_filename_component(ext ${source} EXT)
  set(timeout 120)
  if(ext STREQUAL ".cu")
    set(compiler ${CMAKE_CUDA_COMPILER})
    set(flags "-std=c++20|--extended-lambda|${_replay_cf_includes}")
  else()
    set(compiler ${CMAKE_CXX_COMPILER})
    set(flags "-std=c++20|${_replay_cf_includes}")
  endif()
  if(name MATCHES "^torch_")
    if(NOT TARGET replay_torch)
      continue()
    endif()
    string(APPEND flags "${_replay_cf_torch_flags}")
    set(timeout 600)  # libtorch's headers take a while
  endif()
  add_test(NAME compile_fail.${name}
           COMMAND ${CMAKE_COMMAND} -DCOMPILER=${compiler} "-DFLAGS=${flags}" -DSOURCE=${source}
                   -DWORK_DIR=${_replay_cf_work} -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/expect_compile_error.cmake)
  set_tests_properties(compile_fail.${name} PROPERTIES LABELS host TIMEOUT ${timeout})
endforeach()
