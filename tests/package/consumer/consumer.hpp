#pragma once
// A project that knows nothing of replay's tree: it only links replay::replay
// (found by find_package, FetchContent or Conan) and uses the public API.

// Defined in consumer.cu (nvcc): captures a kernel into a graph, replays it and
// checks the result. Returns the number of wrong elements. Needs a device.
int consumer_graph_roundtrip();
