#pragma once
// The graph the torch loop tests wrap a captured torch step in (see
// torch_loop_graph.cu): its condition kernel is device code, which the torch
// tests' host compiler cannot build, so it lives in a .cu file of its own.
#include <replay/graph.hpp>

namespace replay_test {

// A graph that runs `step` (a captured section) again and again in one
// launch: the body of a WHILE node is `step` as a child graph, then a
// one-thread kernel that stops the loop when `*keep_going` is false (a flag
// the step itself computes) or after `max_passes` passes, whichever comes
// first; the step always runs at least once. The pass counter lives in
// memory the graph allocates and frees itself (one memory-allocation node of
// sizeof(unsigned int) bytes), so the graph's memory is not zero.
replay::Graph make_step_loop(replay::GraphRef step, const bool* keep_going, unsigned int max_passes);

}  // namespace replay_test
