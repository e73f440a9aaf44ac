#pragma once
// The server's command line (CLI11: `inference_server --help` lists every
// flag with its bounds and default).
#include <cstddef>
#include <string>

#include "model.hpp"

namespace inference_server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  bool batching = true;
  int max_queue_delay_us = 200;
  int queue_capacity = 1024;
  int timeout_ms = 2000;  // a request's deadline unless X-Timeout-Ms says otherwise; 0: none
  int verify = 0;         // ids 0..verify-1 get a reference answer to check against
  // Connections and their limits.
  int threads = 160;                  // slots: connections served at once
  int max_pending_connections = -1;   // requests waiting for a slot (-1: as many as --threads)
  int read_timeout_ms = 10'000;       // each wait for bytes; a whole body from its head (else 408)
  int write_timeout_ms = 10'000;      // each wait to send an answer
  int keep_alive_timeout_ms = 2'000;  // an idle kept-alive connection is closed after this
  int keep_alive_max = 100'000;       // requests per connection; the last one says Connection: close
  long long max_body_bytes = 0;       // 0: derived from the model (max_batch rows as JSON)
  int drain_timeout_ms = 30'000;      // after SIGTERM, exit 1 if the drain takes longer
  int unready_after_failures = 3;     // consecutive failed batches before /readyz says 503
  ModelConfig model;
};

// Parses argv; prints --help or the fault and exits (0 for --help, 2 for a
// bad command line) instead of returning.
ServerOptions parse_options(int argc, char** argv);

}  // namespace inference_server
