# The scripts' own logic: scripts/bench_ratios.py (targets, the filters for
# confirming a miss, the median over re-runs) on made-up benchmark JSON, and
# scripts/gpu-check.sh's refusal of bad arguments.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME scripts.bench_ratios COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/bench_ratios_test.py)
  set_tests_properties(scripts.bench_ratios PROPERTIES LABELS host TIMEOUT 60)
else()
  message(STATUS "replay: no python3: the scripts.bench_ratios test is skipped")
endif()
find_program(REPLAY_BASH bash)
if(REPLAY_BASH)
  add_test(NAME scripts.gpu_check_arguments
           COMMAND ${REPLAY_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/gpu_check_arguments_test.sh ${PROJECT_SOURCE_DIR})
  set_tests_properties(scripts.gpu_check_arguments PROPERTIES LABELS host TIMEOUT 60)
endif()
# The include layout of include/replay/ (scripts/include_layout.py): shared
# internals include no component, no component's internals include another's.
if(Python3_Interpreter_FOUND)
  add_test(NAME scripts.include_layout COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/include_layout_test.py)
  set_tests_properties(scripts.include_layout PROPERTIES LABELS host TIMEOUT 60)
endif()
# scripts/test_summary.py: the closing counts of scripts/test.sh, from made-up ctest JUnit output.
if(Python3_Interpreter_FOUND)
  add_test(NAME scripts.test_summary COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_summary_test.py)
  set_tests_properties(scripts.test_summary PROPERTIES LABELS host TIMEOUT 60)
endif()
# bench/llm_decode/summarize.py: the goodput ratio across several runs and the
# bracket the search's resolution gives each, from made-up goodput reports.
if(Python3_Interpreter_FOUND)
  add_test(NAME scripts.summarize_goodput
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/summarize_goodput_test.py)
  set_tests_properties(scripts.summarize_goodput PROPERTIES LABELS host TIMEOUT 60)
endif()
# bench/llm_decode/summarize.py: the C++ bench and the Python peers judged
# against each other only at the same prompt and new tokens.
if(Python3_Interpreter_FOUND)
  add_test(NAME scripts.summarize_lengths
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/summarize_lengths_test.py)
  set_tests_properties(scripts.summarize_lengths PROPERTIES LABELS host TIMEOUT 60)
endif()
# bench/llm_decode/summarize.py: peers files merged batch by batch, and no
# verdict at a batch where an attempted peer was not measured.
if(Python3_Interpreter_FOUND)
  add_test(NAME scripts.summarize_peers
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/summarize_peers_test.py)
  set_tests_properties(scripts.summarize_peers PROPERTIES LABELS host TIMEOUT 60)
endif()
