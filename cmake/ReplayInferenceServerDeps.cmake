# What examples/inference_server and its test need besides replay:
# cpp-httplib (cmake/ReplayHttplib.cmake), nlohmann_json (requests) and CLI11
# (flags). nlohmann_json and CLI11 are found through their CMake packages
# (Debian: nlohmann-json3-dev, libcli11-dev, both header-only), so an
# extracted package works when its usr/ is in CMAKE_PREFIX_PATH.
# replay_find_inference_server_deps() defines the target
# replay_inference_server_deps when all three are found; otherwise nothing,
# and a message says which are missing. With them and a second, current
# httplib (replay_find_httplib_current()), also
# replay_inference_server_deps_current: the same over that httplib.
include(${CMAKE_CURRENT_LIST_DIR}/ReplayHttplib.cmake)

# replay_find_nlohmann_json(): the target nlohmann_json::nlohmann_json, found
# GLOBAL (the examples and the tests, other directories, see the same one),
# or no target. Also used by examples/llm_decode (cmake/ReplayLlmDecode.cmake).
# Sets nlohmann_json_VERSION in the caller.
function(replay_find_nlohmann_json)
  # A second call finds the targets already there and defines nothing anew.
  find_package(nlohmann_json 3.9 CONFIG QUIET GLOBAL)
  set(nlohmann_json_VERSION ${nlohmann_json_VERSION} PARENT_SCOPE)
endfunction()

function(replay_find_inference_server_deps)
  get_property(checked GLOBAL PROPERTY REPLAY_INFERENCE_SERVER_DEPS_CHECKED)
  if(checked)
    return()
  endif()
  set_property(GLOBAL PROPERTY REPLAY_INFERENCE_SERVER_DEPS_CHECKED TRUE)
  replay_find_httplib()
  # GLOBAL: the example and the tests (another directory) see the same targets.
  replay_find_nlohmann_json()
  find_package(CLI11 2.0 CONFIG QUIET GLOBAL)
  set(missing)
  if(NOT TARGET replay_httplib)
    list(APPEND missing "cpp-httplib (libcpp-httplib-dev)")
  endif()
  if(NOT TARGET nlohmann_json::nlohmann_json)
    list(APPEND missing "nlohmann_json >= 3.9 (nlohmann-json3-dev)")
  endif()
  if(NOT CLI11_FOUND)
    list(APPEND missing "CLI11 >= 2.0 (libcli11-dev)")
  endif()
  if(missing)
    list(JOIN missing ", " text)
    message(STATUS "replay: examples/inference_server and its test are skipped: ${text} not found "
                   "(scripts/setup-deps.sh installs them; or add an extracted package's usr/ to CMAKE_PREFIX_PATH)")
    return()
  endif()
  add_library(replay_inference_server_deps INTERFACE)
  target_link_libraries(replay_inference_server_deps INTERFACE replay_httplib nlohmann_json::nlohmann_json CLI11::CLI11)
  replay_find_httplib_current()
  if(TARGET replay_httplib_current)
    add_library(replay_inference_server_deps_current INTERFACE)
    target_link_libraries(replay_inference_server_deps_current
                          INTERFACE replay_httplib_current nlohmann_json::nlohmann_json CLI11::CLI11)
  endif()
  message(STATUS "replay: inference_server: nlohmann_json ${nlohmann_json_VERSION} (${nlohmann_json_DIR}), "
                 "CLI11 ${CLI11_VERSION} (${CLI11_DIR})")
endfunction()
