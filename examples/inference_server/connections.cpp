#include "connections.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cassert>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>

#include "request.hpp"

namespace inference_server {
namespace {

// Threads beyond --threads and --max-pending-connections, for health checks
// and refusals while every slot is held (see connections.hpp); and accepted
// connections waiting for a thread, beyond which a connection is refused.
constexpr std::size_t spare_threads = 16;
constexpr std::size_t queue_capacity = 4096;
// Once no accepted connection waits for a thread any more, how long the
// drain still leaves the acceptor open: the connections just handed to a
// thread reach httplib's loop first (before 0.18.1 a connection whose loop
// starts after stop() is closed unserved).
constexpr auto stop_grace = std::chrono::milliseconds(50);
// Once stopped, with every admitted connection served and no request in
// progress, how long wait_until_served() lets the rest close before it says
// that only idle connections httplib does not close remain.
constexpr auto idle_close_grace = std::chrono::milliseconds(200);

// What httplib::TaskQueue::enqueue returns: void before 0.15, bool (false:
// refused, httplib closes the connection) from 0.15 on.
using EnqueueResult = decltype(std::declval<httplib::TaskQueue&>().enqueue(std::declval<std::function<void()>>()));
constexpr bool queue_may_refuse = std::is_same_v<EnqueueResult, bool>;
static_assert(queue_may_refuse || std::is_void_v<EnqueueResult>, "httplib::TaskQueue::enqueue returns void or bool");

struct ThreadState {
  bool in_connection = false;
  bool accepted_draining = false;  // this connection was accepted during the drain
  bool holds_slot = false;         // this connection holds one of the --threads slots
  bool in_request = false;         // from the request's head until its answer is written
  Exchange exchange;
};
thread_local ThreadState this_thread;

std::pair<time_t, time_t> seconds_and_microseconds(std::chrono::milliseconds ms) {
  return {static_cast<time_t>(ms.count() / 1000), static_cast<time_t>((ms.count() % 1000) * 1000)};
}

}  // namespace

const Exchange* current_exchange() { return this_thread.in_connection ? &this_thread.exchange : nullptr; }

// httplib's acceptor hands each accepted connection to a task queue (its
// public virtual interface): this one admits at once, never blocking the
// acceptor, and its shutdown(), which httplib calls once the acceptor
// stopped, finishes the drain.
class ConnectionServer::AdmissionQueue final : public httplib::TaskQueue {
 public:
  explicit AdmissionQueue(ConnectionServer& server) : server_(server) {}
  EnqueueResult enqueue(std::function<void()> fn) override {
    // (Before 0.15 nothing can be refused: admit() takes every task there, unless out of memory.)
    return static_cast<EnqueueResult>(server_.admit(fn));
  }
  void shutdown() override { server_.finish(); }

 private:
  ConnectionServer& server_;
};

ConnectionServer::ConnectionServer(ConnectionLimits limits) : limits_(limits), slots_free_(limits.threads) {
  http_.new_task_queue = [this] { return new AdmissionQueue(*this); };
  http_.set_tcp_nodelay(true);  // small answers: no Nagle delay (40 ms with delayed ACKs)
  // httplib listens with a backlog of 5 (128 from 0.52 on): connections that
  // arrive in a burst beyond it wait for a retried SYN, or are reset. Its
  // socket-options hook sees the listening socket; bind() listens on it
  // again with the system's maximum.
  http_.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listening_socket_ = sock;
  });
  const auto [read_s, read_us] = seconds_and_microseconds(limits_.read_timeout);
  http_.set_read_timeout(read_s, read_us);
  const auto [write_s, write_us] = seconds_and_microseconds(limits_.write_timeout);
  http_.set_write_timeout(write_s, write_us);
  // httplib counts the keep-alive timeout in whole seconds.
  http_.set_keep_alive_timeout(std::max<time_t>(1, static_cast<time_t>((limits_.keep_alive_timeout.count() + 999) / 1000)));
  http_.set_keep_alive_max_count(limits_.keep_alive_max);
  // Bodies are bounded by their readers (the gate and the body limit), not by httplib's default.
  http_.set_payload_max_length(std::numeric_limits<std::size_t>::max());
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
  http_.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    return pre_route(req, res) == HandlerResponse::Handled ? res.status : 100;
  });
  http_.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) { post_route(req, res); });
  // (Called once an answer is written.)
  http_.set_logger([this](const httplib::Request&, const httplib::Response&) { end_request(); });
  http_.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) { return on_error(req, res); }));
}

