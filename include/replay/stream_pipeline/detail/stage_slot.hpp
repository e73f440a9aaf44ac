#pragma once
#include <replay/detail/require_cxx20.hpp>
// StageSlot: one slot of the CUDA stage runner (buffers, events, streams, graphs, the item in flight).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <source_location>
#include <vector>

#include "replay/stream_pipeline/detail/host_copy_pool.hpp"
#include "replay/event.hpp"
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/graph_exec.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream.hpp"

namespace replay::detail {

// One slot of the CUDA stage runner: its buffers, events, streams and graphs,
// and the item in flight.
template <class In, class Out>
struct StageSlot {
  StageSlot(::std::size_t in_capacity, ::std::size_t out_capacity, ::std::size_t out_chunk_count,
            EventFlags event_flags, const ::std::source_location& where)
      : staging_in(in_capacity, where),
        staging_out(out_capacity, where),
        device_in(in_capacity, where),
        device_out(out_capacity, where),
        copied_in(event_flags, where),
        computed(event_flags, where),
        copied_out(event_flags, where),
        done(copied_out.get()) {
    if (out_chunk_count >= 2) {
      chunk_events.reserve(out_chunk_count);
      for (::std::size_t k = 0; k < out_chunk_count; ++k) {
        chunk_events.emplace_back(event_flags, where);
      }
    }
  }

  PinnedBuffer<In> staging_in;
  PinnedBuffer<Out> staging_out;
  DeviceBuffer<In> device_in;
  DeviceBuffer<Out> device_out;
  Event copied_in;   // H2D done: compute may read device_in
  Event computed;    // compute done: D2H may read device_out
  Event copied_out;  // everything the item issued is done: the slot may be reused
  // A staged output's chunk k is in staging_out: its host copy may start.
  ::std::vector<Event> chunk_events;

  // graph_compute: the compute stage captured on this slot's buffers.
  ::std::optional<GraphExec> compute_graph;
  // graph_slot: the whole slot as one graph, on its own stream. The Graph is
  // kept because the node handles used for per-item updates belong to it.
  ::std::optional<Stream> stream;
  ::std::optional<Graph> slot_graph_source;
  ::std::optional<GraphExec> slot_graph;
  ::cudaGraphNode_t h2d_node = nullptr;
  ::cudaGraphNode_t d2h_node = nullptr;
  const void* graph_source = nullptr;  // where the H2D node reads now
  void* graph_target = nullptr;        // where the D2H node writes now

  // What start() resets before issuing an item (`destination`: its pinned
  // or pageable destination, nullptr for none).
  void begin(::std::uint64_t item, Out* to, ::std::size_t to_size, const ::std::source_location& where) noexcept {
    id = item;
    submitted_at = where;
    output = nullptr;
    count = 0;
    destination = to;
    destination_size = to_size;
    copy_to_destination = false;
    out_chunks = ChunkPlan{};
    out_chunk_events = false;
    done = copied_out.get();
  }

  // The item in flight (written by start, read by finish: ordered by the core's lock).
  ::std::uint64_t id = 0;
  ::std::source_location submitted_at;
  const Out* output = nullptr;  // where the D2H copy put the output
  ::std::size_t count = 0;      // output elements
  Out* destination = nullptr;
  ::std::size_t destination_size = 0;
  bool copy_to_destination = false;  // pageable destination: copy from staging in finish()
  ChunkPlan out_chunks;              // how a staged output is copied out
  bool out_chunk_events = false;     // chunk_events were recorded for it
  bool needs_stream_sync = false;    // fence failed: settle() synchronizes the streams
  // What marks the item done: copied_out, or its launch group's event.
  ::cudaEvent_t done = nullptr;
};

// graph_slot with PipelineOptions::items_per_launch > 1: a run of
// consecutive slots captured once more as one graph, so that one
// cudaGraphLaunch issues an item in each. Its copies are copy-kernel nodes
// (detail/copy_kernel.hpp) reading and writing the host memory in place
// (memcpy nodes where that kernel cannot be loaded: GroupCopies), and
// its members run in two lanes: each lane is a chain of members, copy-in ->
// compute -> copy-out, one after another, and the lanes run side by side (a
// lane costs the launch about as much as a node; more lanes overlap more).
// One event marks the whole group done.
struct SlotGroup {
  static constexpr ::std::size_t lanes = 2;
  struct Member {
    ::cudaGraphNode_t copy_in = nullptr;
    ::cudaGraphNode_t copy_out = nullptr;  // none when the stage has no output
    const void* source = nullptr;  // the host address the copy-in reads now
    void* target = nullptr;        // the host address the copy-out writes now
  };
  ::std::vector<Member> members;  // slot g * members.size() + m is member m of group g
  ::std::optional<Stream> stream;
  ::std::optional<Event> done;  // recorded at the end of each launch
  ::std::optional<Graph> source_graph;  // owns the member nodes' handles
  ::std::optional<GraphExec> exec;
};

}  // namespace replay::detail
