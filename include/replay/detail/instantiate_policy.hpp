#pragma once
#include <replay/detail/require_cxx20.hpp>
// How an executable graph is instantiated: once, with at most one diagnostic
// retry that is kept when it succeeds. Generic over the graph types so that
// the CPU tests count the instantiations GraphExec makes.
#include <optional>
#include <utility>

namespace replay::detail {

// `steps` gives the two operations (GraphExec's are CUDA's):
//   ::std::optional<Exec> instantiate(const Graph&)
//       one instantiation; empty when it failed (the steps keep why);
//   Exec instantiate_diagnosed(const Graph&)
//       after a failed instantiate(): one more that asks why the first failed
//       (cudaGraphInstantiateWithParams). Returns the executable graph when it
//       succeeds (the failure was transient: it is kept, never discarded);
//       throws, naming the first failure, otherwise.
// So a graph costs at most two instantiations.
template <class Exec, class Graph, class Steps>
Exec instantiate_diagnosed_once(const Graph& graph, Steps& steps) {
  if (::std::optional<Exec> exec = steps.instantiate(graph)) {
    return ::std::move(*exec);
  }
  return steps.instantiate_diagnosed(graph);
}

}  // namespace replay::detail
