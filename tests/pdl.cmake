# Programmatic dependent launch: launch()'s checks, attributes and edge data on
# the CPU (host); captured and built programmatic edges, updates, a chain
# against eager over many replays, and the refusals on the device (gpu),
# kernels compiled from older PTX included: test_pdl_ptx80 holds kernels built
# from compute_80 PTX only, which the driver JIT-compiles on a 9.0 device with
# their waits compiled out.
add_library(test_pdl_ptx80 OBJECT gpu/pdl_ptx80_kernels.cu)
set_target_properties(test_pdl_ptx80 PROPERTIES CUDA_ARCHITECTURES 80-virtual)
target_link_libraries(test_pdl_ptx80 PRIVATE replay::replay)
replay_target_warnings(test_pdl_ptx80)
replay_add_test(NAME pdl SOURCES host/pdl_test.cpp gpu/pdl_test.cu SUITES host gpu LIBRARIES test_pdl_ptx80
                Threads::Threads)