ConnectionServer::~ConnectionServer() { finish(); }

int ConnectionServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? http_.bind_to_any_port(host) : (http_.bind_to_port(host, port) ? port : -1);
  if (bound >= 0 && listening_socket_ != INVALID_SOCKET) {
    (void)::listen(listening_socket_, SOMAXCONN);
  }
  return bound;
}

bool ConnectionServer::serve() {
  // The drain's last step, stop(), waits in a thread of its own (drain()
  // returns at once): once no accepted connection waits for a thread any
  // more, the acceptor stops.
  std::thread stopper([this] {
    std::unique_lock lock(mutex_);
    stopper_wake_.wait(lock, [this] { return serve_returned_ || (draining() && queued_.empty()); });
    if (serve_returned_) {
      return;
    }
    lock.unlock();
    std::this_thread::sleep_for(stop_grace);
    // Once stopped, httplib writes no content provider's body (closing
    // answers use one): stop between requests.
    lock.lock();
    stopper_wake_.wait(lock, [this] { return serve_returned_ || requests_in_progress_.load() == 0; });
    lock.unlock();
    stop_listening();
  });
  const bool ok = http_.listen_after_bind();
  {
    std::lock_guard lock(mutex_);
    serve_returned_ = true;
  }
  stopper_wake_.notify_all();
  stopper.join();
  finish();  // (httplib calls it too, once its acceptor stopped)
  return ok;
}

void ConnectionServer::drain() {
  {
    std::lock_guard lock(mutex_);
    if (draining()) {
      return;
    }
    drain_began_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    draining_.store(true, std::memory_order_release);
  }
  stopper_wake_.notify_all();
}

bool ConnectionServer::wait_until_served() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (serve_returned_) {
      return true;
    }
    if (stop_called_ && queued_.empty() && requests_in_progress_.load() == 0) {
      if (!stopper_wake_.wait_for(lock, idle_close_grace,
                                  [this] { return serve_returned_ || requests_in_progress_.load() != 0; })) {
        return false;  // only connections without a request remain, which this httplib does not close
      }
      continue;
    }
    stopper_wake_.wait(lock);
  }
}

void ConnectionServer::stop_listening() {
  // stop() acts only while listen_after_bind() runs, and asserts (in debug
  // builds) when called twice while it does: call it once, once it runs.
  std::unique_lock lock(mutex_);
  while (!http_.is_running() && !serve_returned_) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.lock();
  }
  if (!serve_returned_ && !stop_called_) {
    stop_called_ = true;
    stopped_.store(true, std::memory_order_release);
    lock.unlock();
    http_.stop();
    stopper_wake_.notify_all();
  }
}

void ConnectionServer::finish() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  task_ready_.notify_all();
  for (std::thread& t : threads) {
    t.join();  // each serves what is waiting for it before it stops
  }
}

// ---- admission ----------------------------------------------------------------

bool ConnectionServer::admit(Task& task) {
  counters_.accepted.fetch_add(1, std::memory_order_relaxed);
  try {
    std::unique_lock lock(mutex_);
    if (queued_.size() < queue_capacity || !queue_may_refuse) {
      queued_.push_back([task = std::move(task), during_drain = draining()] {
        this_thread.accepted_draining = during_drain;
        task();  // httplib serves the connection, its keep-alive requests included, and closes it
      });
      if (idle_threads_ < queued_.size() && threads_.size() < limits_.threads + limits_.max_pending + spare_threads) {
        threads_.emplace_back([this] { run(); });
      }
      lock.unlock();
      task_ready_.notify_one();
      return true;
    }
  } catch (...) {
    // no memory for the queue, or no thread: refused below
  }
  counters_.refused.fetch_add(1, std::memory_order_relaxed);
  return false;
}

