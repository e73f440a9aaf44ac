#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeHandle (cancel a request from any thread) and DecodeStream (read a
// request's tokens as they are produced, or wait for all of them): what
// DecodeScheduler::submit() returns. Both stay usable after the scheduler is
// gone.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <utility>

#include "replay/decode/batch.hpp"
#include "replay/decode/status.hpp"
#include "replay/decode/detail/control.hpp"
#include "replay/decode/detail/stream_state.hpp"
#include "replay/error.hpp"

namespace replay {

// A cheap, copyable reference to one request.
class DecodeHandle {
 public:
  DecodeHandle() noexcept = default;
  // Made by the scheduler.
  explicit DecodeHandle(::std::shared_ptr<detail::DecodeControl> control) noexcept : control_(::std::move(control)) {}

  // The request's id (1, 2, ... per scheduler); 0 for an empty handle.
  ::std::uint64_t id() const noexcept { return control_ ? control_->id : 0; }
  // False for a default-constructed handle.
  bool valid() const noexcept { return control_ != nullptr; }

  // Asks the scheduler to end the request: a waiting one leaves the queue, a
  // running one frees its slot at the next step boundary; either ends with
  // DecodeStatus::cancelled and the tokens it had. Any thread, any number of
  // times; a no-op once the request ended and on an empty handle.
  void cancel() const noexcept {
    if (control_) {
      control_->cancel();
    }
  }

 private:
  ::std::shared_ptr<detail::DecodeControl> control_;
};

// The tokens of one request as they come. One thread reads (next(), or a
// range-for over the tokens); wait(), done(), status() and cancel() may be
// called from any thread. Move-only; a moved-from stream throws
// usage_error on use.
//
//   replay::DecodeStream stream = scheduler.submit({.prompt = prompt, .max_new_tokens = 64});
//   for (replay::TokenId token : stream) send(token);       // as produced
//   replay::DecodeResult result = stream.wait();            // status, all tokens, message
class DecodeStream {
  using State = detail::DecodeStreamState;

 public:
  DecodeStream() noexcept = default;
  // Made by the scheduler.
  DecodeStream(DecodeHandle handle, ::std::shared_ptr<State> state) noexcept
      : handle_(::std::move(handle)), state_(::std::move(state)) {}
  DecodeStream(const DecodeStream&) = delete;
  DecodeStream& operator=(const DecodeStream&) = delete;
  DecodeStream(DecodeStream&& other) noexcept
      : handle_(::std::exchange(other.handle_, DecodeHandle{})), state_(::std::move(other.state_)) {}
  DecodeStream& operator=(DecodeStream&& other) noexcept {
    handle_ = ::std::exchange(other.handle_, DecodeHandle{});
    state_ = ::std::move(other.state_);
    return *this;
  }
  // Dropping a stream does not cancel its request (call cancel() for that).
  ~DecodeStream() = default;

  // The request's id, as DecodeHandle::id().
  ::std::uint64_t id() const noexcept { return handle_.id(); }
  // False for a default-constructed or moved-from stream.
  bool valid() const noexcept { return state_ != nullptr; }
  // A copyable handle, e.g. for another thread to cancel with.
  DecodeHandle handle(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    return handle_;
  }
  void cancel(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    handle_.cancel();
  }

  // Waits for the next token not yet read; std::nullopt once the request
  // ended and every token was read (then status() says how it ended).
  ::std::optional<TokenId> next(::std::source_location where = ::std::source_location::current()) {
    require_valid(where);
    ::std::unique_lock lock(state_->mutex);
    state_->changed.wait(lock, [&] { return state_->read < state_->tokens.size() || ended(); });
    if (state_->read < state_->tokens.size()) {
      return state_->tokens[state_->read++];
    }
    return ::std::nullopt;
  }

  // True once the final update arrived (tokens may still be unread).
  bool done(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    ::std::lock_guard lock(state_->mutex);
    return ended();
  }
  // DecodeStatus::running until the final update.
  DecodeStatus status(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    ::std::lock_guard lock(state_->mutex);
    return state_->status;
  }
  // Waits up to `timeout` for the request to end; true when it did.
  template <class Rep, class Period>
  bool wait_for(::std::chrono::duration<Rep, Period> timeout,
                ::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    ::std::unique_lock lock(state_->mutex);
    return state_->changed.wait_for(lock, timeout, [&] { return ended(); });
  }
  // Waits for the request to end; its status, every token (read or not) and
  // message. Any number of times.
  DecodeResult wait(::std::source_location where = ::std::source_location::current()) const {
    require_valid(where);
    ::std::unique_lock lock(state_->mutex);
    state_->changed.wait(lock, [&] { return ended(); });
    DecodeResult result;
    result.status = state_->status;
    result.tokens = state_->tokens;
    result.message = state_->message;
    result.queue_delay = state_->queue_delay;
    return result;
  }

  // A range of the tokens not yet read, each waited for: for (TokenId t : stream).
  class iterator {
   public:
    using iterator_concept = ::std::input_iterator_tag;
    using value_type = TokenId;
    using difference_type = ::std::ptrdiff_t;

    iterator() noexcept = default;
    TokenId operator*() const noexcept { return token_; }
    iterator& operator++() {
      advance();
      return *this;
    }
    void operator++(int) { advance(); }
    friend bool operator==(const iterator& it, ::std::default_sentinel_t) noexcept { return it.stream_ == nullptr; }

   private:
    friend class DecodeStream;
    explicit iterator(DecodeStream* stream) : stream_(stream) { advance(); }
    void advance() {
      if (const ::std::optional<TokenId> token = stream_->next()) {
        token_ = *token;
      } else {
        stream_ = nullptr;
      }
    }
    DecodeStream* stream_ = nullptr;
    TokenId token_ = 0;
  };
  iterator begin(::std::source_location where = ::std::source_location::current()) {
    require_valid(where);
    return iterator(this);
  }
  ::std::default_sentinel_t end() const noexcept { return ::std::default_sentinel; }

 private:
  bool ended() const noexcept { return state_->status != DecodeStatus::running; }  // lock held
  void require_valid(const ::std::source_location& where) const {
    if (!state_) {
      throw usage_error("DecodeStream: used after it was moved from (or default-constructed)", where);
    }
  }

  DecodeHandle handle_;
  ::std::shared_ptr<State> state_;
};

}  // namespace replay
