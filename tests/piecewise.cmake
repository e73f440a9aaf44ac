# Piecewise capture: the segment tree's policy and replay::eager's misuse on
# the CPU (host), captures with eager breaks on the device (gpu).
replay_add_test(NAME piecewise SOURCES host/piecewise_test.cpp gpu/piecewise_test.cu SUITES host gpu
                LIBRARIES Threads::Threads)
