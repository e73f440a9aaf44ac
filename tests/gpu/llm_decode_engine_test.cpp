// examples/llm_decode's executor and engine on a GPU: graphed decode steps
// (one per launch and several in a WHILE node) give the same tokens, bit for
// bit, as the same steps issued eagerly, for random batch compositions, for
// the launches continuous batching makes with requests from several threads,
// with end-of-sequence tokens, and with buckets captured lazily while
// sequences are live. Host cases: the executor's refusals.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <map>
#include <set>
#include <stdexcept>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "engine.hpp"
#include "executor.hpp"
#include "kv_cache.hpp"
#include "launch_plan.hpp"
#include "model.hpp"
#include "product_tuning.hpp"
// doctest after torch, as in the other torch tests: c10's logging defines a
// CHECK macro of its own (a fatal log, not a counted assertion).
#undef CHECK
#include <doctest/doctest.h>
#include "gpu_suite.hpp"
#include "llm_decode_support.hpp"
#include "threads_at_once.hpp"

namespace {

using llm_decode::ExecutorOptions;
using llm_decode::KvCache;
using llm_decode::LlamaExecutor;
using llm_decode::LlamaModel;
using llm_decode::StepMode;

// A small model (the "tiny" preset: a few layers, grouped-query heads) with
// room for the buckets below.
LlamaModel tiny_model(const at::Device& device) {
  llm_decode::LlamaConfig config = llm_decode::LlamaConfig::preset("tiny");
  config.max_len = 64;
  return LlamaModel::random(config, 7, device);
}

const std::vector<std::int64_t> kBatchBuckets{1, 2, 4, 8};
const std::vector<std::int64_t> kContextBuckets{16, 32, 64};
const std::vector<std::int64_t> kPrefillBuckets{8, 16, 32, 64};

ExecutorOptions options(StepMode mode, std::size_t steps, bool capture_at_start = true,
                        llm_decode::DecodeKernels kernels = llm_decode::DecodeKernels::aten) {
  return ExecutorOptions{.mode = mode,
                         .batch_buckets = kBatchBuckets,
                         .context_buckets = kContextBuckets,
                         .steps_per_launch = steps,
                         .kernels = kernels,
                         .prefill_buckets = kPrefillBuckets,
                         .capture_at_start = capture_at_start};
}

std::vector<replay::TokenId> random_prompt(std::mt19937_64& rng, std::size_t length, std::int64_t vocab) {
  std::uniform_int_distribution<replay::TokenId> token(1, static_cast<replay::TokenId>(vocab - 1));
  std::vector<replay::TokenId> prompt(length);
  for (auto& t : prompt) t = token(rng);
  return prompt;
}

// One live sequence of the random schedule.
struct Live {
  std::size_t position = 0;
  replay::TokenId token = 0;
  std::size_t left = 0;  // tokens it may still produce
};

// Whether two caches hold the same bits in their sequence slots. Not the
// spare slot: the padding and finished rows of one step all write its
// position 0, in no fixed order.
bool same_sequence_slots(const KvCache& a, const KvCache& b) {
  const auto slots = [](const at::Tensor& t) { return t.narrow(1, 0, t.size(1) - 1); };
  return slots(a.k).equal(slots(b.k)) && slots(a.v).equal(slots(b.v));
}

// Drives `executors` (all made alike except for their mode) through the
// same random schedule: sequences join (prefilled into a free slot) and
// leave (their token budget spent, or under max_len), launches of 1 to
// `steps` steps over every live sequence. Checks that every executor gets
// the same tokens as the first, call by call. Returns the number of launches.
std::size_t run_random_schedule(std::vector<LlamaExecutor*> executors, std::size_t steps, std::uint64_t seed,
                                std::int64_t vocab, std::size_t max_len, std::size_t rounds) {
  std::mt19937_64 rng(seed);
  std::map<std::size_t, Live> live;  // by slot, in slot order
  std::size_t launches = 0;
  const auto slots = static_cast<std::size_t>(kBatchBuckets.back());
  for (std::size_t round = 0; round < rounds; ++round) {
    // Joins: up to 3 new sequences into free slots.
    std::vector<std::size_t> free;
    for (std::size_t s = 0; s < slots; ++s) {
      if (!live.contains(s)) free.push_back(s);
    }
    std::shuffle(free.begin(), free.end(), rng);
    const std::size_t joins = std::min<std::size_t>(free.size(), std::uniform_int_distribution<std::size_t>(0, 3)(rng));
    std::vector<std::size_t> join_slots(free.begin(), free.begin() + static_cast<std::ptrdiff_t>(joins));
    std::vector<std::vector<replay::TokenId>> prompts;
    for (std::size_t j = 0; j < joins; ++j) {
      prompts.push_back(random_prompt(rng, std::uniform_int_distribution<std::size_t>(1, 24)(rng), vocab));
    }
    if (joins > 0) {
      std::vector<replay::TokenId> first;
      for (std::size_t e = 0; e < executors.size(); ++e) {
        const auto got = llm_decode::run_prefill(*executors[e], join_slots, prompts);
        if (e == 0) {
          first = got;
        } else {
          REQUIRE(got == first);
        }
      }
      for (std::size_t j = 0; j < joins; ++j) {
        live[join_slots[j]] = Live{.position = prompts[j].size(),
                                   .token = first[j],
                                   .left = std::uniform_int_distribution<std::size_t>(1, 20)(rng)};
      }
    }
    if (live.empty()) continue;
    // One launch over every live sequence.
    std::vector<replay::DecodeRow> rows;
    std::size_t max_steps = 1;
    std::size_t reach = 0;
    for (const auto& [slot, seq] : live) {
      const std::size_t room = max_len - seq.position;
      const std::size_t max_tokens = std::min({steps, seq.left, room});
      rows.push_back({.slot = slot, .position = seq.position, .token = seq.token, .max_tokens = max_tokens});
      max_steps = std::max(max_steps, max_tokens);
      reach = std::max(reach, seq.position + max_tokens);
    }
    const std::int64_t batch_bucket =
        llm_decode::smallest_bucket_for(kBatchBuckets, static_cast<std::int64_t>(rows.size()));
    const std::int64_t context_bucket =
        llm_decode::smallest_bucket_for(kContextBuckets, static_cast<std::int64_t>(reach));
    std::vector<std::vector<replay::TokenId>> first;
    for (std::size_t e = 0; e < executors.size(); ++e) {
      const auto got = llm_decode::run_launch(*executors[e], rows, batch_bucket, context_bucket, max_steps, {});
      if (e == 0) {
        first = got;
      } else {
        INFO("launch " << launches << " of " << rows.size() << " rows, bucket {" << batch_bucket << ", "
                       << context_bucket << "}, executor " << e);
        REQUIRE(got == first);
      }
    }
    ++launches;
    std::size_t r = 0;
    for (auto it = live.begin(); it != live.end(); ++r) {
      Live& seq = it->second;
      REQUIRE(first[r].size() == rows[r].max_tokens);
      seq.position += first[r].size();
      seq.token = first[r].back();
      seq.left -= first[r].size();
      // Leaves at its budget or at max_len; and now and then at random.
      if (seq.left == 0 || seq.position >= max_len || std::uniform_int_distribution<int>(0, 9)(rng) == 0) {
        it = live.erase(it);
      } else {
        ++it;
      }
    }
  }
  return launches;
}

// Holds the thread that calls its callback (a DecodeScheduler's worker) at
// each running update until allow() lets that many return.
struct Gate {
  struct Result {
    std::vector<replay::TokenId> tokens;
    replay::DecodeStatus status = replay::DecodeStatus::running;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t entered = 0;
  std::size_t allowed = 0;
  bool done = false;
  Result result;

