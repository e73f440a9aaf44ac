// make_decode_loop (loop_control.hpp): the WHILE node around a captured step.
#include "loop_control.hpp"

#include <replay/graph_builder.hpp>

namespace llm_decode {
namespace {

// Reads the flag the step just wrote; the WHILE node tests the value before
// each pass.
__global__ void set_keep_going(replay::ConditionalHandle loop, const std::int64_t* keep_going) {
  loop.set(*keep_going != 0 ? 1U : 0U);
}

}  // namespace

replay::Graph make_decode_loop(replay::GraphRef step, const std::int64_t* keep_going) {
  replay::Graph graph = replay::make_graph();
  replay::GraphBuilder builder(graph);
  const replay::ConditionalHandle condition = builder.make_condition(/*default_value=*/1);
  const replay::ConditionalNode loop = builder.add_while(condition);
  replay::GraphBuilder body = loop.body();
  const replay::ChildGraphNode pass = body.add_child(step);
  (void)body.add_kernel(set_keep_going, dim3(1), dim3(1), 0, {pass}, condition, keep_going);
  return graph;
}

}  // namespace llm_decode
