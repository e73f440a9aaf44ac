# GraphBuilder: compile-time checks and misuse on the CPU (host), every node
# type, updates and conditional nodes on the device (gpu).
replay_add_test(NAME graph_builder SOURCES host/graph_builder_test.cpp gpu/graph_builder_test.cu
                SUITES host gpu)
