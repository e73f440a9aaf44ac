# The installed replayConfigVersion.cmake answers find_package's version
# requests by the stated policy: SameMinorVersion while the major version is 0
# (a 0.y minor release may break the API), SameMajorVersion from 1.0 on; and
# it is ARCH_INDEPENDENT (header-only: a 32-bit consumer may use it too).
#   cmake -P check_version_policy.cmake -DVERSION_FILE=<.../replayConfigVersion.cmake>
cmake_minimum_required(VERSION 3.24)

# Asks the version file about `request` the way find_package does.
function(ask request out_compatible out_exact)
  set(PACKAGE_FIND_VERSION "${request}")
  string(REPLACE "." ";" parts "${request}")
  list(LENGTH parts PACKAGE_FIND_VERSION_COUNT)
  list(APPEND parts 0 0 0)
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
  set(PACKAGE_FIND_NAME replay)
  set(CMAKE_SIZEOF_VOID_P 4)  # not the 8 the package was made on
  include("${VERSION_FILE}")
  if(PACKAGE_VERSION_UNSUITABLE)
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
  endif()
  set(${out_compatible} "${PACKAGE_VERSION_COMPATIBLE}" PARENT_SCOPE)
  set(${out_exact} "${PACKAGE_VERSION_EXACT}" PARENT_SCOPE)
  set(installed_version "${PACKAGE_VERSION}" PARENT_SCOPE)
endfunction()

ask(0.0.0 ignored ignored)
string(REPLACE "." ";" v "${installed_version}")
list(GET v 0 major)
list(GET v 1 minor)
list(GET v 2 patch)
math(EXPR next_major "${major} + 1")
math(EXPR next_minor "${minor} + 1")
math(EXPR next_patch "${patch} + 1")

# request -> expected compatible (and exact for the full version)
set(cases "${major}.${minor}=TRUE" "${major}.${minor}.${patch}=TRUE" "${major}.${minor}.${next_patch}=FALSE"
          "${major}.${next_minor}=FALSE" "${next_major}.0=FALSE" "99=FALSE")
if(major EQUAL 0)
  if(minor GREATER 0)
    math(EXPR prev_minor "${minor} - 1")
    list(APPEND cases "0.${prev_minor}=FALSE")  # SameMinorVersion
  endif()
else()
  list(APPEND cases "${major}=TRUE" "${major}.0=TRUE")  # SameMajorVersion
  math(EXPR prev_major "${major} - 1")
  list(APPEND cases "${prev_major}.0=FALSE")
endif()

set(problems "")
foreach(case IN LISTS cases)
  string(REPLACE "=" ";" case "${case}")
  list(GET case 0 request)
  list(GET case 1 expected)
  ask(${request} compatible exact)
  set(got FALSE)
  if(compatible)
    set(got TRUE)
  endif()
  if(NOT got STREQUAL expected)
    list(APPEND problems "find_package(replay ${request}) against ${installed_version}: compatible=${got}, expected ${expected}")
  else()
    message(STATUS "find_package(replay ${request}) against ${installed_version}: compatible=${expected}")
  endif()
endforeach()
ask(${installed_version} compatible exact)
if(NOT exact)
  list(APPEND problems "find_package(replay ${installed_version} EXACT) is not reported exact")
endif()

if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "replayConfigVersion.cmake breaks the version policy:\n  ${text}")
endif()
