# The kernel trace (bench/kernel_trace/kernel_trace.cpp): a CUPTI injection
# library that records every kernel a program runs, graphed work included,
# for bench/kernel_trace/summarize_trace.py. Built where the toolkit has
# CUPTI (CUDA::cupti); nothing else depends on it.
if(TARGET CUDA::cupti)
  add_library(replay_kernel_trace MODULE ${CMAKE_CURRENT_LIST_DIR}/kernel_trace/kernel_trace.cpp)
  target_link_libraries(replay_kernel_trace PRIVATE CUDA::cupti)
  target_compile_features(replay_kernel_trace PRIVATE cxx_std_20)
  replay_target_warnings(replay_kernel_trace)
else()
  message(STATUS "replay: CUPTI not found (no CUDA::cupti): the kernel trace (bench/kernel_trace) is not built")
endif()
