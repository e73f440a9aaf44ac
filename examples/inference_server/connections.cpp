#include "connections.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cerrno>
#include <exception>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "request.hpp"

namespace inference_server {
namespace {

// How long the front desk waits for a request line that may be a health check.
constexpr auto front_desk_peek_wait = std::chrono::milliseconds(250);
// How long a health check served beyond capacity may take to arrive.
constexpr auto front_desk_read_timeout = std::chrono::milliseconds(500);
// Connections waiting for the front desk; beyond them, 503 from the acceptor.
constexpr std::size_t front_desk_capacity = 4096;
// Bytes of head (request line and headers) a request may hold besides its body.
constexpr std::size_t head_allowance = 64 * 1024;
// How long an idle kept-alive connection that is to close (the drain, or
// others waiting for its worker) still waits for a request on its way.
constexpr auto closing_grace = std::chrono::milliseconds(50);
// How long a closing connection may still send before it is closed.
constexpr auto linger_time = std::chrono::milliseconds(2'000);

thread_local Exchange* this_exchange = nullptr;

void signal_event(int fd) {
  const std::uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}

bool readable_now(socket_t sock) {
  pollfd p{sock, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

int milliseconds_until(std::chrono::steady_clock::time_point t) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - std::chrono::steady_clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1'000'000));
}

}  // namespace

const Exchange* current_exchange() { return this_exchange; }

// httplib's acceptor hands each accepted socket to a task queue. This one
// runs the hand-over at once on the acceptor (process_and_close_socket,
// which admits without waiting), and its shutdown(), which httplib calls
// once the acceptor stopped, is the drain.
class ConnectionServer::AcceptorQueue final : public httplib::TaskQueue {
 public:
  explicit AcceptorQueue(ConnectionServer& server) : server_(server) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { server_.finish_drain(); }

 private:
  ConnectionServer& server_;
};

ConnectionServer::ConnectionServer(ConnectionLimits limits)
    : limits_(limits),
      drain_event_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      front_desk_event_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      closer_(std::chrono::duration_cast<std::chrono::milliseconds>(linger_time)) {
  if (drain_event_ < 0 || front_desk_event_ < 0) {
    throw std::runtime_error("inference_server: eventfd failed");
  }
  new_task_queue = [this] {
    start_threads();
    return new AcceptorQueue(*this);
  };
  set_tcp_nodelay(true);  // small answers: no Nagle delay (40 ms with delayed ACKs)
  // Only for the Keep-Alive header httplib writes: the connections' own loop applies the limits.
  set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>((limits_.keep_alive_timeout.count() + 999) / 1000)));
  set_keep_alive_max_count(limits_.keep_alive_max);
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
  set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    return pre_route(req, res) == HandlerResponse::Handled ? res.status : 100;
  });
  set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) { post_route(req, res); });
  set_error_handler(HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) { return on_error(req, res); }));
}

ConnectionServer::~ConnectionServer() {
  closer_.finish();
  ::close(drain_event_);
  ::close(front_desk_event_);
}

int ConnectionServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  if (bound >= 0) {
    // httplib listens with a backlog of 5; connections that arrive in a
    // burst wait there until accepted, so give them the system's maximum.
    (void)::listen(svr_sock_, SOMAXCONN);
  }
  return bound;
}

bool ConnectionServer::serve() {
  const bool ok = listen_after_bind();
  serve_returned_.store(true, std::memory_order_release);
  return ok;
}

