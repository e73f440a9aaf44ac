#pragma once
#include <replay/detail/require_cxx20.hpp>
// How a re-capture replaces an executable graph: in place, or by instantiating
// once (with at most one diagnostic retry, kept when it succeeds). Generic over
// the graph types so that the CPU tests count the instantiations.
#include <optional>
#include <utility>

#include "replay/graph_exec.hpp"

namespace replay::detail {

// `steps` gives the three operations (CudaGraphBackend's are CUDA's):
//   bool update_in_place(Exec&, const Graph&)
//       updates without instantiating; false when the update is refused (a
//       topology change, a node kind that cannot be updated);
//   ::std::optional<Exec> instantiate(const Graph&)
//       one instantiation; empty when it failed (the steps keep why);
//   Exec instantiate_diagnosed(const Graph&)
//       after a failed instantiate(): one more that asks why the first failed
//       (cudaGraphInstantiateWithParams). Returns the executable graph when it
//       succeeds (the failure was transient: it is kept, never discarded);
//       throws, naming the first failure, otherwise.
// So a graph costs at most two instantiations, and a refused update adds none.
template <class Exec, class Graph, class Steps>
Exec instantiate_diagnosed_once(const Graph& graph, Steps& steps) {
  if (::std::optional<Exec> exec = steps.instantiate(graph)) {
    return ::std::move(*exec);
  }
  return steps.instantiate_diagnosed(graph);
}

// Makes `exec` run `graph`: in place, or re-instantiated when the update is
// refused. `exec` is unchanged when this throws.
template <class Exec, class Graph, class Steps>
UpdatePath update_or_reinstantiate(Exec& exec, const Graph& graph, Steps& steps) {
  if (steps.update_in_place(exec, graph)) {
    return UpdatePath::in_place;
  }
  exec = instantiate_diagnosed_once<Exec>(graph, steps);
  return UpdatePath::reinstantiated;
}

}  // namespace replay::detail
