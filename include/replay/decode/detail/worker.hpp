#pragma once
#include <replay/detail/require_cxx20.hpp>
// The DecodeScheduler's worker loop; included by decode/detail/core.hpp. The
// prefill and the launches (3 and 4 below) are in decode/detail/launches.hpp.
// Each iteration, at a step boundary:
//   1. running sequences whose cancel() came end, freeing their slots;
//   2. under the lock: cancelled waiting requests leave the queue, and
//      waiting requests are admitted into free slots (plan_admission());
//      with nothing to do the worker sleeps here;
//   3. the admitted prompts are prefilled (one executor call) and get their
//      first token;
//   4. one decode launch runs for every running sequence, in the smallest
//      batch and context buckets that hold it (plan_launch());
//   5. each sequence gets its new tokens; those that ended (an EOS token,
//      max_new_tokens, max_len) get their final update and free their slot.
// With chunked prefill (DecodePrefill::with_decode) the admitted sequences
// are prefilled in chunks instead (plan_prefill_chunks()); while any is, 3 and 4 are
// one mixed launch (prefill_and_decode()) with one step for the running ones,
// and a sequence whose last chunk ran gets its first token from it.
// Callbacks run on this thread, outside the lock.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/decode/batch.hpp"
#include "replay/decode/options.hpp"
#include "replay/decode/policy.hpp"
#include "replay/decode/stats.hpp"
#include "replay/decode/status.hpp"
#include "replay/decode/detail/core.hpp"
#include "replay/detail/message.hpp"

