#pragma once
// Fork/join between streams. fork() makes branch streams wait for the work
// issued so far on an origin stream; join() makes the origin wait for the
// branches. During a capture on the origin, fork() pulls the branches into the
// same capture and join() merges them back, which CUDA requires before the
// capture can end (otherwise cudaErrorStreamCaptureUnjoined).
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <initializer_list>
#include <source_location>
#include <span>
#include <vector>

#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// `waiter` waits (on the device) for all work issued so far on `signaler`.
inline void stream_wait(StreamRef waiter, StreamRef signaler,
                        ::std::source_location where = ::std::source_location::current()) {
  Event marker(EventFlags::disable_timing, where);
  marker.record(signaler, where);
  marker.wait_on(waiter, where);
  // Destroying a recorded event is safe: CUDA releases it once it completes.
}

inline void fork(StreamRef origin, ::std::span<const StreamRef> branches,
                 ::std::source_location where = ::std::source_location::current()) {
  if (branches.empty()) {
    return;
  }
  // Validate everything before the first CUDA call: a half-done fork inside a
  // capture would leave the branches already forked unjoined.
  for (StreamRef branch : branches) {
    if (branch == origin) {
      throw usage_error("fork(): a branch stream equals the origin stream", where);
    }
  }
  Event marker(EventFlags::disable_timing, where);
  marker.record(origin, where);
  for (StreamRef branch : branches) {
    marker.wait_on(branch, where);
  }
}
inline void fork(StreamRef origin, ::std::initializer_list<StreamRef> branches,
                 ::std::source_location where = ::std::source_location::current()) {
  fork(origin, ::std::span<const StreamRef>(branches.begin(), branches.size()), where);
}

inline void join(StreamRef origin, ::std::span<const StreamRef> branches,
                 ::std::source_location where = ::std::source_location::current()) {
  for (StreamRef branch : branches) {
    stream_wait(origin, branch, where);
  }
}
inline void join(StreamRef origin, ::std::initializer_list<StreamRef> branches,
                 ::std::source_location where = ::std::source_location::current()) {
  join(origin, ::std::span<const StreamRef>(branches.begin(), branches.size()), where);
}

// RAII fork: forks on construction and joins on join() or, at the latest, in
// its destructor (without throwing), so that an exception between fork and
// join cannot leave a capture with unjoined streams.
class ScopedFork {
 public:
  ScopedFork(StreamRef origin, ::std::initializer_list<StreamRef> branches,
             ::std::source_location where = ::std::source_location::current())
      : origin_(origin), branches_(branches) {
    fork(origin_, branches_, where);
  }
  ScopedFork(StreamRef origin, ::std::span<const StreamRef> branches,
             ::std::source_location where = ::std::source_location::current())
      : origin_(origin), branches_(branches.begin(), branches.end()) {
    fork(origin_, branches_, where);
  }
  ScopedFork(const ScopedFork&) = delete;
  ScopedFork& operator=(const ScopedFork&) = delete;
  ScopedFork(ScopedFork&&) = delete;
  ScopedFork& operator=(ScopedFork&&) = delete;

  void join(::std::source_location where = ::std::source_location::current()) {
    if (!joined_) {
      replay::join(origin_, branches_, where);
      joined_ = true;  // only now: if a join threw, the destructor joins them all again (harmless)
    }
  }
  bool joined() const noexcept { return joined_; }
  ~ScopedFork() {
    if (joined_) {
      return;
    }
    for (StreamRef branch : branches_) {
      ::cudaEvent_t marker = nullptr;
      if (::cudaEventCreateWithFlags(&marker, cudaEventDisableTiming) == ::cudaSuccess) {
        (void)::cudaEventRecord(marker, branch.get());
        (void)::cudaStreamWaitEvent(origin_.get(), marker, 0);
        (void)::cudaEventDestroy(marker);
      }
    }
  }

 private:
  StreamRef origin_;
  ::std::vector<StreamRef> branches_;
  bool joined_ = false;
};

}  // namespace replay