  std::function<void(const replay::DecodeUpdate&)> callback() {
    return [this](const replay::DecodeUpdate& u) {
      std::unique_lock lock(mutex);
      result.tokens.insert(result.tokens.end(), u.tokens.begin(), u.tokens.end());
      ++entered;
      if (u.done()) {
        result.status = u.status;
        done = true;
      }
      changed.notify_all();
      if (!u.done()) changed.wait(lock, [&] { return allowed >= entered; });
    };
  }
  void wait_entered(std::size_t n) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return entered >= n; });
  }
  void allow(std::size_t n) {
    const std::lock_guard lock(mutex);
    allowed = n;
    changed.notify_all();
  }
  Result wait_done() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return done; });
    return result;
  }
};

// Submits request i (prompts[i], limits[i] new tokens) from `threads`
// threads at once, each thread its own run of requests, one after another.
template <class Scheduler>
std::vector<replay::DecodeResult> submit_from_threads(Scheduler& scheduler,
                                                      const std::vector<std::vector<replay::TokenId>>& prompts,
                                                      const std::vector<std::size_t>& limits, std::size_t threads) {
  std::vector<replay::DecodeResult> results(prompts.size());
  const std::size_t per_thread = prompts.size() / threads;
  std::vector<std::thread> submitters;
  for (std::size_t t = 0; t < threads; ++t) {
    submitters.emplace_back([&, t] {
      const std::size_t end = t + 1 == threads ? prompts.size() : (t + 1) * per_thread;
      for (std::size_t i = t * per_thread; i < end; ++i) {
        results[i] = scheduler.submit({.prompt = prompts[i], .max_new_tokens = limits[i]}).wait();
      }
    });
  }
  for (auto& s : submitters) s.join();
  return results;
}

// Every request ended at its token limit with exactly that many tokens.
void check_token_limits(const std::vector<replay::DecodeResult>& results, const std::vector<std::size_t>& limits) {
  for (std::size_t i = 0; i < results.size(); ++i) {
    CAPTURE(i);
    CHECK(results[i].status == replay::DecodeStatus::token_limit);
    CHECK(results[i].tokens.size() == limits[i]);
  }
}

using Recording = llm_decode::RecordingExecutor<LlamaExecutor>;

// What threaded_run_against_eager() saw.
struct ThreadedRun {
  std::vector<Recording::Call> calls;  // every executor call, in order
  replay::DecodeStats scheduler;
  llm_decode::ExecutorStats executor;
};

// 24 requests (request i: a random prompt of prompt_length(i) tokens and
// 3 + 7i mod 17 new tokens) from 4 threads through continuous batching over
// a graphed executor whose calls are recorded. Checks that every request
// ended at its limit with exactly that many tokens, and that every recorded
// call replayed eagerly (the same kernels, op by op) on a fresh cache gives
// the same tokens bit for bit.
template <class PromptLength>
ThreadedRun threaded_run_against_eager(const LlamaModel& model, std::size_t steps, llm_decode::DecodeKernels kernels,
                                       std::uint64_t seed, PromptLength prompt_length, std::size_t max_prefill_tokens,
                                       replay::DecodePrefill prefill) {
  const at::Device device = model.device();
  KvCache cache(model.config(), kBatchBuckets.back(), device, model.dtype());
  LlamaExecutor graphed(model, cache, options(StepMode::graphed, steps, true, kernels));
  Recording recording(graphed);
  std::vector<std::vector<replay::TokenId>> prompts(24);
  std::vector<std::size_t> limits(prompts.size());
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    prompts[i] = random_prompt(rng, prompt_length(i), model.config().vocab_size);
    limits[i] = 3 + (i * 7) % 17;
  }
  ThreadedRun run;
  {
    replay::DecodeScheduler<Recording&> scheduler(recording, {.max_slots = 8,
                                                              .max_len = 64,
                                                              .batch_buckets = kBatchBuckets,
                                                              .context_buckets = kContextBuckets,
                                                              .steps_per_launch = steps,
                                                              .max_prefill_tokens = max_prefill_tokens,
                                                              .prefill = prefill});
    check_token_limits(submit_from_threads(scheduler, prompts, limits, 4), limits);
    scheduler.shutdown(replay::DecodeShutdown::drain);
    run.scheduler = scheduler.stats();
  }
  run.executor = graphed.stats();
  run.calls = recording.calls();
  KvCache eager_cache(model.config(), kBatchBuckets.back(), device, model.dtype());
  LlamaExecutor eager(model, eager_cache, options(StepMode::eager, steps, true, kernels));
  std::string first_difference;
  CHECK_MESSAGE(llm_decode::replay_recording(eager, run.calls, {}, &first_difference) == 0, first_difference);
  return run;
}

}  // namespace

