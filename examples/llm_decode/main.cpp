// llm_decode: greedy decoding of a Llama-style model (random weights) from C++,
// with graphed decode steps over a static KV cache, continuous batching and
// several steps per launch. Subcommands:
//   write-weights  random weights from a seed into a directory (config.json, weights.pt)
//   generate       greedy tokens for fixed prompts through the engine; checks graphed == eager
//   bench          ms per step and tokens/s at fixed batch sizes: eager, graphed, graphed K steps per launch
//   load           a Poisson load test: continuous against static batching
//   goodput        the highest offered rate within a TTFT / TPOT p99 SLO, per policy and output mix
// Every subcommand can write its results as JSON (--json). See docs/llm_decode.md.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <replay/decode.hpp>
#include <replay/device.hpp>

#include "engine.hpp"
#include "executor.hpp"
#include "goodput.hpp"
#include "kv_cache.hpp"
#include "launch_plan.hpp"
#include "model.hpp"
#include "product_tuning.hpp"
#include "statistics.hpp"

namespace {

using llm_decode::DecodeEngine;
using llm_decode::ExecutorOptions;
using llm_decode::LlamaExecutor;
using llm_decode::LlamaModel;
using llm_decode::StepMode;
using llm_decode::percentile;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

std::vector<replay::TokenId> random_prompt(std::mt19937_64& rng, std::size_t length, std::int64_t vocab) {
  std::uniform_int_distribution<replay::TokenId> token(1, static_cast<replay::TokenId>(vocab - 1));
  std::vector<replay::TokenId> prompt(length);
  for (auto& t : prompt) t = token(rng);
  return prompt;
}

void write_json(const std::string& path, const Json& json) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << json.dump(2) << '\n';
  if (!out) throw std::runtime_error("cannot write " + path);
}

// --pdl's names for fused::ProgrammaticLaunches.
const std::map<std::string, llm_decode::fused::ProgrammaticLaunches> kPdlModes{
    {"after-own", llm_decode::fused::ProgrammaticLaunches::after_own_kernels},
    {"always", llm_decode::fused::ProgrammaticLaunches::always},
    {"off", llm_decode::fused::ProgrammaticLaunches::off}};

std::string pdl_mode_name(llm_decode::fused::ProgrammaticLaunches mode) {
  const auto named = std::find_if(kPdlModes.begin(), kPdlModes.end(), [&](const auto& m) { return m.second == mode; });
  return named != kPdlModes.end() ? named->first : "unknown";
}

struct Common {
  std::string weights;  // a directory with config.json and weights.pt; empty: random from --preset and --seed
  std::string preset = "small";
  std::uint64_t seed = 1;
  std::int64_t max_len = 1024;
  std::vector<std::int64_t> batch_buckets{1, 2, 4, 8, 16, 32, 64};
  std::vector<std::int64_t> context_buckets{64, 128, 256, 512, 1024};
  std::string kernels = "aten";                // aten | fused (DecodeKernels)
  std::string prefill = "bucketed";            // bucketed | unpadded (PrefillMode)
  std::vector<std::int64_t> prefill_buckets;   // empty: the executor's default
  std::size_t prefill_chunk = 0;               // generate: > 0: chunked prefill of this many prompt tokens per launch
  std::string json;
  // --pdl (--no-pdl: off), a name in kPdlModes: fused::set_programmatic_launches; the library's default unless given.
  std::string programmatic_launches = pdl_mode_name(llm_decode::fused::programmatic_launches());
  std::optional<int> own_product_rows;   // --own-product-rows: 1 to N rows (own_products()); absent: the library's
  std::vector<int> own_products_at;       // --own-products-at: fused::set_own_products_at; given, it replaces the above
  bool tune_own_products = false;         // --tune-own-products: tune_own_products at the batch buckets up to 64
  std::vector<int> narrow_products_at;    // --narrow-products-at: fused::set_narrow_products_at; absent: the library's
  bool fold_norms = false;                // --fold-norms: fused::set_fold_norms
  int narrow_chunks_in_flight = 0;        // --narrow-chunks-in-flight: force_narrow_chunks_in_flight; 0: by width

  // Chunked prefill runs on the fused kernels' bucketed prefill only
  // (LlamaExecutor::prefill_and_decode): refused here rather than in every launch.
  void check_chunked_prefill(const std::string& what) const {
    if (kernels != "fused" || prefill != "bucketed") {
      throw std::invalid_argument(what + " needs --kernels fused and --prefill bucketed (chunked prefill); given " +
                                  "--kernels " + kernels + " --prefill " + prefill);
    }
  }

  // The own products' row counts: --own-products-at, else 1 to
  // --own-product-rows, else the library's default (the process-wide set).
  llm_decode::fused::ProductRowCounts own_products() const {
    if (!own_products_at.empty()) return llm_decode::fused::product_rows_of(own_products_at);
    if (own_product_rows.has_value()) return llm_decode::fused::product_rows_up_to(*own_product_rows);
    return llm_decode::fused::own_products_at();
  }

  llm_decode::DecodeKernels decode_kernels() const {
    return kernels == "fused" ? llm_decode::DecodeKernels::fused : llm_decode::DecodeKernels::aten;
  }
  llm_decode::PrefillMode prefill_mode() const {
    return prefill == "unpadded" ? llm_decode::PrefillMode::unpadded : llm_decode::PrefillMode::bucketed;
  }
};

// The executor options of the program's bucket lists.
ExecutorOptions executor_options(const Common& c, StepMode mode, std::size_t steps = 1, int capture_threads = 1) {
  return ExecutorOptions{.mode = mode,
                         .batch_buckets = c.batch_buckets,
                         .context_buckets = c.context_buckets,
                         .steps_per_launch = steps,
                         .kernels = c.decode_kernels(),
                         .prefill = c.prefill_mode(),
                         .prefill_buckets = c.prefill_buckets,
                         .capture_threads = capture_threads};
}

// The model, and where --tune-own-products chose the own products, what it timed.
struct LoadedModel {
  LlamaModel model;
  std::optional<llm_decode::ProductTuning> product_tuning;
};

// Times the fused step each way (own, cuBLAS, narrow) at the batch buckets up to 64
// (product_tuning.hpp), prints the timings and sets what they chose.
llm_decode::ProductTuning tune_and_set_own_products(const Common& c, const LlamaModel& model) {
  llm_decode::ProductTuningOptions options{.rows = {}, .context = c.context_buckets.front()};
  for (const std::int64_t b : c.batch_buckets) {
    if (b <= llm_decode::fused::kMaxSkinnyRows) options.rows.push_back(b);
  }
  const llm_decode::ProductTuning tuning = llm_decode::tune_own_products(model, options);
  std::printf("llm_decode: own products tuned (decode step, graphed, context %lld, median of %d x %d steps):\n",
              static_cast<long long>(options.context), options.repeats, options.steps);
  const auto format_ms = [](double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f ms", 1e3 * seconds);
    return std::string(text);
  };
  for (const llm_decode::ProductTiming& t : tuning.timings) {
    std::string narrow;
    if (t.narrow_seconds.has_value()) narrow = ", narrow " + format_ms(*t.narrow_seconds);
    std::printf("  %2d rows: own %s, cuBLAS %s%s: %s\n", t.rows, format_ms(t.own_seconds).c_str(),
                format_ms(t.cublas_seconds).c_str(), narrow.c_str(),
                llm_decode::product_way_name(llm_decode::way_at(tuning.chosen, t.rows)));
  }
  std::printf("  own products at row counts %s, narrow at %s (a count changes only for a way %.0f%% faster)\n",
              llm_decode::fused::describe_product_rows(tuning.chosen.own).c_str(),
              llm_decode::fused::describe_product_rows(tuning.chosen.narrow).c_str(), 100 * options.margin);
  llm_decode::set_product_sets(tuning.chosen);
  return tuning;
}

// The narrow products' chunks in flight a warp, in words.
std::string describe_narrow_chunks() {
  const int forced = llm_decode::fused::forced_narrow_chunks_in_flight();
  return forced != 0 ? std::to_string(forced) + " at every width"
                     : std::to_string(llm_decode::fused::narrow_chunks_in_flight(1)) + ", or " +
                           std::to_string(llm_decode::fused::narrow_chunks_in_flight(1 << 20)) + " where wide";
}

// The fused step's settings in force, as a report's JSON records them, and
// what --tune-own-products timed.
Json fused_settings_json(const LoadedModel& loaded) {
  Json out{{"programmatic_launches", pdl_mode_name(llm_decode::fused::programmatic_launches())},
           {"own_products_at", llm_decode::fused::product_row_list(llm_decode::fused::own_products_at())},
           {"narrow_products_at", llm_decode::fused::product_row_list(llm_decode::fused::narrow_products_at())},
           {"fold_norms", llm_decode::fused::fold_norms()},
           {"narrow_chunks_in_flight", describe_narrow_chunks()}};
  if (const auto& tuning = loaded.product_tuning) {
    Json timings = Json::array();
    for (const llm_decode::ProductTiming& t : tuning->timings) {
      Json timing{{"rows", t.rows}, {"own_ms", 1e3 * t.own_seconds}, {"cublas_ms", 1e3 * t.cublas_seconds}};
      if (t.narrow_seconds.has_value()) timing["narrow_ms"] = 1e3 * *t.narrow_seconds;
      timings.push_back(timing);
    }
    out["own_products_tuned"] = {{"timings", timings},
                                 {"from", llm_decode::fused::product_row_list(tuning->start.own)},
                                 {"narrow_from", llm_decode::fused::product_row_list(tuning->start.narrow)},
                                 {"context", tuning->options.context},
                                 {"steps", tuning->options.steps},
                                 {"repeats", tuning->options.repeats},
                                 {"margin", tuning->options.margin}};
  }
  return out;
}

