#pragma once
// Whether an item fits a StreamPipeline's slots: its input against the input
// capacity (and the exact size graph modes were captured for), its planned
// output against the output capacity and the caller's destination. Checked
// before an item is accepted, so a refusal takes nothing; used by
// stream_pipeline/detail/state.hpp.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <optional>
#include <source_location>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"

namespace replay::detail {

template <PipelineStageRunner Runner>
void check_pipeline_item(const Runner& runner, ::std::size_t n, const ::std::optional<::std::size_t>& destination_size,
                         const ::std::source_location& where) {
  const ::std::size_t capacity = runner.input_capacity();
  if (n > capacity) {
    throw usage_error(detail::concat("StreamPipeline: the item holds ", detail::elements(n),
                                     " but a slot holds at most ", detail::elements(capacity),
                                     " (PipelineOptions::input_capacity); split the item or raise the capacity"),
                      where);
  }
  if (const auto required = runner.required_input_count(); required && n != *required) {
    throw usage_error(detail::concat("StreamPipeline: the item holds ", detail::elements(n),
                                     " but the slot graphs were captured for exactly ", detail::elements(*required),
                                     " (PipelineFlags::graph_compute / graph_slot); pad the item to that size or "
                                     "use the default (eager) mode for variable sizes"),
                      where);
  }
  if (const auto planned = runner.planned_output_count(n)) {
    if (*planned > runner.output_capacity()) {
      throw usage_error(
          detail::concat("StreamPipeline: an item of ", detail::elements(n), " produces ", detail::elements(*planned),
                         " but a slot's output holds at most ", detail::elements(runner.output_capacity()),
                         " (PipelineOptions::output_capacity / output_count)"),
          where);
    }
    if (destination_size && *destination_size < *planned) {
      throw usage_error(
          detail::concat("StreamPipeline: the destination holds ", detail::elements(*destination_size),
                         " but the item produces ", detail::elements(*planned)),
          where);
    }
  }
}

}  // namespace replay::detail
