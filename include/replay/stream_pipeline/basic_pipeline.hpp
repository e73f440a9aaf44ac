#pragma once
// The heart of StreamPipeline, which makes no CUDA call itself: slot
// scheduling (a FIFO of free slots, back-pressure), the size checks, the
// in-order issue turn, the in-flight FIFO that delivers results in submission
// order, the completion thread, and the tickets and callbacks that carry
// outputs and errors across threads.
//
// It is a template over the stage runner (PipelineStageRunner), which issues
// and awaits one slot's stages. StreamPipeline plugs in the CUDA runner; the
// CPU tests plug in a fake one, so everything here is tested without a GPU.
// StreamPipeline is BasicStreamPipeline over the CUDA stage runner.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <source_location>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/stream_pipeline/detail/state.hpp"
#include "replay/error.hpp"
#include "replay/stream_pipeline/completion.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/producer.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/stats.hpp"
#include "replay/stream_pipeline/ticket.hpp"

namespace replay {

template <PipelineStageRunner Runner>
class BasicStreamPipeline {
 public:
  using runner_type = Runner;
  using input_type = typename Runner::input_type;
  using output_type = typename Runner::output_type;
  using completion_type = PipelineCompletion<output_type>;
  using callback_type = PipelineCallback<output_type>;

  // Builds the runner in place from `args` and starts the completion thread.
  template <class... Args>
  explicit BasicStreamPipeline(::std::in_place_t, Args&&... args)
      : state_(::std::make_unique<State>(::std::forward<Args>(args)...)) {}

  BasicStreamPipeline(const BasicStreamPipeline&) = delete;
  BasicStreamPipeline& operator=(const BasicStreamPipeline&) = delete;
  BasicStreamPipeline(BasicStreamPipeline&&) noexcept = default;
  // Drains and destroys this pipeline first.
  BasicStreamPipeline& operator=(BasicStreamPipeline&& other) noexcept {
    if (this != &other) {
      reset();
      state_ = ::std::move(other.state_);
    }
    return *this;
  }
  // Drains: every submitted item is delivered (tickets become ready, callbacks
  // run) before the resources go. Never throws; a callback's exception is
  // dropped. From a completion callback it returns at once, and the
  // completion thread delivers the rest and then frees the pipeline itself.
  ~BasicStreamPipeline() { reset(); }

  bool moved_from() const noexcept { return state_ == nullptr; }

  // Inputs and destinations are HostRanges: anything a std::span converts
  // from (the memory kind is then asked per item), or a PinnedBuffer, pinned
  // BufferView or RegisteredHostBuffer (known pinned: used in place, no query).
  using input_range = HostRange<const input_type>;
  using destination_range = HostRange<output_type>;

  // ---- submit: blocks while every slot is busy -----------------------------
  // (A producer waiting alone for small, fast items is woken once a few
  // slots are free rather than one: docs/stream_pipeline.md, threading model.)

  // The output comes back as a vector (allocated per item; a destination
  // avoids that).
  [[nodiscard]] PipelineTicket<::std::vector<output_type>> submit(
      input_range input, ::std::source_location where = ::std::source_location::current()) {
    return *submit_for_vector(input, true, where);
  }
  // The output is written to `destination` (pinned: directly by the copy
  // engine; pageable: from the slot's pinned staging); get() returns how many
  // elements were written. `destination` must stay valid until the item is done.
  [[nodiscard]] PipelineTicket<::std::size_t> submit(
      input_range input, destination_range destination,
      ::std::source_location where = ::std::source_location::current()) {
    return *submit_for_count(input, destination, true, where);
  }
  // `on_complete` runs on the completion thread with the output or the error.
  // Returns the item's id.
  ::std::uint64_t submit(input_range input, callback_type on_complete,
                         ::std::source_location where = ::std::source_location::current()) {
    return *submit_with_callback(input, ::std::nullopt, ::std::move(on_complete), true, where);
  }
  ::std::uint64_t submit(input_range input, destination_range destination, callback_type on_complete,
                         ::std::source_location where = ::std::source_location::current()) {
    return *submit_with_callback(input, destination, ::std::move(on_complete), true, where);
  }

  // ---- try_submit: empty at once when every slot is busy -------------------

  [[nodiscard]] ::std::optional<PipelineTicket<::std::vector<output_type>>> try_submit(
      input_range input, ::std::source_location where = ::std::source_location::current()) {
    return submit_for_vector(input, false, where);
  }
  [[nodiscard]] ::std::optional<PipelineTicket<::std::size_t>> try_submit(
      input_range input, destination_range destination,
      ::std::source_location where = ::std::source_location::current()) {
    return submit_for_count(input, destination, false, where);
  }
  [[nodiscard]] ::std::optional<::std::uint64_t> try_submit(
      input_range input, callback_type on_complete,
      ::std::source_location where = ::std::source_location::current()) {
    return submit_with_callback(input, ::std::nullopt, ::std::move(on_complete), false, where);
  }
  [[nodiscard]] ::std::optional<::std::uint64_t> try_submit(
      input_range input, destination_range destination, callback_type on_complete,
      ::std::source_location where = ::std::source_location::current()) {
    return submit_with_callback(input, destination, ::std::move(on_complete), false, where);
  }

