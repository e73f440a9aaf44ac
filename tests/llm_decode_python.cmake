# The Python side of the LLM decode example on the CPU
# (tests/host/llm_decode_python_test.py): examples/llm_decode/llama.py against
# its own full forward and against transformers' LlamaForCausalLM,
# scripts/llm_decode_compare.py, bench/llm_decode/decode_peers.py --smoke.
# Registered only where python3 imports torch; when Torch was found as the
# libtorch of a pip wheel (Torch_DIR = <site>/torch/share/cmake/Torch), that
# wheel's <site> leads PYTHONPATH, so that the test runs the torch the C++ side
# builds against. Without transformers its comparisons are skipped inside the
# test.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  set(_replay_llm_python_path "$ENV{PYTHONPATH}")
  if(Torch_DIR MATCHES "^(.+)/torch/share/cmake/Torch/?$")
    set(_replay_llm_torch_site "${CMAKE_MATCH_1}")
    if(NOT EXISTS "${_replay_llm_torch_site}/torch/__init__.py")
      # A libtorch without the Python package.
    elseif(_replay_llm_python_path STREQUAL "")
      set(_replay_llm_python_path "${_replay_llm_torch_site}")
    else()
      set(_replay_llm_python_path "${_replay_llm_torch_site}:${_replay_llm_python_path}")
    endif()
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${_replay_llm_python_path}"
                          ${Python3_EXECUTABLE} -c "import torch"
                  RESULT_VARIABLE _replay_llm_torch_import OUTPUT_QUIET ERROR_QUIET TIMEOUT 120)
  if(_replay_llm_torch_import EQUAL 0)
    add_test(NAME llm_decode.python
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/host/llm_decode_python_test.py)
    # Exit 77: torch stopped importing after configuration (ctest: skipped).
    set_tests_properties(llm_decode.python PROPERTIES LABELS host TIMEOUT 600 SKIP_RETURN_CODE 77
                         ENVIRONMENT "PYTHONPATH=${_replay_llm_python_path}")
  else()
    message(STATUS "replay: python3 cannot import torch: the llm_decode.python test is skipped")
  endif()
else()
  message(STATUS "replay: no python3: the llm_decode.python test is skipped")
endif()
