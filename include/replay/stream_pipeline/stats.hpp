#pragma once
// PipelineStats: a pipeline's counters.
#include <replay/detail/require_cxx20.hpp>

#include <cstdint>

namespace replay {

// Counters since construction; stats() returns a snapshot.
struct PipelineStats {
  ::std::uint64_t submitted = 0;        // items accepted (submit, try_submit, run)
  ::std::uint64_t completed = 0;        // delivered with an output
  ::std::uint64_t failed = 0;           // delivered with an error
  ::std::uint64_t slot_waits = 0;       // blocking submits that found every slot busy
  ::std::uint64_t refused = 0;          // try_submit calls that returned empty
  ::std::uint64_t inputs_in_place = 0;  // pinned inputs copied to the device directly
  ::std::uint64_t inputs_staged = 0;    // inputs first copied into a slot's pinned staging
  ::std::uint64_t outputs_direct = 0;   // outputs copied straight into a pinned destination
  ::std::uint64_t outputs_staged = 0;   // outputs that went through a slot's pinned staging
  // PipelineFlags::graph_slot: copy nodes re-pointed at another host address
  // (one cudaGraphExecMemcpyNodeSetParams1D each). It does not grow while
  // every slot sees the input and destination addresses of its previous
  // item: each item is then one cudaGraphLaunch.
  ::std::uint64_t graph_retargets = 0;
  // PipelineOptions::items_per_launch: items issued by a group's launch (one
  // cudaGraphLaunch for items_per_launch of them).
  ::std::uint64_t grouped_items = 0;
};

}  // namespace replay
