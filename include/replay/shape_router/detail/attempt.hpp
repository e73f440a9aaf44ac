#pragma once
#include <replay/detail/require_cxx20.hpp>
// One capture attempt of a key: the whole graph, else (BreakPolicy::piecewise
// and a work that declares a break) its pieces, and the slot that holds either.
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <source_location>
#include <thread>
#include <utility>

#include "replay/shape_router/router.hpp"
#include "replay/detail/capture_observer.hpp"
#include "replay/detail/message.hpp"
#include "replay/shape_router/detail/records.hpp"
#include "replay/piecewise/region.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::attempt_capture(const Key& shape, GraphSlot* graph, stream_type stream,
                                                       const ::std::source_location& where) -> Attempt {
  const detail::ActiveRouterScope active(this);
  // The backend's captures on this thread follow the router's audit switch.
  const detail::AuditRequestScope audit(options_.audit);
  Attempt attempt;
  auto issue = [&](stream_type s) { work_(shape, s); };
  auto backoff = options_.retry_backoff;
  for (::std::uint32_t i = 0; i < options_.capture_attempts; ++i) {
    if (i > 0) {
      ++attempt.retries;
      ::std::this_thread::sleep_for(backoff);
      backoff *= 2;
    }
    try {
      if (graph != nullptr) {
        {
          ::std::unique_lock<::std::mutex> lock(mutex_);
          graph->take(lock);  // a launch that began before the key went stale ends first
        }
        const detail::RouterGraphHold<held_type> held(*graph);
        exec_type* whole = nullptr;
        if constexpr (CapturesPiecewise<Backend>) {
          whole = &::std::get<exec_type>(graph->exec);  // a piecewise entry is re-captured fresh
        } else {
          whole = &graph->exec;
        }
        attempt.updated = backend_.recapture(*whole, stream, issue, where);
      } else {
        attempt.fresh.emplace(backend_.capture(stream, issue, where));
      }
      attempt.outcome = Outcome::captured;
      break;
    } catch (const capture_interrupted_error& e) {
      ++attempt.interruptions;
      attempt.outcome = Outcome::interrupted;
      attempt.reason = e.what();
    } catch (const region_in_capture_error& e) {
      // The work declared a break (replay::eager): the policy decides.
      attempt.outcome = Outcome::breaks;
      attempt.reason = e.what();
      break;
    } catch (...) {
      attempt.outcome = Outcome::failed;
      attempt.reason = detail::describe_current_exception();
      break;
    }
  }
  return attempt;
}

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::slot_of(Attempt& attempt) -> GraphRef {
  if constexpr (CapturesPiecewise<Backend>) {
    if (attempt.pieces) {
      return ::std::make_shared<GraphSlot>(held_type(::std::in_place_type<pieces_type>, ::std::move(attempt.pieces->exec)));
    }
  }
  return ::std::make_shared<GraphSlot>(held_type(::std::move(attempt.fresh->exec)));
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::capture_pieces(::std::unique_lock<::std::mutex>& lock, const Key& shape,
                                                      Attempt& attempt, stream_type stream,
                                                      const ::std::source_location& where) {
  if constexpr (CapturesPiecewise<Backend>) {
    release_retired(lock);  // never inside a submission
    {
      // The capture runs the work on `stream`: a submission like an eager run's.
      Submission submission = enter_stream(lock, stream, where);
      lock.unlock();
      try {
        const detail::ActiveRouterScope active(this);
        const detail::AuditRequestScope audit(options_.audit);
        // Kept by the executable, run again after a region value never seen:
        // it owns the shape and refers to the router, which outlives its graphs.
        auto kept = [this, shape](stream_type s) {
          const detail::ActiveRouterScope inside(this);
          work_(shape, s);
        };
        attempt.pieces.emplace(backend_.capture_piecewise(stream, kept, where));
        attempt.outcome = Outcome::captured;
        attempt.ran = true;
      } catch (...) {
        attempt.outcome = Outcome::failed;
        attempt.reason = detail::concat("its work declares a break (replay::eager), and its piecewise capture failed: ",
                                        detail::describe_current_exception());
        attempt.partial = ::std::current_exception();
      }
      try {
        submission.issued(stream, where);
      } catch (...) {  // the mark failed: ~Submission owes the next switch a drain
      }
    }
    lock.lock();
  } else {
    (void)lock, (void)shape, (void)attempt, (void)stream, (void)where;
  }
}

}  // namespace replay
