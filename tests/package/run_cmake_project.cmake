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

if(DEFINED EXPECT_ERROR)
  execute_process(COMMAND ${configure} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "configure was expected to fail, and succeeded:\n${out}")
  endif()
  # CMake wraps messages at word boundaries: compare with whitespace squeezed.
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")
  if(NOT flat MATCHES "${EXPECT_ERROR}")
    message(FATAL_ERROR "configure failed, but its output does not match '${EXPECT_ERROR}':\n${out}")
  endif()
  message(STATUS "configure failed as expected, saying:\n${out}")
  return()
endif()

run_step("configure" ${configure})
run_step("build" ${CMAKE_EXE} --build "${BINARY_DIR}")

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
