#pragma once
#include <replay/detail/require_cxx20.hpp>
// BasicStreamPipeline::run()'s batches: PipelineState's group submissions
// (several items with one launch, for a GroupedPipelineStageRunner), the
// batch's submission and the collection of its results; included by
// stream_pipeline/detail/state.hpp.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <source_location>
#include <span>
#include <optional>
#include <thread>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/stream_pipeline/detail/state.hpp"
#include "replay/error.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/ticket.hpp"

namespace replay::detail {

template <PipelineStageRunner Runner>
auto PipelineState<Runner>::enqueue_group(::std::span<const GroupInput> items, ::std::span<Delivery> deliveries,
                                          const ::std::source_location& where) -> GroupAccepted
  requires GroupedPipelineStageRunner<Runner>
{
  refuse_reentry("run", where);
  const ::std::size_t wanted = items.size();
  if (wanted == 0 || wanted > max_group || wanted > runner.slot_count() || deliveries.size() != wanted) {
    throw usage_error(detail::concat("StreamPipeline: a group of ", wanted, " items for ", runner.slot_count(),
                                     " slots (at most ", max_group, ")"),
                      where);
  }
  ::std::array<typename Runner::plan_type, max_group> plans;
  for (::std::size_t k = 0; k < wanted; ++k) {
    check_item(items[k].input.size(),
               items[k].destination ? ::std::optional(items[k].destination->size()) : ::std::nullopt, where);
    plans[k] = runner.plan(items[k].input, items[k].destination, where);
  }

  ::std::array<::std::size_t, max_group> slots;
  GroupAccepted accepted;
  bool my_turn = false;
  bool wake_waiter = false;
  {
    ::std::unique_lock lock(mutex);
    // Slots come back in the order they were taken, so the free ones are
    // the next in turn: a group beginning at the first of them may hold
    // launch_room() items (fewer than `wanted` re-aligns a batch with the
    // runner's groups after a partial one).
    const auto need = [&] {
      return free_slots.empty() ? wanted : ::std::min(wanted, ::std::max<::std::size_t>(
                                                                  1, runner.launch_room(free_slots.front())));
    };
    const auto enough = [&] {
      return !free_slots.empty() && (free_slots.size() >= need() || callbacks_in_flight != 0);
    };
    if (!enough()) {
      ++stats.slot_waits;
      // (Another producer taking slots meanwhile may lower this waiter's
      // need below group_need: it is then woken a little late, never lost.)
      group_need = group_waiters++ == 0 ? need() : ::std::min(group_need, need());
      group_freed.wait(lock, enough);
      if (--group_waiters == 0) {
        group_need = 0;
      }
    } else if (refill.waiters() != 0) {
      refill.wake_at_first_free();  // as in enqueue(): a batched waiter takes the next free slot instead
      wake_waiter = free_slots.size() > need();
    }
    accepted.count = ::std::min(need(), free_slots.size());
    accepted.first_id = next_id;
    for (::std::size_t k = 0; k < accepted.count; ++k) {
      const ::std::size_t slot = free_slots.pop();
      slots[k] = slot;
      const ::std::uint64_t id = next_id++;
      ++pending;
      ++stats.submitted;
      callbacks_in_flight += deliveries[k].index() == 2 ? 1 : 0;
      records[slot].emplace(InFlight{id, ::std::move(deliveries[k]), nullptr, false});
      order.push(slot);
    }
    my_turn = next_issue == accepted.first_id;
  }
  if (wake_waiter) {
    slot_freed.notify_one();
  }
  ::std::array<::std::exception_ptr, max_group> errors;
  for (::std::size_t k = 0; k < accepted.count; ++k) {
    try {
      runner.prepare(slots[k], accepted.first_id + k, items[k].input, plans[k], where);
    } catch (...) {
      errors[k] = ::std::current_exception();
    }
  }
  if (!my_turn) {
    wait_for_turn(accepted.first_id);
  }
  issuing.store(::std::this_thread::get_id(), ::std::memory_order_relaxed);
  const bool prepared = ::std::all_of(errors.begin(), errors.begin() + static_cast<::std::ptrdiff_t>(accepted.count),
                                      [](const ::std::exception_ptr& e) { return e == nullptr; });
  if (accepted.count >= 2 && prepared && runner.launches_together(::std::span(slots.data(), accepted.count))) {
    ::std::array<PipelineGroupItem<Runner>, max_group> group;
    for (::std::size_t k = 0; k < accepted.count; ++k) {
      group[k] = PipelineGroupItem<Runner>{slots[k], accepted.first_id + k, items[k].input, items[k].destination,
                                           plans[k]};
    }
    try {
      runner.start_group(::std::span<const PipelineGroupItem<Runner>>(group.data(), accepted.count), where);
    } catch (...) {
      ::std::fill_n(errors.begin(), accepted.count, ::std::current_exception());  // the launch was the group's
    }
  } else {
    for (::std::size_t k = 0; k < accepted.count; ++k) {
      if (errors[k] == nullptr) {
        try {
          runner.start(slots[k], accepted.first_id + k, items[k].input, items[k].destination, plans[k], where);
        } catch (...) {
          errors[k] = ::std::current_exception();
        }
      }
    }
  }
  issuing.store(::std::thread::id(), ::std::memory_order_relaxed);
  mark_issued(::std::span<const ::std::size_t>(slots.data(), accepted.count),
              ::std::span<const ::std::exception_ptr>(errors.data(), accepted.count));
  return accepted;
}

// How many items BasicStreamPipeline::run() hands the runner per launch: its
// items_per_launch() for a GroupedPipelineStageRunner, else 1.
template <PipelineStageRunner Runner>
::std::size_t launch_group(const PipelineState<Runner>& s) noexcept {
  if constexpr (GroupedPipelineStageRunner<Runner>) {
    return ::std::min({static_cast<::std::size_t>(s.runner.items_per_launch()), s.runner.slot_count(),
                       PipelineState<Runner>::max_group});
  } else {
    return 1;
  }
}

// run()'s batch: launch_group(s) items at a time through enqueue_group for
// a grouped runner, else item by item through enqueue. `make()` makes an
// item's delivery (a ticket record); `keep(delivery, id)` turns an accepted
// one into the caller's ticket (a ticket delivery still holds its record
// pointer once moved from). Items a round did not accept (fewer slots taken:
// see enqueue_group) go in the next. A round that throws accepted nothing;
// its deliveries are handed back.
template <PipelineStageRunner Runner, class Make, class Keep>
void submit_batch(PipelineState<Runner>& s, ::std::span<const HostRange<const typename Runner::input_type>> ins,
                  ::std::span<const HostRange<typename Runner::output_type>> outs, Make make, Keep keep,
                  const ::std::source_location& where) {
  using State = PipelineState<Runner>;
  const auto destination = [&](::std::size_t k) {
    return outs.empty() ? ::std::nullopt : ::std::optional(outs[k]);
  };
  const ::std::size_t group = launch_group(s);
  if (group <= 1) {
    for (::std::size_t k = 0; k < ins.size(); ++k) {
      typename State::Delivery delivery = make();
      const auto id = s.enqueue_or_discard(ins[k], destination(k), delivery, true, where);
      keep(delivery, *id);  // blocking: always accepted
    }
    return;
  }
  if constexpr (GroupedPipelineStageRunner<Runner>) {
    ::std::vector<typename State::GroupInput> items;
    items.reserve(group);
    ::std::vector<typename State::Delivery> deliveries;
    deliveries.reserve(group);
    ::std::size_t next = 0;
    try {
      while (next < ins.size()) {
        const ::std::size_t count = ::std::min(group, ins.size() - next);
        items.clear();
        for (::std::size_t k = 0; k < count; ++k) {
          items.push_back({ins[next + k], destination(next + k)});
        }
        while (deliveries.size() < count) {
          deliveries.push_back(make());
        }
        const auto accepted = s.enqueue_group(items, ::std::span(deliveries.data(), count), where);
        for (::std::size_t k = 0; k < accepted.count; ++k) {
          keep(deliveries[k], accepted.first_id + k);
        }
        deliveries.erase(deliveries.begin(), deliveries.begin() + static_cast<::std::ptrdiff_t>(accepted.count));
        next += accepted.count;
      }
    } catch (...) {
      for (auto& unaccepted : deliveries) {
        s.discard(unaccepted);
      }
      throw;
    }
  }
}

// The results of a delivered batch, in order; a failed item leaves a
// value-initialized result, and the first failure is rethrown at the end.
template <class T>
::std::vector<T> collect_batch(::std::vector<PipelineTicket<T>>& tickets, const ::std::source_location& where) {
  ::std::vector<T> results;
  results.reserve(tickets.size());
  ::std::exception_ptr first_error;
  for (auto& ticket : tickets) {
    try {
      results.push_back(ticket.get(where));
    } catch (...) {
      if (first_error == nullptr) {
        first_error = ::std::current_exception();
      }
      results.emplace_back();
    }
  }
  if (first_error != nullptr) {
    ::std::rethrow_exception(first_error);
  }
  return results;
}

}  // namespace replay::detail
