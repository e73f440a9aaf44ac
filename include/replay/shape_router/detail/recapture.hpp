#pragma once
#include <replay/detail/require_cxx20.hpp>
// How a re-capture replaces an executable graph: in place, or by a new
// instantiation (detail/instantiate_policy.hpp: at most two). Generic over the
// graph types so that the CPU tests count the instantiations.
#include "replay/detail/instantiate_policy.hpp"
#include "replay/graph_exec.hpp"

namespace replay::detail {

// `steps` gives:
//   bool update_in_place(Exec&, const Graph&)
//       updates without instantiating; false when the update is refused (a
//       topology change, a node kind that cannot be updated);
//   Exec instantiate_new(const Graph&)
//       a new executable graph (instantiate_diagnosed_once: GraphExec's
//       constructor for CUDA graphs); throws when it cannot be made.
// So a re-capture costs at most two instantiations, and a refused update adds
// none of its own.
template <class Exec, class Graph, class Steps>
UpdatePath update_or_reinstantiate(Exec& exec, const Graph& graph, Steps& steps) {
  if (steps.update_in_place(exec, graph)) {
    return UpdatePath::in_place;
  }
  exec = steps.instantiate_new(graph);
  return UpdatePath::reinstantiated;
}

}  // namespace replay::detail
