# Batcher over a GraphedCallable (replay/torch/batch_executor.hpp): part of
# test_torch, so that it runs where the libtorch adapter's tests run. Named to
# be included after tests/torch.cmake, which defines test_torch.
if(TARGET test_torch)
  target_sources(test_torch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/gpu/torch_batcher_test.cpp)
endif()
