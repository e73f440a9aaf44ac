#pragma once
#include <replay/detail/require_cxx20.hpp>
// The DecodeScheduler's executor calls: a separate prefill, a decode launch,
// and (chunked prefill) a mixed launch of prompt chunks and one decode step.
// Both launches take the same steps over the running rows
// (call_decode_rows()): stage them, plan their buckets, call the executor,
// check the counts it reported, take the tokens. Included by
// decode/detail/core.hpp.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "replay/decode/batch.hpp"
#include "replay/decode/executor.hpp"
#include "replay/decode/policy.hpp"
#include "replay/decode/status.hpp"
#include "replay/decode/detail/core.hpp"
#include "replay/detail/message.hpp"

namespace replay::detail {

template <DecodeExecutor Executor>
void DecodeCore<Executor>::prefill() {
  if (admitted_slots_.empty()) {
    return;
  }
  const ::std::size_t n = admitted_slots_.size();
  ::std::size_t prompt_tokens = 0;
  prefill_rows_.clear();
  for (const ::std::size_t slot : admitted_slots_) {
    prefill_rows_.push_back({slot, slots_[slot].prompt});
    prompt_tokens += slots_[slot].prompt.size();
  }
  first_tokens_.assign(n, 0);
  PrefillBatch batch{prefill_rows_, first_tokens_};
  bool failed = false;
  ::std::string error;
  try {
    executor_.prefill(batch);
  } catch (...) {
    failed = true;
    error = describe_current_exception();
  }
  {
    ::std::lock_guard lock(wakeup_->mutex);
    ++stats_.prefills;
    stats_.prefill_tokens += prompt_tokens;
    if (failed) {
      ++stats_.failed_prefills;
    } else {
      stats_.tokens += n;
    }
  }
  if (failed) {
    const ::std::string message =
        concat("the executor's prefill of ", n, n == 1 ? " prompt" : " prompts", " failed: ", error);
    for (const ::std::size_t slot : admitted_slots_) {
      end_slot(slot, DecodeStatus::failed, message);
    }
  } else {
    for (::std::size_t i = 0; i < n; ++i) {
      slots_[admitted_slots_[i]].prefilled = slots_[admitted_slots_[i]].prompt.size();
      slots_[admitted_slots_[i]].tokens.push_back(first_tokens_[i]);
      settle(admitted_slots_[i], is_eos(first_tokens_[i]));
    }
  }
  admitted_slots_.clear();
}

// rows_: every running sequence (prefilled, in slot order), each to produce
// up to max_steps tokens.
template <DecodeExecutor Executor>
void DecodeCore<Executor>::stage_decode_rows(::std::size_t max_steps) {
  rows_.clear();
  for (::std::size_t slot = 0; slot < slots_.capacity(); ++slot) {
    if (!slots_.occupied(slot) || slots_[slot].prefilled < slots_[slot].prompt.size()) {
      continue;
    }
    const DecodeSequence& sequence = slots_[slot];
    // A running sequence has a token left: one with none has ended (settle()).
    const ::std::size_t left =
        tokens_left(sequence.prompt.size(), sequence.tokens.size(), sequence.max_new_tokens, options_.max_len);
    rows_.push_back({slot, sequence.prompt.size() + sequence.tokens.size() - 1, sequence.tokens.back(),
                     ::std::min(max_steps, left)});
  }
}

// The steps both launches take over rows_: every running sequence, up to
// steps_per_launch tokens each (one in a mixed launch, which may have none).
// `call(batch)` calls the executor; a failure is what it threw or a count
// outside 1 to a row's max_tokens. Stats, failures and settling are the caller's.
template <DecodeExecutor Executor>
template <class Call>
auto DecodeCore<Executor>::call_decode_rows(bool mixed, Call&& call) -> DecodeCall {
  stage_decode_rows(mixed ? 1 : options_.steps_per_launch);
  const ::std::size_t n = rows_.size();
  DecodeCall out;
  if (n != 0 || !mixed) {
    out.shape = plan_launch(rows_, options_.batch_buckets, options_.context_buckets);
    if (out.shape.batch_bucket == 0 || out.shape.context_bucket == 0 || out.shape.max_steps == 0 ||
        (mixed && out.shape.max_steps != 1)) {
      throw ::std::logic_error(concat("replay: DecodeScheduler planned a ", mixed ? "mixed launch" : "launch",
                                      " that fits no bucket (a scheduler bug)"));
    }
  }
  const ::std::size_t steps = mixed ? 1 : out.shape.max_steps;
  row_tokens_.assign(n * steps, 0);
  counts_.assign(n, 0);
  row_hit_eos_.assign(n, false);
  DecodeBatch batch{rows_, out.shape.batch_bucket, out.shape.context_bucket, steps, options_.eos_tokens,
                    row_tokens_, counts_};
  try {
    call(batch);
    for (::std::size_t r = 0; r < n && !out.failed; ++r) {
      if (counts_[r] == 0 || counts_[r] > rows_[r].max_tokens) {
        out.failed = true;
        out.error = mixed ? concat("it reported ", counts_[r], " tokens for decode row ", r, " (slot ", rows_[r].slot,
                                   "), expected 1")
                          : concat("it reported ", counts_[r], " tokens for row ", r, " (slot ", rows_[r].slot,
                                   "), expected 1 to ", rows_[r].max_tokens);
      }
    }
  } catch (...) {
    out.failed = true;
    out.error = describe_current_exception();
  }
  if (out.failed) {
    return out;
  }
  for (::std::size_t r = 0; r < n; ++r) {
    DecodeSequence& sequence = slots_[rows_[r].slot];
    for (::std::size_t j = 0; j < counts_[r]; ++j) {
      const TokenId token = row_tokens_[r * steps + j];
      sequence.tokens.push_back(token);
      ++out.produced;
      if (is_eos(token)) {
        row_hit_eos_[r] = true;  // what the executor produced after it is dropped
        break;
      }
    }
    out.steps = ::std::max(out.steps, counts_[r]);
  }
  return out;
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::launch() {
  const DecodeCall result = call_decode_rows(false, [this](DecodeBatch& batch) { executor_.decode(batch); });
  const DecodeLaunchShape& shape = result.shape;
  const ::std::size_t n = rows_.size();
  {
    ::std::lock_guard lock(wakeup_->mutex);
    ++stats_.launches;
    stats_.rows += n;
    stats_.padded_rows += static_cast<::std::uint64_t>(shape.batch_bucket);
    ++stats_.bucket_launches[bucket_index(options_.batch_buckets, shape.batch_bucket) * options_.context_buckets.size() +
                             bucket_index(options_.context_buckets, shape.context_bucket)];
    if (result.failed) {
      ++stats_.failed_launches;
    } else {
      stats_.steps += result.steps;
      stats_.tokens += result.produced;
    }
  }
  if (result.failed) {
    const ::std::string message =
        concat("the executor's decode launch of ", n, n == 1 ? " sequence" : " sequences", " (batch bucket ",
               shape.batch_bucket, ", context bucket ", shape.context_bucket, ", up to ", shape.max_steps,
               shape.max_steps == 1 ? " step" : " steps", ") failed: ", result.error);
    for (const DecodeRow& row : rows_) {
      end_slot(row.slot, DecodeStatus::failed, message);
    }
    return;
  }
  settle_decode_rows();
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::settle_decode_rows() {
  for (::std::size_t r = 0; r < rows_.size(); ++r) {
    settle(rows_[r].slot, row_hit_eos_[r]);
  }
}

template <DecodeExecutor Executor>
void DecodeCore<Executor>::mixed_launch() {
  if constexpr (MixedDecodeExecutor<Executor>) {
    // The prompt chunks: oldest admission first, within the launch's budget.
    const ::std::size_t waiting = prefilling_.size();
    chunk_remaining_.clear();
    for (const ::std::size_t slot : prefilling_) {
      chunk_remaining_.push_back(slots_[slot].prompt.size() - slots_[slot].prefilled);
    }
    chunk_take_.assign(waiting, 0);
    (void)plan_prefill_chunks(chunk_remaining_, options_.max_prefill_tokens, chunk_take_);
    prefill_rows_.clear();
    ::std::size_t prompt_tokens = 0;
    for (::std::size_t i = 0; i < waiting; ++i) {
      if (chunk_take_[i] == 0) {
        continue;
      }
      const DecodeSequence& sequence = slots_[prefilling_[i]];
      prefill_rows_.push_back({prefilling_[i],
                               ::std::span<const TokenId>(sequence.prompt).subspan(sequence.prefilled, chunk_take_[i]),
                               sequence.prefilled});
      prompt_tokens += chunk_take_[i];
    }
    first_tokens_.assign(prefill_rows_.size(), 0);
    // With one step of every running sequence.
    const DecodeCall result = call_decode_rows(true, [this](DecodeBatch& decode) {
      MixedBatch batch{{prefill_rows_, first_tokens_}, decode};
      executor_.prefill_and_decode(batch);
    });
    const ::std::size_t n = rows_.size();
    ::std::size_t completed = 0;  // prompts whose last chunk this is
    for (const PrefillRow& chunk : prefill_rows_) {
      completed += chunk.start + chunk.prompt.size() == slots_[chunk.slot].prompt.size() ? 1 : 0;
    }
    {
      ::std::lock_guard lock(wakeup_->mutex);
      ++stats_.mixed_launches;
      stats_.prefill_chunks += prefill_rows_.size();
      stats_.prefill_tokens += prompt_tokens;
      if (result.failed) {
        ++stats_.failed_mixed_launches;
      } else {
        stats_.mixed_rows += n;
        stats_.steps += result.steps;
        stats_.tokens += result.produced + completed;
      }
    }
    if (result.failed) {
      const ::std::string message = concat("the executor's prefill_and_decode of ", prefill_rows_.size(),
                                           prefill_rows_.size() == 1 ? " prompt chunk (" : " prompt chunks (",
                                           prompt_tokens, " tokens) and ", n, n == 1 ? " sequence" : " sequences",
                                           " failed: ", result.error);
      for (const PrefillRow& chunk : prefill_rows_) {
        end_slot(chunk.slot, DecodeStatus::failed, message);
      }
      for (const DecodeRow& row : rows_) {
        end_slot(row.slot, DecodeStatus::failed, message);
      }
      return;
    }
    for (::std::size_t i = 0; i < prefill_rows_.size(); ++i) {
      const ::std::size_t slot = prefill_rows_[i].slot;
      DecodeSequence& sequence = slots_[slot];
      sequence.prefilled += prefill_rows_[i].prompt.size();
      if (sequence.prefilled == sequence.prompt.size()) {
        prefilling_.erase(::std::find(prefilling_.begin(), prefilling_.end(), slot));
        sequence.tokens.push_back(first_tokens_[i]);
        settle(slot, is_eos(first_tokens_[i]));
      }
    }
    settle_decode_rows();
  } else {
    throw ::std::logic_error(
        "replay: DecodeScheduler ran a mixed launch without prefill_and_decode() (a scheduler bug)");
  }
}

}  // namespace replay::detail
