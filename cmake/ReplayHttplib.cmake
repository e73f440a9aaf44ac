# cpp-httplib for examples/inference_server and its test.
#
# replay_find_httplib() defines the target replay_httplib when httplib.h is
# found: in REPLAY_HTTPLIB_INCLUDE_DIR when set (a CMake variable, or an
# environment variable of that name when configuring: a directory holding
# httplib.h, e.g. usr/include of an extracted libcpp-httplib-dev .deb), else
# on the system (/usr/include). Upstream's httplib.h is header-only. Debian's
# libcpp-httplib-dev ships a split header whose implementation lives in
# libcpp-httplib.so; then that library is linked too: REPLAY_HTTPLIB_LIBRARY,
# else found in $REPLAY_HTTPLIB_LIBRARY_DIR, next to the header
# (<dir>/../lib/<multiarch>, <dir>/../lib) or on the system; at run time it
# needs OpenSSL 3, zlib and brotli. Without httplib nothing is defined and
# the callers say so.
#
# replay_find_httplib_current() defines the target replay_httplib_current
# for a second httplib, a current release's header-only httplib.h, in
# REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR (a CMake variable or an environment
# variable of that name; scripts/setup-deps.sh fetches one into
# build/httplib-current/ under REPLAY_SETUP_PACKAGING=1). The server is
# then built against both (inference_server_httplib_current). Without it
# nothing is defined, with a message; a plain build goes on.

# replay_httplib_version(<header> <out-var>): the CPPHTTPLIB_VERSION it says.
function(replay_httplib_version header out)
  file(STRINGS ${header} line REGEX "^#define CPPHTTPLIB_VERSION \"[0-9.]+\"" LIMIT_COUNT 1)
  string(REGEX REPLACE ".*\"([0-9.]+)\".*" "\\1" version "${line}")
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# replay_httplib_is_split(<header> <out-var>): TRUE when the header holds
# declarations only (Debian's), its implementation in libcpp-httplib.so.
function(replay_httplib_is_split header out)
  file(STRINGS ${header} implementation REGEX "^inline bool Server::listen_internal\\(\\)" LIMIT_COUNT 1)
  if(implementation)
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

function(replay_find_httplib)
  get_property(checked GLOBAL PROPERTY REPLAY_HTTPLIB_CHECKED)
  if(checked)
    return()
  endif()
  set_property(GLOBAL PROPERTY REPLAY_HTTPLIB_CHECKED TRUE)
  find_path(REPLAY_HTTPLIB_INCLUDE_DIR httplib.h HINTS ENV REPLAY_HTTPLIB_INCLUDE_DIR
            DOC "Directory holding cpp-httplib's httplib.h (examples/inference_server)")
  if(NOT REPLAY_HTTPLIB_INCLUDE_DIR OR NOT EXISTS ${REPLAY_HTTPLIB_INCLUDE_DIR}/httplib.h)
    message(STATUS "replay: cpp-httplib (httplib.h) not found: examples/inference_server and its test are "
                   "skipped (install libcpp-httplib-dev, or set REPLAY_HTTPLIB_INCLUDE_DIR)")
    return()
  endif()
  set(header ${REPLAY_HTTPLIB_INCLUDE_DIR}/httplib.h)
  replay_httplib_version(${header} version)
  replay_httplib_is_split(${header} split)
  set(link)
  if(split)
    find_library(REPLAY_HTTPLIB_LIBRARY NAMES cpp-httplib libcpp-httplib.so.0.11
                 HINTS ENV REPLAY_HTTPLIB_LIBRARY_DIR
                       ${REPLAY_HTTPLIB_INCLUDE_DIR}/../lib/${CMAKE_LIBRARY_ARCHITECTURE}
                       ${REPLAY_HTTPLIB_INCLUDE_DIR}/../lib/x86_64-linux-gnu
                       ${REPLAY_HTTPLIB_INCLUDE_DIR}/../lib ${REPLAY_HTTPLIB_INCLUDE_DIR}
                 DOC "libcpp-httplib, for a split httplib.h (Debian's)")
    if(NOT REPLAY_HTTPLIB_LIBRARY)
      message(STATUS "replay: ${header} is a split header (Debian's) but libcpp-httplib was not found: "
                     "examples/inference_server and its test are skipped (set REPLAY_HTTPLIB_LIBRARY)")
        return()
    endif()
    # Its own dependencies (OpenSSL, zlib, brotli) are needed when it runs,
    # not when linking against it.
    set(link ${REPLAY_HTTPLIB_LIBRARY} -Wl,--allow-shlib-undefined)
    # (compiled apart: ThreadSanitizer does not see into it; tests/batcher.cmake)
    set_property(GLOBAL PROPERTY REPLAY_HTTPLIB_PRECOMPILED TRUE)
  endif()
  find_package(Threads REQUIRED)
  add_library(replay_httplib INTERFACE)
  target_include_directories(replay_httplib SYSTEM INTERFACE ${REPLAY_HTTPLIB_INCLUDE_DIR})
  target_link_libraries(replay_httplib INTERFACE Threads::Threads ${link})
  message(STATUS "replay: cpp-httplib ${version}: ${header} ${REPLAY_HTTPLIB_LIBRARY}")
endfunction()

function(replay_find_httplib_current)
  get_property(checked GLOBAL PROPERTY REPLAY_HTTPLIB_CURRENT_CHECKED)
  if(checked)
    return()
  endif()
  set_property(GLOBAL PROPERTY REPLAY_HTTPLIB_CURRENT_CHECKED TRUE)
  set(REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR "" CACHE PATH
      "Directory holding a current release's header-only httplib.h: the server is built against it too")
  if(NOT REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR AND DEFINED ENV{REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR})
    # (scripts/setup-deps.sh exports it once it has fetched the header, maybe after a first configure)
    set_property(CACHE REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR PROPERTY VALUE "$ENV{REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR}")
  endif()
  set(dir ${REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR})
  if(NOT dir)
    message(STATUS "replay: no second cpp-httplib given: inference_server_httplib_current is skipped "
                   "(set REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR to a directory holding a current httplib.h; "
                   "scripts/setup-deps.sh fetches one under REPLAY_SETUP_PACKAGING=1)")
    return()
  endif()
  if(NOT EXISTS ${dir}/httplib.h)
    message(STATUS "replay: REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR=${dir} holds no httplib.h: "
                   "inference_server_httplib_current is skipped")
    return()
  endif()
  replay_httplib_version(${dir}/httplib.h version)
  replay_httplib_is_split(${dir}/httplib.h split)
  if(split)
    message(STATUS "replay: ${dir}/httplib.h (cpp-httplib ${version}) is a split header; the second build wants "
                   "upstream's header-only one: inference_server_httplib_current is skipped")
    return()
  endif()
  find_package(Threads REQUIRED)
  add_library(replay_httplib_current INTERFACE)
  # (-isystem: searched before /usr/include, where a system httplib.h may be too)
  target_include_directories(replay_httplib_current SYSTEM INTERFACE ${dir})
  target_link_libraries(replay_httplib_current INTERFACE Threads::Threads)
  set_property(GLOBAL PROPERTY REPLAY_HTTPLIB_CURRENT_VERSION ${version})
  message(STATUS "replay: cpp-httplib ${version} (second build, inference_server_httplib_current): ${dir}/httplib.h")
endfunction()
