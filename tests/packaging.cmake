# Packaging checks (docs/packaging.md): each consumer in tests/package/ is a
# separate CMake project, configured and built from scratch by a `cmake -P`
# driver with this build's generator, compilers and CUDA architectures. None
# needs a GPU: the consumer programs run, check their host side, and run their
# graph round trip only where a device exists.
set(_pkg_src ${PROJECT_SOURCE_DIR}/tests/package)
set(_pkg_work ${PROJECT_BINARY_DIR}/package-tests)
set(_pkg_prefix ${_pkg_work}/prefix)

# Arguments every consumer gets ('|'-separated for the driver).
set(_pkg_common "-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}|-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}")
if(CMAKE_MAKE_PROGRAM)
  string(APPEND _pkg_common "|-DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}")
endif()
set(_pkg_cuda "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}|-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}")
if(CMAKE_CUDA_HOST_COMPILER)
  string(APPEND _pkg_cuda "|-DCMAKE_CUDA_HOST_COMPILER=${CMAKE_CUDA_HOST_COMPILER}")
endif()

# replay_package_test(NAME n SOURCE dir [CMAKE exe] [ARGS a|b] [RUN exe] [EXPECT_ERROR regex]
#                     [EXPECT_BUILD_ERROR regex] [ONE_CUDA_RUNTIME target:static|shared]
#                     [INSTALL_PREFIX dir] [EXPECT_NOTHING_INSTALLED] [NEEDS_INSTALL])
function(replay_package_test)
  cmake_parse_arguments(ARG "NEEDS_INSTALL;EXPECT_NOTHING_INSTALLED" "NAME;SOURCE;CMAKE;ARGS;RUN;EXPECT_ERROR;EXPECT_BUILD_ERROR;ONE_CUDA_RUNTIME;INSTALL_PREFIX" "" ${ARGN})
  set(driver_args "-DSOURCE_DIR=${ARG_SOURCE}" "-DBINARY_DIR=${_pkg_work}/${ARG_NAME}"
                  "-DGENERATOR=${CMAKE_GENERATOR}" "-DARGS=${ARG_ARGS}")
  foreach(opt CMAKE RUN EXPECT_ERROR EXPECT_BUILD_ERROR ONE_CUDA_RUNTIME INSTALL_PREFIX)
    if(DEFINED ARG_${opt})
      set(var ${opt})
      if(opt STREQUAL "CMAKE")
        set(var CMAKE_EXE)
      endif()
      list(APPEND driver_args "-D${var}=${ARG_${opt}}")
    endif()
  endforeach()
  if(ARG_EXPECT_NOTHING_INSTALLED)
    list(APPEND driver_args -DEXPECT_NOTHING_INSTALLED=ON)
  endif()
  add_test(NAME package.${ARG_NAME}
           COMMAND ${CMAKE_COMMAND} ${driver_args} -P ${_pkg_src}/run_cmake_project.cmake)
  set_tests_properties(package.${ARG_NAME} PROPERTIES LABELS package TIMEOUT 300)
  if(ARG_NEEDS_INSTALL)
    set_tests_properties(package.${ARG_NAME} PROPERTIES FIXTURES_REQUIRED replay_package_installed)
  endif()
endfunction()

find_program(REPLAY_CONAN_EXECUTABLE conan DOC "Conan 2, for the package.conan_create test")

# One version everywhere: CMakeLists.txt, version.hpp, vcpkg.json, conanfile.py.
add_test(NAME package.versions_agree
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DCONAN=${REPLAY_CONAN_EXECUTABLE}
                 -P ${_pkg_src}/check_versions.cmake)
set_tests_properties(package.versions_agree PROPERTIES LABELS package TIMEOUT 120
                     ENVIRONMENT CONAN_HOME=${_pkg_work}/conan-inspect-home)

