#pragma once
#include <replay/detail/require_cxx20.hpp>
// ReplayWatchdog: reports a replay that did not finish in time, instead of a
// silent hang. A rank whose peer never launched the matching graph waits in
// its collective forever; the watchdog sees the event recorded after the
// replay still pending past the timeout and reports (rank, bucket, how long)
// once, through a callback (default: one line on stderr), and check() throws
// timeout_error from then on until the replay does finish.
//
// It polls events with cudaEventQuery from its own thread (never a device or
// stream synchronization). The policy (what is overdue, reported once, when a
// report clears) is WatchdogCore, a template over the clock and the token,
// tested on the CPU with a stand-in clock and stand-in events.
//
// Captures on other threads must use CaptureMode::this_thread or relaxed (the
// defaults of replay): under CaptureMode::global the watchdog's queries
// would break them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replay/error.hpp"
#include "replay/nccl/error.hpp"
#include "replay/nccl/stream_device.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// What is overdue and what to report. Token: whatever identifies a piece of
// work in flight (an event); Clock: a std::chrono clock or a stand-in with
// time_point, duration and now().
template <class Token, class Clock = ::std::chrono::steady_clock>
class WatchdogCore {
 public:
  using time_point = typename Clock::time_point;

  explicit WatchdogCore(::std::chrono::milliseconds timeout) : timeout_(timeout) {}

  void add(Token token, int rank, int device, ::std::string what, time_point now) {
    pending_.push_back(Pending{::std::move(token), rank, device, ::std::move(what), now, false});
  }

  // Drops finished work (done(token) true; recycle(token) gets the token
  // back) and returns the work newly overdue at `now`, each reported once.
  template <class Done, class Recycle>
  ::std::vector<StuckWork> poll(time_point now, Done&& done, Recycle&& recycle) {
    ::std::vector<StuckWork> overdue;
    auto keep = pending_.begin();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (done(it->token)) {
        recycle(::std::move(it->token));
        continue;
      }
      const auto waited = ::std::chrono::duration_cast<::std::chrono::milliseconds>(now - it->start);
      if (!it->reported && waited >= timeout_) {
        it->reported = true;
        overdue.push_back(StuckWork{it->rank, it->device, it->what, waited});
      }
      if (keep != it) {
        *keep = ::std::move(*it);
      }
      ++keep;
    }
    pending_.erase(keep, pending_.end());
    return overdue;
  }

  // The oldest reported work that has not finished yet, as of `now`.
  ::std::optional<StuckWork> stuck(time_point now) const {
    for (const Pending& p : pending_) {
      if (p.reported) {
        return StuckWork{p.rank, p.device, p.what,
                         ::std::chrono::duration_cast<::std::chrono::milliseconds>(now - p.start)};
      }
    }
    return ::std::nullopt;
  }

  ::std::size_t pending() const noexcept { return pending_.size(); }
  ::std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  struct Pending {
    Token token;
    int rank;
    int device;
    ::std::string what;
    time_point start;
    bool reported;
  };
  ::std::chrono::milliseconds timeout_;
  ::std::vector<Pending> pending_;
};

// Called on the watchdog's thread, once per overdue replay. Must not throw
// (what it throws is dropped) and must not call back into the watchdog.
using StuckHandler = ::std::function<void(const StuckWork&)>;

struct WatchdogOptions {
  ::std::chrono::milliseconds timeout{10'000};
  ::std::chrono::milliseconds poll_interval{5};
  StuckHandler on_stuck{};  // empty: one line on stderr
};

class ReplayWatchdog {
 public:
  explicit ReplayWatchdog(WatchdogOptions options = {},
                          ::std::source_location where = ::std::source_location::current())
      : core_(options.timeout), poll_(options.poll_interval), on_stuck_(::std::move(options.on_stuck)) {
    if (options.timeout.count() <= 0 || options.poll_interval.count() <= 0) {
      throw usage_error("ReplayWatchdog: timeout and poll_interval must be positive", where);
    }
    thread_ = ::std::thread([this] { loop(); });
  }

  ReplayWatchdog(const ReplayWatchdog&) = delete;
  ReplayWatchdog& operator=(const ReplayWatchdog&) = delete;
  ReplayWatchdog(ReplayWatchdog&&) = delete;
  ReplayWatchdog& operator=(ReplayWatchdog&&) = delete;