void ConnectionServer::drain() {
  if (drain_called_.exchange(true)) {
    return;
  }
  mark_draining();
  // Connections that finished their handshake but are not accepted yet
  // wait in the listen backlog; accept them (the acceptor is still running)
  // before the listening socket closes, rather than reset them.
  const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(200);
  while (svr_sock_ != INVALID_SOCKET && readable_now(svr_sock_) && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // stop() acts only while listen_after_bind() runs, and asserts (in debug
  // builds) when called twice while it does: call it once, once it runs.
  while (!is_running() && !serve_returned_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!serve_returned_.load(std::memory_order_acquire)) {
    stop_listening();
  }
}

void ConnectionServer::stop_listening() {
  [[maybe_unused]] const bool again = stop_called_.exchange(true);
  assert(!again && "httplib::Server::stop() is called once");
  httplib::Server::stop();
}

void ConnectionServer::start_threads() {
  std::lock_guard lock(mutex_);
  idle_workers_ = limits_.threads;  // idle from the start, though not yet waiting
  for (std::size_t i = 0; i < limits_.threads; ++i) {
    workers_.emplace_back([this] { work(); });
  }
  front_desk_thread_ = std::thread([this] { front_desk(); });
}

void ConnectionServer::mark_draining() {
  Clock::rep unset = 0;
  drain_began_ns_.compare_exchange_strong(unset, Clock::now().time_since_epoch().count());
  draining_.store(true, std::memory_order_release);
  signal_event(drain_event_);
}

void ConnectionServer::finish_drain() {
  mark_draining();  // (already, unless the acceptor stopped on an error)
  {
    std::lock_guard lock(mutex_);
    front_desk_stop_ = true;
  }
  signal_event(front_desk_event_);
  if (front_desk_thread_.joinable()) {
    front_desk_thread_.join();  // it hands its last connections to the workers first
  }
  {
    std::lock_guard lock(mutex_);
    workers_stop_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) {
    worker.join();  // each serves what is pending before it stops
  }
  workers_.clear();
  closer_.finish();
}

// ---- admission ----------------------------------------------------------------

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  counters_.accepted.fetch_add(1, std::memory_order_relaxed);
  try {
    std::unique_lock lock(mutex_);
    if (idle_workers_ > pending_.size()) {
      pending_.push_back(sock);
      note_line();
      lock.unlock();
      work_ready_.notify_one();
      return true;
    }
    if (front_desk_in_.size() < front_desk_capacity && !front_desk_stop_) {
      front_desk_in_.push_back(sock);
      lock.unlock();
      signal_event(front_desk_event_);
      return true;
    }
  } catch (...) {
    // no memory for the queue: refused below
  }
  counters_.refused.fetch_add(1, std::memory_order_relaxed);
  answer_directly(sock, 503, "Service Unavailable", refusal_message(), Clock::now());
  return false;
}

// A worker if one is idle or a place among the pending is free; else 503 now.
void ConnectionServer::admit_or_refuse(socket_t sock) {
  {
    std::unique_lock lock(mutex_);
    if (idle_workers_ > pending_.size() || pending_.size() < limits_.max_pending) {
      pending_.push_back(sock);
      note_line();
      lock.unlock();
      work_ready_.notify_one();
      return;
    }
  }
  counters_.refused.fetch_add(1, std::memory_order_relaxed);
  answer_directly(sock, 503, "Service Unavailable", refusal_message(), Clock::now());
}

std::string ConnectionServer::refusal_message() const {
  return "the server is at capacity (" + std::to_string(limits_.threads) + " connections served and " +
         std::to_string(limits_.max_pending) +
         " waiting; --threads, --max-pending-connections); retry later";
}

// (Under mutex_.) Are connections waiting with no idle worker for them?
void ConnectionServer::note_line() {
  line_waiting_.store(pending_.size() > idle_workers_, std::memory_order_relaxed);
}

void ConnectionServer::work() {
  for (;;) {
    socket_t sock = INVALID_SOCKET;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [this] { return !pending_.empty() || workers_stop_; });
      if (pending_.empty()) {
        return;  // stopping, and nothing is left to serve
      }
      sock = pending_.front();
      pending_.pop_front();
      --idle_workers_;
      note_line();
    }
    serve_connection(sock, Mode::worker);
    std::lock_guard lock(mutex_);
    ++idle_workers_;
    note_line();
  }
}

