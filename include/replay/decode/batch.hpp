#pragma once
#include <replay/detail/require_cxx20.hpp>
// What a DecodeScheduler hands its executor: a PrefillBatch (prompts to write
// into free cache slots, one first token back per prompt) and a DecodeBatch
// (one launch of up to max_steps decode steps over every active sequence,
// padded to a batch bucket and read up to a context bucket). The scheduler
// owns the memory behind the spans; they are valid for the call only.
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay {

// A token of the model's vocabulary.
using TokenId = ::std::int32_t;

// One prompt to prefill.
struct PrefillRow {
  ::std::size_t slot = 0;              // the cache slot it goes into (< max_slots), free until now
  ::std::span<const TokenId> prompt;  // positions 0 .. prompt.size() - 1; fewer than max_len tokens
};

// The prompts admitted in one scheduler iteration. The executor writes each
// prompt's keys and values into its slot and the greedy token that follows
// the prompt (position prompt.size()) into first_tokens[row].
struct PrefillBatch {
  ::std::span<const PrefillRow> rows;
  ::std::span<TokenId> first_tokens;  // out: one per row
};

// One active sequence in a decode launch.
struct DecodeRow {
  ::std::size_t slot = 0;        // its cache slot
  ::std::size_t position = 0;    // where `token` goes; positions 0 .. position - 1 are in the cache
  TokenId token = 0;             // its newest token, the input of the first step
  ::std::size_t max_tokens = 1;  // produce 1 to max_tokens tokens for it in this launch
};

// One launch: up to max_steps greedy decode steps for every row. Step j of
// row r feeds the token at position rows[r].position + j (the row's newest
// token: its input, then what step j - 1 produced), attends to positions
// 0 .. position + j, and produces the next token. A row stops after
// max_tokens tokens or after an end-of-sequence token (one of eos_tokens);
// the launch may end early once every row stopped.
//
// A graphed executor pads rows to batch_bucket (padding rows should write to
// a spare cache slot) and reads attention up to context_bucket positions,
// i.e. it replays the graph of key {batch_bucket, context_bucket} of a
// ShapeRouter bucketed per dimension with the scheduler's bucket lists.
//
// The executor reports row r's tokens in tokens[r * max_steps ...] and their
// number in counts[r] (1 to rows[r].max_tokens); emit() does both. Tokens a
// row produced after its first end-of-sequence token are ignored.
struct DecodeBatch {
  ::std::span<const DecodeRow> rows;  // in slot order
  ::std::int64_t batch_bucket = 0;    // the smallest batch bucket >= rows.size()
  // The smallest context bucket >= max over rows of position + max_tokens:
  // the most positions any step of this launch attends to.
  ::std::int64_t context_bucket = 0;
  ::std::size_t max_steps = 1;              // max over rows of max_tokens (<= steps_per_launch)
  ::std::span<const TokenId> eos_tokens;    // the scheduler's end-of-sequence tokens (may be empty)
  ::std::span<TokenId> tokens;              // out: rows.size() * max_steps, row-major
  ::std::span<::std::size_t> counts;        // out: tokens per row; 0 when the launch starts

  // Room for row r's tokens (max_steps of them; the first counts[r] are set).
  ::std::span<TokenId> row_tokens(::std::size_t row) const noexcept {
    return tokens.subspan(row * max_steps, max_steps);
  }
  // Appends `token` to row r's tokens.
  void emit(::std::size_t row, TokenId token, ::std::source_location where = ::std::source_location::current()) const {
    if (row >= rows.size() || counts[row] >= rows[row].max_tokens) {
      throw usage_error(row >= rows.size()
                            ? detail::concat("DecodeBatch::emit(): row ", row, " of a launch of ", rows.size(), " rows")
                            : detail::concat("DecodeBatch::emit(): row ", row, " already has its ", rows[row].max_tokens,
                                             " tokens for this launch"),
                        where);
    }
    tokens[row * max_steps + counts[row]++] = token;
  }
  // True when `token` ends a sequence.
  bool is_eos(TokenId token) const noexcept {
    for (const TokenId eos : eos_tokens) {
      if (eos == token) {
        return true;
      }
    }
    return false;
  }
};

}  // namespace replay