namespace replay::detail {

template <DecodeExecutor Executor>
void DecodeCore<Executor>::run() noexcept {
  try {
    serve();
  } catch (...) {
    // Not the executor's failure (that fails its sequences and the loop goes
    // on) but the scheduler's own, e.g. out of memory: end everything.
    try {
      abandon(concat("the decode scheduler's worker failed (", describe_current_exception(),
                     "); it ended every request and stopped"));
    } catch (...) {
      abandon("the decode scheduler's worker failed; it ended every request and stopped");
    }
  }
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::serve() {
  for (;;) {
    end_cancelled_running();
    const Gathered gathered = gather();
    if (gathered == Gathered::cancel_all) {
      end_waiting(cancelled_waiting_, DecodeStatus::shut_down,
                  "the decode scheduler shut down (cancel) before this request ran; it got no token");
      end_running(DecodeStatus::shut_down,
                  "the decode scheduler shut down (cancel) before this request ended; it has the tokens so far");
      return;
    }
    end_waiting(cancelled_waiting_, DecodeStatus::cancelled, "cancelled while waiting for a slot; it got no token");
    if (gathered == Gathered::drained) {
      return;
    }
    // After a cancelling shutdown (possibly the scheduler destroyed from an
    // update callback of this iteration) the executor is not called again.
    if (cancel_all_.load(::std::memory_order_relaxed)) {
      admitted_slots_.clear();
      continue;
    }
    if (options_.prefill == DecodePrefill::with_decode) {
      if (!prefilling_.empty()) {
        mixed_launch();
      } else if (slots_.size() != 0) {
        launch();
      }
      continue;
    }
    prefill();
    if (slots_.size() != 0 && !cancel_all_.load(::std::memory_order_relaxed)) {
      launch();
    }
  }
}

template <DecodeExecutor Executor>
auto DecodeCore<Executor>::gather() -> Gathered {
  ::std::unique_lock lock(wakeup_->mutex);
  for (;;) {
    if (cancel_all_.load(::std::memory_order_relaxed)) {
      cancelled_waiting_.insert(cancelled_waiting_.end(), ::std::make_move_iterator(queue_.begin()),
                                ::std::make_move_iterator(queue_.end()));
      queue_.clear();
      stats_.queue_depth = 0;
      return Gathered::cancel_all;
    }
    if (wakeup_->cancel_epoch != seen_cancel_epoch_) {
      seen_cancel_epoch_ = wakeup_->cancel_epoch;
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->control->cancel_requested.load(::std::memory_order_acquire)) {
          cancelled_waiting_.push_back(::std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
    }
    admit(clock::now());
    stats_.queue_depth = queue_.size();
    stats_.active = slots_.size();
    // With sequences running the worker never sleeps: it steps them and
    // decides again at the next boundary (requests held back for
    // min_admission are reconsidered there, admission_delay included).
    if (!admitted_slots_.empty() || slots_.size() != 0 || !cancelled_waiting_.empty()) {
      return Gathered::work;
    }
    auto changed = [&] { return stopping_ || wakeup_->cancel_epoch != seen_cancel_epoch_; };
    if (queue_.empty()) {
      if (stopping_) {
        return Gathered::drained;
      }
      wakeup_->work.wait(lock, [&] { return changed() || !queue_.empty(); });
    } else {
      // Static batches (continuous batching admits at once when nothing
      // runs): wait for a full batch or for the oldest request's delay.
      wakeup_->work.wait_until(lock, queue_.front().submitted + options_.static_batch_delay,
                               [&] { return changed() || queue_.size() >= options_.max_slots; });
    }
  }
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::admit(clock::time_point now) {
  waiting_prompts_.clear();
  const ::std::size_t visible = ::std::min(slots_.free(), queue_.size());
  for (::std::size_t i = 0; i < visible; ++i) {
    waiting_prompts_.push_back(queue_[i].prompt.size());
  }
  // How long the oldest may wait for a static batch to fill, or (continuous)
  // for min_admission requests to join the running ones together.
  const ::std::chrono::microseconds delay = options_.batching == DecodeBatching::static_batches
                                                ? options_.static_batch_delay
                                                : options_.admission_delay;
  const bool oldest_due =
      stopping_ ||
      (!queue_.empty() && admission_due(options_.batching, now, queue_.front().submitted, last_admission_, delay));
  // Chunked prefill spends max_prefill_tokens per launch (plan_prefill_chunks()),
  // not per admission.
  const DecodeAdmissionLimits limits{
      options_.batching, options_.max_slots,
      options_.prefill == DecodePrefill::with_decode ? ::std::size_t{0} : options_.max_prefill_tokens,
      options_.min_admission};
  const ::std::size_t take = plan_admission(waiting_prompts_, slots_.free(), slots_.size(), oldest_due, limits);
  if (take > 0) {
    last_admission_ = now;
  }
  for (::std::size_t i = 0; i < take; ++i) {
    DecodeSequence& sequence = queue_.front();
    sequence.queue_delay = ::std::chrono::duration_cast<::std::chrono::microseconds>(now - sequence.submitted);
    const double us =
        static_cast<double>(::std::chrono::duration_cast<::std::chrono::nanoseconds>(now - sequence.submitted).count()) /
        1000.0;
    const auto& bounds = DecodeStats::queue_delay_bounds_us;
    ++stats_.queue_delay_histogram[static_cast<::std::size_t>(::std::lower_bound(bounds.begin(), bounds.end(), us) -
                                                              bounds.begin())];
    stats_.queue_delay_sum_us += us;
    stats_.queue_delay_max_us = ::std::max(stats_.queue_delay_max_us, us);
    delays_.record(us);
    ++stats_.admitted;
    const ::std::size_t slot = slots_.place(::std::move(sequence));
    (options_.prefill == DecodePrefill::with_decode ? prefilling_ : admitted_slots_).push_back(slot);
    queue_.pop_front();
  }
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::end_cancelled_running() {
  for (::std::size_t slot = 0; slot < slots_.capacity(); ++slot) {
    if (slots_.occupied(slot) && slots_[slot].control->cancel_requested.load(::std::memory_order_acquire)) {
      end_slot(slot, DecodeStatus::cancelled, concat("cancelled after ", slots_[slot].tokens.size(), " tokens"));
    }
  }
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::end_waiting(::std::vector<DecodeSequence>& ended, DecodeStatus status,
                                       ::std::string_view message) noexcept {
  if (ended.empty()) {
    return;
  }
  {
    ::std::lock_guard lock(wakeup_->mutex);
    for (::std::size_t i = 0; i < ended.size(); ++i) {
      count_end(status, true);
    }
  }
  for (DecodeSequence& sequence : ended) {
    deliver_final(sequence, status, message);
  }
  ended.clear();
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::end_running(DecodeStatus status, ::std::string_view message) noexcept {
  for (::std::size_t slot = 0; slot < slots_.capacity(); ++slot) {
    if (slots_.occupied(slot)) {
      end_slot(slot, status, message);
    }
  }
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::end_slot(::std::size_t slot, DecodeStatus status, ::std::string_view message) noexcept {
  DecodeSequence sequence = slots_.take(slot);
  if (const auto it = ::std::find(prefilling_.begin(), prefilling_.end(), slot); it != prefilling_.end()) {
    prefilling_.erase(it);
  }
  {
    ::std::lock_guard lock(wakeup_->mutex);
    count_end(status, true);
    stats_.active = slots_.size();
  }
  deliver_final(sequence, status, message);
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::settle(::std::size_t slot, bool hit_eos) {
  DecodeSequence& sequence = slots_[slot];
  if (hit_eos) {
    end_slot(slot, DecodeStatus::eos, {});
    return;
  }
  if (sequence.max_new_tokens != 0 && sequence.tokens.size() >= sequence.max_new_tokens) {
    end_slot(slot, DecodeStatus::token_limit, {});
    return;
  }
  if (sequence.prompt.size() + sequence.tokens.size() >= options_.max_len) {
    end_slot(slot, DecodeStatus::context_limit,
             concat("prompt and tokens reached max_len (", options_.max_len, " positions) after ",
                    sequence.tokens.size(), " tokens; the sequence was cut there"));
    return;
  }
  const DecodeUpdate update{sequence.control->id,
                            ::std::span<const TokenId>(sequence.tokens).subspan(sequence.delivered),
                            DecodeStatus::running, {}, sequence.queue_delay};
  sequence.delivered = sequence.tokens.size();
  try {
    sequence.on_update(update);
  } catch (...) {
    end_slot(slot, DecodeStatus::cancelled,
             concat("the update callback threw (", describe_current_exception(), "); the request was cancelled"));
  }
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::abandon(::std::string_view message) noexcept {
  try {
    {
      ::std::lock_guard lock(wakeup_->mutex);
      stopping_ = true;
      cancel_all_.store(true, ::std::memory_order_relaxed);
      cancelled_waiting_.insert(cancelled_waiting_.end(), ::std::make_move_iterator(queue_.begin()),
                                ::std::make_move_iterator(queue_.end()));
      queue_.clear();
      stats_.queue_depth = 0;
    }
    end_waiting(cancelled_waiting_, DecodeStatus::failed, message);
    end_running(DecodeStatus::failed, message);
  } catch (...) {
    // Out of memory even for this: nothing more can be done.
  }
}

}  // namespace replay::detail