  // Stops the thread. Work still pending is no longer watched.
  ~ReplayWatchdog() {
    {
      ::std::lock_guard<::std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    for (const Token& t : free_) {
      (void)::cudaEventDestroy(t.event);
    }
    core_.poll(
        Clock::now(), [](const Token&) { return true; }, [](Token t) { (void)::cudaEventDestroy(t.event); });
  }

  // Watches the work issued so far on `stream` (an event recorded on it):
  // `what` and `rank` name it in a report. Not during capture.
  void watch(int rank, ::std::string what, StreamRef stream,
             ::std::source_location where = ::std::source_location::current()) {
    const int device = stream_device(stream, where);
    Token token = take_event(device, where);
    const ::cudaError_t recorded = ::cudaEventRecord(token.event, stream.get());
    if (recorded != ::cudaSuccess) {
      give_back(token);
      check(recorded, "cudaEventRecord", where);
    }
    ::std::lock_guard<::std::mutex> lock(mutex_);
    core_.add(token, rank, device, ::std::move(what), Clock::now());
  }

  // Throws timeout_error while a reported replay has not finished.
  void check_healthy(::std::source_location where = ::std::source_location::current()) const {
    if (auto stuck = this->stuck()) {
      throw timeout_error(::std::move(*stuck),
                          "a replay is stuck (a rank that never launched the matching collective, or a hung "
                          "kernel); abort the communicator (Communicator::abort) to release it",
                          where);
    }
  }

  // The oldest overdue replay that has not finished, if any.
  ::std::optional<StuckWork> stuck() const {
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return core_.stuck(Clock::now());
  }
  ::std::size_t pending() const {
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return core_.pending();
  }
  // Reports made since construction.
  ::std::size_t reports() const {
    ::std::lock_guard<::std::mutex> lock(mutex_);
    return reports_;
  }
  ::std::chrono::milliseconds timeout() const noexcept { return core_.timeout(); }

 private:
  using Clock = ::std::chrono::steady_clock;
  struct Token {
    ::cudaEvent_t event;
    int device;
  };

  Token take_event(int device, const ::std::source_location& where) {
    {
      ::std::lock_guard<::std::mutex> lock(mutex_);
      const auto it = ::std::find_if(free_.begin(), free_.end(), [&](const Token& t) { return t.device == device; });
      if (it != free_.end()) {
        Token t = *it;
        free_.erase(it);
        return t;
      }
    }
    ScopedDevice on(device, where);  // an event belongs to the device current when it is made
    ::cudaEvent_t event = nullptr;
    check(::cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags", where);
    return Token{event, device};
  }
  void give_back(Token t) {
    ::std::lock_guard<::std::mutex> lock(mutex_);
    free_.push_back(t);
  }

  void loop() {
    int current = -1;
    ::std::unique_lock<::std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, poll_, [this] { return stop_; });
      if (stop_) {
        break;
      }
      auto done = [&current](const Token& t) {
        if (t.device != current && ::cudaSetDevice(t.device) == ::cudaSuccess) {
          current = t.device;
        }
        const ::cudaError_t status = ::cudaEventQuery(t.event);
        if (status == ::cudaSuccess) {
          return true;
        }
        (void)::cudaGetLastError();  // this thread's own query; not-ready is an answer
        // An error (a failed kernel, a lost device): the work will not finish
        // later either; stop watching it, the launching thread sees the error.
        return status != ::cudaErrorNotReady;
      };
      auto recycle = [this](Token t) { free_.push_back(t); };
      ::std::vector<StuckWork> overdue = core_.poll(Clock::now(), done, recycle);
      if (overdue.empty()) {
        continue;
      }
      reports_ += overdue.size();
      lock.unlock();
      for (const StuckWork& s : overdue) {
        report(s);
      }
      lock.lock();
    }
  }

  void report(const StuckWork& s) noexcept {
    try {
      if (on_stuck_) {
        on_stuck_(s);
      } else {
        const ::std::string line = "replay::ReplayWatchdog: " + s.describe() + "\n";
        ::std::fputs(line.c_str(), stderr);
      }
    } catch (...) {
      // A failing handler must not take the watchdog down.
    }
  }

  WatchdogCore<Token, Clock> core_;
  ::std::chrono::milliseconds poll_;
  StuckHandler on_stuck_;
  mutable ::std::mutex mutex_;
  ::std::condition_variable wake_;
  ::std::vector<Token> free_;
  ::std::size_t reports_ = 0;
  bool stop_ = false;
  ::std::thread thread_;  // last: starts after every member above exists
};

}  // namespace replay