// The model from --weights, or random from --preset and --seed, on the GPU.
LlamaModel make_model(const Common& c) {
  const at::Device device(at::kCUDA, 0);
  if (!c.weights.empty()) return LlamaModel::load(c.weights, device);
  llm_decode::LlamaConfig config = llm_decode::LlamaConfig::preset(c.preset);
  config.max_len = c.max_len;
  return LlamaModel::random(config, c.seed, device);
}

// Applies the fused step's settings, then makes the model and, with
// --tune-own-products, tunes and sets its own products.
LoadedModel load_model(const Common& c) {
  llm_decode::fused::set_programmatic_launches(kPdlModes.at(c.programmatic_launches));
  llm_decode::fused::set_own_products_at(c.own_products());
  if (!c.narrow_products_at.empty()) {
    llm_decode::fused::set_narrow_products_at(llm_decode::fused::product_rows_of(c.narrow_products_at));
  }
  llm_decode::fused::set_fold_norms(c.fold_norms);
  llm_decode::fused::force_narrow_chunks_in_flight(c.narrow_chunks_in_flight);
  LoadedModel loaded{.model = make_model(c)};
  if (c.tune_own_products) loaded.product_tuning = tune_and_set_own_products(c, loaded.model);
  return loaded;
}

// What a report calls the model: the preset of its sizes, which come from
// the weights' config.json when --weights names them.
std::string preset_of(const LlamaModel& model) {
  return std::string(llm_decode::LlamaConfig::preset_of(model.config()));
}

// ---- generate: fixed prompts through the engine, checked against eager ----

int generate(const Common& c, std::size_t prompts, std::size_t new_tokens, std::size_t steps, int threads) {
  if (c.prefill_chunk > 0) c.check_chunked_prefill("--prefill-chunk");
  const LlamaModel model = load_model(c).model;
  std::mt19937_64 rng(c.seed);
  std::vector<std::vector<replay::TokenId>> inputs;
  std::uniform_int_distribution<std::size_t> length(4, 48);
  for (std::size_t i = 0; i < prompts; ++i) inputs.push_back(random_prompt(rng, length(rng), model.config().vocab_size));

  // The graphed engine, its executor's calls recorded.
  llm_decode::KvCache cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
  LlamaExecutor graphed(model, cache,
                        executor_options(c, StepMode::graphed, steps));
  llm_decode::RecordingExecutor<LlamaExecutor> recording(graphed);
  std::vector<replay::DecodeResult> results(prompts);
  {
    replay::DecodeScheduler<llm_decode::RecordingExecutor<LlamaExecutor>&> scheduler(
        recording, {.max_slots = static_cast<std::size_t>(c.batch_buckets.back()),
                    .max_len = static_cast<std::size_t>(c.context_buckets.back()),
                    .batch_buckets = c.batch_buckets,
                    .context_buckets = c.context_buckets,
                    .steps_per_launch = steps,
                    .max_prefill_tokens = c.prefill_chunk,
                    .prefill = c.prefill_chunk > 0 ? replay::DecodePrefill::with_decode
                                                   : replay::DecodePrefill::separate});
    // Requests from several threads at once.
    std::vector<std::thread> submitters;
    for (int t = 0; t < threads; ++t) {
      submitters.emplace_back([&, t] {
        for (std::size_t i = static_cast<std::size_t>(t); i < prompts; i += static_cast<std::size_t>(threads)) {
          results[i] = scheduler.submit({.prompt = inputs[i], .max_new_tokens = new_tokens}).wait();
        }
      });
    }
    for (auto& s : submitters) s.join();
    scheduler.shutdown(replay::DecodeShutdown::drain);
  }
  // The same calls, eagerly, on a fresh cache: the same kernels, so the same tokens bit for bit.
  llm_decode::KvCache eager_cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
  LlamaExecutor eager(model, eager_cache,
                      executor_options(c, StepMode::eager, steps));
  std::string first_difference;
  const std::size_t differing = llm_decode::replay_recording(eager, recording.calls(), {}, &first_difference);
  std::size_t finished = 0;
  // The reference for scripts/llm_decode_compare.py (format replay.llm_decode.reference/1):
  // every request's prompt and tokens, and for the first few the logits of
  // the prefill and of the first decode steps (the model alone, eagerly, the
  // engine's tokens fed back).
  Json out{{"format", "replay.llm_decode.reference/1"}, {"preset", preset_of(model)}, {"steps_per_launch", steps},
           {"requests", Json::array()}};
  constexpr std::size_t with_logits = 8, logit_steps = 2;
  for (std::size_t i = 0; i < prompts; ++i) {
    finished += results[i].ok() && results[i].tokens.size() == new_tokens ? 1 : 0;
    Json request{{"prompt", inputs[i]}, {"tokens", results[i].tokens}};
    if (i < with_logits && results[i].tokens.size() > logit_steps) {
      const c10::InferenceMode inference;
      llm_decode::KvCache scratch(model.config(), 1, model.device(), model.dtype());
      const auto to_device = [&](std::vector<std::int64_t> v) { return at::tensor(v, at::kLong).to(model.device()); };
      const at::Tensor prefill =
          model.prefill(scratch, 0, to_device({inputs[i].begin(), inputs[i].end()})).to(at::kFloat).cpu();
      request["prefill_logits"] = std::vector<float>(prefill.data_ptr<float>(), prefill.data_ptr<float>() + prefill.numel());
      request["decode_logits"] = Json::array();
      for (std::size_t s = 0; s < logit_steps; ++s) {
        const at::Tensor logits =
            model
                .decode(scratch, to_device({0}), to_device({static_cast<std::int64_t>(inputs[i].size() + s)}),
                        to_device({results[i].tokens[s]}), model.config().max_len)[0]
                .to(at::kFloat)
                .cpu();
        request["decode_logits"].push_back(
            std::vector<float>(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel()));
      }
    }
    out["requests"].push_back(std::move(request));
  }
  out["calls"] = recording.calls().size();
  out["calls_differing_from_eager"] = differing;
  out["capture_failures"] = graphed.capture_failures();
  write_json(c.json, out);
  std::size_t mixed = 0;
  for (const auto& call : recording.calls()) mixed += call.kind == decltype(recording)::Call::Kind::mixed ? 1 : 0;
  out["mixed_calls"] = mixed;
  std::printf("llm_decode generate: %zu requests from %d threads, %zu finished with %zu tokens each; %zu executor "
              "calls (%zu mixed: chunked prefill) replayed eagerly: %zu differ%s%s\n",
              prompts, threads, finished, new_tokens, recording.calls().size(), mixed, differing,
              differing != 0 ? ", the first: " : "", first_difference.c_str());
  for (const std::string& failure : graphed.capture_failures()) std::printf("  capture failed: %s\n", failure.c_str());
  return finished == prompts && differing == 0 && graphed.capture_failures().empty() ? 0 : 1;
}

// ---- bench: ms per step at fixed batch sizes ----

struct BenchRow {
  std::string method;
  std::int64_t batch = 0;
  double ms_per_step = 0;
  double tokens_per_s = 0;
  double host_fraction = 0;
};

// Decodes `new_tokens` tokens for `batch` prompts of `prompt_len` tokens,
// `launch_steps` steps per launch; returns seconds per step (decode only).
// Prefills `batch` prompts of `prompt_len` tokens into slots 0..batch-1;
// returns the median seconds of `repeats` prefill calls (after a warm-up).
double time_prefill(LlamaExecutor& executor, std::int64_t batch, std::size_t prompt_len, int repeats,
                    std::mt19937_64& rng, std::int64_t vocab) {
  std::vector<std::size_t> slots(static_cast<std::size_t>(batch));
  std::iota(slots.begin(), slots.end(), std::size_t{0});
  std::vector<std::vector<replay::TokenId>> prompts;
  for (std::int64_t r = 0; r < batch; ++r) prompts.push_back(random_prompt(rng, prompt_len, vocab));
  (void)llm_decode::run_prefill(executor, slots, prompts);
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    (void)llm_decode::run_prefill(executor, slots, prompts);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return percentile(seconds, 0.5);
}

double time_decode(LlamaExecutor& executor, const Common& c, std::int64_t batch, std::size_t prompt_len,
                   std::size_t new_tokens, std::size_t launch_steps, std::mt19937_64& rng, std::int64_t vocab) {
  std::vector<std::size_t> slots(static_cast<std::size_t>(batch));
  std::iota(slots.begin(), slots.end(), std::size_t{0});
  std::vector<std::vector<replay::TokenId>> prompts;
  for (std::int64_t r = 0; r < batch; ++r) prompts.push_back(random_prompt(rng, prompt_len, vocab));
  const std::vector<replay::TokenId> first = llm_decode::run_prefill(executor, slots, prompts);
  std::vector<replay::DecodeRow> rows(static_cast<std::size_t>(batch));
  for (std::size_t r = 0; r < rows.size(); ++r) rows[r] = {.slot = r, .position = prompt_len, .token = first[r]};
  const std::int64_t batch_bucket = llm_decode::smallest_bucket_for(c.batch_buckets, batch);
  executor.reset_stats();
  const auto start = Clock::now();
  std::size_t produced = 1;  // the prefill's
  while (produced < new_tokens) {
    const std::size_t k = std::min(launch_steps, new_tokens - produced);
    for (auto& row : rows) row.max_tokens = k;
    const std::int64_t context =
        llm_decode::smallest_bucket_for(c.context_buckets, static_cast<std::int64_t>(rows[0].position + k));
    const auto tokens = llm_decode::run_launch(executor, rows, batch_bucket, context, k, {});
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (tokens[r].size() != k) throw std::runtime_error("bench: a row got fewer tokens than asked");
      rows[r].position += k;
      rows[r].token = tokens[r].back();
    }
    produced += k;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return seconds / static_cast<double>(new_tokens - 1);
}

