# ShapeRouter: policy logic on the CPU with a stand-in backend (host), and the
# CUDA backend on the device (gpu).
replay_add_test(NAME shape_router SOURCES host/shape_router_test.cpp gpu/shape_router_test.cu
                SUITES host gpu)
# Keys whose work declares a break (BreakPolicy), on the device.
replay_add_test(NAME shape_router_piecewise SOURCES gpu/shape_router_piecewise_test.cu SUITES gpu)
