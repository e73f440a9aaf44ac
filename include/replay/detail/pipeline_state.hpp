#pragma once
// Internals of BasicStreamPipeline: the state it shares with its completion
// thread (slot scheduling, the in-flight FIFO that delivers results in
// submission order, the completion loop) and the fixed-capacity slot FIFO.
#include <replay/detail/require_cxx20.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/stream_pipeline/completion.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/stats.hpp"

namespace replay::detail {

// Fixed-capacity FIFO of slot indices: never allocates after construction, so
// neither submitting nor completing can fail half-way for lack of memory.
class SlotRing {
 public:
  explicit SlotRing(::std::size_t capacity) : items_(capacity) {}
  bool empty() const noexcept { return count_ == 0; }
  ::std::size_t size() const noexcept { return count_; }
  void push(::std::size_t value) noexcept {
    items_[(head_ + count_) % items_.size()] = value;
    ++count_;
  }
  ::std::size_t pop() noexcept {
    const ::std::size_t value = items_[head_];
    head_ = (head_ + 1) % items_.size();
    --count_;
    return value;
  }

 private:
  ::std::vector<::std::size_t> items_;
  ::std::size_t head_ = 0;
  ::std::size_t count_ = 0;
};

// What a BasicStreamPipeline shares with its completion thread: the runner,
// the slots, the in-flight FIFO, the counters and the thread itself.
// Heap-held so that the pipeline can move while the completion thread runs.
template <PipelineStageRunner Runner>
struct PipelineState {
  using In = typename Runner::input_type;
  using Out = typename Runner::output_type;
  using callback_type = PipelineCallback<Out>;
  using completion_type = PipelineCompletion<Out>;
  // How an item's output is handed over: a vector, a count (the output went
  // to the caller's destination), or a callback.
  using Delivery = ::std::variant<::std::promise<::std::vector<Out>>, ::std::promise<::std::size_t>, callback_type>;

  struct InFlight {
    ::std::uint64_t id;
    ::std::size_t slot;
    Delivery delivery;
    ::std::exception_ptr error;  // set when start() threw
    ::std::thread::id producer;  // the thread that submitted it: its callback errors go back there
  };

  template <class... Args>
  explicit PipelineState(Args&&... args)
      : runner(::std::forward<Args>(args)...),
        free_slots(runner.slot_count()),
        order(runner.slot_count()),
        records(runner.slot_count()) {
    if (runner.slot_count() == 0) {
      throw usage_error("StreamPipeline needs at least one slot");
    }
    for (::std::size_t s = 0; s < runner.slot_count(); ++s) {
      free_slots.push(s);
    }
    completion = ::std::thread([this] { completion_loop(); });
  }
  PipelineState(const PipelineState&) = delete;
  PipelineState& operator=(const PipelineState&) = delete;

  ~PipelineState() {
    {
      ::std::lock_guard lock(mutex);
      stopping = true;
    }
    work_ready.notify_all();
    if (completion.joinable()) {
      if (completion.get_id() == ::std::this_thread::get_id()) {
        completion.detach();  // freed by the completion thread itself, as its last act (see orphan())
      } else {
        completion.join();  // delivers everything still in flight first
      }
    }
  }

  bool on_completion_thread() const noexcept { return ::std::this_thread::get_id() == completion.get_id(); }

  // The owning pipeline is being destroyed from a completion callback: the
  // completion thread keeps the state, delivers what is still in flight, and
  // frees it when it exits (never touching it afterwards).
  void orphan(::std::unique_ptr<PipelineState> self) noexcept {
    {
      ::std::lock_guard lock(mutex);
      self_owned = ::std::move(self);
      stopping = true;
    }
    work_ready.notify_all();
  }

  void require_not_completion_thread(const char* what, const ::std::source_location& where) const {
    if (::std::this_thread::get_id() == completion.get_id()) {
      throw usage_error(detail::concat("StreamPipeline::", what,
                                       " called from a completion callback; it could wait for the callback's own "
                                       "slot and deadlock. Hand the work to another thread"),
                        where);
    }
  }