# Install replay the way a package manager does (tests, benchmarks, examples
# off) into a prefix that the find_package consumers use.
set(_pkg_install_args "-DREPLAY_BUILD_TESTS=OFF|-DREPLAY_BUILD_BENCHMARKS=OFF|-DREPLAY_BUILD_EXAMPLES=OFF|-DREPLAY_INSTALL=ON")
if(TARGET replay_torch)
  # Torch's config enables CUDA, so this configure needs the CUDA settings too.
  string(APPEND _pkg_install_args "|${_pkg_cuda}|-DREPLAY_WITH_TORCH=ON|-DTorch_DIR=${Torch_DIR}")
else()
  string(APPEND _pkg_install_args "|-DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON")
endif()
if(TARGET replay_nccl)
  get_filename_component(_pkg_nccl_root "${NCCL_INCLUDE_DIR}/.." ABSOLUTE)
  string(APPEND _pkg_install_args "|-DREPLAY_WITH_NCCL=ON|-DNCCL_ROOT=${_pkg_nccl_root}")
else()
  string(APPEND _pkg_install_args "|-DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON")
endif()
replay_package_test(NAME install SOURCE ${PROJECT_SOURCE_DIR} INSTALL_PREFIX ${_pkg_prefix}
                    ARGS "${_pkg_common}|${_pkg_install_args}")
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP replay_package_installed)

add_test(NAME package.version_policy
         COMMAND ${CMAKE_COMMAND} -DVERSION_FILE=${_pkg_prefix}/share/cmake/replay/replayConfigVersion.cmake
                 -P ${_pkg_src}/check_version_policy.cmake)
set_tests_properties(package.version_policy PROPERTIES LABELS package TIMEOUT 60 FIXTURES_REQUIRED replay_package_installed)

# find_package after install: a CUDA + C++ consumer, and a C++-only one (no
# CUDA language: cuda_std_20 on the target must not trouble it).
# Each also checks that its link names exactly one CUDA runtime: the one its
# target's CUDA_RUNTIME_LIBRARY asks for (CMake's default: static).
replay_package_test(NAME find_package SOURCE ${_pkg_src}/find_package NEEDS_INSTALL RUN consumer
                    ONE_CUDA_RUNTIME consumer:static
                    ARGS "${_pkg_common}|${_pkg_cuda}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_EXPECTED_VERSION=${PROJECT_VERSION}")
replay_package_test(NAME find_package_shared_runtime SOURCE ${_pkg_src}/find_package NEEDS_INSTALL RUN consumer
                    ONE_CUDA_RUNTIME consumer:shared
                    ARGS "${_pkg_common}|${_pkg_cuda}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared")
