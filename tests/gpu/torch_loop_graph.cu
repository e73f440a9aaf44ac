// The torch loop tests' graph wrapper (declared in torch_loop_graph.hpp).
#include "torch_loop_graph.hpp"

#include <replay/graph_builder.hpp>

namespace replay_test {
namespace {

// Counts the pass and decides whether the WHILE node runs another one.
__global__ void continue_loop(replay::ConditionalHandle loop, const bool* keep_going, unsigned int* passes,
                              unsigned int max_passes) {
  const unsigned int done = ++*passes;
  loop.set(*keep_going && done < max_passes ? 1U : 0U);
}

}  // namespace

replay::Graph make_step_loop(replay::GraphRef step, const bool* keep_going, unsigned int max_passes) {
  replay::Graph graph = replay::make_graph();
  replay::GraphBuilder b(graph);
  const replay::MemAllocNode passes = b.add_mem_alloc(sizeof(unsigned int));
  const replay::MemsetNode zero = b.add_memset(passes.ptr(), 0, sizeof(unsigned int), {passes});
  const replay::ConditionalHandle again = b.make_condition(1);  // the first pass always runs
  const replay::ConditionalNode loop = b.add_while(again, {zero});
  replay::GraphBuilder body = loop.body();
  const replay::ChildGraphNode section = body.add_child(step);
  (void)body.add_kernel(continue_loop, 1, 1, 0, {section}, again, keep_going, passes.as<unsigned int>(), max_passes);
  (void)b.add_mem_free(passes, {loop});
  return graph;
}

}  // namespace replay_test
