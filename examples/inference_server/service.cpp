#include "service.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <future>
#include <limits>
#include <new>
#include <optional>
#include <string_view>
#include <utility>

#include "request.hpp"

namespace inference_server {
namespace {

using ordered_json = nlohmann::ordered_json;

// Bytes of JSON text allowed per input number when the body limit is derived
// (a float32 in full precision with its separator needs at most about 17).
constexpr std::size_t json_bytes_per_number = 32;
constexpr std::size_t body_limit_slack = 64 * 1024;

struct Endpoint {
  std::string_view path;
  std::string_view methods;  // as the Allow header says them
};
constexpr std::array<Endpoint, 5> endpoints{{{"/v1/infer", "POST"},
                                             {"/v1/stats", "GET, HEAD"},
                                             {"/metrics", "GET, HEAD"},
                                             {"/healthz", "GET, HEAD"},
                                             {"/readyz", "GET, HEAD"}}};
constexpr std::string_view endpoint_list =
    "POST /v1/infer, GET /v1/stats, GET /metrics, GET /healthz, GET /readyz";

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

void reply_error(httplib::Response& res, int code, std::string_view status, std::string_view message) {
  res.status = code;
  res.set_content(json_error(status, message), "application/json");
}

// A request refused before its body was read: the connection cannot be reused.
void refuse_unread(httplib::Response& res, int code, std::string_view status, std::string_view message) {
  reply_error(res, code, status, message);
  res.set_header("Connection", "close");
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

// A body's framing this server does not take: a transfer encoding other
// than chunked (501), or more than one framing (400). (Current httplib
// refuses both itself, before the gate; fill_error() then says why.)
struct FramingFault {
  int code;
  std::string_view status;
  std::string message;
};
std::optional<FramingFault> framing_fault(const httplib::Request& req) {
  const std::size_t lengths = req.get_header_value_count("Content-Length");
  const std::string encoding = req.get_header_value("Transfer-Encoding");
  const bool chunked = equals_ignoring_case(encoding, "chunked");
  if (!encoding.empty() && !chunked) {
    return FramingFault{501, "not_implemented",
                        "Transfer-Encoding " + encoding + " is not supported; send Content-Length or chunked"};
  }
  if (lengths > 1 || (lengths == 1 && chunked)) {
    return FramingFault{400, "invalid_request", "give one Content-Length, or Transfer-Encoding: chunked, not both"};
  }
  return std::nullopt;
}

std::string format(const char* fmt, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, fmt, value);
  return buffer;
}

}  // namespace

InferenceService::InferenceService(ServerOptions options, ConnectionServer& http)
    : options_(std::move(options)), http_(http) {}

void InferenceService::install() {
  http_.routes().Post("/v1/infer", [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
    infer(req, res, read);
  });
  http_.routes().Get("/v1/stats", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(stats_json(), "application/json");
  });
  http_.routes().Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus(), "text/plain; version=0.0.4");
  });
  http_.routes().Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  http_.routes().Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    const Readiness r = readiness();
    res.status = r.ready ? 200 : 503;
    res.set_content(r.ready ? "ready\n" : "not ready: " + r.why + "\n", "text/plain");
  });
  http_.set_health_paths({"/healthz", "/readyz"});
  http_.set_request_gate([this](const httplib::Request& req, httplib::Response& res) { return gate(req, res); });
  http_.set_error_body([this](const httplib::Request& req, httplib::Response& res) { fill_error(req, res); });
  http_.set_answer_observer([this](const httplib::Request& req, const httplib::Response& res, Clock::duration latency) {
    on_answer(req, res, latency);
  });
  http_.routes().set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    res.status = 500;
    try {
      std::string what = "an exception that is not a std::exception";
      try {
        std::rethrow_exception(error);
      } catch (const std::bad_alloc&) {
        what = "out of memory (std::bad_alloc)";
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      res.set_content(json_error("internal_error", "the server failed while answering: " + what), "application/json");
    } catch (...) {
      res.body.clear();  // no memory for a message: the error body fills in a short one
    }
  });
}

