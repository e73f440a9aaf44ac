#pragma once
// The CUDA-free heart of StreamPipeline: slot scheduling (a FIFO of free
// slots, back-pressure), the size checks, the in-flight FIFO that delivers
// results in submission order, the completion thread, and the tickets and
// callbacks that carry outputs and errors across threads.
//
// It is a template over the stage runner (PipelineStageRunner), which issues
// and awaits one slot's stages. StreamPipeline plugs in the CUDA runner; the
// CPU tests plug in a fake one, so everything here is tested without a GPU.
// StreamPipeline is BasicStreamPipeline over the CUDA stage runner.
#include <replay/detail/require_cxx20.hpp>

#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
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
#include "replay/error.hpp"
#include "replay/stream_pipeline/completion.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/stats.hpp"
#include "replay/stream_pipeline/ticket.hpp"

namespace replay {

namespace detail {

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

}  // namespace detail

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
  BasicStreamPipeline& operator=(BasicStreamPipeline&&) noexcept = default;
  // Drains: every submitted item is delivered (tickets become ready, callbacks
  // run) before the resources go. Never throws; a callback's exception is dropped.
  ~BasicStreamPipeline() = default;

  bool moved_from() const noexcept { return state_ == nullptr; }

  // ---- submit: blocks while every slot is busy -----------------------------

  // The output comes back as a vector.
  [[nodiscard]] PipelineTicket<::std::vector<output_type>> submit(
      ::std::span<const input_type> input, ::std::source_location where = ::std::source_location::current()) {
    return *submit_for_vector(input, true, where);
  }
  // The output is written to `destination` (pinned: directly by the copy
  // engine; pageable: from the slot's pinned staging); get() returns how many
  // elements were written. `destination` must stay valid until the item is done.
  [[nodiscard]] PipelineTicket<::std::size_t> submit(
      ::std::span<const input_type> input, ::std::span<output_type> destination,
      ::std::source_location where = ::std::source_location::current()) {
    return *submit_for_count(input, destination, true, where);
  }
  // `on_complete` runs on the completion thread with the output or the error.
  // Returns the item's id.
  ::std::uint64_t submit(::std::span<const input_type> input, callback_type on_complete,
                         ::std::source_location where = ::std::source_location::current()) {
    return *submit_with_callback(input, ::std::nullopt, ::std::move(on_complete), true, where);
  }
  ::std::uint64_t submit(::std::span<const input_type> input, ::std::span<output_type> destination,
                         callback_type on_complete, ::std::source_location where = ::std::source_location::current()) {
    return *submit_with_callback(input, destination, ::std::move(on_complete), true, where);
  }

  // ---- try_submit: empty at once when every slot is busy -------------------