  // ---- run: a whole batch ---------------------------------------------------

  // Streams every input through the pipeline and returns the outputs in input
  // order. Every item's size is checked before any is submitted; should a
  // submission still throw (a CUDA error while issuing), the items already
  // submitted are delivered before the exception leaves. If items fail, the
  // others still complete, and the first failure is rethrown once the whole
  // batch is done (use the callback overload to keep partial results).
  template <::std::ranges::forward_range Inputs>
    requires(::std::convertible_to<::std::ranges::range_reference_t<Inputs>, input_range>)
  ::std::vector<::std::vector<output_type>> run(Inputs&& inputs,
                                                ::std::source_location where = ::std::source_location::current()) {
    check_batch(inputs, where);
    ::std::vector<PipelineTicket<::std::vector<output_type>>> tickets;
    try {
      State& s = state(where);
      ::std::vector<input_range> ins;
      for (auto&& input : inputs) {
        ins.push_back(input_range(input));
      }
      detail::submit_batch(
          s, ins, {}, [&] { return s.make_vector_delivery(); },
          [&](Delivery& accepted, ::std::uint64_t id) {
            tickets.push_back(PipelineTicket<::std::vector<Out>>(id, s.vectors, ::std::get<0>(accepted)));
          },
          where);
    } catch (...) {
      settle_after_failed_submit(tickets.empty() ? ::std::nullopt : ::std::optional(tickets.back().id()));
      throw;
    }
    wait_batch(tickets, where);
    return detail::collect_batch(tickets, where);
  }

  // Streams inputs[i] into outputs[i]; returns how many elements each output
  // received. Errors as for run(inputs).
  template <::std::ranges::forward_range Inputs, ::std::ranges::forward_range Outputs>
    requires(::std::convertible_to<::std::ranges::range_reference_t<Inputs>, input_range> &&
             ::std::convertible_to<::std::ranges::range_reference_t<Outputs>, destination_range>)
  ::std::vector<::std::size_t> run(Inputs&& inputs, Outputs&& outputs,
                                   ::std::source_location where = ::std::source_location::current()) {
    if (::std::ranges::distance(inputs) != ::std::ranges::distance(outputs)) {
      throw usage_error(detail::concat("StreamPipeline::run: ", ::std::ranges::distance(inputs), " inputs but ",
                                       ::std::ranges::distance(outputs), " outputs; pass one output per input"),
                        where);
    }
    // Every (input, destination) pair is checked before the first submission:
    // a refusal half-way would leave earlier items writing into destinations
    // the caller frees while the exception unwinds.
    {
      State& s = state(where);
      auto output = ::std::ranges::begin(outputs);
      for (auto&& input : inputs) {
        s.check_item(input_range(input).size(), ::std::optional(destination_range(*output).size()), where);
        ++output;
      }
    }
    ::std::vector<PipelineTicket<::std::size_t>> tickets;
    try {
      State& s = state(where);
      ::std::vector<input_range> ins;
      ::std::vector<destination_range> outs;
      auto output = ::std::ranges::begin(outputs);
      for (auto&& input : inputs) {
        ins.push_back(input_range(input));
        outs.push_back(destination_range(*output));
        ++output;
      }
      detail::submit_batch(
          s, ins, outs, [&] { return s.make_count_delivery(); },
          [&](Delivery& accepted, ::std::uint64_t id) {
            tickets.push_back(PipelineTicket<::std::size_t>(id, s.counts, ::std::get<1>(accepted)));
          },
          where);
    } catch (...) {
      settle_after_failed_submit(tickets.empty() ? ::std::nullopt : ::std::optional(tickets.back().id()));
      throw;
    }
    wait_batch(tickets, where);
    return detail::collect_batch(tickets, where);
  }

  // Streams every input; `on_complete` receives each item's output or error,
  // in input order, on the completion thread. Returns when the batch is done.
  template <::std::ranges::forward_range Inputs, class OnComplete>
    requires(::std::convertible_to<::std::ranges::range_reference_t<Inputs>, input_range> &&
             ::std::invocable<OnComplete&, const completion_type&>)
  void run(Inputs&& inputs, OnComplete on_complete, ::std::source_location where = ::std::source_location::current()) {
    check_batch(inputs, where);
    // The batch lives in this frame until its last item is delivered; its
    // callback's first exception is this batch's, not the pipeline's, so it
    // never reaches another producer's drain() or run().
    struct Batch {
      OnComplete* on_complete;
      ::std::exception_ptr error;
    } batch{&on_complete, nullptr};
    ::std::optional<::std::uint64_t> last;
    try {
      for (auto&& input : inputs) {
        last = submit(
            input_range(input),
            [b = &batch](const completion_type& done) {  // one pointer: no allocation per item
              try {
                ::std::invoke(*b->on_complete, done);
              } catch (...) {
                if (b->error == nullptr) {
                  b->error = ::std::current_exception();
                }
              }
            },
            where);
      }
    } catch (...) {
      settle_after_failed_submit(last);  // the callback refers to this frame
      throw;
    }
    if (last) {
      state(where).wait_delivered(*last);  // orders the callbacks' writes before the reads below
    }
    if (batch.error != nullptr) {
      ::std::rethrow_exception(batch.error);
    }
  }