// Decode steps while a second executor (its own cache, graph pool and
// stream) prefills one prompt of `beside_tokens` tokens after another on a
// second thread: what a step costs when prompts are prefilled beside the
// running rows instead of between their steps (as the engine does). Returns
// the median seconds per step over `repeats` and the prefills per second.
std::pair<double, double> time_decode_beside_prefill(LlamaExecutor& decoder, LlamaExecutor& prefiller,
                                                     const Common& c, std::int64_t batch, std::size_t prompt_len,
                                                     std::size_t new_tokens, std::size_t beside_tokens, int repeats,
                                                     std::mt19937_64& rng, std::int64_t vocab) {
  const std::vector<std::size_t> slot{0};
  const std::vector<std::vector<replay::TokenId>> prompt{random_prompt(rng, beside_tokens, vocab)};
  (void)llm_decode::run_prefill(prefiller, slot, prompt);  // its bucket's graph, before the timing
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> prefills{0};
  std::exception_ptr failure;
  std::thread beside([&] {
    try {
      while (!stop.load(std::memory_order_relaxed)) {
        (void)llm_decode::run_prefill(prefiller, slot, prompt);
        prefills.fetch_add(1, std::memory_order_relaxed);
      }
    } catch (...) {
      failure = std::current_exception();
    }
  });
  std::vector<double> per_step;
  const auto start = Clock::now();
  try {
    for (int r = 0; r < repeats; ++r) {
      per_step.push_back(time_decode(decoder, c, batch, prompt_len, new_tokens, 1, rng, vocab));
    }
  } catch (...) {
    stop = true;
    beside.join();
    throw;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stop = true;
  beside.join();
  if (failure) std::rethrow_exception(failure);
  return {percentile(per_step, 0.5), static_cast<double>(prefills.load()) / seconds};
}

// Bytes a decode step reads at `rows` rows whose keys number `keys` each
// (the mean over the timed steps), from the config alone: every weight once
// (the embedding's rows only), the keys and values each row attends, and the
// activations (each product's input and output, the norms' residual and
// input rows, the logits).
struct StepBytes {
  double weights = 0;
  double cache = 0;
  double activations = 0;
  double total() const { return weights + cache + activations; }
};

StepBytes step_bytes(const llm_decode::LlamaConfig& config, std::int64_t rows, double keys) {
  const auto hidden = static_cast<double>(config.hidden_size);
  const auto inter = static_cast<double>(config.intermediate_size);
  const auto head_dim = static_cast<double>(config.head_dim());
  const auto q_width = static_cast<double>(config.num_heads) * head_dim;
  const auto kv_width = static_cast<double>(config.num_kv_heads) * head_dim;
  const auto layers = static_cast<double>(config.num_layers);
  const auto vocab = static_cast<double>(config.vocab_size);
  const auto n = static_cast<double>(rows);
  constexpr double half = 2;  // bytes
  StepBytes b;
  const double per_layer = (q_width + 2 * kv_width) * hidden + q_width * hidden + 3 * inter * hidden + 2 * hidden;
  b.weights = half * (layers * per_layer + hidden + vocab * hidden + n * hidden);
  b.cache = half * n * layers * 2 * kv_width * keys;
  const double per_layer_rows = hidden + (q_width + 2 * kv_width) + q_width + hidden + hidden + 2 * inter + 2 * inter +
                                hidden + 2 * 3 * hidden;
  b.activations = half * n * (layers * per_layer_rows + hidden + vocab);
  return b;
}

// The GPU's peak memory bandwidth in bytes per second and where it came
// from: --peak-tbps when given; else the device's memory clock and bus width
// (double data rate); else a table by name (H100 SXM 3.35 TB/s, H200 4.8);
// else unknown (0).
struct PeakBandwidth {
  double bytes_per_s = 0;
  std::string source;
};

PeakBandwidth peak_bandwidth(int device, double option_tbps) {
  if (option_tbps > 0) return {option_tbps * 1e12, "--peak-tbps"};
  int clock_khz = 0;
  int bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess && clock_khz > 0 &&
      bus_bits > 0) {
    return {2.0 * clock_khz * 1e3 * bus_bits / 8.0, "the device's memory clock " + std::to_string(clock_khz / 1000) +
                                                       " MHz x " + std::to_string(bus_bits) + "-bit bus, double data rate"};
  }
  cudaDeviceProp properties{};
  replay::check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  const std::string name = properties.name;
  if (name.find("H200") != std::string::npos) return {4.8e12, "the table by name (" + name + ")"};
  if (name.find("H100") != std::string::npos) return {3.35e12, "the table by name (" + name + ")"};
  return {0, "unknown for " + name + " (give --peak-tbps)"};
}

