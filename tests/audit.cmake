# The capture audit (replay/audit.hpp): only where the CUDA toolkit has
# CUPTI (cmake/ReplayAudit.cmake). host: the pure logic (API kinds, frame
# filtering, classification of made-up calls, inventory, report text and
# JSON, the symbolizer on this program's own stack). gpu: planted causes
# captured on the device, each checked for its API, error (or "escaped"),
# thread and source line.
if(NOT TARGET replay_audit)
  return()
endif()
replay_add_test(NAME audit SOURCES host/audit_test.cpp gpu/audit_test.cu SUITES host gpu
                LIBRARIES replay::audit Threads::Threads)
# Source lines for the frames the reports name: line tables (-g), and no
# sibling calls, which would drop the frame of a planted call that is the
# last thing its function does.
target_compile_options(test_audit PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:-g -fno-optimize-sibling-calls>
  $<$<COMPILE_LANGUAGE:CUDA>:-g -Xcompiler=-fno-optimize-sibling-calls>)

# Every audit header compiles on its own, under g++ and nvcc, twice in a row.
file(GLOB_RECURSE _replay_audit_headers RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/include/replay/audit/*.hpp)
replay_header_check(NAME replay_audit_header_check HEADERS replay/audit.hpp ${_replay_audit_headers}
                    LIBRARIES replay::audit)
