# The goodput search of examples/llm_decode (`llm_decode goodput`): which
# offered rates it tries, what passes the SLO, how policies and repeats are
# compared. Pure C++ (examples/llm_decode/goodput.hpp), so always built.
replay_add_test(NAME llm_goodput_host SOURCES host/llm_goodput_test.cpp SUITES host)
target_include_directories(test_llm_goodput_host PRIVATE ${PROJECT_SOURCE_DIR}/examples/llm_decode)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC flags members left to their defaults in designated initializers.
  target_compile_options(test_llm_goodput_host PRIVATE -Wno-missing-field-initializers)
endif()
