#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeCore: everything a DecodeScheduler shares with its worker thread
// (the executor, the queue, the slots, the stats). The scheduler and the
// worker each hold it by shared_ptr, so that a scheduler destroyed from one
// of its own update callbacks leaves the worker a live core to end its
// requests with, instead of joining itself. Its worker half (the loop) is in
// worker.hpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/decode/batch.hpp"
#include "replay/decode/executor.hpp"
#include "replay/decode/handle.hpp"
#include "replay/decode/options.hpp"
#include "replay/decode/policy.hpp"
#include "replay/decode/request.hpp"
#include "replay/decode/stats.hpp"
#include "replay/decode/status.hpp"
#include "replay/decode/detail/control.hpp"
#include "replay/decode/detail/recent_delays.hpp"
#include "replay/decode/detail/sequence.hpp"
#include "replay/decode/detail/slot_table.hpp"
#include "replay/detail/message.hpp"

namespace replay::detail {

template <DecodeExecutor Executor>
class DecodeCore {
 public:
  using clock = ::std::chrono::steady_clock;
  using update_callback = ::std::function<void(const DecodeUpdate&)>;

  // `options` are checked (checked_decode_options()).
  DecodeCore(Executor&& executor, DecodeOptions options)
      : executor_(::std::forward<Executor>(executor)),
        options_(::std::move(options)),
        wakeup_(::std::make_shared<DecodeWakeup>()),
        slots_(options_.max_slots) {
    clear_stats();
  }

  const DecodeOptions& options() const noexcept { return options_; }

  // Queues the request, or refuses it at once (on this thread) with a final
  // update. `on_update` is not empty.
  DecodeHandle submit(DecodeRequest&& request, update_callback&& on_update) {
    auto control = ::std::make_shared<DecodeControl>(next_id_.fetch_add(1, ::std::memory_order_relaxed) + 1, wakeup_);
    DecodeHandle handle(control);
    DecodeSequence sequence;
    sequence.control = ::std::move(control);
    sequence.on_update = ::std::move(on_update);
    sequence.prompt = ::std::move(request.prompt);
    sequence.max_new_tokens = request.max_new_tokens;
    sequence.submitted = clock::now();

    DecodeStatus refusal = DecodeStatus::running;
    ::std::string why;
    const auto out_of_vocabulary = ::std::find_if(sequence.prompt.begin(), sequence.prompt.end(), [&](TokenId t) {
      return options_.vocab_size != 0 && (t < 0 || static_cast<::std::size_t>(t) >= options_.vocab_size);
    });
    if (sequence.prompt.empty()) {
      refusal = DecodeStatus::invalid_request;
      why = "the prompt is empty; give at least one token";
    } else if (out_of_vocabulary != sequence.prompt.end()) {
      refusal = DecodeStatus::invalid_request;
      why = concat("prompt token ", out_of_vocabulary - sequence.prompt.begin(), " is ", *out_of_vocabulary,
                   ", outside the vocabulary (0..", options_.vocab_size - 1, ")");
    } else if (sequence.prompt.size() >= options_.max_len) {
      refusal = DecodeStatus::prompt_too_long;
      why = concat("a prompt of ", sequence.prompt.size(), " tokens leaves no room for a new token under max_len (",
                   options_.max_len, " positions); it must be shorter than max_len");
    }
    {
      ::std::lock_guard lock(wakeup_->mutex);
      if (refusal == DecodeStatus::running) {
        if (stopping_) {
          refusal = DecodeStatus::shut_down;
          why = "the decode scheduler is shutting down and accepts no requests";
        } else if (queue_.size() >= options_.queue_capacity) {
          refusal = DecodeStatus::queue_full;
          why = concat("the queue is full (", options_.queue_capacity, " requests waiting for a slot); try again later");
        } else {
          queue_.push_back(::std::move(sequence));
          ++stats_.enqueued;
          stats_.queue_depth = queue_.size();
        }
      }
      if (refusal != DecodeStatus::running) {
        count_end(refusal, false);
      }
    }
    if (refusal == DecodeStatus::running) {
      wakeup_->work.notify_all();
    } else {
      deliver_final(sequence, refusal, why);
    }
    return handle;
  }

  // Stops accepting; with `cancel`, also ends every request at the next step
  // boundary. A drain may be turned into a cancel later, not back.
  void request_stop(DecodeShutdown mode) noexcept {
    {
      ::std::lock_guard lock(wakeup_->mutex);
      stopping_ = true;
      if (mode == DecodeShutdown::cancel) {
        cancel_all_.store(true, ::std::memory_order_relaxed);
      }
    }
    wakeup_->work.notify_all();
  }

  bool accepting() const {
    ::std::lock_guard lock(wakeup_->mutex);
    return !stopping_;
  }

  DecodeStats stats() const {
    DecodeStats out;
    ::std::vector<double> recent;
    {
      ::std::lock_guard lock(wakeup_->mutex);
      out = stats_;
      recent = delays_.values();
    }
    out.queue_delay_p50_us = RecentDelays::quantile(recent, 0.50);  // outside the lock: the worker goes on
    out.queue_delay_p99_us = RecentDelays::quantile(recent, 0.99);
    return out;
  }

  void reset_stats() {
    ::std::lock_guard lock(wakeup_->mutex);
    clear_stats();
  }

  // The worker thread's body: serves until shut down; never throws.
  void run() noexcept;

 private:
  enum class Gathered : ::std::uint8_t { work, drained, cancel_all };