TEST_SUITE("host") {
TEST_CASE("LlamaExecutor refuses options that cannot work, naming them") {
  const LlamaModel model = tiny_model(at::Device(at::kCPU));
  KvCache cache(model.config(), 8, at::Device(at::kCPU), model.dtype());
  ExecutorOptions no_buckets = options(StepMode::eager, 1);
  no_buckets.batch_buckets.clear();
  CHECK_THROWS_WITH_AS(LlamaExecutor(model, cache, no_buckets), doctest::Contains("batch_buckets"),
                       std::invalid_argument);
  ExecutorOptions zero_steps = options(StepMode::eager, 0);
  CHECK_THROWS_WITH_AS(LlamaExecutor(model, cache, zero_steps), doctest::Contains("steps_per_launch"),
                       std::invalid_argument);
  ExecutorOptions long_context = options(StepMode::eager, 1);
  long_context.context_buckets = {16, 128};
  CHECK_THROWS_WITH_AS(LlamaExecutor(model, cache, long_context), doctest::Contains("max_len"),
                       std::invalid_argument);
  KvCache small_cache(model.config(), 4, at::Device(at::kCPU), model.dtype());
  CHECK_THROWS_WITH_AS(LlamaExecutor(model, small_cache, options(StepMode::eager, 1)),
                       doctest::Contains("slots"), std::invalid_argument);
  for (const std::vector<std::int64_t>& bad : {std::vector<std::int64_t>{16, 8}, std::vector<std::int64_t>{8, 8},
                                               std::vector<std::int64_t>{0, 8}, std::vector<std::int64_t>{32, 128}}) {
    ExecutorOptions bad_prefill = options(StepMode::eager, 1);
    bad_prefill.prefill_buckets = bad;
    CHECK_THROWS_WITH_AS(LlamaExecutor(model, cache, bad_prefill), doctest::Contains("prefill_buckets"),
                         std::invalid_argument);
  }
  // The fused kernels need fp16 on a CUDA device: refused before any capture.
  CHECK_THROWS_WITH_AS(LlamaExecutor(model, cache, options(StepMode::eager, 1, true, llm_decode::DecodeKernels::fused)),
                       doctest::Contains("DecodeKernels::fused"), std::invalid_argument);
  // Product sets of its own whose narrow counts would change nothing, or that the narrow product does not take.
  ExecutorOptions inert_narrow = options(StepMode::eager, 1);
  inert_narrow.products = llm_decode::fused::ProductSets{.own = llm_decode::fused::product_rows_of({1, 2}),
                                                         .narrow = llm_decode::fused::product_rows_of({2, 4})};
  CHECK_THROWS_WITH_AS(LlamaExecutor(model, cache, inert_narrow),
                       doctest::Contains("narrow products at 4 rows, where the own products are not used"),
                       std::invalid_argument);
  inert_narrow.products->narrow = llm_decode::fused::product_rows_of({1});
  CHECK_THROWS_WITH_AS(LlamaExecutor(model, cache, inert_narrow),
                       doctest::Contains("narrow products at 1 rows; they take 2 to 8"), std::invalid_argument);
}

TEST_CASE("DecodeEngine refuses chunked prefill its executor could not run, before touching a device") {
  const LlamaModel model = tiny_model(at::Device(at::kCPU));  // max_len 64: the default prefill buckets are {64}
  auto engine_options = [](std::size_t budget) {
    return llm_decode::EngineOptions{.batch_buckets = kBatchBuckets,
                                     .context_buckets = kContextBuckets,
                                     .mode = StepMode::eager,
                                     .max_prefill_tokens = budget,
                                     .kernels = llm_decode::DecodeKernels::fused,
                                     .decode_prefill = replay::DecodePrefill::with_decode};
  };
  llm_decode::EngineOptions empty = engine_options(16);
  empty.batch_buckets.clear();
  CHECK_THROWS_WITH_AS(llm_decode::DecodeEngine(model, empty), doctest::Contains("batch_buckets"),
                       std::invalid_argument);
  llm_decode::EngineOptions aten = engine_options(16);
  aten.kernels = llm_decode::DecodeKernels::aten;
  CHECK_THROWS_WITH_AS(llm_decode::DecodeEngine(model, aten), doctest::Contains("needs kernels = DecodeKernels::fused"),
                       std::invalid_argument);
  llm_decode::EngineOptions unpadded = engine_options(16);
  unpadded.prefill = llm_decode::PrefillMode::unpadded;
  CHECK_THROWS_WITH_AS(llm_decode::DecodeEngine(model, unpadded), doctest::Contains("PrefillMode::bucketed"),
                       std::invalid_argument);
  // 8 decode rows in a 64-token forward leave room for 56 prompt tokens.
  for (const std::size_t budget : {std::size_t{0}, std::size_t{57}}) {
    CAPTURE(budget);
    CHECK_THROWS_WITH_AS(llm_decode::DecodeEngine(model, engine_options(budget)),
                         doctest::Contains("the budget must be 1..56"), std::invalid_argument);
  }
  llm_decode::EngineOptions explicit_buckets = engine_options(57);
  explicit_buckets.prefill_buckets = {16, 32};
  CHECK_THROWS_WITH_AS(llm_decode::DecodeEngine(model, explicit_buckets), doctest::Contains("the budget must be 1..24"),
                       std::invalid_argument);
  // A budget that fits passes this check; the executor then refuses the
  // fused kernels on the CPU (they need fp16 on a CUDA device).
  CHECK_THROWS_WITH_AS(llm_decode::DecodeEngine(model, engine_options(56)), doctest::Contains("fp16 on a CUDA device"),
                       std::invalid_argument);
}
}

TEST_SUITE("gpu" * replay_test::needs_device()) {
TEST_CASE("graphed steps give the eager steps' tokens bit for bit over random batch compositions") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  for (const std::size_t steps : {std::size_t{1}, std::size_t{3}}) {
    CAPTURE(steps);
    KvCache eager_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    KvCache graphed_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    KvCache threaded_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    LlamaExecutor eager(model, eager_cache, options(StepMode::eager, steps));
    LlamaExecutor graphed(model, graphed_cache, options(StepMode::graphed, steps));
    // The same buckets captured by 4 threads at once (capture_threads).
    ExecutorOptions threaded_options = options(StepMode::graphed, steps);
    threaded_options.capture_threads = 4;
    LlamaExecutor threaded(model, threaded_cache, threaded_options);
    CHECK(graphed.capture_failures().empty());
    CHECK(threaded.capture_failures().empty());
    CHECK(graphed.stats().graphs == kBatchBuckets.size() * kContextBuckets.size());
    CHECK(threaded.stats().graphs == kBatchBuckets.size() * kContextBuckets.size());
    CHECK(graphed.stats().prefill_graphs == kPrefillBuckets.size());
    const std::size_t launches = run_random_schedule({&eager, &graphed, &threaded}, steps, 100 + steps,
                                                     model.config().vocab_size, 64, 60);
    CHECK(launches > 30);
    // Every launch was a replay: the router saw no eager run.
    REQUIRE(graphed.router() != nullptr);
    REQUIRE(threaded.router() != nullptr);
    CHECK(threaded.router()->stats().hits == launches);
    CHECK(graphed.router()->stats().eager_fallbacks == 0);
    CHECK(graphed.router()->stats().eager_busy == 0);
    CHECK(graphed.router()->stats().hits == launches);
    // Every prefill forward was a replay of a prefill bucket's graph (the
    // prompts, at most 3 of 24 tokens, always fit the largest bucket).
    REQUIRE(graphed.prefill_router() != nullptr);
    CHECK(graphed.prefill_router()->stats().eager_fallbacks == 0);
    CHECK(graphed.prefill_router()->stats().hits == graphed.stats().prefill_forwards);
    CHECK(graphed.stats().prefill_forwards > 0);
    CHECK(eager.prefill_router() == nullptr);
  }
}

TEST_CASE("fused kernels: graphed steps give the eager steps' tokens bit for bit over random batch compositions") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  const auto fused = llm_decode::DecodeKernels::fused;
  for (const std::size_t steps : {std::size_t{1}, std::size_t{3}}) {
    CAPTURE(steps);
    KvCache eager_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    KvCache fused_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    LlamaExecutor eager(model, eager_cache, options(StepMode::eager, steps, true, fused));
    LlamaExecutor graphed(model, fused_cache, options(StepMode::graphed, steps, true, fused));
    CHECK(graphed.capture_failures().empty());
    const std::size_t launches =
        run_random_schedule({&eager, &graphed}, steps, 300 + steps, model.config().vocab_size, 64, 40);
    CHECK(launches > 20);
    REQUIRE(graphed.router() != nullptr);
    CHECK(graphed.router()->stats().hits == launches);
  }
}

