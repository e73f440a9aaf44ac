#pragma once
// Internals of BasicStreamPipeline: the state it shares with its completion
// thread (slot scheduling, the in-order issue turn, the in-flight FIFO that
// delivers results in submission order). The completion thread's loop and
// delivery are in stream_pipeline/detail/delivery.hpp, the fixed-capacity slot FIFO
// in stream_pipeline/detail/slot_ring.hpp.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
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
#include "replay/stream_pipeline/detail/item_check.hpp"
#include "replay/stream_pipeline/detail/slot_refill.hpp"
#include "replay/stream_pipeline/detail/slot_ring.hpp"
#include "replay/stream_pipeline/detail/ticket_state.hpp"
#include "replay/error.hpp"
#include "replay/stream_pipeline/completion.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/stats.hpp"

namespace replay::detail {

// Where the exceptions that escape a producer's callbacks go: the
// pipeline's own (submit() on the pipeline, rethrown by its drain()) or a
// PipelineProducer's (rethrown by that producer's drain()). The first is kept
// until a drain() takes it; later ones are dropped. Shared by the producer and
// its items in flight; guarded by the pipeline's mutex.
struct CallbackErrors {
  ::std::exception_ptr first;
  bool closed = false;  // its producer is gone: later errors go to the pipeline's own
};

// What a BasicStreamPipeline shares with its completion thread: the runner,
// the slots, the in-flight FIFO, the counters and the thread itself.
// Heap-held so that the pipeline can move while the completion thread runs.
//
// One item's path: take a slot and an id (one lock; the item joins the
// in-flight FIFO at once, so ids, slots and delivery order agree), prepare it
// (the input's host staging and copy-in, concurrently with other producers),
// wait for its turn (ids are issued in order; usually no wait and no lock),
// start it (compute and copy-out, serialized), mark it issued (one lock). The
// completion thread delivers the FIFO's head once it is issued.
template <PipelineStageRunner Runner>
struct PipelineState {
  using In = typename Runner::input_type;
  using Out = typename Runner::output_type;
  using callback_type = PipelineCallback<Out>;
  using completion_type = PipelineCompletion<Out>;
  using VectorPool = TicketPool<::std::vector<Out>>;
  using CountPool = TicketPool<::std::size_t>;
  // A callback, and where an exception escaping it goes.
  struct CallbackDelivery {
    callback_type callback;
    ::std::shared_ptr<CallbackErrors> errors;
  };
  // How an item's output is handed over: a vector ticket, a count ticket
  // (the output went to the caller's destination), or a callback.
  using Delivery =
      ::std::variant<typename VectorPool::record_type*, typename CountPool::record_type*, CallbackDelivery>;

  struct InFlight {
    ::std::uint64_t id = 0;
    Delivery delivery;
    ::std::exception_ptr error;  // set when prepare() or start() threw
    bool issued = false;         // prepare() and start() returned
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
      completion.join();  // delivers everything still in flight first
    }
  }

  bool on_completion_thread() const noexcept { return ::std::this_thread::get_id() == completion.get_id(); }

  // The pipeline was destroyed from a callback: the completion thread
  // finishes delivering and then deletes this state itself.
  void orphan() noexcept {
    {
      ::std::lock_guard lock(mutex);
      orphaned = true;
      stopping = true;
    }
  }

  void require_not_completion_thread(const char* what, const ::std::source_location& where) const {
    if (on_completion_thread()) {
      throw usage_error(detail::concat("StreamPipeline::", what,
                                       " called from a completion callback; it could wait for the callback's own "
                                       "slot and deadlock. Hand the work to another thread"),
                        where);
    }
  }

