#pragma once
#include <replay/detail/require_cxx20.hpp>
// What a DecodeScheduler hands its executor: a PrefillBatch (prompts to write
// into free cache slots, one first token back per prompt), a DecodeBatch
// (one launch of up to max_steps decode steps over every active sequence,
// padded to a batch bucket and read up to a context bucket), and with
// chunked prefill (DecodePrefill::with_decode) a MixedBatch: prompt chunks
// and one decode step in one launch. The scheduler owns the memory behind
// the spans; they are valid for the call only.
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay {

// A token of the model's vocabulary.
using TokenId = ::std::int32_t;

// One prompt, or one chunk of a prompt, to prefill.
struct PrefillRow {
  ::std::size_t slot = 0;              // the cache slot it goes into (< max_slots)
  ::std::span<const TokenId> prompt;  // the tokens of positions start .. start + prompt.size() - 1 (< max_len)
  // Where prompt[0] goes. 0 (the slot was free until now) unless a chunked
  // prefill continues: then positions 0 .. start - 1 of the slot hold the
  // earlier chunks' keys and values, which the chunk's tokens attend to.
  // Only a MixedBatch has chunks; prefill() always gets whole prompts.
  ::std::size_t start = 0;
};

// The prompts (or chunks) of one call. The executor writes each row's keys
// and values into its slot and the greedy token that follows the row's last
// token (position start + prompt.size()) into first_tokens[row]: a prompt's
// first generated token when the row ends its prompt.
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

// One launch of chunked prefill (DecodePrefill::with_decode): the prefill
// rows (prompt chunks, each continuing its slot at its `start`) and one
// decode step of every running sequence, in one forward, so the running
// sequences do not wait for the prompts. prefill.rows is never empty;
// decode.rows may be (then its buckets are 0). decode.max_steps is 1 and
// every decode row's max_tokens 1: the executor emits one token per decode
// row and writes one first token per prefill row, as prefill() and
// decode() do. The rows' slots are distinct.
struct MixedBatch {
  // The prompt chunks and their first tokens.
  PrefillBatch prefill;
  // One step of every running sequence (max_steps 1; may have no rows).
  DecodeBatch decode;
};

}  // namespace replay
