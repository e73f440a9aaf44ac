// StreamPipeline on the device: 10k random items with every output checked,
// pinned and pageable inputs and destinations, failures confined to their item,
// back-pressure, drain on destruction, graph modes, and a GraphExec reading
// through fixed buffers as the compute stage.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <source_location>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "gpu_suite.hpp"
#include "replay/replay.hpp"
#include "replay/torch/detail/copy_graph.hpp"
#include "replay/stream_pipeline.hpp"

namespace {

bool under_sanitizer() { return std::getenv("REPLAY_UNDER_SANITIZER") != nullptr; }

std::size_t random_size(std::size_t lo, std::size_t hi) {
  return lo + static_cast<std::size_t>(replay_test::rng()() % (hi - lo + 1));
}

// out[i] = 2 in[i] + 1. Exact in float: the doubling is exact, so fused or
// not, the result is rounded once and the host computes the same value.
__global__ void affine_kernel(const float* in, float* out, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    out[i] = 2.0F * in[i] + 1.0F;
  }
}

float expected_affine(float x) { return 2.0F * x + 1.0F; }

// Writes min(in, out) elements: an output_count below n shortens the output.
void affine(replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
  const std::size_t n = std::min(in.size(), out.size());
  if (n == 0) {
    return;
  }
  const auto blocks = static_cast<unsigned>((n + 255) / 256);
  affine_kernel<<<blocks, 256, 0, s.get()>>>(in.data(), out.data(), n);
  replay::check_last_launch("affine_kernel");
}

// out[j] = in[2j] + in[2j+1] (the last one alone when n is odd), widened.
__global__ void pair_sum_kernel(const std::uint32_t* in, std::uint64_t* out, std::size_t n) {
  const std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (2 * j < n) {
    std::uint64_t sum = in[2 * j];
    if (2 * j + 1 < n) {
      sum += in[2 * j + 1];
    }
    out[j] = sum;
  }
}

// Spins until *flag is non-zero (or about 20 s pass, so a failing test cannot hang).
__global__ void wait_for_flag_kernel(const volatile int* flag, long long max_cycles) {
  const long long start = clock64();
  while (*flag == 0 && clock64() - start < max_cycles) {
    __nanosleep(1000);
  }
}

// Keeps the stream busy for about `cycles` clock cycles.
__global__ void delay_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
    __nanosleep(200);
  }
}

// Index of the first element of `out` that is not 2 in + 1, or npos.
std::size_t first_mismatch(std::span<const float> in, std::span<const float> out) {
  if (in.size() != out.size()) {
    return 0;
  }
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (out[i] != expected_affine(in[i])) {
      return i;
    }
  }
  return std::numeric_limits<std::size_t>::max();
}
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

}  // namespace

