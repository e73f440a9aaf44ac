// StreamPipeline's scheduling core on the CPU: slots, back-pressure, size
// checks, ordering, error routing, callbacks, drain and the threading model,
// driven by a fake stage runner (no GPU needed).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/stream_pipeline/detail/slot_refill.hpp"
#include "replay/stream_pipeline/detail/streaming_copy.hpp"
#include "replay/stream_pipeline.hpp"
#include "replaced_allocation.hpp"

namespace {

// One engine per thread (producers draw items at once), reseeded from the
// case's seed when a case begins (replay_test::case_seed: the run's seed,
// logged by the test main, re-runs it); the thread that runs the cases draws
// replayable data, other threads the next seeds in the order they first draw.
std::mt19937& engine() {
  static std::atomic<std::uint64_t> next_thread{0};
  thread_local const std::uint64_t thread_index = next_thread++;
  thread_local std::uint64_t seeded_for = 0;
  thread_local std::mt19937 e;
  if (seeded_for != replay_test::case_seed()) {
    seeded_for = replay_test::case_seed();
    e.seed(replay_test::case_seed_for(thread_index));
  }
  return e;
}
int random_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(engine()); }

std::vector<int> random_item(std::size_t n) {
  std::vector<int> v(n);
  for (int& x : v) {
    x = random_int(-1000000, 1000000);
  }
  return v;
}

// What the fake compute stage does: two outputs per input, so that sizes,
// element types and counts are all exercised.
std::vector<long long> expected_output(std::span<const int> in) {
  std::vector<long long> out;
  for (int x : in) {
    out.push_back(3LL * x + 1);
    out.push_back(-static_cast<long long>(x));
  }
  return out;
}

// Shared between a test and its fake runner.
struct FakeControl {
  std::mutex mutex;
  std::condition_variable cv;
  std::size_t allowed = SIZE_MAX;  // finish() calls allowed to return
  std::size_t finished = 0;
  std::set<std::uint64_t> fail_start;   // ids whose start() throws
  std::set<std::uint64_t> fail_finish;  // ids whose finish() throws (an "asynchronous" error)
  std::set<std::uint64_t> fail_prepare;  // ids whose prepare() throws
  std::vector<std::uint64_t> prepared_ids;
  int preparing = 0;
  std::size_t sunk = 0;                  // outputs copied into a sink (vector deliveries)
  std::set<std::thread::id> start_threads;
  std::function<void(std::uint64_t)> on_prepare;  // runs inside prepare(), outside the lock
  bool runner_destroyed = false;
  std::vector<std::uint64_t> started_ids;
  std::vector<std::size_t> started_slots;
  std::vector<std::uint64_t> finished_ids;
  int busy_slot_starts = 0;  // start() on a slot whose previous item was not finished: must stay 0
  std::set<std::thread::id> finish_threads;
  std::function<void()> on_start;  // runs inside start(), outside the lock
  int runners_destroyed = 0;
  int group_starts = 0;                // start_group() calls (GroupedFakeRunner)
  int single_starts = 0;               // start() calls outside a group
  std::set<std::uint64_t> fail_group;  // first ids of groups whose start_group() throws

  void allow(std::size_t more) {
    {
      std::lock_guard lock(mutex);
      allowed = allowed == SIZE_MAX ? more : allowed + more;
    }
    cv.notify_all();
  }
  void open() {
    {
      std::lock_guard lock(mutex);
      allowed = SIZE_MAX;
    }
    cv.notify_all();
  }
};

struct FakeRunner {
  using input_type = int;
  using output_type = long long;
  struct plan_type {
    std::size_t n = 0;
  };

  FakeRunner(FakeControl& control, std::size_t slots, std::size_t capacity,
             std::optional<std::size_t> required = std::nullopt)
      : control_(&control),
        capacity_(capacity),
        required_(required),
        outputs_(slots, std::vector<long long>(2 * capacity)),
        busy_(slots, false),
        ids_(slots, 0),
        counts_(slots, 0),
        destinations_(slots) {}
  FakeRunner(const FakeRunner&) = delete;
  FakeRunner& operator=(const FakeRunner&) = delete;
  ~FakeRunner() {
    // Notified under the lock: a waiter may destroy the control once it sees it.
    std::lock_guard lock(control_->mutex);
    control_->runner_destroyed = true;
    ++control_->runners_destroyed;
    control_->cv.notify_all();
  }

  std::size_t slot_count() const { return outputs_.size(); }
  std::size_t input_capacity() const { return capacity_; }
  std::size_t output_capacity() const { return 2 * capacity_; }
  std::optional<std::size_t> required_input_count() const { return required_; }
  std::optional<std::size_t> planned_output_count(std::size_t n) const { return 2 * n; }

  plan_type plan(replay::HostRange<const int> input, const std::optional<replay::HostRange<long long>>&,
                 const std::source_location&) const {
    return {input.size()};
  }

  void prepare(std::size_t slot, std::uint64_t id, replay::HostRange<const int> input, const plan_type& plan,
               const std::source_location&) {
    if (control_->on_prepare) {
      control_->on_prepare(id);
    }
    std::lock_guard lock(control_->mutex);
    REQUIRE(plan.n == input.size());
    if (busy_[slot]) {
      ++control_->busy_slot_starts;
    }
    ++control_->preparing;
    control_->prepared_ids.push_back(id);
    if (control_->fail_prepare.count(id) != 0) {
      busy_[slot] = true;  // settle() frees it
      --control_->preparing;
      throw std::runtime_error("prepare failed for item " + std::to_string(id));
    }
    --control_->preparing;
  }

  void start(std::size_t slot, std::uint64_t id, replay::HostRange<const int> input,
             std::optional<replay::HostRange<long long>> destination, const plan_type& plan,
             const std::source_location&) {
    if (control_->on_start) {
      control_->on_start();
    }
    std::lock_guard lock(control_->mutex);
    REQUIRE(plan.n == input.size());
    if (busy_[slot]) {
      ++control_->busy_slot_starts;
    }
    busy_[slot] = true;
    ids_[slot] = id;
    control_->started_ids.push_back(id);
    control_->start_threads.insert(std::this_thread::get_id());
    control_->started_slots.push_back(slot);
    if (control_->fail_start.count(id) != 0) {
      throw std::runtime_error("start failed for item " + std::to_string(id));
    }
    const auto out = expected_output(input.span());
    std::copy(out.begin(), out.end(), outputs_[slot].begin());
    counts_[slot] = out.size();
    destinations_[slot] = destination ? std::optional(destination->span()) : std::nullopt;
  }

  std::span<const long long> finish(std::size_t slot, replay::PipelineOutputSink<long long> sink) {
    std::unique_lock lock(control_->mutex);
    control_->cv.wait(lock, [&] { return control_->finished < control_->allowed; });
    ++control_->finished;
    control_->finish_threads.insert(std::this_thread::get_id());
    control_->finished_ids.push_back(ids_[slot]);
    busy_[slot] = false;
    if (control_->fail_finish.count(ids_[slot]) != 0) {
      throw std::runtime_error("asynchronous failure in item " + std::to_string(ids_[slot]));
    }
    std::span<const long long> out(outputs_[slot].data(), counts_[slot]);
    if (destinations_[slot]) {
      std::copy(out.begin(), out.end(), destinations_[slot]->begin());
      return {destinations_[slot]->data(), counts_[slot]};
    }
    if (sink) {
      ++control_->sunk;
      long long* to = sink.allocate(sink.context, out.size());
      std::copy(out.begin(), out.end(), to);
      return {to, out.size()};
    }
    return out;
  }

  void settle(std::size_t slot) noexcept {
    std::lock_guard lock(control_->mutex);
    busy_[slot] = false;
  }
  void bind_completion_thread() noexcept {}
  void add_stats(replay::PipelineStats&) const noexcept {}

 private:
  FakeControl* control_;
  std::size_t capacity_;
  std::optional<std::size_t> required_;
  std::vector<std::vector<long long>> outputs_;
  std::vector<bool> busy_;
  std::vector<std::uint64_t> ids_;
  std::vector<std::size_t> counts_;
  std::vector<std::optional<std::span<long long>>> destinations_;
};

static_assert(replay::PipelineStageRunner<FakeRunner>);

using FakePipeline = replay::BasicStreamPipeline<FakeRunner>;

// FakeRunner with launch groups of `group` consecutive slots (as the CUDA
// runner's items_per_launch): start_group() starts each item of a group.
struct GroupedFakeRunner : FakeRunner {
  GroupedFakeRunner(FakeControl& control, std::size_t slots, std::size_t capacity, std::size_t group)
      : FakeRunner(control, slots, capacity), control_(&control), group_(group) {}

  std::size_t items_per_launch() const noexcept { return group_; }
  bool launches_together(std::span<const std::size_t> slots) const noexcept {
    if (slots.size() != group_ || slots[0] % group_ != 0) {
      return false;
    }
    for (std::size_t m = 1; m < slots.size(); ++m) {
      if (slots[m] != slots[0] + m) {
        return false;
      }
    }
    return true;
  }
  std::size_t launch_room(std::size_t slot) const noexcept { return group_ - slot % group_; }

