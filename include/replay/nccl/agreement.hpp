#pragma once
#include <replay/detail/require_cxx20.hpp>
// Bucket agreement: before a step, every rank must choose the same graph, or
// the collectives inside the graphs do not match and the ranks hang. Each
// rank pads its own key to its bucket; the ranks then take the element-wise
// maximum of the padded keys (an all-reduce with max), which is a bucket
// shape covering every rank's input, and all replay that one.
//
// agree_on_shape() is the policy, a template over the router (anything with
// padded_shape(key, where)) and over the agreement backend:
//   NcclAgreement   an ncclAllReduce(max) on the communicator, in stream
//                   order; the host waits for the answer with a timeout
//                   (timeout_error, never a silent hang);
//   HostAgreement   threads of one process (one thread per GPU), with no
//                   device work at all; also the CPU tests' stand-in.
// A rank whose key cannot be routed (a zero extent, an oversize key under
// OversizePolicy::throw_error) still takes part, with an error flag, so that
// every rank throws for that step instead of the others hanging.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "replay/shape_router/keys.hpp"
#include "replay/error.hpp"
#include "replay/event.hpp"
#include "replay/nccl/collectives.hpp"
#include "replay/nccl/communicator.hpp"
#include "replay/nccl/error.hpp"
#include "replay/nccl/stream_device.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// An agreement backend for streams of type Stream: reduce_max(values, stream,
// where) is collective (every rank calls it, in the same order) and leaves
// in `values` the element-wise maximum over the ranks; rank() and size().
template <class A, class Stream>
concept AgreementBackend = requires(A& a, ::std::span<::std::int64_t> values, Stream stream,
                                    ::std::source_location where) {
  a.reduce_max(values, stream, where);
  { a.rank() } -> ::std::convertible_to<int>;
  { a.size() } -> ::std::convertible_to<int>;
};

// The largest key rank this header agrees on (extents plus one error flag).
inline constexpr ::std::size_t max_agreement_values = 16;

// Some rank could not take part in a step (its key could not be routed, or
// its watchdog reports a stuck replay), so no rank runs it.
class agreement_error : public ::std::runtime_error {
 public:
  agreement_error(int failed_rank, ::std::string_view what,
                  ::std::source_location where = ::std::source_location::current())
      : ::std::runtime_error("replay: " + ::std::string(what) + " at " + replay::to_string(where)),
        failed_rank_(failed_rank) {}
  // The highest rank that could not take part.
  int failed_rank() const noexcept { return failed_rank_; }

 private:
  int failed_rank_;
};

namespace detail {
struct NoRefusal {
  void operator()() const noexcept {}
};
}  // namespace detail

// The bucket shape every rank runs: the element-wise maximum over the ranks
// of router.padded_shape(key). Collective: every rank calls it once per step.
// `refuse`, when set, is called first and may throw to keep this rank out of
// the step (a stuck replay): the rank still takes part, flagged, and rethrows.
// A rank whose own key or `refuse` failed rethrows its own exception; the
// others throw agreement_error naming it.
template <ShapeKey Key, class Router, class Agreement, class Stream, class Refuse = detail::NoRefusal>
  requires AgreementBackend<Agreement, Stream>
Key agree_on_shape(const Router& router, const Key& key, Agreement& agreement, Stream stream,
                   ::std::source_location where = ::std::source_location::current(), Refuse&& refuse = {}) {
  constexpr ::std::size_t rank = shape_traits<Key>::rank;
  static_assert(rank + 1 <= max_agreement_values, "agree_on_shape: the key has too many dimensions");
  ::std::array<::std::int64_t, rank + 1> values{};
  ::std::exception_ptr local_failure;
  try {
    refuse();
    const Key padded = router.padded_shape(key, where);
    for (::std::size_t d = 0; d < rank; ++d) {
      values[d] = shape_traits<Key>::extent(padded, d);
    }
  } catch (...) {
    // Take part anyway, flagged, so that no other rank waits for this one.
    values.fill(0);
    values[rank] = agreement.rank() + 1;
    local_failure = ::std::current_exception();
  }
  agreement.reduce_max(::std::span<::std::int64_t>(values), stream, where);
  if (local_failure) {
    ::std::rethrow_exception(local_failure);
  }
  if (values[rank] != 0) {
    const int failed = static_cast<int>(values[rank] - 1);
    throw agreement_error(failed, detail::concat("rank ", failed, " could not take part in this step (a key it cannot "
                                                 "route, or a stuck replay), so no rank runs it; rank ",
                                                 agreement.rank(), " had key ", describe_key(key)),
                          where);
  }
  Key agreed = key;
  for (::std::size_t d = 0; d < rank; ++d) {
    shape_traits<Key>::set_extent(agreed, d, values[d]);
  }
  return agreed;
}