TEST_SUITE("gpu" * replay_test::needs_device()) {
  TEST_CASE("10k items of distinct random data and random sizes: every output checked, every memory path") {
    const std::size_t capacity = 4096;
    const std::size_t items = under_sanitizer() ? 1000 : 10000;
    std::vector<std::size_t> offsets(items + 1, 0);
    for (std::size_t i = 0; i < items; ++i) {
      offsets[i + 1] = offsets[i] + random_size(1, capacity);
    }
    const std::size_t total = offsets[items];
    const std::vector<float> data = replay_test::random_floats(total);
    replay::PinnedBuffer<float> pinned_in(total);
    replay::PinnedBuffer<float> pinned_out(total);
    std::vector<float> pageable_out(total, -1.0F);
    std::memcpy(pinned_in.data(), data.data(), total * sizeof(float));

    std::vector<replay::PipelineTicket<std::vector<float>>> vector_tickets(items);
    std::vector<replay::PipelineTicket<std::size_t>> count_tickets(items);
    std::vector<std::vector<float>> callback_outputs(items);
    std::atomic<std::size_t> callbacks{0};
    std::size_t pinned_inputs = 0;
    std::size_t pinned_destinations = 0;
    replay::PipelineStats stats;
    {
      replay::StreamPipeline<float> pipeline({.input_capacity = capacity, .slots = 3}, affine);
      for (std::size_t i = 0; i < items; ++i) {
        const std::size_t offset = offsets[i];
        const std::size_t n = offsets[i + 1] - offset;
        const bool pinned_input = ((i >> 2) & 1) != 0;  // every delivery kind with both input kinds
        pinned_inputs += pinned_input ? 1 : 0;
        const std::span<const float> in(pinned_input ? pinned_in.data() + offset : data.data() + offset, n);
        switch (i % 4) {
          case 0: vector_tickets[i] = pipeline.submit(in); break;
          case 1: count_tickets[i] = pipeline.submit(in, std::span<float>(pageable_out.data() + offset, n)); break;
          case 2:
            ++pinned_destinations;
            count_tickets[i] = pipeline.submit(in, std::span<float>(pinned_out.data() + offset, n));
            break;
          default:
            (void)pipeline.submit(in, [&, i](const replay::PipelineCompletion<float>& done) {
              if (done.ok() && done.id == i) {
                callback_outputs[i].assign(done.output.begin(), done.output.end());
              }
              ++callbacks;
            });
        }
      }
      pipeline.drain();
      stats = pipeline.stats();
    }
    CHECK(stats.submitted == items);
    CHECK(stats.completed == items);
    CHECK(stats.failed == 0);
    CHECK(stats.inputs_in_place == pinned_inputs);  // pinned inputs were not copied on the host
    CHECK(stats.inputs_staged == items - pinned_inputs);
    CHECK(stats.outputs_direct == pinned_destinations);
    CHECK(stats.outputs_staged == items - pinned_destinations);
    CHECK(callbacks.load() == items / 4);
    for (std::size_t i = 0; i < items; ++i) {
      const std::size_t offset = offsets[i];
      const std::size_t n = offsets[i + 1] - offset;
      const std::span<const float> in(data.data() + offset, n);
      INFO("item " << i << " of " << n << " elements, delivery " << i % 4);
      switch (i % 4) {
        case 0: {
          REQUIRE(vector_tickets[i].id() == i);
          const auto out = vector_tickets[i].get();
          REQUIRE(first_mismatch(in, out) == kNone);
          break;
        }
        case 1:
          REQUIRE(count_tickets[i].id() == i);
          REQUIRE(count_tickets[i].get() == n);
          REQUIRE(first_mismatch(in, std::span<const float>(pageable_out.data() + offset, n)) == kNone);
          break;
        case 2:
          REQUIRE(count_tickets[i].get() == n);
          REQUIRE(first_mismatch(in, std::span<const float>(pinned_out.data() + offset, n)) == kNone);
          break;
        default: REQUIRE(first_mismatch(in, callback_outputs[i]) == kNone);
      }
    }
  }

  TEST_CASE("different element types, and a compute stage that reports its output count, through run(range)") {
    const std::size_t capacity = 1000;
    replay::StreamPipeline<std::uint32_t, std::uint64_t> pipeline(
        {.input_capacity = capacity, .output_capacity = capacity / 2, .slots = 2},
        [](replay::BufferView<std::uint32_t> in, replay::BufferView<std::uint64_t> out,
           replay::StreamRef s) -> std::size_t {
          const std::size_t pairs = (in.size() + 1) / 2;
          if (pairs > out.size()) {
            throw std::length_error("output too small");
          }
          if (pairs != 0) {
            pair_sum_kernel<<<static_cast<unsigned>((pairs + 127) / 128), 128, 0, s.get()>>>(in.data(), out.data(),
                                                                                            in.size());
            replay::check_last_launch("pair_sum_kernel");
          }
          return pairs;
        });
    const std::size_t items = under_sanitizer() ? 300 : 2000;
    std::vector<std::vector<std::uint32_t>> inputs(items);
    for (auto& in : inputs) {
      in.resize(random_size(0, capacity));
      for (auto& x : in) {
        x = static_cast<std::uint32_t>(replay_test::rng()());
      }
    }
    const auto outputs = pipeline.run(inputs);
    REQUIRE(outputs.size() == items);
    for (std::size_t i = 0; i < items; ++i) {
      const auto& in = inputs[i];
      REQUIRE(outputs[i].size() == (in.size() + 1) / 2);
      for (std::size_t j = 0; j < outputs[i].size(); ++j) {
        const std::uint64_t expected =
            std::uint64_t{in[2 * j]} + (2 * j + 1 < in.size() ? std::uint64_t{in[2 * j + 1]} : 0);
        if (outputs[i][j] != expected) {
          FAIL("item " << i << " element " << j << ": " << outputs[i][j] << " != " << expected);
        }
      }
    }
  }

  TEST_CASE("an injected failure reaches only its item; items before and after are intact") {
    const std::size_t capacity = 2048;
    const int throw_at = 10 + static_cast<int>(replay_test::rng()() % 40);
    const int bad_launch_at = throw_at + 20 + static_cast<int>(replay_test::rng()() % 30);
    const int partial_at = bad_launch_at + 20 + static_cast<int>(replay_test::rng()() % 30);
    int calls = 0;  // the compute stage runs once per submit, in order, on the producer thread
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = 3},
        [&](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          const int index = calls++;
          if (index == throw_at) {
            throw std::runtime_error("injected failure");
          }
          if (index == bad_launch_at) {
            if (under_sanitizer()) {
              throw std::invalid_argument("injected bad launch");  // the sanitizer reports real API errors
            }
            affine_kernel<<<1, 4096, 0, s.get()>>>(in.data(), out.data(), in.size());  // > 1024 threads
            replay::check_last_launch("deliberately invalid launch");
          }
          affine(in, out, s);
          if (index == partial_at) {
            throw std::domain_error("failure after issuing work");  // the kernel above is in flight
          }
        });
    const std::size_t items = static_cast<std::size_t>(partial_at) + 60;
    std::vector<std::vector<float>> inputs(items);
    std::vector<std::vector<float>> destinations(items);
    std::vector<replay::PipelineTicket<std::vector<float>>> vector_tickets(items);
    std::vector<replay::PipelineTicket<std::size_t>> count_tickets(items);
    for (std::size_t i = 0; i < items; ++i) {
      inputs[i] = replay_test::random_floats(random_size(1, capacity));
      if (i % 2 == 0) {
        vector_tickets[i] = pipeline.submit(std::span<const float>(inputs[i]));
      } else {
        destinations[i].assign(inputs[i].size(), 0.0F);
        count_tickets[i] = pipeline.submit(std::span<const float>(inputs[i]), std::span<float>(destinations[i]));
      }
    }
    const auto get = [&](std::size_t i) -> std::vector<float> {
      if (i % 2 == 0) {
        return vector_tickets[i].get();
      }
      (void)count_tickets[i].get();
      return destinations[i];
    };
    for (std::size_t i = 0; i < items; ++i) {
      INFO("item " << i);
      if (i == static_cast<std::size_t>(throw_at)) {
        CHECK_THROWS_WITH_AS(get(i), doctest::Contains("injected failure"), std::runtime_error);
      } else if (i == static_cast<std::size_t>(bad_launch_at)) {
        if (under_sanitizer()) {
          CHECK_THROWS_AS(get(i), std::invalid_argument);
        } else {
          try {
            (void)get(i);
            FAIL("the invalid launch did not fail its item");
          } catch (const replay::cuda_error& e) {
            // Which status an impossible launch configuration gets depends on the
            // driver (invalid configuration, or invalid value on current ones).
            CHECK((e.status() == cudaErrorInvalidConfiguration || e.status() == cudaErrorInvalidValue));
            CHECK(std::string(e.what()).find("deliberately invalid launch") != std::string::npos);
          }
        }
      } else if (i == static_cast<std::size_t>(partial_at)) {
        CHECK_THROWS_WITH_AS(get(i), doctest::Contains("failure after issuing work"), std::domain_error);
      } else {
        REQUIRE(first_mismatch(inputs[i], get(i)) == kNone);
      }
    }
    pipeline.drain();  // a ticket is ready a moment before its item is counted
    const auto stats = pipeline.stats();
    CHECK(stats.failed == 3);
    CHECK(stats.completed == items - 3);
    CHECK(cudaGetLastError() == cudaSuccess);  // no error left behind for unrelated code
  }

  TEST_CASE("back-pressure: submit waits while every slot is busy; try_submit returns at once") {
    replay::PinnedBuffer<int> flag(1);
    flag[0] = 0;
    int calls = 0;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = 1024, .slots = 2},
        [&](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          if (calls++ == 0) {  // the first item holds the compute stream until the host says so
            wait_for_flag_kernel<<<1, 1, 0, s.get()>>>(flag.data(), 40'000'000'000LL);
            replay::check_last_launch("wait_for_flag_kernel");
          }
          affine(in, out, s);
        });
    const auto a = replay_test::random_floats(1024);
    const auto b = replay_test::random_floats(700);
    const auto c = replay_test::random_floats(300);
    auto ticket_a = pipeline.submit(std::span<const float>(a));
    auto ticket_b = pipeline.submit(std::span<const float>(b));
    CHECK_FALSE(pipeline.try_submit(std::span<const float>(c)).has_value());
    CHECK(pipeline.stats().refused == 1);
    CHECK(pipeline.stats().submitted == 2);

    std::atomic<bool> returned{false};
    replay::PipelineTicket<std::vector<float>> ticket_c;
    std::thread producer([&] {
      ticket_c = pipeline.submit(std::span<const float>(c));
      returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK_FALSE(returned.load());  // both slots wait on the spinning kernel
    CHECK_FALSE(ticket_a.ready());
    *static_cast<volatile int*>(flag.data()) = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    producer.join();
    CHECK(returned.load());
    CHECK(pipeline.stats().slot_waits == 1);
    CHECK(first_mismatch(a, ticket_a.get()) == kNone);
    CHECK(first_mismatch(b, ticket_b.get()) == kNone);
    CHECK(first_mismatch(c, ticket_c.get()) == kNone);
    auto later = pipeline.try_submit(std::span<const float>(b));
    REQUIRE(later.has_value());
    CHECK(first_mismatch(b, later->get()) == kNone);
  }

  TEST_CASE("destroying the pipeline drains it: every ticket is fulfilled and every callback ran") {
    const std::size_t items = under_sanitizer() ? 100 : 600;
    std::vector<std::vector<float>> inputs(items);
    std::vector<replay::PipelineTicket<std::vector<float>>> tickets(items);
    std::vector<std::vector<float>> callback_outputs(items);
    std::atomic<std::size_t> callbacks{0};
    {
      replay::StreamPipeline<float> pipeline({.input_capacity = 3000, .slots = 3}, affine);
      for (std::size_t i = 0; i < items; ++i) {
        inputs[i] = replay_test::random_floats(random_size(1, 3000));
        if (i % 2 == 0) {
          tickets[i] = pipeline.submit(std::span<const float>(inputs[i]));
        } else {
          (void)pipeline.submit(std::span<const float>(inputs[i]), [&, i](const auto& done) {
            if (done.ok()) {
              callback_outputs[i].assign(done.output.begin(), done.output.end());
            }
            ++callbacks;
          });
        }
      }
    }  // no drain(): the destructor must deliver everything
    CHECK(callbacks.load() == items / 2);
    for (std::size_t i = 0; i < items; ++i) {
      if (i % 2 == 0) {
        REQUIRE(tickets[i].ready());
        REQUIRE(first_mismatch(inputs[i], tickets[i].get()) == kNone);
      } else {
        REQUIRE(first_mismatch(inputs[i], callback_outputs[i]) == kNone);
      }
    }
  }

  TEST_CASE("graph_compute: the compute stage is captured once per slot and replayed per item") {
    const std::size_t capacity = 1536;
    int captured = 0;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = 3, .flags = replay::PipelineFlags::graph_compute},
        [&](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          ++captured;
          CHECK(in.size() == capacity);
          affine(in, out, s);
        });
    CHECK(captured == 3);
    const std::size_t items = 300;
    replay::PinnedBuffer<float> pinned(capacity * items);
    std::vector<std::vector<float>> inputs(items);
    std::vector<replay::PipelineTicket<std::vector<float>>> tickets(items);
    for (std::size_t i = 0; i < items; ++i) {
      inputs[i] = replay_test::random_floats(capacity);
      std::span<const float> in(inputs[i]);
      if (i % 2 == 1) {
        std::memcpy(pinned.data() + i * capacity, inputs[i].data(), capacity * sizeof(float));
        in = std::span<const float>(pinned.data() + i * capacity, capacity);
      }
      tickets[i] = pipeline.submit(in);
    }
    for (std::size_t i = 0; i < items; ++i) {
      REQUIRE(first_mismatch(inputs[i], tickets[i].get()) == kNone);
    }
    CHECK(captured == 3);  // replayed, never re-run eagerly
    const auto short_item = replay_test::random_floats(capacity - 1);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(std::span<const float>(short_item)),
                         doctest::Contains("exactly 1536 elements"), replay::usage_error);
    CHECK(pipeline.stats().inputs_in_place == items / 2);
  }

  TEST_CASE("graph_slot: copy-in, compute and copy-out replay as one graph per slot, in place for pinned memory") {
    const std::size_t capacity = 2500;
    int captured = 0;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity,
         .slots = 4,
         .flags = replay::PipelineFlags::graph_slot,
         .staging_chunk_bytes = 4096,  // staged copies in three chunks, both ways
         .host_copy_threads = 2},
        [&](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          ++captured;
          affine(in, out, s);
        });
    CHECK(captured == 4);
    const std::size_t items = under_sanitizer() ? 100 : 400;
    replay::PinnedBuffer<float> pinned_in(capacity * items);
    replay::PinnedBuffer<float> pinned_out(capacity * items);
    std::vector<std::vector<float>> inputs(items);
    std::vector<std::vector<float>> pageable_out(items, std::vector<float>(capacity));
    std::vector<replay::PipelineTicket<std::size_t>> tickets(items);
    std::size_t pinned_inputs = 0;
    std::size_t pinned_outputs = 0;
    for (std::size_t i = 0; i < items; ++i) {
      inputs[i] = replay_test::random_floats(capacity);
      std::span<const float> in(inputs[i]);
      if ((i & 1) != 0) {
        ++pinned_inputs;
        std::memcpy(pinned_in.data() + i * capacity, inputs[i].data(), capacity * sizeof(float));
        in = std::span<const float>(pinned_in.data() + i * capacity, capacity);
      }
      std::span<float> out(pageable_out[i]);
      if ((i & 2) != 0) {
        ++pinned_outputs;
        out = std::span<float>(pinned_out.data() + i * capacity, capacity);
      }
      tickets[i] = pipeline.submit(in, out);
    }
    for (std::size_t i = 0; i < items; ++i) {
      INFO("item " << i);
      REQUIRE(tickets[i].get() == capacity);
      const std::span<const float> out = (i & 2) != 0
                                             ? std::span<const float>(pinned_out.data() + i * capacity, capacity)
                                             : std::span<const float>(pageable_out[i]);
      REQUIRE(first_mismatch(inputs[i], out) == kNone);
    }
    CHECK(captured == 4);
    const auto stats = pipeline.stats();
    CHECK(stats.inputs_in_place == pinned_inputs);
    CHECK(stats.outputs_direct == pinned_outputs);
    const auto owned = pipeline.submit(std::span<const float>(inputs[0])).get();  // through staging
    CHECK(first_mismatch(inputs[0], owned) == kNone);
  }

  TEST_CASE("a GraphExec reading through fixed buffers serves every slot, for variable item sizes") {
    // The compute stage is serialized on one stream, so one set of fixed
    // buffers (and one graph) serves all slots: copy in, replay, copy out.
    const std::size_t capacity = 4000;
    replay::Stream capture_stream;
    replay::DeviceBuffer<float> model_in(capacity);
    replay::DeviceBuffer<float> hidden(capacity);
    replay::DeviceBuffer<float> model_out(capacity);
    auto graph = replay::capture(capture_stream, [&](replay::StreamRef s) {
      affine(model_in.view(), hidden.view(), s);   // 2x + 1
      affine(hidden.view(), model_out.view(), s);  // 2(2x + 1) + 1
    });
    replay::GraphExec exec(graph);
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = 3},
        [&](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          model_in.first(in.size()).copy_from(in, s);
          exec.launch(s);
          out.copy_from(model_out.first(out.size()), s);
        });
    const std::size_t items = 200;
    std::vector<std::vector<float>> inputs(items);
    for (auto& in : inputs) {
      in = replay_test::random_floats(random_size(1, capacity));
    }
    const auto outputs = pipeline.run(inputs);
    for (std::size_t i = 0; i < items; ++i) {
      REQUIRE(outputs[i].size() == inputs[i].size());
      for (std::size_t j = 0; j < inputs[i].size(); ++j) {
        if (outputs[i][j] != expected_affine(expected_affine(inputs[i][j]))) {
          FAIL("item " << i << " element " << j);
        }
      }
    }
  }

  TEST_CASE("stage_inputs copies even pinned inputs; blocking_wait completes without spinning") {
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = 512,
         .slots = 2,
         .flags = replay::PipelineFlags::stage_inputs | replay::PipelineFlags::blocking_wait},
        affine);
    replay::PinnedBuffer<float> pinned(512);
    std::vector<replay::PipelineTicket<std::vector<float>>> tickets;
    std::vector<std::vector<float>> inputs;
    for (int i = 0; i < 50; ++i) {
      inputs.push_back(replay_test::random_floats(512));
      std::memcpy(pinned.data(), inputs.back().data(), 512 * sizeof(float));
      tickets.push_back(pipeline.submit(pinned.span()));
      // stage_inputs: the pinned input was copied during submit, so it may be overwritten at once.
    }
    for (std::size_t i = 0; i < tickets.size(); ++i) {
      REQUIRE(first_mismatch(inputs[i], tickets[i].get()) == kNone);
    }
    CHECK(pipeline.stats().inputs_in_place == 0);
    CHECK(pipeline.stats().inputs_staged == 50);
  }

  TEST_CASE("device memory as input or destination, bad options and bad slots are refused clearly") {
    replay::StreamPipeline<float> pipeline({.input_capacity = 256}, affine);
    CHECK(pipeline.slot_count() == 3);
    CHECK(pipeline.output_capacity() == 256);
    replay::DeviceBuffer<float> device(256);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(std::span<const float>(device.data(), 256)),
                         doctest::Contains("device memory"), replay::usage_error);
    const auto in = replay_test::random_floats(256);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(std::span<const float>(in), device.span()),
                         doctest::Contains("destination points to device memory"), replay::usage_error);
    CHECK(pipeline.stats().submitted == 0);
    CHECK_THROWS_AS((void)pipeline.device_input(3), replay::usage_error);
    CHECK(pipeline.device_input(2).size() == 256);
    CHECK_THROWS_WITH_AS(replay::StreamPipeline<float>({.input_capacity = 0}, affine),
                         doctest::Contains("input_capacity"), replay::usage_error);
    constexpr auto both = replay::PipelineFlags::graph_compute | replay::PipelineFlags::graph_slot;
    CHECK_THROWS_WITH_AS(replay::StreamPipeline<float>({.input_capacity = 8, .flags = both}, affine),
        doctest::Contains("exclude each other"), replay::usage_error);
    replay::StreamPipeline<float> halves(
        {.input_capacity = 100, .output_capacity = 10, .output_count = [](std::size_t n) { return n / 2; }}, affine);
    const auto thirty = replay_test::random_floats(30);
    CHECK_THROWS_WITH_AS((void)halves.submit(std::span<const float>(thirty)),
                         doctest::Contains("produces 15 elements but a slot's output holds at most 10"),
                         replay::usage_error);
    const auto twenty = replay_test::random_floats(20);
    const auto halved = halves.submit(std::span<const float>(twenty)).get();
    REQUIRE(halved.size() == 10);  // the compute saw an output view of output_count(20) elements
    CHECK(first_mismatch(std::span<const float>(twenty).first(10), halved) == kNone);
  }

  TEST_CASE("producers on other threads, completions on the pipeline's own thread, and moves while in flight") {
    std::set<std::thread::id> completion_threads;
    std::vector<std::vector<float>> inputs(64);
    std::vector<std::vector<float>> outputs(64);
    replay::StreamPipeline<float> pipeline({.input_capacity = 2048, .slots = 3}, affine);
    std::thread producer([&] {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = replay_test::random_floats(random_size(1, 2048));
        (void)pipeline.submit(std::span<const float>(inputs[i]), [&, i](const auto& done) {
          completion_threads.insert(std::this_thread::get_id());
          outputs[i].assign(done.output.begin(), done.output.end());
        });
      }
    });
    producer.join();
    replay::StreamPipeline<float> moved = std::move(pipeline);  // items still in flight move along
    moved.drain();
    CHECK(completion_threads.size() == 1);
    CHECK(completion_threads.count(std::this_thread::get_id()) == 0);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      REQUIRE(first_mismatch(inputs[i], outputs[i]) == kNone);
    }
    CHECK_THROWS_AS(pipeline.drain(), replay::usage_error);
  }

  TEST_CASE("several producers, pageable and pinned memory, sizes on and off chunk boundaries: every output checked") {
    constexpr std::size_t chunk_bytes = 4096;
    constexpr std::size_t per_chunk = chunk_bytes / sizeof(float);
    const std::size_t capacity = 20 * per_chunk + 3;
    const std::vector<std::size_t> edges{0,
                                         1,
                                         2,
                                         per_chunk - 1,
                                         per_chunk,
                                         per_chunk + 1,
                                         2 * per_chunk,
                                         3 * per_chunk + 5,
                                         17 * per_chunk - 1,
                                         capacity - 1,
                                         capacity};
    constexpr int producers = 4;
    const std::size_t per_producer = under_sanitizer() ? 24 : 120;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = 4, .staging_chunk_bytes = chunk_bytes, .host_copy_threads = 3}, affine);

    // Delivery kinds: 0 vector, 1 pageable destination, 2 pinned destination
    // (typed), 3 callback (output in the slot), 4 callback into a pageable destination.
    struct Item {
      std::vector<float> input;
      bool pinned_input = false;
      int delivery = 0;
      std::vector<float> pageable_out;
      std::vector<float> callback_out;
      bool callback_ok = false;
      replay::PipelineTicket<std::vector<float>> vector_ticket;
      replay::PipelineTicket<std::size_t> count_ticket;
    };
    std::vector<std::vector<Item>> items(producers);
    for (auto& list : items) {
      list = std::vector<Item>(per_producer);
    }
    std::vector<replay::PinnedBuffer<float>> pinned_in;
    std::vector<replay::PinnedBuffer<float>> pinned_out;
    for (int p = 0; p < producers; ++p) {
      pinned_in.emplace_back(per_producer * capacity);
      pinned_out.emplace_back(per_producer * capacity);
      for (std::size_t i = 0; i < per_producer; ++i) {
        Item& item = items[p][i];
        const std::size_t n = i < edges.size() ? edges[(i + static_cast<std::size_t>(p)) % edges.size()]
                                               : random_size(0, capacity);
        item.input = replay_test::random_floats(n);
        item.pinned_input = replay_test::rng()() % 2 == 0;
        item.delivery = static_cast<int>(replay_test::rng()() % 5);
        std::memcpy(pinned_in[p].data() + i * capacity, item.input.data(), n * sizeof(float));
        if (item.delivery == 1 || item.delivery == 4) {
          item.pageable_out.assign(n + 1, -7.0F);  // one past the output: must stay untouched
        }
      }
    }
    std::vector<std::thread> threads;
    std::atomic<int> submit_errors{0};
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] {
        try {
          for (std::size_t i = 0; i < per_producer; ++i) {
            Item& item = items[p][i];
            const std::size_t n = item.input.size();
            const replay::HostRange<const float> in =
                item.pinned_input ? replay::HostRange<const float>(pinned_in[p].subview(i * capacity, n))
                                  : replay::HostRange<const float>(item.input);
            switch (item.delivery) {
              case 0: item.vector_ticket = pipeline.submit(in); break;
              case 1: item.count_ticket = pipeline.submit(in, std::span<float>(item.pageable_out).first(n)); break;
              case 2: item.count_ticket = pipeline.submit(in, pinned_out[p].subview(i * capacity, n)); break;
              case 3:
                (void)pipeline.submit(in, [&item](const replay::PipelineCompletion<float>& done) {
                  item.callback_ok = done.ok();
                  item.callback_out.assign(done.output.begin(), done.output.end());
                });
                break;
              default:
                (void)pipeline.submit(in, std::span<float>(item.pageable_out).first(n),
                                      [&item](const replay::PipelineCompletion<float>& done) {
                                        item.callback_ok = done.ok();
                                        item.callback_out.assign(done.output.begin(), done.output.end());
                                      });
            }
          }
        } catch (...) {
          ++submit_errors;
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    pipeline.drain();
    REQUIRE(submit_errors.load() == 0);
    std::size_t pinned_inputs = 0;
    std::size_t pageable_inputs = 0;
    for (int p = 0; p < producers; ++p) {
      for (std::size_t i = 0; i < per_producer; ++i) {
        Item& item = items[p][i];
        const std::size_t n = item.input.size();
        INFO("producer " << p << " item " << i << ": " << n << " elements, delivery " << item.delivery
                         << (item.pinned_input ? ", pinned input" : ", pageable input"));
        if (n != 0) {
          (item.pinned_input ? pinned_inputs : pageable_inputs) += 1;
        }
        switch (item.delivery) {
          case 0: REQUIRE(first_mismatch(item.input, item.vector_ticket.get()) == kNone); break;
          case 1:
            REQUIRE(item.count_ticket.get() == n);
            REQUIRE(first_mismatch(item.input, std::span<const float>(item.pageable_out).first(n)) == kNone);
            REQUIRE(item.pageable_out[n] == -7.0F);
            break;
          case 2:
            REQUIRE(item.count_ticket.get() == n);
            REQUIRE(first_mismatch(item.input, std::span<const float>(pinned_out[p].data() + i * capacity, n)) ==
                    kNone);
            break;
          case 3:
            REQUIRE(item.callback_ok);
            REQUIRE(first_mismatch(item.input, item.callback_out) == kNone);
            break;
          default:
            REQUIRE(item.callback_ok);
            REQUIRE(first_mismatch(item.input, item.callback_out) == kNone);
            REQUIRE(first_mismatch(item.input, std::span<const float>(item.pageable_out).first(n)) == kNone);
            REQUIRE(item.pageable_out[n] == -7.0F);
        }
      }
    }
    const auto stats = pipeline.stats();
    CHECK(stats.submitted == producers * per_producer);
    CHECK(stats.completed == producers * per_producer);
    CHECK(stats.failed == 0);
    CHECK(stats.inputs_in_place == pinned_inputs);
    CHECK(stats.inputs_staged == pageable_inputs);
  }

  TEST_CASE("a huge pageable item: more chunks than a job takes, larger chunks instead, every element checked") {
    // 72 MiB (plus a few elements) with 1 MiB chunks needs 73 chunks; a job
    // takes at most 64, so the chunks grow. Under the sanitizer: 2 MiB, 16 KiB chunks.
    const std::size_t n = under_sanitizer() ? (std::size_t{2} << 20) / sizeof(float) + 7
                                            : (std::size_t{72} << 20) / sizeof(float) + 7;
    const std::size_t chunk = under_sanitizer() ? 16384 : std::size_t{1} << 20;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = n, .slots = 2, .staging_chunk_bytes = chunk, .host_copy_threads = 4}, affine);
    const auto a = replay_test::random_floats(n);
    const auto b = replay_test::random_floats(n - 5);
    replay::PinnedBuffer<float> pinned(n);
    const auto c = replay_test::random_floats(n);
    std::memcpy(pinned.data(), c.data(), n * sizeof(float));
    std::vector<float> out_a(n, 0.0F);
    std::vector<float> out_c(n, 0.0F);
    auto ta = pipeline.submit(std::span<const float>(a), std::span<float>(out_a));  // pageable both ways
    auto tb = pipeline.submit(std::span<const float>(b));                            // into a vector
    auto tc = pipeline.submit(pinned, std::span<float>(out_c));                      // pinned in, pageable out
    CHECK(ta.get() == n);
    CHECK(first_mismatch(a, out_a) == kNone);
    CHECK(first_mismatch(b, tb.get()) == kNone);
    CHECK(tc.get() == n);
    CHECK(first_mismatch(c, out_c) == kNone);
    pipeline.drain();
    CHECK(pipeline.stats().inputs_staged == 2);
    CHECK(pipeline.stats().inputs_in_place == 1);
    CHECK(pipeline.stats().outputs_staged == 3);
  }

  TEST_CASE("a RegisteredHostBuffer is used in place while it lives and staged again after it is gone") {
    const std::size_t n = (std::size_t{3} << 20) / sizeof(float) + 11;  // large enough for their own pages
    replay::StreamPipeline<float> pipeline({.input_capacity = n, .slots = 3}, affine);
    std::vector<float> request = replay_test::random_floats(n);
    std::vector<float> response(n, 0.0F);
    {
      replay::RegisteredHostBuffer<float> in{std::span<float>(request)};
      replay::RegisteredHostBuffer<float> out{std::span<float>(response)};
      CHECK(in.size() == n);
      CHECK(in.data() == request.data());
      for (int round = 0; round < 5; ++round) {
        const auto fresh = replay_test::random_floats(n);
        std::copy(fresh.begin(), fresh.end(), request.begin());
        REQUIRE(pipeline.submit(in, out).get() == n);
        REQUIRE(first_mismatch(fresh, response) == kNone);
      }
      pipeline.drain();
      CHECK(pipeline.stats().inputs_in_place == 5);
      CHECK(pipeline.stats().outputs_direct == 5);
      // The plain span over registered memory is found pinned too (asked once per item).
      REQUIRE(pipeline.submit(std::span<const float>(request), std::span<float>(response)).get() == n);
      pipeline.drain();
      CHECK(pipeline.stats().inputs_in_place == 6);
      if (!under_sanitizer()) {  // the sanitizer reports the refused call itself
        try {
          replay::RegisteredHostBuffer<float> twice{std::span<float>(request)};
          FAIL("registering the same memory twice was accepted");
        } catch (const replay::cuda_error& e) {
          CHECK(e.status() == cudaErrorHostMemoryAlreadyRegistered);
          CHECK(std::string(e.what()).find("cudaHostRegister") != std::string::npos);
        }
        CHECK(cudaGetLastError() == cudaSuccess);
      }
      replay::RegisteredHostBuffer<float> moved = std::move(in);
      CHECK(in.moved_from());
      CHECK_THROWS_AS((void)in.view(), replay::usage_error);
      CHECK(moved.data() == request.data());
    }  // unregistered here
    const auto again = replay_test::random_floats(n);
    std::copy(again.begin(), again.end(), request.begin());
    REQUIRE(pipeline.submit(std::span<const float>(request), std::span<float>(response)).get() == n);
    CHECK(first_mismatch(again, response) == kNone);
    pipeline.drain();
    CHECK(pipeline.stats().inputs_staged == 1);  // pageable again
    CHECK(pipeline.stats().outputs_staged == 1);
    replay::RegisteredHostBuffer<float> empty{std::span<float>()};
    CHECK(empty.empty());
  }

  TEST_CASE("pinned views are typed pinned; bad staging options and bad sizes are refused with usage_error") {
    CHECK_THROWS_WITH_AS(replay::StreamPipeline<float>({.input_capacity = 64, .staging_chunk_bytes = 1000}, affine),
                         doctest::Contains("multiple of 4096"), replay::usage_error);
    CHECK_THROWS_WITH_AS(replay::StreamPipeline<float>({.input_capacity = 64, .staging_chunk_bytes = 0}, affine),
                         doctest::Contains("staging_chunk_bytes"), replay::usage_error);
    CHECK_THROWS_WITH_AS(replay::StreamPipeline<float>({.input_capacity = 64, .host_copy_threads = 65}, affine),
                         doctest::Contains("host_copy_threads"), replay::usage_error);
    replay::StreamPipeline<float> pipeline({.input_capacity = 1000, .slots = 2}, affine);
    replay::PinnedBuffer<float> big(1001);
    replay::PinnedBuffer<float> out(1000);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(big), doctest::Contains("holds 1001 elements but a slot holds at most 1000"),
                         replay::usage_error);
    CHECK_THROWS_WITH_AS((void)pipeline.submit(big.subview(0, 1000), out.subview(0, 999)),
                         doctest::Contains("destination holds 999 elements but the item produces 1000"),
                         replay::usage_error);
    CHECK(pipeline.stats().submitted == 0);
    const auto data = replay_test::random_floats(1000);
    std::memcpy(big.data(), data.data(), 1000 * sizeof(float));
    CHECK(pipeline.submit(big.subview(0, 1000), out).get() == 1000);
    CHECK(first_mismatch(data, std::span<const float>(out.data(), 1000)) == kNone);
    pipeline.drain();
    CHECK(pipeline.stats().inputs_in_place == 1);
    CHECK(pipeline.stats().outputs_direct == 1);
    // A pinned range the caller vouches for, and a zero-length item.
    const auto one = replay_test::random_floats(1);
    big[0] = one[0];
    CHECK(pipeline.submit(replay::HostRange<const float>::pinned(std::span<const float>(big.data(), 1))).get() ==
          std::vector<float>{expected_affine(one[0])});
    CHECK(pipeline.submit(std::span<const float>()).get().empty());
    std::vector<float> none;
    CHECK(pipeline.submit(std::span<const float>(), std::span<float>(none)).get() == 0);
  }

  TEST_CASE("slot_streams: every stage on the slot's own stream, any size, chunked staging, every output checked") {
    constexpr std::size_t per_chunk = 4096 / sizeof(float);
    const std::size_t capacity = 6 * per_chunk + 9;
    replay::StreamPipeline<float> pipeline({.input_capacity = capacity,
                                            .slots = 5,
                                            .flags = replay::PipelineFlags::slot_streams,
                                            .staging_chunk_bytes = 4096,
                                            .host_copy_threads = 2},
                                           affine);
    const std::size_t items = under_sanitizer() ? 60 : 600;
    replay::PinnedBuffer<float> pinned_in(items * capacity);
    replay::PinnedBuffer<float> pinned_out(items * capacity);
    std::vector<std::vector<float>> inputs(items);
    std::vector<std::vector<float>> pageable_out(items);
    std::vector<replay::PipelineTicket<std::vector<float>>> vector_tickets(items);
    std::vector<replay::PipelineTicket<std::size_t>> count_tickets(items);
    for (std::size_t i = 0; i < items; ++i) {
      const std::size_t n = i < 4 ? std::vector<std::size_t>{0, 1, per_chunk, capacity}[i] : random_size(0, capacity);
      inputs[i] = replay_test::random_floats(n);
      std::memcpy(pinned_in.data() + i * capacity, inputs[i].data(), n * sizeof(float));
      const replay::HostRange<const float> in = i % 2 == 0
                                                    ? replay::HostRange<const float>(inputs[i])
                                                    : replay::HostRange<const float>(pinned_in.subview(i * capacity, n));
      switch (i % 3) {
        case 0: vector_tickets[i] = pipeline.submit(in); break;
        case 1:
          pageable_out[i].assign(n, 0.0F);
          count_tickets[i] = pipeline.submit(in, std::span<float>(pageable_out[i]));
          break;
        default: count_tickets[i] = pipeline.submit(in, pinned_out.subview(i * capacity, n));
      }
    }
    for (std::size_t i = 0; i < items; ++i) {
      INFO("item " << i << " of " << inputs[i].size() << " elements");
      switch (i % 3) {
        case 0: REQUIRE(first_mismatch(inputs[i], vector_tickets[i].get()) == kNone); break;
        case 1:
          REQUIRE(count_tickets[i].get() == inputs[i].size());
          REQUIRE(first_mismatch(inputs[i], pageable_out[i]) == kNone);
          break;
        default:
          REQUIRE(count_tickets[i].get() == inputs[i].size());
          REQUIRE(first_mismatch(inputs[i], std::span<const float>(pinned_out.data() + i * capacity,
                                                                   inputs[i].size())) == kNone);
      }
    }
    pipeline.drain();
    CHECK(pipeline.stats().completed == items);

    // With graph_compute: the per-slot compute graphs replay on the slot streams.
    replay::StreamPipeline<float> graphed(
        {.input_capacity = 777, .slots = 3,
         .flags = replay::PipelineFlags::slot_streams | replay::PipelineFlags::graph_compute},
        affine);
    std::vector<std::vector<float>> fixed(40);
    std::vector<replay::PipelineTicket<std::vector<float>>> fixed_tickets(fixed.size());
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      fixed[i] = replay_test::random_floats(777);
      fixed_tickets[i] = graphed.submit(fixed[i]);
    }
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      REQUIRE(first_mismatch(fixed[i], fixed_tickets[i].get()) == kNone);
    }
    constexpr auto clash = replay::PipelineFlags::slot_streams | replay::PipelineFlags::graph_slot;
    CHECK_THROWS_WITH_AS(replay::StreamPipeline<float>({.input_capacity = 8, .flags = clash}, affine),
                         doctest::Contains("exclude each other"), replay::usage_error);
  }
  TEST_CASE("pageable in and out behind a slow compute, default copy helpers, two producers: every output checked") {
    // Outputs of many chunks wait for a compute stage that takes a while: the
    // completion thread waits for the first chunk before the helpers join, and
    // the producers' input copies keep the helpers meanwhile.
    constexpr std::size_t chunk_bytes = 4096;
    const std::size_t capacity = 24 * (chunk_bytes / sizeof(float)) + 7;
    const std::size_t per_producer = under_sanitizer() ? 6 : 40;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = 4, .staging_chunk_bytes = chunk_bytes},
        [](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          delay_kernel<<<1, 1, 0, s.get()>>>(200000);  // about 0.1 ms
          replay::check_last_launch("delay_kernel");
          affine(in, out, s);
        });
    CHECK(replay::PipelineOptions{}.host_copy_threads == 8);
    struct Work {
      std::vector<std::vector<float>> inputs;
      std::vector<std::vector<float>> outputs;
      std::vector<replay::PipelineTicket<std::size_t>> tickets;
    };
    std::vector<Work> work(2);
    for (Work& w : work) {
      for (std::size_t i = 0; i < per_producer; ++i) {
        const std::size_t n = (i % 3 == 0) ? capacity : random_size(1, capacity);
        w.inputs.push_back(replay_test::random_floats(n));
        w.outputs.emplace_back(n, -1.0F);
      }
    }
    std::vector<std::thread> producers;
    for (Work& w : work) {
      producers.emplace_back([&pipeline, &w] {
        for (std::size_t i = 0; i < w.inputs.size(); ++i) {
          w.tickets.push_back(pipeline.submit(std::span<const float>(w.inputs[i]), std::span<float>(w.outputs[i])));
        }
      });
    }
    for (std::thread& t : producers) {
      t.join();
    }
    for (Work& w : work) {
      for (std::size_t i = 0; i < w.inputs.size(); ++i) {
        INFO("item " << i);
        REQUIRE(w.tickets[i].get() == w.inputs[i].size());
        REQUIRE(first_mismatch(w.inputs[i], w.outputs[i]) == kNone);
      }
    }
    pipeline.drain();
    const auto stats = pipeline.stats();
    CHECK(stats.completed == 2 * per_producer);
    CHECK(stats.inputs_staged == 2 * per_producer);
    CHECK(stats.outputs_staged == 2 * per_producer);
  }

  TEST_CASE("graph_slot records its own completion: outputs are whole when delivered, addresses changing or not") {
    const std::size_t capacity = 1024;
    const std::size_t items = under_sanitizer() ? 60 : 600;
    const std::size_t buffers = 5;  // items reuse five input and output addresses, in a varying order
    replay::StreamPipeline<float> pipeline({.input_capacity = capacity, .slots = 3, .flags = replay::PipelineFlags::graph_slot},
                                           [](replay::BufferView<float> in, replay::BufferView<float> out,
                                              replay::StreamRef s) {
                                             delay_kernel<<<1, 1, 0, s.get()>>>(20000);
                                             replay::check_last_launch("delay_kernel");
                                             affine(in, out, s);
                                           });
    replay::PinnedBuffer<float> in_pool(capacity * buffers);
    replay::PinnedBuffer<float> out_pool(capacity * buffers);
    const auto in_view = in_pool.view();
    const auto out_view = out_pool.view();
    std::size_t checked = 0;
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < items; ++i) {
      // The same buffer twice in a row now and then (no graph update), else another one.
      const std::size_t b = (i % 7 == 1) ? (i - 1) % buffers : i % buffers;
      // Its previous item was delivered (callbacks are checked before the next submit reuses it).
      pipeline.drain();
      const std::vector<float> input = replay_test::random_floats(capacity);
      std::memcpy(in_pool.data() + b * capacity, input.data(), capacity * sizeof(float));
      std::fill_n(out_pool.data() + b * capacity, capacity, -1.0F);
      pipeline.submit(in_view.subview(b * capacity, capacity), out_view.subview(b * capacity, capacity),
                      [&, input](const replay::PipelineCompletion<float>& done) {
                        // The item is delivered only once its copy-out has landed.
                        ++checked;
                        if (!done.ok() || first_mismatch(input, done.output) != kNone) {
                          ++mismatches;
                        }
                      });
      if (i % 4 != 0) {
        continue;
      }
      // Several in flight at once, too: three more on other buffers, through tickets.
      std::vector<std::vector<float>> more;
      std::vector<replay::PipelineTicket<std::size_t>> tickets;
      for (std::size_t k = 1; k <= 3 && k < buffers; ++k) {
        const std::size_t c = (b + k) % buffers;
        more.push_back(replay_test::random_floats(capacity));
        std::memcpy(in_pool.data() + c * capacity, more.back().data(), capacity * sizeof(float));
        std::fill_n(out_pool.data() + c * capacity, capacity, -1.0F);
        tickets.push_back(pipeline.submit(in_view.subview(c * capacity, capacity), out_view.subview(c * capacity, capacity)));
      }
      for (std::size_t k = 0; k < tickets.size(); ++k) {
        const std::size_t c = (b + k + 1) % buffers;
        REQUIRE(tickets[k].get() == capacity);
        REQUIRE(first_mismatch(more[k], std::span<const float>(out_pool.data() + c * capacity, capacity)) == kNone);
      }
    }
    pipeline.drain();
    CHECK(checked == items);
    CHECK(mismatches == 0);
    CHECK(pipeline.stats().failed == 0);
    CHECK(pipeline.stats().outputs_direct == pipeline.stats().completed);
  }

  TEST_CASE("graph_slot on a ring of `slots` recycled buffers is one launch per item; new addresses re-point only "
            "the copy whose address changed; every output checked") {
    constexpr std::size_t slots = 4;
    const std::size_t capacity = 1000;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = slots, .flags = replay::PipelineFlags::graph_slot},
        [](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) { affine(in, out, s); });
    // Recycled buffers, then recycled and new addresses interleaved at random, then recycled again.
    const std::size_t recycled_items = under_sanitizer() ? 24 : 400;
    const std::size_t mixed_items = under_sanitizer() ? 48 : 600;
    const std::size_t items = 2 * recycled_items + mixed_items;
    replay::PinnedBuffer<float> ring_in(capacity * slots);  // buffer s serves the items of slot s
    replay::PinnedBuffer<float> ring_out(capacity * slots);
    replay::PinnedBuffer<float> fresh_in(capacity * mixed_items);  // each part used once: a new address
    replay::PinnedBuffer<float> fresh_out(capacity * mixed_items);
    std::size_t fresh_inputs = 0;
    std::size_t fresh_outputs = 0;

    // An item in flight: its input (the host reference's), and where its output arrives.
    struct Pending {
      std::vector<float> input;
      std::vector<float> pageable_out;
      std::optional<replay::PipelineTicket<std::size_t>> to_destination;
      std::optional<replay::PipelineTicket<std::vector<float>>> to_vector;
      std::span<const float> output;  // to_destination's output
    };
    std::vector<Pending> pending(slots);
    std::size_t checked = 0;
    const auto settle = [&](Pending& p) {
      if (p.to_destination) {
        REQUIRE(p.to_destination->get() == capacity);
        REQUIRE(first_mismatch(p.input, p.output) == kNone);
        p.to_destination.reset();
        ++checked;
      } else if (p.to_vector) {
        const std::vector<float> out = p.to_vector->get();
        REQUIRE(first_mismatch(p.input, out) == kNone);
        p.to_vector.reset();
        ++checked;
      }
    };

    // The test's model of each slot graph's host addresses (nullptr: the
    // slot's own staging, where the graphs start). Items take the slots in
    // turn: item k (its id) runs in slot k % slots.
    std::vector<const void*> graph_source(slots, nullptr);
    std::vector<const void*> graph_target(slots, nullptr);
    std::uint64_t expected_retargets = 0;
    std::size_t pinned_inputs = 0;
    std::size_t pinned_destinations = 0;
    for (std::size_t k = 0; k < items; ++k) {
      const std::size_t s = k % slots;
      Pending& p = pending[s];
      settle(p);  // item k - slots: the slot's previous item, the last one to use ring buffer s
      const bool mixed = k >= recycled_items && k < recycled_items + mixed_items;
      // 0 and 7: the ring; 1 new input; 2 new destination; 3 pageable input;
      // 4 no destination (a vector); 5 both new; 6 pageable destination.
      const auto kind = mixed ? static_cast<unsigned>(replay_test::rng()() % 8) : 0U;
      p.input = replay_test::random_floats(capacity);

      replay::HostRange<const float> input(std::span<const float>(p.input));  // kind 3: pageable, staged
      const float* source = nullptr;
      if (kind != 3) {
        const bool fresh = kind == 1 || kind == 5;
        auto view = fresh ? fresh_in.view().subview(fresh_inputs++ * capacity, capacity)
                          : ring_in.view().subview(s * capacity, capacity);
        std::memcpy(view.data(), p.input.data(), capacity * sizeof(float));
        input = view;
        source = view.data();
        ++pinned_inputs;
      }
      const float* target = nullptr;
      if (kind == 4) {
        p.to_vector = pipeline.submit(input);
      } else if (kind == 6) {
        p.pageable_out.assign(capacity, -1.0F);
        p.output = p.pageable_out;
        p.to_destination = pipeline.submit(input, std::span<float>(p.pageable_out));
      } else {
        const bool fresh = kind == 2 || kind == 5;
        auto view = fresh ? fresh_out.view().subview(fresh_outputs++ * capacity, capacity)
                          : ring_out.view().subview(s * capacity, capacity);
        std::fill_n(view.data(), capacity, -1.0F);
        p.output = std::span<const float>(view.data(), capacity);
        p.to_destination = pipeline.submit(input, view);
        target = view.data();
        ++pinned_destinations;
      }
      REQUIRE((p.to_destination ? p.to_destination->id() : p.to_vector->id()) == k);
      // Only a copy whose host address differs from the slot's last item's is re-pointed.
      expected_retargets += (graph_source[s] != source ? 1U : 0U) + (graph_target[s] != target ? 1U : 0U);
      graph_source[s] = source;
      graph_target[s] = target;
      if (k + 1 == recycled_items) {
        // Each slot's first item pointed both copies at its ring buffers; nothing since.
        CHECK(pipeline.stats().graph_retargets == 2 * slots);
      }
    }
    for (Pending& p : pending) {
      settle(p);
    }
    pipeline.drain();
    CHECK(checked == items);
    const auto stats = pipeline.stats();
    CHECK(stats.completed == items);
    CHECK(stats.failed == 0);
    CHECK(stats.graph_retargets == expected_retargets);
    CHECK(stats.inputs_in_place == pinned_inputs);
    CHECK(stats.inputs_staged == items - pinned_inputs);
    CHECK(stats.outputs_direct == pinned_destinations);
  }

  TEST_CASE("graph_slot with no output: the graph's completion record follows the compute stage") {
    const std::size_t capacity = 512;
    std::atomic<int> captured{0};
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity,
         .slots = 2,
         .flags = replay::PipelineFlags::graph_slot,
         .output_count = [](std::size_t) { return std::size_t{0}; }},
        [&](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
          ++captured;
          delay_kernel<<<1, 1, 0, s.get()>>>(1000);  // the captured stage is not empty
          replay::check_last_launch("delay_kernel");
          affine(in, out, s);  // writes nothing: out is empty
        });
    CHECK(captured == 2);
    const std::size_t items = under_sanitizer() ? 8 : 64;
    std::vector<replay::PipelineTicket<std::vector<float>>> tickets;
    std::vector<std::vector<float>> inputs;
    for (std::size_t i = 0; i < items; ++i) {
      inputs.push_back(replay_test::random_floats(capacity));
      tickets.push_back(pipeline.submit(std::span<const float>(inputs.back())));
    }
    for (auto& ticket : tickets) {
      CHECK(ticket.get().empty());
    }
    pipeline.drain();
    CHECK(pipeline.stats().completed == items);
    CHECK(pipeline.stats().failed == 0);
  }

  // Grouped runs with the launch groups copying as `copies` says: a recycled
  // ring, new addresses, pageable inputs, vector outputs and partial groups;
  // every output checked against the host.
  void check_grouped_runs(replay::GroupCopies copies) {
    constexpr std::size_t group = 4;
    constexpr std::size_t slots = 8;
    const std::size_t capacity = 1000;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = slots, .flags = replay::PipelineFlags::graph_slot,
         .items_per_launch = group, .group_copies = copies},
        [](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) { affine(in, out, s); });
    CHECK(pipeline.items_per_launch() == group);
    const replay::GroupCopiesUsed& used = pipeline.group_copies();
    if (copies == replay::GroupCopies::memcpy_nodes) {
      CHECK(used.copies == replay::GroupCopies::memcpy_nodes);
      CHECK(used.reason.find("GroupCopies::memcpy_nodes") != std::string::npos);
    } else {
      int major = 0;
      int minor = 0;
      replay::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, pipeline.device()),
                    "cudaDeviceGetAttribute");
      replay::check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, pipeline.device()),
                    "cudaDeviceGetAttribute");
      if (major * 10 + minor >= 75) {  // the PTX's target: the kernel loads (unless PTX JIT is disabled)
        CHECK(used.copies == replay::GroupCopies::copy_kernel);
        CHECK(used.reason.empty());
      } else {
        CHECK(used.copies == replay::GroupCopies::memcpy_nodes);
        CHECK(used.reason.find("cannot be loaded") != std::string::npos);
      }
    }
    using PinnedView = replay::BufferView<float, replay::MemorySpace::pinned_host>;
    // Runs `inputs` into `outputs` (pinned views) and checks every output against the host.
    const auto run_pinned = [&](const std::vector<PinnedView>& inputs, const std::vector<PinnedView>& outputs) {
      std::vector<std::vector<float>> reference;
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        reference.push_back(replay_test::random_floats(capacity));
        std::memcpy(inputs[k].data(), reference.back().data(), capacity * sizeof(float));
        std::fill_n(outputs[k].data(), capacity, -1.0F);
      }
      const std::vector<std::size_t> counts = pipeline.run(inputs, outputs);
      REQUIRE(counts.size() == inputs.size());
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        REQUIRE(counts[k] == capacity);
        REQUIRE(first_mismatch(reference[k], std::span<const float>(outputs[k].data(), capacity)) == kNone);
      }
    };

    // A ring of `slots` pinned buffers, item k of each batch in buffer k: the
    // slot it takes, so after the first batch nothing is re-pointed.
    replay::PinnedBuffer<float> ring_in(capacity * slots);
    replay::PinnedBuffer<float> ring_out(capacity * slots);
    std::vector<PinnedView> ring_inputs;
    std::vector<PinnedView> ring_outputs;
    for (std::size_t k = 0; k < slots; ++k) {
      ring_inputs.push_back(ring_in.view().subview(k * capacity, capacity));
      ring_outputs.push_back(ring_out.view().subview(k * capacity, capacity));
    }
    const std::size_t rounds = under_sanitizer() ? 2 : 25;
    for (std::size_t r = 0; r < rounds; ++r) {
      run_pinned(ring_inputs, ring_outputs);
    }
    auto stats = pipeline.stats();
    CHECK(stats.grouped_items == rounds * slots);
    // Per slot, once: its own graph's copy-in (prepare), the member's copy-in and copy-out.
    CHECK(stats.graph_retargets == 3 * slots);
    CHECK(stats.inputs_in_place == rounds * slots);
    CHECK(stats.outputs_direct == rounds * slots);

    // Pageable inputs, outputs as vectors: staged both ways, still one launch per group.
    std::vector<std::vector<float>> pageable;
    for (std::size_t k = 0; k < 3 * slots; ++k) {
      pageable.push_back(replay_test::random_floats(capacity));
    }
    const std::vector<std::vector<float>> vectors = pipeline.run(pageable);
    REQUIRE(vectors.size() == pageable.size());
    for (std::size_t k = 0; k < pageable.size(); ++k) {
      REQUIRE(first_mismatch(pageable[k], vectors[k]) == kNone);
    }
    CHECK(pipeline.stats().grouped_items == rounds * slots + 3 * slots);

    // New pinned addresses for every item: the members' copies are re-pointed.
    replay::PinnedBuffer<float> fresh_in(capacity * 2 * slots);
    replay::PinnedBuffer<float> fresh_out(capacity * 2 * slots);
    std::vector<PinnedView> fresh_inputs;
    std::vector<PinnedView> fresh_outputs;
    for (std::size_t k = 0; k < 2 * slots; ++k) {
      fresh_inputs.push_back(fresh_in.view().subview(k * capacity, capacity));
      fresh_outputs.push_back(fresh_out.view().subview(k * capacity, capacity));
    }
    const std::uint64_t retargets_before = pipeline.stats().graph_retargets;
    run_pinned(fresh_inputs, fresh_outputs);
    CHECK(pipeline.stats().graph_retargets > retargets_before);
    CHECK(pipeline.stats().grouped_items == rounds * slots + 5 * slots);
    const std::uint64_t staged_before = pipeline.stats().inputs_staged;

    // Pageable memory passed as pinned (HostRange::pinned): the device cannot
    // address it, so the group goes through the staging both ways instead.
    {
      std::vector<std::vector<float>> sources;
      std::vector<std::vector<float>> sinks(slots, std::vector<float>(capacity, -1.0F));
      std::vector<replay::HostRange<const float>> claimed_in;
      std::vector<replay::HostRange<float>> claimed_out;
      for (std::size_t k = 0; k < slots; ++k) {
        sources.push_back(replay_test::random_floats(capacity));
        claimed_in.push_back(replay::HostRange<const float>::pinned(std::span<const float>(sources[k])));
        claimed_out.push_back(replay::HostRange<float>::pinned(std::span<float>(sinks[k])));
      }
      const std::uint64_t grouped = pipeline.stats().grouped_items;
      const auto counts = pipeline.run(claimed_in, claimed_out);
      for (std::size_t k = 0; k < slots; ++k) {
        REQUIRE(counts[k] == capacity);
        REQUIRE(first_mismatch(sources[k], sinks[k]) == kNone);
      }
      CHECK(pipeline.stats().grouped_items == grouped + slots);
      CHECK(pipeline.stats().inputs_staged == staged_before + slots);
    }

    // 5 items: one group and one alone; then 8 from slot 5: three alone, one
    // group (slots 0-3), one alone (slot 4); then the ring lines up again.
    const std::uint64_t grouped_before = pipeline.stats().grouped_items;
    run_pinned(std::vector<PinnedView>(ring_inputs.begin(), ring_inputs.begin() + 5),
               std::vector<PinnedView>(ring_outputs.begin(), ring_outputs.begin() + 5));
    CHECK(pipeline.stats().grouped_items == grouped_before + group);
    run_pinned(ring_inputs, ring_outputs);
    CHECK(pipeline.stats().grouped_items == grouped_before + 2 * group);
    std::vector<PinnedView> shifted_in(ring_inputs.begin() + 5, ring_inputs.end());  // slots 5-7
    std::vector<PinnedView> shifted_out(ring_outputs.begin() + 5, ring_outputs.end());
    run_pinned(shifted_in, shifted_out);
    run_pinned(ring_inputs, ring_outputs);
    CHECK(pipeline.stats().grouped_items == grouped_before + 4 * group);
    stats = pipeline.stats();
    CHECK(stats.failed == 0);
    CHECK(stats.completed == stats.submitted);
  }

  TEST_CASE("items_per_launch: run() issues a group of graph slots with one launch; a recycled ring, new addresses, "
            "pageable inputs, vector outputs and partial groups; every output checked") {
    check_grouped_runs(replay::GroupCopies::automatic);
  }

  TEST_CASE("items_per_launch: groups on memcpy nodes (the fallback where the copy kernel cannot be loaded) give "
            "the same outputs, and say why they use them") {
    check_grouped_runs(replay::GroupCopies::memcpy_nodes);
  }

  TEST_CASE("items_per_launch: the copy kernel's availability per device is reported, never a crash") {
    // On this GPU either it loads (sm_75 and newer) or a reason names the
    // CUDA call and status; asking twice gives the same answer.
    const int device = replay::current_device();
    const replay::detail::CopyKernelLoad& first = replay::detail::copy_kernel_on(device, std::source_location::current());
    const replay::detail::CopyKernelLoad& again = replay::detail::copy_kernel_on(device, std::source_location::current());
    CHECK(&first == &again);
    CHECK((first.kernel != nullptr) == first.unavailable.empty());
    if (first.kernel == nullptr) {
      CHECK(replay::detail::is_code_load_error(first.status));
      CHECK(first.unavailable.find("cannot be loaded") != std::string::npos);
    }
    CHECK(cudaPeekAtLastError() == cudaSuccess);  // a refusal is replay's own, taken back out of the slot
  }

  TEST_CASE("items_per_launch: grouped runs on three threads beside single submits: every output checked") {
    constexpr std::size_t group = 4;
    const std::size_t capacity = 2048;
    replay::StreamPipeline<float> pipeline(
        {.input_capacity = capacity, .slots = 2 * group, .flags = replay::PipelineFlags::graph_slot,
         .items_per_launch = group},
        [](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) { affine(in, out, s); });
    const int rounds = under_sanitizer() ? 3 : 30;
    std::atomic<std::size_t> checked{0};
    std::vector<std::thread> threads;
    // Each thread draws its data from its own engine (the case's engine is not
    // thread-safe), seeded from the case's seed: replayable like the rest.
    const auto floats = [capacity](std::mt19937& engine) {
      std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
      std::vector<float> v(capacity);
      for (float& x : v) {
        x = dist(engine);
      }
      return v;
    };
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 engine{replay_test::case_seed_for(static_cast<std::uint64_t>(t) + 1)};
        // Each thread's own pinned ring, reused every round (pinned or pageable by turns).
        replay::PinnedBuffer<float> in(capacity * 12);
        replay::PinnedBuffer<float> out(capacity * 12);
        for (int round = 0; round < rounds; ++round) {
          const std::size_t count = 1 + static_cast<std::size_t>((round * 5 + t) % 12);
          std::vector<std::vector<float>> reference;
          std::vector<replay::BufferView<float, replay::MemorySpace::pinned_host>> inputs;
          std::vector<replay::BufferView<float, replay::MemorySpace::pinned_host>> outputs;
          for (std::size_t k = 0; k < count; ++k) {
            reference.push_back(floats(engine));
            inputs.push_back(in.view().subview(k * capacity, capacity));
            outputs.push_back(out.view().subview(k * capacity, capacity));
            std::memcpy(inputs.back().data(), reference.back().data(), capacity * sizeof(float));
            std::fill_n(outputs.back().data(), capacity, -1.0F);
          }
          if (round % 2 == 0) {
            const auto counts = pipeline.run(inputs, outputs);
            for (std::size_t k = 0; k < count; ++k) {
              REQUIRE(counts[k] == capacity);
              REQUIRE(first_mismatch(reference[k], std::span<const float>(outputs[k].data(), capacity)) == kNone);
            }
          } else {
            const auto vectors = pipeline.run(reference);  // pageable in, vectors out
            for (std::size_t k = 0; k < count; ++k) {
              REQUIRE(first_mismatch(reference[k], vectors[k]) == kNone);
            }
          }
          checked += count;
        }
      });
    }
    threads.emplace_back([&] {
      std::mt19937 engine{replay_test::case_seed_for(0)};
      for (int i = 0; i < 6 * rounds; ++i) {
        const auto input = floats(engine);
        const std::vector<float> output = pipeline.submit(std::span<const float>(input)).get();
        REQUIRE(first_mismatch(input, output) == kNone);
        ++checked;
      }
    });
    for (auto& thread : threads) {
      thread.join();
    }
    pipeline.drain();
    const auto stats = pipeline.stats();
    CHECK(stats.completed == checked.load());
    CHECK(stats.failed == 0);
    CHECK(stats.grouped_items > 0);
  }

  TEST_CASE("items_per_launch: bad values are refused with usage_error naming the option") {
    const auto make = [](replay::PipelineOptions options) {
      replay::StreamPipeline<float> pipeline(std::move(options), affine);
    };
    CHECK_THROWS_WITH_AS(make({.input_capacity = 64, .slots = 8, .items_per_launch = 4}),
                         doctest::Contains("needs PipelineFlags::graph_slot"), replay::usage_error);
    CHECK_THROWS_WITH_AS(
        make({.input_capacity = 64, .slots = 6, .flags = replay::PipelineFlags::graph_slot, .items_per_launch = 4}),
        doctest::Contains("slots (6) must be a multiple of items_per_launch (4)"), replay::usage_error);
    CHECK_THROWS_WITH_AS(
        make({.input_capacity = 64, .slots = 8, .flags = replay::PipelineFlags::graph_slot, .items_per_launch = 0}),
        doctest::Contains("items_per_launch must be between 1 and 64 (got 0)"), replay::usage_error);
    CHECK_THROWS_WITH_AS(
        make({.input_capacity = 64, .slots = 130, .flags = replay::PipelineFlags::graph_slot, .items_per_launch = 65}),
        doctest::Contains("items_per_launch must be between 1 and 64 (got 65)"), replay::usage_error);
    replay::StreamPipeline<float> single({.input_capacity = 64, .slots = 4, .flags = replay::PipelineFlags::graph_slot},
                                         affine);
    CHECK(single.items_per_launch() == 1);
  }

  TEST_CASE("the launch groups' copy kernel copies every byte at any size and alignment, both ways, in place") {
    namespace d = replay::detail;
    constexpr std::size_t kRoom = 70000;
    replay::PinnedBuffer<unsigned char> host_in(kRoom);
    replay::PinnedBuffer<unsigned char> host_out(kRoom);
    replay::DeviceBuffer<unsigned char> device(kRoom);
    std::vector<unsigned char> pageable(64);
    CHECK(d::device_address_of_host(host_in.data()) != nullptr);
    CHECK(d::device_address_of_host(pageable.data()) == nullptr);  // not addressable by the device
    replay::Stream stream;
    std::uniform_int_distribution<int> byte(0, 255);
    int cases = 0;
    for (const std::size_t offset : {0U, 1U, 4U, 8U, 16U}) {
      for (const std::size_t bytes : {1U, 3U, 15U, 16U, 17U, 64U, 1000U, 65536U, 65537U}) {
        for (std::size_t i = 0; i < kRoom; ++i) {
          host_in.data()[i] = static_cast<unsigned char>(byte(replay_test::rng()));
          host_out.data()[i] = 0xA5;
        }
        // Host -> device -> host through two copy nodes, on the device addresses of the pinned buffers.
        replay::Graph graph = replay::Graph::create();
        auto* const in = static_cast<unsigned char*>(d::device_address_of_host(host_in.data()));
        auto* const out = static_cast<unsigned char*>(d::device_address_of_host(host_out.data()));
        REQUIRE(in != nullptr);
        REQUIRE(out != nullptr);
        const cudaGraphNode_t first = d::add_copy_node(graph.get(), nullptr, in + offset, device.data() + offset, bytes,
                                                       std::source_location::current());
        (void)d::add_copy_node(graph.get(), first, device.data() + offset, out + offset, bytes,
                               std::source_location::current());
        replay::GraphExec exec(graph);
        exec.launch(stream);
        stream.synchronize();
        REQUIRE(std::memcmp(host_in.data() + offset, host_out.data() + offset, bytes) == 0);
        for (std::size_t i = 0; i < kRoom; ++i) {  // nothing written outside the range
          if (i < offset || i >= offset + bytes) {
            REQUIRE(host_out.data()[i] == 0xA5);
          }
        }
        ++cases;
      }
    }
    CHECK(cases == 45);
  }

  TEST_CASE("CopyGraph: several copies in one launch, changed nodes re-pointed, fewer or more copies later") {
    namespace d = replay::detail;
    constexpr std::size_t kRoom = 1 << 16;
    replay::DeviceBuffer<unsigned char> source(kRoom);
    replay::DeviceBuffer<unsigned char> target(kRoom);
    replay::Stream stream;
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<unsigned char> host(kRoom);
    for (auto& b : host) {
      b = static_cast<unsigned char>(byte(replay_test::rng()));
    }
    source.copy_from(std::span<const unsigned char>(host), stream);
    d::CopyGraph graph;
    // Rounds of disjoint copies at varied offsets and sizes; each round's
    // target starts filled with a marker, so a copy that went elsewhere, or
    // a node left pointing at the last round's ranges, shows.
    const std::vector<std::vector<d::ByteCopy>> rounds = {
        {{source.data(), target.data(), 1000}, {source.data() + 3000, target.data() + 2001, 17}},
        {{source.data() + 5, target.data() + 9, 4096}, {source.data() + 9000, target.data() + 8000, 65}},
        {{source.data() + 12345, target.data() + 40000, 1}},  // fewer: the second node copies nothing
        {{source.data() + 12345, target.data() + 40000, 1}},  // the same again: nothing re-pointed
        {{source.data() + 12345, target.data() + 40000, 1},
         {source.data() + 100, target.data() + 50000, 200}},  // only the second node re-pointed
        {{source.data(), target.data() + 100, 16}, {source.data() + 20000, target.data() + 20000, 30000},
         {source.data() + 7, target.data() + 60000, 5000}},  // more: built again
    };
    const std::vector<std::size_t> builds_after = {1, 1, 1, 1, 1, 2};
    const std::vector<std::size_t> repoints_after = {0, 2, 4, 4, 5, 5};
    for (std::size_t r = 0; r < rounds.size(); ++r) {
      CAPTURE(r);
      replay::check(cudaMemsetAsync(target.data(), 0xA5, kRoom, stream.get()), "cudaMemsetAsync");
      graph.launch(rounds[r], stream, std::source_location::current());
      std::vector<unsigned char> got(kRoom);
      target.copy_to(std::span<unsigned char>(got), stream);
      stream.synchronize();
      std::vector<unsigned char> want(kRoom, 0xA5);
      for (const d::ByteCopy& c : rounds[r]) {
        const auto from = static_cast<std::size_t>(static_cast<const unsigned char*>(c.source) - source.data());
        const auto to = static_cast<std::size_t>(static_cast<unsigned char*>(c.target) - target.data());
        std::memcpy(want.data() + to, host.data() + from, c.bytes);
      }
      CHECK(got == want);
      CHECK(graph.builds() == builds_after[r]);
      CHECK(graph.repoints() == repoints_after[r]);
    }
    CHECK(graph.nodes() == 3);
    graph.launch({}, stream, std::source_location::current());  // no copies: nothing launched, nothing built
    CHECK(graph.builds() == 2);
  }
}
