#pragma once
// Which connection is served when, and for how long: admission, request
// deadlines and the drain, over cpp-httplib's public API only (an
// httplib::Server owned as a plain object, its handlers, timeouts and a task
// queue of our own through new_task_queue), so the server builds against any
// release from Debian 12's 0.11 to the current one.
//
// Admission. httplib's acceptor hands each accepted connection to our task
// queue, which never blocks it: a pool of threads serves the connections
// (up to --threads + --max-pending-connections + 16 of them). A connection
// is served once its request's head is read and it holds one of --threads
// slots, for as long as it stays open; a request that finds no free slot
// waits for one among at most --max-pending-connections, and beyond that is
// answered 503 at once (with Retry-After and Connection: close). GET
// /healthz and /readyz take a free slot, else are answered without one, so
// they answer while every slot is held (e.g. by slow clients). While
// requests wait for a slot, every answer ends its connection, so the
// waiting are served in turn. No queue grows without bound: beyond 4096
// connections waiting for a thread, one is closed unanswered (httplib >=
// 0.15 lets a task queue refuse; before, it waits).
//
// Deadlines. httplib bounds each wait for bytes (the read timeout) and each
// wait to send (the write timeout). On top of that, a request's body must
// arrive within the read timeout of its head, or of the moment it got its
// slot (the body reader checks it; else 408). A head sent a byte at a time
// is bounded only per byte: httplib's public API gives no deadline for the
// whole head (it holds a thread, not a slot).
//
// Drain (drain(): SIGTERM). Connections accepted from then on are answered
// 503 (health checks answered); every answer says Connection: close.
// Connections accepted before are served, requests waiting for a slot
// included; once no connection waits for a thread and no request is in
// progress, httplib's stop() is called once: the listening socket closes,
// and idle kept-alive connections close at once (before 0.18.1 httplib
// does not close them: it waits for their keep-alive timeout, so
// wait_until_served() says when only they remain, and the process ends
// with them). A body still on its way must arrive within the read timeout
// of the drain's start.
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