// Agreement through an NCCL all-reduce (max) on the communicator, issued on
// the stream given to reduce_max (after the work already there, before what
// follows: the same order on every rank as the other collectives). The host
// then waits for the answer, polling an event, and throws timeout_error
// (marking the communicator failed) when it does not come in time: a rank
// that never joined.
class NcclAgreement {
 public:
  explicit NcclAgreement(Communicator& comm, ::std::chrono::milliseconds timeout = ::std::chrono::seconds(60),
                         ::std::source_location where = ::std::source_location::current())
      : comm_(&comm), timeout_(timeout), device_(comm.device()) {
    if (timeout.count() <= 0) {
      throw usage_error("NcclAgreement: the timeout must be positive", where);
    }
    ScopedDevice on(device_, where);
    device_values_ = DeviceBuffer<::std::int64_t>(max_agreement_values, where);
    host_values_ = PinnedBuffer<::std::int64_t>(max_agreement_values, where);
    done_.emplace(EventFlags::disable_timing, where);
  }

  int rank() const noexcept { return comm_->rank(); }
  int size() const noexcept { return comm_->size(); }
  ::std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  void reduce_max(::std::span<::std::int64_t> values, StreamRef stream,
                  ::std::source_location where = ::std::source_location::current()) {
    if (values.empty() || values.size() > max_agreement_values) {
      throw usage_error(detail::concat("NcclAgreement::reduce_max: 1 to ", max_agreement_values, " values, got ",
                                       values.size()),
                        where);
    }
    if (stream.is_capturing(where)) {
      throw usage_error("NcclAgreement::reduce_max on a capturing stream: the host must read the answer, so "
                        "agreement runs outside captures (MultiRankRouter::run does)",
                        where);
    }
    ScopedDevice on(device_, where);
    const auto count = values.size();
    ::std::memcpy(host_values_.data(), values.data(), count * sizeof(::std::int64_t));
    BufferView<::std::int64_t> dev = device_values_.first(count, where);
    BufferView<::std::int64_t, MemorySpace::pinned_host> host = host_values_.first(count, where);
    dev.copy_from(host, stream, where);
    all_reduce(*comm_, dev, ReduceOp::max, stream, where);
    host.copy_from(dev, stream, where);
    done_->record(stream, where);
    wait(values, where);
    ::std::memcpy(values.data(), host_values_.data(), count * sizeof(::std::int64_t));
  }

 private:
  void wait(::std::span<const ::std::int64_t> values, const ::std::source_location& where) {
    const auto start = ::std::chrono::steady_clock::now();
    const auto spin_until = start + ::std::chrono::microseconds(200);
    for (;;) {
      if (done_->ready(where)) {
        return;
      }
      const auto now = ::std::chrono::steady_clock::now();
      if (now - start >= timeout_) {
        comm_->mark_failed();
        ::std::string what = "bucket agreement (values";
        for (::std::int64_t v : values) {
          what += ' ' + ::std::to_string(v);
        }
        what += ')';
        throw timeout_error(
            StuckWork{rank(), device_, what, ::std::chrono::duration_cast<::std::chrono::milliseconds>(now - start)},
            "another rank never joined the all-reduce (it stopped, or it is issuing different collectives); the "
            "communicator is marked failed",
            where);
      }
      if (now < spin_until) {
        ::std::this_thread::yield();
      } else {
        ::std::this_thread::sleep_for(::std::chrono::microseconds(20));
      }
    }
  }

