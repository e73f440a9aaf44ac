#pragma once
// Test helper: submits every input to a Batcher from `threads` producer
// threads (each waits for its answers in turn) and returns the answers by
// input index.
#include <cstddef>
#include <thread>
#include <vector>

namespace replay_test {

template <class Batcher, class In>
std::vector<typename Batcher::result_type> submit_from_threads(Batcher& batcher,
                                                               const std::vector<std::vector<In>>& inputs,
                                                               int threads) {
  std::vector<typename Batcher::result_type> results(inputs.size());
  std::vector<std::thread> producers;
  for (int t = 0; t < threads; ++t) {
    producers.emplace_back([&, t] {
      for (std::size_t id = static_cast<std::size_t>(t); id < inputs.size(); id += static_cast<std::size_t>(threads)) {
        results[id] = batcher.submit(inputs[id]).get();
      }
    });
  }
  for (auto& p : producers) {
    p.join();
  }
  return results;
}

}  // namespace replay_test
