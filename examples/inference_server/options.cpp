#include "options.hpp"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace inference_server {
namespace {

// An integer flag in [min, max], listed under `group` in --help.
template <class T>
CLI::Option* bounded(CLI::App& app, const std::string& group, const std::string& name, T& value, T min, T max,
                     const std::string& help) {
  return app.add_option(name, value, help)->check(CLI::Range(min, max))->group(group);
}

}  // namespace

ServerOptions parse_options(int argc, char** argv) {
  ServerOptions o;
  CLI::App app{
      "inference_server: an HTTP inference server over replay::Batcher (see docs/batching.md).\n"
      "  POST /v1/infer   raw little-endian float32 rows, or JSON {\"inputs\": [[...], ...], \"id\": n}\n"
      "  GET  /v1/stats   JSON statistics;  GET /metrics   Prometheus text\n"
      "  GET  /healthz    liveness;  GET /readyz   readiness (503 while loading, draining or failing)\n"
      "SIGTERM or SIGINT drains (every accepted request is answered) and exits 0; a second one exits at once.",
      "inference_server"};
  app.option_defaults()->always_capture_default();
  app.add_option("--host", o.host, "Address to listen on");
  bounded(app, "Options", "--port", o.port, 0, 65535, "Port to listen on (0: any free port)");

  const std::string model = "Model";
  app.add_option("--model", o.model.kind, "mlp: CUDA kernels; cpu: the CPU stand-in (no GPU); resnet50: libtorch")
      ->check(CLI::IsMember({"mlp", "cpu", "resnet50"}))
      ->group(model);
  bool eager = false;
  app.add_flag("--eager", eager, "Launch the model's kernels without CUDA graphs (the baseline)")->group(model);
  CLI::Option* layers = bounded(app, model, "--layers", o.model.layers, 2, 1000, "MLP layers (cpu default: 4)");
  CLI::Option* width = bounded(app, model, "--width", o.model.width, 1, 1 << 16,
                               "MLP width: float32 values per input row (cpu default: 64)");
  bounded(app, model, "--outputs", o.model.outputs, 1, 1 << 16, "Values per output row");
  bounded(app, model, "--max-batch", o.model.max_batch, 1, 4096,
          "Largest batch (rows); buckets are the powers of two up to it");
  bounded(app, model, "--verify", o.verify, 0, 1'000'000,
          "Compute reference answers for request ids 0..K-1 at start (X-Replay-Check)");
  bounded(app, model, "--cpu-delay-us", o.model.cpu_delay_us, 0, 600'000'000, "cpu model: extra time per batch");
  bounded(app, model, "--cpu-fail-after", o.model.cpu_fail_after, -1, 1'000'000'000,
          "cpu model: every batch after the first N fails (-1: never)");
  bounded(app, model, "--cpu-load-ms", o.model.cpu_load_ms, 0, 600'000, "cpu model: time the model takes to load");

  const std::string batching_group = "Batching";
  std::string batching = "on";
  app.add_option("--batching", batching, "on: gather requests into batches; off: one request per run")
      ->check(CLI::IsMember({"on", "off"}))
      ->group(batching_group);
  bounded(app, batching_group, "--max-queue-delay-us", o.max_queue_delay_us, 0, 10'000'000,
          "Longest a request waits for others to join its batch");
  bounded(app, batching_group, "--queue-capacity", o.queue_capacity, 1, 1'000'000,
          "Requests waiting for a batch; beyond it a request gets 503");
  bounded(app, batching_group, "--timeout-ms", o.timeout_ms, 0, 3'600'000,
          "A request's deadline (X-Timeout-Ms overrides): past it, 504 and its HTTP thread is released (0: none)");

  const std::string limits = "Connections and limits";
  bounded(app, limits, "--threads", o.threads, 1, 4096, "Connections served at once (each holds a slot while it stays open)");
  bounded(app, limits, "--max-pending-connections", o.max_pending_connections, -1, 1'000'000,
          "Requests waiting for a slot (-1: as many as --threads); beyond them, 503 at once");
  bounded(app, limits, "--read-timeout-ms", o.read_timeout_ms, 1, 3'600'000,
          "Each wait for a request's bytes ends within this, and a whole body within this of its head, else 408");
  bounded(app, limits, "--write-timeout-ms", o.write_timeout_ms, 1, 3'600'000, "Each wait to send an answer ends within this");
  bounded(app, limits, "--keep-alive-timeout-ms", o.keep_alive_timeout_ms, 1, 3'600'000,
          "An idle kept-alive connection is closed after this");
  bounded(app, limits, "--keep-alive-max", o.keep_alive_max, 1, 1'000'000'000,
          "Requests per connection (the last answer says Connection: close)");
  bounded(app, limits, "--max-body-bytes", o.max_body_bytes, 0LL, 1LL << 40,
          "Largest request body, else 413 (0: --max-batch rows of the model as JSON, 32 bytes a number)");
  bounded(app, limits, "--drain-timeout-ms", o.drain_timeout_ms, 1, 3'600'000,
          "After SIGTERM, exit 1 if draining takes longer than this");
  bounded(app, limits, "--unready-after-failures", o.unready_after_failures, 1, 1'000'000,
          "Consecutive failed batches after which /readyz answers 503 (until a batch succeeds)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help (code 0) or the fault
    std::exit(code == 0 ? 0 : 2);
  }
  o.batching = batching == "on";
  o.model.graphs = !eager;
  if (o.model.kind == "cpu") {  // a small default: the CPU stand-in is for tests
    o.model.layers = layers->count() != 0 ? o.model.layers : 4;
    o.model.width = width->count() != 0 ? o.model.width : 64;
  }
  if (o.max_pending_connections < 0) {
    o.max_pending_connections = o.threads;
  }
  return o;
}

}  // namespace inference_server
