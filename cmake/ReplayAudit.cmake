# The optional capture audit: INTERFACE target replay_audit (alias
# replay::audit) = replay::replay + CUPTI (CUDA::cupti, from FindCUDAToolkit)
# + the dynamic loader's library (dladdr), for include/replay/audit.hpp.
#
#   -DREPLAY_WITH_AUDIT=ON     CUPTI is required (configure fails without it)
#   (default)                  the audit is built when the CUDA toolkit has CUPTI
#
# Without CUPTI nothing else changes: the component's tests, benchmark and
# example are simply not defined (REPLAY_AUDIT_FOUND is FALSE), and replay's
# other targets never depend on it.
option(REPLAY_WITH_AUDIT "Require CUPTI and build the replay::audit component" OFF)
set(REPLAY_AUDIT_FOUND FALSE)

if(NOT TARGET CUDA::cupti)
  if(REPLAY_WITH_AUDIT)
    message(FATAL_ERROR "replay: REPLAY_WITH_AUDIT is ON but the CUDA toolkit (${CUDAToolkit_LIBRARY_ROOT}) has no "
                        "CUPTI (FindCUDAToolkit defined no CUDA::cupti): install the toolkit's CUPTI "
                        "(cuda-cupti-<version> packages) or point CUDAToolkit_ROOT at a toolkit that has it.")
  endif()
  message(STATUS "replay: CUPTI not found (no CUDA::cupti): the capture audit (replay::audit) is not built "
                 "(install the CUDA toolkit's CUPTI, or set REPLAY_WITH_AUDIT=ON to require it)")
  return()
endif()
set(REPLAY_AUDIT_FOUND TRUE)
message(STATUS "replay: CUPTI found: building the capture audit (replay::audit)")

add_library(replay_audit INTERFACE)
add_library(replay::audit ALIAS replay_audit)
target_link_libraries(replay_audit INTERFACE replay::replay CUDA::cupti ${CMAKE_DL_LIBS})
