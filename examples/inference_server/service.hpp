#pragma once
// The server's endpoints over a model and a replay::Batcher:
//   POST /v1/infer   raw float32 rows or JSON (request.hpp); the answer's rows
//   GET  /v1/stats   JSON: the Batcher's and router's statistics, answer and connection counts
//   GET  /metrics    the same in Prometheus text format
//   GET  /healthz    liveness: 200 while the process answers
//   GET  /readyz     readiness: 503 while the model loads, while draining, or
//                    after --unready-after-failures failed batches in a row
// The model arrives after the server listens (set_model()): until then
// /v1/infer answers 503, so health checks answer while it loads.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "connections.hpp"
#include "metrics.hpp"
#include "model.hpp"
#include "options.hpp"
#include "replay/batcher/batcher.hpp"

namespace inference_server {

class InferenceService {
 public:
  using Clock = std::chrono::steady_clock;

  InferenceService(ServerOptions options, ConnectionServer& http);
  InferenceService(const InferenceService&) = delete;
  InferenceService& operator=(const InferenceService&) = delete;

  // Routes and hooks on the server: before it serves.
  void install();
  // The model is loaded: computes the references (--verify), starts the
  // Batcher, sets the body limit, and /readyz turns 200.
  void set_model(std::unique_ptr<Model> model);
  // SIGTERM: /readyz turns 503 (requests are still answered).
  void begin_drain() { draining_.store(true, std::memory_order_release); }
  // After the last connection: the Batcher runs what it holds, then stops.
  void shutdown();

  std::size_t body_limit() const { return model_ready() ? body_limit_ : 0; }
  std::string summary() const;  // one line, for the log at exit

 private:
  struct Readiness {
    bool ready;
    std::string why;  // when not ready
  };
  Readiness readiness() const;
  bool model_ready() const { return model_ready_.load(std::memory_order_acquire); }

  httplib::Server::HandlerResponse gate(const httplib::Request& req, httplib::Response& res) const;
  void infer(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read);
  void answer_infer(const httplib::Request& req, httplib::Response& res, std::string_view body,
                    Clock::time_point received);
  void fill_error(const httplib::Request& req, httplib::Response& res) const;
  void on_answer(const httplib::Request& req, const httplib::Response& res, Clock::duration latency);
  bool check(unsigned long long id, const std::vector<float>& inputs, const std::vector<float>& output);
  std::string stats_json() const;
  std::string prometheus() const;

  ServerOptions options_;
  ConnectionServer& http_;
  Metrics metrics_;
  BatchHealth health_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> model_ready_{false};
  // Written once by set_model(), before model_ready_ says so.
  std::unique_ptr<Model> model_;
  std::size_t row_ = 0;
  std::size_t out_row_ = 0;
  float tolerance_ = 0.0F;
  std::size_t body_limit_ = 0;
  std::vector<std::vector<float>> references_;
  std::unique_ptr<replay::Batcher<ModelExecutor>> batcher_;
};

}  // namespace inference_server