void InferenceService::set_model(std::unique_ptr<Model> model) {
  model_ = std::move(model);
  row_ = model_->input_row_elements();
  out_row_ = model_->output_row_elements();
  tolerance_ = model_->tolerance();
  std::vector<float> row(row_);
  for (int key = 0; key < options_.verify; ++key) {
    for (std::size_t j = 0; j < row_; ++j) {
      row[j] = input_value(static_cast<unsigned long long>(key), j);
    }
    references_.push_back(model_->reference(row));
  }
  replay::BatcherOptions options;
  options.max_queue_delay = std::chrono::microseconds(options_.batching ? options_.max_queue_delay_us : 0);
  options.max_batch_requests = options_.batching ? 0 : 1;
  options.queue_capacity = static_cast<std::size_t>(options_.queue_capacity);
  batcher_ = std::make_unique<replay::Batcher<ModelExecutor>>(ModelExecutor{model_.get(), &health_}, options);
  const std::size_t max_rows = model_->batch_sizes().back();
  body_limit_ = options_.max_body_bytes > 0 ? static_cast<std::size_t>(options_.max_body_bytes)
                                            : max_rows * row_ * json_bytes_per_number + body_limit_slack;
  model_ready_.store(true, std::memory_order_release);
}

void InferenceService::shutdown() {
  if (model_ready()) {
    batcher_->shutdown(replay::ShutdownMode::drain);
  }
}

InferenceService::Readiness InferenceService::readiness() const {
  if (!model_ready()) {
    return {false, "the model is loading"};
  }
  if (draining_.load(std::memory_order_acquire)) {
    return {false, "draining (shutting down)"};
  }
  if (const std::uint64_t failures = health_.failures_in_a_row();
      failures >= static_cast<std::uint64_t>(options_.unready_after_failures)) {
    return {false, std::to_string(failures) + " batches failed in a row (--unready-after-failures " +
                       std::to_string(options_.unready_after_failures) + "); the last: " + health_.last_failure()};
  }
  return {true, {}};
}

