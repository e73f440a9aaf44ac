#pragma once
#include <replay/detail/require_cxx20.hpp>
// MultiRankRouter: a ShapeRouter per rank whose ranks always replay the same
// graph. Each step, run(key, stream) first agrees with the other ranks on the
// bucket (agree_on_shape: an all-reduce of the padded key, max), then runs
// the agreed shape on this rank's router, and hands the replay to a watchdog
// that reports it if it does not finish in time.
//
//   replay::ShapeRouter<int> router(work, options);            // work issues kernels + collectives
//   replay::NcclAgreement agreement(comm);
//   replay::ReplayWatchdog watchdog({.timeout = std::chrono::seconds(5)});
//   replay::MultiRankRouter<int> ranks(router, agreement, &watchdog);
//   ranks.capture_all(stream);                                  // every rank, same buckets, same order
//   const int shape = ranks.agree(batch, stream);               // pad inputs up to this
//   ranks.run_agreed(shape, stream);
//
// The router must warm up (options.warmup_runs >= 1): NCCL sets up its
// connections on a collective's first eager run, which must not happen inside
// a capture. Every rank's router needs the same options; the ranks' calls
// (capture_all, agree, run) must come in the same order on every rank.
// The work runs with the stream's device current, whatever device the
// calling thread had. The router, agreement and watchdog are borrowed: they
// must outlive this object, and the communicator must outlive the router.
#include <cstddef>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>

#include "replay/shape_router/keys.hpp"
#include "replay/error.hpp"
#include "replay/nccl/agreement.hpp"
#include "replay/nccl/stream_device.hpp"
#include "replay/nccl/watchdog.hpp"
#include "replay/shape_router.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// What MultiRankRouter::run did: the agreed shape and the route on this rank.
template <class Key>
struct MultiRankRoute {
  Key agreed;        // the shape every rank ran
  Route<Key> route;  // what this rank's router did with it
};

// A watchdog: watch(rank, what, stream) and check_healthy(where).
template <class W, class Stream>
concept ReplayMonitor = requires(W& w, int rank, ::std::string what, Stream stream, ::std::source_location where) {
  w.watch(rank, what, stream, where);
  w.check_healthy(where);
};

template <ShapeKey Key, class Router = ShapeRouter<Key>, class Agreement = NcclAgreement,
          class Monitor = ReplayWatchdog>
  requires AgreementBackend<Agreement, typename Router::stream_type> &&
           ReplayMonitor<Monitor, typename Router::stream_type>
class MultiRankRouter {
 public:
  using key_type = Key;
  using stream_type = typename Router::stream_type;

  // `monitor` may be null (no watchdog). usage_error when the router does not
  // warm up before capturing.
  MultiRankRouter(Router& router, Agreement& agreement, Monitor* monitor = nullptr,
                  ::std::source_location where = ::std::source_location::current())
      : router_(&router), agreement_(&agreement), monitor_(monitor) {
    if constexpr (requires { router.options().warmup_runs; }) {
      if (router.options().warmup_runs < 1) {
        throw usage_error("MultiRankRouter: the router's options.warmup_runs is 0; set it to at least 1: NCCL "
                          "sets up a collective's connections on its first run, which must be eager, not inside "
                          "a capture",
                          where);
      }
    }
  }

  int rank() const noexcept { return agreement_->rank(); }
  int size() const noexcept { return agreement_->size(); }
  Router& router() noexcept { return *router_; }

  // The shape every rank will run this step: the maximum over ranks of the
  // padded key. Collective. A rank whose key cannot be routed throws
  // usage_error, one whose watchdog reports a stuck replay timeout_error,
  // and the others agreement_error, all for the same step; timeout_error
  // (NcclAgreement) when a rank never joins.
  Key agree(const Key& key, stream_type stream, ::std::source_location where = ::std::source_location::current()) {
    return agree_on_shape(*router_, key, *agreement_, stream, where, [&] {
      if (monitor_ != nullptr) {
        monitor_->check_healthy(where);
      }
    });
  }

  // Runs a shape returned by agree() (the same on every rank), then watches it.
  Route<Key> run_agreed(const Key& agreed, stream_type stream,
                        ::std::source_location where = ::std::source_location::current()) {
    Route<Key> route = with_stream_device(stream, where, [&] { return router_->run(agreed, stream, where); });
    if (monitor_ != nullptr) {
      monitor_->watch(rank(), describe(route), stream, where);
    }
    return route;
  }

  // agree() then run_agreed(). The work sees the agreed (padded) shape; it
  // must read inputs valid for that shape (pad them, e.g. zeros).
  MultiRankRoute<Key> run(const Key& key, stream_type stream,
                          ::std::source_location where = ::std::source_location::current()) {
    const Key agreed = agree(key, stream, where);
    return MultiRankRoute<Key>{agreed, run_agreed(agreed, stream, where)};
  }

  // Captures every bucket (after its eager warm-ups), largest first; the same
  // list and order on every rank, so the warm-ups' collectives match.
  ::std::size_t capture_all(stream_type stream, ::std::source_location where = ::std::source_location::current()) {
    return with_stream_device(stream, where, [&] { return router_->capture_all(stream, where); });
  }

 private:
  template <class F>
  static decltype(auto) with_stream_device(stream_type stream, const ::std::source_location& where, F&& f) {
    if constexpr (::std::is_convertible_v<stream_type, StreamRef>) {
      ScopedDevice on(StreamRef(stream), where);
      return f();
    } else {
      return f();
    }
  }

  static ::std::string describe(const Route<Key>& route) {
    return detail::concat(route.graph() ? "replay of bucket " : "eager run of shape ",
                          describe_key(route.shape), " (", to_string(route.kind), ")");
  }

  Router* router_;
  Agreement* agreement_;
  Monitor* monitor_;
};

}  // namespace replay
