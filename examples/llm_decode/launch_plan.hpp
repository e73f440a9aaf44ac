#pragma once
// Driving a LlamaExecutor by hand, without the scheduler: the fixed batches
// of the benchmark, and the record-and-replay check that a graphed executor
// gives the same tokens as an eager one for the very launches a scheduler made.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <replay/decode.hpp>

namespace llm_decode {

// The scheduler's smallest_bucket() (replay/decode/policy.hpp), refusing
// `n` above the largest bucket instead of returning 0.
inline std::int64_t smallest_bucket_for(const std::vector<std::int64_t>& buckets, std::int64_t n) {
  if (const std::int64_t bucket = replay::smallest_bucket(buckets, static_cast<std::size_t>(n)); bucket > 0) {
    return bucket;
  }
  throw std::invalid_argument("no bucket holds " + std::to_string(n) + " (the largest is " +
                              std::to_string(buckets.back()) + ")");
}

// One prefill call: prompts and the first tokens they produced.
struct RecordedPrefill {
  std::vector<std::size_t> slots;
  std::vector<std::vector<replay::TokenId>> prompts;
  std::vector<replay::TokenId> first_tokens;
};

// One decode launch: its rows and buckets, and the tokens each row got.
struct RecordedLaunch {
  std::vector<replay::DecodeRow> rows;
  std::int64_t batch_bucket = 0;
  std::int64_t context_bucket = 0;
  std::size_t max_steps = 1;
  std::vector<std::vector<replay::TokenId>> tokens;  // per row, in order
};

// Runs one launch on `executor` with owned buffers; returns each row's tokens.
template <class Executor>
std::vector<std::vector<replay::TokenId>> run_launch(Executor& executor, const std::vector<replay::DecodeRow>& rows,
                                                     std::int64_t batch_bucket, std::int64_t context_bucket,
                                                     std::size_t max_steps,
                                                     const std::vector<replay::TokenId>& eos_tokens) {
  std::vector<replay::TokenId> tokens(rows.size() * max_steps);
  std::vector<std::size_t> counts(rows.size(), 0);
  replay::DecodeBatch batch{.rows = rows,
                            .batch_bucket = batch_bucket,
                            .context_bucket = context_bucket,
                            .max_steps = max_steps,
                            .eos_tokens = eos_tokens,
                            .tokens = tokens,
                            .counts = counts};
  executor.decode(batch);
  std::vector<std::vector<replay::TokenId>> out(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto row = batch.row_tokens(r);
    out[r].assign(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(counts[r]));
  }
  return out;
}

// Prefills `prompts` into `slots` on `executor`; returns the first tokens.
template <class Executor>
std::vector<replay::TokenId> run_prefill(Executor& executor, const std::vector<std::size_t>& slots,
                                         const std::vector<std::vector<replay::TokenId>>& prompts) {
  std::vector<replay::PrefillRow> rows;
  for (std::size_t i = 0; i < prompts.size(); ++i) rows.push_back({.slot = slots[i], .prompt = prompts[i]});
  std::vector<replay::TokenId> first(prompts.size());
  replay::PrefillBatch batch{.rows = rows, .first_tokens = first};
  executor.prefill(batch);
  return first;
}

// A DecodeExecutor that forwards to `inner` and records every call, in order,
// so the same calls can be replayed on another executor (replay_recording).
template <class Inner>
class RecordingExecutor {
 public:
  explicit RecordingExecutor(Inner& inner) : inner_(&inner) {}
  void prefill(replay::PrefillBatch& batch) {
    inner_->prefill(batch);
    RecordedPrefill call;
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      call.slots.push_back(batch.rows[r].slot);
      call.prompts.emplace_back(batch.rows[r].prompt.begin(), batch.rows[r].prompt.end());
      call.first_tokens.push_back(batch.first_tokens[r]);
    }
    calls_.push_back(Call{.prefill = std::move(call), .is_prefill = true});
  }
  void decode(replay::DecodeBatch& batch) {
    inner_->decode(batch);
    RecordedLaunch launch{.rows = {batch.rows.begin(), batch.rows.end()},
                          .batch_bucket = batch.batch_bucket,
                          .context_bucket = batch.context_bucket,
                          .max_steps = batch.max_steps,
                          .tokens = {}};
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      const auto row = batch.row_tokens(r);
      launch.tokens.emplace_back(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(batch.counts[r]));
    }
    calls_.push_back(Call{.launch = std::move(launch), .is_prefill = false});
  }

  struct Call {
    RecordedPrefill prefill{};
    RecordedLaunch launch{};
    bool is_prefill = false;
  };
  const std::vector<Call>& calls() const noexcept { return calls_; }

 private:
  Inner* inner_;
  std::vector<Call> calls_;
};

// Replays recorded calls on `executor` (a fresh cache) and returns how many
// calls gave other tokens than were recorded, with the first difference in
// `first_difference`.
template <class Executor, class Call>
std::size_t replay_recording(Executor& executor, const std::vector<Call>& calls,
                             const std::vector<replay::TokenId>& eos_tokens, std::string* first_difference) {
  std::size_t differing = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const Call& call = calls[i];
    bool same = true;
    if (call.is_prefill) {
      same = run_prefill(executor, call.prefill.slots, call.prefill.prompts) == call.prefill.first_tokens;
    } else {
      const RecordedLaunch& l = call.launch;
      same = run_launch(executor, l.rows, l.batch_bucket, l.context_bucket, l.max_steps, eos_tokens) == l.tokens;
    }
    if (!same) {
      if (differing == 0 && first_difference != nullptr) {
        *first_difference = "call " + std::to_string(i) + " (" + (call.is_prefill ? "prefill" : "decode launch") +
                            " of " +
                            std::to_string(call.is_prefill ? call.prefill.prompts.size() : call.launch.rows.size()) +
                            " rows)";
      }
      ++differing;
    }
  }
  return differing;
}

}  // namespace llm_decode
