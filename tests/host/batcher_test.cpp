// Batcher on the CPU with a stand-in executor: the gathering policy as a pure
// function, then the Batcher with real threads: delay bound, preferred sizes,
// back-pressure, deadlines, error isolation, shutdown with requests waiting,
// and no request lost, duplicated or mixed up under many producers; a
// Batcher destroyed from its own completion, and shutdown() out of memory.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "replay/batcher/batcher.hpp"
#include "replaced_allocation.hpp"

// Allocations on a thread fail while its flag is set: shutdown() must still
// answer every request and return (it is noexcept).
namespace {
thread_local bool t_fail_allocations = false;
}
void replay_test::before_each_allocation() {
  if (t_fail_allocations) {
    throw std::bad_alloc();
  }
}

namespace {

using namespace std::chrono_literals;

constexpr std::size_t kInRow = 3;
constexpr std::size_t kOutRow = 2;

// What the stand-in saw, and a gate that holds its run() until opened.
struct StandInState {
  std::mutex mutex;
  std::condition_variable changed;
  bool open = true;
  std::size_t entered = 0;                 // run() calls begun
  std::vector<std::size_t> batches;        // rows of each run()
  std::vector<float> first_values;         // row[0] of every row run

  void close() {
    std::lock_guard lock(mutex);
    open = false;
  }
  void release() {
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    changed.notify_all();
  }
  void wait_entered(std::size_t n) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return entered >= n; });
  }
};

// Output row of input row x: {x0 + x1 + x2, 2 * x0}. A row whose first value
// is negative makes its whole batch throw.
struct StandInExecutor {
  using input_type = float;
  using output_type = float;

  std::shared_ptr<StandInState> state = std::make_shared<StandInState>();
  std::vector<std::size_t> sizes{1, 2, 4, 8};
  std::vector<float> staging = std::vector<float>(8 * kInRow);
  std::vector<float> output = std::vector<float>(8 * kOutRow);

  std::size_t input_row_elements() const { return kInRow; }
  std::size_t output_row_elements() const { return kOutRow; }
  std::vector<std::size_t> batch_sizes() const { return sizes; }
  std::span<float> input_staging() { return staging; }
  std::span<const float> run(std::size_t rows) {
    {
      std::unique_lock lock(state->mutex);
      ++state->entered;
      state->changed.notify_all();
      state->changed.wait(lock, [&] { return state->open; });
      state->batches.push_back(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        state->first_values.push_back(staging[r * kInRow]);
      }
    }
    for (std::size_t r = 0; r < rows; ++r) {
      const float* x = &staging[r * kInRow];
      if (x[0] < 0) {
        throw std::runtime_error("poisoned row");
      }
      output[r * kOutRow] = x[0] + x[1] + x[2];
      output[r * kOutRow + 1] = 2 * x[0];
    }
    return {output.data(), rows * kOutRow};
  }
};
static_assert(replay::BatchExecutor<StandInExecutor>);

std::vector<float> rows_of(float first, std::size_t rows = 1) {
  std::vector<float> out(rows * kInRow);
  for (std::size_t r = 0; r < rows; ++r) {
    out[r * kInRow] = first + static_cast<float>(r);
    out[r * kInRow + 1] = 1.0F;
    out[r * kInRow + 2] = 2.0F;
  }
  return out;
}

std::vector<float> expected_of(const std::vector<float>& in) {
  std::vector<float> out;
  for (std::size_t r = 0; r < in.size() / kInRow; ++r) {
    const float* x = &in[r * kInRow];
    out.push_back(x[0] + x[1] + x[2]);
    out.push_back(2 * x[0]);
  }
  return out;
}

replay::BatcherOptions options_with(std::chrono::microseconds delay, std::vector<std::size_t> preferred = {}) {
  replay::BatcherOptions options;
  options.max_queue_delay = delay;
  options.preferred_batch_rows = std::move(preferred);
  return options;
}

