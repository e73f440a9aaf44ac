#pragma once
#include <replay/detail/require_cxx20.hpp>
// ShapeRouter's capture machinery: misses, warm-ups, captures and re-captures, retries, failure reports.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <source_location>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replay/shape_router/router.hpp"
#include "replay/detail/capture_observer.hpp"
#include "replay/detail/message.hpp"
#include "replay/shape_router/detail/records.hpp"
#include "replay/shape_router/detail/keys.hpp"
#include "replay/piecewise/region.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

template <RouterKey Key, GraphBackend Backend>
inline ::std::size_t ShapeRouter<Key, Backend>::capture_all(stream_type stream, const progress_type& progress,
                                                            ::std::source_location where) {
  if (options_.policy != RoutingPolicy::bucketed) {
    throw usage_error("ShapeRouter::capture_all(stream) needs RoutingPolicy::bucketed; with the exact "
                      "policy pass the keys: capture(keys, stream)",
                      where);
  }
  const ::std::vector<Key> shapes = bucket_shapes();
  return capture(::std::span<const Key>(shapes), stream, progress, where);
}

template <RouterKey Key, GraphBackend Backend>
inline ::std::size_t ShapeRouter<Key, Backend>::capture(::std::span<const Key> keys, stream_type stream,
                                                        const progress_type& progress, ::std::source_location where) {
  refuse_reentry(where);
  ::std::vector<Key> shapes;
  shapes.reserve(keys.size());
  for (const Key& key : keys) {
    const Planned planned = Plan::plan(options_, key, where);
    if (!planned.oversize && ::std::find(shapes.begin(), shapes.end(), planned.shape) == shapes.end()) {
      shapes.push_back(planned.shape);
    }
  }
  Plan::sort_largest_first(shapes);
  {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    admit_stream(stream, false, where);  // its warm-ups run on `stream`
  }
  ::std::atomic<::std::size_t> next{0};
  ::std::atomic<::std::size_t> with_graph{0};
  ::std::size_t done = 0;
  ::std::mutex progress_mutex;  // one progress call at a time, `done` in order
  ::std::exception_ptr first_error;
  auto capture_shapes = [&] {
    for (::std::size_t i = next++; i < shapes.size(); i = next++) {
      try {
        with_graph += capture_one(shapes[i], stream, where) ? 1 : 0;
        const ::std::lock_guard<::std::mutex> lock(progress_mutex);
        ++done;
        if (progress) {
          const detail::ActiveRouterScope active(this);
          progress(done, shapes.size(), shapes[i]);
        }
      } catch (...) {
        const ::std::lock_guard<::std::mutex> lock(progress_mutex);
        if (first_error == nullptr) {
          first_error = ::std::current_exception();
        }
        next = shapes.size();  // the others stop after their current shape
      }
    }
  };
  const ::std::size_t helpers =
      ::std::min<::std::size_t>(options_.capture_threads, shapes.size() == 0 ? 1 : shapes.size()) - 1;
  ::std::vector<::std::thread> threads;
  threads.reserve(helpers);
  try {
    for (::std::size_t t = 0; t < helpers; ++t) {
      threads.emplace_back(capture_shapes);
    }
  } catch (...) {  // fewer threads than asked: the rest still runs
  }
  capture_shapes();
  for (::std::thread& thread : threads) {
    thread.join();
  }
  if (first_error != nullptr) {
    ::std::rethrow_exception(first_error);
  }
  return with_graph.load();
}

