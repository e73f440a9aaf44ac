# The capture audit's benchmark (bench/audit/audit_bench.cu): only where
# the audit was built (cmake/ReplayAudit.cmake, CUPTI found). Its binary
# sits with the others in bench/, so scripts/gpu-check.sh runs it and reads
# bench/audit_bench.ratios in the CUDA-only lane.
if(TARGET replay_audit)
  add_executable(audit_bench ${CMAKE_CURRENT_LIST_DIR}/audit/audit_bench.cu)
  target_link_libraries(audit_bench PRIVATE replay::audit benchmark::benchmark)
  target_include_directories(audit_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  replay_target_warnings(audit_bench)
endif()
