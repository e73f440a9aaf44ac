# `conan create . -nr` offline, in a Conan home of its own (so that a user's
# ~/.conan2 is neither used nor touched), with test_package copied out of the
# tree (Conan builds test_package in place). Then checks that validate()
# refuses a C++17 consumer.
#   cmake -P conan_create.cmake -DCONAN=<conan> -DSOURCE_DIR=<repo> -DWORK_DIR=<dir>
#         -DGENERATOR=Ninja -DCUDA_COMPILER=<nvcc> -DCUDA_ARCHITECTURES=90
cmake_minimum_required(VERSION 3.24)

if(NOT CONAN)
  message(FATAL_ERROR "conan (2.x) was not found when this build was configured: "
                      "pip install conan (scripts/setup-deps.sh installs the pinned version), then reconfigure")
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(COPY "${SOURCE_DIR}/test_package" DESTINATION "${WORK_DIR}" PATTERN build EXCLUDE
     PATTERN CMakeUserPresets.json EXCLUDE)
set(ENV{CONAN_HOME} "${WORK_DIR}/conan-home")

function(conan what)
  execute_process(COMMAND "${CONAN}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(conan_rc ${rc} PARENT_SCOPE)
  set(conan_out "${out}" PARENT_SCOPE)
  if(what STREQUAL "must-fail")
    return()
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "conan ${ARGN} failed (exit ${rc}):\n${out}")
  endif()
  message(STATUS "conan ${ARGV1}: ok")
endfunction()

conan(must-succeed profile detect)
set(common -nr -s compiler.cppstd=20
    -c "tools.cmake.cmaketoolchain:generator=${GENERATOR}"
    -c "tools.cmake.cmaketoolchain:extra_variables={'CMAKE_CUDA_ARCHITECTURES': '${CUDA_ARCHITECTURES}', 'CMAKE_CUDA_COMPILER': '${CUDA_COMPILER}'}")
conan(must-succeed create "${SOURCE_DIR}" ${common} -tf "${WORK_DIR}/test_package")
message(STATUS "${conan_out}")
if(NOT conan_out MATCHES "replay [0-9.]+ from Conan")
  message(FATAL_ERROR "conan create succeeded, but test_package's program did not report")
endif()

conan(must-fail create "${SOURCE_DIR}" -nr -s compiler.cppstd=17 --test-folder=)
if(conan_rc EQUAL 0 OR NOT conan_out MATCHES "cppstd.*20")
  message(FATAL_ERROR "a C++17 profile was not refused by validate() with a message about C++20:\n${conan_out}")
endif()
message(STATUS "C++17 refused as expected")