replay_package_test(NAME find_package_cxx_only SOURCE ${_pkg_src}/find_package NEEDS_INSTALL RUN consumer
                    ONE_CUDA_RUNTIME consumer:static
                    ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_CONSUMER_CUDA=OFF")

# A consumer on a CMake older than 3.25.2 (Debian 12's 3.25.1, if present):
# the package must not hand it cuda_std_20, which that CMake rejects.
set(REPLAY_OLD_CMAKE /usr/bin/cmake CACHE FILEPATH "A CMake in [3.24, 3.25.2) to test consumers with, if present")
if(EXISTS "${REPLAY_OLD_CMAKE}")
  execute_process(COMMAND ${REPLAY_OLD_CMAKE} --version OUTPUT_VARIABLE _pkg_old_cmake_version ERROR_QUIET)
  if(_pkg_old_cmake_version MATCHES "cmake version ([0-9]+\\.[0-9]+\\.[0-9]+)")
    set(_pkg_old_cmake_version ${CMAKE_MATCH_1})
    if(_pkg_old_cmake_version VERSION_GREATER_EQUAL 3.24 AND _pkg_old_cmake_version VERSION_LESS 3.25.2)
      replay_package_test(NAME find_package_cmake_${_pkg_old_cmake_version} SOURCE ${_pkg_src}/find_package
                          CMAKE ${REPLAY_OLD_CMAKE} NEEDS_INSTALL RUN consumer
                          ARGS "${_pkg_common}|${_pkg_cuda}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}")
    endif()
  endif()
endif()

# FetchContent from this checkout; checks inside that nothing leaks into the
# parent, and here that nothing gets installed.
replay_package_test(NAME fetchcontent SOURCE ${_pkg_src}/fetchcontent RUN consumer EXPECT_NOTHING_INSTALLED
                    ONE_CUDA_RUNTIME consumer:static
                    ARGS "${_pkg_common}|${_pkg_cuda}|-DREPLAY_SOURCE_DIR=${PROJECT_SOURCE_DIR}")

# Bad input: each must fail, saying why.
replay_package_test(NAME bad.version_too_new SOURCE ${_pkg_src}/find_errors NEEDS_INSTALL
                    ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_CASE=version_too_new"
                    EXPECT_ERROR "compatible with requested version \"99\".*replayConfig.cmake, version: ${PROJECT_VERSION}")
replay_package_test(NAME bad.unknown_component SOURCE ${_pkg_src}/find_errors NEEDS_INSTALL
                    ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_CASE=unknown_component"
                    EXPECT_ERROR "replay has no component 'no_such_part'")
# No CUDA: CUDAToolkit_ROOT names an empty folder and CUDACXX is unset, which
# FindCUDAToolkit honours before PATH or /usr/local/cuda.
file(MAKE_DIRECTORY ${_pkg_work}/no-cuda-here)
replay_package_test(NAME bad.no_cuda SOURCE ${_pkg_src}/find_errors NEEDS_INSTALL
                    ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_CASE=no_cuda|-DCUDAToolkit_ROOT=${_pkg_work}/no-cuda-here"
                    EXPECT_ERROR "replay needs the CUDA toolkit \\(CUDAToolkit\\) ${REPLAY_CUDATOOLKIT_MIN_VERSION} or newer")
set_tests_properties(package.bad.no_cuda PROPERTIES ENVIRONMENT_MODIFICATION "CUDACXX=unset:;CUDA_PATH=unset:;CUDAToolkit_ROOT=unset:")

if(TARGET replay_torch)
  # The adapter was built: the torch component must load, with Torch.
  # ...and run: on a GPU it graphs a tensor function and checks the replays.
  # One CUDA runtime: libtorch's shared one.
  replay_package_test(NAME torch_component SOURCE ${_pkg_src}/torch NEEDS_INSTALL RUN torch_consumer
                      ONE_CUDA_RUNTIME torch_consumer:shared
                      ARGS "${_pkg_common}|${_pkg_cuda}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DTorch_DIR=${Torch_DIR}")
else()
  replay_package_test(NAME bad.torch_not_installed SOURCE ${_pkg_src}/find_errors NEEDS_INSTALL
                      ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_CASE=torch_missing"
                      EXPECT_ERROR "the torch component was not installed")
  replay_package_test(NAME optional_torch_absent SOURCE ${_pkg_src}/find_errors NEEDS_INSTALL
                      ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_CASE=optional_torch")
endif()

if(TARGET replay_decode)
  # The decode scheduler (always defined, cmake/ReplayDecode.cmake): the decode
  # component must load, link the threads library and run a DecodeScheduler
  # over a stand-in executor (no device needed), from a C++-only project.
  replay_package_test(NAME decode_component SOURCE ${_pkg_src}/decode NEEDS_INSTALL RUN decode_consumer
                      ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}")
endif()

if(TARGET replay_audit)
  # The capture audit was built (the toolkit has CUPTI): it must load, link
  # CUPTI and, with a GPU, audit a clean capture.
  replay_package_test(NAME audit_component SOURCE ${_pkg_src}/audit NEEDS_INSTALL RUN audit_consumer
                      ARGS "${_pkg_common}|${_pkg_cuda}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}")
endif()

if(TARGET replay_nccl)
  # The NCCL component was built: it must load, find NCCL and link it.
  replay_package_test(NAME nccl_component SOURCE ${_pkg_src}/nccl NEEDS_INSTALL RUN nccl_consumer
                      ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DNCCL_ROOT=${_pkg_nccl_root}")
else()
  replay_package_test(NAME bad.nccl_not_installed SOURCE ${_pkg_src}/find_errors NEEDS_INSTALL
                      ARGS "${_pkg_common}|-DCMAKE_PREFIX_PATH=${_pkg_prefix}|-DREPLAY_CASE=nccl_missing"
                      EXPECT_ERROR "the nccl component was not installed")
endif()

# Conan 2: conan create . -nr, offline, in a Conan home of its own.
add_test(NAME package.conan_create
         COMMAND ${CMAKE_COMMAND} -DCONAN=${REPLAY_CONAN_EXECUTABLE} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -DWORK_DIR=${_pkg_work}/conan "-DGENERATOR=${CMAKE_GENERATOR}"
                 -DCUDA_COMPILER=${CMAKE_CUDA_COMPILER} -DCUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}
                 -P ${_pkg_src}/conan_create.cmake)
set_tests_properties(package.conan_create PROPERTIES LABELS package TIMEOUT 300)

# vcpkg: the overlay port's portfile under stand-ins for vcpkg's helpers
# (vcpkg itself cannot be installed here).
add_test(NAME package.vcpkg_port
         COMMAND ${CMAKE_COMMAND} -DPORT_DIR=${PROJECT_SOURCE_DIR}/ports/replay -DWORK_DIR=${_pkg_work}/vcpkg
                 "-DGENERATOR=${CMAKE_GENERATOR}" -P ${_pkg_src}/vcpkg_port_smoke.cmake)
set_tests_properties(package.vcpkg_port PROPERTIES LABELS package TIMEOUT 300)

# The README's "Use it in your project": its CMakeLists.txt and main.cu are
# extracted from README.md and built as a project of their own (with
# FETCHCONTENT_SOURCE_DIR_REPLAY pointing at this checkout), so the README
# cannot drift from what works.
add_test(NAME package.readme
         COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/README.md -DWORK_DIR=${_pkg_work}/readme
                 "-DGENERATOR=${CMAKE_GENERATOR}" "-DARGS=${_pkg_common}|${_pkg_cuda}|-DFETCHCONTENT_SOURCE_DIR_REPLAY=${PROJECT_SOURCE_DIR}"
                 -DDRIVER=${_pkg_src}/run_cmake_project.cmake
                 -P ${_pkg_src}/readme_blocks.cmake)
set_tests_properties(package.readme PROPERTIES LABELS package TIMEOUT 300)

# A .cu file compiled as C++17 (an old CMake that drops CUDA_STANDARD 20, or
# nvcc without -std=c++20): one clear error naming the fix, not a wall.
replay_package_test(NAME cxx17_is_refused SOURCE ${_pkg_src}/cxx17
                    ARGS "${_pkg_common}|${_pkg_cuda}|-DREPLAY_INCLUDE_DIR=${PROJECT_SOURCE_DIR}/include"
                    EXPECT_BUILD_ERROR "replay needs C\\+\\+20\\. Compile with -std=c\\+\\+20")

# Every public header, as a consumer includes it, is warning-free under
# -Wall -Wextra -Wpedantic -Werror with the host compiler and with nvcc.
set(_pkg_warning_args "${_pkg_common}|${_pkg_cuda}|-DREPLAY_INCLUDE_DIR=${PROJECT_SOURCE_DIR}/include")
if(TARGET replay_torch)
  string(APPEND _pkg_warning_args "|-DTorch_DIR=${Torch_DIR}")
endif()
replay_package_test(NAME warnings SOURCE ${_pkg_src}/warnings ARGS "${_pkg_warning_args}")
set_tests_properties(package.warnings PROPERTIES TIMEOUT 900)
