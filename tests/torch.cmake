# The libtorch adapter's tests (replay/torch.hpp): only where Torch was found
# (cmake/ReplayTorch.cmake). Compiled by the host C++ compiler: libtorch code
# is not meant for nvcc. The ResNet-50 definition is shared with the example.
if(TARGET replay_torch)
  # With the capture audit (CUPTI): also its case inside a GraphedCallable.
  set(_replay_torch_test_sources gpu/torch_test.cpp)
  set(_replay_torch_test_libraries replay::torch)
  if(TARGET replay_audit)
    list(APPEND _replay_torch_test_sources gpu/torch_audit_test.cpp)
    list(APPEND _replay_torch_test_libraries replay::audit)
  endif()
  replay_add_test(NAME torch SOURCES ${_replay_torch_test_sources} SUITES host gpu
                  LIBRARIES ${_replay_torch_test_libraries})
  if(TARGET replay_audit)
    # Source lines for the audit's frames. The TorchScript modules are
    # defined as the example defines its own (examples/capture_audit/script_source.hpp).
    set_source_files_properties(gpu/torch_audit_test.cpp PROPERTIES COMPILE_OPTIONS "-g;-fno-optimize-sibling-calls")
    target_include_directories(test_torch PRIVATE ${PROJECT_SOURCE_DIR}/examples/capture_audit)
  endif()
  target_include_directories(test_torch PRIVATE ${PROJECT_SOURCE_DIR}/examples/torch_resnet)
  # Breakable captures (GraphedOptions::breaks): their own program, so that
  # the thread-local RecordFunction callbacks of one case never meet another's.
  replay_add_test(NAME torch_piecewise SOURCES gpu/torch_piecewise_test.cpp SUITES host gpu LIBRARIES replay::torch)
  set_target_properties(test_torch_piecewise PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  # The test main links replay::replay too: one runtime, libtorch's shared one.
  set_target_properties(test_torch PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  # Every adapter header compiles on its own (the rest are checked in tests/CMakeLists.txt).
  replay_header_check_sources(_replay_torch_header_sources EXTENSIONS cpp HEADERS ${REPLAY_TORCH_HEADERS})
  add_library(replay_torch_header_check OBJECT ${_replay_torch_header_sources})
  target_link_libraries(replay_torch_header_check PRIVATE replay::torch)
  replay_target_warnings(replay_torch_header_check)
endif()
# GCC 12/13 warn about members left to their default initializers in a
# designated initializer ({.batch_buckets = ...}), the idiom the options are
# made for.
if(TARGET test_torch AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(test_torch PRIVATE -Wno-missing-field-initializers)
  target_compile_options(test_torch_piecewise PRIVATE -Wno-missing-field-initializers)
  target_compile_options(replay_torch_header_check PRIVATE -Wno-missing-field-initializers)
endif()