int bench(const Common& c, const std::vector<std::int64_t>& batches, std::size_t prompt_len, std::size_t new_tokens,
          const std::vector<std::size_t>& multi_steps, int repeats, int capture_threads,
          const std::vector<std::size_t>& beside_prefill, double peak_tbps) {
  const LoadedModel loaded = load_model(c);
  const LlamaModel& model = loaded.model;
  const PeakBandwidth peak = peak_bandwidth(model.device().index(), peak_tbps);
  std::printf("llm_decode bench: HBM peak %.2f TB/s, from %s; fused kernels' programmatic launches %s; own products "
              "at row counts %s (narrow at %s; chunks in flight: %s), cuBLAS elsewhere; norms %s\n",
              peak.bytes_per_s / 1e12, peak.source.c_str(), c.programmatic_launches.c_str(),
              llm_decode::fused::describe_product_rows(llm_decode::fused::own_products_at()).c_str(),
              llm_decode::fused::describe_product_rows(llm_decode::fused::narrow_products_at()).c_str(),
              describe_narrow_chunks().c_str(),
              c.fold_norms ? "folded into the products at one row (--fold-norms)" : "kernels of their own");
  // Refused before any measurement, not after minutes of them.
  for (const std::size_t tokens : beside_prefill) {
    if (tokens == 0 || static_cast<std::int64_t>(tokens) > model.config().max_len) {
      throw std::invalid_argument("--beside-prefill: a prompt of " + std::to_string(tokens) +
                                  " tokens; it must hold 1.." + std::to_string(model.config().max_len));
    }
  }
  std::mt19937_64 rng(c.seed + 7);
  Json out{{"preset", preset_of(model)},
           {"prompt", prompt_len},
           {"new_tokens", new_tokens},
           {"rows", Json::array()},
           {"batch_buckets", c.batch_buckets},
           {"context_buckets", c.context_buckets}};
  out["peak_bytes_per_s"] = peak.bytes_per_s;
  out["peak_source"] = peak.source;
  out.update(fused_settings_json(loaded));
  std::vector<BenchRow> rows;
  struct Method {
    std::string name;
    StepMode mode;
    std::size_t steps;
    llm_decode::DecodeKernels kernels;
  };
  const llm_decode::DecodeKernels kernels = c.decode_kernels();
  std::vector<Method> methods{{"cpp_eager", StepMode::eager, 1, kernels}, {"cpp_graphed", StepMode::graphed, 1, kernels}};
  for (const std::size_t k : multi_steps) {
    methods.push_back({"cpp_graphed_k" + std::to_string(k), StepMode::graphed, k, kernels});
  }
  // The fused kernels' row beside the operators' (a failure there is
  // reported in the JSON and does not stop the other rows).
  if (kernels == llm_decode::DecodeKernels::aten) {
    methods.push_back({"cpp_graphed_fused", StepMode::graphed, 1, llm_decode::DecodeKernels::fused});
  }
  std::vector<std::int64_t> graphed_prefill_buckets;  // the executor's, defaults filled in
  for (const Method& m : methods) {
    try {
      llm_decode::KvCache cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
      ExecutorOptions method_options = executor_options(c, m.mode, m.steps);
      method_options.kernels = m.kernels;
      LlamaExecutor executor(model, cache, method_options);
      if (m.mode == StepMode::graphed) {
        graphed_prefill_buckets = executor.prefill_buckets();
        const auto& s = executor.stats();
        out["capture"][m.name] = {{"graphs", s.graphs},
                                  {"seconds_serial", s.capture_seconds},
                                  {"pool_bytes", s.graph_pool_bytes},
                                  {"failures", executor.capture_failures()}};
        std::printf("llm_decode bench: %s: %zu graphs captured in %.2f s, pool %.1f MiB%s\n", m.name.c_str(), s.graphs,
                    s.capture_seconds, static_cast<double>(s.graph_pool_bytes) / (1 << 20),
                    executor.capture_failures().empty() ? "" : " (SOME CAPTURES FAILED)");
      }
      for (const std::int64_t batch : batches) {
        (void)time_decode(executor, c, batch, prompt_len, std::min<std::size_t>(new_tokens, 16), m.steps, rng,
                          model.config().vocab_size);  // warm-up
        std::vector<double> per_step;
        double host = 0;
        double launch = 0;
        for (int r = 0; r < repeats; ++r) {
          per_step.push_back(
              time_decode(executor, c, batch, prompt_len, new_tokens, m.steps, rng, model.config().vocab_size));
          host += executor.stats().host_seconds;
          launch += executor.stats().launch_seconds;
        }
        BenchRow row{.method = m.name,
                     .batch = batch,
                     .ms_per_step = percentile(per_step, 0.5) * 1e3,
                     .tokens_per_s = static_cast<double>(batch) / percentile(per_step, 0.5),
                     .host_fraction = launch > 0 ? host / launch : 0};
        // The timed steps attend prompt_len + 1 .. prompt_len + new_tokens - 1 keys.
        const StepBytes bytes =
            step_bytes(model.config(), batch, static_cast<double>(prompt_len) + static_cast<double>(new_tokens) / 2);
        const double bytes_per_s = bytes.total() / (row.ms_per_step / 1e3);
        const double peak_share = peak.bytes_per_s > 0 ? bytes_per_s / peak.bytes_per_s : 0;
        std::printf("llm_decode bench: %-18s batch %3lld: %8.3f ms/step %10.0f tokens/s  host %.1f%% of a launch  "
                    "%.3f GB read, %.2f TB/s, %.1f%% of peak\n",
                    row.method.c_str(), static_cast<long long>(batch), row.ms_per_step, row.tokens_per_s,
                    100 * row.host_fraction, bytes.total() / 1e9, bytes_per_s / 1e12, 100 * peak_share);
        out["rows"].push_back({{"method", row.method},
                               {"batch", row.batch},
                               {"ms_per_step", row.ms_per_step},
                               {"tokens_per_s", row.tokens_per_s},
                               {"host_fraction", row.host_fraction},
                               {"bytes_per_step", bytes.total()},
                               {"weight_bytes", bytes.weights},
                               {"cache_bytes", bytes.cache},
                               {"activation_bytes", bytes.activations},
                               {"bytes_per_s", bytes_per_s},
                               {"peak_share", peak_share}});
        if (m.steps == 1 && m.kernels == kernels) {  // the prefill is the same in the fused row
          const double prefill_ms =
              1e3 * time_prefill(executor, batch, prompt_len, std::max(repeats, 5), rng, model.config().vocab_size);
          std::printf("llm_decode bench: %-18s prefill of %3lld prompts of %zu tokens: %8.3f ms\n", m.name.c_str(),
                      static_cast<long long>(batch), prompt_len, prefill_ms);
          out["prefill_rows"].push_back({{"method", m.name}, {"prompts", batch}, {"prompt", prompt_len},
                                         {"prefill", c.prefill}, {"ms", prefill_ms}});
        }
      }
    } catch (const std::exception& e) {
      if (m.kernels != llm_decode::DecodeKernels::fused || kernels == llm_decode::DecodeKernels::fused) throw;
      std::printf("llm_decode bench: %s FAILED: %s\n", m.name.c_str(), e.what());
      out["failures"][m.name] = e.what();
    }
  }
  // Decode steps alone, then with prefill beside them (graphed, one step per launch).
  for (const std::size_t tokens : beside_prefill) {
    llm_decode::KvCache decoder_cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
    llm_decode::KvCache prefiller_cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
    // The decoder's stream at normal priority (as the prefiller's), then at high.
    for (const llm_decode::StreamPriority priority :
         {llm_decode::StreamPriority::normal, llm_decode::StreamPriority::high}) {
      const char* priority_name = priority == llm_decode::StreamPriority::high ? "high" : "normal";
      ExecutorOptions decoder_options = executor_options(c, StepMode::graphed, 1);
      decoder_options.stream_priority = priority;
      LlamaExecutor decoder(model, decoder_cache, decoder_options);
      LlamaExecutor prefiller(model, prefiller_cache, executor_options(c, StepMode::graphed, 1));
      const std::int64_t vocab = model.config().vocab_size;
      const double prefill_alone = time_prefill(prefiller, 1, tokens, std::max(repeats, 5), rng, vocab);
      for (const std::int64_t batch : batches) {
        (void)time_decode(decoder, c, batch, prompt_len, std::min<std::size_t>(new_tokens, 16), 1, rng, vocab);
        std::vector<double> alone;
        for (int r = 0; r < repeats; ++r) {
          alone.push_back(time_decode(decoder, c, batch, prompt_len, new_tokens, 1, rng, vocab));
        }
        const auto [beside, prefills_per_s] = time_decode_beside_prefill(decoder, prefiller, c, batch, prompt_len,
                                                                         new_tokens, tokens, repeats, rng, vocab);
        const double alone_s = percentile(alone, 0.5);
        std::printf("llm_decode bench: beside prefill, batch %3lld, decode stream priority %s: %.3f ms/step alone, "
                    "%.3f ms/step while a second executor prefills %zu-token prompts (%.0f per s, %.3f ms each "
                    "alone)\n",
                    static_cast<long long>(batch), priority_name, alone_s * 1e3, beside * 1e3, tokens,
                    prefills_per_s, prefill_alone * 1e3);
        out["beside_prefill"].push_back({{"batch", batch},
                                         {"decode_stream_priority", priority_name},
                                         {"prompt_tokens", tokens},
                                         {"ms_per_step_alone", alone_s * 1e3},
                                         {"ms_per_step_beside", beside * 1e3},
                                         {"prefills_per_s", prefills_per_s},
                                         {"prefill_ms_alone", prefill_alone * 1e3}});
      }
    }
  }
  // Graph memory: all buckets against the largest bucket alone (both captured
  // into a pool of their own, largest first).
  {
    const std::int64_t largest_prefill_bucket = graphed_prefill_buckets.empty() ? 1 : graphed_prefill_buckets.back();
    llm_decode::KvCache cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
    // The largest decode bucket and the largest prefill bucket.
    LlamaExecutor largest(model, cache,
                          ExecutorOptions{.mode = StepMode::graphed,
                                          .batch_buckets = {c.batch_buckets.back()},
                                          .context_buckets = {c.context_buckets.back()},
                                          .prefill = c.prefill_mode(),
                                          .prefill_buckets = {largest_prefill_bucket}});
    const auto all = out["capture"]["cpp_graphed"]["pool_bytes"].get<std::size_t>();
    const std::size_t alone = largest.stats().graph_pool_bytes;
    out["memory"] = {{"all_buckets_bytes", all},
                     {"largest_bucket_bytes", alone},
                     {"ratio", alone > 0 ? static_cast<double>(all) / static_cast<double>(alone) : 0.0}};
    std::printf("llm_decode bench: graph memory, all %zu buckets / the largest alone: %.1f / %.1f MiB = %.3f\n",
                c.batch_buckets.size() * c.context_buckets.size(), static_cast<double>(all) / (1 << 20),
                static_cast<double>(alone) / (1 << 20), alone > 0 ? static_cast<double>(all) / static_cast<double>(alone) : 0.0);
  }
  // Start-up capture on several threads (captures of one pool take turns).
  if (capture_threads > 1) {
    llm_decode::KvCache cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
    LlamaExecutor threaded(model, cache,
                           executor_options(c, StepMode::graphed, 1, capture_threads));
    out["capture"]["threads"] = {{"threads", capture_threads}, {"seconds", threaded.stats().capture_seconds}};
    std::printf("llm_decode bench: capture of all buckets on %d threads: %.2f s\n", capture_threads,
                threaded.stats().capture_seconds);
  }
  write_json(c.json, out);
  return 0;
}

// ---- load: Poisson arrivals, continuous against static batching ----

// How many tokens each request asks for: uniform in [min, max], or min plus
// an exponential tail of mean (mean - min), redrawn above max (a chat-like
// mix of many short answers and a few long ones).
struct OutputLengths {
  std::string shape = "uniform";  // uniform | exponential
  std::size_t min = 16, max = 192, mean = 96;

  std::size_t draw(std::mt19937_64& rng) const {
    if (shape == "uniform") return std::uniform_int_distribution<std::size_t>(min, max)(rng);
    std::exponential_distribution<double> tail(1.0 / static_cast<double>(mean - min));
    for (;;) {
      const auto n = min + static_cast<std::size_t>(tail(rng));
      if (n <= max) return n;
    }
  }
  // The probabilities of each length that draw() gives.
  llm_decode::goodput::LengthPmf pmf() const {
    return shape == "uniform" ? llm_decode::goodput::uniform_lengths(min, max)
                              : llm_decode::goodput::exponential_lengths(min, max, mean);
  }
  std::string describe() const {
    return shape == "uniform" ? "uniform " + std::to_string(min) + ".." + std::to_string(max)
                              : "exponential, mean " + std::to_string(mean) + ", " + std::to_string(min) + ".." +
                                    std::to_string(max);
  }
};

// A batching policy of the load test.
struct LoadPolicy {
  std::string name;  // continuous | grouped | chunked | chunked-grouped | static
  replay::DecodeBatching batching = replay::DecodeBatching::continuous;
  std::size_t min_admission = 1;
  replay::DecodePrefill prefill = replay::DecodePrefill::separate;
  std::size_t max_prefill_tokens = 0;
};

struct LoadResult {
  double offered_rps = 0;
  double throughput_tokens_per_s = 0;
  double completed_rps = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, tpot_p50_ms = 0, tpot_p99_ms = 0;
  std::size_t requests = 0, finished = 0, refused = 0, tokens = 0;
};

// One point: `requests` requests at Poisson arrivals of `rate` per second
// into a running engine, until every one ended.
LoadResult run_load(DecodeEngine& engine, const LlamaModel& model, double rate, std::size_t requests,
                    const OutputLengths& lengths, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::uniform_int_distribution<std::size_t> prompt_len(8, 64);
  struct Timing {
    Clock::time_point submitted, first, last;
    std::size_t tokens = 0;
    bool ok = false;
    bool refused = false;
  };
  std::vector<Timing> timings(requests);
  std::vector<replay::DecodeRequest> load;
  std::vector<double> arrivals;
  double t = 0;
  for (std::size_t i = 0; i < requests; ++i) {
    load.push_back({.prompt = random_prompt(rng, prompt_len(rng), model.config().vocab_size),
                    .max_new_tokens = lengths.draw(rng)});
    t += gap(rng);
    arrivals.push_back(t);
  }
  std::mutex ended_mutex;
  std::condition_variable ended_changed;
  std::size_t ended = 0;
  Clock::time_point last_end;
  const auto start = Clock::now();
  std::vector<replay::DecodeHandle> handles;
  for (std::size_t i = 0; i < requests; ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    timings[i].submitted = Clock::now();
    handles.push_back(engine.submit(std::move(load[i]), [&, i](const replay::DecodeUpdate& u) {
      const auto now = Clock::now();
      Timing& timing = timings[i];
      if (!u.tokens.empty()) {
        if (timing.tokens == 0) timing.first = now;
        timing.last = now;
        timing.tokens += u.tokens.size();
      }
      if (u.done()) {
        timing.ok = replay::is_finished(u.status);
        timing.refused = replay::is_refusal(u.status);
        const std::lock_guard lock(ended_mutex);
        ++ended;
        last_end = now;
        ended_changed.notify_all();
      }
    }));
  }
  {
    std::unique_lock lock(ended_mutex);
    ended_changed.wait(lock, [&] { return ended == requests; });
  }
  LoadResult r;
  r.offered_rps = rate;
  r.requests = requests;
  std::vector<double> ttft, tpot;
  for (const Timing& timing : timings) {
    r.refused += timing.refused ? 1 : 0;
    if (!timing.ok) continue;
    ++r.finished;
    r.tokens += timing.tokens;
    ttft.push_back(std::chrono::duration<double, std::milli>(timing.first - timing.submitted).count());
    if (timing.tokens > 1) {
      tpot.push_back(std::chrono::duration<double, std::milli>(timing.last - timing.first).count() /
                     static_cast<double>(timing.tokens - 1));
    }
  }
  const double seconds = std::chrono::duration<double>(last_end - start).count();
  r.throughput_tokens_per_s = static_cast<double>(r.tokens) / seconds;
  r.completed_rps = static_cast<double>(r.finished) / seconds;
  r.ttft_p50_ms = percentile(ttft, 0.5);
  r.ttft_p99_ms = percentile(ttft, 0.99);
  r.tpot_p50_ms = percentile(tpot, 0.5);
  r.tpot_p99_ms = percentile(tpot, 0.99);
  return r;
}