  // A delivery made before the item is accepted; handed back by discard()
  // when the item is refused.
  Delivery make_vector_delivery() { return Delivery(::std::in_place_index<0>, vectors->acquire()); }
  Delivery make_count_delivery() { return Delivery(::std::in_place_index<1>, counts->acquire()); }
  Delivery make_callback_delivery(callback_type callback, ::std::shared_ptr<CallbackErrors> errors,
                                  const ::std::source_location& where) const {
    if (!callback) {
      throw usage_error("StreamPipeline::submit: the completion callback is empty", where);
    }
    return Delivery(::std::in_place_index<2>, CallbackDelivery{::std::move(callback), ::std::move(errors)});
  }
  void discard(Delivery& delivery) noexcept {
    if (auto* record = ::std::get_if<0>(&delivery)) {
      vectors->release(*record);  // both shares: no ticket was made
      vectors->release(*record);
    } else if (auto* count_record = ::std::get_if<1>(&delivery)) {
      counts->release(*count_record);
      counts->release(*count_record);
    }
  }

  // Takes a slot (waiting if `block`), issues the item and queues it for the
  // completion thread. Empty when !block and no slot is free at once; then
  // (and when it throws) `delivery` is left to the caller.
  ::std::optional<::std::uint64_t> enqueue(HostRange<const In> input, ::std::optional<HostRange<Out>> destination,
                                           Delivery& delivery, bool block, const ::std::source_location& where) {
    refuse_reentry(block ? "submit" : "try_submit", where);
    check_item(input.size(), destination ? ::std::optional(destination->size()) : ::std::nullopt, where);
    const auto plan = runner.plan(input, destination, where);

    ::std::size_t slot = 0;
    ::std::uint64_t id = 0;
    bool my_turn = false;
    bool wake_waiter = false;
    {
      ::std::unique_lock lock(mutex);
      if (free_slots.empty()) {
        if (!block) {
          ++stats.refused;
          return ::std::nullopt;
        }
        ++stats.slot_waits;
        wait_for_slot(lock);
      } else if (refill.waiters() != 0) {
        // A waiter may be holding out for a batch of slots: this producer
        // takes one of them, so the waiter takes the next free one instead.
        refill.wake_at_first_free();
        wake_waiter = free_slots.size() > 1;  // one is left after this pop
      }
      slot = free_slots.pop();
      id = next_id++;
      ++pending;
      ++stats.submitted;
      callbacks_in_flight += delivery.index() == 2 ? 1 : 0;
      records[slot].emplace(InFlight{id, ::std::move(delivery), nullptr, false});
      order.push(slot);
      my_turn = next_issue == id;  // stays true: later ids wait for this one
    }
    if (wake_waiter) {
      slot_freed.notify_one();
    }
    // From here on the item is accepted: whatever fails is its own error.
    ::std::exception_ptr error;
    try {
      runner.prepare(slot, id, input, plan, where);
    } catch (...) {
      error = ::std::current_exception();
    }
    if (!my_turn) {
      wait_for_turn(id);
    }
    if (error == nullptr) {
      issuing.store(::std::this_thread::get_id(), ::std::memory_order_relaxed);
      try {
        runner.start(slot, id, input, destination, plan, where);
      } catch (...) {
        error = ::std::current_exception();  // belongs to this item alone
      }
      issuing.store(::std::thread::id(), ::std::memory_order_relaxed);
    }
    mark_issued(::std::span(&slot, 1), ::std::span(&error, 1));
    return id;
  }

  // enqueue() that hands `delivery` back (discard) when the item is refused:
  // empty (not blocking, every slot busy) or a usage_error.
  ::std::optional<::std::uint64_t> enqueue_or_discard(HostRange<const In> input,
                                                      ::std::optional<HostRange<Out>> destination,
                                                      Delivery& delivery, bool block,
                                                      const ::std::source_location& where) {
    ::std::optional<::std::uint64_t> id;
    try {
      id = enqueue(input, destination, delivery, block, where);
    } catch (...) {
      discard(delivery);
      throw;
    }
    if (!id) {
      discard(delivery);
    }
    return id;
  }

