# Batcher: the gathering policy and the Batcher with a stand-in executor on
# the CPU (host), the CUDA executor over a ShapeRouter against eager results
# with real threads (gpu).
replay_add_test(NAME batcher SOURCES host/batcher_test.cpp gpu/batcher_test.cu SUITES host gpu)
