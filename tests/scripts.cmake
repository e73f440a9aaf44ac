# The scripts' own logic: scripts/bench_ratios.py (targets, the filters for
# confirming a miss, the median over re-runs) on made-up benchmark JSON.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME scripts.bench_ratios COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/bench_ratios_test.py)
  set_tests_properties(scripts.bench_ratios PROPERTIES LABELS host TIMEOUT 60)
else()
  message(STATUS "replay: no python3: the scripts.bench_ratios test is skipped")
endif()
