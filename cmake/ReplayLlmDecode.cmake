# The decoder model of examples/llm_decode (its headers, namespace llm_decode):
# INTERFACE target llm_decode_model = those headers + replay::torch +
# replay::decode (the DecodeScheduler it serves with) +
# nlohmann_json (config.json), linked by the example and by its test
# (tests/llm_decode.cmake, configured before examples/). Defined by the first
# call of replay_llm_decode_model() where Torch and nlohmann_json were found;
# otherwise nothing, and a message says what is missing.
include(${CMAKE_CURRENT_LIST_DIR}/ReplayInferenceServerDeps.cmake)

function(replay_llm_decode_model)
  get_property(checked GLOBAL PROPERTY REPLAY_LLM_DECODE_MODEL_CHECKED)
  if(checked)
    return()
  endif()
  set_property(GLOBAL PROPERTY REPLAY_LLM_DECODE_MODEL_CHECKED TRUE)
  if(NOT TARGET replay_torch)
    message(STATUS "replay: examples/llm_decode and its test are skipped: Torch not found (see cmake/ReplayTorch.cmake)")
    return()
  endif()
  replay_find_nlohmann_json()
  if(NOT TARGET nlohmann_json::nlohmann_json)
    message(STATUS "replay: examples/llm_decode and its test are skipped: nlohmann_json >= 3.9 (nlohmann-json3-dev) "
                   "not found (scripts/setup-deps.sh installs it; or add an extracted package's usr/ to CMAKE_PREFIX_PATH)")
    return()
  endif()
  add_library(llm_decode_model INTERFACE)
  target_include_directories(llm_decode_model INTERFACE ${PROJECT_SOURCE_DIR}/examples/llm_decode)
  target_link_libraries(llm_decode_model INTERFACE replay::torch replay::decode nlohmann_json::nlohmann_json)
  # The device code, compiled by nvcc: the kernel that sets the WHILE node
  # around the captured step (several steps per launch, loop_control.cu) and
  # the fused decode kernels (fused_kernels.cu); the rest is host code.
  add_library(llm_decode_loop STATIC ${PROJECT_SOURCE_DIR}/examples/llm_decode/loop_control.cu
                                     ${PROJECT_SOURCE_DIR}/examples/llm_decode/fused_kernels.cu)
  target_link_libraries(llm_decode_loop PUBLIC replay::replay)
  # One CUDA runtime in the program: libtorch's shared one.
  set_target_properties(llm_decode_loop PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  target_link_libraries(llm_decode_model INTERFACE llm_decode_loop)
endfunction()
