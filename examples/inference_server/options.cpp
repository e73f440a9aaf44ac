#include "options.hpp"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace inference_server {

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
  std::string batching = "on";
  app.add_option("--host", o.host, "Address to listen on");
  app.add_option("--port", o.port, "Port to listen on (0: any free port)")->check(CLI::Range(0, 65535));

  const std::string model_group = "Model";
  app.add_option("--model", o.model.kind, "mlp: CUDA kernels; cpu: the CPU stand-in (no GPU); resnet50: libtorch")
      ->check(CLI::IsMember({"mlp", "cpu", "resnet50"}))
      ->group(model_group);
  bool eager = false;
  app.add_flag("--eager", eager, "Launch the model's kernels without CUDA graphs (the baseline)")->group(model_group);
  CLI::Option* layers = app.add_option("--layers", o.model.layers, "MLP layers (cpu default: 4)")
                            ->check(CLI::Range(2, 1000))
                            ->group(model_group);
  CLI::Option* width = app.add_option("--width", o.model.width, "MLP width: float32 values per input row (cpu default: 64)")
                           ->check(CLI::Range(1, 1 << 16))
                           ->group(model_group);
  app.add_option("--outputs", o.model.outputs, "Values per output row")->check(CLI::Range(1, 1 << 16))->group(model_group);
  app.add_option("--max-batch", o.model.max_batch, "Largest batch (rows); buckets are the powers of two up to it")
      ->check(CLI::Range(1, 4096))
      ->group(model_group);
  app.add_option("--verify", o.verify, "Compute reference answers for request ids 0..K-1 at start (X-Replay-Check)")
      ->check(CLI::Range(0, 1'000'000))
      ->group(model_group);
  app.add_option("--cpu-delay-us", o.model.cpu_delay_us, "cpu model: extra time per batch")
      ->check(CLI::Range(0, 600'000'000))
      ->group(model_group);
  app.add_option("--cpu-fail-after", o.model.cpu_fail_after, "cpu model: every batch after the first N fails (-1: never)")
      ->check(CLI::Range(-1, 1'000'000'000))
      ->group(model_group);
  app.add_option("--cpu-load-ms", o.model.cpu_load_ms, "cpu model: time the model takes to load")
      ->check(CLI::Range(0, 600'000))
      ->group(model_group);

  const std::string batching_group = "Batching";
  app.add_option("--batching", batching, "on: gather requests into batches; off: one request per run")
      ->check(CLI::IsMember({"on", "off"}))
      ->group(batching_group);
  app.add_option("--max-queue-delay-us", o.max_queue_delay_us, "Longest a request waits for others to join its batch")
      ->check(CLI::Range(0, 10'000'000))
      ->group(batching_group);
  app.add_option("--queue-capacity", o.queue_capacity, "Requests waiting for a batch; beyond it a request gets 503")
      ->check(CLI::Range(1, 1'000'000))
      ->group(batching_group);
  app.add_option("--timeout-ms", o.timeout_ms,
                 "A request's deadline (X-Timeout-Ms overrides): past it, 504 and its HTTP thread is released (0: none)")
      ->check(CLI::Range(0, 3'600'000))
      ->group(batching_group);

  const std::string limits_group = "Connections and limits";
  app.add_option("--threads", o.threads, "HTTP worker threads: connections served at once")
      ->check(CLI::Range(1, 4096))
      ->group(limits_group);
  app.add_option("--max-pending-connections", o.max_pending_connections,
                 "Accepted connections waiting for a worker (-1: as many as --threads); beyond them, 503 at once")
      ->check(CLI::Range(-1, 1'000'000))
      ->group(limits_group);
  app.add_option("--read-timeout-ms", o.read_timeout_ms, "A whole request (head and body) must arrive within this, else 408")
      ->check(CLI::Range(1, 3'600'000))
      ->group(limits_group);
  app.add_option("--write-timeout-ms", o.write_timeout_ms, "A whole response must be sent within this")
      ->check(CLI::Range(1, 3'600'000))
      ->group(limits_group);
  app.add_option("--keep-alive-timeout-ms", o.keep_alive_timeout_ms, "An idle kept-alive connection is closed after this")
      ->check(CLI::Range(1, 3'600'000))
      ->group(limits_group);
  app.add_option("--keep-alive-max", o.keep_alive_max, "Requests per connection (the last answer says Connection: close)")
      ->check(CLI::Range(1, 1'000'000'000))
      ->group(limits_group);
  app.add_option("--max-body-bytes", o.max_body_bytes,
                 "Largest request body, else 413 (0: --max-batch rows of the model as JSON, 32 bytes a number)")
      ->check(CLI::Range(0LL, 1LL << 40))
      ->group(limits_group);
  app.add_option("--drain-timeout-ms", o.drain_timeout_ms, "After SIGTERM, exit 1 if draining takes longer than this")
      ->check(CLI::Range(1, 3'600'000))
      ->group(limits_group);
  app.add_option("--unready-after-failures", o.unready_after_failures,
                 "Consecutive failed batches after which /readyz answers 503 (until a batch succeeds)")
      ->check(CLI::Range(1, 1'000'000))
      ->group(limits_group);

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