  void start(std::size_t slot, std::uint64_t id, replay::HostRange<const int> input,
             std::optional<replay::HostRange<long long>> destination, const plan_type& plan,
             const std::source_location& where) {
    {
      std::lock_guard lock(control_->mutex);
      ++control_->single_starts;
    }
    FakeRunner::start(slot, id, input, destination, plan, where);
  }
  void start_group(std::span<const replay::PipelineGroupItem<GroupedFakeRunner>> items,
                   const std::source_location& where) {
    bool fail = false;
    {
      std::lock_guard lock(control_->mutex);
      ++control_->group_starts;
      REQUIRE(launches_together(slots_of(items)));
      for (std::size_t m = 1; m < items.size(); ++m) {
        REQUIRE(items[m].id == items[0].id + m);  // consecutive ids, in order
      }
      fail = control_->fail_group.count(items[0].id) != 0;
    }
    for (const auto& item : items) {
      FakeRunner::start(item.slot, item.id, item.input, item.destination, item.plan, where);
    }
    if (fail) {
      throw std::runtime_error("group launch failed at item " + std::to_string(items[0].id));
    }
  }

 private:
  static std::vector<std::size_t> slots_of(std::span<const replay::PipelineGroupItem<GroupedFakeRunner>> items) {
    std::vector<std::size_t> slots;
    for (const auto& item : items) {
      slots.push_back(item.slot);
    }
    return slots;
  }
  FakeControl* control_;
  std::size_t group_;
};

static_assert(replay::GroupedPipelineStageRunner<GroupedFakeRunner>);
using GroupedPipeline = replay::BasicStreamPipeline<GroupedFakeRunner>;

std::vector<std::vector<int>> random_items(std::size_t count, std::size_t max_size) {
  std::vector<std::vector<int>> items;
  for (std::size_t i = 0; i < count; ++i) {
    items.push_back(random_item(static_cast<std::size_t>(random_int(0, static_cast<int>(max_size)))));
  }
  return items;
}
std::vector<std::span<const int>> spans_of(const std::vector<std::vector<int>>& items) {
  return {items.begin(), items.end()};
}

// run(items, destinations) on `pipeline`; every output checked against the host.
void run_into_and_check(GroupedPipeline& pipeline, const std::vector<std::vector<int>>& items, std::size_t room) {
  std::vector<std::vector<long long>> outputs(items.size(), std::vector<long long>(room, -7));
  std::vector<std::span<long long>> destinations(outputs.begin(), outputs.end());
  const auto counts = pipeline.run(spans_of(items), destinations);
  REQUIRE(counts.size() == items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto expected = expected_output(items[i]);
    REQUIRE(counts[i] == expected.size());
    REQUIRE(std::equal(expected.begin(), expected.end(), outputs[i].begin()));
  }
}


