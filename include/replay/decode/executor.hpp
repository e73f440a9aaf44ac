#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeExecutor: what a DecodeScheduler drives. It owns the model and its
// KV cache of max_slots slots of max_len positions; the scheduler decides
// which sequence lives in which slot and which positions each launch covers.
//
// An executor provides
//   void prefill(PrefillBatch& batch)
//       writes each row's prompt into its cache slot (overwriting whatever
//       the slot held) and its first generated token into
//       batch.first_tokens[row];
//   void decode(DecodeBatch& batch)
//       runs 1 to batch.max_steps decode steps for every row and reports the
//       tokens with batch.emit(row, token) (or batch.row_tokens(row) and
//       batch.counts[row]); see DecodeBatch.
// and, for chunked prefill (DecodePrefill::with_decode), a MixedDecodeExecutor
// also
//   void prefill_and_decode(MixedBatch& batch)
//       does both in one launch: each prefill row's tokens written at its
//       slot's positions start.. (attending to the earlier chunks there), and
//       one decode step of every decode row; see MixedBatch.
// They throw on failure: the scheduler then fails the sequences of that call
// with the exception's message and goes on serving the others. A scheduler
// calls its executor from one thread (its worker), one call at a time, so an
// executor needs no locking. The CPU tests use a stand-in.
#include <concepts>

#include "replay/decode/batch.hpp"

namespace replay {

template <class E>
concept DecodeExecutor = requires(E& executor, PrefillBatch& prefill, DecodeBatch& decode) {
  { executor.prefill(prefill) } -> ::std::same_as<void>;
  { executor.decode(decode) } -> ::std::same_as<void>;
};

template <class E>
concept MixedDecodeExecutor = DecodeExecutor<E> && requires(E& executor, MixedBatch& mixed) {
  { executor.prefill_and_decode(mixed) } -> ::std::same_as<void>;
};

}  // namespace replay
