#pragma once
#include <replay/detail/require_cxx20.hpp>
// The DecodeScheduler's decisions as pure functions, so that they are tested
// without threads, clocks or a model: which waiting requests to admit, how
// many tokens a sequence may still produce, and which bucket a launch takes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "replay/decode/batch.hpp"
#include "replay/decode/options.hpp"

namespace replay {

// The smallest of `buckets` (strictly ascending) that holds `need`; 0 when
// none does.
constexpr ::std::int64_t smallest_bucket(::std::span<const ::std::int64_t> buckets, ::std::size_t need) noexcept {
  for (const ::std::int64_t bucket : buckets) {
    if (bucket > 0 && static_cast<::std::size_t>(bucket) >= need) {
      return bucket;
    }
  }
  return 0;
}

// How many more tokens a sequence of `prompt` tokens that has produced
// `generated` may produce: up to max_new_tokens (0: no limit) while prompt
// and tokens stay within max_len.
constexpr ::std::size_t tokens_left(::std::size_t prompt, ::std::size_t generated, ::std::size_t max_new_tokens,
                                    ::std::size_t max_len) noexcept {
  const ::std::size_t length = prompt + generated;
  ::std::size_t left = length < max_len ? max_len - length : 0;
  if (max_new_tokens != 0) {
    left = ::std::min(left, max_new_tokens > generated ? max_new_tokens - generated : 0);
  }
  return left;
}

// The padded shape of one decode launch.
struct DecodeLaunchShape {
  ::std::int64_t batch_bucket = 0;    // the smallest batch bucket >= the number of rows; 0: none fits
  ::std::int64_t context_bucket = 0;  // the smallest context bucket >= every row's position + max_tokens; 0: none fits
  ::std::size_t max_steps = 0;        // the most tokens any row may produce
};

// The launch shape of `rows` (position and max_tokens set).
constexpr DecodeLaunchShape plan_launch(::std::span<const DecodeRow> rows,
                                        ::std::span<const ::std::int64_t> batch_buckets,
                                        ::std::span<const ::std::int64_t> context_buckets) noexcept {
  ::std::size_t context = 0;
  ::std::size_t steps = 0;
  for (const DecodeRow& row : rows) {
    context = ::std::max(context, row.position + row.max_tokens);
    steps = ::std::max(steps, row.max_tokens);
  }
  return {smallest_bucket(batch_buckets, rows.size()), smallest_bucket(context_buckets, context), steps};
}

// What plan_admission() decides with.
struct DecodeAdmissionLimits {
  DecodeBatching batching = DecodeBatching::continuous;
  ::std::size_t max_slots = 1;
  ::std::size_t max_prefill_tokens = 0;  // continuous only; 0: no limit
  // Continuous only: the fewest requests admitted together while sequences
  // run (unless the oldest is due).
  ::std::size_t min_admission = 1;
};

// Whether the waiting requests are due for admission however few fit.
// Static batches: the oldest has waited `delay` (static_batch_delay).
// Continuous batching: `delay` (admission_delay) has passed both since the
// oldest arrived and since the last admission: under load the queue's
// oldest request has always waited long, and counting from its arrival
// alone would admit at every step, the pauses grouping is meant to save.
template <class TimePoint, class Duration>
constexpr bool admission_due(DecodeBatching batching, TimePoint now, TimePoint oldest_submitted,
                             TimePoint last_admission, Duration delay) noexcept {
  const TimePoint since =
      batching == DecodeBatching::continuous ? ::std::max(oldest_submitted, last_admission) : oldest_submitted;
  return now - since >= delay;
}

// How many of the waiting requests (their prompt lengths, oldest first) to
// admit now, oldest first. `oldest_due`: admission_due() (the policy's delay
// has passed), or the scheduler drains.
//   - continuous: none while sequences run, fewer than min_admission fit
//     (free slots and waiting requests both) and the oldest is not due: each
//     admission is a prefill that pauses the running sequences, so they are
//     grouped. Otherwise as many as fit, cut where the prompts would exceed
//     max_prefill_tokens (but at least one);
//   - static_batches: none while a sequence runs; otherwise a whole batch
//     (up to max_slots) once max_slots wait or `oldest_due`, else none.
constexpr ::std::size_t plan_admission(::std::span<const ::std::size_t> waiting_prompts, ::std::size_t free_slots,
                                       ::std::size_t active, bool oldest_due,
                                       const DecodeAdmissionLimits& limits) noexcept {
  const ::std::size_t fit = ::std::min(free_slots, waiting_prompts.size());
  if (fit == 0) {
    return 0;
  }
  if (limits.batching == DecodeBatching::static_batches) {
    if (active != 0 || (waiting_prompts.size() < limits.max_slots && !oldest_due)) {
      return 0;
    }
    return fit;
  }
  if (active != 0 && fit < limits.min_admission && !oldest_due) {
    return 0;
  }
  if (limits.max_prefill_tokens == 0) {
    return fit;
  }
  ::std::size_t take = 1;
  ::std::size_t tokens = waiting_prompts[0];
  while (take < fit && tokens + waiting_prompts[take] <= limits.max_prefill_tokens) {
    tokens += waiting_prompts[take];
    ++take;
  }
  return take;
}

// Chunked prefill (DecodePrefill::with_decode): how many prompt tokens each
// prefilling sequence gets in the next launch. `remaining`: the tokens each
// still has to prefill, oldest admission first; `budget`: the launch's
// prompt tokens (max_prefill_tokens; 0: no limit). Oldest first, each as
// many as fit, so a prompt's chunks come in order and the oldest prompt is
// done soonest. Writes take[i] for every i (0: none this launch) and returns
// the number of sequences that got tokens.
constexpr ::std::size_t plan_prefill_chunks(::std::span<const ::std::size_t> remaining, ::std::size_t budget,
                                    ::std::span<::std::size_t> take) noexcept {
  ::std::size_t left = budget;
  ::std::size_t rows = 0;
  for (::std::size_t i = 0; i < remaining.size() && i < take.size(); ++i) {
    take[i] = budget == 0 ? remaining[i] : ::std::min(remaining[i], left);
    left -= budget == 0 ? 0 : take[i];
    rows += take[i] != 0 ? 1 : 0;
  }
  return rows;
}

}  // namespace replay