TEST_CASE("fused kernels past 256 positions (attention split over blocks): graphed and K-step launches give eager's tokens") {
  const at::Device cuda(at::kCUDA, 0);
  llm_decode::LlamaConfig config = llm_decode::LlamaConfig::preset("tiny");
  config.max_len = 640;
  const LlamaModel model = LlamaModel::random(config, 11, cuda);
  // Contexts of 1, 2 and 3 key splits; prompts that start the rows on both
  // sides of the split boundaries (256, 512), each prefilled in a bucket's
  // graph (whose forward reads the whole cache length: 3 splits).
  const std::vector<std::int64_t> context_buckets{64, 320, 640};
  const auto fused_options = [&](StepMode mode, std::size_t steps) {
    return ExecutorOptions{.mode = mode,
                           .batch_buckets = kBatchBuckets,
                           .context_buckets = context_buckets,
                           .steps_per_launch = steps,
                           .kernels = llm_decode::DecodeKernels::fused,
                           .prefill_buckets = {64, 512}};
  };
  std::mt19937_64 rng(replay_test::case_seed());
  const std::vector<std::size_t> lengths{40, 250, 300, 509};
  for (const std::size_t steps : {std::size_t{1}, std::size_t{3}}) {
    CAPTURE(steps);
    KvCache eager_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    KvCache graphed_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    LlamaExecutor eager(model, eager_cache, fused_options(StepMode::eager, steps));
    LlamaExecutor graphed(model, graphed_cache, fused_options(StepMode::graphed, steps));
    REQUIRE(graphed.capture_failures().empty());
    std::vector<replay::DecodeRow> rows;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::vector<std::vector<replay::TokenId>> prompt{random_prompt(rng, lengths[i], model.config().vocab_size)};
      const auto first = llm_decode::run_prefill(eager, {i}, prompt);
      REQUIRE(llm_decode::run_prefill(graphed, {i}, prompt) == first);
      rows.push_back({.slot = i, .position = lengths[i], .token = first[0], .max_tokens = steps});
    }
    // 9 steps of the first 3 rows (a context of 320: 2 splits; the rows
    // cross position 256), then 9 of all 4 (640: 3 splits, the last row
    // crossing 512).
    std::set<std::int64_t> contexts;
    for (const std::size_t live : {std::size_t{3}, std::size_t{4}}) {
      for (std::size_t launch = 0; launch * steps < 9; ++launch) {
        const std::vector<replay::DecodeRow> launch_rows(rows.begin(),
                                                         rows.begin() + static_cast<std::ptrdiff_t>(live));
        std::size_t reach = 0;
        for (const replay::DecodeRow& row : launch_rows) reach = std::max(reach, row.position + steps);
        const std::int64_t context =
            llm_decode::smallest_bucket_for(context_buckets, static_cast<std::int64_t>(reach));
        contexts.insert(context);
        const auto expected = llm_decode::run_launch(eager, launch_rows, 4, context, steps, {});
        INFO("launch " << launch << " of " << live << " rows, context bucket " << context);
        REQUIRE(llm_decode::run_launch(graphed, launch_rows, 4, context, steps, {}) == expected);
        for (std::size_t r = 0; r < live; ++r) {
          REQUIRE(expected[r].size() == steps);
          rows[r].position += steps;
          rows[r].token = expected[r].back();
        }
      }
    }
    CHECK(contexts == std::set<std::int64_t>{320, 640});
    CHECK(graphed.router()->stats().eager_fallbacks == 0);
    CHECK(graphed.prefill_router()->stats().hits == graphed.stats().prefill_forwards);
  }
}

TEST_CASE("a bucket captured lazily while sequences are live leaves their caches alone") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  KvCache eager_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  KvCache lazy_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  // Small prefill buckets: prompts of up to 24 tokens, so some packs are
  // split and some prompts (over 16 tokens) get an unpadded forward of their own.
  ExecutorOptions eager_options = options(StepMode::eager, 2);
  eager_options.prefill_buckets = {4, 8, 16};
  ExecutorOptions lazy_options = options(StepMode::graphed, 2, /*capture_at_start=*/false);
  lazy_options.prefill_buckets = {4, 8, 16};
  LlamaExecutor eager(model, eager_cache, eager_options);
  LlamaExecutor lazy(model, lazy_cache, lazy_options);
  CHECK(lazy.stats().graphs == 0);
  CHECK(lazy.stats().prefill_graphs == 0);
  (void)run_random_schedule({&eager, &lazy}, 2, 5, model.config().vocab_size, 64, 40);
  CHECK(lazy.stats().graphs > 1);
  CHECK(lazy.stats().prefill_graphs > 1);
  CHECK(lazy.capture_failures().empty());
  // Some prompts were longer than the largest prefill bucket: eager forwards of their own.
  CHECK(lazy.prefill_router()->stats().hits < lazy.stats().prefill_forwards);
}

TEST_CASE("bucketed prefill (padded, graphed) gives unpadded prefill's first tokens and cache within fp16 rounding") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  std::mt19937_64 rng(21);
  std::vector<std::vector<replay::TokenId>> prompts;
  for (const std::size_t length : {3, 11, 1, 17, 6}) prompts.push_back(random_prompt(rng, length, model.config().vocab_size));
  const std::vector<std::size_t> slots{4, 0, 7, 2, 5};
  KvCache unpadded_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  KvCache bucketed_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  ExecutorOptions unpadded_options = options(StepMode::eager, 1);
  unpadded_options.prefill = llm_decode::PrefillMode::unpadded;
  LlamaExecutor unpadded(model, unpadded_cache, unpadded_options);
  LlamaExecutor bucketed(model, bucketed_cache, options(StepMode::graphed, 1));
  const auto expected = llm_decode::run_prefill(unpadded, slots, prompts);
  const auto got = llm_decode::run_prefill(bucketed, slots, prompts);
  CHECK(got == expected);
  CHECK(bucketed.stats().prefill_forwards == 1);  // 38 tokens: one forward of the 64-token bucket
  CHECK(bucketed.prefill_router()->stats().hits == 1);
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    const auto slot = static_cast<std::int64_t>(slots[p]);
    const auto length = static_cast<std::int64_t>(prompts[p].size());
    for (const auto& [a, b] : {std::pair{&unpadded_cache.k, &bucketed_cache.k}, std::pair{&unpadded_cache.v, &bucketed_cache.v}}) {
      const at::Tensor x = a->select(1, slot).narrow(2, 0, length).to(at::kFloat);
      const at::Tensor y = b->select(1, slot).narrow(2, 0, length).to(at::kFloat);
      CHECK(at::allclose(x, y, /*rtol=*/1e-2, /*atol=*/1e-2));
    }
  }
  // Nothing outside the prompts' rows was written: the other slots and the
  // positions past each prompt are still zero.
  for (const std::int64_t slot : {1, 3, 6}) CHECK(bucketed_cache.k.select(1, slot).abs().sum().item<double>() == 0.0);
  CHECK(bucketed_cache.k.select(1, 0).narrow(2, 11, 64 - 11).abs().sum().item<double>() == 0.0);
}

