#pragma once
// Which connection is served when, and for how long: admission, connection
// lifetimes and the drain, under cpp-httplib (which parses each request and
// writes each answer).
//
// Admission. The acceptor never waits: a new connection goes to an idle
// worker (--threads of them), else it waits for one among at most
// --max-pending-connections, and beyond that it is answered 503 at once
// (with Retry-After), never queued without bound. Health checks get through
// even then: a connection that finds no idle worker first passes a front
// desk, one thread that watches all such connections at once and peeks at
// their request line (not consuming it); GET /healthz and /readyz are
// answered right there, so they answer while every worker is held, e.g. by
// clients that send a byte at a time.
//
// Lifetimes. A whole request (head and body) must arrive within the read
// timeout (else 408, and the connection closes), a whole answer must leave
// within the write timeout; a kept-alive connection waits for its next
// request at most the keep-alive timeout and serves at most keep_alive_max
// requests. While connections wait for a worker, answers end their
// connections and idle ones close, so the waiting are served in turn rather
// than behind clients that keep their connection busy. Every answer that ends a connection says `Connection: close`,
// and connections are closed by a LingeringCloser, so a client that is still
// sending receives its answer rather than a reset.
//
// Drain (drain(): SIGTERM). httplib's stop() is called once and no
// connection is accepted any more; those already accepted are still served,
// the ones waiting for a worker included: each answers the request it has
// sent, with `Connection: close`, and idle kept-alive connections are closed
// at once. serve() returns when every one is done.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lingering_closer.hpp"
#include "request_stream.hpp"

namespace inference_server {

struct ConnectionLimits {
  std::size_t threads = 160;      // workers: connections served at once
  std::size_t max_pending = 160;  // accepted connections waiting for a worker
  std::chrono::milliseconds read_timeout{10'000};   // a whole request
  std::chrono::milliseconds write_timeout{10'000};  // a whole answer
  std::chrono::milliseconds keep_alive_timeout{2'000};
  std::size_t keep_alive_max = 100'000;  // requests per connection
};

struct ConnectionCounters {
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> refused{0};            // beyond capacity: answered 503 at once
  std::atomic<std::uint64_t> health_at_capacity{0};  // health checks answered by the front desk
  std::atomic<std::uint64_t> read_timeouts{0};       // requests not received within the read timeout (408)
  std::atomic<std::uint64_t> too_large{0};           // requests over their byte cap (413)
};

// What the connection layer knows of the request this thread is serving.
struct Exchange {
  std::chrono::steady_clock::time_point received;  // when its first byte was there
  bool beyond_capacity = false;                    // served by the front desk (health checks only)
  bool last = false;                               // the connection closes after this answer
  const RequestStream* stream = nullptr;
};

// The exchange this thread serves (in a handler), else nullptr.
const Exchange* current_exchange();

class ConnectionServer final : public httplib::Server {
 public:
  using Clock = std::chrono::steady_clock;
  using AnswerObserver = std::function<void(const httplib::Request&, const httplib::Response&, Clock::duration)>;

  explicit ConnectionServer(ConnectionLimits limits);
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;
  ~ConnectionServer() override;

  // ---- set before serve() ----
  // Called before routing, before any body is read: Handled means answered
  // (e.g. a body too large for its Content-Length); also for Expect: 100-continue.
  void set_request_gate(HandlerWithResponse gate) { gate_ = std::move(gate); }
  // Fills the body of an error answer that has none (404, a malformed head, ...).
  void set_error_body(Handler fill) { error_body_ = std::move(fill); }
  // Called once for every answer, as it is written, with the time since its request's first byte.
  void set_answer_observer(AnswerObserver observer) { observer_ = std::move(observer); }
  // GET (and HEAD) paths the front desk answers beyond capacity.
  void set_health_paths(std::vector<std::string> paths) { health_paths_ = std::move(paths); }

  // Bytes one request may hold, head and body (any time).
  void set_request_byte_cap(std::size_t bytes) { byte_cap_.store(bytes, std::memory_order_relaxed); }

  // Binds (port 0: any free port); returns the port, or -1.
  int bind(const std::string& host, int port);
  // Accepts and serves until drain() and every accepted connection is done.
  bool serve();
  // Begins the drain, from any thread; idempotent.
  void drain();
  // httplib's stop() asserts (in debug builds) when called again while the
  // server runs: only drain() calls it, once (stop_listening()).
  void stop() = delete;
  bool draining() const { return draining_.load(std::memory_order_acquire); }

  const ConnectionLimits& limits() const { return limits_; }
  const ConnectionCounters& counters() const { return counters_; }

 private:
  class AcceptorQueue;
  enum class Mode { worker, front_desk };
  enum class Kind { health, other, undecided, gone };

  bool process_and_close_socket(socket_t sock) override;  // on the acceptor: admits
  void start_threads();
  void mark_draining();
  void stop_listening();
  void finish_drain();  // the acceptor stopped: serve what was accepted, then stop the threads
  void work();
  void front_desk();
  Kind peek_kind(socket_t sock) const;
  void admit_or_refuse(socket_t sock);
  void note_line();
  void serve_connection(socket_t sock, Mode mode);
  bool wait_for_request(socket_t sock, const RequestStream& stream, std::size_t served) const;
  Clock::time_point read_deadline(Clock::time_point received, bool front) const;
  void answer_directly(socket_t sock, int status, const std::string& reason, const std::string& message,
                       Clock::time_point received);
  HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
  void post_route(const httplib::Request& req, httplib::Response& res);
  HandlerResponse on_error(const httplib::Request& req, httplib::Response& res);
  bool is_health(const httplib::Request& req) const;
  std::string refusal_message() const;

  ConnectionLimits limits_;
  ConnectionCounters counters_;
  std::atomic<std::size_t> byte_cap_{64 * 1024};
  HandlerWithResponse gate_;
  Handler error_body_;
  AnswerObserver observer_;
  std::vector<std::string> health_paths_;

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<socket_t> pending_;       // waiting for a worker
  std::deque<socket_t> front_desk_in_;  // waiting for the front desk
  std::size_t idle_workers_ = 0;
  std::atomic<bool> line_waiting_{false};  // pending_.size() > idle_workers_
  bool workers_stop_ = false;
  bool front_desk_stop_ = false;
  std::vector<std::thread> workers_;
  std::thread front_desk_thread_;
  int drain_event_ = -1;       // an eventfd, readable once the drain began: wakes idle connections
  int front_desk_event_ = -1;  // an eventfd: a connection for the front desk, or its stop
  LingeringCloser closer_;

  std::atomic<Clock::rep> drain_began_ns_{0};  // Clock's time since its epoch
  std::atomic<bool> draining_{false};
  std::atomic<bool> drain_called_{false};
  std::atomic<bool> serve_returned_{false};
  std::atomic<bool> stop_called_{false};
};

}  // namespace inference_server
