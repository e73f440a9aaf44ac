# Run after each test program is built (POST_BUILD, see replay_add_test in
# tests/CMakeLists.txt): lists the program's test cases per doctest suite and
# writes one ctest entry per case, labelled with its suite, into CTEST_FILE.
# Fails the build when the program holds fewer cases than its minimum in
# tests/expected_cases.txt, so a program cannot quietly lose its tests.
#   -DEXE=... -DNAME=... -DSUITES=host;gpu -DMIN_CASES=n -DCTEST_FILE=...
cmake_minimum_required(VERSION 3.24)
set(script "")
set(total 0)
foreach(suite IN LISTS SUITES)
  # --no-skip: list the gpu cases too on a machine without a GPU.
  execute_process(COMMAND "${EXE}" --list-test-cases --no-skip --test-suite=${suite} --no-version
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "replay: '${EXE} --list-test-cases' failed (${rc}):\n${out}\n${err}")
  endif()
  # A ';' in a name would split CMake's list: carry it as a '?' wildcard in the filter.
  string(REPLACE ";" "<semicolon>" out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  set(count 0)
  foreach(line IN LISTS lines)
    if(line STREQUAL "" OR line MATCHES "^\\[doctest\\]" OR line MATCHES "^=+$")
      continue()
    endif()
    math(EXPR count "${count} + 1")
    # doctest's filter treats ',' as a separator and '\' as its escape.
    string(REPLACE "\\" "\\\\" filter "${line}")
    string(REPLACE "," "\\," filter "${filter}")
    string(REPLACE "<semicolon>" "?" filter "${filter}")
    string(REPLACE "<semicolon>" "," line "${line}")
    string(APPEND script
      "add_test([==[${NAME}.${suite}: ${line}]==] [==[${EXE}]==] [==[--test-case=${filter}]==] --test-suite=${suite} --no-version)\n"
      "set_tests_properties([==[${NAME}.${suite}: ${line}]==] PROPERTIES SKIP_RETURN_CODE 77 LABELS ${suite} ENVIRONMENT \"\${REPLAY_TEST_ENV}\")\n")
  endforeach()
  if(count EQUAL 0)
    message(FATAL_ERROR "replay: ${EXE} has no test case in suite '${suite}'; "
                        "drop '${suite}' from its SUITES in replay_add_test")
  endif()
  math(EXPR total "${total} + ${count}")
endforeach()
if(total LESS MIN_CASES)
  message(FATAL_ERROR "replay: ${EXE} holds ${total} test cases, fewer than the ${MIN_CASES} that "
                      "tests/expected_cases.txt expects; a test was lost (or lower the minimum there "
                      "on purpose)")
endif()
file(WRITE "${CTEST_FILE}" "${script}")
