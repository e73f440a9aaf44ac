# Compiles SOURCE, which must FAIL, with output matching the regex on its line
#   // expect-error: <regex>
# (a compile-failure test: the refusal of a misuse is part of the API).
#   cmake -DCOMPILER=... -DFLAGS=a|b -DSOURCE=... -P expect_compile_error.cmake
cmake_minimum_required(VERSION 3.24)
file(STRINGS "${SOURCE}" expect REGEX "^// expect-error: ")
if(NOT expect)
  message(FATAL_ERROR "${SOURCE} has no '// expect-error: <regex>' line")
endif()
list(GET expect 0 expect)
string(REGEX REPLACE "^// expect-error: " "" expect "${expect}")
string(REPLACE "|" ";" flags "${FLAGS}")
get_filename_component(name "${SOURCE}" NAME)
execute_process(COMMAND "${COMPILER}" ${flags} -c "${SOURCE}" -o "${WORK_DIR}/${name}.o"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${name} compiled, but it must be refused (expected an error matching '${expect}')")
endif()
if(NOT out MATCHES "${expect}")
  message(FATAL_ERROR "${name} was refused, but not with an error matching '${expect}':\n${out}")
endif()
message(STATUS "${name}: refused as expected ('${expect}')")
