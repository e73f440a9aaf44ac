#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeScheduler: continuous batching of autoregressive decoding in front
// of an executor that owns the model and a KV cache of max_slots slots.
//
//   replay::DecodeScheduler scheduler(MyExecutor(model),
//                                     {.batch_buckets = {1, 2, 4, 8, 16, 32},
//                                      .context_buckets = {256, 512, 1024, 2048},
//                                      .eos_tokens = {2}});
//   replay::DecodeStream stream = scheduler.submit({.prompt = prompt, .max_new_tokens = 128});  // any thread
//   for (replay::TokenId token : stream) send(token);                 // as they are produced
//   if (replay::DecodeResult result = stream.wait(); !result) report(result.status, result.message);
//
// Many threads submit requests; one worker thread owned by the scheduler
// runs a loop of step boundaries: admit waiting requests into free slots
// (one prefill call, or chunks of the prompts carried by the next launches:
// DecodePrefill::with_decode), run one decode launch over every running sequence in
// the smallest batch bucket x context bucket that holds it, hand each
// request its new tokens, and retire the sequences that ended (an EOS token,
// max_new_tokens, or max_len), freeing their slots for the next boundary.
// Every accepted request ends exactly once: finished, cancelled, failed or
// shut down, with exactly the tokens produced for it. See docs/llm_decode.md.
#include <functional>
#include <memory>
#include <mutex>
#include <source_location>
#include <thread>
#include <utility>

#include "replay/decode/executor.hpp"
#include "replay/decode/handle.hpp"
#include "replay/decode/options.hpp"
#include "replay/decode/request.hpp"
#include "replay/decode/stats.hpp"
#include "replay/decode/status.hpp"
#include "replay/decode/detail/core.hpp"
#include "replay/decode/detail/options_check.hpp"
#include "replay/decode/detail/stream_state.hpp"
#include "replay/error.hpp"

namespace replay {

// `Executor` may be a reference type (DecodeScheduler<MyExecutor&>) to
// borrow an executor that must outlive the scheduler.
template <DecodeExecutor Executor>
class DecodeScheduler {
  using Core = detail::DecodeCore<Executor>;

 public:
  using executor_type = Executor;
  // Called on the worker thread for every update of a request, in order;
  // the last has done() true. It should be quick (it holds up the next
  // step). Throwing from a running update cancels the request (its final
  // update says so); what a final update's callback throws is dropped. It
  // may call submit(), cancel(), stats() and shutdown(), and may destroy
  // the scheduler.
  using update_callback = ::std::function<void(const DecodeUpdate&)>;

  // Checks `options` (usage_error naming what is wrong) and starts the worker.
  explicit DecodeScheduler(Executor executor, DecodeOptions options,
                           ::std::source_location where = ::std::source_location::current())
      : core_(::std::make_shared<Core>(::std::forward<Executor>(executor), checked(::std::move(options), where))) {
    worker_ = ::std::thread([core = core_] { core->run(); });
  }

  DecodeScheduler(const DecodeScheduler&) = delete;
  DecodeScheduler& operator=(const DecodeScheduler&) = delete;
  DecodeScheduler(DecodeScheduler&&) = delete;  // hold it in a unique_ptr to move it
  DecodeScheduler& operator=(DecodeScheduler&&) = delete;

  // Cancels: every request not yet ended ends with DecodeStatus::shut_down
  // and the tokens it had, at the next step boundary (the launch in flight
  // finishes first); then the worker is joined. Call shutdown(drain) first
  // to finish them instead. Destroyed from one of its own update callbacks,
  // the scheduler cannot join the thread it runs on: the worker ends the
  // requests itself after that callback returns, calls the executor no more,
  // and destroys the core (and an owned executor) as it exits.
  ~DecodeScheduler() {
    core_->request_stop(DecodeShutdown::cancel);
    ::std::lock_guard join_lock(join_mutex_);
    if (worker_.joinable()) {
      if (worker_.get_id() == ::std::this_thread::get_id()) {
        worker_.detach();
      } else {
        worker_.join();
      }
    }
  }

  // ---- submission ------------------------------------------------------------

  // Queues `request`; from any thread, never waits. `on_update` receives its
  // tokens as they are produced and exactly one final update. A refused
  // request (invalid_request, prompt_too_long, queue_full, shut_down) gets
  // its final update on this thread before submit() returns.
  DecodeHandle submit(DecodeRequest request, update_callback on_update,
                      ::std::source_location where = ::std::source_location::current()) {
    if (!on_update) {
      throw usage_error("DecodeScheduler::submit(): the update callback is empty; give a callable (or use the "
                        "DecodeStream overload)",
                        where);
    }
    return core_->submit(::std::move(request), ::std::move(on_update));
  }
  // As above, the updates gathered in a DecodeStream to iterate or wait on.
  [[nodiscard]] DecodeStream submit(DecodeRequest request) {
    auto state = ::std::make_shared<detail::DecodeStreamState>();
    DecodeHandle handle =
        core_->submit(::std::move(request), [state](const DecodeUpdate& update) { state->deliver(update); });
    return DecodeStream(::std::move(handle), ::std::move(state));
  }

  // ---- lifetime --------------------------------------------------------------

  // Stops accepting (later submissions end with DecodeStatus::shut_down),
  // deals with the accepted requests as `mode` says, and joins the worker.
  // Idempotent; a drain can be turned into a cancel by a later call. From an
  // update callback it returns at once (the worker cannot join itself) and
  // the worker stops as `mode` says after that callback.
  void shutdown(DecodeShutdown mode) noexcept {
    core_->request_stop(mode);
    ::std::lock_guard join_lock(join_mutex_);
    if (worker_.joinable() && worker_.get_id() != ::std::this_thread::get_id()) {
      worker_.join();
    }
  }

  // False once shutdown began.
  bool accepting() const { return core_->accepting(); }

  // ---- introspection ---------------------------------------------------------

  // A snapshot of the counters; any thread.
  DecodeStats stats() const { return core_->stats(); }
  // Zeroes the counters (queue_depth and active stay: they are states, not counts).
  void reset_stats() { core_->reset_stats(); }
  // The options in force (max_slots, max_len and the bucket lists filled in).
  const DecodeOptions& options() const noexcept { return core_->options(); }

 private:
  static DecodeOptions checked(DecodeOptions options, const ::std::source_location& where) {
    if (options.prefill == DecodePrefill::with_decode && !MixedDecodeExecutor<Executor>) {
      throw usage_error("DecodeScheduler: prefill = DecodePrefill::with_decode (chunked prefill) needs an executor "
                        "with prefill_and_decode(MixedBatch&) (a MixedDecodeExecutor); this one has only prefill() "
                        "and decode(): use DecodePrefill::separate",
                        where);
    }
    return detail::checked_decode_options(::std::move(options), where);
  }

  ::std::shared_ptr<Core> core_;
  ::std::mutex join_mutex_;
  ::std::thread worker_;
};

template <class Executor>
DecodeScheduler(Executor, DecodeOptions) -> DecodeScheduler<Executor>;

}  // namespace replay