std::string ConnectionServer::refusal_message() const {
  if (draining()) {
    return "the server is shutting down; retry on another instance";
  }
  return "the server is at capacity (" + std::to_string(limits_.threads) + " connections served and " +
         std::to_string(limits_.max_pending) + " waiting; --threads, --max-pending-connections); retry later";
}

void ConnectionServer::run() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      ++idle_threads_;
      task_ready_.wait(lock, [this] { return !queued_.empty() || stopping_; });
      --idle_threads_;
      if (queued_.empty()) {
        return;  // stopping, and nothing is left to serve
      }
      task = std::move(queued_.front());
      queued_.pop_front();
    }
    stopper_wake_.notify_all();  // (the drain waits for queued_ to empty)
    this_thread.in_connection = true;
    task();
    this_thread.in_connection = false;
    end_request();  // (one whose answer was never written)
    if (this_thread.holds_slot) {
      this_thread.holds_slot = false;
      {
        std::lock_guard lock(mutex_);
        ++slots_free_;
      }
      slot_freed_.notify_one();
    }
  }
}

// A slot for this thread's connection, if one is free; with `wait`, else a
// place among those waiting for one, if there is room (then it waits).
// False: at capacity.
bool ConnectionServer::take_slot(bool wait) {
  std::unique_lock lock(mutex_);
  if (slots_free_ == 0) {
    if (!wait || waiting_ >= limits_.max_pending) {
      return false;
    }
    ++waiting_;
    line_waiting_.store(true, std::memory_order_relaxed);
    slot_freed_.wait(lock, [this] { return slots_free_ > 0; });
    --waiting_;
    line_waiting_.store(waiting_ > 0, std::memory_order_relaxed);
  }
  --slots_free_;
  this_thread.holds_slot = true;
  return true;
}

// ---- httplib's hooks -----------------------------------------------------------

// A request's head is there.
void ConnectionServer::begin_exchange() {
  if (!this_thread.in_request) {
    this_thread.in_request = true;
    requests_in_progress_.fetch_add(1, std::memory_order_relaxed);
  }
  this_thread.exchange.received = Clock::now();
  this_thread.exchange.refusal.clear();
  start_body_clock();
}

// Its body must follow within the read timeout, from now (its head's
// arrival, or when it got a slot); during the drain, also within the read
// timeout of the drain's start, so that connections served late (they
// waited for a slot) do not make the drain last longer.
void ConnectionServer::start_body_clock() {
  Exchange& e = this_thread.exchange;
  e.deadline = Clock::now() + limits_.read_timeout;
  if (draining()) {
    const Clock::time_point began{Clock::duration(drain_began_ns_.load(std::memory_order_relaxed))};
    e.deadline = std::min(e.deadline, began + limits_.read_timeout);
  }
}

void ConnectionServer::end_request() {
  if (!this_thread.in_request) {
    return;  // (httplib's own answer to a head it could not read, before any hook)
  }
  this_thread.in_request = false;
  if (requests_in_progress_.fetch_sub(1, std::memory_order_acq_rel) == 1 && draining()) {
    { std::lock_guard lock(mutex_); }  // (the drain's waits check under mutex_: none misses this)
    stopper_wake_.notify_all();
  }
}

bool ConnectionServer::is_health(const httplib::Request& req) const {
  return (req.method == "GET" || req.method == "HEAD") &&
         std::find(health_paths_.begin(), health_paths_.end(), req.path) != health_paths_.end();
}

