# Programmatic dependent launch: launch()'s checks, attributes and edge data on
# the CPU (host); captured and built programmatic edges, updates, a chain
# against eager over many replays, and the refusals on the device (gpu).
replay_add_test(NAME pdl SOURCES host/pdl_test.cpp gpu/pdl_test.cu SUITES host gpu)
