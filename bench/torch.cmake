# The libtorch adapter's benchmark programs: only where Torch was found. They
# go to bench/torch/, out of reach of gpu-check.sh's generic benchmark loop;
# scripts/gpu-check.d/torch.sh runs them.
#   replay_torch_bench(NAME SOURCE [LIBRARIES...])
function(replay_torch_bench name source)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE replay::torch ${ARGN})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/torch)
  replay_target_warnings(${name})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${name} PRIVATE -Wno-missing-field-initializers)
  endif()
endfunction()

if(TARGET replay_torch)
  # The C++ half of the torch benchmark (the Python half is
  # bench/torch_resnet_bench.py). It reports percentiles in its own JSON
  # rather than through Google Benchmark.
  replay_torch_bench(torch_resnet_bench ${CMAKE_CURRENT_LIST_DIR}/torch_resnet_bench.cpp)
  target_include_directories(torch_resnet_bench PRIVATE ${PROJECT_SOURCE_DIR}/examples/torch_resnet)

  # GraphedCallable's host cost over a raw replay (Google Benchmark), with its
  # ratios in bench/torch/call_overhead.ratios.
  replay_torch_bench(torch_call_bench ${CMAKE_CURRENT_LIST_DIR}/torch_call_bench.cpp benchmark::benchmark)

  # Breakable captures (GraphedOptions::breaks): a TorchScript model with a
  # read-back halfway; its Python peer is bench/torch_piecewise_bench.py.
  replay_torch_bench(torch_piecewise_bench ${CMAKE_CURRENT_LIST_DIR}/torch_piecewise_bench.cpp)
  target_include_directories(torch_piecewise_bench PRIVATE ${PROJECT_SOURCE_DIR}/examples/torch_resnet)
endif()