// Each producer saw its own ids in increasing order, and together they are
// exactly 0 .. total-1 (no id lost or given twice).
void check_ids(const std::vector<std::vector<std::uint64_t>>& ids, std::size_t total) {
  std::set<std::uint64_t> all;
  for (const auto& own : ids) {
    CHECK(std::is_sorted(own.begin(), own.end()));
    all.insert(own.begin(), own.end());
  }
  CHECK(all.size() == total);
  CHECK(*all.rbegin() == static_cast<std::uint64_t>(total - 1));
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("outputs come back to the right request, in submission order, for random sizes and every delivery") {
    FakeControl control;
    const std::size_t slots = 1 + static_cast<std::size_t>(random_int(0, 4));
    const std::size_t capacity = 64;
    const int items = 3000;
    std::vector<std::vector<int>> inputs;
    for (int i = 0; i < items; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(0, static_cast<int>(capacity)))));
    }
    std::vector<std::vector<long long>> destinations(items);
    std::vector<std::vector<long long>> from_callbacks(items);
    std::vector<std::uint64_t> callback_ids;
    std::vector<replay::PipelineTicket<std::vector<long long>>> vector_tickets(items);
    std::vector<replay::PipelineTicket<std::size_t>> count_tickets(items);
    {
      FakePipeline pipeline(std::in_place, control, slots, capacity);
      for (int i = 0; i < items; ++i) {
        const std::span<const int> in(inputs[static_cast<std::size_t>(i)]);
        switch (i % 3) {
          case 0:
            vector_tickets[static_cast<std::size_t>(i)] = pipeline.submit(in);
            CHECK(vector_tickets[static_cast<std::size_t>(i)].id() == static_cast<std::uint64_t>(i));
            break;
          case 1:
            destinations[static_cast<std::size_t>(i)].assign(2 * in.size() + 3, -7);
            count_tickets[static_cast<std::size_t>(i)] =
                pipeline.submit(in, std::span<long long>(destinations[static_cast<std::size_t>(i)]));
            CHECK(count_tickets[static_cast<std::size_t>(i)].id() == static_cast<std::uint64_t>(i));
            break;
          default: {
            const auto id = pipeline.submit(in, [&, i](const replay::PipelineCompletion<long long>& done) {
              REQUIRE(done.ok());
              callback_ids.push_back(done.id);
              from_callbacks[static_cast<std::size_t>(i)].assign(done.output.begin(), done.output.end());
            });
            CHECK(id == static_cast<std::uint64_t>(i));
          }
        }
      }
      pipeline.drain();
      CHECK(pipeline.in_flight() == 0);
      const auto stats = pipeline.stats();
      CHECK(stats.submitted == static_cast<std::uint64_t>(items));
      CHECK(stats.completed == static_cast<std::uint64_t>(items));
      CHECK(stats.failed == 0);
    }
    for (int i = 0; i < items; ++i) {
      const auto u = static_cast<std::size_t>(i);
      const auto expected = expected_output(inputs[u]);
      switch (i % 3) {
        case 0: REQUIRE(vector_tickets[u].get() == expected); break;
        case 1: {
          REQUIRE(count_tickets[u].get() == expected.size());
          REQUIRE(std::equal(expected.begin(), expected.end(), destinations[u].begin()));
          REQUIRE(destinations[u][expected.size()] == -7);  // nothing written past the output
          break;
        }
        default: REQUIRE(from_callbacks[u] == expected);
      }
    }
    CHECK(std::is_sorted(callback_ids.begin(), callback_ids.end()));
    CHECK(control.busy_slot_starts == 0);
    // The free-slot FIFO and in-order delivery make slot use round-robin.
    for (std::size_t i = 0; i < control.started_slots.size(); ++i) {
      REQUIRE(control.started_slots[i] == i % slots);
    }
    CHECK(std::is_sorted(control.finished_ids.begin(), control.finished_ids.end()));
  }

  TEST_CASE("items that come faster or slower than the completion thread's watch are all delivered, in order") {
    // Gaps of 0 (the completion thread is still watching), 20 us (around the
    // watch) and 2 ms (it went to sleep and must be woken) between submits.
    FakeControl control;
    const int items = 60;
    std::vector<std::uint64_t> ids;
    std::vector<std::vector<long long>> outputs(items);
    std::vector<std::vector<int>> inputs;
    for (int i = 0; i < items; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(1, 32))));
    }
    {
      FakePipeline pipeline(std::in_place, control, 3, 32);
      for (int i = 0; i < items; ++i) {
        const int gap_us = (i % 3 == 0) ? 0 : (i % 3 == 1 ? 20 : 2000);
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
        (void)pipeline.submit(std::span<const int>(inputs[static_cast<std::size_t>(i)]),
                              [&, i](const replay::PipelineCompletion<long long>& done) {
                                ids.push_back(done.id);
                                outputs[static_cast<std::size_t>(i)].assign(done.output.begin(), done.output.end());
                              });
        if (i % 10 == 9) {
          pipeline.drain();  // and idle in between: the thread sleeps, then wakes for the next item
          CHECK(ids.size() == static_cast<std::size_t>(i + 1));
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      pipeline.drain();
    }
    REQUIRE(ids.size() == static_cast<std::size_t>(items));
    for (int i = 0; i < items; ++i) {
      CHECK(ids[static_cast<std::size_t>(i)] == static_cast<std::uint64_t>(i));
      CHECK(outputs[static_cast<std::size_t>(i)] == expected_output(inputs[static_cast<std::size_t>(i)]));
    }
  }

  TEST_CASE("copy_streaming copies exactly its range at every size and alignment, streaming or not") {
    namespace d = replay::detail;
    constexpr std::size_t kRoom = (std::size_t{1} << 20) + 512;
    std::vector<unsigned char> from(kRoom);
    std::vector<unsigned char> to(kRoom);
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : from) {
      b = static_cast<unsigned char>(byte(replay_test::rng()));
    }
    const std::size_t big = d::streaming_copy_min_bytes;
    int cases = 0;
    for (const std::size_t src_offset : {0U, 1U, 16U, 63U}) {
      for (const std::size_t dst_offset : {0U, 3U, 64U, 100U}) {
        for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, big - 1, big, big + 1,
                                        big + 63, big + 64, std::size_t{1} << 20}) {
          std::fill(to.begin(), to.end(), static_cast<unsigned char>(0xA5));
          d::copy_streaming(to.data() + dst_offset, from.data() + src_offset, bytes);
          REQUIRE(std::equal(from.begin() + static_cast<std::ptrdiff_t>(src_offset),
                             from.begin() + static_cast<std::ptrdiff_t>(src_offset + bytes),
                             to.begin() + static_cast<std::ptrdiff_t>(dst_offset)));
          const auto untouched = [](unsigned char b) { return b == 0xA5; };  // nothing written outside the range
          REQUIRE(std::all_of(to.begin(), to.begin() + static_cast<std::ptrdiff_t>(dst_offset), untouched));
          REQUIRE(std::all_of(to.begin() + static_cast<std::ptrdiff_t>(dst_offset + bytes), to.end(), untouched));
          ++cases;
        }
      }
    }
    CHECK(cases == 144);
  }

  TEST_CASE("the copy helpers default to eight threads") {
    CHECK(replay::PipelineOptions{}.host_copy_threads == 8);
  }

  TEST_CASE("a full pipeline makes submit wait and try_submit return at once, until a slot frees") {
    FakeControl control;
    control.allow(0);  // nothing completes until the test says so
    const std::size_t slots = 3;
    FakePipeline pipeline(std::in_place, control, slots, 16);
    const auto first = random_item(5);
    std::vector<replay::PipelineTicket<std::vector<long long>>> tickets;
    for (std::size_t i = 0; i < slots; ++i) {
      tickets.push_back(pipeline.submit(std::span<const int>(first)));
    }
    CHECK_FALSE(tickets[0].ready());
    CHECK_FALSE(pipeline.try_submit(std::span<const int>(first)).has_value());
    CHECK_FALSE(pipeline.try_submit(std::span<const int>(first), [](const auto&) {}).has_value());
    CHECK(pipeline.stats().refused == 2);
    CHECK(pipeline.stats().submitted == slots);

    const auto late = random_item(7);
    std::atomic<bool> returned{false};
    replay::PipelineTicket<std::vector<long long>> late_ticket;
    std::thread producer([&] {
      late_ticket = pipeline.submit(std::span<const int>(late));
      returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(returned.load());  // every slot is still busy: submit must still be waiting
    control.allow(1);              // the oldest item completes and frees its slot
    producer.join();
    CHECK(returned.load());
    CHECK(tickets[0].get() == expected_output(first));
    CHECK(pipeline.stats().slot_waits == 1);
    CHECK_FALSE(pipeline.try_submit(std::span<const int>(first)).has_value());  // full again

    control.open();
    pipeline.drain();
    CHECK(late_ticket.id() == slots);
    CHECK(late_ticket.get() == expected_output(late));
    auto again = pipeline.try_submit(std::span<const int>(late));
    REQUIRE(again.has_value());
    CHECK(again->get() == expected_output(late));
    CHECK(control.busy_slot_starts == 0);
  }

  TEST_CASE("oversized items, wrong fixed sizes and short destinations are refused before anything is issued") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 2, 8);
    const auto big = random_item(9);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(std::span<const int>(big)),
                         doctest::Contains("holds 9 elements but a slot holds at most 8 elements"),
                         replay::usage_error);
    CHECK_THROWS_AS((void)pipeline.try_submit(std::span<const int>(big)), replay::usage_error);
    std::vector<long long> small(5);
    const auto item = random_item(3);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(std::span<const int>(item), std::span<long long>(small)),
                         doctest::Contains("destination holds 5 elements but the item produces 6"),
                         replay::usage_error);
    const std::vector<std::vector<int>> batch{random_item(2), random_item(12)};
    CHECK_THROWS_AS((void)pipeline.run(batch), replay::usage_error);  // checked as a whole, before submitting
    // A batch into destinations: every (input, destination) pair is checked
    // before the first submission, so no earlier item can still be writing
    // into destinations the caller frees while the exception unwinds.
    const std::vector<std::vector<int>> pairs_in{random_item(2), random_item(2), random_item(3)};
    std::vector<std::vector<long long>> pairs_out{std::vector<long long>(4), std::vector<long long>(4),
                                                  std::vector<long long>(5)};
    CHECK_THROWS_WITH_AS((void)pipeline.run(pairs_in, pairs_out), doctest::Contains("destination holds 5"),
                         replay::usage_error);
    CHECK(pipeline.stats().submitted == 0);
    CHECK(control.started_ids.empty());
    std::vector<long long> exact(6);
    CHECK(pipeline.submit(std::span<const int>(item), std::span<long long>(exact)).get() == 6);

    FakeControl fixed_control;
    FakePipeline fixed(std::in_place, fixed_control, 2, 8, std::size_t{8});
    const auto seven = random_item(7);
    CHECK_THROWS_WITH_AS((void)fixed.submit(std::span<const int>(seven)), doctest::Contains("exactly 8 elements"),
                         replay::usage_error);
    const auto eight = random_item(8);
    CHECK(fixed.submit(std::span<const int>(eight)).get() == expected_output(eight));
  }

  TEST_CASE("a failure while issuing one item reaches only that item; its slot is reused afterwards") {
    FakeControl control;
    const std::uint64_t bad = static_cast<std::uint64_t>(random_int(0, 40));
    control.fail_start = {bad, bad + 7};
    FakePipeline pipeline(std::in_place, control, 3, 32);
    std::vector<std::vector<int>> inputs;
    std::vector<replay::PipelineTicket<std::vector<long long>>> tickets;
    std::vector<std::exception_ptr> callback_errors(60);
    for (int i = 0; i < 60; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(1, 32))));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (i == bad + 7) {
        (void)pipeline.submit(std::span<const int>(inputs[i]),
                              [&, i](const auto& done) { callback_errors[i] = done.error; });
        tickets.emplace_back();
      } else {
        tickets.push_back(pipeline.submit(std::span<const int>(inputs[i])));
      }
    }
    pipeline.drain();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (i == bad) {
        const std::string message = "start failed for item " + std::to_string(bad);
        CHECK_THROWS_WITH_AS(tickets[i].get(), doctest::Contains(message.c_str()),
                             std::runtime_error);
      } else if (i == bad + 7) {
        REQUIRE(callback_errors[i] != nullptr);
        CHECK_THROWS_WITH_AS(std::rethrow_exception(callback_errors[i]), doctest::Contains("start failed"),
                             std::runtime_error);
      } else {
        REQUIRE(tickets[i].get() == expected_output(inputs[i]));
      }
    }
    const auto stats = pipeline.stats();
    CHECK(stats.failed == 2);
    CHECK(stats.completed == inputs.size() - 2);
    CHECK(control.busy_slot_starts == 0);
  }

  TEST_CASE("an asynchronous failure of one item reaches only that item") {
    FakeControl control;
    const std::uint64_t bad = static_cast<std::uint64_t>(random_int(0, 30));
    control.fail_finish = {bad};
    FakePipeline pipeline(std::in_place, control, 2, 16);
    std::vector<std::vector<int>> inputs;
    for (int i = 0; i < 40; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(0, 16))));
    }
    std::vector<replay::PipelineTicket<std::size_t>> tickets;
    std::vector<std::vector<long long>> outs(inputs.size(), std::vector<long long>(32));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      tickets.push_back(pipeline.submit(std::span<const int>(inputs[i]), std::span<long long>(outs[i])));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (i == bad) {
        CHECK_THROWS_WITH_AS((void)tickets[i].get(), doctest::Contains("asynchronous failure"), std::runtime_error);
      } else {
        const auto expected = expected_output(inputs[i]);
        REQUIRE(tickets[i].get() == expected.size());
        REQUIRE(std::equal(expected.begin(), expected.end(), outs[i].begin()));
      }
    }
    CHECK(pipeline.stats().failed == 1);
  }

  TEST_CASE("callbacks run in order on one completion thread; a callback's exception comes back from drain()") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 3, 8);
    std::vector<std::uint64_t> ids;
    std::set<std::thread::id> threads;
    const std::uint64_t thrower = static_cast<std::uint64_t>(random_int(0, 19));
    for (int i = 0; i < 20; ++i) {
      const auto item = random_item(4);
      (void)pipeline.submit(std::span<const int>(item), [&](const replay::PipelineCompletion<long long>& done) {
        ids.push_back(done.id);
        threads.insert(std::this_thread::get_id());
        if (done.id == thrower) {
          throw std::runtime_error("callback threw");
        }
      });
    }
    CHECK_THROWS_WITH_AS(pipeline.drain(), doctest::Contains("callback threw"), std::runtime_error);
    CHECK_NOTHROW(pipeline.drain());  // reported once
    REQUIRE(ids.size() == 20);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      REQUIRE(ids[i] == i);
    }
    CHECK(threads.size() == 1);
    CHECK(threads.count(std::this_thread::get_id()) == 0);
    CHECK(control.finish_threads == threads);  // finish() and callbacks share the completion thread
  }

  TEST_CASE("calling submit or drain from a completion callback is refused instead of deadlocking") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 1, 8);
    std::string submit_error;
    std::string drain_error;
    const auto item = random_item(3);
    (void)pipeline.submit(std::span<const int>(item), [&](const auto&) {
      try {
        (void)pipeline.submit(std::span<const int>(item));
      } catch (const replay::usage_error& e) {
        submit_error = e.what();
      }
      try {
        pipeline.drain();
      } catch (const replay::usage_error& e) {
        drain_error = e.what();
      }
    });
    pipeline.drain();
    CHECK(submit_error.find("completion callback") != std::string::npos);
    CHECK(drain_error.find("completion callback") != std::string::npos);
    CHECK(pipeline.stats().submitted == 1);
  }

  TEST_CASE("submitting from inside a stage is refused instead of deadlocking") {
    FakeControl control;
    FakePipeline* self = nullptr;
    std::string error;
    control.on_start = [&] {
      try {
        (void)self->try_submit(std::span<const int>());
      } catch (const replay::usage_error& e) {
        error = e.what();
      }
    };
    FakePipeline pipeline(std::in_place, control, 2, 8);
    self = &pipeline;
    const auto item = random_item(4);
    CHECK(pipeline.submit(std::span<const int>(item)).get() == expected_output(item));
    CHECK(error.find("inside the compute stage") != std::string::npos);
    CHECK(pipeline.stats().submitted == 1);
  }

  TEST_CASE("the destructor drains: every callback runs and every ticket is fulfilled") {
    FakeControl control;
    control.allow(0);
    std::atomic<int> callbacks{0};
    std::vector<replay::PipelineTicket<std::vector<long long>>> tickets;
    std::vector<std::vector<int>> inputs;
    for (int i = 0; i < 12; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(1, 8))));
    }
    std::thread opener;
    {
      FakePipeline pipeline(std::in_place, control, 4, 8);
      for (std::size_t i = 0; i < 4; ++i) {
        (void)pipeline.submit(std::span<const int>(inputs[i]), [&](const auto& done) {
          CHECK(done.ok());
          ++callbacks;
        });
      }
      // Completions start only after the destructor has begun (or soon before).
      opener = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        control.open();
      });
      for (std::size_t i = 4; i < inputs.size(); ++i) {
        tickets.push_back(pipeline.submit(std::span<const int>(inputs[i])));
      }
    }  // ~BasicStreamPipeline
    opener.join();
    CHECK(callbacks.load() == 4);
    for (std::size_t i = 0; i < tickets.size(); ++i) {
      REQUIRE(tickets[i].ready());
      REQUIRE(tickets[i].get() == expected_output(inputs[i + 4]));
    }
  }

  TEST_CASE("run(range) returns every output in order; a failure surfaces after the whole batch finished") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 3, 16);
    std::vector<std::vector<int>> inputs;
    for (int i = 0; i < 50; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(0, 16))));
    }
    const auto outputs = pipeline.run(inputs);
    REQUIRE(outputs.size() == inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      REQUIRE(outputs[i] == expected_output(inputs[i]));
    }

    std::vector<std::vector<long long>> destinations(inputs.size(), std::vector<long long>(32));
    const auto counts = pipeline.run(inputs, destinations);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const auto expected = expected_output(inputs[i]);
      REQUIRE(counts[i] == expected.size());
      REQUIRE(std::equal(expected.begin(), expected.end(), destinations[i].begin()));
    }

    std::vector<std::uint64_t> seen;
    pipeline.run(inputs, [&](const replay::PipelineCompletion<long long>& done) {
      REQUIRE(done.ok());
      seen.push_back(done.id);
    });
    REQUIRE(seen.size() == inputs.size());  // run returns only after its batch was delivered
    CHECK(std::is_sorted(seen.begin(), seen.end()));

    const std::uint64_t base = pipeline.stats().submitted;
    control.fail_start = {base + 5};
    CHECK_THROWS_WITH_AS((void)pipeline.run(inputs), doctest::Contains("start failed"), std::runtime_error);
    const auto stats = pipeline.stats();
    CHECK(stats.failed == 1);
    CHECK(stats.completed == base + inputs.size() - 1);  // the rest of the batch was not lost
    CHECK(pipeline.in_flight() == 0);
  }

  TEST_CASE("several producer threads may submit at once; each gets its own outputs") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 3, 16);
    constexpr int producers = 4;
    constexpr int per_producer = 400;
    std::vector<std::thread> threads;
    std::vector<int> mismatches(producers, 0);
    std::vector<std::vector<std::uint64_t>> ids(producers);
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] {
        std::mt19937 local{replay_test::case_seed_for(static_cast<std::uint64_t>(p) + 100)};
        for (int i = 0; i < per_producer; ++i) {
          std::vector<int> in(local() % 17);
          for (int& x : in) {
            x = static_cast<int>(local() % 100000);
          }
          auto ticket = pipeline.submit(std::span<const int>(in));
          ids[static_cast<std::size_t>(p)].push_back(ticket.id());
          if (ticket.get() != expected_output(in)) {
            ++mismatches[static_cast<std::size_t>(p)];
          }
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    for (int p = 0; p < producers; ++p) {
      CHECK(mismatches[static_cast<std::size_t>(p)] == 0);
    }
    check_ids(ids, static_cast<std::size_t>(producers * per_producer));
    CHECK(control.busy_slot_starts == 0);
  }

  TEST_CASE("tickets poll, wait and yield once; a moved-from pipeline refuses use") {
    FakeControl control;
    control.allow(0);
    FakePipeline pipeline(std::in_place, control, 2, 8);
    const auto item = random_item(6);
    auto ticket = pipeline.submit(std::span<const int>(item));
    CHECK(ticket.valid());
    CHECK_FALSE(ticket.ready());
    CHECK_FALSE(ticket.wait_for(std::chrono::milliseconds(5)));
    control.open();
    ticket.wait();
    CHECK(ticket.ready());
    CHECK(ticket.get() == expected_output(item));
    CHECK_FALSE(ticket.valid());
    CHECK_THROWS_WITH_AS((void)ticket.get(), doctest::Contains("once"), replay::usage_error);
    replay::PipelineTicket<std::size_t> empty;
    CHECK_THROWS_AS((void)empty.ready(), replay::usage_error);

    FakePipeline moved = std::move(pipeline);
    CHECK(pipeline.moved_from());
    CHECK_THROWS_WITH_AS((void)pipeline.submit(std::span<const int>(item)), doctest::Contains("after move"),
                         replay::usage_error);
    CHECK_THROWS_AS(pipeline.drain(), replay::usage_error);
    CHECK(moved.submit(std::span<const int>(item)).get() == expected_output(item));
  }

  TEST_CASE("a pipeline without slots, or a callback that is empty, is refused") {
    FakeControl control;
    CHECK_THROWS_WITH_AS(FakePipeline(std::in_place, control, 0, 8), doctest::Contains("at least one slot"),
                         replay::usage_error);
    FakePipeline pipeline(std::in_place, control, 1, 8);
    const auto item = random_item(2);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(std::span<const int>(item), replay::PipelineCallback<long long>{}),
                         doctest::Contains("callback is empty"), replay::usage_error);
  }

  TEST_CASE("PipelineFlags combine as a bitmask") {
    constexpr auto flags = replay::PipelineFlags::stage_inputs | replay::PipelineFlags::blocking_wait;
    static_assert(replay::has_flag(flags, replay::PipelineFlags::stage_inputs));
    static_assert(!replay::has_flag(flags, replay::PipelineFlags::graph_slot));
    CHECK(replay::to_underlying(flags) == 9U);
  }

  TEST_CASE("a producer's callback exception goes back to that producer, not to another or to the pipeline") {
    // Old code kept one error slot per pipeline (B's drain() threw A's error),
    // then one per thread id (an error outlived its thread, and a new thread
    // at the same id inherited it).
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 4, 8);
    auto a = pipeline.producer();
    std::promise<void> submitted;
    std::promise<void> b_drained;
    bool a_threw = false;
    std::thread thread_a([&] {
      const auto item = random_item(3);
      (void)a.submit(std::span<const int>(item), [](const replay::PipelineCompletion<long long>&) {
        throw std::runtime_error("producer A's callback");
      });
      submitted.set_value();
      b_drained.get_future().wait();
      try {
        a.drain();
      } catch (const std::runtime_error& e) {
        a_threw = std::string(e.what()).find("producer A's callback") != std::string::npos;
      }
    });
    submitted.get_future().wait();
    auto b = pipeline.producer();
    const auto item = random_item(2);
    (void)b.submit(std::span<const int>(item), [](const replay::PipelineCompletion<long long>&) {});
    CHECK_NOTHROW(b.drain());
    CHECK_NOTHROW(pipeline.drain());  // waits for A's item too, but its error is A's
    b_drained.set_value();
    thread_a.join();
    CHECK(a_threw);
    CHECK_NOTHROW(a.drain());  // reported once
  }

  TEST_CASE("a producer's errors outlive the thread that made them; a new thread, even at the same id, sees none") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 4, 8);
    auto a = pipeline.producer();
    std::thread::id a_id;
    std::thread thread_a([&] {
      a_id = std::this_thread::get_id();
      const auto item = random_item(3);
      (void)a.submit(std::span<const int>(item), [](const replay::PipelineCompletion<long long>&) {
        throw std::runtime_error("from the thread that ended");
      });
    });
    thread_a.join();
    pipeline.drain();  // A's item is delivered; its error is A's producer's, not the pipeline's
    // A thread made now often gets the id of the one that just ended.
    bool b_clean = false;
    bool b_pipeline_clean = false;
    std::thread::id b_id;
    std::thread thread_b([&] {
      b_id = std::this_thread::get_id();
      auto b = pipeline.producer();
      const auto item = random_item(2);
      (void)b.submit(std::span<const int>(item), [](const replay::PipelineCompletion<long long>&) {});
      try {
        b.drain();
        b_clean = true;
        pipeline.drain();
        b_pipeline_clean = true;
      } catch (...) {
      }
    });
    thread_b.join();
    const std::string reuse = a_id == b_id ? "reused" : "did not reuse";
    MESSAGE("the second thread " << reuse << " the first one's id");
    CHECK(b_clean);
    CHECK(b_pipeline_clean);
    CHECK_THROWS_WITH_AS(a.drain(), doctest::Contains("from the thread that ended"), std::runtime_error);
    CHECK_NOTHROW(a.drain());
  }

  TEST_CASE("a callback's exception from a thread that ended without draining is reported by the pipeline's drain()") {
    // Old code kept it under the ended thread's id: lost, unless a new thread
    // reused that id and drained.
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 4, 8);
    std::thread ended([&] {
      const auto item = random_item(3);
      (void)pipeline.submit(std::span<const int>(item), [](const replay::PipelineCompletion<long long>&) {
        throw std::runtime_error("a callback of an ended thread");
      });
    });
    ended.join();
    CHECK_THROWS_WITH_AS(pipeline.drain(), doctest::Contains("a callback of an ended thread"), std::runtime_error);
    CHECK_NOTHROW(pipeline.drain());  // once
  }

  TEST_CASE("a producer destroyed with an error unreported hands it to the pipeline; a producer outliving it is refused") {
    FakeControl control;
    auto pipeline = std::make_unique<FakePipeline>(std::in_place, control, 4, 8);
    const auto item = random_item(3);
    const auto throwing = [](const replay::PipelineCompletion<long long>&) {
      throw std::runtime_error("left behind by its producer");
    };
    for (const bool delivered_first : {true, false}) {
      CAPTURE(delivered_first);
      if (!delivered_first) {
        control.allow(0);  // the item is delivered after its producer is gone
      }
      {
        auto dropped = pipeline->producer();
        (void)dropped.submit(std::span<const int>(item), throwing);
        if (delivered_first) {
          pipeline->drain();  // the error is the producer's: not reported here
        }
      }
      control.open();
      CHECK_THROWS_WITH_AS(pipeline->drain(), doctest::Contains("left behind by its producer"), std::runtime_error);
      CHECK_NOTHROW(pipeline->drain());
    }
    auto survivor = pipeline->producer();
    pipeline.reset();
    CHECK_THROWS_WITH_AS((void)survivor.submit(std::span<const int>(item), throwing), doctest::Contains("destroyed"),
                         replay::usage_error);
    CHECK_THROWS_AS(survivor.drain(), replay::usage_error);
    auto moved = std::move(survivor);
    CHECK(survivor.moved_from());  // NOLINT(bugprone-use-after-move): the moved-from state is the point
    CHECK_THROWS_WITH_AS(survivor.drain(), doctest::Contains("after move"), replay::usage_error);
  }

  TEST_CASE("a pipeline destroyed from its own completion callback delivers the rest, then frees itself") {
    // Old code: the destructor detached the completion thread, which went on
    // delivering into freed state (a use after free).
    FakeControl control;
    control.allow(0);
    auto pipeline = std::make_unique<FakePipeline>(std::in_place, control, 8, 8);
    std::atomic<int> callbacks{0};
    std::atomic<bool> destroyed_inside{false};
    std::vector<std::vector<int>> inputs;
    for (int i = 0; i < 6; ++i) {
      inputs.push_back(random_item(4));
    }
    for (int i = 0; i < 6; ++i) {
      (void)pipeline->submit(std::span<const int>(inputs[static_cast<std::size_t>(i)]),
                             [&](const replay::PipelineCompletion<long long>& done) {
                               ++callbacks;
                               if (done.id == 1) {
                                 pipeline.reset();  // returns at once
                                 destroyed_inside = true;
                               }
                             });
    }
    control.open();
    {
      std::unique_lock lock(control.mutex);
      REQUIRE(control.cv.wait_for(lock, std::chrono::seconds(20), [&] { return control.runners_destroyed > 0; }));
    }
    CHECK(destroyed_inside);
    CHECK(callbacks == 6);  // the items after the one that destroyed it were still delivered
  }
}

