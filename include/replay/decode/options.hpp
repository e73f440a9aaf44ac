#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeOptions: the cache's shape, the buckets a launch is padded to, and
// how a DecodeScheduler admits requests.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "replay/decode/batch.hpp"

namespace replay {

// When waiting requests are admitted into free slots.
enum class DecodeBatching : ::std::uint8_t {
  // Every iteration, as slots free up: a sequence joins the running batch as
  // soon as one ends (continuous, or in-flight, batching), or once
  // min_admission can join together (or admission_delay after the last
  // admission).
  continuous,
  // Only when no sequence is running: a batch starts when max_slots requests
  // wait or the oldest has waited static_batch_delay, and runs until every
  // sequence in it ended (the classic way, kept for comparison).
  static_batches,
};

// How admitted prompts reach the cache.
enum class DecodePrefill : ::std::uint8_t {
  // One prefill() call per iteration for the prompts admitted at its step
  // boundary, before the decode launch: the running sequences wait for it.
  separate,
  // Chunked prefill: while prompts are being prefilled, each launch is one
  // prefill_and_decode() call (MixedDecodeExecutor) that carries up to
  // max_prefill_tokens of their tokens (a long prompt over several
  // launches, oldest prompts first) and one decode step of every running
  // sequence, so no running sequence waits for a whole prompt. Launches
  // without prompts are decode() calls as before (K steps).
  with_decode,
};

// What shutdown() does with the requests it did not finish.
enum class DecodeShutdown : ::std::uint8_t {
  drain,   // serve every accepted request to its end, then stop
  cancel,  // end every waiting and running request with DecodeStatus::shut_down at the next step boundary
};

// A DecodeScheduler's cache shape, launch buckets and admission policy.
struct DecodeOptions {
  // Cache slots, i.e. sequences decoded at once. 0: the largest batch bucket.
  ::std::size_t max_slots = 0;
  // Positions per cache slot: a sequence's prompt and tokens together never
  // exceed it. At least 2. 0: the largest context bucket.
  ::std::size_t max_len = 0;
  // The batch sizes a launch is padded to, strictly ascending and positive;
  // the largest at least max_slots. Empty: {max_slots}.
  ::std::vector<::std::int64_t> batch_buckets{};
  // The context lengths a launch reads up to, strictly ascending and
  // positive; the largest at least max_len. Empty: {max_len}.
  ::std::vector<::std::int64_t> context_buckets{};
  // Decode steps one executor call may run (K steps per launch), at least 1.
  ::std::size_t steps_per_launch = 1;
  // Tokens that end a sequence (it keeps them as its last token). Empty:
  // sequences end at max_new_tokens or max_len only.
  ::std::vector<TokenId> eos_tokens{};
  // The model's vocabulary size: a prompt token outside 0..vocab_size-1 is
  // refused (invalid_request) on the submitting thread, before it could index
  // out of bounds on the device. 0: tokens are not checked.
  ::std::size_t vocab_size = 0;
  // Most requests waiting for a slot; at capacity submit() refuses with
  // DecodeStatus::queue_full. At least 1.
  ::std::size_t queue_capacity = 1024;
  // Most prompt tokens prefilled in one iteration (so long prompts do not
  // stall the running sequences for long); 0: no limit.
  //   - DecodePrefill::separate: admission stops where the admitted prompts
  //     would exceed it; a request is admitted whatever its length when it
  //     is the first of its iteration;
  //   - DecodePrefill::with_decode: the prompt tokens of one mixed launch
  //     (its chunk budget): a longer prompt is cut into chunks over several
  //     launches. The executor's forward then holds up to max_slots decode
  //     rows and this many prompt tokens. 0: whole prompts.
  ::std::size_t max_prefill_tokens = 0;
  // continuous only: while sequences run, waiting requests are admitted only
  // once this many can join together (free slots and waiting requests both),
  // or once admission_delay has passed since the last admission (and since
  // the oldest waiting request arrived). With DecodePrefill::separate each
  // admission is one prefill call that pauses every running sequence, so
  // grouping admissions trades some time to first token for fewer pauses
  // (chunked prefill pauses nothing: leave it at 1 there). With no sequence
  // running, waiting requests are admitted at once. 1: at every step boundary.
  // At least 1, at most max_slots.
  ::std::size_t min_admission = 1;
  // continuous only: while requests wait and sequences run, the longest the
  // scheduler goes without an admission (counted from the last admission, or
  // from the oldest request's arrival if later) before it admits however few
  // fit. Counted from the last admission, not from the oldest's arrival: under
  // load the oldest has always waited long, and grouping would stop. Not negative.
  ::std::chrono::microseconds admission_delay{5000};
  DecodeBatching batching = DecodeBatching::continuous;
  // separate prefill() calls, or chunked prefill (with_decode: needs a
  // MixedDecodeExecutor).
  DecodePrefill prefill = DecodePrefill::separate;
  // static_batches only: how long the oldest waiting request waits for a
  // batch to fill before it starts with fewer than max_slots.
  ::std::chrono::microseconds static_batch_delay{1000};
};

}  // namespace replay