TEST_CASE("several steps per launch end early once every row hit an end-of-sequence token") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  std::mt19937_64 rng(3);
  const std::vector<std::vector<replay::TokenId>> prompts{random_prompt(rng, 5, model.config().vocab_size),
                                                          random_prompt(rng, 9, model.config().vocab_size)};
  const std::vector<std::size_t> slots{0, 1};
  // Without end-of-sequence tokens: what each row produces in 8 steps.
  KvCache probe_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  LlamaExecutor probe(model, probe_cache, options(StepMode::graphed, 8));
  const auto first = llm_decode::run_prefill(probe, slots, prompts);
  std::vector<replay::DecodeRow> rows{{.slot = 0, .position = 5, .token = first[0], .max_tokens = 8},
                                      {.slot = 1, .position = 9, .token = first[1], .max_tokens = 8}};
  const auto free_run = llm_decode::run_launch(probe, rows, 2, 32, 8, {});
  REQUIRE(free_run[0].size() == 8);
  REQUIRE(free_run[1].size() == 8);
  // Row 0's third token and row 1's second token end their sequences (each
  // at its first occurrence in the free run).
  const std::vector<replay::TokenId> eos{free_run[0][2], free_run[1][1]};
  auto expected_length = [&](const std::vector<replay::TokenId>& run) {
    for (std::size_t j = 0; j < run.size(); ++j) {
      if (std::find(eos.begin(), eos.end(), run[j]) != eos.end()) return j + 1;
    }
    return run.size();
  };
  for (const StepMode mode : {StepMode::graphed, StepMode::eager}) {
    CAPTURE(static_cast<int>(mode));
    KvCache cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    ExecutorOptions o = options(mode, 8);
    o.eos_tokens = eos;
    LlamaExecutor executor(model, cache, o);
    (void)llm_decode::run_prefill(executor, slots, prompts);
    executor.reset_stats();
    const auto got = llm_decode::run_launch(executor, rows, 2, 32, 8, eos);
    for (std::size_t r = 0; r < 2; ++r) {
      const std::size_t n = expected_length(free_run[r]);
      REQUIRE(got[r].size() == n);
      CHECK(std::equal(got[r].begin(), got[r].end(), free_run[r].begin()));
    }
    if (mode == StepMode::graphed) {
      // The WHILE node stopped after the longer of the two rows.
      CHECK(executor.stats().steps == std::max(expected_length(free_run[0]), expected_length(free_run[1])));
    }
  }
}

TEST_CASE("continuous batching with requests from several threads: every request gets exactly its tokens") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  for (const std::size_t steps : {std::size_t{1}, std::size_t{4}}) {
    CAPTURE(steps);
    const ThreadedRun run = threaded_run_against_eager(
        model, steps, llm_decode::DecodeKernels::aten, 11, [](std::size_t i) { return 1 + i % 20; }, 0,
        replay::DecodePrefill::separate);
    CHECK(run.calls.size() > 24 / 2);
  }
}

TEST_CASE("chunked prefill, requests from several threads: mixed launches give the eager replay's tokens exactly") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  static_assert(replay::MixedDecodeExecutor<llm_decode::RecordingExecutor<LlamaExecutor>>);
  for (const std::size_t steps : {std::size_t{1}, std::size_t{4}}) {
    CAPTURE(steps);
    // 8 prompt tokens per launch: the longer prompts take several chunks.
    const ThreadedRun run = threaded_run_against_eager(
        model, steps, llm_decode::DecodeKernels::fused, 13, [](std::size_t i) { return 1 + (i * 5) % 30; }, 8,
        replay::DecodePrefill::with_decode);
    CHECK(run.scheduler.prefills == 0);
    CHECK(run.scheduler.mixed_launches == run.executor.mixed_launches);
    std::size_t mixed = 0, continued = 0, with_rows = 0;
    for (const auto& call : run.calls) {
      if (call.kind != Recording::Call::Kind::mixed) continue;
      ++mixed;
      for (const replay::PrefillRow& row : call.mixed.chunk_rows) continued += row.start > 0 ? 1 : 0;
      with_rows += call.mixed.launch.rows.empty() ? 0 : 1;
    }
    CHECK(mixed > 0);
    CHECK(continued > 0);  // some prompts were cut into chunks
    CHECK(with_rows > 0);  // and some chunks rode with running sequences' steps
  }
}