  // Lock held (or in the constructor).
  void clear_stats() {
    const ::std::size_t depth = stats_.queue_depth;
    const ::std::size_t active = stats_.active;
    stats_ = DecodeStats{};
    stats_.queue_depth = depth;
    stats_.active = active;
    stats_.batch_buckets = options_.batch_buckets;
    stats_.context_buckets = options_.context_buckets;
    stats_.bucket_launches.assign(options_.batch_buckets.size() * options_.context_buckets.size(), 0);
    delays_.clear();
  }

  // Counts a request that ended with `status`, after being queued or not
  // (lock held).
  void count_end(DecodeStatus status, bool was_queued) noexcept {
    switch (status) {
      case DecodeStatus::eos: ++stats_.finished_eos; break;
      case DecodeStatus::token_limit: ++stats_.finished_token_limit; break;
      case DecodeStatus::context_limit: ++stats_.finished_context_limit; break;
      case DecodeStatus::cancelled: ++stats_.cancelled; break;
      case DecodeStatus::failed: ++stats_.failed; break;
      case DecodeStatus::invalid_request: ++stats_.invalid; break;
      case DecodeStatus::prompt_too_long: ++stats_.prompt_too_long; break;
      case DecodeStatus::queue_full: ++stats_.refused; break;
      case DecodeStatus::shut_down: ++(was_queued ? stats_.shut_down : stats_.rejected_shut_down); break;
      case DecodeStatus::running: break;
    }
  }

  // The final update of `sequence`: its undelivered tokens and `status`.
  // Never throws (a final update's callback must not; what it throws is dropped).
  static void deliver_final(DecodeSequence& sequence, DecodeStatus status, ::std::string_view message) noexcept {
    sequence.control->ended.store(true, ::std::memory_order_release);
    const DecodeUpdate update{sequence.control->id, ::std::span<const TokenId>(sequence.tokens).subspan(sequence.delivered),
                              status, message, sequence.queue_delay};
    sequence.delivered = sequence.tokens.size();
    try {
      sequence.on_update(update);
    } catch (...) {
      // Nothing follows a final update; the scheduler keeps serving the others.
    }
  }

  bool is_eos(TokenId token) const noexcept {
    return ::std::find(options_.eos_tokens.begin(), options_.eos_tokens.end(), token) != options_.eos_tokens.end();
  }
  static ::std::size_t bucket_index(const ::std::vector<::std::int64_t>& buckets, ::std::int64_t bucket) noexcept {
    return static_cast<::std::size_t>(::std::lower_bound(buckets.begin(), buckets.end(), bucket) - buckets.begin());
  }

  // The worker's steps (worker.hpp).
  void serve();
  Gathered gather();
  void admit(clock::time_point now);
  void end_cancelled_running();
  void end_waiting(::std::vector<DecodeSequence>& ended, DecodeStatus status, ::std::string_view message) noexcept;
  void end_running(DecodeStatus status, ::std::string_view message) noexcept;
  void settle(::std::size_t slot, bool hit_eos);
  void end_slot(::std::size_t slot, DecodeStatus status, ::std::string_view message) noexcept;
  void abandon(::std::string_view message) noexcept;

  // The executor calls (launches.hpp).
  struct DecodeCall {  // what call_decode_rows() did
    DecodeLaunchShape shape;
    bool failed = false;
    ::std::string error;
    ::std::size_t produced = 0;  // tokens taken into the sequences
    ::std::size_t steps = 0;     // the most tokens a row reported
  };
  void prefill();
  void launch();
  void mixed_launch();
  void stage_decode_rows(::std::size_t max_steps);
  template <class Call>
  DecodeCall call_decode_rows(bool mixed, Call&& call);
  void settle_decode_rows();

  Executor executor_;
  const DecodeOptions options_;
  const ::std::shared_ptr<DecodeWakeup> wakeup_;  // its mutex guards everything up to the worker's own state
  ::std::atomic<::std::uint64_t> next_id_{0};

  ::std::deque<DecodeSequence> queue_;
  bool stopping_ = false;
  ::std::atomic<bool> cancel_all_{false};  // written under the lock, read at step boundaries without it
  DecodeStats stats_;
  RecentDelays delays_;

  // The worker's own state.
  SlotTable<DecodeSequence> slots_;
  ::std::uint64_t seen_cancel_epoch_ = 0;
  ::std::vector<::std::size_t> admitted_slots_;     // admitted this iteration, to prefill (separate)
  ::std::vector<::std::size_t> prefilling_;         // with_decode: slots still prefilling, oldest admission first
  ::std::vector<DecodeSequence> cancelled_waiting_;  // left the queue cancelled this iteration
  ::std::vector<::std::size_t> waiting_prompts_;
  clock::time_point last_admission_{};  // continuous batching's admission_delay counts from it
  ::std::vector<PrefillRow> prefill_rows_;
  ::std::vector<TokenId> first_tokens_;
  ::std::vector<::std::size_t> chunk_remaining_;
  ::std::vector<::std::size_t> chunk_take_;
  ::std::vector<DecodeRow> rows_;
  ::std::vector<TokenId> row_tokens_;
  ::std::vector<::std::size_t> counts_;
  ::std::vector<bool> row_hit_eos_;
};

}  // namespace replay::detail

// The worker half: gather, admit, retire; and its executor calls: prefill, launch.
#include "replay/decode/detail/worker.hpp"
#include "replay/decode/detail/launches.hpp"