struct LoadSettings {
  std::vector<double> rates;
  std::size_t requests = 256;  // per point, at least
  double seconds = 0;          // > 0: per point also at least rate x seconds requests
  std::size_t steps = 1;
  std::vector<std::string> policies{"continuous", "grouped", "chunked", "static"};
  std::size_t min_admission = 8;
  std::size_t chunk_tokens = 64;  // chunked: prompt tokens per mixed launch
  // chunked-grouped: prompt tokens per mixed launch, at most the largest
  // prefill bucket less the largest batch bucket (512 - 64 by default).
  std::size_t grouped_chunk_tokens = 448;
  std::int64_t admission_delay_us = 20000;
  OutputLengths lengths;
};

// A point of the load test as a JSON row (`load` and `goodput`).
Json load_row(const std::string& batching, const LoadResult& r) {
  return {{"batching", batching},
          {"offered_rps", r.offered_rps},
          {"completed_rps", r.completed_rps},
          {"tokens_per_s", r.throughput_tokens_per_s},
          {"ttft_p50_ms", r.ttft_p50_ms},
          {"ttft_p99_ms", r.ttft_p99_ms},
          {"tpot_p50_ms", r.tpot_p50_ms},
          {"tpot_p99_ms", r.tpot_p99_ms},
          {"finished", r.finished},
          {"refused", r.refused},
          {"requests", r.requests}};
}

// Chunked policies need the fused kernels: refused before the model loads.
void check_load_policies(const Common& c, const std::vector<std::string>& policies) {
  for (const char* chunked : {"chunked", "chunked-grouped"}) {
    if (std::find(policies.begin(), policies.end(), chunked) != policies.end()) {
      c.check_chunked_prefill(std::string("--policies ") + chunked);
    }
  }
}

// A policy of the load test by its name (--policies).
LoadPolicy load_policy(const std::string& name, const LoadSettings& settings) {
  LoadPolicy policy{.name = name};
  if (name == "static") {
    policy.batching = replay::DecodeBatching::static_batches;
  } else if (name == "grouped") {
    policy.min_admission = settings.min_admission;
  } else if (name == "chunked") {
    policy.prefill = replay::DecodePrefill::with_decode;
    policy.max_prefill_tokens = settings.chunk_tokens;
  } else if (name == "chunked-grouped") {
    // Fewer, larger mixed launches: the running rows meet fewer of them,
    // and the grouped prompts wait for each other.
    policy.prefill = replay::DecodePrefill::with_decode;
    policy.max_prefill_tokens = settings.grouped_chunk_tokens;
    policy.min_admission = settings.min_admission;
  } else if (name != "continuous") {
    throw std::invalid_argument("--policies: '" + name +
                                "' is none of continuous, grouped, chunked, chunked-grouped, static");
  }
  return policy;
}

// One engine per policy (its graphs captured once), every rate through it;
// its queue holds `queue_capacity` requests.
std::unique_ptr<DecodeEngine> load_engine(const LlamaModel& model, const Common& c, const LoadSettings& settings,
                                          const LoadPolicy& policy, std::size_t queue_capacity) {
  return std::make_unique<DecodeEngine>(
      model, llm_decode::EngineOptions{.batch_buckets = c.batch_buckets,
                                       .context_buckets = c.context_buckets,
                                       .steps_per_launch = settings.steps,
                                       .queue_capacity = queue_capacity,
                                       .max_prefill_tokens = policy.max_prefill_tokens,
                                       .min_admission = policy.min_admission,
                                       .admission_delay = std::chrono::microseconds(settings.admission_delay_us),
                                       .kernels = c.decode_kernels(),
                                       .prefill = c.prefill_mode(),
                                       .prefill_buckets = c.prefill_buckets,
                                       .batching = policy.batching,
                                       .static_batch_delay = std::chrono::microseconds(20000),
                                       .decode_prefill = policy.prefill});
}

int load(const Common& c, const LoadSettings& settings) {
  check_load_policies(c, settings.policies);
  const LoadedModel loaded = load_model(c);
  const LlamaModel& model = loaded.model;
  Json out{{"preset", preset_of(model)},
           {"requests", settings.requests},
           {"seconds", settings.seconds},
           {"rows", Json::array()},
           {"prompt_tokens", "uniform 8..64"},
           {"new_tokens", settings.lengths.describe()},
           {"prefill", c.prefill},
           {"min_admission", settings.min_admission},
           {"chunk_tokens", settings.chunk_tokens},
           {"grouped_chunk_tokens", settings.grouped_chunk_tokens},
           {"admission_delay_us", settings.admission_delay_us}};
  if (c.kernels == "fused") out.update(fused_settings_json(loaded));
  bool all_finished = true;
  // The queue holds every request of a point: an overloaded point shows in
  // the waiting times, not in refusals that would change what is served.
  std::size_t most_requests = settings.requests;
  for (const double rate : settings.rates) {
    most_requests = std::max(most_requests, static_cast<std::size_t>(rate * std::max(settings.seconds, 0.0)));
  }
  for (const std::string& name : settings.policies) {
    const LoadPolicy policy = load_policy(name, settings);
    const std::unique_ptr<DecodeEngine> engine_owner = load_engine(model, c, settings, policy, most_requests);
    DecodeEngine& engine = *engine_owner;
    for (const double rate : settings.rates) {
      // Enough requests that the run is mostly steady state, not the ramp
      // and the drain of a few batches.
      const std::size_t requests =
          std::max(settings.requests, static_cast<std::size_t>(rate * std::max(settings.seconds, 0.0)));
      const LoadResult r = run_load(engine, model, rate, requests, settings.lengths, c.seed + 11);
      all_finished &= r.finished == r.requests;
      std::printf("llm_decode load: %-10s offered %7.1f req/s: %6.1f req/s done, %9.0f tokens/s; TTFT p50 %8.1f p99 "
                  "%8.1f ms; TPOT p50 %6.2f p99 %6.2f ms; %zu/%zu finished, %zu refused\n",
                  policy.name.c_str(), rate, r.completed_rps, r.throughput_tokens_per_s, r.ttft_p50_ms, r.ttft_p99_ms,
                  r.tpot_p50_ms, r.tpot_p99_ms, r.finished, r.requests, r.refused);
      std::fflush(stdout);
      out["rows"].push_back(load_row(policy.name, r));
    }
    engine.shutdown(replay::DecodeShutdown::drain);
    const auto& stats = engine.executor().stats();
    // What the decode launches cost, over every rate of this policy: the
    // rows and context they carried, and their wall time (read-back included).
    const replay::DecodeStats scheduled = engine.stats();
    double context_sum = 0;
    for (std::size_t b = 0; b < scheduled.batch_buckets.size(); ++b) {
      for (std::size_t k = 0; k < scheduled.context_buckets.size(); ++k) {
        context_sum += static_cast<double>(scheduled.bucket_launches[b * scheduled.context_buckets.size() + k]) *
                       static_cast<double>(scheduled.context_buckets[k]);
      }
    }
    const double launches = static_cast<double>(std::max<std::uint64_t>(scheduled.launches, 1));
    out["launch_stats"][policy.name] = {{"decode_launches", scheduled.launches},
                                        {"mean_rows", scheduled.mean_batch_rows()},
                                        {"mean_padded_rows", static_cast<double>(scheduled.padded_rows) / launches},
                                        {"mean_context_bucket", context_sum / launches},
                                        {"ms_per_decode_launch", 1e3 * stats.launch_seconds / launches},
                                        {"mixed_launches", scheduled.mixed_launches},
                                        {"mixed_rows", scheduled.mixed_rows}};
    std::printf("llm_decode load: %-10s %llu decode launches: %.1f rows (padded %.1f), context bucket %.0f, %.3f ms "
                "each on average\n",
                policy.name.c_str(), static_cast<unsigned long long>(scheduled.launches), scheduled.mean_batch_rows(),
                static_cast<double>(scheduled.padded_rows) / launches, context_sum / launches,
                1e3 * stats.launch_seconds / launches);
    out["prefill_stats"][policy.name] = {{"prompts", stats.prefills},
                                         {"forwards", stats.prefill_forwards},
                                         {"seconds", stats.prefill_seconds},
                                         {"mixed_launches", stats.mixed_launches},
                                         {"mixed_seconds", stats.mixed_seconds}};
    if (policy.prefill == replay::DecodePrefill::with_decode) {
      std::printf("llm_decode load: %-10s %llu mixed launches (prompt chunks with a decode step), %.3f ms each\n",
                  policy.name.c_str(), static_cast<unsigned long long>(stats.mixed_launches),
                  stats.mixed_launches > 0 ? 1e3 * stats.mixed_seconds / static_cast<double>(stats.mixed_launches)
                                           : 0.0);
    } else {
      std::printf("llm_decode load: %-10s %llu prompts prefilled in %llu forwards, %.3f ms per forward\n",
                  policy.name.c_str(), static_cast<unsigned long long>(stats.prefills),
                  static_cast<unsigned long long>(stats.prefill_forwards),
                  stats.prefill_forwards > 0 ? 1e3 * stats.prefill_seconds / static_cast<double>(stats.prefill_forwards)
                                             : 0.0);
    }
  }
  write_json(c.json, out);
  return all_finished ? 0 : 1;
}


