#pragma once
// StreamPipeline's options (PipelineFlags, PipelineOptions) and the
// PipelineCompute concept its compute stage satisfies.
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>

#include "replay/flags.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

enum class PipelineFlags : unsigned int {
  none = 0,
  // Copy every input into the slot's pinned staging, pinned or not, so that
  // the caller may reuse any input as soon as submit() returns.
  stage_inputs = 1U << 0,
  // Capture the compute stage once per slot (on the slot's fixed buffers, full
  // capacity) and replay that graph per item. Items must hold exactly
  // input_capacity elements. Copies stay on their own streams.
  graph_compute = 1U << 1,
  // Capture each slot's copy-in, compute and copy-out as one graph, replayed
  // per item on the slot's own stream; the copies' host addresses are updated
  // in the executable graph per item. Items must hold exactly input_capacity.
  graph_slot = 1U << 2,
  // The completion thread sleeps (cudaEventBlockingSync) instead of spinning
  // while it waits: less CPU, more latency per item.
  blocking_wait = 1U << 3,
  // Each slot runs its copy-in, compute and copy-out on a stream of its own
  // (eager stages, any item size): half the CUDA calls per item (no events
  // between stages), so small items cost the host less. Overlap then comes
  // from K slots in flight on K streams, and the compute stages of different
  // items may run at the same time on the device: the stage must not share
  // device buffers between items.
  slot_streams = 1U << 4,
};
template <>
inline constexpr bool enable_bitmask<PipelineFlags> = true;

// How a launch group (PipelineOptions::items_per_launch) copies between the
// host and the device.
enum class GroupCopies : ::std::uint8_t {
  // Copy-kernel nodes where the device can load replay's copy kernel (PTX for
  // sm_75; an older GPU, or PTX JIT disabled, cannot), memcpy nodes elsewhere.
  automatic,
  // Kernel nodes that read and write the pinned host memory in place: a
  // launch pays tens of nanoseconds of host time per node, where a memcpy
  // node costs a couple of microseconds. cuda_error from the constructor
  // where the kernel cannot be loaded.
  copy_kernel,
  // Memcpy nodes (cudaGraphAddMemcpyNode1D) on every device.
  memcpy_nodes,
};

// What a pipeline's launch groups copy with (StreamPipeline::group_copies()).
struct GroupCopiesUsed {
  // copy_kernel or memcpy_nodes; automatic when the pipeline has no groups.
  GroupCopies copies = GroupCopies::automatic;
  // Why memcpy nodes: asked for, or why the copy kernel could not be loaded
  // (the CUDA call and its status). Empty with the copy kernel.
  ::std::string reason;
};

struct PipelineOptions {
  // The most elements of In one item may hold. Required.
  ::std::size_t input_capacity = 0;
  // The most elements of Out one item may produce; 0 means input_capacity.
  ::std::size_t output_capacity = 0;
  // Items in flight at once (K). 3 lets copy-in, compute and copy-out of three
  // items overlap; 4 or more also hides the completion latency (see the docs).
  ::std::size_t slots = 3;
  PipelineFlags flags = PipelineFlags::none;
  // Output elements of an n-element item, for a compute that returns void;
  // empty means n. Ignored when the compute returns its output count.
  ::std::function<::std::size_t(::std::size_t)> output_count{};
  // Pageable inputs and outputs go through the slot's pinned staging in
  // chunks of this many bytes, so that the host copy of one chunk overlaps the
  // DMA of the one before. A positive multiple of 4096; 1-2 MiB suits PCIe
  // and NVLink-C2C hosts alike.
  ::std::size_t staging_chunk_bytes = ::std::size_t{1} << 20;
  // Helper threads for the host side of staged copies: an item of two or more
  // chunks is copied by the submitting thread (inputs) or the completion
  // thread (outputs) together with these. Started on first use, asleep when
  // idle. 0: those two threads copy alone (still chunk by chunk). The default
  // gives each direction about five cores' memcpy speed when both are busy.
  ::std::size_t host_copy_threads = 8;
  // PipelineFlags::graph_slot only: how many items one graph launch may
  // carry. Above 1, consecutive slots form groups of this many (`slots` must
  // be a multiple of it), each group captured once more as one graph of its
  // slots side by side, and run() issues its batch a group at a time: one
  // cudaGraphLaunch for that many items, which is what brings a small item's
  // host cost down to a fraction of a launch. submit() still launches one
  // slot's graph. At most 64; 4 to 8 with 2 groups of slots suits small items.
  ::std::size_t items_per_launch = 1;
  // What the launch groups copy with (see GroupCopies).
  GroupCopies group_copies = GroupCopies::automatic;
};

// A compute stage: issues work on the stream that reads the slot's device
// input (the item's elements) and writes the slot's device output. It returns
// void (the output count is PipelineOptions::output_count(n)) or the number of
// output elements it wrote (then `out` spans the whole output capacity).
template <class F, class In, class Out>
concept PipelineCompute =
    ::std::invocable<F&, BufferView<In>, BufferView<Out>, StreamRef> &&
    (::std::is_void_v<::std::invoke_result_t<F&, BufferView<In>, BufferView<Out>, StreamRef>> ||
     ::std::convertible_to<::std::invoke_result_t<F&, BufferView<In>, BufferView<Out>, StreamRef>, ::std::size_t>);

}  // namespace replay
