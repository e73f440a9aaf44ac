#pragma once
#include <replay/detail/require_cxx20.hpp>
// BatchStatus and BatchResult: the one completion channel of a Batcher
// request. Every request is completed exactly once with a BatchResult, whether
// it ran, was refused, expired or failed; values and errors travel the same
// way (as stdexec's set_value / set_error do), so a server maps a result to a
// response without catching exceptions.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace replay {

enum class BatchStatus : ::std::uint8_t {
  ok,               // ran; output holds the request's rows
  invalid_request,  // empty, or not a whole number of rows; never queued
  too_large,        // more rows than the largest batch; never queued
  queue_full,       // try_submit() found the queue at capacity; never queued
  timed_out,        // its deadline passed before it ran; not run
  failed,           // its batch failed; message says why (every request of that batch gets it)
  shut_down,        // the Batcher shut down before it ran (or before it was submitted)
};

constexpr ::std::string_view to_string(BatchStatus status) noexcept {
  switch (status) {
    case BatchStatus::ok: return "ok";
    case BatchStatus::invalid_request: return "invalid_request";
    case BatchStatus::too_large: return "too_large";
    case BatchStatus::queue_full: return "queue_full";
    case BatchStatus::timed_out: return "timed_out";
    case BatchStatus::failed: return "failed";
    case BatchStatus::shut_down: return "shut_down";
  }
  return "unknown";
}

// What one request got back.
template <class Out>
struct BatchResult {
  BatchStatus status = BatchStatus::ok;
  ::std::vector<Out> output;  // ok: the request's rows of output, rows * output_row_elements
  ::std::string message;      // not ok: what went wrong, for a person
  ::std::size_t batch_rows = 0;   // rows of the batch it ran in (0 when it did not run)
  ::std::size_t padded_rows = 0;  // that batch padded up to the executor's batch size
  ::std::chrono::microseconds queue_delay{0};  // from submission to leaving the queue

  bool ok() const noexcept { return status == BatchStatus::ok; }
  explicit operator bool() const noexcept { return ok(); }
};

}  // namespace replay
