# The scripts' own logic, each test on made-up input (tests/scripts/<name>_test.py):
#   bench_ratios       scripts/bench_ratios.py: targets, the filters for confirming a miss, the median over re-runs;
#   include_layout     scripts/include_layout.py: shared internals include no component, no component's
#                      internals include another's;
#   test_summary       scripts/test_summary.py: the closing counts of scripts/test.sh, from ctest JUnit output;
#   summarize_goodput  bench/llm_decode/summarize.py: the goodput ratio across runs and the bracket the
#                      search's resolution gives each;
#   summarize_lengths  the same: the C++ bench and the Python peers judged only at the same prompt and new tokens;
#   summarize_peers    the same: peers files merged batch by batch, no verdict where a peer ran out of time,
#                      and --pair: each peer against its own run's C++ step;
#   summarize_trace    bench/kernel_trace/summarize_trace.py: steps cut at idle time or at an anchor kernel,
#                      graphed work only, each step's span split into durations and idle time;
#   piecewise_summary  bench/torch_piecewise_bench.py: each ratio against its target, the hand-written
#                      break's ratios only where the C++ side measured it (imported without torch);
#   bert_table         bench/torch_bert_bench.py: the targets per shape, and the bound lines against the
#                      bucket's graph launched raw only where the C++ side timed it (imported without torch);
# and scripts/gpu-check.sh's refusal of bad arguments.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  foreach(name IN ITEMS bench_ratios include_layout test_summary summarize_goodput summarize_lengths summarize_peers
                    summarize_trace piecewise_summary bert_table)
    add_test(NAME scripts.${name} COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/${name}_test.py)
    set_tests_properties(scripts.${name} PROPERTIES LABELS host TIMEOUT 60)
  endforeach()
else()
  message(STATUS "replay: no python3: the scripts.* tests of the Python scripts are skipped")
endif()
find_program(REPLAY_BASH bash)
if(REPLAY_BASH)
  # gpu_check_arguments: bad arguments refused before anything is written;
  # gpu_check_sanitizer: a device compute-sanitizer refuses is reported as such.
  foreach(name gpu_check_arguments gpu_check_sanitizer)
    add_test(NAME scripts.${name}
             COMMAND ${REPLAY_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/${name}_test.sh ${PROJECT_SOURCE_DIR})
    set_tests_properties(scripts.${name} PROPERTIES LABELS host TIMEOUT 60)
  endforeach()
endif()
