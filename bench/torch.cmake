# The C++ half of the torch benchmark (bench/torch_resnet_bench.cpp; the
# Python half is bench/torch_resnet_bench.py): only where Torch was found.
# It reports percentiles in its own JSON rather than through Google
# Benchmark, so it goes to bench/torch/, out of reach of gpu-check.sh's
# generic benchmark loop; scripts/gpu-check.d/torch.sh runs it.
if(TARGET replay_torch)
  add_executable(torch_resnet_bench ${CMAKE_CURRENT_LIST_DIR}/torch_resnet_bench.cpp)
  target_link_libraries(torch_resnet_bench PRIVATE replay::torch)
  target_include_directories(torch_resnet_bench PRIVATE ${PROJECT_SOURCE_DIR}/examples/torch_resnet)
  set_target_properties(torch_resnet_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/torch)
  replay_target_warnings(torch_resnet_bench)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(torch_resnet_bench PRIVATE -Wno-missing-field-initializers)
  endif()
endif()

# GraphedCallable's host cost over a raw replay (Google Benchmark); also in
# bench/torch/, run by scripts/gpu-check.d/torch.sh with its ratios
# (bench/torch/call_overhead.ratios).
if(TARGET replay_torch)
  add_executable(torch_call_bench ${CMAKE_CURRENT_LIST_DIR}/torch_call_bench.cpp)
  target_link_libraries(torch_call_bench PRIVATE replay::torch benchmark::benchmark)
  set_target_properties(torch_call_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/torch)
  replay_target_warnings(torch_call_bench)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(torch_call_bench PRIVATE -Wno-missing-field-initializers)
  endif()
endif()
