# Configures, builds and optionally installs or runs a CMake project from a
# clean binary directory; ctest runs it as `cmake -P` (tests/packaging.cmake).
#
#   -DCMAKE_EXE=<cmake>         the CMake that configures and builds (default: this one)
#   -DSOURCE_DIR= -DBINARY_DIR= the project, and its (wiped) build directory
#   -DGENERATOR=<name>          as in cmake -G
#   -DARGS=-DA=1|-DB=2          cache arguments, separated by '|'
#   -DINSTALL_PREFIX=<dir>      after the build, cmake --install into this (wiped) prefix
#   -DEXPECT_NOTHING_INSTALLED=ON  after the build, cmake --install must install no file
#   -DRUN=<exe>                 after the build, run <BINARY_DIR>/<exe>; it must exit 0
#   -DEXPECT_ERROR=<regex>      the configure step must fail, with output matching regex
#   -DEXPECT_BUILD_ERROR=<regex> the configure step must succeed and the build fail, with
#                               output matching regex
#   -DONE_CUDA_RUNTIME=<target>:<static|shared>  (Ninja) the link command of <target> must
#                               name exactly one CUDA runtime, of that kind
cmake_minimum_required(VERSION 3.24)

foreach(required SOURCE_DIR BINARY_DIR GENERATOR)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "run_cmake_project.cmake: -D${required}=... is required")
  endif()
endforeach()
if(NOT CMAKE_EXE)
  set(CMAKE_EXE "${CMAKE_COMMAND}")
endif()
string(REPLACE "|" ";" cache_args "${ARGS}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc}):\n  ${ARGN}\n${out}")
  endif()
  message(STATUS "${what}: ok")
endfunction()

file(REMOVE_RECURSE "${BINARY_DIR}")
set(configure ${CMAKE_EXE} -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}" ${cache_args})

# expect_failure(<what> <regex> <command...>): the command must fail, with
# output matching regex (compared with whitespace squeezed: CMake wraps
# messages at word boundaries).
function(expect_failure what expect)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${what} was expected to fail, and succeeded:\n${out}")
  endif()
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")
  if(NOT flat MATCHES "${expect}")
    message(FATAL_ERROR "${what} failed, but its output does not match '${expect}':\n${out}")
  endif()
  message(STATUS "${what} failed as expected, saying:\n${out}")
endfunction()

if(DEFINED EXPECT_ERROR)
  expect_failure("configure" "${EXPECT_ERROR}" ${configure})
  return()
endif()

run_step("configure" ${configure})
if(DEFINED EXPECT_BUILD_ERROR)
  expect_failure("the build" "${EXPECT_BUILD_ERROR}" ${CMAKE_EXE} --build "${BINARY_DIR}")
  return()
endif()
run_step("build" ${CMAKE_EXE} --build "${BINARY_DIR}")

if(DEFINED ONE_CUDA_RUNTIME)
  string(REPLACE ":" ";" spec "${ONE_CUDA_RUNTIME}")
  list(GET spec 0 target)
  list(GET spec 1 kind)
  file(STRINGS "${BINARY_DIR}/CMakeCache.txt" make_program REGEX "^CMAKE_MAKE_PROGRAM:")
  string(REGEX REPLACE "^[^=]*=" "" make_program "${make_program}")
  execute_process(COMMAND "${make_program}" -C "${BINARY_DIR}" -t commands ${target}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE commands ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "could not list the commands of ${target} (${make_program}, Ninja only):\n${err}")
  endif()
  string(REGEX REPLACE "\n$" "" commands "${commands}")
  string(REGEX REPLACE "^.*\n" "" link "${commands}")  # the last command links the target
  set(found "")
  if(link MATCHES "cudart_static")
    list(APPEND found static)
  endif()
  if(link MATCHES "libcudart\\.so" OR link MATCHES "-lcudart( |$)")
    list(APPEND found shared)
  endif()
  if(NOT found STREQUAL kind)
    message(FATAL_ERROR "${target} must link exactly one CUDA runtime, the ${kind} one; its link "
                        "command names: '${found}'\n${link}")
  endif()
  message(STATUS "one CUDA runtime (${kind}) in the link of ${target}: ok")
endif()

if(INSTALL_PREFIX)
  file(REMOVE_RECURSE "${INSTALL_PREFIX}")
  run_step("install" ${CMAKE_EXE} --install "${BINARY_DIR}" --prefix "${INSTALL_PREFIX}")
endif()

if(EXPECT_NOTHING_INSTALLED)
  set(prefix "${BINARY_DIR}/install-check")
  file(REMOVE_RECURSE "${prefix}")
  run_step("install (expecting nothing)" ${CMAKE_EXE} --install "${BINARY_DIR}" --prefix "${prefix}")
  file(GLOB_RECURSE installed LIST_DIRECTORIES false "${prefix}/*")
  if(installed)
    list(JOIN installed "\n  " text)
    message(FATAL_ERROR "cmake --install installed files nobody asked for:\n  ${text}")
  endif()
endif()

if(RUN)
  execute_process(COMMAND "${BINARY_DIR}/${RUN}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message(STATUS "${RUN}: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${RUN} exited ${rc}")
  endif()
endif()
