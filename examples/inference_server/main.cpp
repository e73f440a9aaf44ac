// inference_server: an HTTP inference server over replay::Batcher.
// (inference_server_torch, built where libtorch is found, also serves
// --model resnet50 through the libtorch adapter.)
//
// Requests from many connections are gathered into batches (up to the
// model's batch buckets, waiting at most --max-queue-delay-us) and run as one
// bucketed CUDA-graph replay each (a ShapeRouter behind replay's
// StagedCudaExecutor), or eagerly (--eager), or on the CPU stand-in model
// (--model cpu, for tests without a GPU). See docs/batching.md and --help.
//
//   options.*           the command line (CLI11)
//   request.*           a request's body and header values, read strictly (nlohmann_json)
//   connections.*       admission (bounded; 503 beyond), health checks at capacity,
//                       body deadlines, drain; over cpp-httplib's public API only
//   service.*           the endpoints over the model and the Batcher
//   main.cpp            start-up, signals, shutdown
//
// The server listens before the model is loaded (/healthz answers, /readyz
// says 503 until it is ready). SIGTERM or SIGINT: stop accepting, answer
// every request already accepted (the last answer on each connection says
// Connection: close), let the Batcher finish, exit 0; past
// --drain-timeout-ms, exit 1. A second SIGTERM or SIGINT exits at once.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "connections.hpp"
#include "model.hpp"
#include "options.hpp"
#include "service.hpp"

namespace {

using inference_server::ServerOptions;
using Clock = std::chrono::steady_clock;

std::unique_ptr<inference_server::Model> load_model(const inference_server::ModelConfig& config) {
  if (config.kind == "cpu") {
    return inference_server::make_cpu_model(config);
  }
  if (config.kind == "resnet50") {
#ifdef INFERENCE_SERVER_WITH_TORCH
    return inference_server::make_torch_resnet(config);
#else
    throw std::runtime_error("--model resnet50 is served by inference_server_torch (built where libtorch is found)");
#endif
  }
  return inference_server::make_gpu_mlp(config);
}

const char* signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal"; }

// The signal thread: the first SIGTERM or SIGINT begins the drain; a second
// one, or the drain outlasting its bound, ends the process at once. SIGUSR1
// with `finished` set is main saying the process is done.
void watch_signals(const sigset_t& signals, inference_server::ConnectionServer& http,
                   inference_server::InferenceService& service, const std::atomic<bool>& finished,
                   std::chrono::milliseconds drain_timeout) {
  int first = 0;
  do {
    if (sigwait(&signals, &first) != 0) {
      return;
    }
  } while (first == SIGUSR1 && !finished.load());
  if (first == SIGUSR1) {
    return;
  }
  const Clock::time_point give_up = Clock::now() + drain_timeout;
  std::printf("inference_server: %s: draining (every accepted request is answered; a second signal exits at once)\n",
              signal_name(first));
  std::fflush(stdout);
  service.begin_drain();
  http.drain();
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(give_up - Clock::now());
    const timespec wait{static_cast<std::time_t>(std::max<long long>(left.count(), 0) / 1'000'000'000),
                        static_cast<long>(std::max<long long>(left.count(), 0) % 1'000'000'000)};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGUSR1 && finished.load()) {
      return;
    }
    if (sig == SIGTERM || sig == SIGINT) {
      std::fprintf(stderr, "inference_server: second signal (%s): exiting at once; requests in flight are not answered\n",
                   signal_name(sig));
      std::_Exit(128 + sig);
    }
    if (sig < 0 && errno == EAGAIN) {
      std::fprintf(stderr, "inference_server: the drain took longer than %lld ms (--drain-timeout-ms): exiting\n",
                   static_cast<long long>(drain_timeout.count()));
      std::_Exit(1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const ServerOptions options = inference_server::parse_options(argc, argv);

  // Every thread started from here on inherits the blocked signals; one
  // thread waits for them (sigwait), so no handler runs in a random thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  inference_server::ConnectionLimits limits;
  limits.threads = static_cast<std::size_t>(options.threads);
  limits.max_pending = static_cast<std::size_t>(options.max_pending_connections);
  limits.read_timeout = std::chrono::milliseconds(options.read_timeout_ms);
  limits.write_timeout = std::chrono::milliseconds(options.write_timeout_ms);
  limits.keep_alive_timeout = std::chrono::milliseconds(options.keep_alive_timeout_ms);
  limits.keep_alive_max = static_cast<std::size_t>(options.keep_alive_max);
  std::unique_ptr<inference_server::ConnectionServer> http;
  try {
    http = std::make_unique<inference_server::ConnectionServer>(limits);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "inference_server: cannot start: %s\n", e.what());
    return 1;
  }
  inference_server::InferenceService service(options, *http);
  service.install();
  const int port = http->bind(options.host, options.port);
  if (port < 0) {
    std::fprintf(stderr, "inference_server: cannot listen on %s:%d\n", options.host.c_str(), options.port);
    return 1;
  }
  std::printf("inference_server: cpp-httplib %s\n", CPPHTTPLIB_VERSION);
  std::printf("inference_server: accepting connections on http://%s:%d; loading the model (/readyz: 503 until ready)\n",
              options.host.c_str(), port);
  std::fflush(stdout);

  std::atomic<bool> finished{false};
  std::thread signal_thread(watch_signals, std::cref(signals), std::ref(*http), std::ref(service), std::cref(finished),
                            std::chrono::milliseconds(options.drain_timeout_ms));
  bool listened = false;
  std::thread listener([&] { listened = http->serve(); });

  int status = 0;
  try {
    std::unique_ptr<inference_server::Model> model = load_model(options.model);
    std::printf("inference_server: model: %s\n", model->describe().c_str());
    service.set_model(std::move(model));
    if (http->draining()) {
      std::printf("inference_server: the model is ready, but the server is draining\n");
    } else {
      std::printf("inference_server: listening on http://%s:%d (batching %s, max queue delay %d us, body limit %zu bytes)\n",
                  options.host.c_str(), port, options.batching ? "on" : "off",
                  options.batching ? options.max_queue_delay_us : 0, service.body_limit());
    }
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "inference_server: cannot start: %s\n", e.what());
    status = 1;
    http->drain();
  }
  // After the drain, once every accepted connection is answered.
  const bool every_connection_closed = http->wait_until_served();
  if (every_connection_closed) {
    listener.join();
  }
  service.shutdown();
  std::printf("inference_server: stopped: %s\n", service.summary().c_str());
  std::fflush(stdout);
  finished.store(true);
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  if (!every_connection_closed) {
    // Idle kept-alive connections that httplib before 0.18.1 keeps until
    // their keep-alive timeout even once stopped: every request is
    // answered, so the process ends now, closing them.
    std::fflush(nullptr);
    std::_Exit(status);
  }
  return status != 0 ? status : (listened ? 0 : 1);
}
