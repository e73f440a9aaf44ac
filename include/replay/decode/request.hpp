#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeRequest: one sequence to generate.
#include <cstddef>
#include <vector>

#include "replay/decode/batch.hpp"

namespace replay {

// One sequence to generate: a prompt and a token limit.
struct DecodeRequest {
  // At least one token and fewer than the scheduler's max_len (there must be
  // room for one new token); otherwise the request is refused.
  ::std::vector<TokenId> prompt;
  // Most tokens to generate. 0: until an end-of-sequence token or until
  // prompt and tokens fill max_len.
  ::std::size_t max_new_tokens = 0;
};

}  // namespace replay