// Is what the client sent so far the start of a health check, something
// else, or not yet telling? Peeks (leaves the bytes for whoever serves it).
ConnectionServer::Kind ConnectionServer::peek_kind(socket_t sock) const {
  std::array<char, 64> bytes{};
  const ssize_t n = ::recv(sock, bytes.data(), bytes.size(), MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    return Kind::gone;
  }
  if (n < 0) {
    return Kind::undecided;
  }
  const std::string_view seen(bytes.data(), static_cast<std::size_t>(n));
  bool may_be_health = false;
  for (const std::string& path : health_paths_) {
    for (const std::string_view method : {std::string_view("GET "), std::string_view("HEAD ")}) {
      const std::string line = std::string(method) + path;
      if (seen.size() > line.size() && seen.starts_with(line) && (seen[line.size()] == ' ' || seen[line.size()] == '?')) {
        return Kind::health;
      }
      may_be_health = may_be_health || (seen.size() <= line.size() && std::string_view(line).starts_with(seen));
    }
  }
  return may_be_health ? Kind::undecided : Kind::other;
}

// The connections that found no idle worker, all watched at once: a health
// check is answered here; anything else waits for a worker if there is
// room, else is answered 503. A line that may still become a health check
// is peeked at again every few milliseconds until the peek wait passes.
void ConnectionServer::front_desk() {
  struct Waiting {
    socket_t sock;
    Clock::time_point deadline;
    bool partial;  // bytes arrived but say nothing yet: peek again soon, not on readiness
  };
  std::vector<Waiting> waiting;
  std::vector<pollfd> fds;
  std::vector<std::size_t> watched;  // fds[i + 1] watches waiting[watched[i]]
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      for (const socket_t sock : front_desk_in_) {
        waiting.push_back({sock, Clock::now() + front_desk_peek_wait, false});
      }
      front_desk_in_.clear();
      if (front_desk_stop_ && waiting.empty()) {
        return;
      }
    }
    fds.assign(1, pollfd{front_desk_event_, POLLIN, 0});
    watched.clear();
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      next = std::min(next, waiting[i].partial ? Clock::now() + std::chrono::milliseconds(5) : waiting[i].deadline);
      if (!waiting[i].partial) {
        fds.push_back(pollfd{waiting[i].sock, POLLIN, 0});
        watched.push_back(i);
      }
    }
    (void)::poll(fds.data(), fds.size(), milliseconds_until(next));
    std::uint64_t events = 0;
    (void)!::read(front_desk_event_, &events, sizeof events);
    std::vector<bool> ready(waiting.size(), false);
    for (std::size_t i = 0; i < watched.size(); ++i) {
      ready[watched[i]] = fds[i + 1].revents != 0;
    }
    const Clock::time_point now = Clock::now();
    std::size_t kept = 0;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      Waiting w = waiting[i];
      const bool late = now >= w.deadline;
      Kind kind = w.partial || ready[i] || late ? peek_kind(w.sock) : Kind::undecided;
      if (kind == Kind::undecided && late) {
        kind = Kind::other;
      }
      switch (kind) {
        case Kind::undecided:
          w.partial = w.partial || ready[i];
          waiting[kept++] = w;
          break;
        case Kind::gone: closer_.close(w.sock); break;
        case Kind::health:
          counters_.health_at_capacity.fetch_add(1, std::memory_order_relaxed);
          serve_connection(w.sock, Mode::front_desk);
          break;
        case Kind::other: admit_or_refuse(w.sock); break;
      }
    }
    waiting.resize(kept);
  }
}

// ---- one connection -----------------------------------------------------------

