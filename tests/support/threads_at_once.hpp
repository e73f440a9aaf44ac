#pragma once
// Test helper: runs body(t, start) on `count` threads at once and returns
// each thread's failure by index ("" where it had none). A body that wants
// the threads to overlap calls start.arrive_and_wait() once its set-up is
// done; a thread that fails before it gets there still lets the others go,
// so one failure cannot leave the rest waiting forever.
#include <cstddef>
#include <exception>
#include <latch>
#include <string>
#include <thread>
#include <vector>

namespace replay_test {

// One thread's place at the common start.
class ThreadStart {
 public:
  explicit ThreadStart(std::latch& line) : line_(&line) {}

  // Waits until every thread has arrived (or ended without arriving).
  void arrive_and_wait() {
    arrived_ = true;
    line_->arrive_and_wait();
  }

  // The helper's part: a thread that never arrived still counts.
  void leave() {
    if (!arrived_) line_->count_down();
  }

 private:
  std::latch* line_;
  bool arrived_ = false;
};

template <typename Body>
std::vector<std::string> run_threads_at_once(int count, Body&& body) {
  std::vector<std::string> failures(static_cast<std::size_t>(count));
  std::latch line(count);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(count));
  const auto join_all = [&] {
    for (std::thread& thread : threads) thread.join();
  };
  try {
    for (int t = 0; t < count; ++t) {
      threads.emplace_back([&, t] {
        const auto index = static_cast<std::size_t>(t);
        ThreadStart start(line);
        try {
          body(t, start);
        } catch (const std::exception& error) {
          failures[index] = error.what();
        } catch (...) {
          failures[index] = "a failed assertion (above)";  // doctest's REQUIRE throws its own type
        }
        start.leave();
      });
    }
  } catch (...) {
    // A thread that could not be made: the others must not wait for it.
    line.count_down(count - static_cast<std::ptrdiff_t>(threads.size()));
    join_all();
    throw;
  }
  join_all();
  return failures;
}

}  // namespace replay_test
