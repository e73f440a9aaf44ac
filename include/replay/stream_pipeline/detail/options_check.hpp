#pragma once
#include <replay/detail/require_cxx20.hpp>
// The checks of PipelineOptions that StreamPipeline's constructor makes
// before it allocates anything.
#include <cstddef>
#include <source_location>

#include "replay/stream_pipeline/detail/host_copy_pool.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/stream_pipeline/options.hpp"

namespace replay::detail {

// Throws usage_error naming the first bad option.
inline void validate_pipeline_options(const PipelineOptions& options, bool has_compute,
                                      const ::std::source_location& where) {
  const PipelineFlags flags = options.flags;
  if (options.input_capacity == 0) {
    throw usage_error("PipelineOptions::input_capacity must be positive: the most elements one item holds", where);
  }
  if (options.slots == 0 || options.slots > 1024) {
    throw usage_error(detail::concat("PipelineOptions::slots must be between 1 and 1024 (got ", options.slots,
                                     "); 3 or 4 is typical"),
                      where);
  }
  if (has_flag(flags, PipelineFlags::graph_compute) && has_flag(flags, PipelineFlags::graph_slot)) {
    throw usage_error("PipelineFlags::graph_compute and graph_slot exclude each other: graph_slot already "
                      "captures the compute stage",
                      where);
  }
  if (has_flag(flags, PipelineFlags::slot_streams) && has_flag(flags, PipelineFlags::graph_slot)) {
    throw usage_error("PipelineFlags::slot_streams and graph_slot exclude each other: graph_slot already runs "
                      "each slot on a stream of its own",
                      where);
  }
  constexpr auto known = PipelineFlags::stage_inputs | PipelineFlags::graph_compute | PipelineFlags::graph_slot |
                         PipelineFlags::blocking_wait | PipelineFlags::slot_streams;
  if ((flags & ~known) != PipelineFlags::none) {
    throw usage_error("PipelineFlags holds unknown bits", where);
  }
  if (!has_compute) {
    throw usage_error("StreamPipeline needs a compute stage", where);
  }
  if (options.staging_chunk_bytes == 0 || options.staging_chunk_bytes % staging_page_bytes != 0) {
    throw usage_error(detail::concat("PipelineOptions::staging_chunk_bytes must be a positive multiple of ",
                                     staging_page_bytes, " (got ", options.staging_chunk_bytes,
                                     "); 1 MiB or 2 MiB is typical"),
                      where);
  }
  if (options.items_per_launch == 0 || options.items_per_launch > 64) {
    throw usage_error(detail::concat("PipelineOptions::items_per_launch must be between 1 and 64 (got ",
                                     options.items_per_launch, ")"),
                      where);
  }
  if (options.items_per_launch > 1 && !has_flag(flags, PipelineFlags::graph_slot)) {
    throw usage_error("PipelineOptions::items_per_launch above 1 needs PipelineFlags::graph_slot: a group is "
                      "launched as one graph of its slots' graphs",
                      where);
  }
  if (options.slots % options.items_per_launch != 0) {
    throw usage_error(detail::concat("PipelineOptions::slots (", options.slots,
                                     ") must be a multiple of items_per_launch (", options.items_per_launch,
                                     "): slots are grouped into runs of that many; twice it is typical"),
                      where);
  }
  if (options.host_copy_threads > 64) {
    throw usage_error(detail::concat("PipelineOptions::host_copy_threads must be at most 64 (got ",
                                     options.host_copy_threads, "); a few are enough to outrun the link"),
                      where);
  }
}

}  // namespace replay::detail
