#pragma once
#include <replay/detail/require_cxx20.hpp>
// PipelineState's completion thread: the loop that waits for the in-flight
// FIFO's head to be issued, the short watch before it sleeps, and the
// delivery of one item's output (to a vector ticket, a count ticket or a
// callback); included by stream_pipeline/detail/state.hpp.
#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "replay/stream_pipeline/detail/state.hpp"
#include "replay/stream_pipeline/completion.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"

namespace replay::detail {

template <PipelineStageRunner Runner>
inline void PipelineState<Runner>::completion_loop() noexcept {
  runner.bind_completion_thread();
  for (;;) {
    ::std::optional<InFlight> item;
    ::std::size_t slot = 0;
    await_next_issue();
    {
      ::std::unique_lock lock(mutex);
      const auto ready = [&] { return order.empty() ? stopping : records[order.front()]->issued; };
      if (!ready()) {
        end_batch_before_sleeping();
      }
      work_ready.wait(lock, ready);
      if (order.empty()) {
        if (orphaned) {
          lock.unlock();
          completion.detach();  // this thread owns the state now: nobody joins it
          delete this;
        }
        return;  // stopping, and everything was delivered
      }
      slot = order.pop();
      item.swap(records[slot]);
    }
    deliver(slot, *item);
  }
}

template <PipelineStageRunner Runner>
inline void PipelineState<Runner>::await_next_issue() const noexcept {
  if (issued_count.load(::std::memory_order_acquire) > delivered) {
    return;
  }
  const auto deadline = ::std::chrono::steady_clock::now() + completion_watch;
  do {
    for (int i = 0; i < 64; ++i) {
      if (issued_count.load(::std::memory_order_acquire) > delivered) {
        return;
      }
      cpu_relax();
    }
  } while (::std::chrono::steady_clock::now() < deadline);
}

template <PipelineStageRunner Runner>
inline void PipelineState<Runner>::cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

template <PipelineStageRunner Runner>
inline void PipelineState<Runner>::deliver(::std::size_t slot, InFlight& item) noexcept {
  ::std::span<const Out> output;
  ::std::exception_ptr error = item.error;
  ::std::vector<Out> result;
  const bool to_vector = item.delivery.index() == 0;
  if (error == nullptr) {
    try {
      PipelineOutputSink<Out> sink;
      if (to_vector) {
        sink.context = &result;
        sink.allocate = [](void* context, ::std::size_t n) -> Out* {
          auto& vector = *static_cast<::std::vector<Out>*>(context);
          vector.resize(n);
          return vector.data();
        };
      }
      output = runner.finish(slot, sink);
    } catch (...) {
      error = ::std::current_exception();
    }
  }
  if (error != nullptr) {
    runner.settle(slot);
  }
  if (auto* vector_record = ::std::get_if<0>(&item.delivery)) {
    if (error == nullptr) {
      if (output.data() != result.data() || output.size() != result.size()) {
        try {  // a runner that ignored the sink
          result.assign(output.begin(), output.end());
        } catch (...) {
          error = ::std::current_exception();
        }
      }
    }
    if (error == nullptr) {
      vectors->fulfill(*vector_record, ::std::move(result));
    } else {
      vectors->fail(*vector_record, error);
    }
  } else if (auto* count_record = ::std::get_if<1>(&item.delivery)) {
    if (error == nullptr) {
      counts->fulfill(*count_record, output.size());
    } else {
      counts->fail(*count_record, error);
    }
  } else {
    auto& callback = ::std::get<2>(item.delivery);
    const completion_type done{item.id, error == nullptr ? output : ::std::span<const Out>(), error};
    try {
      callback.callback(done);  // output may live in the slot: release afterwards
    } catch (...) {
      ::std::lock_guard lock(mutex);
      // The producer's first error is kept, later ones dropped; a producer
      // that is gone leaves it to the pipeline's own.
      CallbackErrors& errors = callback.errors->closed ? *own_callback_errors : *callback.errors;
      if (errors.first == nullptr) {
        errors.first = ::std::current_exception();
      }
    }
  }
  const auto now = SlotRefill::clock::now();
  bool wake_producer = false;
  bool wake_group = false;
  {
    ::std::lock_guard lock(mutex);
    free_slots.push(slot);
    refill.delivered(now);
    wake_producer = refill.should_wake(free_slots.size());
    callbacks_in_flight -= item.delivery.index() == 2 ? 1 : 0;
    wake_group = should_wake_group();
    --pending;
    ++delivered;
    ++(error == nullptr ? stats.completed : stats.failed);
  }
  if (wake_producer) {
    slot_freed.notify_one();
  }
  if (wake_group) {
    group_freed.notify_all();  // needs may differ: each rechecks its own
  }
  progress.notify_all();
}

}  // namespace replay::detail
