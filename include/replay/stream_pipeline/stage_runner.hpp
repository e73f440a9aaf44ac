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

#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/stats.hpp"

namespace replay {

// Where a runner's finish() puts an output that the pipeline wants in memory
// of its own (a result vector): allocate(context, n) returns room for n
// elements. Empty (allocate == nullptr): the output may stay where it is.
template <class Out>
struct PipelineOutputSink {
  void* context = nullptr;
  Out* (*allocate)(void* context, ::std::size_t count) = nullptr;

  explicit operator bool() const noexcept { return allocate != nullptr; }
};

// A stage runner issues the stages of one item into one slot and awaits them.
// The pipeline guarantees: prepare() and start() are called for a slot only
// when the slot's previous item was finished or settled (and delivered);
// start() calls are serialized and come in id order; finish()/settle() run on
// the completion thread, one at a time, in id order.
//   plan(input, destination, where): per-item checks that need the runner
//       (e.g. memory kinds); throws usage_error to refuse the item. Called
//       before a slot is taken and before producers are serialized, so it may
//       run on several producer threads at once (it must not mutate the
//       runner; PipelineOptions::output_count likewise); its result is
//       handed to prepare() and start().
//   prepare(slot, id, input, plan, where): moves the input toward the device
//       (host staging, the copy-in). Runs on the producer thread without the
//       pipeline's serialization, so prepare() calls for different slots may
//       overlap each other and one start(). May throw: the item then fails
//       and start() is not called for it.
//   start(slot, id, input, destination, plan, where): issues the rest of the
//       item's stages. May throw.
//       Whether prepare() or start() throws or not, everything they issued
//       must be ordered before what finish()/settle() await.
//   finish(slot, sink): blocks until the slot's item is done and returns its
//       output: in the destination when one was given, else in memory from
//       `sink` when it is set, else wherever it is (valid until the slot is
//       reused); throws an asynchronous error.
//   settle(slot): blocks until whatever a failed item issued is done.
//   required_input_count(): an exact item size the runner needs, if any.
//   planned_output_count(n): the output size of an n-element item when known
//       before it runs (nullopt: the stage reports it).
template <class R>
concept PipelineStageRunner =
    requires { typename R::input_type; typename R::output_type; typename R::plan_type; } &&
    requires(R& runner, const R& const_runner, ::std::size_t n, ::std::uint64_t id,
             HostRange<const typename R::input_type> input,
             ::std::optional<HostRange<typename R::output_type>> destination,
             PipelineOutputSink<typename R::output_type> sink, const typename R::plan_type& plan,
             const ::std::source_location& where, PipelineStats& stats) {
      { const_runner.slot_count() } -> ::std::convertible_to<::std::size_t>;
      { const_runner.input_capacity() } -> ::std::convertible_to<::std::size_t>;
      { const_runner.output_capacity() } -> ::std::convertible_to<::std::size_t>;
      { const_runner.required_input_count() } -> ::std::same_as<::std::optional<::std::size_t>>;
      { const_runner.planned_output_count(n) } -> ::std::same_as<::std::optional<::std::size_t>>;
      { runner.plan(input, destination, where) } -> ::std::same_as<typename R::plan_type>;
      runner.prepare(n, id, input, plan, where);
      runner.start(n, id, input, destination, plan, where);
      { runner.finish(n, sink) } -> ::std::same_as<::std::span<const typename R::output_type>>;
      { runner.settle(n) } noexcept;
      { runner.bind_completion_thread() } noexcept;
      { const_runner.add_stats(stats) } noexcept;
    };

// One item of a group (GroupedPipelineStageRunner::start_group): its slot and
// id, what prepare() had, and the plan.
template <class R>
struct PipelineGroupItem {
  ::std::size_t slot = 0;
  ::std::uint64_t id = 0;
  HostRange<const typename R::input_type> input;
  ::std::optional<HostRange<typename R::output_type>> destination;
  typename R::plan_type plan;
};

// A runner that can issue several items with one launch. The pipeline then
// takes a group's slots together (BasicStreamPipeline::run), prepares each
// item, and when launches_together(slots) says the slots, in that order, are
// one of the runner's groups, calls start_group() once instead of start()
// per item; otherwise (and for any item whose prepare() threw) start() per
// item, as always.
//   items_per_launch(): the most items one launch carries (1: never grouped).
//   launches_together(slots): the slots, in this order, form one group.
//   launch_room(slot): how many items a group that begins at `slot` may hold
//       (the pipeline takes slots in a fixed cyclic order, so a batch whose
//       next slot is mid-group takes only the rest of that group, and the
//       one after it lines up again).
//   start_group(items, where): start() for every item at once, in id order.
//       If it throws, every item of the group fails with that error, and
//       everything issued is ordered before what finish()/settle() await.
template <class R>
concept GroupedPipelineStageRunner =
    PipelineStageRunner<R> && ::std::default_initializable<typename R::plan_type> &&
    requires(R& runner, const R& const_runner, ::std::span<const ::std::size_t> slots,
             ::std::span<const PipelineGroupItem<R>> items, const ::std::source_location& where) {
      { const_runner.items_per_launch() } noexcept -> ::std::convertible_to<::std::size_t>;
      { const_runner.launches_together(slots) } noexcept -> ::std::same_as<bool>;
      { const_runner.launch_room(slots[0]) } noexcept -> ::std::convertible_to<::std::size_t>;
      runner.start_group(items, where);
    };

}  // namespace replay
