# Test and benchmark dependencies. Installed packages are used first
# (FIND_PACKAGE_ARGS); the scripts install Debian's doctest-dev and
# libbenchmark-dev, so no download is needed. A download happens only if a
# package is missing and the network allows it.
include(FetchContent)

function(replay_require_doctest)
  if(TARGET doctest::doctest)
    return()
  endif()
  FetchContent_Declare(doctest
    GIT_REPOSITORY https://github.com/doctest/doctest.git
    GIT_TAG v2.4.11
    FIND_PACKAGE_ARGS 2.4 CONFIG)
  FetchContent_MakeAvailable(doctest)
endfunction()

function(replay_require_benchmark)
  if(TARGET benchmark::benchmark)
    return()
  endif()
  set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
  set(BENCHMARK_ENABLE_GTEST_TESTS OFF CACHE BOOL "" FORCE)
  FetchContent_Declare(benchmark
    GIT_REPOSITORY https://github.com/google/benchmark.git
    GIT_TAG v1.8.3
    FIND_PACKAGE_ARGS 1.7 CONFIG)
  FetchContent_MakeAvailable(benchmark)
endfunction()
