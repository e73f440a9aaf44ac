#pragma once
#include <replay/detail/require_cxx20.hpp>
// BatcherOptions (how a Batcher gathers requests into batches) and
// SubmitOptions (per request).
#include <chrono>
#include <cstddef>
#include <vector>

namespace replay {

struct BatcherOptions {
  // Most rows in one batch. 0: the executor's largest batch size. Never more
  // than that.
  ::std::size_t max_batch_rows = 0;
  // Batch sizes worth forming (strictly ascending, each <= max_batch_rows).
  // Empty: the executor's batch sizes (for a ShapeRouter, its buckets), cut at
  // max_batch_rows. A batch leaves at once when its rows reach the largest
  // preferred size (a full bucket), else when its oldest request has waited
  // max_queue_delay; see plan_batch().
  ::std::vector<::std::size_t> preferred_batch_rows{};
  // When a batch leaves before it is full, cut it back to the longest run of
  // requests whose rows are exactly a preferred size (no padding rows); the
  // rest wait for the next batch. Off: the batch is padded instead, which
  // costs little when a batch is one graph replay.
  bool trim_to_preferred = false;
  // Longest a request waits for others to join it before its batch leaves
  // anyway. 0: never wait (a batch is whatever is queued when the executor is free).
  ::std::chrono::microseconds max_queue_delay{100};
  // Most requests in one batch; 0: no limit. 1 turns batching off (each
  // request runs alone, through the same queue).
  ::std::size_t max_batch_requests = 0;
  // Most requests waiting to be batched. At capacity submit() waits and
  // try_submit() refuses (BatchStatus::queue_full). At least 1.
  ::std::size_t queue_capacity = 1024;
  // Deadline of a request that gives none: submission time plus this.
  // 0: no deadline.
  ::std::chrono::microseconds default_timeout{0};
};

struct SubmitOptions {
  using clock = ::std::chrono::steady_clock;
  // After this the request is answered BatchStatus::timed_out and not run
  // (also while submit() waits for queue space). max(): the Batcher's
  // default_timeout applies.
  clock::time_point deadline = clock::time_point::max();
};

}  // namespace replay