  // Takes a slot (waiting if `block`), issues the item and queues it for
  // the completion thread. Empty when !block and no slot (or the producer
  // lock) is free at once.
  ::std::optional<::std::uint64_t> enqueue(::std::span<const In> input, ::std::optional<::std::span<Out>> destination,
                                           Delivery& delivery, bool block, const ::std::source_location& where) {
    require_not_completion_thread(block ? "submit" : "try_submit", where);
    if (issuing.load(::std::memory_order_relaxed) == ::std::this_thread::get_id()) {
      throw usage_error(
          "StreamPipeline::submit called from inside the compute stage; the stage only "
          "issues work for the item it was given",
          where);
    }
    check_item(input.size(), destination, where);
    const auto plan = runner.plan(input, destination, where);

    // Producers are serialized so that ids, slots and the in-flight order agree.
    ::std::unique_lock producer(producer_mutex, ::std::defer_lock);
    if (block) {
      producer.lock();
    } else if (!producer.try_lock()) {
      count_refused();
      return ::std::nullopt;
    }
    ::std::size_t slot = 0;
    ::std::uint64_t id = 0;
    {
      ::std::unique_lock lock(mutex);
      if (free_slots.empty()) {
        if (!block) {
          ++stats.refused;
          return ::std::nullopt;
        }
        ++stats.slot_waits;
        slot_freed.wait(lock, [&] { return !free_slots.empty(); });
      }
      slot = free_slots.pop();
      id = next_id++;
      ++pending;
      ++stats.submitted;
    }
    ::std::exception_ptr error;
    issuing.store(::std::this_thread::get_id(), ::std::memory_order_relaxed);
    try {
      runner.start(slot, id, input, destination, plan, where);
    } catch (...) {
      error = ::std::current_exception();  // belongs to this item alone
    }
    issuing.store(::std::thread::id(), ::std::memory_order_relaxed);
    {
      ::std::lock_guard lock(mutex);
      records[slot].emplace(InFlight{id, slot, ::std::move(delivery), error, ::std::this_thread::get_id()});
      order.push(slot);
    }
    work_ready.notify_one();
    return id;
  }

  void check_item(::std::size_t n, const ::std::optional<::std::span<Out>>& destination,
                  const ::std::source_location& where) const {
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
      if (destination && destination->size() < *planned) {
        throw usage_error(
            detail::concat("StreamPipeline: the destination holds ", detail::elements(destination->size()),
                           " but the item produces ", detail::elements(*planned)),
            where);
      }
    }
  }

  void completion_loop() noexcept {
    runner.bind_completion_thread();
    // Set when the pipeline was destroyed from a callback: freed on return,
    // after the lock below is gone; nothing touches the state after that.
    ::std::unique_ptr<PipelineState> orphaned;
    for (;;) {
      ::std::optional<InFlight> item;
      {
        ::std::unique_lock lock(mutex);
        work_ready.wait(lock, [&] { return stopping || !order.empty(); });
        if (order.empty()) {
          orphaned = ::std::move(self_owned);
          break;  // stopping, and everything was delivered
        }
        const ::std::size_t slot = order.pop();
        item.swap(records[slot]);
      }
      deliver(*item);
    }
  }

