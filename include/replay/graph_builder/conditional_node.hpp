#pragma once
#include <replay/detail/require_cxx20.hpp>
// ConditionalNode (a conditional node and its bodies) and GraphBuilder's
// add_if, add_while, add_if_else, add_switch; included by graph_builder/builder.hpp.
#include <cuda_runtime_api.h>

#include <source_location>
#include <string>

#include "replay/error.hpp"
#include "replay/graph_builder/builder.hpp"
#include "replay/graph_builder/conditional.hpp"
#include "replay/graph_builder/node.hpp"

namespace replay {

#if CUDART_VERSION >= 12040

// A conditional node and its bodies. The bodies are graphs CUDA owns (for the
// node's lifetime); fill them with body(i) (a GraphBuilder that refuses node
// types CUDA does not allow there) or by capture (body(i).capture(...)).
class ConditionalNode : public Node {
 public:
  ConditionalNode() noexcept = default;

  ConditionalKind kind() const noexcept { return kind_; }
  unsigned int body_count() const noexcept { return count_; }

  // Body `index`: IF and WHILE have body 0; IF/ELSE has 0 (then) and 1 (else);
  // SWITCH has one per case.
  GraphBuilder body(unsigned int index = 0, ::std::source_location where = ::std::source_location::current()) const {
    return GraphBuilder::from_native_handle(body_graph(index, where), true);
  }
  GraphBuilder then_body(::std::source_location where = ::std::source_location::current()) const {
    return body(0, where);
  }
  GraphBuilder else_body(::std::source_location where = ::std::source_location::current()) const {
    if (kind_ != ConditionalKind::if_then_else) {
      throw usage_error("ConditionalNode::else_body: only an IF/ELSE node (add_if_else) has an else body", where);
    }
    return body(1, where);
  }
  ::cudaGraph_t body_graph(unsigned int index, ::std::source_location where = ::std::source_location::current()) const {
    (void)handle(where);
    if (index >= count_) {
      throw usage_error("ConditionalNode: body " + ::std::to_string(index) + " requested of a " +
                            ::std::string(to_string(kind_)) + " node with " + ::std::to_string(count_) + " bodies",
                        where);
    }
    return bodies_[index];
  }

 private:
  friend class GraphBuilder;
  ConditionalNode(::cudaGraphNode_t node, ConditionalKind kind, const ::cudaGraph_t* bodies,
                  unsigned int count) noexcept
      : Node(node), kind_(kind), bodies_(bodies), count_(count) {}

  ConditionalKind kind_ = ConditionalKind::if_then;
  const ::cudaGraph_t* bodies_ = nullptr;  // CUDA's array, valid while the node lives
  unsigned int count_ = 0;
};

inline ConditionalNode GraphBuilder::add_conditional(ConditionalKind kind, ConditionalHandle condition,
                                                     unsigned int bodies, const Deps& deps,
                                                     const ::std::source_location& where) {
  prepare(NodeType::conditional, deps, "add_conditional", where);
  if (!condition) {
    throw usage_error(::std::string("add ") + ::std::string(to_string(kind)) +
                          " node: the ConditionalHandle is empty; make it with make_condition() on this graph",
                      where);
  }
  ::cudaGraphNodeParams params{};
  params.type = ::cudaGraphNodeTypeConditional;
  params.conditional.handle = condition.get();
  switch (kind) {
    case ConditionalKind::if_then:
    case ConditionalKind::if_then_else:
      params.conditional.type = ::cudaGraphCondTypeIf;
      break;
    case ConditionalKind::while_loop:
      params.conditional.type = ::cudaGraphCondTypeWhile;
      break;
    case ConditionalKind::switch_case:
#if CUDART_VERSION >= 12080
      params.conditional.type = ::cudaGraphCondTypeSwitch;
#endif
      break;
  }
  params.conditional.size = bodies;
  params.conditional.phGraph_out = nullptr;
  ::cudaGraphNode_t node = nullptr;
#if CUDART_VERSION >= 13000
  const ::cudaError_t status = ::cudaGraphAddNode(&node, graph_, deps.data(), nullptr, deps.size(), &params);
#else
  const ::cudaError_t status = ::cudaGraphAddNode(&node, graph_, deps.data(), deps.size(), &params);
#endif
  if (status != ::cudaSuccess) {
    (void)::cudaGetLastError();
    int driver = 0;
    (void)::cudaDriverGetVersion(&driver);
    (void)::cudaGetLastError();
    ::std::string context = ::std::string("adding a ") + ::std::string(to_string(kind)) + " node with " +
                            ::std::to_string(bodies) + " bodies";
    if (driver < required_cuda_version(kind)) {
      context += "; " + ::std::string(to_string(kind)) + " nodes need a CUDA " +
                 ::std::to_string(required_cuda_version(kind) / 1000) + "." +
                 ::std::to_string(required_cuda_version(kind) % 1000 / 10) + " driver, this one is " +
                 ::std::to_string(driver / 1000) + "." + ::std::to_string(driver % 1000 / 10);
    }
    throw cuda_error(status, "cudaGraphAddNode", where, context);
  }
  return ConditionalNode(node, kind, params.conditional.phGraph_out, bodies);
}

inline ConditionalNode GraphBuilder::add_if(ConditionalHandle condition, const Deps& deps,
                                            ::std::source_location where) {
  return add_conditional(ConditionalKind::if_then, condition, 1, deps, where);
}
inline ConditionalNode GraphBuilder::add_while(ConditionalHandle condition, const Deps& deps,
                                               ::std::source_location where) {
  return add_conditional(ConditionalKind::while_loop, condition, 1, deps, where);
}
#if CUDART_VERSION >= 12080
inline ConditionalNode GraphBuilder::add_if_else(ConditionalHandle condition, const Deps& deps,
                                                 ::std::source_location where) {
  return add_conditional(ConditionalKind::if_then_else, condition, 2, deps, where);
}
inline ConditionalNode GraphBuilder::add_switch(ConditionalHandle condition, unsigned int cases, const Deps& deps,
                                                ::std::source_location where) {
  if (cases == 0) {
    throw usage_error("add_switch: a SWITCH node needs at least one case (body)", where);
  }
  return add_conditional(ConditionalKind::switch_case, condition, cases, deps, where);
}
#endif

#endif  // CUDART_VERSION >= 12040

}  // namespace replay