// Waits for the connection's next request: true when its bytes are there.
// Idle kept-alive connections close at the keep-alive timeout, and soon
// (closing_grace) when the drain begins or while other connections wait for
// a worker (the worker goes to them); so during the drain a connection is
// served only for a request it has already sent (or, if it has sent none
// yet, its first).
bool ConnectionServer::wait_for_request(socket_t sock, const RequestStream& stream, std::size_t served) const {
  if (stream.has_buffered_input()) {
    return true;
  }
  const Clock::time_point idle_until = Clock::now() + limits_.keep_alive_timeout;
  for (;;) {
    const bool drain = draining();
    if (served > 0 && (drain || line_waiting_.load(std::memory_order_relaxed))) {
      // A request already on its way is still served (its answer closes).
      pollfd p{sock, POLLIN, 0};
      return ::poll(&p, 1, std::min(milliseconds_until(idle_until), static_cast<int>(closing_grace.count()))) > 0;
    }
    // (Looks at the line again every 100 ms while idle.)
    const Clock::time_point until =
        served > 0 ? std::min(idle_until, Clock::now() + std::chrono::milliseconds(100)) : idle_until;
    std::array<pollfd, 2> fds{pollfd{sock, POLLIN, 0}, pollfd{drain_event_, POLLIN, 0}};
    const int ready = ::poll(fds.data(), drain ? 1 : 2, milliseconds_until(until));
    if (ready < 0 && errno == EINTR) {
      continue;
    }
    if (ready < 0 || (ready == 0 && Clock::now() >= idle_until)) {
      return false;
    }
    if (fds[0].revents != 0) {
      return true;
    }
    // the drain began: look again as a draining connection
  }
}

void ConnectionServer::serve_connection(socket_t sock, Mode mode) {
  RequestStream stream(sock, limits_.write_timeout);
  const bool front = mode == Mode::front_desk;
  std::size_t served = 0;
  for (bool keep = true; keep;) {
    if (!wait_for_request(sock, stream, served)) {
      break;
    }
    Exchange exchange;
    exchange.received = Clock::now();
    exchange.beyond_capacity = front;
    exchange.last = front || draining() || served + 1 >= limits_.keep_alive_max;
    exchange.stream = &stream;
    this_exchange = &exchange;
    stream.begin_request(read_deadline(exchange.received, front),
                         byte_cap_.load(std::memory_order_relaxed) + head_allowance);
    bool closed_by_client = false;
    bool written = false;
    try {
      written = process_request(stream, exchange.last, closed_by_client, nullptr);
    } catch (...) {
      // the exception handler failed too (out of memory): close, answering 500 if nothing was sent
      if (!stream.answer_started()) {
        answer_directly(sock, 500, "Internal Server Error", "the server failed while answering", exchange.received);
        sock = INVALID_SOCKET;
      }
    }
    this_exchange = nullptr;
    ++served;
    if (sock != INVALID_SOCKET && !stream.answer_started() && stream.bytes_read() > 0 &&
        (stream.timed_out() || stream.over_cap())) {
      // httplib gives up on an unfinished request line without answering; answer it
      const bool late = stream.timed_out();
      (late ? counters_.read_timeouts : counters_.too_large).fetch_add(1, std::memory_order_relaxed);
      answer_directly(sock, late ? 408 : 413, late ? "Request Timeout" : "Payload Too Large",
                      late ? "the request was not received within the read timeout"
                           : "the request line is longer than the request may be",
                      exchange.received);
      sock = INVALID_SOCKET;
    }
    keep = sock != INVALID_SOCKET && written && !closed_by_client && !exchange.last;
  }
  if (sock != INVALID_SOCKET) {
    closer_.close(sock);
  }
}

// A request must arrive within the read timeout; during the drain, also
// within the read timeout of the drain's start, so that connections served
// late (they waited for a worker) do not make the drain last longer: what
// they have already sent is still read, as a read waits only for bytes that
// are not there yet.
ConnectionServer::Clock::time_point ConnectionServer::read_deadline(Clock::time_point received, bool front) const {
  const Clock::duration timeout = front ? Clock::duration(front_desk_read_timeout) : Clock::duration(limits_.read_timeout);
  Clock::time_point deadline = received + timeout;
  if (draining()) {
    const Clock::time_point began{Clock::duration(drain_began_ns_.load(std::memory_order_relaxed))};
    deadline = std::min(deadline, began + timeout);
  }
  return deadline;
}

