#pragma once
// PipelineProducer: a producer's own way into a pipeline, whose callbacks'
// exceptions come back from its own drain(), never another producer's.
#include <replay/detail/require_cxx20.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>
#include <utility>

#include "replay/stream_pipeline/detail/state.hpp"
#include "replay/error.hpp"
#include "replay/stream_pipeline/completion.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"

namespace replay {

// Made by BasicStreamPipeline::producer(). submit()/try_submit() with a
// callback as on the pipeline; an exception that escapes one of these
// callbacks belongs to this producer: its drain() rethrows it (once), and
// neither the pipeline's drain() nor another producer's ever sees it, whatever
// thread submitted the item or drains (a producer may move between threads,
// and several threads may use one). Destroying the producer hands an error it
// has not reported, and any its items in flight still raise, to the
// pipeline's drain(). Move-only. It must not be used once its pipeline is
// destroyed (a usage_error then); destroying it afterwards is fine.
template <PipelineStageRunner Runner>
class PipelineProducer {
  using State = detail::PipelineState<Runner>;

 public:
  // The pipeline's output element type.
  using output_type = typename Runner::output_type;
  // Inputs, as BasicStreamPipeline::input_range.
  using input_range = HostRange<const typename Runner::input_type>;
  // Destinations, as BasicStreamPipeline::destination_range.
  using destination_range = HostRange<output_type>;
  // Receives each item's output or error on the completion thread.
  using callback_type = PipelineCallback<output_type>;

  PipelineProducer(const PipelineProducer&) = delete;
  PipelineProducer& operator=(const PipelineProducer&) = delete;
  // Takes over `other`'s errors and items; `other` is then moved-from.
  PipelineProducer(PipelineProducer&& other) noexcept
      : state_(::std::exchange(other.state_, nullptr)),
        alive_(::std::move(other.alive_)),
        errors_(::std::move(other.errors_)),
        after_last_(other.after_last_.load()) {}
  // Lets go of this producer's own errors (to the pipeline), then takes over `other`'s.
  PipelineProducer& operator=(PipelineProducer&& other) noexcept {
    if (this != &other) {
      close();
      state_ = ::std::exchange(other.state_, nullptr);
      alive_ = ::std::move(other.alive_);
      errors_ = ::std::move(other.errors_);
      after_last_ = other.after_last_.load();
    }
    return *this;
  }
  ~PipelineProducer() { close(); }

  // As BasicStreamPipeline::submit with a callback (blocks while every slot
  // is busy); returns the item's id.
  ::std::uint64_t submit(input_range input, callback_type on_complete,
                         ::std::source_location where = ::std::source_location::current()) {
    return *enqueue(input, ::std::nullopt, ::std::move(on_complete), true, where);
  }
  // The same, the output written to `destination`.
  ::std::uint64_t submit(input_range input, destination_range destination, callback_type on_complete,
                         ::std::source_location where = ::std::source_location::current()) {
    return *enqueue(input, destination, ::std::move(on_complete), true, where);
  }
  // As BasicStreamPipeline::try_submit with a callback: empty at once when
  // every slot is busy.
  [[nodiscard]] ::std::optional<::std::uint64_t> try_submit(
      input_range input, callback_type on_complete, ::std::source_location where = ::std::source_location::current()) {
    return enqueue(input, ::std::nullopt, ::std::move(on_complete), false, where);
  }
  // The same, the output written to `destination`.
  [[nodiscard]] ::std::optional<::std::uint64_t> try_submit(
      input_range input, destination_range destination, callback_type on_complete,
      ::std::source_location where = ::std::source_location::current()) {
    return enqueue(input, destination, ::std::move(on_complete), false, where);
  }

  // Blocks until every item submitted through this producer so far is
  // delivered (not other producers' items), then rethrows (once) the first
  // exception that escaped one of their callbacks.
  void drain(::std::source_location where = ::std::source_location::current()) {
    State& s = state(where);
    s.require_not_completion_thread("drain", where);
    if (const ::std::uint64_t after_last = after_last_.load(); after_last != 0) {
      s.wait_delivered(after_last - 1);
    }
    s.rethrow_callback_error(*errors_);
  }

  // True after this producer was moved from.
  bool moved_from() const noexcept { return state_ == nullptr; }

 private:
  template <PipelineStageRunner>
  friend class BasicStreamPipeline;
  explicit PipelineProducer(State& state)
      : state_(&state), alive_(state.alive), errors_(::std::make_shared<detail::CallbackErrors>()) {}

  State& state(const ::std::source_location& where) const {
    if (state_ == nullptr) [[unlikely]] {
      throw usage_error("PipelineProducer used after move", where);
    }
    if (!alive_->load()) [[unlikely]] {
      throw usage_error("PipelineProducer used after its StreamPipeline was destroyed", where);
    }
    return *state_;
  }

  ::std::optional<::std::uint64_t> enqueue(input_range input, ::std::optional<destination_range> destination,
                                           callback_type on_complete, bool block,
                                           const ::std::source_location& where) {
    State& s = state(where);
    auto delivery = s.make_callback_delivery(::std::move(on_complete), errors_, where);
    const auto id = s.enqueue(input, destination, delivery, block, where);
    if (id) {
      // Several threads may submit through one producer: keep the largest id.
      ::std::uint64_t seen = after_last_.load();
      while (seen < *id + 1 && !after_last_.compare_exchange_weak(seen, *id + 1)) {
      }
    }
    return id;
  }

  void close() noexcept {
    if (state_ != nullptr && alive_->load()) {
      state_->close_callback_errors(*errors_);
    }
    state_ = nullptr;
  }

  State* state_ = nullptr;
  ::std::shared_ptr<::std::atomic<bool>> alive_;
  ::std::shared_ptr<detail::CallbackErrors> errors_;
  ::std::atomic<::std::uint64_t> after_last_{0};  // the last item's id + 1; 0: none yet
};

}  // namespace replay
