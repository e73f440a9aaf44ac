# TorchGraphBackend with a graph wrapper (a captured torch step inside a WHILE
# node): part of test_torch. The wrapper's graph, with its condition kernel,
# is device code, compiled by nvcc in torch_loop_graph.cu; the test itself is
# host C++ like the other torch tests. Named to be included after
# tests/torch.cmake, which defines test_torch (CUDA_RUNTIME_LIBRARY Shared:
# the .cu uses libtorch's shared CUDA runtime).
if(TARGET test_torch)
  target_sources(test_torch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/gpu/torch_loop_test.cpp
                                    ${CMAKE_CURRENT_SOURCE_DIR}/gpu/torch_loop_graph.cu)
endif()
