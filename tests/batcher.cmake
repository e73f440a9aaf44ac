# Batcher: the gathering policy and the Batcher with a stand-in executor on
# the CPU (host), the CUDA executor over a ShapeRouter against eager results
# with real threads (gpu).
replay_add_test(NAME batcher SOURCES host/batcher_test.cpp gpu/batcher_test.cu SUITES host gpu)

# The inference server built with the CPU stand-in model, driven over real
# sockets on loopback by tests/host/inference_server_test.py: one ctest entry
# per group of checks (answers, input, limits, slow, shutdown; debug runs a
# debug build of the server), against each httplib the server was built
# with. Needs the server's dependencies (the example is skipped without
# them) and python3.
include(${PROJECT_SOURCE_DIR}/cmake/ReplayInferenceServerDeps.cmake)
replay_find_inference_server_deps()
if(REPLAY_BUILD_EXAMPLES AND TARGET replay_inference_server_deps)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    # Against each httplib the server was built with: the system's, and a
    # current release's where one was given (inference_server_httplib_current,
    # entries "inference_server_httplib_current.host: <group>").
    set(servers inference_server)
    # Under ThreadSanitizer, a precompiled libcpp-httplib (Debian's) synchronizes
    # where the sanitizer cannot see it and its races would be false ones: only
    # the header-only build is tested there.
    get_property(precompiled GLOBAL PROPERTY REPLAY_HTTPLIB_PRECOMPILED)
    if(REPLAY_SANITIZE STREQUAL "thread" AND precompiled)
      set(servers "")
      message(STATUS "replay: REPLAY_SANITIZE=thread: inference_server (a precompiled libcpp-httplib) is not "
                     "tested; inference_server_httplib_current is, where a header-only httplib.h was given")
    endif()
    if(TARGET replay_inference_server_deps_current)
      list(APPEND servers inference_server_httplib_current)
    endif()
    # Under a sanitizer, two checks are left out: std::bad_alloc from a capped address space (the
    # sanitizers' allocators end the program instead) and the bound on peak resident memory.
    set(sanitized "")
    if(REPLAY_SANITIZE)
      set(sanitized --sanitized)
    endif()
    foreach(server IN LISTS servers)
      foreach(group IN ITEMS answers input limits slow shutdown debug)
        add_test(NAME "${server}.host: ${group}"
                 COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/host/inference_server_test.py
                         $<TARGET_FILE:${server}> --debug-server $<TARGET_FILE:${server}_debug> --group ${group}
                         ${sanitized})
        set_tests_properties("${server}.host: ${group}" PROPERTIES LABELS host TIMEOUT 120)
      endforeach()
      # The edit loop (target replay_tests) builds what these host tests run.
      add_dependencies(replay_tests ${server} ${server}_debug)
      add_dependencies(replay_host_tests ${server} ${server}_debug)
    endforeach()
  else()
    message(STATUS "replay: no python3: the inference_server test is skipped")
  endif()
else()
  message(STATUS "replay: the inference_server test is skipped (examples off, or the server's dependencies missing)")
endif()