ConnectionServer::HandlerResponse ConnectionServer::pre_route(const httplib::Request& req, httplib::Response& res) {
  begin_exchange();
  if (!this_thread.holds_slot) {
    const bool health = is_health(req);
    // A health check takes a free slot, else is answered without one; any
    // other request waits for one if there is room, else is refused.
    if (this_thread.accepted_draining || !take_slot(!health)) {
      if (health) {
        counters_.health_at_capacity.fetch_add(1, std::memory_order_relaxed);
        return HandlerResponse::Unhandled;
      }
      // A body on its way is read and dropped before the 503 (by the body's
      // reader, which finds the refusal in the exchange), so that closing
      // does not reset the connection before the client reads the answer;
      // unless the gate refuses the body itself.
      const bool has_body = req.has_header("Transfer-Encoding") ||
                            (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
      if (has_body && gate_ != nullptr) {
        if (gate_(req, res) == HandlerResponse::Handled) {
          return HandlerResponse::Handled;
        }
        counters_.refused.fetch_add(1, std::memory_order_relaxed);
        this_thread.exchange.refusal = refusal_message();
        return HandlerResponse::Unhandled;
      }
      counters_.refused.fetch_add(1, std::memory_order_relaxed);
      refuse(res, refusal_message());
      return HandlerResponse::Handled;
    }
    start_body_clock();  // (it may have waited for the slot)
  }
  return gate_ != nullptr ? gate_(req, res) : HandlerResponse::Unhandled;
}

void ConnectionServer::refuse(httplib::Response& res, const std::string& message) {
  res.status = 503;
  res.headers.clear();
  res.set_header("Retry-After", "1");
  res.set_header("Connection", "close");
  res.set_content(json_error("unavailable", message), "application/json");
}

// Every answer, just before it is written: during the drain, without a
// slot, and while connections wait for one, it ends its connection (so that
// busy kept-alive clients take their turn rather than hold the slots), and
// says so; and the observer counts it.
void ConnectionServer::post_route(const httplib::Request& req, httplib::Response& res) {
  if (!this_thread.exchange.refusal.empty() && res.status != 503) {
    refuse(res, this_thread.exchange.refusal);  // (a handler that did not look at the refusal)
  }
  const bool close = draining() || !this_thread.holds_slot || line_waiting_.load(std::memory_order_relaxed) ||
                     res.get_header_value("Connection") == "close";
  if (close) {
    res.headers.erase("Connection");
    res.headers.erase("Keep-Alive");
    res.set_header("Connection", "close");
  }
  // Counted before it is written: a client that has its answer finds it counted.
  if (observer_ != nullptr) {
    const Clock::duration latency =
        this_thread.in_connection ? Clock::now() - this_thread.exchange.received : Clock::duration::zero();
    observer_(req, res, latency);
  }
}

// An answer of 400 or more: one without a body (httplib's own: a malformed
// head, no such route) gets one, and as its request's framing may be
// unknown, it ends the connection; so does one that says Connection: close
// (a body refused unread).
ConnectionServer::HandlerResponse ConnectionServer::on_error(const httplib::Request& req, httplib::Response& res) {
  if (res.body.empty() && !res.has_header("Content-Type")) {
    res.set_header("Connection", "close");
    if (error_body_ != nullptr) {
      error_body_(req, res);
    }
  }
  if (res.get_header_value("Connection") == "close" && !res.body.empty()) {
    end_connection_after(res);
  }
  return HandlerResponse::Handled;  // (httplib then sets Content-Length for the new body)
}

// httplib before 0.28 keeps a connection open after an answer that says
// Connection: close (the client is to close it), and reads what follows,
// e.g. the rest of a refused body, as the next request. A content
// provider that gives up once it has written the body ends the connection
// in every version: the body goes out through one. (Once the acceptor has
// stopped, httplib writes no provider's body; the drain stops it between
// requests, and later answers end their connections anyway.)
void ConnectionServer::end_connection_after(httplib::Response& res) const {
  if (stopped_.load(std::memory_order_acquire)) {
    return;
  }
  const std::string type = res.get_header_value("Content-Type");
  auto body = std::make_shared<const std::string>(std::move(res.body));
  res.body.clear();
  res.headers.erase("Content-Type");
  res.set_content_provider(body->size(), type, [body](std::size_t offset, std::size_t, httplib::DataSink& sink) {
    sink.write(body->data() + offset, body->size() - offset);
    return false;  // written: httplib ends the connection
  });
}

}  // namespace inference_server