template <RouterKey Key, GraphBackend Backend>
Route<Key> ShapeRouter<Key, Backend>::run_miss(::std::unique_lock<::std::mutex>& lock, const Key& shape,
                                               stream_type stream, const ::std::source_location& where) {
  ++stats_.misses;
  const EntryRef entry = entry_for(shape);
  switch (entry->state) {
    case State::warming:
      if (++entry->warmups >= options_.warmup_runs) {
        entry->state = State::ready;
      }
      ++stats_.warmups;
      issue_eager(lock, shape, stream, where);
      return Route<Key>{shape, RouteKind::warmup};
    case State::ready:
    case State::stale: {
      if (entry->interrupted_rounds > 0 && Clock::now() < entry->retry_at) {
        break;  // cooling down after an interrupted capture: eager (busy)
      }
      const bool recapture = entry->state == State::stale;
      bool ran = false;
      ::std::exception_ptr partial;
      GraphRef graph = capture_locked(lock, entry, stream, where, &ran, &partial);
      if (partial != nullptr) {
        // A piecewise capture ran part of the work on the stream, then
        // failed: running it again eagerly would repeat that part.
        ::std::rethrow_exception(partial);
      }
      if (graph) {
        if (!ran) {
          launch(lock, ::std::move(graph), stream, where);
        }  // else the piecewise capture was this run
        return Route<Key>{shape, recapture ? RouteKind::recaptured : RouteKind::captured};
      }
      if (entry->state == State::eager_only) {
        ++stats_.eager_fallbacks;
        issue_eager(lock, shape, stream, where);
        return Route<Key>{shape, RouteKind::eager_fallback};
      }
      break;
    }
    case State::eager_only:
      ++stats_.eager_fallbacks;
      issue_eager(lock, shape, stream, where);
      return Route<Key>{shape, RouteKind::eager_fallback};
    case State::capturing:
      break;
    case State::captured: {  // captured by another thread since run() looked
      ++entry->replays;
      launch(lock, entry->graph, stream, where);
      return Route<Key>{shape, RouteKind::replayed};
    }
  }
  ++stats_.eager_busy;
  issue_eager(lock, shape, stream, where);
  return Route<Key>{shape, RouteKind::eager_busy};
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::capture_one(const Key& shape, stream_type stream,
                                                   const ::std::source_location& where) {
  ::std::unique_lock<::std::mutex> lock(mutex_);
  // Until the shape has its verdict: a graph, or marked eager (and reported).
  // An interrupted capture is retried here, round after round, rather than
  // left for later runs; capture_locked() turns the last interrupted round
  // into a failure of the shape's own.
  for (;;) {
    const EntryRef entry = entry_for(shape);
    switch (entry->state) {
      case State::captured: return true;
      case State::eager_only: return false;
      case State::capturing: {
        // Another thread's run captures it: wait for that capture's end.
        lock.unlock();
        ::std::this_thread::sleep_for(::std::min<::std::chrono::microseconds>(options_.retry_backoff, ::std::chrono::milliseconds(1)));
        lock.lock();
        continue;
      }
      default: break;
    }
    if (entry->state != State::stale && (live_graphs_ >= options_.max_graphs || total_bytes_ >= options_.max_bytes)) {
      return false;  // the limits stop capture_all here: not a failure
    }
    while (entry->state == State::warming) {
      if (++entry->warmups >= options_.warmup_runs) {
        entry->state = State::ready;
      }
      ++stats_.warmups;
      issue_eager(lock, shape, stream, where);
      lock.lock();
      if (entry->detached) {
        return false;
      }
    }
    if (entry->state != State::ready && entry->state != State::stale) {
      continue;  // another thread got there meanwhile: see what it left
    }
    if (entry->interrupted_rounds > 0) {
      // Interrupted before: sleep out the cool-down instead of serving eagerly.
      if (const auto now = Clock::now(); now < entry->retry_at) {
        const auto until = entry->retry_at;
        lock.unlock();
        ::std::this_thread::sleep_until(until);
        lock.lock();
        continue;
      }
    }
    const bool captured = capture_locked(lock, entry, stream, where) != nullptr;
    release_retired(lock);
    if (captured) {
      return true;
    }
    if (entry->detached) {
      return false;  // forgotten meanwhile (clear(), max_entries)
    }
    // Eager now (a failure, reported) or interrupted: the loop decides.
  }
}

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::capture_locked(::std::unique_lock<::std::mutex>& lock,
                                                      const EntryRef& entry, stream_type stream,
                                                      const ::std::source_location& where, bool* ran,
                                                      ::std::exception_ptr* partial) -> GraphRef {
  // A piecewise entry is re-captured piecewise, whole: its executable is
  // replaced once the new one exists (a PiecewiseExec is not updated in place).
  const bool was_piecewise = entry->piecewise && entry->graph != nullptr;
  const bool recapture = entry->state == State::stale && !was_piecewise;
  const State before = entry->state;
  GraphRef graph = recapture ? entry->graph : nullptr;
  entry->state = State::capturing;
  entry->invalidated_in_capture = false;
  Handler handler = on_capture_failure_;
  Attempt attempt;
  if (was_piecewise) {
    attempt.outcome = Outcome::breaks;  // its work declared breaks before: no whole capture to try
  } else {
    lock.unlock();
    attempt = attempt_capture(entry->shape, graph.get(), stream, where);
    lock.lock();
  }
  stats_.interrupted_captures += attempt.interruptions;
  stats_.capture_retries += attempt.retries;
  if (attempt.outcome == Outcome::breaks) {
    if constexpr (CapturesPiecewise<Backend>) {
      if (options_.breaks == BreakPolicy::piecewise) {
        try {
          capture_pieces(lock, entry->shape, attempt, stream, where);
        } catch (...) {  // not the capture's failure (e.g. the stream refused): the key has no verdict
          entry->state = before;
          throw;
        }
      }
    }
    if (attempt.outcome == Outcome::breaks) {
      attempt.outcome = Outcome::failed;
      attempt.reason = detail::concat(
          attempt.reason, " (the work declares a break: ShapeRouterOptions::breaks = BreakPolicy::piecewise "
                          "would capture this key piecewise)");
    }
  }
  if (ran != nullptr) {
    *ran = attempt.ran;
  }
  if (partial != nullptr) {
    *partial = attempt.partial;
  }
  if (attempt.outcome == Outcome::interrupted) {
    if (++entry->interrupted_rounds < max_interrupted_rounds) {
      entry->state = recapture ? State::stale : State::ready;
      const ::std::uint32_t round = ::std::min<::std::uint32_t>(entry->interrupted_rounds - 1, 10);
      entry->retry_at = Clock::now() + options_.retry_backoff * (1U << round);
      return nullptr;
    }
    // Interrupted every time, round after round: most likely the work
    // itself breaks the capture in a way that looks external (a raw call
    // whose error was overwritten). Treated as its own failure.
    attempt.outcome = Outcome::failed;
    attempt.reason = detail::concat("every capture attempt was interrupted (", max_interrupted_rounds, " rounds of ",
                                    options_.capture_attempts, "); last: ", attempt.reason);
  }
  if (attempt.outcome == Outcome::failed) {
    if (!entry->detached) {
      if (entry->graph) {
        drop_graph(*entry, State::eager_only);
      }
      entry->state = State::eager_only;
      entry->interrupted_rounds = 0;
      entry->reason = attempt.reason;
      ++stats_.capture_failures;
      lock.unlock();
      report_failure(handler, entry->shape, attempt.reason);
      lock.lock();
    }
    return nullptr;
  }
  entry->interrupted_rounds = 0;
  if (entry->detached) {
    // Forgotten meanwhile (clear(), max_entries): the graph serves this run, then goes.
    if (recapture && !attempt.pieces) {
      return graph;
    }
    ++stats_.captures;
    stats_.piecewise_captures += attempt.pieces ? 1 : 0;
    return slot_of(attempt);
  }
  entry->reason.clear();
  if (recapture && !attempt.pieces) {
    total_bytes_ -= entry->memory.footprint_bytes;
    entry->memory.alloc_bytes = attempt.updated.memory.alloc_bytes;
    // An in-place update reuses the executable graph: it keeps its footprint.
    if (attempt.updated.path == UpdatePath::reinstantiated) {
      entry->memory.footprint_bytes = attempt.updated.memory.footprint_bytes;
      ++stats_.reinstantiations;
    } else {
      ++stats_.updates;
    }
    total_bytes_ += entry->memory.footprint_bytes;
  } else {
    if (entry->graph) {
      // The executable this one replaces: a piecewise one, or a whole one
      // whose work declares a break since it was invalidated.
      drop_graph(*entry, State::capturing);
    }
    graph = slot_of(attempt);
    if (attempt.pieces) {
      ++stats_.piecewise_captures;
      entry->memory = attempt.pieces->memory;
      entry->piecewise = true;
      entry->segments = attempt.pieces->segments;
      entry->regions = ::std::move(attempt.pieces->regions);
    } else {
      entry->memory = attempt.fresh->memory;
    }
    ++stats_.captures;
    entry->graph = graph;
    entry->replays = 0;
    graph_lru_.push_front(entry.get());
    entry->graph_lru = graph_lru_.begin();
    ++live_graphs_;
    total_bytes_ += entry->memory.footprint_bytes;
  }
  entry->state = entry->invalidated_in_capture ? State::stale : State::captured;
  ++entry->replays;  // the launch that follows
  touch(*entry);
  while ((live_graphs_ > options_.max_graphs || total_bytes_ > options_.max_bytes) && evict_lru(entry.get())) {
  }
  release_retired(lock);  // the evicted graphs, destroyed (and the pool trimmed) with the lock released
  return graph;
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::report_failure(const Handler& handler, const Key& shape,
                                                      const ::std::string& reason) noexcept {
  try {
    const detail::ActiveRouterScope active(this);
    if (handler && *handler) {
      (*handler)(shape, reason);
    } else {
      const ::std::string line = detail::concat("replay::ShapeRouter: capturing shape ", detail::describe_key(shape),
                                                " failed; it runs eagerly from now on. ", reason, "\n");
      ::std::fputs(line.c_str(), stderr);
    }
  } catch (...) {
    // A failing logger must not take the serving path down.
  }
}

}  // namespace replay
