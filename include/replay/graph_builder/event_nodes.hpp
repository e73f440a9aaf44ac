#pragma once
#include <replay/detail/require_cxx20.hpp>
// EventRecordNode and EventWaitNode: a graph records an event (for streams or
// the host to wait on) or waits for one recorded elsewhere. The event can be
// swapped for another on an executable graph.
#include <cuda_runtime_api.h>

#include <source_location>
#include <string>

#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/graph_builder/node.hpp"
#include "replay/graph_exec.hpp"

namespace replay {

namespace detail {
inline ::cudaEvent_t event_handle(const Event& event, const char* what, const ::std::source_location& where) {
  if (event.get() == nullptr) {
    throw usage_error(::std::string(what) + ": the Event is empty (moved from or released)", where);
  }
  return event.get();
}
}  // namespace detail

class EventRecordNode : public Node {
 public:
  EventRecordNode() noexcept = default;
  // Records `event` instead, in `exec`. The event must outlive the launches that record it.
  void set_event(GraphExec& exec, const Event& event,
                 ::std::source_location where = ::std::source_location::current()) const {
    detail::check_node(::cudaGraphExecEventRecordNodeSetEvent(exec.handle(where), handle(where),
                                                              detail::event_handle(event, "EventRecordNode", where)),
                       "cudaGraphExecEventRecordNodeSetEvent", get(), "updating", where);
  }

 private:
  friend class GraphBuilder;
  explicit EventRecordNode(::cudaGraphNode_t node) noexcept : Node(node) {}
};

class EventWaitNode : public Node {
 public:
  EventWaitNode() noexcept = default;
  // Waits for `event` instead, in `exec`.
  void set_event(GraphExec& exec, const Event& event,
                 ::std::source_location where = ::std::source_location::current()) const {
    detail::check_node(::cudaGraphExecEventWaitNodeSetEvent(exec.handle(where), handle(where),
                                                            detail::event_handle(event, "EventWaitNode", where)),
                       "cudaGraphExecEventWaitNodeSetEvent", get(), "updating", where);
  }

 private:
  friend class GraphBuilder;
  explicit EventWaitNode(::cudaGraphNode_t node) noexcept : Node(node) {}
};

}  // namespace replay