  // Refuses a submission (`what`: the call) from the completion thread, or
  // from inside the compute stage of an item being started.
  void refuse_reentry(const char* what, const ::std::source_location& where) const {
    require_not_completion_thread(what, where);
    if (issuing.load(::std::memory_order_relaxed) == ::std::this_thread::get_id()) {
      throw usage_error(detail::concat("StreamPipeline::", what,
                                       " called from inside the compute stage; the stage only issues work for "
                                       "the item it was given"),
                        where);
    }
  }
  // Waits until the items before `id` are started (ids start in order).
  void wait_for_turn(::std::uint64_t id) {
    ::std::unique_lock lock(mutex);
    ++turn_waiters;
    turn.wait(lock, [&] { return next_issue == id; });
    --turn_waiters;
  }
  // The items in `slots`, the next in id order, were started (with their
  // errors, if any): the completion thread may deliver them, and the next
  // ids may start.
  void mark_issued(::std::span<const ::std::size_t> slots, ::std::span<const ::std::exception_ptr> errors) {
    bool wake_producers = false;
    {
      ::std::lock_guard lock(mutex);
      for (::std::size_t k = 0; k < slots.size(); ++k) {
        records[slots[k]]->error = errors[k];
        records[slots[k]]->issued = true;
      }
      next_issue += slots.size();
      issued_count.store(next_issue, ::std::memory_order_release);
      wake_producers = turn_waiters != 0;
    }
    work_ready.notify_one();  // no system call unless the completion thread went to sleep
    if (wake_producers) {
      turn.notify_all();
    }
  }

  // ---- groups: several items with one launch (GroupedPipelineStageRunner) --

  static constexpr ::std::size_t max_group = 64;
  struct GroupInput {
    HostRange<const In> input;
    ::std::optional<HostRange<Out>> destination;
  };
  struct GroupAccepted {
    ::std::uint64_t first_id = 0;
    ::std::size_t count = 0;  // items[0, count) were accepted (their deliveries moved from)
  };

  // Takes slots for `items` at once (waiting until that many are free),
  // gives them consecutive ids, prepares each, and issues them with one
  // start_group() when the runner says the slots form a group (else start()
  // per item). Fewer are taken, and the rest left to the caller, when a group
  // beginning at the next free slot holds fewer (runner.launch_room()), and
  // when a callback item is in flight (its callback is user code, which may
  // wait for this producer, so waiting for more than one free slot could
  // deadlock). Every item is checked before any is accepted: a usage_error
  // accepts none. At most max_group items and at most the slot count.
  GroupAccepted enqueue_group(::std::span<const GroupInput> items, ::std::span<Delivery> deliveries,
                              const ::std::source_location& where)
    requires GroupedPipelineStageRunner<Runner>;
  // The completion thread freed a slot: whether a group waiter must be woken. Under the lock.
  bool should_wake_group() const noexcept {
    return group_waiters != 0 && (free_slots.size() >= group_need || callbacks_in_flight != 0);
  }

  // Sleeps until a slot is free; a lone producer may wait for a batch of them
  // (stream_pipeline/detail/slot_refill.hpp says why and when).
  void wait_for_slot(::std::unique_lock<::std::mutex>& lock) {
    refill.begin_wait(runner.slot_count(), callbacks_in_flight == 0);
    slot_freed.wait(lock, [&] { return refill.refilled(free_slots.size()); });
    refill.end_wait();
  }
  // The completion thread will sleep (no issued item): a batched wait would
  // then wait on producers, so it takes the first free slot instead. Under the lock.
  void end_batch_before_sleeping() {
    if (refill.batching()) {
      refill.wake_at_first_free();
      if (!free_slots.empty()) {
        slot_freed.notify_one();
      }
    }
  }

  // What a slot can take (stream_pipeline/detail/item_check.hpp).
  void check_item(::std::size_t n, const ::std::optional<::std::size_t>& destination_size,
                  const ::std::source_location& where) const {
    check_pipeline_item(runner, n, destination_size, where);
  }