TEST_CASE("a prompt in chunks beside a decode row: the whole prompt's cache and first token; refusals") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  std::mt19937_64 rng(29);
  const std::vector<replay::TokenId> prompt = random_prompt(rng, 40, model.config().vocab_size);
  const std::vector<replay::TokenId> other = random_prompt(rng, 9, model.config().vocab_size);
  const ExecutorOptions fused = options(StepMode::graphed, 1, true, llm_decode::DecodeKernels::fused);
  // Whole: slot 1 holds `other`, then the prompt in slot 3 in one prefill,
  // then one decode step of slot 1.
  KvCache whole_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  LlamaExecutor whole(model, whole_cache, fused);
  const replay::TokenId other_first = llm_decode::run_prefill(whole, {1}, {other})[0];
  const replay::TokenId expected_first = llm_decode::run_prefill(whole, {3}, {prompt})[0];
  const replay::DecodeRow row{.slot = 1, .position = other.size(), .token = other_first, .max_tokens = 1};
  const auto expected_step = llm_decode::run_launch(whole, {row}, 1, 16, 1, {});
  // Chunked: the prompt in chunks of 16, 16 and 8; slot 1's step rides with the second.
  KvCache chunked_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  LlamaExecutor chunked(model, chunked_cache, fused);
  CHECK(llm_decode::run_prefill(chunked, {1}, {other})[0] == other_first);
  std::vector<replay::TokenId> got;
  for (std::size_t begin = 0; begin < prompt.size(); begin += 16) {
    const std::size_t end = std::min(prompt.size(), begin + 16);
    llm_decode::RecordedMixed call;
    call.chunks.emplace_back(prompt.begin() + static_cast<std::ptrdiff_t>(begin),
                             prompt.begin() + static_cast<std::ptrdiff_t>(end));
    call.chunk_rows.push_back({.slot = 3, .prompt = {}, .start = begin});
    if (begin == 16) {
      call.launch = {.rows = {row}, .batch_bucket = 1, .context_bucket = 16, .max_steps = 1, .tokens = {}};
    }
    got = llm_decode::run_mixed(chunked, call, {});
    if (begin == 16) {
      REQUIRE(got.size() == 2);
      CHECK(got[1] == expected_step[0][0]);
    }
  }
  CHECK(got.size() == 1);
  CHECK(got[0] == expected_first);
  CHECK(chunked.stats().mixed_launches == 3);
  // Keys and values of both slots as the whole prefill and the decode step wrote them (fp16 rounding apart).
  for (const auto& [slot, length] : {std::pair<std::int64_t, std::int64_t>{3, 40}, {1, 10}}) {
    CAPTURE(slot);
    for (const auto& [a, b] :
         {std::pair{&whole_cache.k, &chunked_cache.k}, std::pair{&whole_cache.v, &chunked_cache.v}}) {
      const at::Tensor x = a->select(1, slot).narrow(2, 0, length).to(at::kFloat);
      const at::Tensor y = b->select(1, slot).narrow(2, 0, length).to(at::kFloat);
      CHECK(at::allclose(x, y, /*rtol=*/1e-2, /*atol=*/1e-2));
      CHECK(b->select(1, slot).narrow(2, length, 64 - length).abs().sum().item<double>() == 0.0);
    }
  }
  // A chunk too many for the largest prefill bucket (64 tokens) is refused, naming the budget.
  const std::vector<replay::TokenId> long_chunk(60, 5);
  llm_decode::RecordedMixed too_long;
  too_long.chunks.push_back(long_chunk);
  too_long.chunk_rows.push_back({.slot = 4, .prompt = {}, .start = 0});
  too_long.launch = {.rows = {{.slot = 1, .position = 10, .token = 1, .max_tokens = 1},
                              {.slot = 3, .position = 40, .token = 1, .max_tokens = 1},
                              {.slot = 5, .position = 0, .token = 1, .max_tokens = 1},
                              {.slot = 6, .position = 0, .token = 1, .max_tokens = 1},
                              {.slot = 7, .position = 0, .token = 1, .max_tokens = 1}},
                     .batch_bucket = 8, .context_bucket = 64, .max_steps = 1, .tokens = {}};
  CHECK_THROWS_WITH_AS(llm_decode::run_mixed(chunked, too_long, {}),
                       doctest::Contains("5 decode rows and 60 prompt tokens make 65 packed tokens; the largest prefill "
                                         "bucket is 64: set the scheduler's max_prefill_tokens"),
                       std::invalid_argument);
  // Chunked prefill needs the fused kernels; prefill() takes whole prompts.
  KvCache aten_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  LlamaExecutor aten(model, aten_cache, options(StepMode::eager, 1));
  const std::vector<replay::TokenId> chunk{5, 6, 7};
  const std::vector<replay::PrefillRow> rows{{.slot = 2, .prompt = chunk, .start = 4}};
  std::vector<replay::TokenId> first(1);
  replay::MixedBatch mixed{.prefill = {.rows = rows, .first_tokens = first}, .decode = {}};
  CHECK_THROWS_WITH_AS(aten.prefill_and_decode(mixed),
                       doctest::Contains("chunked prefill needs kernels = DecodeKernels::fused"), std::invalid_argument);
  replay::PrefillBatch whole_only{.rows = rows, .first_tokens = first};
  CHECK_THROWS_WITH_AS(aten.prefill(whole_only),
                       doctest::Contains("row 0 starts at position 4; prefill() takes whole prompts"),
                       std::invalid_argument);
}

TEST_CASE("DecodeEngine: refusals, cancellation mid-stream, and the freed slot serving the next request") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  Gate gate;  // before the engine: the worker may call it until the engine stops
  llm_decode::DecodeEngine engine(model, {.batch_buckets = {1, 2},
                                          .context_buckets = {32, 64},
                                          .steps_per_launch = 2,
                                          .queue_capacity = 1});
  // On any way out of this case (a failed REQUIRE too), let the worker go
  // before the engine's destructor waits for it.
  const std::unique_ptr<Gate, void (*)(Gate*)> release(
      &gate, [](Gate* g) { g->allow(std::numeric_limits<std::size_t>::max()); });
  // A prompt with no room for a token under max_len (64) is refused at once.
  const replay::DecodeResult too_long = engine.submit({.prompt = std::vector<replay::TokenId>(64, 1)}).wait();
  CHECK(too_long.status == replay::DecodeStatus::prompt_too_long);
  CHECK(too_long.tokens.empty());
  // A token outside the vocabulary is refused before it reaches the device
  // (where it would index out of bounds).
  const auto vocab = static_cast<replay::TokenId>(model.config().vocab_size);
  const replay::DecodeResult outside = engine.submit({.prompt = {1, vocab, 2}}).wait();
  CHECK(outside.status == replay::DecodeStatus::invalid_request);
  CHECK(outside.message.find("outside the vocabulary") != std::string::npos);
  // The first request's callback holds the engine's worker at each of its
  // updates until the test lets it go on, so what the test does in between
  // happens at a known point (no launch runs meanwhile), whatever the GPU's speed.
  replay::DecodeHandle first = engine.submit({.prompt = {1, 2, 3}, .max_new_tokens = 50}, gate.callback());
  gate.wait_entered(1);  // `first` is prefilled, in a slot; the worker waits in its callback
  replay::DecodeStream second = engine.submit({.prompt = {4, 5}, .max_new_tokens = 50});  // waits: the queue is full now
  const replay::DecodeResult extra = engine.submit({.prompt = {9}, .max_new_tokens = 2}).wait();
  CHECK(extra.status == replay::DecodeStatus::queue_full);
  CHECK(extra.tokens.empty());
  // One launch for `first`, then the next iteration admits `second` (its
  // prefill's token comes before that iteration's launch) and runs both.
  gate.allow(2);
  gate.wait_entered(3);
  REQUIRE(second.next().has_value());
  // Both slots are taken: this one waits for a slot.
  replay::DecodeStream waiting = engine.submit({.prompt = {6, 7, 8}, .max_new_tokens = 4});
  first.cancel();
  gate.allow(std::numeric_limits<std::size_t>::max());
  const Gate::Result cancelled = gate.wait_done();
  CHECK(cancelled.status == replay::DecodeStatus::cancelled);
  CHECK(cancelled.tokens.size() == 5);  // the prefill's token and two launches of 2
  const replay::DecodeResult served = waiting.wait();  // in the slot `first` freed
  CHECK(served.status == replay::DecodeStatus::token_limit);
  CHECK(served.tokens.size() == 4);
  const replay::DecodeResult other = second.wait();
  CHECK(other.status == replay::DecodeStatus::token_limit);
  CHECK(other.tokens.size() == 50);
  engine.shutdown(replay::DecodeShutdown::drain);
  CHECK(engine.executor().capture_failures().empty());
}

