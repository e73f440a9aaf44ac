# Batcher: the gathering policy and the Batcher with a stand-in executor on
# the CPU (host), the CUDA executor over a ShapeRouter against eager results
# with real threads (gpu).
replay_add_test(NAME batcher SOURCES host/batcher_test.cpp gpu/batcher_test.cu SUITES host gpu)

# The inference server built with the CPU stand-in model, driven over HTTP by
# Python's http.client: correct answers, 400, 503, 504, clean SIGTERM. Needs
# cpp-httplib (the example is skipped without it) and python3.
include(${PROJECT_SOURCE_DIR}/cmake/ReplayHttplib.cmake)
replay_find_httplib()
if(REPLAY_BUILD_EXAMPLES AND TARGET replay_httplib)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    add_test(NAME inference_server.host
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/host/inference_server_test.py
                     $<TARGET_FILE:inference_server>)
    set_tests_properties(inference_server.host PROPERTIES LABELS host TIMEOUT 120)
    add_dependencies(replay_tests inference_server)  # the edit loop builds what its host tests run
  else()
    message(STATUS "replay: no python3: the inference_server test is skipped")
  endif()
else()
  message(STATUS "replay: the inference_server test is skipped (examples off or no cpp-httplib)")
endif()