// A Batcher in storage of the test's own, so that its destruction can be
// followed by scribbling over it: a worker that touched it afterwards would
// find garbage for a mutex and a queue, and hang or crash.
using StandInBatcher = replay::Batcher<StandInExecutor>;
struct BatcherStorage {
  alignas(StandInBatcher) unsigned char bytes[sizeof(StandInBatcher)];
};
std::shared_ptr<StandInBatcher> make_scribbled_on_destruction(StandInExecutor executor, replay::BatcherOptions options,
                                                              std::shared_ptr<std::atomic<bool>> destroyed) {
  auto storage = std::make_shared<BatcherStorage>();
  auto* batcher = new (storage->bytes) StandInBatcher(std::move(executor), std::move(options));
  return std::shared_ptr<StandInBatcher>(batcher, [storage, destroyed](StandInBatcher* b) {
    b->~StandInBatcher();
    std::memset(static_cast<void*>(storage->bytes), 0xA5, sizeof(storage->bytes));
    *destroyed = true;
  });
}

// Fulfils its promise when its thread exits (thread_local destructors run
// after the thread's function returned, so after anything the thread did).
struct ThreadExitWatch {
  std::shared_ptr<std::promise<void>> exited;
  ~ThreadExitWatch() {
    if (exited) {
      exited->set_value();
    }
  }
};
thread_local ThreadExitWatch t_exit_watch;

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("plan_batch: waits until full or due, then takes every request that fits") {
    const std::array<std::size_t, 4> preferred{1, 2, 4, 8};
    const replay::BatchPlanLimits limits{8, 0, preferred};
    using rows = std::vector<std::size_t>;
    auto plan = [](const rows& waiting, std::size_t overdue, const replay::BatchPlanLimits& l) {
      return replay::plan_batch(waiting, overdue, l);
    };
    CHECK(plan({}, 0, limits) == 0);
    CHECK(plan({1, 1, 1}, 0, limits) == 0);                  // not full, nobody due: wait
    CHECK(plan({1, 1, 1}, 1, limits) == 3);                  // due: all that fit (3 rows, padded to 4)
    CHECK(plan({2, 2, 2, 2, 1}, 0, limits) == 4);            // full at the largest preferred size
    CHECK(plan({4, 3, 2}, 0, limits) == 2);                  // the next does not fit: leaves at once
    CHECK(plan({1, 1, 1, 1, 1, 1, 1, 1, 1}, 0, limits) == 8);
    CHECK(plan({5, 1, 1, 1}, 0, limits) == 4);               // 5+1+1+1 = 8 rows: full

    const std::array<std::size_t, 1> only4{4};
    const replay::BatchPlanLimits prefer4{8, 0, only4};
    CHECK(plan({1, 1, 1}, 0, prefer4) == 0);
    CHECK(plan({1, 1, 1, 1, 1}, 0, prefer4) == 5);           // reached the largest preferred size: all that fit
    CHECK(plan({1, 1, 1}, 2, prefer4) == 3);

    const replay::BatchPlanLimits one_each{8, 1, preferred};
    CHECK(plan({1}, 0, one_each) == 1);                      // batching off: never waits
    CHECK(plan({2, 1}, 0, one_each) == 1);

    const replay::BatchPlanLimits no_preferred{6, 0, {}};
    CHECK(plan({2, 2}, 0, no_preferred) == 0);
    CHECK(plan({2, 2, 2}, 0, no_preferred) == 3);            // max_batch_rows reached
    CHECK(plan({2, 2}, 1, no_preferred) == 2);
  }

  TEST_CASE("plan_batch with trim_to_preferred: exactly a preferred size, never leaving an overdue request") {
    const std::array<std::size_t, 4> preferred{1, 2, 4, 8};
    const replay::BatchPlanLimits limits{8, 0, preferred, true};
    using rows = std::vector<std::size_t>;
    auto plan = [&](const rows& waiting, std::size_t overdue) { return replay::plan_batch(waiting, overdue, limits); };
    CHECK(plan({1, 1, 1}, 0) == 0);
    CHECK(plan({1, 1, 1}, 1) == 2);               // the longest exact prefix (2 rows); one young request stays
    CHECK(plan({1, 1, 1}, 3) == 3);               // every due request goes, padded
    CHECK(plan({1, 1, 1, 1, 1}, 1) == 4);         // 4 of 5
    CHECK(plan({3, 3}, 1) == 2);                  // no exact prefix holds the due one: all that fit
    CHECK(plan({4, 3, 2}, 0) == 1);               // leaves at once (2 does not fit), cut back to 4 rows
    CHECK(plan({4, 3, 2}, 2) == 2);               // ... but not below the overdue ones
    const std::array<std::size_t, 1> only4{4};
    const replay::BatchPlanLimits prefer4{8, 0, only4, true};
    CHECK(replay::plan_batch(std::vector<std::size_t>{1, 1, 1, 1, 1}, 0, prefer4) == 4);
  }

  TEST_CASE("padded_batch_rows rounds up to the executor's sizes") {
    const std::array<std::size_t, 4> sizes{1, 2, 4, 8};
    CHECK(replay::padded_batch_rows(sizes, 1) == 1);
    CHECK(replay::padded_batch_rows(sizes, 3) == 4);
    CHECK(replay::padded_batch_rows(sizes, 8) == 8);
    CHECK(replay::padded_batch_rows(sizes, 9) == 9);
  }

  TEST_CASE("Batcher: bad options are refused with a clear usage_error") {
    auto make = [](replay::BatcherOptions options) { replay::Batcher batcher(StandInExecutor{}, std::move(options)); };
    replay::BatcherOptions options;
    options.max_batch_rows = 9;
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("largest batch is 8 rows"), replay::usage_error);
    options = {};
    options.preferred_batch_rows = {4, 2};
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("strictly ascending"), replay::usage_error);
    options = {};
    options.queue_capacity = 0;
    CHECK_THROWS_AS(make(options), replay::usage_error);
    StandInExecutor bad;
    bad.sizes = {4, 2};
    CHECK_THROWS_AS(replay::Batcher(std::move(bad)), replay::usage_error);
    replay::Batcher batcher(StandInExecutor{}, options_with(0us));
    CHECK_THROWS_WITH_AS(batcher.submit(rows_of(1.0F), replay::Batcher<StandInExecutor>::completion_type{}),
                         doctest::Contains("empty completion"), replay::usage_error);
  }

  TEST_CASE("Batcher: too large and malformed requests get a clear status, never queued") {
    replay::Batcher batcher(StandInExecutor{}, options_with(0us));
    auto big = batcher.submit(rows_of(1.0F, 9)).get();
    CHECK(big.status == replay::BatchStatus::too_large);
    CHECK(big.message.find("9 rows") != std::string::npos);
    CHECK(big.message.find("8 rows") != std::string::npos);
    const std::vector<float> ragged(4, 1.0F);
    auto bad = batcher.submit(ragged).get();
    CHECK(bad.status == replay::BatchStatus::invalid_request);
    CHECK(bad.message.find("3 elements") != std::string::npos);
    CHECK(batcher.submit(std::span<const float>{}).get().status == replay::BatchStatus::invalid_request);
    const auto stats = batcher.stats();
    CHECK(stats.too_large == 1);
    CHECK(stats.invalid == 2);
    CHECK(stats.enqueued == 0);
    CHECK(stats.batches == 0);
  }

  TEST_CASE("Batcher: a batch that is not full waits the maximum queue delay, and no longer than needed") {
    const auto delay = 30ms;
    replay::Batcher batcher(StandInExecutor{}, options_with(delay, {8}));
    const auto start = std::chrono::steady_clock::now();
    auto result = batcher.submit(rows_of(5.0F)).get();
    const auto elapsed = std::chrono::steady_clock::now() - start;
    REQUIRE(result.ok());
    CHECK(result.output == expected_of(rows_of(5.0F)));
    CHECK(result.queue_delay >= delay);  // it could not have left earlier: the batch was not full
    CHECK(elapsed >= delay);
    CHECK(result.batch_rows == 1);
    CHECK(result.padded_rows == 1);

    // A full batch does not wait: with a delay of an hour, 8 rows leave at once.
    replay::Batcher patient(StandInExecutor{}, options_with(std::chrono::hours(1), {8}));
    std::vector<std::future<replay::BatchResult<float>>> futures;
    for (int i = 0; i < 8; ++i) {
      futures.push_back(patient.submit(rows_of(static_cast<float>(i))));
    }
    for (int i = 0; i < 8; ++i) {
      REQUIRE(futures[i].wait_for(std::chrono::minutes(2)) == std::future_status::ready);
      auto r = futures[i].get();
      CHECK(r.ok());
      CHECK(r.batch_rows == 8);
      CHECK(r.output == expected_of(rows_of(static_cast<float>(i))));
    }
  }

  TEST_CASE("Batcher: preferred sizes and trimming shape the batches; padding is counted") {
    for (const bool trim : {false, true}) {
      CAPTURE(trim);
      StandInExecutor executor;
      auto state = executor.state;
      // Requests younger than the delay may be left behind by trimming; overdue ones never.
      replay::BatcherOptions options = options_with(200ms, {4});
      options.trim_to_preferred = trim;
      replay::Batcher batcher(std::move(executor), options);
      state->close();
      auto first = batcher.submit(rows_of(100.0F));  // runs alone and holds the worker
      state->wait_entered(1);
      std::vector<std::future<replay::BatchResult<float>>> futures;
      for (int i = 0; i < 7; ++i) {
        futures.push_back(batcher.submit(rows_of(static_cast<float>(i))));
      }
      state->release();
      CHECK(first.get().ok());
      for (int i = 0; i < 7; ++i) {
        auto r = futures[i].get();
        CHECK(r.ok());
        CHECK(r.output == expected_of(rows_of(static_cast<float>(i))));
      }
      const auto stats = batcher.stats();
      CHECK(stats.rows == 8);
      CHECK(stats.completed == 8);
      if (trim) {
        // 7 waiting, none due: exactly 4 leave at once, then 3 (padded to 4) when due.
        CHECK(state->batches == std::vector<std::size_t>{1, 4, 3});
        CHECK(stats.padded_rows == 9);
        CHECK(stats.batch_rows_histogram[4] == 1);
        CHECK(stats.batch_rows_histogram[3] == 1);
        CHECK(stats.padding_waste() == doctest::Approx(1.0 / 8.0));
      } else {
        // 7 waiting reach the largest preferred size (4): all 7 leave, padded to 8.
        CHECK(state->batches == std::vector<std::size_t>{1, 7});
        CHECK(stats.padded_rows == 9);
        CHECK(stats.batch_rows_histogram[7] == 1);
        CHECK(stats.batch_requests_histogram[7] == 1);
      }
    }
  }

  TEST_CASE("Batcher: a full queue makes try_submit refuse and submit wait") {
    StandInExecutor executor;
    auto state = executor.state;
    replay::BatcherOptions options = options_with(0us);
    options.queue_capacity = 2;
    options.max_batch_requests = 1;
    replay::Batcher batcher(std::move(executor), options);
    state->close();
    auto running = batcher.submit(rows_of(1.0F));
    state->wait_entered(1);
    auto queued_a = batcher.submit(rows_of(2.0F));
    auto queued_b = batcher.submit(rows_of(3.0F));
    auto refused = batcher.try_submit(rows_of(4.0F)).get();
    CHECK(refused.status == replay::BatchStatus::queue_full);
    CHECK(refused.message.find("2 requests") != std::string::npos);

    std::atomic<bool> returned{false};
    std::future<replay::BatchResult<float>> waited;
    std::thread producer([&] {
      waited = batcher.submit(rows_of(5.0F));  // blocks: no room
      returned = true;
    });
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(returned.load());
    state->release();
    producer.join();
    CHECK(returned.load());
    for (auto* f : {&running, &queued_a, &queued_b, &waited}) {
      CHECK(f->get().ok());
    }
    CHECK(batcher.stats().refused == 1);
    CHECK(state->first_values == std::vector<float>{1.0F, 2.0F, 3.0F, 5.0F});
  }

  TEST_CASE("Batcher: an expired request is answered timed_out and not run") {
    StandInExecutor executor;
    auto state = executor.state;
    replay::BatcherOptions options = options_with(0us);
    options.queue_capacity = 1;
    replay::Batcher batcher(std::move(executor), options);
    state->close();
    auto running = batcher.submit(rows_of(1.0F));
    state->wait_entered(1);
    auto expiring = batcher.submit(rows_of(7.0F), {.deadline = std::chrono::steady_clock::now() + 1ms});
    // The queue is full (capacity 1): this one times out while waiting for room.
    auto blocked = batcher.submit(rows_of(8.0F), {.deadline = std::chrono::steady_clock::now() + 20ms}).get();
    CHECK(blocked.status == replay::BatchStatus::timed_out);
    state->release();
    CHECK(running.get().ok());
    auto expired = expiring.get();
    CHECK(expired.status == replay::BatchStatus::timed_out);
    CHECK(expired.message.find("deadline") != std::string::npos);
    CHECK(expired.output.empty());
    CHECK(batcher.submit(rows_of(9.0F)).get().ok());
    CHECK(state->first_values == std::vector<float>{1.0F, 9.0F});  // 7 and 8 never ran
    CHECK(batcher.stats().timed_out == 2);
  }

  TEST_CASE("Batcher: a failing batch fails exactly its own requests") {
    StandInExecutor executor;
    auto state = executor.state;
    replay::BatcherOptions options = options_with(0us);
    options.max_batch_rows = 4;
    replay::Batcher batcher(std::move(executor), options);
    state->close();
    auto first = batcher.submit(rows_of(50.0F));
    state->wait_entered(1);
    std::vector<std::future<replay::BatchResult<float>>> futures;
    for (int i = 0; i < 8; ++i) {
      futures.push_back(batcher.submit(rows_of(i == 2 ? -1.0F : static_cast<float>(i))));  // #2 poisons batch 1
    }
    state->release();
    CHECK(first.get().ok());
    for (int i = 0; i < 8; ++i) {
      auto r = futures[i].get();
      if (i < 4) {
        CHECK(r.status == replay::BatchStatus::failed);
        CHECK(r.message.find("poisoned row") != std::string::npos);
        CHECK(r.message.find("4 rows") != std::string::npos);
        CHECK(r.output.empty());
      } else {
        CHECK(r.ok());
        CHECK(r.output == expected_of(rows_of(static_cast<float>(i))));
      }
    }
    const auto stats = batcher.stats();
    CHECK(stats.failed == 4);
    CHECK(stats.failed_batches == 1);
    CHECK(stats.completed == 5);
  }

  TEST_CASE("Batcher: a throwing completion does not stop the worker") {
    replay::Batcher batcher(StandInExecutor{}, options_with(0us));
    batcher.submit(rows_of(1.0F), [](replay::BatchResult<float>) { throw std::runtime_error("careless callback"); });
    CHECK(batcher.submit(rows_of(2.0F)).get().ok());
  }

  TEST_CASE("Batcher: shutdown(cancel) fails the waiting requests; later submissions are refused") {
    StandInExecutor executor;
    auto state = executor.state;
    auto batcher = std::make_unique<replay::Batcher<StandInExecutor>>(std::move(executor), options_with(0us));
    state->close();
    auto running = batcher->submit(rows_of(1.0F));
    state->wait_entered(1);
    std::vector<std::future<replay::BatchResult<float>>> waiting;
    for (int i = 0; i < 5; ++i) {
      waiting.push_back(batcher->submit(rows_of(static_cast<float>(10 + i))));
    }
    std::thread stopper([&] { batcher->shutdown(replay::ShutdownMode::cancel); });
    for (auto& f : waiting) {
      auto r = f.get();  // cancelled before the worker is joined
      CHECK(r.status == replay::BatchStatus::shut_down);
      CHECK(r.message.find("shut down") != std::string::npos);
    }
    CHECK_FALSE(batcher->accepting());
    auto late = batcher->submit(rows_of(3.0F)).get();
    CHECK(late.status == replay::BatchStatus::shut_down);
    state->release();
    stopper.join();
    CHECK(running.get().ok());  // the batch already running completes
    CHECK(state->first_values == std::vector<float>{1.0F});
    const auto stats = batcher->stats();
    CHECK(stats.cancelled == 5);
    CHECK(stats.rejected_shut_down == 1);
    batcher.reset();
  }

  TEST_CASE("Batcher: shutdown(drain) runs every waiting request, even with a long delay") {
    StandInExecutor executor;
    auto state = executor.state;
    replay::Batcher batcher(std::move(executor), options_with(std::chrono::hours(1), {8}));
    std::vector<std::future<replay::BatchResult<float>>> waiting;
    for (int i = 0; i < 3; ++i) {
      waiting.push_back(batcher.submit(rows_of(static_cast<float>(i))));
    }
    batcher.shutdown(replay::ShutdownMode::drain);
    for (int i = 0; i < 3; ++i) {
      auto r = waiting[i].get();
      CHECK(r.ok());
      CHECK(r.output == expected_of(rows_of(static_cast<float>(i))));
    }
    batcher.shutdown();  // idempotent
  }

  TEST_CASE("Batcher: many producers, nothing lost, duplicated or mixed up") {
    constexpr int kThreads = 8;
    constexpr int kPerThread = 400;
    StandInExecutor executor;
    auto state = executor.state;
    replay::BatcherOptions options = options_with(200us);
    options.queue_capacity = 16;  // back-pressure too
    replay::Batcher batcher(std::move(executor), options);
    std::vector<std::atomic<int>> deliveries(kThreads * kPerThread);
    std::atomic<int> wrong{0};
    std::vector<std::thread> producers;
    for (int t = 0; t < kThreads; ++t) {
      producers.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t) * 7919U + 1U);
        std::uniform_int_distribution<std::size_t> rows(1, 3);
        for (int i = 0; i < kPerThread; ++i) {
          const int id = t * kPerThread + i;
          auto input = rows_of(static_cast<float>(id) * 8.0F, rows(rng));  // distinct first values per request
          auto expected = expected_of(input);
          if (i % 2 == 0) {
            batcher.submit(input, [&, id, expected](replay::BatchResult<float> r) {
              deliveries[static_cast<std::size_t>(id)]++;
              if (!r.ok() || r.output != expected) {
                wrong++;
              }
            });
          } else {
            auto r = batcher.submit(input).get();
            deliveries[static_cast<std::size_t>(id)]++;
            if (!r.ok() || r.output != expected) {
              wrong++;
            }
          }
        }
      });
    }
    for (auto& p : producers) {
      p.join();
    }
    batcher.shutdown();
    CHECK(wrong.load() == 0);
    int not_once = 0;
    for (auto& d : deliveries) {
      not_once += d.load() == 1 ? 0 : 1;
    }
    CHECK(not_once == 0);
    const auto stats = batcher.stats();
    CHECK(stats.enqueued == kThreads * kPerThread);
    CHECK(stats.completed == kThreads * kPerThread);
    std::uint64_t histogram_rows = 0;
    for (std::size_t n = 0; n < stats.batch_rows_histogram.size(); ++n) {
      histogram_rows += n * stats.batch_rows_histogram[n];
    }
    CHECK(histogram_rows == stats.rows);
    CHECK(state->first_values.size() == stats.rows);
    std::uint64_t delays = 0;
    for (auto c : stats.queue_delay_histogram) {
      delays += c;
    }
    CHECK(delays == stats.completed);
    CHECK(stats.queue_delay_p99_us >= stats.queue_delay_p50_us);
  }

  TEST_CASE("Batcher: the last owner dropped inside a completion: the rest is completed, the worker ends on its own") {
    // Old code: the destructor ran on the worker, which cannot join itself:
    // std::terminate.
    for (const bool held_by_request : {false, true}) {
      CAPTURE(held_by_request);
      StandInExecutor executor;
      auto state = executor.state;
      replay::BatcherOptions options = options_with(0us);
      options.max_batch_requests = 2;
      auto destroyed = std::make_shared<std::atomic<bool>>(false);
      std::shared_ptr<StandInBatcher> holder = make_scribbled_on_destruction(std::move(executor), options, destroyed);
      StandInBatcher* batcher = holder.get();
      auto worker_exited = std::make_shared<std::promise<void>>();
      std::future<void> worker_gone = worker_exited->get_future();
      state->close();
      auto running = batcher->submit(rows_of(0.0F));  // holds the worker in run()
      state->wait_entered(1);
      // Request 1 (batched with request 2) ends the Batcher: its completion
      // drops the last owner, or it holds the last owner itself.
      std::promise<replay::BatchResult<float>> first;
      std::future<replay::BatchResult<float>> first_result = first.get_future();
      if (held_by_request) {
        batcher->submit(rows_of(1.0F), [&first, worker_exited, keep = holder](replay::BatchResult<float> r) {
          t_exit_watch.exited = worker_exited;
          first.set_value(std::move(r));
        });
      } else {
        batcher->submit(rows_of(1.0F), [&first, &holder, worker_exited](replay::BatchResult<float> r) {
          t_exit_watch.exited = worker_exited;
          first.set_value(std::move(r));
          holder.reset();
        });
      }
      std::vector<std::future<replay::BatchResult<float>>> later;
      for (int i = 2; i <= 4; ++i) {  // 2: the same batch; 3 and 4: still waiting, drained by the destructor
        later.push_back(batcher->submit(rows_of(static_cast<float>(i))));
      }
      if (held_by_request) {
        holder.reset();
      }
      state->release();
      CHECK(running.get().ok());
      auto r1 = first_result.get();
      CHECK(r1.ok());
      CHECK(r1.output == expected_of(rows_of(1.0F)));
      for (int i = 2; i <= 4; ++i) {
        REQUIRE(later[i - 2].wait_for(std::chrono::seconds(30)) == std::future_status::ready);
        auto r = later[i - 2].get();
        CHECK(r.ok());
        CHECK(r.output == expected_of(rows_of(static_cast<float>(i))));
      }
      // The worker ends without touching the scribbled-over Batcher.
      REQUIRE(worker_gone.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
      CHECK(destroyed->load());
      CHECK(state->first_values == std::vector<float>{0.0F, 1.0F, 2.0F, 3.0F, 4.0F});
    }
  }

  TEST_CASE("Batcher: a cancelled request whose completion drops the last owner: the others are still cancelled") {
    // Old code: shutdown() went on to join through the destroyed Batcher.
    StandInExecutor executor;
    auto state = executor.state;
    auto destroyed = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<StandInBatcher> holder = make_scribbled_on_destruction(std::move(executor), options_with(0us), destroyed);
    StandInBatcher* batcher = holder.get();
    state->close();
    auto running = batcher->submit(rows_of(0.0F));
    state->wait_entered(1);
    std::promise<void> dropping;
    std::atomic<bool> first_cancelled{false};
    batcher->submit(rows_of(1.0F), [&](replay::BatchResult<float> r) {
      first_cancelled = r.status == replay::BatchStatus::shut_down;
      dropping.set_value();
      holder.reset();  // the destructor joins the worker, which waits for release() below
    });
    std::vector<std::future<replay::BatchResult<float>>> waiting;
    for (int i = 2; i <= 3; ++i) {
      waiting.push_back(batcher->submit(rows_of(static_cast<float>(i))));
    }
    std::thread stopper([batcher] { batcher->shutdown(replay::ShutdownMode::cancel); });
    dropping.get_future().wait();
    state->release();
    stopper.join();
    CHECK(first_cancelled.load());
    CHECK(running.get().ok());
    for (auto& f : waiting) {
      const auto r = f.get();
      CHECK(r.status == replay::BatchStatus::shut_down);
      CHECK(r.message.find("shut down") != std::string::npos);
    }
    CHECK(destroyed->load());
    CHECK(state->first_values == std::vector<float>{0.0F});
  }

  TEST_CASE("Batcher: shutdown() cannot terminate: out of memory, every waiting request is still answered") {
    // Old code: shutdown(cancel) is noexcept but copied the waiting requests
    // into a vector; bad_alloc there called std::terminate.
    constexpr int kWaiting = 5;
    StandInExecutor executor;
    auto state = executor.state;
    replay::Batcher batcher(std::move(executor), options_with(0us));
    state->close();
    auto running = batcher.submit(rows_of(0.0F));
    state->wait_entered(1);
    std::array<std::atomic<int>, kWaiting> statuses{};
    std::array<std::atomic<bool>, kWaiting> with_message{};
    std::atomic<int> answered{0};
    for (int i = 0; i < kWaiting; ++i) {
      statuses[i] = -1;
      batcher.submit(rows_of(static_cast<float>(10 + i)), [&, i](replay::BatchResult<float> r) {
        statuses[i] = static_cast<int>(r.status);
        with_message[i] = !r.message.empty();
        answered.fetch_add(1);
        answered.notify_all();
      });
    }
    std::atomic<bool> returned{false};
    std::thread stopper([&] {
      t_fail_allocations = true;
      batcher.shutdown(replay::ShutdownMode::cancel);  // the worker is busy: this answers the waiting requests
      t_fail_allocations = false;
      returned = true;
    });
    for (int n = answered.load(); n < kWaiting; n = answered.load()) {
      answered.wait(n);
    }
    state->release();  // shutdown() then joins the worker
    stopper.join();
    CHECK(returned.load());
    for (int i = 0; i < kWaiting; ++i) {
      CHECK(statuses[i].load() == static_cast<int>(replay::BatchStatus::shut_down));
      CHECK_FALSE(with_message[i].load());  // no memory for the message: the status alone
    }
    CHECK(running.get().ok());
    CHECK(batcher.stats().cancelled == kWaiting);
    CHECK(state->first_values == std::vector<float>{0.0F});
  }
}
