// inference_server: an HTTP inference server over replay::Batcher.
// (inference_server_torch, built where libtorch is found, also serves
// --model resnet50 through the libtorch adapter.)
//
// Requests from many connections are gathered into batches (up to the
// model's batch buckets, waiting at most --max-queue-delay-us) and run as one
// bucketed CUDA-graph replay each (a ShapeRouter behind replay's
// StagedCudaExecutor), or eagerly (--eager), or on the CPU stand-in model
// (--model cpu, for tests without a GPU). See docs/batching.md.
//
//   POST /v1/infer   body: raw little-endian float32 rows (any content type but
//                    JSON), or JSON {"inputs": [[...], ...] or [...], "id": n};
//                    answer: float32 output rows (raw), or {"outputs": [[...]]}.
//                    Headers: X-Request-Id (echoed; with --verify the answer is
//                    checked against the reference for that id), X-Timeout-Ms.
//                    400 bad body, 503 queue full or shutting down, 504 deadline.
//   GET /v1/stats    JSON: the Batcher's and the router's statistics
//   GET /metrics     Prometheus text format
//   GET /healthz     200 "ok" while serving
//
// SIGTERM or SIGINT: stop accepting, finish the requests in flight, exit 0.
#include <httplib.h>

#include <pthread.h>
#include <signal.h>

#include <csignal>
#include <optional>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "json.hpp"
#include "model.hpp"
#include "replay/batcher/batcher.hpp"

namespace {

using inference_server::json_string;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string host = "127.0.0.1";
  int port = 8000;
  bool batching = true;
  int max_queue_delay_us = 200;
  int queue_capacity = 1024;
  int timeout_ms = 2000;
  int threads = 160;
  int verify = 0;  // ids 0..verify-1 get a reference answer to check against
  inference_server::ModelConfig model;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "inference_server: %s\n"
               "usage: inference_server [--port N (0: any free port)] [--host ADDR] [--batching on|off]\n"
               "         [--max-queue-delay-us N] [--model mlp|cpu|resnet50] [--eager] [--layers N] [--width N]\n"
               "         [--outputs N] [--max-batch N] [--queue-capacity N] [--timeout-ms N] [--threads N]\n"
               "         [--verify K] [--cpu-delay-us N]\n",
               why.c_str());
  std::exit(2);
}

int to_int(const std::string& flag, const char* value, int min) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < min || v > 1'000'000'000L) {
    usage(flag + " needs an integer >= " + std::to_string(min) + ", got '" + value + "'");
  }
  return static_cast<int>(v);
}

Flags parse_flags(int argc, char** argv) {
  Flags flags;
  bool layers_given = false;
  bool width_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage(flag + " needs a value");
      }
      return argv[++i];
    };
    if (flag == "--port") {
      flags.port = to_int(flag, value(), 0);
    } else if (flag == "--host") {
      flags.host = value();
    } else if (flag == "--batching") {
      const std::string v = value();
      if (v != "on" && v != "off") {
        usage("--batching takes on or off");
      }
      flags.batching = v == "on";
    } else if (flag == "--max-queue-delay-us") {
      flags.max_queue_delay_us = to_int(flag, value(), 0);
    } else if (flag == "--model") {
      flags.model.kind = value();
      if (flags.model.kind != "mlp" && flags.model.kind != "cpu" && flags.model.kind != "resnet50") {
        usage("--model takes mlp, cpu or resnet50");
      }
    } else if (flag == "--eager") {
      flags.model.graphs = false;
    } else if (flag == "--layers") {
      flags.model.layers = to_int(flag, value(), 2);
      layers_given = true;
    } else if (flag == "--width") {
      flags.model.width = to_int(flag, value(), 1);
      width_given = true;
    } else if (flag == "--outputs") {
      flags.model.outputs = to_int(flag, value(), 1);
    } else if (flag == "--max-batch") {
      flags.model.max_batch = to_int(flag, value(), 1);
    } else if (flag == "--queue-capacity") {
      flags.queue_capacity = to_int(flag, value(), 1);
    } else if (flag == "--timeout-ms") {
      flags.timeout_ms = to_int(flag, value(), 0);
    } else if (flag == "--threads") {
      flags.threads = to_int(flag, value(), 1);
    } else if (flag == "--verify") {
      flags.verify = to_int(flag, value(), 0);
    } else if (flag == "--cpu-delay-us") {
      flags.model.cpu_delay_us = to_int(flag, value(), 0);
    } else if (flag == "--help" || flag == "-h") {
      usage("help");
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (flags.model.kind == "cpu") {  // a small default: the CPU stand-in is for tests
    flags.model.layers = layers_given ? flags.model.layers : 4;
    flags.model.width = width_given ? flags.model.width : 64;
  }
  return flags;
}