TEST_CASE("ExecutorOptions::stream_priority: the stream has a higher priority when asked, and the steps the same tokens") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  std::map<llm_decode::StreamPriority, int> priority;
  std::map<llm_decode::StreamPriority, std::vector<std::vector<replay::TokenId>>> tokens;
  for (const llm_decode::StreamPriority asked : {llm_decode::StreamPriority::normal, llm_decode::StreamPriority::high}) {
    KvCache cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    ExecutorOptions o = options(StepMode::graphed, 1);
    o.stream_priority = asked;
    LlamaExecutor executor(model, cache, o);
    REQUIRE(::cudaStreamGetPriority(executor.stream().stream(), &priority[asked]) == ::cudaSuccess);
    const auto first = llm_decode::run_prefill(executor, {0, 1}, {{1, 2, 3}, {4, 5, 6, 7}});
    std::vector<replay::DecodeRow> rows{{.slot = 0, .position = 3, .token = first[0], .max_tokens = 1},
                                        {.slot = 1, .position = 4, .token = first[1], .max_tokens = 1}};
    for (int step = 0; step < 6; ++step) {
      const auto next = llm_decode::run_launch(executor, rows, 2, 16, 1, {});
      tokens[asked].push_back({next[0].at(0), next[1].at(0)});
      for (std::size_t r = 0; r < rows.size(); ++r) {
        rows[r].position += 1;
        rows[r].token = next[r].at(0);
      }
    }
  }
  // CUDA: a lower number is a higher priority.
  CHECK(priority[llm_decode::StreamPriority::high] < priority[llm_decode::StreamPriority::normal]);
  CHECK(tokens[llm_decode::StreamPriority::high] == tokens[llm_decode::StreamPriority::normal]);
}

TEST_CASE("tune_own_products times each way at each count the own products take and changes no setting") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  const llm_decode::ProductSets start{.own = llm_decode::fused::product_rows_of({2, 5, 6}),
                                      .narrow = llm_decode::fused::product_rows_of({6})};
  const llm_decode_test::OwnProductsAt own_in_use(start.own);
  const llm_decode_test::ScopedNarrowProducts narrow_in_use(start.narrow);
  // 9 rows: no product of the model fits the own kernels (GEMVs to 8 rows,
  // skinny GEMMs at multiples of 16), so the ways are one step: not timed.
  const llm_decode::ProductTuningOptions tuning_options{
      .rows = {16, 1, 9, 4, 1}, .context = 32, .steps = 4, .repeats = 3};
  const llm_decode::ProductTuning tuning = llm_decode::tune_own_products(model, tuning_options);
  CHECK(llm_decode::fused::product_sets_in_force() == start);
  CHECK(tuning.start == start);
  std::vector<int> timed;
  std::vector<int> narrow_timed;
  for (const llm_decode::ProductTiming& t : tuning.timings) {
    timed.push_back(t.rows);
    if (t.narrow_seconds.has_value()) narrow_timed.push_back(t.rows);
  }
  CHECK(timed == std::vector<int>{1, 4, 16});
  CHECK(narrow_timed == std::vector<int>{4});  // the narrow products take 2 to 8 rows
  // 2, 5 and 6 rows were not timed: as they were.
  for (const auto& [rows, way] : {std::pair{2, llm_decode::ProductWay::own}, std::pair{5, llm_decode::ProductWay::own},
                                  std::pair{6, llm_decode::ProductWay::narrow}}) {
    CHECK(llm_decode::way_at(tuning.chosen, rows) == way);
  }
  // The start is the calling thread's sets: a scope of its own, where open.
  {
    const llm_decode::fused::ProductSets scoped{.own = llm_decode::fused::product_rows_of({1, 4}),
                                                .narrow = llm_decode::fused::product_rows_of({4})};
    const llm_decode::fused::ThreadProductSets scope(scoped);
    const llm_decode::ProductTuning in_scope =
        llm_decode::tune_own_products(model, {.rows = {4}, .context = 32, .steps = 2, .repeats = 1});
    CHECK(in_scope.start == scoped);
  }
  // Without the narrow products asked for, they are timed only where the start has them.
  const llm_decode::ProductTuning own_only =
      llm_decode::tune_own_products(model, {.rows = {4, 6}, .context = 32, .steps = 2, .repeats = 1, .narrow = false});
  REQUIRE(own_only.timings.size() == 2);
  CHECK_FALSE(own_only.timings[0].narrow_seconds.has_value());
  CHECK(own_only.timings[1].narrow_seconds.has_value());
  CHECK(llm_decode::fused::product_sets_in_force() == start);
  // A model the fused kernels do not take (9 query heads over one key/value
  // head: more than the fused attention takes) is refused before anything
  // is captured or changed.
  llm_decode::LlamaConfig refused = llm_decode::LlamaConfig::preset("tiny");
  refused.hidden_size = 72;
  refused.num_heads = 9;
  refused.num_kv_heads = 1;
  refused.max_len = 64;
  const LlamaModel refused_model = LlamaModel::random(refused, 7, cuda);
  CHECK_THROWS_WITH_AS((void)llm_decode::tune_own_products(refused_model, {.rows = {1}, .context = 32}),
                       doctest::Contains("tune_own_products: kernels = DecodeKernels::fused cannot take this model"),
                       std::invalid_argument);
  CHECK(llm_decode::fused::product_sets_in_force() == start);
}

TEST_CASE("executors with their own product sets, two threads at once: graphed and K-step launches give the eager tokens of the same sets") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  const auto fused = llm_decode::DecodeKernels::fused;
  // The process-wide sets meanwhile: the GEMV up to 8 rows, which neither executor's sets are.
  const llm_decode_test::OwnProductRows process_wide(8);
  const llm_decode::fused::ProductSets before = llm_decode::fused::product_sets_in_force();
  const std::array<llm_decode::fused::ProductSets, 2> sets{
      llm_decode::fused::ProductSets{.own = llm_decode::fused::product_rows_up_to(llm_decode::fused::kMaxSkinnyRows),
                                     .narrow = llm_decode::fused::kNarrowRowCounts},
      llm_decode::fused::ProductSets{.own = {}, .narrow = {}}};  // cuBLAS everywhere
  // References without sets of their own: each made (and its graphs
  // captured) while the process-wide sets were those of one thread, which
  // it keeps, then run while the process-wide sets are the GEMV's again. An
  // executor that ignored its own sets would run the GEMV up to 8 rows and
  // part from its reference (the control below shows that it would).
  std::vector<std::unique_ptr<KvCache>> reference_caches;
  std::vector<std::unique_ptr<LlamaExecutor>> references;
  for (const llm_decode::fused::ProductSets& s : sets) {
    const llm_decode_test::OwnProductsAt own(s.own);
    const llm_decode_test::ScopedNarrowProducts narrow(s.narrow);
    reference_caches.push_back(std::make_unique<KvCache>(model.config(), kBatchBuckets.back(), cuda, model.dtype()));
    references.push_back(
        std::make_unique<LlamaExecutor>(model, *reference_caches.back(), options(StepMode::graphed, 3, true, fused)));
    REQUIRE(references.back()->capture_failures().empty());
  }
  REQUIRE(llm_decode::fused::product_sets_in_force() == before);
  // The caches bit for bit: each product's rounding shows there, where the
  // tokens (argmaxes) rarely show it.
  std::array<std::size_t, 2> launches{};
  std::array<bool, 2> cache_as_reference{};
  const std::vector<std::string> failures =
      replay_test::run_threads_at_once(2, [&](int thread, replay_test::ThreadStart& start) {
        const auto t = static_cast<std::size_t>(thread);
        const c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(false, cuda.index()));
        KvCache eager_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
        KvCache graphed_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
        ExecutorOptions eager_options = options(StepMode::eager, 3, true, fused);
        eager_options.products = sets[t];
        ExecutorOptions graphed_options = options(StepMode::graphed, 3, true, fused);
        graphed_options.products = sets[t];
        graphed_options.capture_threads = 2;  // the capture workers open the executor's sets too
        LlamaExecutor eager(model, eager_cache, eager_options);
        LlamaExecutor graphed(model, graphed_cache, graphed_options);
        if (!graphed.capture_failures().empty()) throw std::runtime_error(graphed.capture_failures().front());
        if (graphed.products() != sets[t] || eager.products() != sets[t]) throw std::runtime_error("sets not kept");
        start.arrive_and_wait();  // the two schedules run at once
        launches[t] = run_random_schedule({references[t].get(), &eager, &graphed}, 3, 500 + t,
                                          model.config().vocab_size, 64, 30);
        cache_as_reference[t] = same_sequence_slots(graphed_cache, *reference_caches[t]);
      });
  for (std::size_t t = 0; t < sets.size(); ++t) {
    INFO("thread " << t);
    CHECK_MESSAGE(failures[t].empty(), failures[t]);
    CHECK(launches[t] > 10);
    CHECK(cache_as_reference[t]);
    // What an executor that ignored its sets would have run: the same
    // schedule under the process-wide sets. Its cache must differ from the
    // reference's, or this case could not tell the two apart.
    KvCache control_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
    LlamaExecutor control(model, control_cache, options(StepMode::graphed, 3, true, fused));
    REQUIRE(control.products() == before);
    (void)run_random_schedule({&control}, 3, 500 + t, model.config().vocab_size, 64, 30);
    CHECK_FALSE(same_sequence_slots(control_cache, *reference_caches[t]));
  }
}

