#pragma once
#include <replay/detail/require_cxx20.hpp>
// ShapeRouter's key table: lookups, LRU lists, eviction, invalidation, clearing and the table queries.
#include <algorithm>
#include <memory>
#include <mutex>
#include <source_location>
#include <vector>

#include "replay/shape_router/router.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/stats.hpp"

namespace replay {

template <RouterKey Key, GraphBackend Backend>
inline RouterStats ShapeRouter<Key, Backend>::stats() const {
  refuse_reentry();
  ::std::lock_guard<::std::mutex> lock(mutex_);
  RouterStats out = stats_;
  out.runs = hot_.runs;
  out.hits = hot_.hits;
  out.real_elements = hot_.real_elements;
  out.padded_elements = hot_.padded_elements;
  return out;
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::reset_stats() {
  refuse_reentry();
  ::std::lock_guard<::std::mutex> lock(mutex_);
  stats_ = RouterStats{};
  hot_ = HotCounters{};
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::set_capture_failure_handler(CaptureFailureHandler<Key> handler,
                                                                   ::std::source_location where) {
  refuse_reentry(where);
  ::std::lock_guard<::std::mutex> lock(mutex_);
  on_capture_failure_ = ::std::make_shared<const CaptureFailureHandler<Key>>(::std::move(handler));
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::invalidate(const Key& key, ::std::source_location where) {
  refuse_reentry(where);
  const Planned planned = Plan::plan(options_, key, where);
  ::std::lock_guard<::std::mutex> lock(mutex_);
  const auto it = entries_.find(planned.shape);
  return it != entries_.end() && invalidate_entry(*it->second);
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::invalidate_all(::std::source_location where) {
  refuse_reentry(where);
  ::std::lock_guard<::std::mutex> lock(mutex_);
  for (auto& [shape, entry] : entries_) {
    (void)invalidate_entry(*entry);
  }
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::evict(const Key& key, ::std::source_location where) {
  refuse_reentry(where);
  const Planned planned = Plan::plan(options_, key, where);
  ::std::unique_lock<::std::mutex> lock(mutex_);
  const auto it = entries_.find(planned.shape);
  if (it == entries_.end() || !it->second->graph || it->second->state == State::capturing) {
    return false;
  }
  drop_graph(*it->second, State::ready);
  ++stats_.evictions;
  release_retired(lock);
  return true;
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::clear(::std::source_location where) {
  refuse_reentry(where);
  ::std::unique_lock<::std::mutex> lock(mutex_);
  for (auto& [shape, entry] : entries_) {
    entry->detached = true;
    if (entry->graph && entry->state != State::capturing) {  // a re-capture in flight keeps its own
      retired_.push_back(::std::move(entry->graph));
    }
  }
  entries_.clear();
  lru_.clear();
  graph_lru_.clear();
  live_graphs_ = 0;
  total_bytes_ = 0;
  evicted_memory_ = true;
  release_retired(lock);
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::contains(const Key& key, ::std::source_location where) const {
  refuse_reentry(where);
  const Planned planned = Plan::plan(options_, key, where);
  ::std::lock_guard<::std::mutex> lock(mutex_);
  const auto it = entries_.find(planned.shape);
  return it != entries_.end() && it->second->graph != nullptr;
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::is_eager(const Key& key, ::std::source_location where) const {
  refuse_reentry(where);
  const Planned planned = Plan::plan(options_, key, where);
  ::std::lock_guard<::std::mutex> lock(mutex_);
  const auto it = entries_.find(planned.shape);
  return it != entries_.end() && it->second->state == State::eager_only;
}

template <RouterKey Key, GraphBackend Backend>
inline RouterEntryInfo<Key> ShapeRouter<Key, Backend>::info_of(const Entry& entry) const {
  RouterEntryInfo<Key> out = pending_info(entry.shape);
  const bool live = entry.graph != nullptr && (entry.state == State::captured || entry.state == State::stale ||
                                               entry.state == State::capturing);
  if (entry.state == State::eager_only) {
    out.kind = RouterEntryKind::eager;
    out.reason = entry.reason;
  } else if (live) {
    out.kind = entry.piecewise ? RouterEntryKind::piecewise : RouterEntryKind::whole;
    out.segments = entry.segments;
    out.regions = entry.regions;
    out.memory = entry.memory;
    out.replays = entry.replays;
    out.stale = entry.state == State::stale;
  }
  return out;
}

template <RouterKey Key, GraphBackend Backend>
inline RouterEntryInfo<Key> ShapeRouter<Key, Backend>::entry_info(const Key& key, ::std::source_location where) const {
  refuse_reentry(where);
  const Planned planned = Plan::plan(options_, key, where);
  if (planned.oversize) {
    RouterEntryInfo<Key> out = pending_info(planned.shape);
    out.kind = RouterEntryKind::eager;
    out.reason = "above the largest bucket (OversizePolicy::run_eager)";
    return out;
  }
  ::std::lock_guard<::std::mutex> lock(mutex_);
  const auto it = entries_.find(planned.shape);
  return it == entries_.end() ? pending_info(planned.shape) : info_of(*it->second);
}

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::entries() const -> ::std::vector<RouterEntryInfo<Key>> {
  refuse_reentry();
  ::std::lock_guard<::std::mutex> lock(mutex_);
  ::std::vector<const Entry*> all;
  all.reserve(entries_.size());
  for (const Entry* entry : lru_) {
    all.push_back(entry);
  }
  ::std::sort(all.begin(), all.end(), [](const Entry* a, const Entry* b) { return a->last_used > b->last_used; });
  ::std::vector<RouterEntryInfo<Key>> out;
  out.reserve(all.size());
  for (const Entry* entry : all) {
    out.push_back(info_of(*entry));
  }
  return out;
}

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::graphs() const -> ::std::vector<GraphInfo<Key>> {
  refuse_reentry();
  ::std::vector<GraphInfo<Key>> out;
  ::std::lock_guard<::std::mutex> lock(mutex_);
  ::std::vector<const Entry*> live(graph_lru_.begin(), graph_lru_.end());
  ::std::sort(live.begin(), live.end(), [](const Entry* a, const Entry* b) { return a->last_used > b->last_used; });
  out.reserve(live.size());
  for (const Entry* entry : live) {
    out.push_back(GraphInfo<Key>{entry->shape, entry->memory, entry->replays, entry->state == State::stale});
  }
  return out;
}

template <RouterKey Key, GraphBackend Backend>
inline RouterMemory ShapeRouter<Key, Backend>::memory(::std::source_location where) const {
  refuse_reentry(where);
  RouterMemory out;
  {
    ::std::lock_guard<::std::mutex> lock(mutex_);
    for (const Entry* entry : graph_lru_) {
      ++out.graphs;
      out.alloc_bytes_sum += entry->memory.alloc_bytes;
      out.alloc_bytes_max = ::std::max(out.alloc_bytes_max, entry->memory.alloc_bytes);
      out.footprint_bytes += entry->memory.footprint_bytes;
    }
  }
  if constexpr (ReportsPoolMemory<Backend>) {
    out.pool = backend_.pool_memory(where);
  }
  return out;
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::touch(Entry& entry) noexcept {
  entry.last_used = ++use_clock_;
  entry.recent = false;
  lru_.splice(lru_.begin(), lru_, entry.lru);
}

template <RouterKey Key, GraphBackend Backend>
inline auto ShapeRouter<Key, Backend>::entry_for(const Key& shape) -> EntryRef {
  if (const auto it = entries_.find(shape); it != entries_.end()) {
    touch(*it->second);
    return it->second;
  }
  while (entries_.size() >= options_.max_entries && forget_lru_entry()) {
  }
  EntryRef entry = ::std::make_shared<Entry>(shape);
  entry->state = options_.warmup_runs > 0 ? State::warming : State::ready;
  entry->last_used = ++use_clock_;
  lru_.push_front(entry.get());
  entry->lru = lru_.begin();
  try {
    entries_.emplace(shape, entry);
  } catch (...) {
    lru_.pop_front();
    throw;
  }
  return entry;
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::forget_lru_entry() {
  // From the back; an entry hit since it was last moved goes to the front
  // instead (once: the flag is cleared), so each entry is looked at at most
  // twice: amortized O(1) per forgotten key, whatever the table's size.
  for (auto it = lru_.end(); it != lru_.begin();) {
    const auto current = ::std::prev(it);
    Entry& victim = **current;
    if (victim.recent) {
      victim.recent = false;
      lru_.splice(lru_.begin(), lru_, current);  // `it` stays; its predecessor is next
      continue;
    }
    if (victim.state == State::capturing) {
      it = current;
      continue;
    }
    if (victim.graph) {
      drop_graph(victim, State::ready);
      ++stats_.evictions;
    }
    ++stats_.entry_evictions;
    victim.detached = true;
    lru_.erase(victim.lru);
    entries_.erase(victim.shape);  // `victim` dies here
    return true;
  }
  return false;
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::evict_lru(const Entry* keep) {
  // The oldest stamp among the live graphs: a scan (at most max_graphs + 1
  // of them), on the capture path only, so that a hit moves nothing.
  Entry* victim = nullptr;
  for (Entry* entry : graph_lru_) {
    if (entry != keep && entry->state != State::capturing &&
        (victim == nullptr || entry->last_used < victim->last_used)) {
      victim = entry;
    }
  }
  if (victim == nullptr) {
    return false;
  }
  drop_graph(*victim, State::ready);
  ++stats_.evictions;
  return true;
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::drop_graph(Entry& entry, State next) noexcept {
  if (entry.graph) {
    graph_lru_.erase(entry.graph_lru);
    if (entry.memory.alloc_bytes > 0 || entry.memory.footprint_bytes > 0) {
      evicted_memory_ = true;  // it held graph-pool memory: trim once it is gone
    }
    try {
      retired_.push_back(::std::move(entry.graph));  // destroyed with the lock released
    } catch (...) {
      entry.graph.reset();  // no room to defer: destroyed here (waits for a launch of it)
    }
    entry.graph.reset();
    --live_graphs_;
    total_bytes_ -= entry.memory.footprint_bytes;
  }
  entry.memory = GraphMemory{};
  entry.replays = 0;
  entry.piecewise = false;
  entry.segments = 0;
  entry.regions.clear();
  entry.state = next;
}

template <RouterKey Key, GraphBackend Backend>
inline void ShapeRouter<Key, Backend>::trim() noexcept {
  if constexpr (TrimsMemory<Backend>) {
    backend_.trim(::std::source_location::current());
  }
}

template <RouterKey Key, GraphBackend Backend>
inline bool ShapeRouter<Key, Backend>::invalidate_entry(Entry& entry) noexcept {
  switch (entry.state) {
    case State::captured:
    case State::stale:
      entry.state = State::stale;
      return true;
    case State::eager_only:
      entry.state = State::ready;
      return true;
    case State::capturing:
      entry.invalidated_in_capture = true;
      return true;
    case State::ready:
      entry.interrupted_rounds = 0;  // no cool-down: try at once
      return false;
    case State::warming:
      return false;
  }
  return false;
}

}  // namespace replay