// Before any body is read: a POST /v1/infer whose body cannot be taken, and
// a body sent anywhere else, are answered now (and the connection closes).
httplib::Server::HandlerResponse InferenceService::gate(const httplib::Request& req, httplib::Response& res) const {
  const std::size_t lengths = req.get_header_value_count("Content-Length");
  const std::string encoding = req.get_header_value("Transfer-Encoding");
  const bool chunked = equals_ignoring_case(encoding, "chunked");
  const bool has_body = chunked || !encoding.empty() || (lengths != 0 && req.get_header_value("Content-Length") != "0");
  if (req.path != "/v1/infer" || req.method != "POST") {
    if (!has_body) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 404;  // (405 where the path is served with another method)
    fill_error(req, res);
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  }
  if (!model_ready()) {
    res.set_header("Retry-After", "1");
    refuse_unread(res, 503, "unavailable", "the model is still loading; /readyz says when it is ready");
    return httplib::Server::HandlerResponse::Handled;
  }
  if (const std::optional<FramingFault> fault = framing_fault(req)) {
    refuse_unread(res, fault->code, fault->status, fault->message);
    return httplib::Server::HandlerResponse::Handled;
  }
  if (lengths == 0 && !chunked) {
    refuse_unread(res, 411, "length_required", "a body needs Content-Length (or Transfer-Encoding: chunked)");
    return httplib::Server::HandlerResponse::Handled;
  }
  if (lengths == 1) {
    std::uint64_t length = 0;
    if (std::string fault = parse_header_integer("Content-Length", req.get_header_value("Content-Length"), 0,
                                                 std::numeric_limits<std::uint64_t>::max(), length);
        !fault.empty()) {
      refuse_unread(res, 400, "invalid_request", fault);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (length > body_limit_) {
      refuse_unread(res, 413, "too_large",
                    "the body is " + std::to_string(length) + " bytes; the limit is " + std::to_string(body_limit_) +
                        " (--max-body-bytes; by default the largest batch as JSON)");
      return httplib::Server::HandlerResponse::Handled;
    }
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

void InferenceService::infer(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
  const Exchange* exchange = current_exchange();
  const Clock::time_point received = exchange != nullptr ? exchange->received : Clock::now();
  const Clock::time_point deadline =
      exchange != nullptr ? exchange->deadline : received + http_.limits().read_timeout;
  if (exchange != nullptr && !exchange->refusal.empty()) {
    // Refused at capacity: the body is dropped first (within the limits), so the 503 is read, not reset.
    std::size_t dropped = 0;
    read([&](const char*, std::size_t n) {
      dropped += n;
      return dropped <= body_limit_ && Clock::now() <= deadline;
    });
    res.set_header("Retry-After", "1");
    refuse_unread(res, 503, "unavailable", exchange->refusal);
    return;
  }
  std::string body;
  if (std::uint64_t length = 0; req.has_header("Content-Length") &&
                                 parse_header_integer("Content-Length", req.get_header_value("Content-Length"), 0,
                                                      body_limit_, length).empty()) {
    try {
      body.reserve(length);  // (gate() refused a larger one)
    } catch (const std::bad_alloc&) {
      // grown as it comes instead, while memory lasts
    }
  }
  bool over_limit = false;
  bool late = false;
  // A failure to hold the body (std::bad_alloc) is answered once the whole
  // body has been read (and dropped): a client still sending it then gets
  // its answer rather than a broken connection.
  std::exception_ptr failure;
  std::size_t taken = 0;
  const bool complete = read([&](const char* data, std::size_t n) {
    if (n > body_limit_ - taken) {
      over_limit = true;
      return false;
    }
    taken += n;
    // A body sent a byte at a time must still arrive within the read timeout of its head.
    if (Clock::now() > deadline) {
      late = true;
      return false;
    }
    if (failure == nullptr) {
      try {
        body.append(data, n);
      } catch (...) {
        failure = std::current_exception();
        std::string().swap(body);
      }
    }
    return true;
  });
  if (complete && failure != nullptr) {
    std::rethrow_exception(failure);  // (the exception handler answers 500)
  }
  if (!complete) {
    // (httplib gives up too when no byte comes within the read timeout: then the deadline has passed)
    if (late || (!over_limit && Clock::now() >= deadline)) {
      http_.count_read_timeout();
      refuse_unread(res, 408, "request_timeout",
                    "the body was not received within " + std::to_string(http_.limits().read_timeout.count()) +
                        " ms of its head (--read-timeout-ms)");
    } else if (over_limit) {
      http_.count_too_large();
      refuse_unread(res, 413, "too_large", "the body is larger than " + std::to_string(body_limit_) +
                                               " bytes (--max-body-bytes; by default the largest batch as JSON)");
    } else {
      refuse_unread(res, 400, "invalid_request",
                    "the body could not be read (the connection ended, or its chunks are malformed)");
    }
    return;
  }
  answer_infer(req, res, body, received);
}

void InferenceService::answer_infer(const httplib::Request& req, httplib::Response& res, std::string_view body,
                                   Clock::time_point received) {
  for (const char* name : {"X-Request-Id", "X-Timeout-Ms"}) {
    if (const std::size_t n = req.get_header_value_count(name); n > 1) {
      reply_error(res, 400, "invalid_request", std::string(name) + " appears " + std::to_string(n) + " times; give it once");
      return;
    }
  }
  std::optional<std::uint64_t> header_id;
  if (req.has_header("X-Request-Id")) {
    std::uint64_t v = 0;
    if (std::string fault = parse_header_integer("X-Request-Id", req.get_header_value("X-Request-Id"), 0,
                                                 std::numeric_limits<std::uint64_t>::max(), v);
        !fault.empty()) {
      reply_error(res, 400, "invalid_request", fault);
      return;
    }
    header_id = v;
  }
  std::uint64_t timeout_ms = static_cast<std::uint64_t>(options_.timeout_ms);
  if (req.has_header("X-Timeout-Ms")) {
    if (std::string fault = parse_header_integer("X-Timeout-Ms", req.get_header_value("X-Timeout-Ms"), 1, 3'600'000,
                                                 timeout_ms);
        !fault.empty()) {
      reply_error(res, 400, "invalid_request", fault);
      return;
    }
  }
  InferInput input;
  const bool json = req.get_header_value("Content-Type").find("json") != std::string::npos;
  if (std::string fault = json ? parse_json_input(body, row_, input) : parse_raw_input(body, row_, input); !fault.empty()) {
    reply_error(res, 400, "invalid_request", fault);
    return;
  }
  if (header_id && input.id && *header_id != *input.id) {
    reply_error(res, 400, "invalid_request",
                "X-Request-Id says " + std::to_string(*header_id) + " but \"id\" says " + std::to_string(*input.id));
    return;
  }
  const std::optional<std::uint64_t> id = header_id ? header_id : input.id;
  if (id) {
    res.set_header("X-Request-Id", std::to_string(*id));
  }

  // The deadline bounds the wait in the queue (the Batcher) and for the
  // batch (here): past it the HTTP thread answers 504 and moves on; the
  // request's result, if it comes, is dropped with its promise.
  replay::SubmitOptions submit;
  if (timeout_ms > 0) {
    submit.deadline = received + std::chrono::milliseconds(timeout_ms);
  }
  std::future<replay::BatchResult<float>> pending = batcher_->try_submit(input.values, submit);
  if (timeout_ms > 0 && pending.wait_until(submit.deadline) != std::future_status::ready) {
    reply_error(res, 504, "timed_out",
                "no answer within the deadline of " + std::to_string(timeout_ms) +
                    " ms (X-Timeout-Ms, else --timeout-ms): its batch is still running, and its answer is dropped");
    return;
  }
  const replay::BatchResult<float> result = pending.get();
  const int code = http_code(result.status);
  if (!result.ok()) {
    if (code == 503) {
      res.set_header("Retry-After", "1");
    }
    reply_error(res, code, replay::to_string(result.status), result.message);
    return;
  }
  res.set_header("X-Batch-Rows", std::to_string(result.batch_rows));
  if (id && !references_.empty()) {
    res.set_header("X-Replay-Check", check(*id, input.values, result.output) ? "ok" : "mismatch");
  }
  if (json) {
    res.set_content(json_outputs(result.output, out_row_, result.batch_rows), "application/json");
  } else {
    res.set_content(reinterpret_cast<const char*>(result.output.data()), result.output.size() * sizeof(float),
                    "application/octet-stream");
  }
}

// An error answer without a body (httplib's own: no route, a malformed head).
void InferenceService::fill_error(const httplib::Request& req, httplib::Response& res) const {
  std::string status = "error";
  std::string message;
  if (res.status == 404) {
    const auto served = std::find_if(endpoints.begin(), endpoints.end(),
                                     [&](const Endpoint& e) { return e.path == req.path; });
    if (served != endpoints.end()) {
      res.status = 405;
      res.set_header("Allow", std::string(served->methods));
      status = "method_not_allowed";
      message = req.method + " " + req.path + " is not served; " + req.path + " takes " + std::string(served->methods);
    } else {
      status = "not_found";
      message = "no endpoint " + req.method + " " + req.path + "; the endpoints are " + std::string(endpoint_list);
    }
  } else if (const std::optional<FramingFault> fault = res.status == 400 ? framing_fault(req) : std::nullopt) {
    res.status = fault->code;
    status = fault->status;
    message = fault->message;
  } else if (res.status == 400) {
    status = "invalid_request";
    message = "the request line or headers are malformed, or the method is not one HTTP/1.1 servers know";
  } else if (res.status == 414) {
    status = "too_large";
    message = "the request target is too long";
  } else if (res.status == 416) {
    status = "invalid_request";
    message = "the Range header is malformed";
  } else if (res.status == 413) {
    status = "too_large";
    message = "the body is too large";
  } else if (res.status == 500) {
    status = "internal_error";
    message = "the server failed while answering";
  } else {
    message = "HTTP status " + std::to_string(res.status);
  }
  res.set_content(json_error(status, message), "application/json");
}

void InferenceService::on_answer(const httplib::Request& req, const httplib::Response& res, Clock::duration latency) {
  metrics_.record(req.path == "/v1/infer" ? Metrics::Endpoint::infer : Metrics::Endpoint::other, res.status, latency);
}

// True when the answer is the reference for the request's id (bitwise).
bool InferenceService::check(unsigned long long id, const std::vector<float>& inputs, const std::vector<float>& output) {
  const std::size_t key = static_cast<std::size_t>(id % references_.size());
  bool derived = inputs.size() == row_;
  for (std::size_t j = 0; derived && j < row_; ++j) {
    derived = inputs[j] == input_value(key, j);
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

std::string InferenceService::summary() const {
  if (!model_ready()) {
    return "no model was loaded";
  }
  const replay::BatcherStats s = batcher_->stats();
  return std::to_string(s.completed) + " requests completed in " + std::to_string(s.batches) + " batches, " +
         std::to_string(s.timed_out) + " timed out, " + std::to_string(s.refused) + " refused, " +
         std::to_string(s.failed) + " failed";
}

std::string InferenceService::stats_json() const {
  const Readiness r = readiness();
  const ConnectionCounters& c = http_.counters();
  auto codes = [this](Metrics::Endpoint endpoint) {
    ordered_json counts = ordered_json::object();
    for (int code = 100; code < 600; ++code) {
      if (const std::uint64_t n = metrics_.code(endpoint, code); n != 0) {
        counts[std::to_string(code)] = n;
      }
    }
    return counts;
  };
  ordered_json j;
  j["model"] = model_ready() ? ordered_json(model_->describe()) : ordered_json(nullptr);
  j["ready"] = r.ready;
  if (!r.ready) {
    j["not_ready"] = r.why;
  }
  j["batching"] = options_.batching;
  j["max_queue_delay_us"] = options_.batching ? options_.max_queue_delay_us : 0;
  j["queue_capacity"] = options_.queue_capacity;
  if (model_ready()) {
    j["body_limit_bytes"] = body_limit_;
    const replay::BatcherStats s = batcher_->stats();
    j["max_batch_rows"] = batcher_->options().max_batch_rows;
    ordered_json histogram = ordered_json::object();
    for (std::size_t n = 1; n < s.batch_rows_histogram.size(); ++n) {
      if (s.batch_rows_histogram[n] != 0) {
        histogram[std::to_string(n)] = s.batch_rows_histogram[n];
      }
    }
    j["batcher"] = {{"enqueued", s.enqueued},
                    {"completed", s.completed},
                    {"failed", s.failed},
                    {"timed_out", s.timed_out},
                    {"refused", s.refused},
                    {"too_large", s.too_large},
                    {"invalid", s.invalid},
                    {"cancelled", s.cancelled},
                    {"rejected_shut_down", s.rejected_shut_down},
                    {"queue_depth", s.queue_depth},
                    {"batches", s.batches},
                    {"failed_batches", s.failed_batches},
                    {"rows", s.rows},
                    {"padded_rows", s.padded_rows},
                    {"mean_batch_rows", s.mean_batch_rows()},
                    {"padding_waste", s.padding_waste()},
                    {"queue_delay_p50_us", s.queue_delay_p50_us},
                    {"queue_delay_p99_us", s.queue_delay_p99_us},
                    {"batch_rows_histogram", std::move(histogram)}};
    j["router"] = ordered_json::parse(model_->router_stats_json(), nullptr, false);
  } else {
    j["batcher"] = nullptr;
    j["router"] = nullptr;
  }
  j["executor"] = {{"failures_in_a_row", health_.failures_in_a_row()}, {"last_failure", health_.last_failure()}};
  j["http"] = codes(Metrics::Endpoint::infer);
  j["http_other"] = codes(Metrics::Endpoint::other);
  j["connections"] = {{"accepted", c.accepted.load()},
                      {"refused", c.refused.load()},
                      {"health_at_capacity", c.health_at_capacity.load()},
                      {"read_timeouts", c.read_timeouts.load()},
                      {"too_large", c.too_large.load()}};
  j["verify"] = {{"references", references_.size()},
                 {"checked", metrics_.verified.load()},
                 {"mismatches", metrics_.mismatches.load()},
                 {"unverifiable", metrics_.unverifiable.load()}};
  return j.dump(2) + "\n";
}

std::string InferenceService::prometheus() const {
  std::string m;
  m += "# HELP replay_http_requests_total Answers written, by endpoint (/v1/infer or other) and HTTP status code.\n"
       "# TYPE replay_http_requests_total counter\n";
  for (const auto& [endpoint, label] :
       {std::pair{Metrics::Endpoint::infer, "/v1/infer"}, std::pair{Metrics::Endpoint::other, "other"}}) {
    for (int c = 100; c < 600; ++c) {
      if (const std::uint64_t n = metrics_.code(endpoint, c); n != 0) {
        m += std::string("replay_http_requests_total{endpoint=\"") + label + "\",code=\"" + std::to_string(c) + "\"} " +
             std::to_string(n) + "\n";
      }
    }
  }
  const ConnectionCounters& c = http_.counters();
  m += "# HELP replay_http_connections_total Connections accepted, and those refused at capacity (503).\n"
       "# TYPE replay_http_connections_total counter\n"
       "replay_http_connections_total{outcome=\"accepted\"} " + std::to_string(c.accepted.load()) + "\n"
       "replay_http_connections_total{outcome=\"refused\"} " + std::to_string(c.refused.load()) + "\n";
  m += "# HELP replay_http_read_timeouts_total Requests not received within --read-timeout-ms (408).\n"
       "# TYPE replay_http_read_timeouts_total counter\nreplay_http_read_timeouts_total " +
       std::to_string(c.read_timeouts.load()) + "\n";
  m += "# HELP replay_ready 1 while /readyz answers 200.\n# TYPE replay_ready gauge\nreplay_ready " +
       std::string(readiness().ready ? "1" : "0") + "\n";
  m += "# HELP replay_batch_failures_in_a_row Batches that failed since the last one that succeeded.\n"
       "# TYPE replay_batch_failures_in_a_row gauge\nreplay_batch_failures_in_a_row " +
       std::to_string(health_.failures_in_a_row()) + "\n";
  m += "# HELP replay_request_latency_seconds Time to answer /v1/infer, in the server, from the arrival of its head.\n"
       "# TYPE replay_request_latency_seconds histogram\n";
  std::uint64_t cumulative = 0;
  for (std::size_t b = 0; b < Metrics::bounds_us.size(); ++b) {
    cumulative += metrics_.latency_bucket(b);
    m += "replay_request_latency_seconds_bucket{le=\"" + format("%g", Metrics::bounds_us[b] * 1e-6) + "\"} " +
         std::to_string(cumulative) + "\n";
  }
  cumulative += metrics_.latency_bucket(Metrics::bounds_us.size());
  m += "replay_request_latency_seconds_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  m += "replay_request_latency_seconds_sum " + format("%.9f", metrics_.latency_sum_s()) +
       "\nreplay_request_latency_seconds_count " + std::to_string(cumulative) + "\n";
  m += "# HELP replay_verify_mismatches_total Answers that differed from the reference (--verify).\n"
       "# TYPE replay_verify_mismatches_total counter\nreplay_verify_mismatches_total " +
       std::to_string(metrics_.mismatches.load()) + "\n";
  if (!model_ready()) {
    return m;
  }
  const replay::BatcherStats s = batcher_->stats();
  m += "# HELP replay_batcher_requests_total Batcher requests by outcome.\n"
       "# TYPE replay_batcher_requests_total counter\n";
  const std::pair<const char*, std::uint64_t> outcomes[] = {
      {"ok", s.completed},       {"failed", s.failed},       {"timed_out", s.timed_out},
      {"queue_full", s.refused}, {"too_large", s.too_large}, {"invalid_request", s.invalid},
      {"shut_down", s.cancelled + s.rejected_shut_down}};
  for (const auto& [name, n] : outcomes) {
    m += std::string("replay_batcher_requests_total{status=\"") + name + "\"} " + std::to_string(n) + "\n";
  }
  m += "# HELP replay_batch_rows Real rows per batch run.\n# TYPE replay_batch_rows histogram\n";
  cumulative = 0;
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
  m += "# HELP replay_queue_depth Requests waiting in the Batcher's queue.\n# TYPE replay_queue_depth gauge\n"
       "replay_queue_depth " + std::to_string(s.queue_depth) + "\n";
  m += "# HELP replay_padding_waste Padded rows run per real row, minus one.\n# TYPE replay_padding_waste gauge\n"
       "replay_padding_waste " + format("%.6f", s.padding_waste()) + "\n";
  return m;
}

}  // namespace inference_server