TEST_CASE("an executor's product sets are fixed when it is made: its own, else those in force on the thread that makes it") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  const auto fused = llm_decode::DecodeKernels::fused;
  using llm_decode::fused::ProductSets;
  using llm_decode::fused::product_rows_of;
  const llm_decode_test::OwnProductRows process_wide(2);
  const ProductSets process_wide_sets = llm_decode::fused::product_sets_in_force();
  const ProductSets scoped{.own = product_rows_of({1, 4}), .narrow = product_rows_of({4})};
  const ProductSets own{.own = {}, .narrow = {}};
  REQUIRE(process_wide_sets != scoped);
  REQUIRE(process_wide_sets != own);
  KvCache cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  {
    const llm_decode::fused::ThreadProductSets scope(scoped);
    const LlamaExecutor in_scope(model, cache, options(StepMode::eager, 1, true, fused));
    ExecutorOptions with_own = options(StepMode::eager, 1, true, fused);
    with_own.products = own;
    const LlamaExecutor own_sets(model, cache, with_own);
    // Made on another thread: that thread's sets (the process-wide ones), not this one's scope.
    std::optional<ProductSets> elsewhere;
    const std::vector<std::string> failures = replay_test::run_threads_at_once(1, [&](int, replay_test::ThreadStart&) {
      elsewhere = LlamaExecutor(model, cache, options(StepMode::eager, 1, true, fused)).products();
    });
    CHECK_MESSAGE(failures.front().empty(), failures.front());
    CHECK(in_scope.products() == scoped);
    CHECK(own_sets.products() == own);
    REQUIRE(elsewhere.has_value());
    CHECK(*elsewhere == process_wide_sets);
  }
  // What an executor inherited reaches the thread that runs it and outlives
  // a process-wide change: one made in a scope and one given the same sets,
  // both graphed and capturing their buckets lazily (on the thread that runs
  // them), run from another thread after the process-wide sets changed,
  // must leave the same cache bits; one made under the new process-wide
  // sets must leave others, or this could not tell.
  KvCache inherited_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  KvCache given_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  KvCache control_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  std::unique_ptr<LlamaExecutor> inherited;
  {
    const llm_decode::fused::ThreadProductSets scope(scoped);
    inherited = std::make_unique<LlamaExecutor>(model, inherited_cache, options(StepMode::graphed, 3, false, fused));
  }
  ExecutorOptions given_options = options(StepMode::graphed, 3, false, fused);
  given_options.products = scoped;
  LlamaExecutor given(model, given_cache, given_options);
  KvCache eager_cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  ExecutorOptions eager_options = options(StepMode::eager, 3, false, fused);
  eager_options.products = scoped;
  LlamaExecutor eager(model, eager_cache, eager_options);  // the tokens of both, against eager steps
  const llm_decode_test::OwnProductRows later(8);
  LlamaExecutor control(model, control_cache, options(StepMode::graphed, 3, false, fused));
  REQUIRE(control.products() != scoped);
  const std::vector<std::string> run_failures =
      replay_test::run_threads_at_once(1, [&](int, replay_test::ThreadStart&) {
        const c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool(false, cuda.index()));
        (void)run_random_schedule({&eager, &given, inherited.get()}, 3, 700, model.config().vocab_size, 64, 30);
        (void)run_random_schedule({&control}, 3, 700, model.config().vocab_size, 64, 30);
      });
  CHECK_MESSAGE(run_failures.front().empty(), run_failures.front());
  CHECK(inherited->products() == scoped);
  CHECK(same_sequence_slots(inherited_cache, given_cache));
  CHECK_FALSE(same_sequence_slots(control_cache, given_cache));
  // An engine gives its executor its own sets, else those in force when it is made.
  const llm_decode::EngineOptions engine_options{
      .batch_buckets = {1, 2}, .context_buckets = {32}, .mode = StepMode::eager, .kernels = fused};
  llm_decode::EngineOptions with_sets = engine_options;
  with_sets.products = scoped;
  const llm_decode::DecodeEngine engine(model, with_sets);
  CHECK(engine.executor().products() == scoped);
  const llm_decode::fused::ThreadProductSets scope(own);
  const llm_decode::DecodeEngine in_force(model, engine_options);
  CHECK(in_force.executor().products() == own);
}

TEST_CASE("a launch asking for more steps than the executor was made for is refused") {
  const at::Device cuda(at::kCUDA, 0);
  const LlamaModel model = tiny_model(cuda);
  KvCache cache(model.config(), kBatchBuckets.back(), cuda, model.dtype());
  LlamaExecutor executor(model, cache, options(StepMode::graphed, 2));
  const auto first = llm_decode::run_prefill(executor, {0}, {{1, 2, 3}});
  const std::vector<replay::DecodeRow> rows{{.slot = 0, .position = 3, .token = first[0], .max_tokens = 3}};
  CHECK_THROWS_WITH_AS(llm_decode::run_launch(executor, rows, 1, 16, 3, {}), doctest::Contains("made for 2"),
                       std::invalid_argument);
}
}
