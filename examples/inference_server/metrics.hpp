#pragma once
// The server's answer counts, for /v1/stats and /metrics: every answer the
// server writes, by endpoint and status, whatever produced it (a handler,
// httplib's own 400, the exception handler's 500, a 503 at capacity, a 408);
// latency for /v1/infer; verification counts (--verify).
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace inference_server {

class Metrics {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Endpoint : std::uint8_t { infer, other };  // /v1/infer, everything else
  static constexpr std::array<double, 14> bounds_us{50,     100,    250,     500,     1'000,   2'500,     5'000,
                                                    10'000, 25'000, 50'000, 100'000, 250'000, 1'000'000, 5'000'000};

  void record(Endpoint endpoint, int code, Clock::duration latency) {
    counts(endpoint)[static_cast<std::size_t>(code < 100 || code >= 600 ? 599 : code)].fetch_add(
        1, std::memory_order_relaxed);
    if (endpoint != Endpoint::infer) {
      return;
    }
    const double us = std::chrono::duration<double, std::micro>(latency).count();
    std::size_t b = 0;
    while (b < bounds_us.size() && us > bounds_us[b]) {
      ++b;
    }
    latency_[b].fetch_add(1, std::memory_order_relaxed);
    latency_sum_ns_.fetch_add(
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(latency).count()),
        std::memory_order_relaxed);
  }
  std::uint64_t code(Endpoint endpoint, int c) const {
    return counts(endpoint)[static_cast<std::size_t>(c)].load(std::memory_order_relaxed);
  }
  std::uint64_t latency_bucket(std::size_t b) const { return latency_[b].load(std::memory_order_relaxed); }
  double latency_sum_s() const { return static_cast<double>(latency_sum_ns_.load(std::memory_order_relaxed)) * 1e-9; }

  std::atomic<std::uint64_t> verified{0};
  std::atomic<std::uint64_t> mismatches{0};
  std::atomic<std::uint64_t> unverifiable{0};  // carried an id but not that id's input

 private:
  using Counts = std::array<std::atomic<std::uint64_t>, 600>;
  Counts& counts(Endpoint e) { return e == Endpoint::infer ? infer_codes_ : other_codes_; }
  const Counts& counts(Endpoint e) const { return e == Endpoint::infer ? infer_codes_ : other_codes_; }

  Counts infer_codes_{};
  Counts other_codes_{};
  std::array<std::atomic<std::uint64_t>, bounds_us.size() + 1> latency_{};
  std::atomic<std::uint64_t> latency_sum_ns_{0};
};

}  // namespace inference_server
