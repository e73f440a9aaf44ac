# Finds NCCL and defines the imported target NCCL::nccl (headers + the shared
# library), unless it exists already. Used by cmake/ReplayNccl.cmake in the
# build tree and, installed next to replayConfig.cmake, by the nccl component.
#
# Where it looks, in order: NCCL_ROOT (CMake or environment variable),
# NCCL_HOME (environment), CMAKE_PREFIX_PATH and the system paths (a system
# NCCL, e.g. libnccl-dev), the `nvidia-nccl-cu*` wheel next to a found Torch
# (site-packages/nvidia/nccl), and last the wheel in python3's site-packages.
# Wheels ship lib/libnccl.so.2 without the unversioned libnccl.so symlink, so
# the library is looked for under both names and imported by its exact file.
#
# Sets NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR and NCCL_LIBRARY (cache).
include_guard(GLOBAL)

function(_replay_nccl_python_prefix out)
  set(${out} "" PARENT_SCOPE)
  find_program(_replay_nccl_python NAMES python3 python)
  if(NOT _replay_nccl_python)
    return()
  endif()
  # __path__, not __file__: the wheel's nvidia/nccl may be a namespace package.
  execute_process(
    COMMAND "${_replay_nccl_python}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc TIMEOUT 30)
  if(rc EQUAL 0 AND IS_DIRECTORY "${prefix}")
    set(${out} "${prefix}" PARENT_SCOPE)
  endif()
endfunction()

if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  set(_replay_nccl_hints)
  foreach(_replay_nccl_hint IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "$ENV{NCCL_HOME}")
    if(_replay_nccl_hint)
      list(APPEND _replay_nccl_hints "${_replay_nccl_hint}")
    endif()
  endforeach()
  if(TORCH_INSTALL_PREFIX AND IS_DIRECTORY "${TORCH_INSTALL_PREFIX}/../nvidia/nccl")
    get_filename_component(_replay_nccl_hint "${TORCH_INSTALL_PREFIX}/../nvidia/nccl" ABSOLUTE)
    list(APPEND _replay_nccl_hints "${_replay_nccl_hint}")
  endif()
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_replay_nccl_hints} PATH_SUFFIXES include
            DOC "Folder holding nccl.h")
  # The library next to the header first, so that the two always match;
  # NAMES_PER_DIR: a folder's libnccl.so.2 before another folder's libnccl.so.
  if(NCCL_INCLUDE_DIR)
    get_filename_component(_replay_nccl_hint "${NCCL_INCLUDE_DIR}/.." ABSOLUTE)
    list(PREPEND _replay_nccl_hints "${_replay_nccl_hint}")
  endif()
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_replay_nccl_hints}
               PATH_SUFFIXES lib lib64 DOC "The NCCL shared library")
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    _replay_nccl_python_prefix(_replay_nccl_wheel)
    if(_replay_nccl_wheel)
      unset(NCCL_INCLUDE_DIR CACHE)
      unset(NCCL_LIBRARY CACHE)
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS "${_replay_nccl_wheel}" PATH_SUFFIXES include NO_DEFAULT_PATH
                DOC "Folder holding nccl.h")
      find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS "${_replay_nccl_wheel}"
                   PATH_SUFFIXES lib NO_DEFAULT_PATH DOC "The NCCL shared library")
    endif()
  endif()
  unset(_replay_nccl_hints)
  unset(_replay_nccl_hint)
  unset(_replay_nccl_wheel)
endif()

set(NCCL_FOUND FALSE)
set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _replay_nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_replay_nccl_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_replay_nccl_part} +([0-9]+).*" "\\1" _replay_nccl_${_replay_nccl_part}
           "${_replay_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${_replay_nccl_MAJOR}.${_replay_nccl_MINOR}.${_replay_nccl_PATCH}")
  unset(_replay_nccl_version_lines)
  unset(_replay_nccl_part)
  unset(_replay_nccl_MAJOR)
  unset(_replay_nccl_MINOR)
  unset(_replay_nccl_PATCH)
  set(NCCL_FOUND TRUE)
  if(NOT TARGET NCCL::nccl)
    # SHARED with the exact file (libnccl.so.2 in a wheel): the link line names
    # the file, the executable records its soname, and the build tree's RPATH
    # gets its folder.
    add_library(NCCL::nccl SHARED IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    # Not a system include folder (-I, not -isystem): the header must be found
    # before any other nccl.h, such as one a CUDA toolkit folder may hold,
    # which would otherwise shadow it and not match the library.
    if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.25)
      set_property(TARGET NCCL::nccl PROPERTY SYSTEM FALSE)
    else()
      set_property(TARGET NCCL::nccl PROPERTY IMPORTED_NO_SYSTEM TRUE)
    endif()
    if(TARGET CUDA::cudart)
      set_property(TARGET NCCL::nccl APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
    endif()
  endif()
endif()
