#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeStatus, DecodeUpdate and DecodeResult: the one channel of a decode
// request. A request gets zero or more updates with status `running`, each
// with the tokens produced since the last, and exactly one final update
// (any other status), which may carry the last tokens too. Refusals, errors
// and cancellation travel the same way as tokens (as stdexec's set_value /
// set_error / set_stopped do), so a server maps the final status to a
// response without catching exceptions.
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "replay/decode/batch.hpp"

namespace replay {

enum class DecodeStatus : ::std::uint8_t {
  running,          // not final: more updates follow
  eos,              // finished: its last token is an end-of-sequence token
  token_limit,      // finished: it produced its max_new_tokens
  context_limit,    // finished early: prompt and tokens reached max_len (the cache slot is full)
  cancelled,        // cancel() (or its update callback threw): ended at a step boundary with the tokens so far
  failed,           // the executor threw in a call this request was part of; message says what
  invalid_request,  // an empty prompt, or a token outside vocab_size; never queued
  prompt_too_long,  // the prompt leaves no room for a new token under max_len; never queued
  queue_full,       // queue_capacity requests were waiting; never queued
  shut_down,        // submitted after shutdown began, or ended by a cancelling shutdown
};

// The status's name, e.g. "token_limit".
constexpr ::std::string_view to_string(DecodeStatus status) noexcept {
  switch (status) {
    case DecodeStatus::running: return "running";
    case DecodeStatus::eos: return "eos";
    case DecodeStatus::token_limit: return "token_limit";
    case DecodeStatus::context_limit: return "context_limit";
    case DecodeStatus::cancelled: return "cancelled";
    case DecodeStatus::failed: return "failed";
    case DecodeStatus::invalid_request: return "invalid_request";
    case DecodeStatus::prompt_too_long: return "prompt_too_long";
    case DecodeStatus::queue_full: return "queue_full";
    case DecodeStatus::shut_down: return "shut_down";
  }
  return "unknown";
}

// True for the three ways a sequence ends normally, with all its tokens.
constexpr bool is_finished(DecodeStatus status) noexcept {
  return status == DecodeStatus::eos || status == DecodeStatus::token_limit || status == DecodeStatus::context_limit;
}

// True for the refusals: the request never entered the queue and got no token.
constexpr bool is_refusal(DecodeStatus status) noexcept {
  return status == DecodeStatus::invalid_request || status == DecodeStatus::prompt_too_long ||
         status == DecodeStatus::queue_full;
}

// One message of a request's channel; its spans are valid during the call.
struct DecodeUpdate {
  ::std::uint64_t id = 0;                 // the request's id (DecodeHandle::id())
  ::std::span<const TokenId> tokens;      // new since the previous update, in order
  DecodeStatus status = DecodeStatus::running;
  ::std::string_view message;             // final and not finished: why, for a person
  // From submission to admission into a slot; 0 before admission.
  ::std::chrono::microseconds queue_delay{0};

  // True for the last update of the request.
  bool done() const noexcept { return status != DecodeStatus::running; }
};

// A request's whole answer (DecodeStream::wait()).
struct DecodeResult {
  DecodeStatus status = DecodeStatus::running;
  ::std::vector<TokenId> tokens;  // every token it got (a cancelled or failed one: those produced before)
  ::std::string message;          // not finished: why
  ::std::chrono::microseconds queue_delay{0};

  bool ok() const noexcept { return is_finished(status); }
  explicit operator bool() const noexcept { return ok(); }
};

}  // namespace replay