// ---- chunked staging, the issue turn, pooled tickets ------------------------

namespace {

// Counts heap allocations on every thread while `counting` is set.
std::atomic<bool> counting{false};
std::atomic<std::size_t> allocations{0};

// A runner that allocates nothing per item: for the allocation test.
struct LeanRunner {
  using input_type = int;
  using output_type = long long;
  struct plan_type {};

  explicit LeanRunner(std::size_t slots) : outputs_(slots, std::vector<long long>(64)), counts_(slots, 0) {}
  std::size_t slot_count() const { return outputs_.size(); }
  std::size_t input_capacity() const { return 32; }
  std::size_t output_capacity() const { return 64; }
  std::optional<std::size_t> required_input_count() const { return std::nullopt; }
  std::optional<std::size_t> planned_output_count(std::size_t n) const { return 2 * n; }
  plan_type plan(replay::HostRange<const int>, const std::optional<replay::HostRange<long long>>&,
                 const std::source_location&) const {
    return {};
  }
  void prepare(std::size_t, std::uint64_t, replay::HostRange<const int>, const plan_type&,
               const std::source_location&) {}
  void start(std::size_t slot, std::uint64_t, replay::HostRange<const int> input,
             std::optional<replay::HostRange<long long>> destination, const plan_type&, const std::source_location&) {
    std::size_t j = 0;
    for (int x : input.span()) {
      outputs_[slot][j++] = 3LL * x + 1;
      outputs_[slot][j++] = -static_cast<long long>(x);
    }
    counts_[slot] = j;
    destinations_[slot] = destination ? destination->data() : nullptr;
  }
  std::span<const long long> finish(std::size_t slot, replay::PipelineOutputSink<long long>) {
    if (destinations_[slot] != nullptr) {
      std::copy_n(outputs_[slot].begin(), counts_[slot], destinations_[slot]);
      return {destinations_[slot], counts_[slot]};
    }
    return {outputs_[slot].data(), counts_[slot]};
  }
  void settle(std::size_t) noexcept {}
  void bind_completion_thread() noexcept {}
  void add_stats(replay::PipelineStats&) const noexcept {}

