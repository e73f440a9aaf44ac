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
  file(STRINGS ${header} implementation REGEX "^inline bool Server::listen_internal\\(\\)" LIMIT_COUNT 1)
  set(link)
  if(NOT implementation)
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
  endif()
  find_package(Threads REQUIRED)
  add_library(replay_httplib INTERFACE)
  target_include_directories(replay_httplib SYSTEM INTERFACE ${REPLAY_HTTPLIB_INCLUDE_DIR})
  target_link_libraries(replay_httplib INTERFACE Threads::Threads ${link})
  message(STATUS "replay: cpp-httplib: ${header} ${REPLAY_HTTPLIB_LIBRARY}")
endfunction()
