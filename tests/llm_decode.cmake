# The decoder model of examples/llm_decode (cmake/ReplayLlmDecode.cmake): only
# where Torch and nlohmann_json were found. Host cases run the model on the
# CPU in float32 (the "tiny" config); gpu cases in float16 on CUDA, and its
# decode step captured in a CUDA graph (llm_decode_model links replay::torch
# and replay::decode). Compiled by the host C++ compiler, as
# the libtorch adapter's tests are (tests/torch.cmake). The engine cases
# (gpu/llm_decode_engine_test.cpp) check the graphed executor against eager.
include(${PROJECT_SOURCE_DIR}/cmake/ReplayLlmDecode.cmake)
replay_llm_decode_model()
if(TARGET llm_decode_model)
  replay_add_test(NAME llm_decode SOURCES host/llm_decode_model_test.cpp host/llm_product_tuning_test.cpp
                          gpu/llm_decode_model_test.cpp
                          gpu/llm_decode_engine_test.cpp
                  SUITES host gpu LIBRARIES llm_decode_model)
  # The test main links replay::replay too: one runtime, libtorch's shared one.
  set_target_properties(test_llm_decode PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
endif()
if(TARGET test_llm_decode AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # Designated initializers leave members to their defaults on purpose.
  target_compile_options(test_llm_decode PRIVATE -Wno-missing-field-initializers)
endif()