// ---- goodput: the highest offered rate within a latency SLO ----

struct GoodputSettings {
  LoadSettings load{.requests = 1000, .policies = {"continuous", "chunked", "chunked-grouped", "static"}};
  std::vector<std::string> mixes{"exponential", "uniform"};
  llm_decode::goodput::SearchOptions search{};
  double ttft_p99_ms = 100;
  double tpot_factor = 2;  // TPOT p99 limit: this times the batch-1 decode step
  double target = 2;       // continuous (best policy) / static goodput
  int repeats = 3;
  double budget_s = 0;  // > 0: no point starts whose arrivals would end past it
};

// The load test's two output-length mixes (docs/llm_decode.md).
OutputLengths mix_lengths(const std::string& mix) {
  if (mix == "exponential") return {.shape = "exponential", .min = 8, .max = 768, .mean = 128};
  return {.shape = "uniform", .min = 16, .max = 192, .mean = 96};
}

// The batch-1 decode step as `bench` times it (graphed, one step per launch,
// a 32-token prompt, 128 new tokens, median of 5), and the host's share of a
// launch in it.
std::pair<double, double> batch1_step(const LlamaModel& model, const Common& c) {
  llm_decode::KvCache cache(model.config(), c.batch_buckets.back(), model.device(), model.dtype());
  LlamaExecutor executor(model, cache, executor_options(c, StepMode::graphed, 1));
  std::mt19937_64 rng(c.seed + 7);
  const std::int64_t vocab = model.config().vocab_size;
  (void)time_decode(executor, c, 1, 32, 16, 1, rng, vocab);  // warm-up
  std::vector<double> per_step;
  double host = 0, launch = 0;
  for (int r = 0; r < 5; ++r) {
    per_step.push_back(time_decode(executor, c, 1, 32, 128, 1, rng, vocab));
    host += executor.stats().host_seconds;
    launch += executor.stats().launch_seconds;
  }
  return {1e3 * percentile(per_step, 0.5), launch > 0 ? host / launch : 0.0};
}

std::string describe(const llm_decode::goodput::Goodput& g) {
  char text[96];
  using llm_decode::goodput::Bound;
  if (g.bound == Bound::none) return "not measured";
  std::snprintf(text, sizeof text, g.bound == Bound::below ? "below %.0f req/s (no rate passed)"
                                   : g.bound == Bound::at_least ? "at least %.0f req/s"
                                                                : "%.0f req/s",
                g.rate);
  return text;
}

std::string describe(const llm_decode::goodput::Ratio& r) {
  using Kind = llm_decode::goodput::Ratio::Kind;
  if (r.kind == Kind::unknown) return "unknown";
  char text[48];
  std::snprintf(text, sizeof text, "%s%.2fx", r.kind == Kind::at_least ? ">= " : r.kind == Kind::at_most ? "<= " : "",
                r.value);
  return text;
}

