#pragma once
// The PipelineStageRunner concept: what BasicStreamPipeline needs from the
// type that issues and awaits one slot's stages (the CUDA runner, or a CPU
// stand-in in the tests).
#include <replay/detail/require_cxx20.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <source_location>
#include <span>

#include "replay/stream_pipeline/stats.hpp"

namespace replay {

// A stage runner issues the stages of one item into one slot and awaits them.
// The pipeline guarantees: start() is called for a slot only when the slot's
// previous item was finished or settled (and delivered); start() calls are
// serialized; finish()/settle() run on the completion thread, one at a time,
// in submission order.
//   plan(input, destination, where): per-item checks that need the runner
//       (e.g. memory kinds); throws usage_error to refuse the item. Called
//       before a slot is taken and before producers are serialized, so it may
//       run on several producer threads at once (it must not mutate the
//       runner; PipelineOptions::output_count likewise); its result is
//       handed to start().
//   start(slot, id, input, destination, plan, where): issues the item's
//       stages. May throw; whether it throws or not, everything it issued must
//       be ordered before what finish()/settle() await.
//   finish(slot): blocks until the slot's item is done and returns its output
//       (in the destination when one was given); throws an asynchronous error.
//   settle(slot): blocks until whatever a failed item issued is done.
//   required_input_count(): an exact item size the runner needs, if any.
//   planned_output_count(n): the output size of an n-element item when known
//       before it runs (nullopt: the stage reports it).
template <class R>
concept PipelineStageRunner =
    requires { typename R::input_type; typename R::output_type; typename R::plan_type; } &&
    requires(R& runner, const R& const_runner, ::std::size_t n, ::std::uint64_t id,
             ::std::span<const typename R::input_type> input,
             ::std::optional<::std::span<typename R::output_type>> destination,
             const typename R::plan_type& plan, const ::std::source_location& where, PipelineStats& stats) {
      { const_runner.slot_count() } -> ::std::convertible_to<::std::size_t>;
      { const_runner.input_capacity() } -> ::std::convertible_to<::std::size_t>;
      { const_runner.output_capacity() } -> ::std::convertible_to<::std::size_t>;
      { const_runner.required_input_count() } -> ::std::same_as<::std::optional<::std::size_t>>;
      { const_runner.planned_output_count(n) } -> ::std::same_as<::std::optional<::std::size_t>>;
      { runner.plan(input, destination, where) } -> ::std::same_as<typename R::plan_type>;
      runner.start(n, id, input, destination, plan, where);
      { runner.finish(n) } -> ::std::same_as<::std::span<const typename R::output_type>>;
      { runner.settle(n) } noexcept;
      { runner.bind_completion_thread() } noexcept;
      { const_runner.add_stats(stats) } noexcept;
    };

}  // namespace replay