  // Blocks until every item submitted so far is delivered. Rethrows (once)
  // the first exception that escaped a callback passed to this pipeline's
  // submit/try_submit, from whatever thread (a PipelineProducer's callbacks
  // report to that producer's drain(), run's callbacks to their run).
  void drain(::std::source_location where = ::std::source_location::current()) {
    State& s = state(where);
    s.require_not_completion_thread("drain", where);
    s.wait_idle();
    s.rethrow_callback_error(*s.own_callback_errors);
  }

  // A producer of its own for submissions with a callback: the exceptions
  // its callbacks throw come back from its drain() alone (see
  // PipelineProducer). One per thread, or per source of work, that wants its
  // errors kept apart from others'.
  [[nodiscard]] PipelineProducer<Runner> producer(::std::source_location where = ::std::source_location::current()) {
    return PipelineProducer<Runner>(state(where));
  }

  PipelineStats stats() const { return state().snapshot(); }
  // Items submitted and not yet delivered.
  ::std::size_t in_flight() const { return state().pending_count(); }
  ::std::size_t slot_count() const { return state().runner.slot_count(); }
  ::std::size_t input_capacity() const { return state().runner.input_capacity(); }
  ::std::size_t output_capacity() const { return state().runner.output_capacity(); }

 protected:
  Runner& runner(::std::source_location where = ::std::source_location::current()) { return state(where).runner; }
  const Runner& runner(::std::source_location where = ::std::source_location::current()) const {
    return state(where).runner;
  }

 private:
  using State = detail::PipelineState<Runner>;
  using In = input_type;
  using Out = output_type;
  using Delivery = typename State::Delivery;

  // From the completion thread (a callback destroying the pipeline) the
  // state cannot be joined: it is handed to that thread, which delivers the
  // rest and frees it once its loop ends.
  void reset() noexcept {
    if (state_ != nullptr) {
      state_->alive->store(false);  // its producers refuse use from now on
    }
    if (state_ != nullptr && state_->on_completion_thread()) {
      state_.release()->orphan();
      return;
    }
    state_.reset();
  }

  // Queries without a caller's location report the pipeline's own.
  State& state(const ::std::source_location& where = ::std::source_location::current()) const {
    if (state_ == nullptr) [[unlikely]] {
      throw usage_error("StreamPipeline used after move", where);
    }
    return *state_;
  }


  // After a submission in a batch threw: waits until the items submitted
  // before it are delivered, so that none still writes into the caller's
  // memory (or calls its callback) once the exception has unwound the caller.
  void settle_after_failed_submit(::std::optional<::std::uint64_t> last_submitted) noexcept {
    if (!last_submitted || state_ == nullptr) {
      return;
    }
    try {
      state_->wait_delivered(*last_submitted);
    } catch (...) {
    }
  }

  template <::std::ranges::forward_range Inputs>
  void check_batch(Inputs& inputs, const ::std::source_location& where) {
    State& s = state(where);
    for (auto&& input : inputs) {
      s.check_item(input_range(input).size(), ::std::nullopt, where);
    }
  }

  // Returns once the batch is fully delivered (its counters included), not
  // merely once its last ticket is ready.
  template <class Ticket>
  void wait_batch(const ::std::vector<Ticket>& tickets, const ::std::source_location& where) {
    if (!tickets.empty()) {
      state(where).wait_delivered(tickets.back().id());
    }
  }

  ::std::optional<PipelineTicket<::std::vector<Out>>> submit_for_vector(input_range input, bool block,
                                                                       const ::std::source_location& where) {
    State& s = state(where);
    Delivery delivery = s.make_vector_delivery();
    auto* record = ::std::get<0>(delivery);
    const auto id = s.enqueue_or_discard(input, ::std::nullopt, delivery, block, where);
    if (!id) {
      return ::std::nullopt;
    }
    return PipelineTicket<::std::vector<Out>>(*id, s.vectors, record);
  }
  ::std::optional<PipelineTicket<::std::size_t>> submit_for_count(input_range input, destination_range destination,
                                                                 bool block, const ::std::source_location& where) {
    State& s = state(where);
    Delivery delivery = s.make_count_delivery();
    auto* record = ::std::get<1>(delivery);
    const auto id = s.enqueue_or_discard(input, destination, delivery, block, where);
    if (!id) {
      return ::std::nullopt;
    }
    return PipelineTicket<::std::size_t>(*id, s.counts, record);
  }
  ::std::optional<::std::uint64_t> submit_with_callback(input_range input,
                                                       ::std::optional<destination_range> destination,
                                                       callback_type on_complete, bool block,
                                                       const ::std::source_location& where) {
    State& s = state(where);
    Delivery delivery = s.make_callback_delivery(::std::move(on_complete), s.own_callback_errors, where);
    return s.enqueue(input, destination, delivery, block, where);
  }

  ::std::unique_ptr<State> state_;
};

}  // namespace replay