namespace inference_server {

struct ConnectionLimits {
  std::size_t threads = 160;      // slots: connections served at once
  std::size_t max_pending = 160;  // requests waiting for a slot
  std::chrono::milliseconds read_timeout{10'000};   // each wait for bytes; a whole body after its head
  std::chrono::milliseconds write_timeout{10'000};  // each wait to send
  std::chrono::milliseconds keep_alive_timeout{2'000};
  std::size_t keep_alive_max = 100'000;  // requests per connection
};

struct ConnectionCounters {
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> refused{0};             // beyond capacity or draining: 503 (or closed unanswered)
  std::atomic<std::uint64_t> health_at_capacity{0};  // health checks answered without a slot
  std::atomic<std::uint64_t> read_timeouts{0};       // bodies not received within the read timeout (408)
  std::atomic<std::uint64_t> too_large{0};           // bodies that passed the limit while read (413)
};

// What the connection layer knows of the request this thread is serving.
struct Exchange {
  std::chrono::steady_clock::time_point received;  // when its head was there
  std::chrono::steady_clock::time_point deadline;  // its body must be there by then
  // Not empty: refused at capacity (or draining) with this message; its
  // body's reader drops the body, then answers 503 (Retry-After, Connection: close).
  std::string refusal;
};

// The exchange this thread serves (in a handler), else nullptr.
const Exchange* current_exchange();

class ConnectionServer {
 public:
  using Clock = std::chrono::steady_clock;
  using HandlerResponse = httplib::Server::HandlerResponse;
  using Gate = std::function<HandlerResponse(const httplib::Request&, httplib::Response&)>;
  using ErrorFill = std::function<void(const httplib::Request&, httplib::Response&)>;
  using AnswerObserver = std::function<void(const httplib::Request&, const httplib::Response&, Clock::duration)>;

  explicit ConnectionServer(ConnectionLimits limits);
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;
  ~ConnectionServer();

  // The routes and the exception handler go on this (before serve()); the
  // other hooks below, as the connection layer uses httplib's own.
  httplib::Server& routes() { return http_; }

  // ---- set before serve() ----
  // Called before routing, before any body is read: Handled means answered
  // (e.g. a body too large for its Content-Length); also for Expect: 100-continue.
  void set_request_gate(Gate gate) { gate_ = std::move(gate); }
  // Fills the body of an error answer that has none (404, a malformed head, ...).
  void set_error_body(ErrorFill fill) { error_body_ = std::move(fill); }
  // Called once for every answer, just before it is written, with the time since its head arrived.
  void set_answer_observer(AnswerObserver observer) { observer_ = std::move(observer); }
  // GET (and HEAD) paths answered without a slot while every slot is held.
  void set_health_paths(std::vector<std::string> paths) { health_paths_ = std::move(paths); }

  // Binds (port 0: any free port); returns the port, or -1.
  int bind(const std::string& host, int port);
  // Accepts and serves until drain() and every accepted connection is done.
  bool serve();
  // Begins the drain, from any thread; idempotent.
  void drain();
  // After drain(): waits until every admitted connection is served. True
  // when serve() returned (every connection closed); false when only
  // connections without a request remain that httplib does not close on
  // stop() (before 0.18.1 idle kept-alive ones wait for their keep-alive
  // timeout): the process may end with them.
  bool wait_until_served();
  bool draining() const { return draining_.load(std::memory_order_acquire); }

  // A body reader gave up at the exchange's deadline (408) or at its limit (413).
  void count_read_timeout() { counters_.read_timeouts.fetch_add(1, std::memory_order_relaxed); }
  void count_too_large() { counters_.too_large.fetch_add(1, std::memory_order_relaxed); }

  const ConnectionLimits& limits() const { return limits_; }
  const ConnectionCounters& counters() const { return counters_; }

 private:
  class AdmissionQueue;
  using Task = std::function<void()>;  // httplib's: serves one connection, then closes it

  bool admit(Task& task);  // on the acceptor; false: refused (closed unanswered)
  void run();              // a pool thread: serves connections one after the other
  bool take_slot(bool wait);
  void stop_listening();
  void finish();  // httplib's acceptor stopped: serve what was admitted, then stop the threads
  void begin_exchange();
  void start_body_clock();
  void end_request();
  void end_connection_after(httplib::Response& res) const;
  HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
  void post_route(const httplib::Request& req, httplib::Response& res);
  HandlerResponse on_error(const httplib::Request& req, httplib::Response& res);
  bool is_health(const httplib::Request& req) const;
  static void refuse(httplib::Response& res, const std::string& message);
  std::string refusal_message() const;

  httplib::Server http_;
  socket_t listening_socket_ = INVALID_SOCKET;  // (seen by httplib's socket-options hook)
  ConnectionLimits limits_;
  ConnectionCounters counters_;
  Gate gate_;
  ErrorFill error_body_;
  AnswerObserver observer_;
  std::vector<std::string> health_paths_;

  std::mutex mutex_;
  std::condition_variable task_ready_;
  std::condition_variable slot_freed_;
  std::condition_variable stopper_wake_;
  std::deque<Task> queued_;                // accepted, waiting for a thread
  std::vector<std::thread> threads_;       // the pool, started as needed
  std::size_t idle_threads_ = 0;
  std::size_t slots_free_;                 // of --threads
  std::size_t waiting_ = 0;                // requests waiting for a slot
  std::atomic<bool> line_waiting_{false};  // waiting_ > 0
  bool stopping_ = false;                  // httplib's acceptor stopped: the threads end once idle
  std::atomic<Clock::rep> drain_began_ns_{0};  // Clock's time since its epoch
  std::atomic<bool> draining_{false};
  std::atomic<std::size_t> requests_in_progress_{0};  // heads read, answers not yet written
  bool serve_returned_ = false;  // (under mutex_)
  std::atomic<bool> stopped_{false};     // httplib's stop() was called
  bool stop_called_ = false;     // (under mutex_)
};

}  // namespace inference_server