int goodput(const Common& c, const GoodputSettings& settings) {
  namespace gp = llm_decode::goodput;
  check_load_policies(c, settings.load.policies);
  gp::check(settings.search);
  const auto& policies = settings.load.policies;
  if (std::find(policies.begin(), policies.end(), "static") == policies.end() || policies.size() < 2) {
    throw std::invalid_argument("--policies: goodput compares static batching with continuous policies: name "
                                "static and at least one other");
  }
  const auto run_start = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - run_start).count(); };
  const LoadedModel loaded = load_model(c);
  const LlamaModel& model = loaded.model;
  const auto [step_ms, host_fraction] = batch1_step(model, c);
  const gp::Slo slo = gp::slo_from_step(step_ms, settings.ttft_p99_ms, settings.tpot_factor);
  std::printf("llm_decode goodput: batch-1 decode step %.3f ms (graphed, %s kernels; host %.1f%% of a launch): SLO "
              "TTFT p99 <= %.0f ms, TPOT p99 <= %.3f ms (%gx the step)\n",
              step_ms, c.kernels.c_str(), 100 * host_fraction, slo.ttft_p99_ms, slo.tpot_p99_ms,
              settings.tpot_factor);
  std::fflush(stdout);
  const std::size_t most_requests =
      std::max(settings.load.requests,
               static_cast<std::size_t>(settings.search.max_rate * std::max(settings.load.seconds, 0.0)));
  std::vector<std::unique_ptr<DecodeEngine>> engines;
  for (const std::string& name : policies) {
    engines.push_back(load_engine(model, c, settings.load, load_policy(name, settings.load), most_requests));
  }
  std::printf("llm_decode goodput: %zu engines captured, %.1f s since the start\n", engines.size(), elapsed());
  const gp::SearchOptions& so = settings.search;
  Json out{{"format", "replay.llm_decode.goodput/1"},
           {"preset", preset_of(model)},
           {"kernels", c.kernels},
           {"prefill", c.prefill},
           {"batch1_step_ms", step_ms},
           {"batch1_host_fraction", host_fraction},
           {"slo", {{"ttft_p99_ms", slo.ttft_p99_ms}, {"tpot_p99_ms", slo.tpot_p99_ms}, {"tpot_factor", settings.tpot_factor}}},
           {"search", {{"start_rate", so.start_rate}, {"min_rate", so.min_rate}, {"max_rate", so.max_rate},
                       {"growth", so.growth}, {"resolution", so.resolution}, {"max_points", so.max_points}}},
           {"requests", settings.load.requests},
           {"seconds", settings.load.seconds},
           {"repeats", settings.repeats},
           {"policies", policies},
           {"prompt_tokens", "uniform 8..64"},
           {"min_admission", settings.load.min_admission},
           {"chunk_tokens", settings.load.chunk_tokens},
           {"grouped_chunk_tokens", settings.load.grouped_chunk_tokens},
           {"admission_delay_us", settings.load.admission_delay_us},
           {"target", settings.target},
           {"rows", Json::array()},
           {"searches", Json::array()},
           {"ratios", Json::array()}};
  if (c.kernels == "fused") out.update(fused_settings_json(loaded));
  // What the mix alone allows (goodput.hpp's batching_bound): every policy
  // has the engine's rows, its largest batch bucket.
  const auto rows = static_cast<std::size_t>(c.batch_buckets.back());
  for (const std::string& mix : settings.mixes) {
    const OutputLengths lengths = mix_lengths(mix);
    out["mixes"][mix] = lengths.describe();
    const gp::BatchingBound b = gp::batching_bound(lengths.pmf(), rows);
    std::printf("llm_decode goodput: %-11s outputs, %zu rows: a static batch holds its rows for its longest output, "
                "%.1f tokens on average (%.0f ms at the batch-1 step), where continuous batching refills a row after "
                "%.1f: continuous / static near %.2fx at saturation, from the mix alone\n",
                mix.c_str(), rows, b.mean_longest, b.mean_longest * step_ms, b.mean_length, b.ratio);
    out["bounds"][mix] = {{"rows", rows},
                          {"mean_length", b.mean_length},
                          {"mean_longest", b.mean_longest},
                          {"ratio", b.ratio}};
  }
  std::fflush(stdout);
  bool complete = true;
  // Goodputs and ratios by mix and policy ("best" for the best continuous one), over the repeats.
  std::map<std::string, std::map<std::string, std::vector<gp::Goodput>>> found;
  std::map<std::string, std::vector<gp::Ratio>> ratios;
  for (int repeat = 0; repeat < settings.repeats && complete; ++repeat) {
    for (const std::string& mix : settings.mixes) {
      const OutputLengths lengths = mix_lengths(mix);
      std::vector<gp::Goodput> continuous;
      std::vector<std::string> continuous_names;
      gp::Goodput static_goodput;
      for (std::size_t p = 0; p < policies.size(); ++p) {
        gp::RateSearch search(so);
        while (const std::optional<double> rate = search.next()) {
          const std::size_t requests =
              std::max(settings.load.requests, static_cast<std::size_t>(*rate * std::max(settings.load.seconds, 0.0)));
          if (!gp::fits_budget(elapsed(), settings.budget_s, requests, *rate)) {
            complete = false;
            break;
          }
          const auto point_start = Clock::now();
          // The same requests for every policy at a rate; other ones in each repeat.
          const LoadResult r = run_load(*engines[p], model, *rate, requests, lengths,
                                        c.seed + 11 + 1009 * static_cast<std::uint64_t>(repeat));
          const double point_s = std::chrono::duration<double>(Clock::now() - point_start).count();
          const bool passed = gp::meets(slo, {.ttft_p99_ms = r.ttft_p99_ms,
                                              .tpot_p99_ms = r.tpot_p99_ms,
                                              .requests = r.requests,
                                              .finished = r.finished});
          search.record(passed);
          std::printf("llm_decode goodput: repeat %d %-11s %-15s offered %7.1f req/s, %zu requests: TTFT p99 %8.1f "
                      "ms, TPOT p99 %6.3f ms, %zu/%zu finished: %s (%.1f s)\n",
                      repeat + 1, mix.c_str(), policies[p].c_str(), *rate, requests, r.ttft_p99_ms, r.tpot_p99_ms,
                      r.finished, r.requests, passed ? "pass" : "FAIL", point_s);
          std::fflush(stdout);
          Json row = load_row(policies[p], r);
          row["repeat"] = repeat + 1;
          row["mix"] = mix;
          row["passed"] = passed;
          row["seconds"] = point_s;
          out["rows"].push_back(std::move(row));
        }
        const gp::Goodput g = search.goodput();
        const std::optional<double> failing = search.lowest_failing();
        std::printf("llm_decode goodput: repeat %d %-11s %-15s goodput %s%s, %zu points%s\n", repeat + 1, mix.c_str(),
                    policies[p].c_str(), describe(g).c_str(),
                    failing && g.bound == gp::Bound::measured
                        ? (" (" + std::to_string(static_cast<long>(*failing)) + " failed)").c_str()
                        : "",
                    search.points().size(), complete ? "" : " (the budget ended the search)");
        Json points = Json::array();
        for (const gp::Point& point : search.points()) points.push_back({{"rate", point.rate}, {"passed", point.passed}});
        out["searches"].push_back({{"repeat", repeat + 1},
                                   {"mix", mix},
                                   {"batching", policies[p]},
                                   {"goodput_rps", g.rate},
                                   {"bound", gp::to_string(g.bound)},
                                   {"lowest_failing_rps", failing ? Json(*failing) : Json()},
                                   {"points", points},
                                   {"complete", complete}});
        if (!complete) break;
        found[mix][policies[p]].push_back(g);
        if (policies[p] == "static") {
          static_goodput = g;
        } else {
          continuous.push_back(g);
          continuous_names.push_back(policies[p]);
        }
      }
      if (!complete) break;
      const std::size_t b = *gp::best(continuous);
      const gp::Ratio ratio = gp::ratio(continuous[b], static_goodput);
      found[mix]["best continuous"].push_back(continuous[b]);
      ratios[mix].push_back(ratio);
      std::printf("llm_decode goodput: repeat %d %-11s continuous (best: %s, %s) / static (%s) = %s (%s): target >= "
                  "%gx %s\n",
                  repeat + 1, mix.c_str(), continuous_names[b].c_str(), describe(continuous[b]).c_str(),
                  describe(static_goodput).c_str(), describe(ratio).c_str(), gp::to_string(ratio.kind),
                  settings.target, gp::meets_target(ratio, settings.target) ? "met" : "MISSED");
      out["ratios"].push_back({{"repeat", repeat + 1},
                               {"mix", mix},
                               {"best_continuous", continuous_names[b]},
                               {"continuous_rps", continuous[b].rate},
                               {"continuous_bound", gp::to_string(continuous[b].bound)},
                               {"static_rps", static_goodput.rate},
                               {"static_bound", gp::to_string(static_goodput.bound)},
                               {"ratio", ratio.value},
                               {"ratio_kind", gp::to_string(ratio.kind)},
                               {"target_met", gp::meets_target(ratio, settings.target)}});
    }
  }
  for (auto& engine : engines) engine->shutdown(replay::DecodeShutdown::drain);
  // The spread over the repeats: of each policy's goodput (the rates of the
  // searches, whatever their bound; the bounds are counted beside), and of
  // the ratio.
  std::printf("llm_decode goodput: summary, %d repeat(s)%s; TTFT p99 <= %.0f ms, TPOT p99 <= %.3f ms\n",
              settings.repeats, complete ? "" : " (INCOMPLETE: the budget ended the run)", slo.ttft_p99_ms,
              slo.tpot_p99_ms);
  for (const auto& [mix, by_policy] : found) {
    for (const auto& [policy, goodputs] : by_policy) {
      std::vector<double> rates;
      std::map<std::string, int> bounds;
      for (const gp::Goodput& g : goodputs) {
        rates.push_back(g.rate);
        ++bounds[gp::to_string(g.bound)];
      }
      const std::optional<gp::Spread> s = gp::spread(rates);
      if (!s) continue;
      std::string bound_text;
      for (const auto& [bound, count] : bounds) bound_text += " " + std::to_string(count) + " " + bound;
      std::printf("llm_decode goodput: %-11s %-15s goodput min / median / max %7.0f / %7.0f / %7.0f req/s (%zu "
                  "repeats;%s)\n",
                  mix.c_str(), policy.c_str(), s->min, s->median, s->max, s->count, bound_text.c_str());
      out["spread"][mix][policy] = {{"min_rps", s->min}, {"median_rps", s->median}, {"max_rps", s->max},
                                    {"repeats", s->count}, {"bounds", bounds}};
    }
    // An unknown ratio (both searches below their floor, or both at their
    // ceiling) has no value: it is counted, never averaged in.
    std::vector<double> values;
    bool all_met = true;
    std::string kinds;
    std::size_t unknown = 0;
    for (const gp::Ratio& r : ratios[mix]) {
      all_met &= gp::meets_target(r, settings.target);
      kinds += std::string(kinds.empty() ? "" : ", ") + gp::to_string(r.kind);
      if (r.kind == gp::Ratio::Kind::unknown) {
        ++unknown;
      } else {
        values.push_back(r.value);
      }
    }
    if (unknown > 0) {
      std::printf("llm_decode goodput: %-11s continuous (best) / static unknown in %zu of %zu repeat(s) (both "
                  "goodputs below --min-rate, or both at --max-rate): target >= %gx not shown\n",
                  mix.c_str(), unknown, ratios[mix].size(), settings.target);
      out["spread"][mix]["ratio_unknown_repeats"] = unknown;
    }
    if (const std::optional<gp::Spread> s = gp::spread(values)) {
      std::printf("llm_decode goodput: %-11s continuous (best) / static min / median / max %.2f / %.2f / %.2f "
                  "(%s): target >= %gx %s in every repeat\n",
                  mix.c_str(), s->min, s->median, s->max, kinds.c_str(), settings.target, all_met ? "met" : "MISSED");
      out["spread"][mix]["ratio"] = {{"min", s->min}, {"median", s->median}, {"max", s->max},
                                     {"repeats", s->count}, {"target_met_every_repeat", all_met}};
    }
  }
  out["complete"] = complete;
  out["seconds_total"] = elapsed();
  std::printf("llm_decode goodput: %.0f s in all\n", elapsed());
  write_json(c.json, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"llm_decode: greedy decoding of a Llama-style model with CUDA graphs (replay)"};
  app.require_subcommand(1);
  Common c;
  // write-weights makes random weights: it reads none (reads_weights false).
  auto add_common = [&c](CLI::App* sub, bool reads_weights = true) {
    CLI::Option* preset =
        sub->add_option("--preset", c.preset, "model size for random weights: tiny, small or 1b")->capture_default_str();
    sub->add_option("--seed", c.seed, "seed of the random weights and prompts")->capture_default_str();
    CLI::Option* max_len =
        sub->add_option("--max-len", c.max_len, "positions per cache slot (random weights)")->capture_default_str();
    if (reads_weights) {
      CLI::Option* weights = sub->add_option("--weights", c.weights,
                                             "directory with config.json and weights.pt (default: random weights)");
      // The weights' config.json gives their sizes: beside it, these would be ignored.
      preset->excludes(weights);
      max_len->excludes(weights);
    }
    sub->add_option("--batch-buckets", c.batch_buckets, "batch sizes a launch is padded to")->delimiter(',');
    sub->add_option("--context-buckets", c.context_buckets, "context lengths a launch reads up to")->delimiter(',');
    sub->add_option("--kernels", c.kernels, "the decode step's kernels: aten (operators) or fused")
        ->check(CLI::IsMember({"aten", "fused"}))
        ->capture_default_str();
    sub->add_option("--prefill", c.prefill, "bucketed (padded to prefill buckets, graphed) or unpadded (eager)")
        ->check(CLI::IsMember({"bucketed", "unpadded"}))
        ->capture_default_str();
    sub->add_option("--prefill-buckets", c.prefill_buckets, "packed prompt tokens a prefill is padded to")
        ->delimiter(',');
    sub->add_option("--json", c.json, "write the results to this file");
    CLI::Option* pdl =
        sub->add_option("--pdl", c.programmatic_launches,
                        "where the fused kernels are launched with programmatic dependent launch: after-own "
                        "(in a graph, plainly after a kernel of torch's: a cuBLAS product, index_select, a fill), "
                        "always or off")
            ->check(CLI::IsMember(kPdlModes))
            ->capture_default_str();
    sub->add_flag_callback(
           "--no-pdl", [&c] { c.programmatic_launches = "off"; },
           "launch the fused kernels plainly (--pdl off), to measure what programmatic dependent launch gains")
        ->excludes(pdl);
    CLI::Option* own_rows =
        sub->add_option("--own-product-rows", c.own_product_rows,
                        "the fused step's own products (GEMV, tensor-core skinny GEMM) up to this many rows, cuBLAS "
                        "above (0: cuBLAS everywhere; 64: every row count they take; default: the library's, at row counts " +
                            llm_decode::fused::describe_product_rows(llm_decode::fused::own_products_at()) + ")")
            ->check(CLI::Range(0, llm_decode::fused::kMaxSkinnyRows));
    CLI::Option* own_at =
        sub->add_option("--own-products-at", c.own_products_at,
                        "the fused step's own products at exactly these row counts (1 to 64, comma-separated), "
                        "cuBLAS at the others")
            ->delimiter(',')
            ->check(CLI::Range(1, llm_decode::fused::kMaxSkinnyRows))
            ->excludes(own_rows);
    CLI::Option* narrow_at =
        sub->add_option("--narrow-products-at", c.narrow_products_at,
                        "where the own products are used at these row counts (2 to 8, comma-separated), the narrow "
                        "tensor-core product in place of the GEMV")
            ->delimiter(',')
            ->check(CLI::Range(llm_decode::fused::kMinNarrowRows, llm_decode::fused::kMaxGemvRows));
    sub->add_flag("--tune-own-products", c.tune_own_products,
                  "time the fused decode step with its own products, with cuBLAS's and (2 to 8 rows) with the "
                  "narrow tensor-core products at each batch bucket up to 64 (graphed, the first context bucket) "
                  "and keep the fastest (by 2% or more; the default where closer): for the fused step (--kernels "
                  "fused, and bench's cpp_graphed_fused row); a model the fused kernels do not take is an error")
        ->excludes(own_rows)
        ->excludes(own_at)
        ->excludes(narrow_at);
    sub->add_option("--narrow-chunks-in-flight", c.narrow_chunks_in_flight,
                    "chunks of 32 halves each warp of the narrow products loads at once: 4 or 8 at every width, to "
                    "measure one against the other (default: by the width, 8 where 4 would take more than one pass)")
        ->check(CLI::IsMember(std::vector<int>{4, 8}));
    sub->add_flag("--fold-norms", c.fold_norms,
                  "at one row with the own products, compute each residual add and RMSNorm inside the product "
                  "after it (5 kernels per layer instead of 7)");
  };
  std::string out_dir;
  CLI::App* write = app.add_subcommand("write-weights", "write random weights (config.json, weights.pt)");
  add_common(write, /*reads_weights=*/false);
  write->add_option("--out", out_dir, "directory to write")->required();

  std::size_t prompts = 24, new_tokens = 32, steps = 1;
  int threads = 4;
  CLI::App* gen = app.add_subcommand("generate", "fixed prompts through the graphed engine, checked against eager");
  add_common(gen);
  gen->add_option("--prompts", prompts)->capture_default_str();
  gen->add_option("--new-tokens", new_tokens)->capture_default_str();
  gen->add_option("--steps-per-launch", steps)->capture_default_str();
  gen->add_option("--threads", threads, "threads submitting requests")->capture_default_str();
  gen->add_option("--prefill-chunk", c.prefill_chunk,
                  "chunked prefill: this many prompt tokens per launch, carried with a decode step of the running "
                  "sequences (needs --kernels fused); 0: separate prefill calls")
      ->capture_default_str();

  std::vector<std::int64_t> batches{1, 8, 32, 64};
  std::size_t prompt_len = 32;
  std::vector<std::size_t> multi_steps{4};
  int repeats = 3, capture_threads = 4;
  std::vector<std::size_t> beside_prefill;
  double peak_tbps = 0;
  CLI::App* bench_app = app.add_subcommand("bench", "ms per step and tokens/s: eager, graphed, K steps per launch");
  add_common(bench_app);
  bench_app->add_option("--batches", batches)->delimiter(',');
  bench_app->add_option("--prompt", prompt_len)->capture_default_str();
  bench_app->add_option("--new-tokens", new_tokens)->capture_default_str();
  bench_app->add_option("--multi-steps", multi_steps, "K of the several-steps-per-launch rows")->delimiter(',');
  bench_app->add_option("--repeats", repeats)->capture_default_str();
  bench_app->add_option("--capture-threads", capture_threads)->capture_default_str();
  bench_app->add_option("--peak-tbps", peak_tbps,
                        "the GPU's peak memory bandwidth in TB/s for the rows' share of peak (default: from the "
                        "device's memory clock and bus width, else by name: H100 SXM 3.35, H200 4.8)");
  bench_app
      ->add_option("--beside-prefill", beside_prefill,
                   "also time graphed steps while a second executor prefills prompts of these many tokens, one after "
                   "another, on a second thread and stream")
      ->delimiter(',');

  // The options `load` and `goodput` share: requests per point, the policies and their settings.
  auto add_load_options = [](CLI::App* sub, LoadSettings& settings) {
    sub->add_option("--requests", settings.requests, "requests per point, at least")->capture_default_str();
    sub->add_option("--seconds", settings.seconds, "per point also at least rate x seconds requests")
        ->capture_default_str();
    sub->add_option("--steps-per-launch", settings.steps)->capture_default_str();
    sub->add_option("--policies", settings.policies,
                    "continuous (admit at every step, prompts prefilled separately), grouped (continuous, admissions "
                    "grouped), chunked (continuous, chunked prefill: needs --kernels fused), chunked-grouped "
                    "(chunked prefill, admissions grouped), static")
        ->delimiter(',')
        ->check(CLI::IsMember({"continuous", "grouped", "chunked", "chunked-grouped", "static"}))
        ->capture_default_str();
    sub->add_option("--min-admission", settings.min_admission, "grouped, chunked-grouped: requests admitted together")
        ->capture_default_str();
    sub->add_option("--chunk-tokens", settings.chunk_tokens, "chunked: prompt tokens per mixed launch")
        ->capture_default_str();
    sub->add_option("--grouped-chunk-tokens", settings.grouped_chunk_tokens,
                    "chunked-grouped: prompt tokens per mixed launch (at most the largest prefill bucket less the "
                    "largest batch bucket)")
        ->capture_default_str();
    sub->add_option("--admission-delay-us", settings.admission_delay_us,
                    "grouped, chunked-grouped: the longest the scheduler goes without an admission while requests "
                    "wait")
        ->capture_default_str();
  };
  LoadSettings load_settings{.rates = {50, 200, 800}};
  CLI::App* load_app = app.add_subcommand("load", "Poisson load test: continuous against static batching");
  add_common(load_app);
  load_app->add_option("--rates", load_settings.rates, "offered requests per second")->delimiter(',');
  add_load_options(load_app, load_settings);
  load_app->add_option("--output-lengths", load_settings.lengths.shape, "new tokens per request: uniform or exponential")
      ->check(CLI::IsMember({"uniform", "exponential"}))
      ->capture_default_str();
  load_app->add_option("--new-tokens-min", load_settings.lengths.min)->capture_default_str();
  load_app->add_option("--new-tokens-max", load_settings.lengths.max)->capture_default_str();
  load_app->add_option("--new-tokens-mean", load_settings.lengths.mean, "exponential: the mean")->capture_default_str();


  GoodputSettings goodput_settings;
  CLI::App* goodput_app = app.add_subcommand(
      "goodput",
      "goodput under an SLO: the highest offered rate at which TTFT p99 and TPOT p99 stay within limits, searched "
      "per policy and output-length mix, continuous against static batching (default --kernels fused)");
  add_common(goodput_app);
  add_load_options(goodput_app, goodput_settings.load);
  goodput_app->add_option("--mixes", goodput_settings.mixes, "output-length mixes: exponential, uniform")
      ->delimiter(',')
      ->check(CLI::IsMember({"uniform", "exponential"}))
      ->capture_default_str();
  goodput_app->add_option("--repeats", goodput_settings.repeats, "the whole search this many times (the spread)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  goodput_app->add_option("--ttft-p99-ms", goodput_settings.ttft_p99_ms, "the SLO's TTFT p99 limit")
      ->capture_default_str();
  goodput_app
      ->add_option("--tpot-factor", goodput_settings.tpot_factor,
                   "the SLO's TPOT p99 limit: this times the batch-1 decode step measured first")
      ->capture_default_str();
  goodput_app->add_option("--target", goodput_settings.target, "continuous (best) / static goodput to reach")
      ->capture_default_str();
  goodput_app->add_option("--start-rate", goodput_settings.search.start_rate, "the search's first rate (req/s)")
      ->capture_default_str();
  goodput_app->add_option("--min-rate", goodput_settings.search.min_rate, "the lowest rate tried")
      ->capture_default_str();
  goodput_app->add_option("--max-rate", goodput_settings.search.max_rate, "the highest rate tried")
      ->capture_default_str();
  goodput_app->add_option("--growth", goodput_settings.search.growth, "the ramp's factor between rates")
      ->capture_default_str();
  goodput_app
      ->add_option("--resolution", goodput_settings.search.resolution,
                   "bisection stops when the lowest failing rate is within this fraction above the highest passing")
      ->capture_default_str();
  goodput_app->add_option("--max-points", goodput_settings.search.max_points, "points per search, at most")
      ->capture_default_str();
  goodput_app
      ->add_option("--budget-s", goodput_settings.budget_s,
                   "no point starts whose arrivals would end past this many seconds (0: no limit); the results so "
                   "far are written")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // goodput runs the fused kernels unless told otherwise: its chunked policies need them.
  if (goodput_app->parsed() && goodput_app->count("--kernels") == 0) c.kernels = "fused";
  // --tune-own-products chooses the fused step's products: refused where
  // nothing runs that step (bench's cpp_graphed_fused row always does).
  if (c.tune_own_products && c.kernels != "fused" && !bench_app->parsed()) {
    std::fprintf(stderr, "llm_decode: --tune-own-products chooses the fused step's products: it needs --kernels "
                         "fused here (given --kernels %s)\n", c.kernels.c_str());
    return 2;
  }
  // --narrow-products-at picks the own products' kernel: at a count where
  // they are not used it would change nothing, silently.
  for (const int rows : c.narrow_products_at) {
    if (!c.own_products().test(static_cast<std::size_t>(rows - 1))) {
      std::fprintf(stderr, "llm_decode: --narrow-products-at %d: the own products are not used at %d rows (own "
                           "products at %s; give --own-product-rows or --own-products-at with it)\n",
                   rows, rows, llm_decode::fused::describe_product_rows(c.own_products()).c_str());
      return 2;
    }
  }
  if (new_tokens < 2) {
    std::fprintf(stderr, "llm_decode: --new-tokens must be at least 2\n");
    return 2;
  }
  try {
    if (write->parsed()) {
      llm_decode::LlamaConfig config = llm_decode::LlamaConfig::preset(c.preset);
      config.max_len = c.max_len;
      LlamaModel::random(config, c.seed, at::Device(at::kCPU)).save(out_dir);
      std::printf("llm_decode: wrote %s weights (seed %llu) to %s\n", c.preset.c_str(),
                  static_cast<unsigned long long>(c.seed), out_dir.c_str());
      return 0;
    }
    if (!replay::has_device()) {
      std::printf("%s: nothing to run\n", replay::no_device_message.data());
      return 0;
    }
    if (gen->parsed()) return generate(c, prompts, new_tokens, steps, threads);
    if (bench_app->parsed()) {
      std::sort(multi_steps.begin(), multi_steps.end());
      return bench(c, batches, prompt_len, new_tokens, multi_steps, repeats, capture_threads, beside_prefill,
                   peak_tbps);
    }
    if (load_app->parsed()) {
      const OutputLengths& l = load_settings.lengths;
      if (l.min < 1 || l.min > l.max || (l.shape == "exponential" && (l.mean <= l.min || l.mean >= l.max))) {
        std::fprintf(stderr, "llm_decode: new tokens need 1 <= min <= max (and min < mean < max for exponential)\n");
        return 2;
      }
      return load(c, load_settings);
    }
    if (goodput_app->parsed()) return goodput(c, goodput_settings);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llm_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