 private:
  std::vector<std::vector<long long>> outputs_;
  std::vector<std::size_t> counts_;
  std::vector<long long*> destinations_ = std::vector<long long*>(8, nullptr);
};
static_assert(replay::PipelineStageRunner<LeanRunner>);

// Checks that a chunk plan covers [0, bytes) exactly once, in order.
void check_plan(const replay::detail::ChunkPlan& plan, std::size_t bytes, std::size_t chunk) {
  INFO("bytes " << bytes << " chunk " << chunk);
  REQUIRE(plan.bytes == bytes);
  if (bytes == 0) {
    REQUIRE(plan.count == 0);
    return;
  }
  REQUIRE(plan.count >= 1);
  REQUIRE(plan.count <= replay::detail::max_staging_chunks);
  REQUIRE(plan.count <= replay::detail::max_chunks_for(bytes, chunk));
  std::size_t covered = 0;
  for (std::size_t k = 0; k < plan.count; ++k) {
    REQUIRE(plan.offset(k) == covered);
    REQUIRE(plan.length(k) > 0);
    REQUIRE(plan.length(k) <= plan.chunk_bytes);
    if (k + 1 < plan.count) {
      REQUIRE(plan.length(k) == plan.chunk_bytes);
    }
    covered += plan.length(k);
  }
  REQUIRE(covered == bytes);
}

}  // namespace

void replay_test::before_each_allocation() {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
  }
}