// Request counts by HTTP status and latency, for /v1/stats and /metrics.
class Metrics {
 public:
  static constexpr std::array<double, 14> bounds_us{50,    100,   250,    500,    1'000,   2'500,   5'000,
                                                    10'000, 25'000, 50'000, 100'000, 250'000, 1'000'000, 5'000'000};

  void record(int code, Clock::duration latency) {
    codes_[static_cast<std::size_t>(code < 0 || code >= 600 ? 599 : code)].fetch_add(1, std::memory_order_relaxed);
    const double us = std::chrono::duration<double, std::micro>(latency).count();
    std::size_t b = 0;
    while (b < bounds_us.size() && us > bounds_us[b]) {
      ++b;
    }
    latency_[b].fetch_add(1, std::memory_order_relaxed);
    latency_sum_ns_.fetch_add(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(latency).count()),
                              std::memory_order_relaxed);
  }
  std::uint64_t code(int c) const { return codes_[static_cast<std::size_t>(c)].load(std::memory_order_relaxed); }
  std::uint64_t latency_bucket(std::size_t b) const { return latency_[b].load(std::memory_order_relaxed); }
  double latency_sum_s() const { return static_cast<double>(latency_sum_ns_.load(std::memory_order_relaxed)) * 1e-9; }

  std::atomic<std::uint64_t> verified{0};
  std::atomic<std::uint64_t> mismatches{0};
  std::atomic<std::uint64_t> unverifiable{0};  // carried an id but not that id's input

 private:
  std::array<std::atomic<std::uint64_t>, 600> codes_{};
  std::array<std::atomic<std::uint64_t>, bounds_us.size() + 1> latency_{};
  std::atomic<std::uint64_t> latency_sum_ns_{0};
};

int http_code(replay::BatchStatus status) {
  switch (status) {
    case replay::BatchStatus::ok: return 200;
    case replay::BatchStatus::invalid_request:
    case replay::BatchStatus::too_large: return 400;
    case replay::BatchStatus::queue_full:
    case replay::BatchStatus::shut_down: return 503;
    case replay::BatchStatus::timed_out: return 504;
    case replay::BatchStatus::failed: return 500;
  }
  return 500;
}

std::string format(const char* fmt, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, fmt, value);
  return buffer;
}

class Server {
 public:
  Server(Flags flags, std::unique_ptr<inference_server::Model> model)
      : flags_(std::move(flags)), model_(std::move(model)), row_(model_->input_row_elements()),
        out_row_(model_->output_row_elements()), tolerance_(model_->tolerance()) {
    build_references();
    replay::BatcherOptions options;
    options.max_queue_delay = std::chrono::microseconds(flags_.batching ? flags_.max_queue_delay_us : 0);
    options.max_batch_requests = flags_.batching ? 0 : 1;
    options.queue_capacity = static_cast<std::size_t>(flags_.queue_capacity);
    batcher_ = std::make_unique<replay::Batcher<inference_server::ModelExecutor>>(
        inference_server::ModelExecutor{model_.get()}, options);
  }