  void deliver(InFlight& item) noexcept {
    ::std::span<const Out> output;
    ::std::exception_ptr error = item.error;
    if (error == nullptr) {
      try {
        output = runner.finish(item.slot);
      } catch (...) {
        error = ::std::current_exception();
      }
    }
    if (error != nullptr) {
      runner.settle(item.slot);
    }
    bool released = false;
    const auto release = [&]() noexcept {
      if (!released) {
        released = true;
        release_slot(item.slot);
      }
    };
    if (auto* vector_promise = ::std::get_if<0>(&item.delivery)) {
      if (error == nullptr) {
        try {
          ::std::vector<Out> result(output.begin(), output.end());
          release();  // the output is out of the slot: let a producer reuse it now
          vector_promise->set_value(::std::move(result));
        } catch (...) {
          error = ::std::current_exception();  // out of memory for the result
        }
      }
      if (error != nullptr) {
        release();
        set_exception(*vector_promise, error);
      }
    } else if (auto* count_promise = ::std::get_if<1>(&item.delivery)) {
      release();  // finish() already placed the output in the destination
      if (error == nullptr) {
        try {
          count_promise->set_value(output.size());
        } catch (...) {
        }
      } else {
        set_exception(*count_promise, error);
      }
    } else {
      auto& callback = ::std::get<2>(item.delivery);
      const completion_type done{item.id, error == nullptr ? output : ::std::span<const Out>(), error};
      try {
        callback(done);  // output may live in the slot: release afterwards
      } catch (...) {
        ::std::lock_guard lock(mutex);
        try {
          callback_errors.try_emplace(item.producer, ::std::current_exception());  // the first per producer
        } catch (...) {  // out of memory: the error is dropped
        }
      }
      release();
    }
    {
      ::std::lock_guard lock(mutex);
      --pending;
      ++delivered;
      ++(error == nullptr ? stats.completed : stats.failed);
    }
    progress.notify_all();
  }

  template <class T>
  static void set_exception(::std::promise<T>& promise, const ::std::exception_ptr& error) noexcept {
    try {
      promise.set_exception(error);
    } catch (...) {
    }
  }

  void release_slot(::std::size_t slot) noexcept {
    {
      ::std::lock_guard lock(mutex);
      free_slots.push(slot);
    }
    slot_freed.notify_all();
  }

  void count_refused() {
    ::std::lock_guard lock(mutex);
    ++stats.refused;
  }

  void wait_idle() {
    ::std::unique_lock lock(mutex);
    progress.wait(lock, [&] { return pending == 0; });
  }
  // Items are delivered in id order, so "delivered > id" means id is done.
  void wait_delivered(::std::uint64_t id) {
    ::std::unique_lock lock(mutex);
    progress.wait(lock, [&] { return delivered > id; });
  }
  // The first callback error of an item this thread submitted, once.
  void rethrow_callback_error() {
    ::std::exception_ptr error;
    {
      ::std::lock_guard lock(mutex);
      if (const auto it = callback_errors.find(::std::this_thread::get_id()); it != callback_errors.end()) {
        error = ::std::move(it->second);
        callback_errors.erase(it);
      }
    }
    if (error != nullptr) {
      ::std::rethrow_exception(error);
    }
  }
  PipelineStats snapshot() const {
    PipelineStats out;
    {
      ::std::lock_guard lock(mutex);
      out = stats;
    }
    runner.add_stats(out);
    return out;
  }
  ::std::size_t pending_count() const {
    ::std::lock_guard lock(mutex);
    return pending;
  }

  Runner runner;  // first: destroyed last, after the completion thread is joined

  ::std::mutex producer_mutex;                 // serializes submit/try_submit/run
  ::std::atomic<::std::thread::id> issuing{};  // the producer inside runner.start(), if any
  mutable ::std::mutex mutex;                  // guards everything below
  ::std::condition_variable slot_freed;
  ::std::condition_variable work_ready;
  ::std::condition_variable progress;
  SlotRing free_slots;
  SlotRing order;                                    // slots in flight, in submission order
  ::std::vector<::std::optional<InFlight>> records;  // per slot
  ::std::uint64_t next_id = 0;
  ::std::uint64_t delivered = 0;
  ::std::size_t pending = 0;
  bool stopping = false;
  ::std::map<::std::thread::id, ::std::exception_ptr> callback_errors;  // per producer
  ::std::unique_ptr<PipelineState> self_owned;                          // see orphan()
  PipelineStats stats;

  ::std::thread completion;  // last: started once everything above exists
};

}  // namespace replay::detail
