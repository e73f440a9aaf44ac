#pragma once
#include <replay/detail/require_cxx20.hpp>
// A decode request inside the scheduler: waiting in its queue, then living
// in a cache slot until it ends.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "replay/decode/batch.hpp"
#include "replay/decode/status.hpp"
#include "replay/decode/detail/control.hpp"

namespace replay::detail {

struct DecodeSequence {
  using clock = ::std::chrono::steady_clock;

  ::std::shared_ptr<DecodeControl> control;
  ::std::function<void(const DecodeUpdate&)> on_update;
  ::std::vector<TokenId> prompt;
  ::std::size_t max_new_tokens = 0;  // 0: no limit
  clock::time_point submitted;
  ::std::chrono::microseconds queue_delay{0};
  // Prompt tokens in the cache: prompt.size() once prefilled; less while a
  // chunked prefill (DecodePrefill::with_decode) is under way.
  ::std::size_t prefilled = 0;
  ::std::vector<TokenId> tokens;  // produced so far
  ::std::size_t delivered = 0;    // tokens[0, delivered) went out in updates
};

}  // namespace replay::detail
