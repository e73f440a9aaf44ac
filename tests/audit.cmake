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

# Beside CUPTI: a program that uses CUPTI itself includes <cupti.h>, before
# or after replay's audit, in one translation unit, under g++ and nvcc.
set(_replay_audit_beside_cupti)
foreach(order IN ITEMS cupti_first audit_first)
  if(order STREQUAL "cupti_first")
    set(content "#include <cupti.h>\n#include <replay/audit.hpp>\n")
  else()
    set(content "#include <replay/audit.hpp>\n#include <cupti.h>\n")
  endif()
  string(APPEND content "int replay_audit_beside_${order}() { return CUPTI_API_VERSION > 0 ? 0 : 1; }\n")
  foreach(ext IN ITEMS cpp cu)
    set(src ${CMAKE_CURRENT_BINARY_DIR}/audit_beside_cupti/${order}.${ext})
    file(CONFIGURE OUTPUT ${src} CONTENT "${content}")
    list(APPEND _replay_audit_beside_cupti ${src})
  endforeach()
endforeach()
add_library(replay_audit_beside_cupti OBJECT ${_replay_audit_beside_cupti})
target_link_libraries(replay_audit_beside_cupti PRIVATE replay::audit)
replay_target_warnings(replay_audit_beside_cupti)
add_dependencies(replay_tests replay_audit_beside_cupti)
