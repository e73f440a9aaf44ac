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

// One mixed launch (chunked prefill): its prompt chunks and the first tokens
// they produced, its decode rows and the token each got.
struct RecordedMixed {
  std::vector<replay::PrefillRow> chunk_rows;  // slot and start; the prompt spans are empty (see `chunks`)
  std::vector<std::vector<replay::TokenId>> chunks;
  std::vector<replay::TokenId> first_tokens;
  RecordedLaunch launch;  // max_steps 1
};

// Runs one mixed launch on `executor` with owned buffers; returns the chunks'
// first tokens, then each decode row's token.
template <class Executor>
std::vector<replay::TokenId> run_mixed(Executor& executor, const RecordedMixed& call,
                                       const std::vector<replay::TokenId>& eos_tokens) {
  std::vector<replay::PrefillRow> chunk_rows = call.chunk_rows;
  for (std::size_t c = 0; c < chunk_rows.size(); ++c) chunk_rows[c].prompt = call.chunks[c];
  std::vector<replay::TokenId> first(chunk_rows.size());
  const std::vector<replay::DecodeRow>& rows = call.launch.rows;
  std::vector<replay::TokenId> tokens(rows.size());
  std::vector<std::size_t> counts(rows.size(), 0);
  replay::MixedBatch batch{.prefill = {.rows = chunk_rows, .first_tokens = first},
                           .decode = {.rows = rows,
                                      .batch_bucket = call.launch.batch_bucket,
                                      .context_bucket = call.launch.context_bucket,
                                      .max_steps = 1,
                                      .eos_tokens = eos_tokens,
                                      .tokens = tokens,
                                      .counts = counts}};
  executor.prefill_and_decode(batch);
  first.insert(first.end(), tokens.begin(), tokens.end());
  return first;
}

// A DecodeExecutor that forwards to `inner` and records every call, in order,
// so the same calls can be replayed on another executor (replay_recording).
// A MixedDecodeExecutor when `inner` is one.
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
    calls_.push_back(Call{.prefill = std::move(call), .kind = Call::Kind::prefill});
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
    calls_.push_back(Call{.launch = std::move(launch), .kind = Call::Kind::launch});
  }
  void prefill_and_decode(replay::MixedBatch& batch)
    requires replay::MixedDecodeExecutor<Inner>
  {
    inner_->prefill_and_decode(batch);
    RecordedMixed call{.chunk_rows = {batch.prefill.rows.begin(), batch.prefill.rows.end()},
                       .chunks = {},
                       .first_tokens = {batch.prefill.first_tokens.begin(), batch.prefill.first_tokens.end()},
                       .launch = {.rows = {batch.decode.rows.begin(), batch.decode.rows.end()},
                                  .batch_bucket = batch.decode.batch_bucket,
                                  .context_bucket = batch.decode.context_bucket,
                                  .max_steps = 1,
                                  .tokens = {}}};
    // The chunks' tokens are copied; the spans into the scheduler's memory
    // are not kept (run_mixed() points them at the copies).
    for (replay::PrefillRow& row : call.chunk_rows) {
      call.chunks.emplace_back(row.prompt.begin(), row.prompt.end());
      row.prompt = {};
    }
    for (std::size_t r = 0; r < batch.decode.rows.size(); ++r) {
      call.launch.tokens.push_back({batch.decode.tokens[r]});
    }
    calls_.push_back(Call{.mixed = std::move(call), .kind = Call::Kind::mixed});
  }

  struct Call {
    enum class Kind : std::uint8_t { prefill, launch, mixed };
    RecordedPrefill prefill{};
    RecordedLaunch launch{};
    RecordedMixed mixed{};
    Kind kind = Kind::launch;
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
    std::string what;
    if (call.kind == Call::Kind::prefill) {
      same = run_prefill(executor, call.prefill.slots, call.prefill.prompts) == call.prefill.first_tokens;
      what = "prefill of " + std::to_string(call.prefill.prompts.size()) + " prompts";
    } else if (call.kind == Call::Kind::launch) {
      const RecordedLaunch& l = call.launch;
      same = run_launch(executor, l.rows, l.batch_bucket, l.context_bucket, l.max_steps, eos_tokens) == l.tokens;
      what = "decode launch of " + std::to_string(l.rows.size()) + " rows";
    } else {
      const RecordedMixed& m = call.mixed;
      std::vector<replay::TokenId> recorded = m.first_tokens;
      for (const auto& row : m.launch.tokens) recorded.insert(recorded.end(), row.begin(), row.end());
      if constexpr (replay::MixedDecodeExecutor<Executor>) {
        same = run_mixed(executor, m, eos_tokens) == recorded;
      } else {
        throw std::invalid_argument(
            "replay_recording: a mixed launch to replay on an executor without prefill_and_decode()");
      }
      what = "mixed launch of " + std::to_string(m.chunks.size()) + " chunks and " +
             std::to_string(m.launch.rows.size()) + " decode rows";
    }
    if (!same) {
      if (differing == 0 && first_difference != nullptr) {
        *first_difference = "call " + std::to_string(i) + " (" + what + ")";
      }
      ++differing;
    }
  }
  return differing;
}

}  // namespace llm_decode