// Writes a whole answer (503 at capacity, 408, ...) without httplib, records
// it, and closes the connection.
void ConnectionServer::answer_directly(socket_t sock, int status, const std::string& reason, const std::string& message,
                                       Clock::time_point received) {
  std::string body;
  try {
    body = json_error(status == 503 ? "unavailable" : status == 408 ? "request_timeout" : "error", message);
  } catch (...) {
  }
  const std::string answer = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                             "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                             (status == 503 ? "\r\nRetry-After: 1" : "") + "\r\nConnection: close\r\n\r\n" + body;
  if (observer_ != nullptr) {
    httplib::Request req;
    httplib::Response res;
    res.status = status;
    observer_(req, res, Clock::now() - received);
  }
  (void)::send(sock, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);  // small: fits the send buffer
  closer_.close(sock);
}

// ---- httplib's hooks -----------------------------------------------------------

bool ConnectionServer::is_health(const httplib::Request& req) const {
  return (req.method == "GET" || req.method == "HEAD") &&
         std::find(health_paths_.begin(), health_paths_.end(), req.path) != health_paths_.end();
}

httplib::Server::HandlerResponse ConnectionServer::pre_route(const httplib::Request& req, httplib::Response& res) {
  if (this_exchange != nullptr && this_exchange->beyond_capacity && !is_health(req)) {
    res.status = 503;
    res.set_header("Retry-After", "1");
    res.set_content(json_error("unavailable", refusal_message()), "application/json");
    return HandlerResponse::Handled;
  }
  return gate_ != nullptr ? gate_(req, res) : HandlerResponse::Unhandled;
}

// Every answer, just before it is written: one that ends its connection
// says so (and only so), and the observer counts it. While
// connections wait for a worker, every answer ends its connection, so that
// busy kept-alive clients take their turn rather than hold the workers.
void ConnectionServer::post_route(const httplib::Request& req, httplib::Response& res) {
  const auto connection = res.headers.find("Connection");
  const bool close = (this_exchange != nullptr && this_exchange->last) || draining() ||
                     line_waiting_.load(std::memory_order_relaxed) ||
                     (connection != res.headers.end() && connection->second == "close");
  if (close) {
    res.headers.erase("Connection");
    res.headers.erase("Keep-Alive");
    res.set_header("Connection", "close");
    if (this_exchange != nullptr) {
      this_exchange->last = true;
    }
  }
  // Counted before it is written: a client that has its answer finds it counted.
  if (observer_ != nullptr && this_exchange != nullptr) {
    observer_(req, res, Clock::now() - this_exchange->received);
  }
}

// An answer of 400 or more: a request that failed to arrive in time or in
// size is said to have (httplib says 400), and one without a body gets one.
// (Called before the answer's Connection header is written.)
httplib::Server::HandlerResponse ConnectionServer::on_error(const httplib::Request& req, httplib::Response& res) {
  const RequestStream* stream = this_exchange != nullptr ? this_exchange->stream : nullptr;
  if (stream != nullptr && stream->timed_out()) {
    counters_.read_timeouts.fetch_add(1, std::memory_order_relaxed);
    res.status = 408;
    res.set_header("Connection", "close");
    res.set_content(json_error("request_timeout", "the request was not received within " +
                                                      std::to_string(limits_.read_timeout.count()) +
                                                      " ms (--read-timeout-ms)"),
                    "application/json");
  } else if (stream != nullptr && stream->over_cap()) {
    counters_.too_large.fetch_add(1, std::memory_order_relaxed);
    res.status = 413;
    res.set_header("Connection", "close");
    res.set_content(json_error("too_large", "the request is larger than " +
                                                std::to_string(byte_cap_.load(std::memory_order_relaxed) +
                                                               head_allowance) +
                                                " bytes, head and body"),
                    "application/json");
  } else if (res.body.empty()) {
    // httplib's own error (a malformed head, no such route): the request's
    // framing may be unknown, so the connection ends with the answer.
    res.set_header("Connection", "close");
    if (error_body_ != nullptr) {
      error_body_(req, res);
    }
  }
  return HandlerResponse::Handled;  // (httplib then sets Content-Length for the new body)
}

}  // namespace inference_server