  Communicator* comm_;
  ::std::chrono::milliseconds timeout_;
  int device_;
  DeviceBuffer<::std::int64_t> device_values_;
  PinnedBuffer<::std::int64_t> host_values_;
  ::std::optional<Event> done_;  // made on the communicator's device
};

// The shared state of HostAgreement: one per group of threads.
class HostAgreementGroup {
 public:
  explicit HostAgreementGroup(int ranks, ::std::chrono::milliseconds timeout = ::std::chrono::seconds(60),
                              ::std::source_location where = ::std::source_location::current())
      : ranks_(ranks), timeout_(timeout) {
    if (ranks < 1 || timeout.count() <= 0) {
      throw usage_error("HostAgreementGroup: ranks must be at least 1 and the timeout positive", where);
    }
  }
  int size() const noexcept { return ranks_; }

  // Collective over the group's threads: values becomes the element-wise max.
  void reduce_max(int rank, ::std::span<::std::int64_t> values, const ::std::source_location& where) {
    ::std::unique_lock<::std::mutex> lock(mutex_);
    if (broken_) {
      throw usage_error("HostAgreementGroup: an earlier agreement timed out; the group is unusable", where);
    }
    if (arrived_ == 0) {
      acc_.assign(values.begin(), values.end());
    } else if (acc_.size() != values.size()) {
      broken_ = true;
      wake_.notify_all();
      throw usage_error(detail::concat("HostAgreementGroup: rank ", rank, " agrees on ", values.size(),
                                       " values but another rank on ", acc_.size()),
                        where);
    } else {
      for (::std::size_t i = 0; i < values.size(); ++i) {
        acc_[i] = ::std::max(acc_[i], values[i]);
      }
    }
    const ::std::uint64_t generation = generation_;
    if (++arrived_ == ranks_) {
      result_ = acc_;
      arrived_ = 0;
      ++generation_;
      wake_.notify_all();
    } else {
      const auto start = ::std::chrono::steady_clock::now();
      if (!wake_.wait_for(lock, timeout_, [&] { return generation_ != generation || broken_; })) {
        broken_ = true;
        wake_.notify_all();
        throw timeout_error(StuckWork{rank, -1, "bucket agreement between threads",
                                      ::std::chrono::duration_cast<::std::chrono::milliseconds>(
                                          ::std::chrono::steady_clock::now() - start)},
                            "another thread of the group never joined", where);
      }
      if (generation_ == generation) {  // broken while waiting
        throw usage_error("HostAgreementGroup: another rank failed during this agreement", where);
      }
    }
    ::std::copy(result_.begin(), result_.end(), values.begin());
  }

 private:
  int ranks_;
  ::std::chrono::milliseconds timeout_;
  ::std::mutex mutex_;
  ::std::condition_variable wake_;
  int arrived_ = 0;
  ::std::uint64_t generation_ = 0;
  bool broken_ = false;
  ::std::vector<::std::int64_t> acc_;
  ::std::vector<::std::int64_t> result_;
};

// Agreement between the threads of one process (one thread per rank): no
// device work, no synchronization of any stream. Any stream type.
class HostAgreement {
 public:
  HostAgreement(HostAgreementGroup& group, int rank, ::std::source_location where = ::std::source_location::current())
      : group_(&group), rank_(rank) {
    if (rank < 0 || rank >= group.size()) {
      throw usage_error(detail::concat("HostAgreement: rank ", rank, " is not in [0, ", group.size(), ")"), where);
    }
  }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return group_->size(); }

  template <class Stream>
  void reduce_max(::std::span<::std::int64_t> values, Stream /*stream*/,
                  ::std::source_location where = ::std::source_location::current()) {
    group_->reduce_max(rank_, values, where);
  }

 private:
  HostAgreementGroup* group_;
  int rank_;
};

}  // namespace replay
