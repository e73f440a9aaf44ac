#pragma once
#include <replay/detail/require_cxx20.hpp>
// What a DecodeStream reads: the updates of its request, gathered by the
// update callback the scheduler calls (on its worker) and read by the
// stream's owner (on any thread).
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "replay/decode/batch.hpp"
#include "replay/decode/status.hpp"

namespace replay::detail {

struct DecodeStreamState {
  mutable ::std::mutex mutex;
  ::std::condition_variable changed;
  ::std::vector<TokenId> tokens;  // every token so far
  ::std::size_t read = 0;         // tokens[0, read) were returned by next()
  DecodeStatus status = DecodeStatus::running;
  ::std::string message;
  ::std::chrono::microseconds queue_delay{0};

  void deliver(const DecodeUpdate& update) {
    ::std::unique_lock lock(mutex);
    // The status first, and a wake-up whatever happens: the stream ends even
    // if copying the rest runs out of memory.
    status = update.status;
    queue_delay = update.queue_delay;
    try {
      tokens.insert(tokens.end(), update.tokens.begin(), update.tokens.end());
      message.assign(update.message);
    } catch (...) {
      lock.unlock();
      changed.notify_all();
      throw;
    }
    lock.unlock();
    changed.notify_all();
  }
};

}  // namespace replay::detail
