# The NCCL component (replay/nccl.hpp): only where NCCL was found
# (cmake/ReplayNccl.cmake). nccl_host: the policies on the CPU (errors, unique
# id exchange, bucket agreement, watchdog) with stand-ins. nccl: one-rank
# communicators and collectives captured in graphs (gpu). nccl_multi: two GPUs
# or more (suite gpu_multi, skipped with fewer; see tests/support/gpu_suite.hpp):
# its own program, which scripts/gpu-check.sh leaves to gpu-check.d/nccl.sh.
if(NOT TARGET replay_nccl)
  return()
endif()
replay_add_test(NAME nccl_host SOURCES host/nccl_test.cpp SUITES host LIBRARIES replay::nccl)
replay_add_test(NAME nccl SOURCES gpu/nccl_test.cu SUITES gpu LIBRARIES replay::nccl)
replay_add_test(NAME nccl_multi SOURCES gpu/nccl_multi_test.cu SUITES gpu_multi LIBRARIES replay::nccl)

# Every NCCL header compiles on its own, under g++ and nvcc, twice in a row.
file(GLOB _replay_nccl_headers RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/include/replay/nccl/*.hpp)
replay_header_check(NAME replay_nccl_header_check HEADERS replay/nccl.hpp ${_replay_nccl_headers}
                    LIBRARIES replay::nccl)