  void install(httplib::Server& http) {
    http.Post("/v1/infer", [this](const httplib::Request& req, httplib::Response& res) { infer(req, res); });
    http.Get("/v1/stats", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(stats_json(), "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(prometheus(), "text/plain; version=0.0.4");
    });
    http.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
      const bool up = batcher_->accepting();
      res.status = up ? 200 : 503;
      res.set_content(up ? "ok\n" : "shutting down\n", "text/plain");
    });
  }

  void shutdown() { batcher_->shutdown(replay::ShutdownMode::drain); }
  const replay::Batcher<inference_server::ModelExecutor>& batcher() const { return *batcher_; }
  const Metrics& metrics() const { return metrics_; }

 private:
  void build_references() {
    std::vector<float> row(row_);
    for (int key = 0; key < flags_.verify; ++key) {
      for (std::size_t j = 0; j < row_; ++j) {
        row[j] = inference_server::input_value(static_cast<unsigned long long>(key), j);
      }
      references_.push_back(model_->reference(row));
    }
  }

  static void reply_error(httplib::Response& res, int code, std::string_view status, const std::string& message) {
    res.status = code;
    res.set_content("{\"error\": " + json_string(message) + ", \"status\": " + json_string(status) + "}\n",
                    "application/json");
  }

  void infer(const httplib::Request& req, httplib::Response& res) {
    const Clock::time_point start = Clock::now();
    const int code = infer_body(req, res, start);
    metrics_.record(code, Clock::now() - start);
  }

  int infer_body(const httplib::Request& req, httplib::Response& res, Clock::time_point start) {
    std::vector<float> inputs;
    std::optional<unsigned long long> id;
    const bool json = req.get_header_value("Content-Type").find("json") != std::string::npos;
    if (req.has_header("X-Request-Id")) {
      const std::string text = req.get_header_value("X-Request-Id");
      char* end = nullptr;
      const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
      if (end == text.c_str() || *end != '\0') {
        reply_error(res, 400, "invalid_request", "X-Request-Id must be a non-negative integer, got '" + text + "'");
        return 400;
      }
      id = v;
    }
    if (json) {
      inference_server::InferRequestJson parsed;
      inference_server::JsonReader reader(req.body);
      if (std::string error = reader.parse_infer(parsed); !error.empty()) {
        reply_error(res, 400, "invalid_request", error);
        return 400;
      }
      if (parsed.rows_given != 0 && parsed.inputs.size() != parsed.rows_given * row_) {
        reply_error(res, 400, "invalid_request",
                    "each row of \"inputs\" must hold " + std::to_string(row_) + " numbers; got " +
                        std::to_string(parsed.inputs.size()) + " numbers in " + std::to_string(parsed.rows_given) +
                        " rows");
        return 400;
      }
      inputs = std::move(parsed.inputs);
      id = id ? id : parsed.id;
    } else {
      const std::size_t row_bytes = row_ * sizeof(float);
      if (req.body.empty() || req.body.size() % row_bytes != 0) {
        reply_error(res, 400, "invalid_request",
                    "a raw body must be whole rows of " + std::to_string(row_) + " float32 values (" +
                        std::to_string(row_bytes) + " bytes each); got " + std::to_string(req.body.size()) +
                        " bytes");
        return 400;
      }
      inputs.resize(req.body.size() / sizeof(float));
      std::memcpy(inputs.data(), req.body.data(), req.body.size());
    }
    for (const float v : inputs) {
      if (!std::isfinite(v)) {
        reply_error(res, 400, "invalid_request", "the inputs must be finite numbers");
        return 400;
      }
    }
    int timeout_ms = flags_.timeout_ms;
    if (req.has_header("X-Timeout-Ms")) {
      timeout_ms = std::atoi(req.get_header_value("X-Timeout-Ms").c_str());
      if (timeout_ms <= 0) {
        reply_error(res, 400, "invalid_request", "X-Timeout-Ms must be a positive integer");
        return 400;
      }
    }
    replay::SubmitOptions submit;
    if (timeout_ms > 0) {
      submit.deadline = start + std::chrono::milliseconds(timeout_ms);
    }
    replay::BatchResult<float> result = batcher_->try_submit(inputs, submit).get();
    const int code = http_code(result.status);
    if (id) {
      res.set_header("X-Request-Id", std::to_string(*id));
    }
    if (!result.ok()) {
      reply_error(res, code, replay::to_string(result.status), result.message);
      return code;
    }
    res.set_header("X-Batch-Rows", std::to_string(result.batch_rows));
    if (id && !references_.empty()) {
      res.set_header("X-Replay-Check", check(*id, inputs, result.output) ? "ok" : "mismatch");
    }
    if (json) {
      std::string body = "{\"outputs\": [";
      for (std::size_t r = 0; r < result.output.size() / out_row_; ++r) {
        body += r == 0 ? "[" : ", [";
        for (std::size_t j = 0; j < out_row_; ++j) {
          body += (j == 0 ? "" : ", ") + format("%.9g", static_cast<double>(result.output[r * out_row_ + j]));
        }
        body += "]";
      }
      body += "], \"batch_rows\": " + std::to_string(result.batch_rows) + "}\n";
      res.set_content(body, "application/json");
    } else {
      res.set_content(reinterpret_cast<const char*>(result.output.data()), result.output.size() * sizeof(float),
                      "application/octet-stream");
    }
    return 200;
  }

  // True when the answer is the reference for the request's id (bitwise).
  bool check(unsigned long long id, const std::vector<float>& inputs, const std::vector<float>& output) {
    const std::size_t key = static_cast<std::size_t>(id % references_.size());
    bool derived = inputs.size() == row_;
    for (std::size_t j = 0; derived && j < row_; ++j) {
      derived = inputs[j] == inference_server::input_value(key, j);
    }
    if (!derived) {
      metrics_.unverifiable.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    metrics_.verified.fetch_add(1, std::memory_order_relaxed);
    const std::vector<float>& expected = references_[key];
    bool same = expected.size() == output.size();
    if (same && tolerance_ == 0.0F) {
      same = std::memcmp(expected.data(), output.data(), output.size() * sizeof(float)) == 0;
    }
    for (std::size_t j = 0; same && tolerance_ > 0.0F && j < output.size(); ++j) {
      same = std::fabs(expected[j] - output[j]) <= tolerance_ * (1.0F + std::fabs(expected[j]));
    }
    if (!same) {
      metrics_.mismatches.fetch_add(1, std::memory_order_relaxed);
    }
    return same;
  }

  std::string stats_json() const {
    const replay::BatcherStats s = batcher_->stats();
    std::string j = "{\n  \"model\": " + json_string(model_->describe()) + ",\n";
    j += "  \"batching\": " + std::string(flags_.batching ? "true" : "false") +
         ", \"max_queue_delay_us\": " + std::to_string(batcher_->options().max_queue_delay.count()) +
         ", \"max_batch_rows\": " + std::to_string(batcher_->options().max_batch_rows) +
         ", \"queue_capacity\": " + std::to_string(batcher_->options().queue_capacity) + ",\n";
    j += "  \"batcher\": {\"enqueued\": " + std::to_string(s.enqueued) + ", \"completed\": " + std::to_string(s.completed) +
         ", \"failed\": " + std::to_string(s.failed) + ", \"timed_out\": " + std::to_string(s.timed_out) +
         ", \"refused\": " + std::to_string(s.refused) + ", \"too_large\": " + std::to_string(s.too_large) +
         ", \"invalid\": " + std::to_string(s.invalid) + ", \"cancelled\": " + std::to_string(s.cancelled) +
         ", \"rejected_shut_down\": " + std::to_string(s.rejected_shut_down) +
         ", \"queue_depth\": " + std::to_string(s.queue_depth) + ", \"batches\": " + std::to_string(s.batches) +
         ", \"failed_batches\": " + std::to_string(s.failed_batches) + ", \"rows\": " + std::to_string(s.rows) +
         ", \"padded_rows\": " + std::to_string(s.padded_rows) +
         ", \"mean_batch_rows\": " + format("%.4f", s.mean_batch_rows()) +
         ", \"padding_waste\": " + format("%.6f", s.padding_waste()) +
         ", \"queue_delay_p50_us\": " + format("%.1f", s.queue_delay_p50_us) +
         ", \"queue_delay_p99_us\": " + format("%.1f", s.queue_delay_p99_us) + ",\n    \"batch_rows_histogram\": {";
    bool first = true;
    for (std::size_t n = 1; n < s.batch_rows_histogram.size(); ++n) {
      if (s.batch_rows_histogram[n] != 0) {
        j += (first ? "\"" : ", \"") + std::to_string(n) + "\": " + std::to_string(s.batch_rows_histogram[n]);
        first = false;
      }
    }
    j += "}},\n  \"router\": " + model_->router_stats_json() + ",\n  \"http\": {";
    first = true;
    for (int c = 100; c < 600; ++c) {
      if (const std::uint64_t n = metrics_.code(c); n != 0) {
        j += (first ? "\"" : ", \"") + std::to_string(c) + "\": " + std::to_string(n);
        first = false;
      }
    }
    j += "},\n  \"verify\": {\"references\": " + std::to_string(references_.size()) +
         ", \"checked\": " + std::to_string(metrics_.verified.load()) +
         ", \"mismatches\": " + std::to_string(metrics_.mismatches.load()) +
         ", \"unverifiable\": " + std::to_string(metrics_.unverifiable.load()) + "}\n}\n";
    return j;
  }

  std::string prometheus() const {
    const replay::BatcherStats s = batcher_->stats();
    std::string m;
    m += "# HELP replay_http_requests_total Requests to /v1/infer by HTTP status code.\n"
         "# TYPE replay_http_requests_total counter\n";
    for (int c = 100; c < 600; ++c) {
      if (const std::uint64_t n = metrics_.code(c); n != 0) {
        m += "replay_http_requests_total{code=\"" + std::to_string(c) + "\"} " + std::to_string(n) + "\n";
      }
    }
    m += "# HELP replay_batcher_requests_total Batcher requests by outcome.\n"
         "# TYPE replay_batcher_requests_total counter\n";
    const std::pair<const char*, std::uint64_t> outcomes[] = {
        {"ok", s.completed},          {"failed", s.failed},   {"timed_out", s.timed_out},
        {"queue_full", s.refused},    {"too_large", s.too_large}, {"invalid_request", s.invalid},
        {"shut_down", s.cancelled + s.rejected_shut_down}};
    for (const auto& [name, n] : outcomes) {
      m += std::string("replay_batcher_requests_total{status=\"") + name + "\"} " + std::to_string(n) + "\n";
    }
    m += "# HELP replay_batch_rows Real rows per batch run.\n# TYPE replay_batch_rows histogram\n";
    std::uint64_t cumulative = 0;
    std::size_t next = 1;
    for (const std::size_t bound : batcher_->batch_sizes()) {
      for (; next <= bound && next < s.batch_rows_histogram.size(); ++next) {
        cumulative += s.batch_rows_histogram[next];
      }
      m += "replay_batch_rows_bucket{le=\"" + std::to_string(bound) + "\"} " + std::to_string(cumulative) + "\n";
    }
    m += "replay_batch_rows_bucket{le=\"+Inf\"} " + std::to_string(s.batches) + "\n";
    m += "replay_batch_rows_sum " + std::to_string(s.rows) + "\nreplay_batch_rows_count " + std::to_string(s.batches) + "\n";
    m += "# HELP replay_queue_delay_seconds Time from submission to leaving the Batcher's queue.\n"
         "# TYPE replay_queue_delay_seconds histogram\n";
    cumulative = 0;
    for (std::size_t b = 0; b < replay::BatcherStats::queue_delay_bounds_us.size(); ++b) {
      cumulative += s.queue_delay_histogram[b];
      m += "replay_queue_delay_seconds_bucket{le=\"" + format("%g", replay::BatcherStats::queue_delay_bounds_us[b] * 1e-6) +
           "\"} " + std::to_string(cumulative) + "\n";
    }
    cumulative += s.queue_delay_histogram.back();
    m += "replay_queue_delay_seconds_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
    m += "replay_queue_delay_seconds_sum " + format("%.9f", s.queue_delay_sum_us * 1e-6) +
         "\nreplay_queue_delay_seconds_count " + std::to_string(cumulative) + "\n";
    m += "# HELP replay_request_latency_seconds Time to answer /v1/infer, in the server.\n"
         "# TYPE replay_request_latency_seconds histogram\n";
    cumulative = 0;
    for (std::size_t b = 0; b < Metrics::bounds_us.size(); ++b) {
      cumulative += metrics_.latency_bucket(b);
      m += "replay_request_latency_seconds_bucket{le=\"" + format("%g", Metrics::bounds_us[b] * 1e-6) + "\"} " +
           std::to_string(cumulative) + "\n";
    }
    cumulative += metrics_.latency_bucket(Metrics::bounds_us.size());
    m += "replay_request_latency_seconds_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
    m += "replay_request_latency_seconds_sum " + format("%.9f", metrics_.latency_sum_s()) +
         "\nreplay_request_latency_seconds_count " + std::to_string(cumulative) + "\n";
    m += "# HELP replay_queue_depth Requests waiting in the Batcher's queue.\n# TYPE replay_queue_depth gauge\n"
         "replay_queue_depth " + std::to_string(s.queue_depth) + "\n";
    m += "# HELP replay_padding_waste Padded rows run per real row, minus one.\n# TYPE replay_padding_waste gauge\n"
         "replay_padding_waste " + format("%.6f", s.padding_waste()) + "\n";
    m += "# HELP replay_verify_mismatches_total Answers that differed from the reference (--verify).\n"
         "# TYPE replay_verify_mismatches_total counter\nreplay_verify_mismatches_total " +
         std::to_string(metrics_.mismatches.load()) + "\n";
    return m;
  }

  Flags flags_;
  std::unique_ptr<inference_server::Model> model_;
  std::size_t row_;
  std::size_t out_row_;
  float tolerance_;
  std::vector<std::vector<float>> references_;
  Metrics metrics_;
  std::unique_ptr<replay::Batcher<inference_server::ModelExecutor>> batcher_;
};

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);

  // Every thread started from here on inherits the blocked signals; one
  // thread waits for them (sigwait), so no handler runs in a random thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<Server> server;
  try {
    std::unique_ptr<inference_server::Model> model;
    if (flags.model.kind == "cpu") {
      model = inference_server::make_cpu_model(flags.model);
    } else if (flags.model.kind == "resnet50") {
#ifdef INFERENCE_SERVER_WITH_TORCH
      model = inference_server::make_torch_resnet(flags.model);
#else
      throw std::runtime_error("--model resnet50 is served by inference_server_torch (built where libtorch is found)");
#endif
    } else {
      model = inference_server::make_gpu_mlp(flags.model);
    }
    std::printf("inference_server: %s\n", model->describe().c_str());
    server = std::make_unique<Server>(flags, std::move(model));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "inference_server: cannot start: %s\n", e.what());
    return 1;
  }

  httplib::Server http;
  const int threads = flags.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
  http.set_keep_alive_max_count(1'000'000);
  http.set_tcp_nodelay(true);  // small answers: no Nagle delay (40 ms with delayed ACKs)
  http.set_keep_alive_timeout(2);  // also bounds how long a drain waits for idle connections
  http.set_payload_max_length(64ULL << 20);
  server->install(http);

  const int port = flags.port == 0 ? http.bind_to_any_port(flags.host) : (http.bind_to_port(flags.host, flags.port) ? flags.port : -1);
  if (port < 0) {
    std::fprintf(stderr, "inference_server: cannot listen on %s:%d\n", flags.host.c_str(), flags.port);
    return 1;
  }
  std::printf("inference_server: listening on http://%s:%d (batching %s, max queue delay %d us)\n",
              flags.host.c_str(), port, flags.batching ? "on" : "off", flags.batching ? flags.max_queue_delay_us : 0);
  std::fflush(stdout);

  std::atomic<bool> listening_done{false};
  std::thread signal_thread([&] {
    int received = 0;
    sigwait(&signals, &received);
    if (listening_done.load()) {
      return;  // woken by main to exit
    }
    std::printf("inference_server: %s: draining\n", received == SIGTERM ? "SIGTERM" : "SIGINT");
    std::fflush(stdout);
    // stop() only acts once listen_after_bind() runs; repeat until it returned.
    while (!listening_done.load()) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  const bool listened = http.listen_after_bind();  // returns after stop(), once every connection's thread is done
  listening_done = true;
  pthread_kill(signal_thread.native_handle(), SIGTERM);  // no-op for a thread already past sigwait
  signal_thread.join();
  server->shutdown();
  const replay::BatcherStats s = server->batcher().stats();
  std::printf("inference_server: stopped: %llu requests completed in %llu batches, %llu timed out, %llu refused, "
              "%llu failed\n",
              static_cast<unsigned long long>(s.completed), static_cast<unsigned long long>(s.batches),
              static_cast<unsigned long long>(s.timed_out), static_cast<unsigned long long>(s.refused),
              static_cast<unsigned long long>(s.failed));
  return listened ? 0 : 1;
}