TEST_SUITE("host") {
  TEST_CASE("chunk plans cover every byte once, in order, for sizes on and off chunk boundaries") {
    constexpr std::size_t page = replay::detail::staging_page_bytes;
    for (std::size_t chunk : {page, 16 * page, std::size_t{1} << 20, std::size_t{2} << 20}) {
      for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4}, chunk - 1, chunk, chunk + 1,
                                2 * chunk, 3 * chunk + 7, 64 * chunk, 64 * chunk + 1, 1000 * chunk + 3}) {
        check_plan(replay::detail::plan_chunks(bytes, chunk), bytes, chunk);
      }
      for (int i = 0; i < 200; ++i) {
        const auto bytes = static_cast<std::size_t>(random_int(0, 1 << 30));
        check_plan(replay::detail::plan_chunks(bytes, chunk), bytes, chunk);
      }
    }
    // Small items stay one chunk: no helper and no per-chunk event for them.
    CHECK(replay::detail::plan_chunks(64 << 10, 1 << 20).count == 1);
    CHECK(replay::detail::plan_chunks(16 << 20, 1 << 20).count == 16);
    // Huge items get larger (page-multiple) chunks instead of more of them.
    const auto huge = replay::detail::plan_chunks(std::size_t{3} << 30, 1 << 20);
    CHECK(huge.count == replay::detail::max_staging_chunks);
    CHECK(huge.chunk_bytes % page == 0);
    CHECK(replay::detail::max_chunks_for(0, 1 << 20) == 0);
    CHECK(replay::detail::max_chunks_for(1 << 20, 1 << 20) == 1);
  }

  TEST_CASE("the copy pool runs every chunk once on the caller and its helpers, jobs from several threads at once") {
    std::atomic<int> bound{0};
    auto owned_pool = std::make_unique<replay::detail::HostCopyPool>(3, [&]() noexcept { ++bound; });
    replay::detail::HostCopyPool& pool = *owned_pool;
    CHECK(pool.started() == 0);  // helpers start on first use
    // A single-chunk job runs inline and starts no helper.
    int inline_runs = 0;
    auto once = [&](std::size_t) { ++inline_runs; };
    pool.run(1, once);
    CHECK(inline_runs == 1);
    CHECK(pool.started() == 0);

    constexpr int jobs_per_thread = 60;
    std::vector<std::thread> owners;
    std::atomic<int> failures{0};
    std::set<std::thread::id> workers;
    std::mutex workers_mutex;
    for (int t = 0; t < 3; ++t) {
      owners.emplace_back([&, t] {
        std::mt19937 local{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 100)};
        for (int j = 0; j < jobs_per_thread; ++j) {
          const std::size_t count = 2 + local() % 40;
          std::vector<std::atomic<int>> hits(count);
          // A stand-in for "copy the chunk, then issue its DMA": the copy must
          // be complete (all bytes written) before the chunk reports done.
          std::vector<std::vector<unsigned char>> dst(count, std::vector<unsigned char>(257));
          std::vector<unsigned char> src(257);
          for (auto& b : src) {
            b = static_cast<unsigned char>(local());
          }
          auto work = [&](std::size_t k) {
            ++hits[k];
            std::copy(src.begin(), src.end(), dst[k].begin());
            if (k % 8 == 3) {
              std::this_thread::yield();
            }
            std::lock_guard lock(workers_mutex);
            workers.insert(std::this_thread::get_id());
          };
          pool.run(count, work);
          for (std::size_t k = 0; k < count; ++k) {
            if (hits[k].load() != 1 || dst[k] != src) {
              ++failures;
            }
          }
        }
      });
    }
    for (auto& t : owners) {
      t.join();
    }
    CHECK(failures.load() == 0);
    CHECK(pool.started() == 3);
    CHECK(workers.size() >= 3);
    // A helper takes chunks while the owner is busy with one: the owner's
    // chunk returns only once another thread has run a chunk of the same job.
    {
      const auto owner = std::this_thread::get_id();
      std::mutex m;
      std::condition_variable cv;
      bool helper_ran = false;
      auto work = [&](std::size_t) {
        std::unique_lock lock(m);
        if (std::this_thread::get_id() == owner) {
          cv.wait_for(lock, std::chrono::seconds(20), [&] { return helper_ran; });
        } else {
          helper_ran = true;
          cv.notify_all();
        }
      };
      pool.run(4, work);
      CHECK(helper_ran);
    }
    owned_pool.reset();  // joins the helpers
    CHECK(bound.load() == 3);   // `bind` ran once on each helper
  }

  TEST_CASE("a chunk's exception is the caller's alone once run() has thrown it: no helper holds it after") {
    // Its destructor records the thread it ran on: the caller's, at the end
    // of its handler, never a helper's afterwards.
    struct ChunkFailure : std::runtime_error {
      explicit ChunkFailure(std::atomic<std::thread::id>* destroyed_on)
          : std::runtime_error("chunk failed"), destroyed_on_(destroyed_on) {}
      ChunkFailure(const ChunkFailure&) = default;
      ChunkFailure& operator=(const ChunkFailure&) = default;
      ~ChunkFailure() override { destroyed_on_->store(std::this_thread::get_id()); }
      std::atomic<std::thread::id>* destroyed_on_;
    };
    replay::detail::HostCopyPool pool(2, nullptr);
    const std::thread::id caller = std::this_thread::get_id();
    std::atomic<int> thrown_on_helper{0};
    for (int round = 0; round < 200; ++round) {
      std::atomic<std::thread::id> destroyed_on{};
      auto work = [&](std::size_t k) {
        if (k == 1) {
          thrown_on_helper += std::this_thread::get_id() != caller ? 1 : 0;
          throw ChunkFailure(&destroyed_on);
        }
      };
      bool caught = false;
      try {
        pool.run(4, work);
      } catch (const ChunkFailure&) {
        caught = true;
      }
      REQUIRE(caught);
      REQUIRE(destroyed_on.load() == caller);
    }
    MESSAGE("the failing chunk ran on a helper in " << thrown_on_helper.load() << " of 200 rounds");
  }

  TEST_CASE("a failing chunk fails its job only: the rest are skipped or finished, the error reaches the caller") {
    replay::detail::HostCopyPool pool(2, nullptr);
    for (int round = 0; round < 50; ++round) {
      const std::size_t count = 5 + static_cast<std::size_t>(random_int(0, 30));
      const std::size_t bad = static_cast<std::size_t>(random_int(0, static_cast<int>(count) - 1));
      std::atomic<std::size_t> ran{0};
      auto work = [&](std::size_t k) {
        ++ran;
        if (k == bad) {
          throw std::runtime_error("chunk " + std::to_string(k) + " failed");
        }
      };
      CHECK_THROWS_WITH_AS(pool.run(count, work), doctest::Contains("failed"), std::runtime_error);
      CHECK(ran.load() >= 1);
      CHECK(ran.load() <= count);
      // The pool stays usable.
      std::atomic<std::size_t> ok{0};
      auto fine = [&](std::size_t) { ++ok; };
      pool.run(count, fine);
      REQUIRE(ok.load() == count);
    }
    replay::detail::HostCopyPool no_helpers(0, nullptr);
    std::vector<std::size_t> order;
    auto in_order = [&](std::size_t k) { order.push_back(k); };
    no_helpers.run(6, in_order);
    CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});  // without helpers: the caller alone, in order
    CHECK(no_helpers.started() == 0);
  }

  TEST_CASE("producers prepare (stage) their items concurrently; starts stay serialized and in id order") {
    FakeControl control;
    std::mutex gate_mutex;
    std::condition_variable gate;
    bool second_prepared = false;
    bool first_waiting = false;
    bool overlapped = false;
    control.on_prepare = [&](std::uint64_t id) {
      std::unique_lock lock(gate_mutex);
      if (id == 0) {
        // Item 0's staging waits until item 1 was staged by another producer:
        // with staging serialized this would never return (the wait_for bounds it).
        first_waiting = true;
        gate.wait_for(lock, std::chrono::seconds(20), [&] { return second_prepared; });
        first_waiting = false;
      } else if (id == 1) {
        overlapped = first_waiting;
        second_prepared = true;
        gate.notify_all();
      }
    };
    FakePipeline pipeline(std::in_place, control, 4, 16);
    const auto a = random_item(5);
    const auto b = random_item(9);
    replay::PipelineTicket<std::vector<long long>> ta;
    replay::PipelineTicket<std::vector<long long>> tb;
    std::thread first([&] { ta = pipeline.submit(std::span<const int>(a)); });
    // Let the first producer take id 0 before the second takes id 1.
    while (pipeline.stats().submitted == 0) {
      std::this_thread::yield();
    }
    std::thread second([&] { tb = pipeline.submit(std::span<const int>(b)); });
    first.join();
    second.join();
    {
      std::lock_guard lock(gate_mutex);
      CHECK(second_prepared);
      CHECK(overlapped);  // item 1 was staged while item 0 still was
    }
    CHECK(ta.id() == 0);
    CHECK(tb.id() == 1);
    CHECK(ta.get() == expected_output(a));
    CHECK(tb.get() == expected_output(b));
    pipeline.drain();
    REQUIRE(control.prepared_ids.size() == 2);
    CHECK(control.started_ids == std::vector<std::uint64_t>{0, 1});  // but started in id order
    CHECK(control.busy_slot_starts == 0);
  }

  TEST_CASE("a failure while staging reaches only that item; start() is not called for it") {
    FakeControl control;
    const std::uint64_t bad = static_cast<std::uint64_t>(random_int(0, 20));
    control.fail_prepare = {bad};
    FakePipeline pipeline(std::in_place, control, 3, 16);
    std::vector<std::vector<int>> inputs;
    std::vector<replay::PipelineTicket<std::size_t>> tickets;
    std::vector<std::vector<long long>> outs(30, std::vector<long long>(32));
    for (std::size_t i = 0; i < 30; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(0, 16))));
      tickets.push_back(pipeline.submit(std::span<const int>(inputs[i]), std::span<long long>(outs[i])));
    }
    for (std::size_t i = 0; i < 30; ++i) {
      if (i == bad) {
        CHECK_THROWS_WITH_AS((void)tickets[i].get(), doctest::Contains("prepare failed"), std::runtime_error);
      } else {
        const auto expected = expected_output(inputs[i]);
        REQUIRE(tickets[i].get() == expected.size());
        REQUIRE(std::equal(expected.begin(), expected.end(), outs[i].begin()));
      }
    }
    CHECK(std::find(control.started_ids.begin(), control.started_ids.end(), bad) == control.started_ids.end());
    CHECK(control.started_ids.size() == 29);
    CHECK(pipeline.stats().failed == 1);
    CHECK(control.busy_slot_starts == 0);
  }

  TEST_CASE("vector deliveries go through the runner's sink; dropped tickets are fine") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 2, 16);
    std::vector<std::vector<int>> inputs;
    std::vector<replay::PipelineTicket<std::vector<long long>>> kept;
    for (int i = 0; i < 40; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(0, 16))));
      auto ticket = pipeline.submit(std::span<const int>(inputs.back()));
      if (i % 2 == 0) {
        kept.push_back(std::move(ticket));  // the others are dropped at once, before they complete
      }
    }
    pipeline.drain();
    CHECK(control.sunk == 40);
    for (std::size_t i = 0; i < kept.size(); ++i) {
      REQUIRE(kept[i].get() == expected_output(inputs[2 * i]));
    }
    CHECK(pipeline.stats().completed == 40);
  }

  TEST_CASE("an item's hot path allocates nothing: ticket records are reused") {
    replay::BasicStreamPipeline<LeanRunner> pipeline(std::in_place, 4);
    const auto input = random_item(16);
    std::vector<long long> out(32);
    const auto expected = expected_output(input);
    for (int i = 0; i < 100; ++i) {  // warm: ticket records, condition variables
      (void)pipeline.submit(std::span<const int>(input), std::span<long long>(out)).get();
    }
    pipeline.drain();
    std::size_t wrong = 0;
    allocations = 0;
    counting = true;
    for (int i = 0; i < 2000; ++i) {
      auto ticket = pipeline.submit(std::span<const int>(input), std::span<long long>(out));
      if (ticket.get() != expected.size() || out[5] != expected[5]) {
        ++wrong;
      }
    }
    counting = false;
    CHECK(wrong == 0);
    CHECK(allocations.load() == 0);
    pipeline.drain();  // a ticket is ready a moment before its item is counted
    CHECK(pipeline.stats().completed == 2100);
  }

  TEST_CASE("ticket records: a record returns to the pool only after both the pipeline and the ticket let go") {
    replay::detail::TicketPool<std::size_t> pool;
    auto* a = pool.acquire();
    pool.fulfill(a, 7);  // the pipeline's share
    CHECK(replay::detail::TicketPool<std::size_t>::is_ready(a));
    auto* b = pool.acquire();
    CHECK(b != a);  // `a` is still held by its ticket
    CHECK(a->value == 7U);
    pool.release(a);  // the ticket's share
    auto* c = pool.acquire();
    CHECK(c == a);  // reused
    CHECK_FALSE(replay::detail::TicketPool<std::size_t>::is_ready(c));
    CHECK_FALSE(c->value.has_value());
    pool.release(b);
    pool.fail(b, std::make_exception_ptr(std::runtime_error("x")));
    pool.release(c);
    pool.release(c);
    std::thread waiter([&] {
      auto* d = pool.acquire();
      std::thread late([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        pool.fulfill(d, 9);
      });
      pool.wait(d);
      CHECK(d->value == 9U);
      pool.release(d);
      late.join();
    });
    waiter.join();
  }

  TEST_CASE("a callback may destroy its pipeline: the rest is still delivered, then the pipeline frees itself") {
    FakeControl control;
    control.allow(0);  // nothing completes before everything was submitted
    auto pipeline = std::make_unique<FakePipeline>(std::in_place, control, 12, 8);
    std::vector<std::vector<int>> inputs;
    std::vector<replay::PipelineTicket<std::vector<long long>>> tickets;
    std::atomic<bool> destroyed{false};
    for (int i = 0; i < 10; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(1, 8))));
      if (i == 3) {
        (void)pipeline->submit(std::span<const int>(inputs.back()), [&](const auto& done) {
          CHECK(done.ok());
          pipeline.reset();  // from the completion thread
          destroyed = true;
        });
        tickets.emplace_back();
      } else {
        tickets.push_back(pipeline->submit(std::span<const int>(inputs.back())));
      }
    }
    control.open();  // from here on only the callback touches `pipeline`
    for (std::size_t i = 0; i < tickets.size(); ++i) {
      if (i != 3) {
        REQUIRE(tickets[i].get() == expected_output(inputs[i]));  // items after the callback's too
      }
    }
    CHECK(destroyed.load());
    std::unique_lock lock(control.mutex);
    CHECK(control.cv.wait_for(lock, std::chrono::seconds(20), [&] { return control.runner_destroyed; }));
  }

  TEST_CASE("run(range, callback) reports its own callback's exception, never another producer's") {
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 3, 8);
    std::vector<std::vector<int>> inputs;
    for (int i = 0; i < 30; ++i) {
      inputs.push_back(random_item(static_cast<std::size_t>(random_int(0, 8))));
    }
    std::atomic<int> clean_errors{0};
    std::atomic<int> thrower_errors{0};
    std::thread thrower([&] {
      for (int round = 0; round < 20; ++round) {
        try {
          pipeline.run(inputs, [&](const replay::PipelineCompletion<long long>& done) {
            if (done.id % 7 == 0) {
              throw std::runtime_error("batch callback threw");
            }
          });
        } catch (const std::runtime_error&) {
          ++thrower_errors;
        }
      }
    });
    std::thread clean([&] {
      for (int round = 0; round < 20; ++round) {
        try {
          std::size_t seen = 0;
          pipeline.run(inputs, [&](const replay::PipelineCompletion<long long>&) { ++seen; });
          pipeline.drain();
          if (seen != inputs.size()) {
            ++clean_errors;
          }
        } catch (...) {
          ++clean_errors;
        }
      }
    });
    thrower.join();
    clean.join();
    CHECK(clean_errors.load() == 0);
    CHECK(thrower_errors.load() >= 1);  // ids 0, 7, 14, ... land in some of its batches
    CHECK_NOTHROW(pipeline.drain());
  }

  TEST_CASE("slot refill: a lone waiter holds out for a batch only while deliveries are fast; any doubt ends it") {
    using replay::detail::SlotRefill;
    using namespace std::chrono_literals;
    SlotRefill refill;
    CHECK(refill.batch(8) == 1);  // nothing delivered yet: not known to be fast
    auto now = SlotRefill::clock::now();
    for (int i = 0; i < 40; ++i) {  // deliveries 2 us apart
      now += 2us;
      refill.delivered(now);
    }
    CHECK(refill.interval() < SlotRefill::fast_delivery);
    CHECK(refill.batch(3) == 1);  // too few slots to hold any back
    CHECK(refill.batch(4) == 1);
    CHECK(refill.batch(6) == 1);
    CHECK(refill.batch(8) == 2);
    CHECK(refill.batch(16) == 4);
    CHECK(refill.batch(1024) == SlotRefill::max_batch);

    // A lone waiter waits for two free slots; one does not wake it.
    refill.begin_wait(8, true);
    CHECK(refill.batching());
    CHECK_FALSE(refill.should_wake(1));
    CHECK_FALSE(refill.refilled(1));
    CHECK(refill.should_wake(2));
    // A slow delivery ends the batch: one free slot wakes it now.
    now += 500us;
    refill.delivered(now);
    CHECK_FALSE(refill.batching());
    CHECK(refill.should_wake(1));
    refill.end_wait();
    CHECK_FALSE(refill.should_wake(8));  // nobody waits

    for (int i = 0; i < 40; ++i) {
      now += 2us;
      refill.delivered(now);
    }
    // A second waiter ends the batch; with a callback in flight there is none.
    refill.begin_wait(8, true);
    CHECK(refill.batching());
    refill.begin_wait(8, true);
    CHECK_FALSE(refill.batching());
    CHECK(refill.should_wake(1));
    refill.end_wait();
    refill.end_wait();
    CHECK(refill.waiters() == 0);
    refill.begin_wait(8, false);
    CHECK_FALSE(refill.batching());
    refill.end_wait();
    // Gaps count at most 1 ms, so the average is fast again within a dozen items.
    now += 10s;
    refill.delivered(now);
    CHECK(refill.batch(8) == 1);
    int recovered_after = 0;
    while (refill.batch(8) == 1 && recovered_after < 100) {
      now += 2us;
      refill.delivered(now);
      ++recovered_after;
    }
    CHECK(recovered_after <= 16);
  }

  TEST_CASE("many producers and a fast completion thread that sleeps in between: every item once, in order") {
    // 8 slots and instant items: producers outrun the completion thread and
    // wait for slots, a lone waiter in batches. Tickets, destinations and
    // callbacks mixed (a callback in flight turns batching off), and idle
    // gaps so that the completion thread goes to sleep and must be woken.
    replay::BasicStreamPipeline<LeanRunner> pipeline(std::in_place, 8);
    constexpr int producers = 4;
    constexpr int per_producer = 3000;
    std::vector<int> wrong(producers, 0);
    std::vector<std::vector<std::uint64_t>> ids(producers);
    std::vector<std::uint64_t> callback_ids;  // written on the completion thread only
    std::atomic<int> callbacks{0};
    std::vector<std::thread> threads;
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] {
        std::mt19937 local{replay_test::case_seed_for(static_cast<std::uint64_t>(p) + 100)};
        std::vector<long long> out(64);
        for (int i = 0; i < per_producer; ++i) {
          std::vector<int> in(local() % 33);
          for (int& x : in) {
            x = static_cast<int>(local() % 100000);
          }
          const auto expected = expected_output(in);
          auto& mine = ids[static_cast<std::size_t>(p)];
          if (p == 3 && i % 50 == 0) {
            mine.push_back(pipeline.submit(std::span<const int>(in),
                                           [&, expected](const replay::PipelineCompletion<long long>& done) {
                                             callback_ids.push_back(done.id);
                                             if (!done.ok() || !std::equal(done.output.begin(), done.output.end(),
                                                                           expected.begin(), expected.end())) {
                                               ++wrong[3];
                                             }
                                             ++callbacks;
                                           }));
          } else if (p % 2 == 0) {
            auto ticket = pipeline.submit(std::span<const int>(in), std::span<long long>(out));
            mine.push_back(ticket.id());
            if (ticket.get() != expected.size() || !std::equal(expected.begin(), expected.end(), out.begin())) {
              ++wrong[static_cast<std::size_t>(p)];
            }
          } else {
            auto ticket = pipeline.submit(std::span<const int>(in));
            mine.push_back(ticket.id());
            if (ticket.get() != expected) {
              ++wrong[static_cast<std::size_t>(p)];
            }
          }
          if (i % 1000 == 999) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));  // longer than the completion thread's watch
          }
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    pipeline.drain();
    for (int p = 0; p < producers; ++p) {
      CHECK(wrong[static_cast<std::size_t>(p)] == 0);
    }
    check_ids(ids, static_cast<std::size_t>(producers * per_producer));
    CHECK(callbacks.load() == per_producer / 50);
    CHECK(std::is_sorted(callback_ids.begin(), callback_ids.end()));
    CHECK(pipeline.stats().completed == static_cast<std::uint64_t>(producers * per_producer));
    CHECK(pipeline.stats().slot_waits <= static_cast<std::uint64_t>(producers * per_producer));
  }

  TEST_CASE("a lone producer holding out for a batch of slots is woken by one slow delivery") {
    // Fast deliveries first (the producer may then wait for two free slots
    // of eight), then nothing completes until the test frees a single slot,
    // long after the last delivery: that one slot must be enough.
    FakeControl control;
    FakePipeline pipeline(std::in_place, control, 8, 16);
    const auto input = random_item(6);
    std::vector<long long> out(12);
    for (int i = 0; i < 2000; ++i) {
      (void)pipeline.submit(std::span<const int>(input), std::span<long long>(out));
    }
    pipeline.drain();
    {
      std::lock_guard lock(control.mutex);
      control.allowed = control.finished;  // hold every later item
    }
    std::vector<replay::PipelineTicket<std::vector<long long>>> held;
    const std::uint64_t waits_before = pipeline.stats().slot_waits;
    for (int i = 0; i < 8; ++i) {
      held.push_back(pipeline.submit(std::span<const int>(input)));
    }
    std::atomic<bool> returned{false};
    std::thread producer([&] {
      auto late = pipeline.submit(std::span<const int>(input));
      returned = true;
      CHECK(late.get() == expected_output(input));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK_FALSE(returned.load());
    control.allow(1);  // one slot, after a slow gap
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!returned.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(returned.load());  // not stuck waiting for a second free slot
    CHECK(pipeline.stats().slot_waits > waits_before);
    control.open();
    producer.join();
    for (auto& ticket : held) {
      CHECK(ticket.get() == expected_output(input));
    }
    CHECK(control.busy_slot_starts == 0);
  }

  TEST_CASE("grouped runs: run() starts whole groups at once, in id order, and lines up again after a partial one") {
    FakeControl control;
    GroupedPipeline pipeline(std::in_place, control, 8, 32, 4);
    // 20 items from slot 0: five whole groups, nothing started alone.
    const auto first = random_items(20, 32);
    const auto first_out = pipeline.run(spans_of(first));
    REQUIRE(first_out.size() == first.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
      REQUIRE(first_out[i] == expected_output(first[i]));
    }
    CHECK(control.group_starts == 5);
    CHECK(control.single_starts == 0);
    // 3 items (slots 4-6): too few for a group, started one by one.
    run_into_and_check(pipeline, random_items(3, 32), 64);
    CHECK(control.group_starts == 5);
    CHECK(control.single_starts == 3);
    // 9 items: slot 7 alone (the rest of its group), then two whole groups.
    const auto third = random_items(9, 32);
    const auto third_out = pipeline.run(spans_of(third));
    for (std::size_t i = 0; i < third.size(); ++i) {
      REQUIRE(third_out[i] == expected_output(third[i]));
    }
    CHECK(control.group_starts == 7);
    CHECK(control.single_starts == 4);
    CHECK(std::is_sorted(control.started_ids.begin(), control.started_ids.end()));
    CHECK(control.started_ids.size() == 32);
    CHECK(control.busy_slot_starts == 0);
    CHECK(pipeline.stats().completed == 32);
  }

  TEST_CASE("grouped runs: a failed group launch fails its items alone; a failed prepare starts the rest one by one") {
    FakeControl control;
    control.fail_group.insert(4);    // the second group's launch
    control.fail_prepare.insert(9);  // one item of the third group
    GroupedPipeline pipeline(std::in_place, control, 8, 32, 4);
    const auto items = random_items(16, 32);
    std::vector<std::vector<long long>> outputs(items.size(), std::vector<long long>(64, -7));
    std::vector<std::span<long long>> destinations(outputs.begin(), outputs.end());
    try {
      (void)pipeline.run(spans_of(items), destinations);
      FAIL("run() did not rethrow the group's failure");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "group launch failed at item 4");  // the first failure, in input order
    }
    const auto stats = pipeline.stats();
    CHECK(stats.completed == 11);  // 0-3, 8, 10, 11, 12-15
    CHECK(stats.failed == 5);      // 4-7 and 9
    for (std::size_t i : {0U, 1U, 2U, 3U, 8U, 10U, 11U, 12U, 15U}) {
      const auto expected = expected_output(items[i]);
      REQUIRE(std::equal(expected.begin(), expected.end(), outputs[i].begin()));
    }
    CHECK(control.group_starts == 3);   // 0-3, 4-7 (failed) and 12-15
    CHECK(control.single_starts == 3);  // 8, 10, 11
    CHECK(control.busy_slot_starts == 0);
    // The pipeline goes on.
    const auto after = random_items(8, 32);
    const auto after_out = pipeline.run(spans_of(after));
    for (std::size_t i = 0; i < after.size(); ++i) {
      REQUIRE(after_out[i] == expected_output(after[i]));
    }
  }

  TEST_CASE("grouped runs: a callback in flight that waits for the run never leaves the run waiting for its slot") {
    FakeControl control;
    GroupedPipeline pipeline(std::in_place, control, 4, 32, 4);
    const auto input = random_item(16);
    auto ticket0 = pipeline.submit(std::span<const int>(input));  // slot 0
    std::atomic<bool> saw_run_start{false};
    (void)pipeline.submit(std::span<const int>(input), [&](const replay::PipelineCompletion<long long>&) {
      // Waits (10 s at most) until the run below has started an item: a run
      // that waited for every slot of a group, this one's included, would not.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < deadline) {
        {
          std::lock_guard lock(control.mutex);
          if (std::find(control.started_ids.begin(), control.started_ids.end(), 4U) != control.started_ids.end()) {
            saw_run_start = true;
            return;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    auto ticket2 = pipeline.submit(std::span<const int>(input));
    auto ticket3 = pipeline.submit(std::span<const int>(input));
    CHECK(ticket0.get() == expected_output(input));  // slot 0 is free again; slot 1 is held by the callback
    const auto items = random_items(4, 32);
    const auto outputs = pipeline.run(spans_of(items));
    for (std::size_t i = 0; i < items.size(); ++i) {
      REQUIRE(outputs[i] == expected_output(items[i]));
    }
    CHECK(saw_run_start.load());
    CHECK(ticket2.get() == expected_output(input));
    CHECK(ticket3.get() == expected_output(input));
    CHECK(control.group_starts == 0);  // never four free slots in a row here
  }

  TEST_CASE("grouped runs and single submits from several threads at once: every output checked, every id once") {
    FakeControl control;
    GroupedPipeline pipeline(std::in_place, control, 8, 16, 4);
    constexpr int kRunners = 3;
    constexpr int kSubmitters = 2;
    std::vector<std::vector<std::uint64_t>> ids(kRunners + kSubmitters);
    std::atomic<std::size_t> total{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kRunners; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 40; ++round) {
          const auto items = random_items(static_cast<std::size_t>(1 + round % 12), 16);
          run_into_and_check(pipeline, items, 32);
          total += items.size();
        }
      });
    }
    for (int t = 0; t < kSubmitters; ++t) {
      threads.emplace_back([&, t] {
        auto& own = ids[static_cast<std::size_t>(kRunners + t)];
        for (int i = 0; i < 150; ++i) {
          const auto input = random_item(static_cast<std::size_t>(random_int(0, 16)));
          auto ticket = pipeline.submit(std::span<const int>(input));
          own.push_back(ticket.id());
          REQUIRE(ticket.get() == expected_output(input));
          ++total;
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    pipeline.drain();
    const auto stats = pipeline.stats();
    CHECK(stats.completed == total.load());
    CHECK(stats.failed == 0);
    CHECK(control.busy_slot_starts == 0);
    CHECK(control.started_ids.size() == total.load());
    std::set<std::uint64_t> unique(control.started_ids.begin(), control.started_ids.end());
    CHECK(unique.size() == total.load());  // every id started once
    CHECK(*unique.rbegin() == total.load() - 1);
    CHECK(std::is_sorted(control.finished_ids.begin(), control.finished_ids.end()));
    CHECK(control.group_starts > 0);
  }
}