  // The completion thread (in stream_pipeline/detail/delivery.hpp): delivers the
  // in-flight FIFO's head once it is issued; returns when stopping with
  // nothing left in flight.
  void completion_loop() noexcept;
  // Before it sleeps on work_ready, the completion thread watches for the
  // next item for a short while: a steady stream of small items then never
  // finds it asleep, and submit() never pays for waking it (a futex system
  // call and a context switch per item). `delivered` is written by this
  // thread only, so it reads it without the lock.
  void await_next_issue() const noexcept;
  static void cpu_relax() noexcept;
  void deliver(::std::size_t slot, InFlight& item) noexcept;

  void wait_idle() {
    ::std::unique_lock lock(mutex);
    progress.wait(lock, [&] { return pending == 0; });
  }
  // Items are delivered in id order, so "delivered > id" means id is done.
  void wait_delivered(::std::uint64_t id) {
    ::std::unique_lock lock(mutex);
    progress.wait(lock, [&] { return delivered > id; });
  }
  // Rethrows (once) the first exception that escaped a callback whose
  // errors go to `errors`.
  void rethrow_callback_error(CallbackErrors& errors) {
    ::std::exception_ptr error;
    {
      ::std::lock_guard lock(mutex);
      error = ::std::exchange(errors.first, nullptr);
    }
    if (error != nullptr) {
      ::std::rethrow_exception(error);
    }
  }
  // A producer lets go of `errors`: an error it has not reported, and any its
  // items in flight still raise, go to the pipeline's own.
  void close_callback_errors(CallbackErrors& errors) noexcept {
    ::std::lock_guard lock(mutex);
    errors.closed = true;
    if (own_callback_errors->first == nullptr) {
      own_callback_errors->first = ::std::exchange(errors.first, nullptr);
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
  // Shared with the tickets, which may outlive the pipeline.
  ::std::shared_ptr<VectorPool> vectors = ::std::make_shared<VectorPool>();
  ::std::shared_ptr<CountPool> counts = ::std::make_shared<CountPool>();
  // Errors of callbacks given to the pipeline itself (and those producers left).
  ::std::shared_ptr<CallbackErrors> own_callback_errors = ::std::make_shared<CallbackErrors>();
  // False once the pipeline is destroyed (its producers then refuse use).
  ::std::shared_ptr<::std::atomic<bool>> alive = ::std::make_shared<::std::atomic<bool>>(true);

  // How long the completion thread watches for the next item before it sleeps.
  static constexpr ::std::chrono::microseconds completion_watch{50};

  ::std::atomic<::std::thread::id> issuing{};  // the producer inside runner.start(), if any
  ::std::atomic<::std::uint64_t> issued_count{0};  // next_issue, readable without the lock
  mutable ::std::mutex mutex;                  // guards everything below
  ::std::condition_variable slot_freed;
  ::std::condition_variable group_freed;  // producers waiting for a group's slots (enqueue_group)
  ::std::condition_variable turn;  // producers waiting to start their item in id order
  ::std::condition_variable work_ready;
  ::std::condition_variable progress;
  SlotRing free_slots;
  SlotRefill refill;  // when a free slot wakes a waiting producer
  ::std::size_t callbacks_in_flight = 0;  // accepted callback items not yet delivered
  ::std::size_t group_waiters = 0;        // producers waiting in enqueue_group
  ::std::size_t group_need = 0;           // the fewest free slots one of them waits for
  SlotRing order;                                    // slots in flight, in submission order
  ::std::vector<::std::optional<InFlight>> records;  // per slot
  ::std::uint64_t next_id = 0;
  ::std::uint64_t next_issue = 0;  // the id whose start() is next
  ::std::size_t turn_waiters = 0;
  ::std::uint64_t delivered = 0;
  ::std::size_t pending = 0;
  bool stopping = false;
  bool orphaned = false;  // destroyed from a callback: the completion thread frees the state
  PipelineStats stats;

  ::std::thread completion;  // last: started once everything above exists
};

}  // namespace replay::detail

// The out-of-line parts: the completion thread, and run()'s batches.
#include "replay/stream_pipeline/detail/delivery.hpp"
#include "replay/stream_pipeline/detail/batches.hpp"