  [[nodiscard]] ::std::optional<PipelineTicket<::std::vector<output_type>>> try_submit(
      ::std::span<const input_type> input, ::std::source_location where = ::std::source_location::current()) {
    return submit_for_vector(input, false, where);
  }
  [[nodiscard]] ::std::optional<PipelineTicket<::std::size_t>> try_submit(
      ::std::span<const input_type> input, ::std::span<output_type> destination,
      ::std::source_location where = ::std::source_location::current()) {
    return submit_for_count(input, destination, false, where);
  }
  [[nodiscard]] ::std::optional<::std::uint64_t> try_submit(
      ::std::span<const input_type> input, callback_type on_complete,
      ::std::source_location where = ::std::source_location::current()) {
    return submit_with_callback(input, ::std::nullopt, ::std::move(on_complete), false, where);
  }
  [[nodiscard]] ::std::optional<::std::uint64_t> try_submit(
      ::std::span<const input_type> input, ::std::span<output_type> destination, callback_type on_complete,
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
    requires(::std::convertible_to<::std::ranges::range_reference_t<Inputs>, ::std::span<const input_type>>)
  ::std::vector<::std::vector<output_type>> run(Inputs&& inputs,
                                                ::std::source_location where = ::std::source_location::current()) {
    check_batch(inputs, where);
    ::std::vector<PipelineTicket<::std::vector<output_type>>> tickets;
    try {
      for (auto&& input : inputs) {
        tickets.push_back(submit(::std::span<const input_type>(input), where));
      }
    } catch (...) {
      settle_after_failed_submit(tickets.empty() ? ::std::nullopt : ::std::optional(tickets.back().id()));
      throw;
    }
    wait_batch(tickets, where);
    return collect_batch(tickets, where);
  }

  // Streams inputs[i] into outputs[i]; returns how many elements each output
  // received. Errors as for run(inputs).
  template <::std::ranges::forward_range Inputs, ::std::ranges::forward_range Outputs>
    requires(::std::convertible_to<::std::ranges::range_reference_t<Inputs>, ::std::span<const input_type>> &&
             ::std::convertible_to<::std::ranges::range_reference_t<Outputs>, ::std::span<output_type>>)
  ::std::vector<::std::size_t> run(Inputs&& inputs, Outputs&& outputs,
                                   ::std::source_location where = ::std::source_location::current()) {
    if (::std::ranges::distance(inputs) != ::std::ranges::distance(outputs)) {
      throw usage_error("StreamPipeline::run: " + ::std::to_string(::std::ranges::distance(inputs)) +
                            " inputs but " + ::std::to_string(::std::ranges::distance(outputs)) +
                            " outputs; pass one output per input",
                        where);
    }
    // Every (input, destination) pair is checked before the first submission:
    // a refusal half-way would leave earlier items writing into destinations
    // the caller frees while the exception unwinds.
    {
      State& s = state(where);
      auto output = ::std::ranges::begin(outputs);
      for (auto&& input : inputs) {
        s.check_item(::std::span<const In>(input).size(), ::std::optional(::std::span<Out>(*output)), where);
        ++output;
      }
    }
    ::std::vector<PipelineTicket<::std::size_t>> tickets;
    try {
      auto output = ::std::ranges::begin(outputs);
      for (auto&& input : inputs) {
        tickets.push_back(submit(::std::span<const input_type>(input), ::std::span<output_type>(*output), where));
        ++output;
      }
    } catch (...) {
      settle_after_failed_submit(tickets.empty() ? ::std::nullopt : ::std::optional(tickets.back().id()));
      throw;
    }
    wait_batch(tickets, where);
    return collect_batch(tickets, where);
  }

  // Streams every input; `on_complete` receives each item's output or error,
  // in input order, on the completion thread. Returns when the batch is done.
  template <::std::ranges::forward_range Inputs, class OnComplete>
    requires(::std::convertible_to<::std::ranges::range_reference_t<Inputs>, ::std::span<const input_type>> &&
             ::std::invocable<OnComplete&, const completion_type&>)
  void run(Inputs&& inputs, OnComplete on_complete, ::std::source_location where = ::std::source_location::current()) {
    check_batch(inputs, where);
    auto shared = ::std::make_shared<OnComplete>(::std::move(on_complete));
    ::std::optional<::std::uint64_t> last;
    try {
      for (auto&& input : inputs) {
        last = submit(
            ::std::span<const input_type>(input),
            [shared](const completion_type& done) { ::std::invoke(*shared, done); }, where);
      }
    } catch (...) {
      settle_after_failed_submit(last);  // the callback may refer to the caller's frame
      throw;
    }
    if (last) {
      state(where).wait_delivered(*last);
    }
    state(where).rethrow_callback_error();
  }

  // Blocks until every item submitted so far is delivered. Rethrows (once)
  // the first exception that escaped a completion callback.
  void drain(::std::source_location where = ::std::source_location::current()) {
    State& s = state(where);
    s.require_not_completion_thread("drain", where);
    s.wait_idle();
    s.rethrow_callback_error();
  }

  PipelineStats stats(::std::source_location where = ::std::source_location::current()) const {
    return state(where).snapshot();
  }
  // Items submitted and not yet delivered.
  ::std::size_t in_flight(::std::source_location where = ::std::source_location::current()) const {
    return state(where).pending_count();
  }
  ::std::size_t slot_count(::std::source_location where = ::std::source_location::current()) const {
    return state(where).runner.slot_count();
  }
  ::std::size_t input_capacity(::std::source_location where = ::std::source_location::current()) const {
    return state(where).runner.input_capacity();
  }
  ::std::size_t output_capacity(::std::source_location where = ::std::source_location::current()) const {
    return state(where).runner.output_capacity();
  }

 protected:
  Runner& runner(::std::source_location where = ::std::source_location::current()) { return state(where).runner; }
  const Runner& runner(::std::source_location where = ::std::source_location::current()) const {
    return state(where).runner;
  }

 private:
  using In = input_type;
  using Out = output_type;
  using Delivery = ::std::variant<::std::promise<::std::vector<Out>>, ::std::promise<::std::size_t>, callback_type>;

  struct InFlight {
    ::std::uint64_t id;
    ::std::size_t slot;
    Delivery delivery;
    ::std::exception_ptr error;  // set when start() threw
  };

  // Heap-held so that the pipeline can move while the completion thread runs.
  struct State {
    template <class... Args>
    explicit State(Args&&... args)
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
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    ~State() {
      {
        ::std::lock_guard lock(mutex);
        stopping = true;
      }
      work_ready.notify_all();
      if (completion.joinable()) {
        if (completion.get_id() == ::std::this_thread::get_id()) {
          completion.detach();  // destroyed from a callback: documented as forbidden
        } else {
          completion.join();  // delivers everything still in flight first
        }
      }
    }

    void require_not_completion_thread(const char* what, const ::std::source_location& where) const {
      if (::std::this_thread::get_id() == completion.get_id()) {
        throw usage_error(::std::string("StreamPipeline::") + what +
                              " called from a completion callback; it could wait for the callback's own "
                              "slot and deadlock. Hand the work to another thread",
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
        throw usage_error("StreamPipeline::submit called from inside the compute stage; the stage only "
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
        records[slot].emplace(InFlight{id, slot, ::std::move(delivery), error});
        order.push(slot);
      }
      work_ready.notify_one();
      return id;
    }

    void check_item(::std::size_t n, const ::std::optional<::std::span<Out>>& destination,
                    const ::std::source_location& where) const {
      const ::std::size_t capacity = runner.input_capacity();
      if (n > capacity) {
        throw usage_error("StreamPipeline: the item holds " + detail::elements(n) + " but a slot holds at most " +
                              detail::elements(capacity) +
                              " (PipelineOptions::input_capacity); split the item or raise the capacity",
                          where);
      }
      if (const auto required = runner.required_input_count(); required && n != *required) {
        throw usage_error("StreamPipeline: the item holds " + detail::elements(n) +
                              " but the slot graphs were captured for exactly " + detail::elements(*required) +
                              " (PipelineFlags::graph_compute / graph_slot); pad the item to that size or "
                              "use the default (eager) mode for variable sizes",
                          where);
      }
      if (const auto planned = runner.planned_output_count(n)) {
        if (*planned > runner.output_capacity()) {
          throw usage_error("StreamPipeline: an item of " + detail::elements(n) + " produces " +
                                detail::elements(*planned) + " but a slot's output holds at most " +
                                detail::elements(runner.output_capacity()) +
                                " (PipelineOptions::output_capacity / output_count)",
                            where);
        }
        if (destination && destination->size() < *planned) {
          throw usage_error("StreamPipeline: the destination holds " + detail::elements(destination->size()) +
                                " but the item produces " + detail::elements(*planned),
                            where);
        }
      }
    }

    void completion_loop() noexcept {
      runner.bind_completion_thread();
      for (;;) {
        ::std::optional<InFlight> item;
        {
          ::std::unique_lock lock(mutex);
          work_ready.wait(lock, [&] { return stopping || !order.empty(); });
          if (order.empty()) {
            return;  // stopping, and everything was delivered
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
          if (callback_error == nullptr) {
            callback_error = ::std::current_exception();
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
    void rethrow_callback_error() {
      ::std::exception_ptr error;
      {
        ::std::lock_guard lock(mutex);
        error = ::std::exchange(callback_error, nullptr);
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

    ::std::mutex producer_mutex;  // serializes submit/try_submit/run
    ::std::atomic<::std::thread::id> issuing{};  // the producer inside runner.start(), if any
    mutable ::std::mutex mutex;   // guards everything below
    ::std::condition_variable slot_freed;
    ::std::condition_variable work_ready;
    ::std::condition_variable progress;
    detail::SlotRing free_slots;
    detail::SlotRing order;                        // slots in flight, in submission order
    ::std::vector<::std::optional<InFlight>> records;  // per slot
    ::std::uint64_t next_id = 0;
    ::std::uint64_t delivered = 0;
    ::std::size_t pending = 0;
    bool stopping = false;
    ::std::exception_ptr callback_error;
    PipelineStats stats;

    ::std::thread completion;  // last: started once everything above exists
  };

  State& state(const ::std::source_location& where) const {
    if (state_ == nullptr) [[unlikely]] {
      throw usage_error("StreamPipeline used after move", where);
    }
    return *state_;
  }

  // The results of a delivered batch, in order; a failed item leaves a
  // value-initialized result, and the first failure is rethrown at the end.
  template <class T>
  static ::std::vector<T> collect_batch(::std::vector<PipelineTicket<T>>& tickets, const ::std::source_location& where) {
    ::std::vector<T> results;
    results.reserve(tickets.size());
    ::std::exception_ptr first_error;
    for (auto& ticket : tickets) {
      try {
        results.push_back(ticket.get(where));
      } catch (...) {
        if (first_error == nullptr) {
          first_error = ::std::current_exception();
        }
        results.emplace_back();
      }
    }
    if (first_error != nullptr) {
      ::std::rethrow_exception(first_error);
    }
    return results;
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
      s.check_item(::std::span<const In>(input).size(), ::std::nullopt, where);
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

  ::std::optional<PipelineTicket<::std::vector<Out>>> submit_for_vector(::std::span<const In> input, bool block,
                                                                       const ::std::source_location& where) {
    State& s = state(where);
    ::std::promise<::std::vector<Out>> promise;
    auto future = promise.get_future();
    Delivery delivery(::std::in_place_index<0>, ::std::move(promise));
    const auto id = s.enqueue(input, ::std::nullopt, delivery, block, where);
    if (!id) {
      return ::std::nullopt;
    }
    return PipelineTicket<::std::vector<Out>>(*id, ::std::move(future));
  }
  ::std::optional<PipelineTicket<::std::size_t>> submit_for_count(::std::span<const In> input,
                                                                 ::std::span<Out> destination, bool block,
                                                                 const ::std::source_location& where) {
    State& s = state(where);
    ::std::promise<::std::size_t> promise;
    auto future = promise.get_future();
    Delivery delivery(::std::in_place_index<1>, ::std::move(promise));
    const auto id = s.enqueue(input, destination, delivery, block, where);
    if (!id) {
      return ::std::nullopt;
    }
    return PipelineTicket<::std::size_t>(*id, ::std::move(future));
  }
  ::std::optional<::std::uint64_t> submit_with_callback(::std::span<const In> input,
                                                       ::std::optional<::std::span<Out>> destination,
                                                       callback_type on_complete, bool block,
                                                       const ::std::source_location& where) {
    if (!on_complete) {
      throw usage_error("StreamPipeline::submit: the completion callback is empty", where);
    }
    State& s = state(where);
    Delivery delivery(::std::in_place_index<2>, ::std::move(on_complete));
    return s.enqueue(input, destination, delivery, block, where);
  }

  ::std::unique_ptr<State> state_;
};

}  // namespace replay
