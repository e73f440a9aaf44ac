#pragma once
// Closes connections without destroying their last answer. Closing a socket
// whose client is still sending (a body refused before it was read, a
// request that came too late) makes the kernel send a reset, and a reset can
// discard the answer from the client's receive buffer before it is read.
// So the sending side is shut first (the client sees the answer, then the
// end), and what the client still sends is read and dropped until it closes
// or `linger` has passed; only then is the socket closed. One thread watches
// every closing socket, so no worker waits for a client to go away.
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace inference_server {

class LingeringCloser {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LingeringCloser(std::chrono::milliseconds linger, std::size_t capacity = 4096);
  LingeringCloser(const LingeringCloser&) = delete;
  LingeringCloser& operator=(const LingeringCloser&) = delete;
  ~LingeringCloser();

  // Takes `sock` (from any thread): shuts its sending side and closes it
  // once the client has closed, or after the linger time. Beyond `capacity`
  // sockets lingering at once, closes at once.
  void close(socket_t sock) noexcept;
  // Closes every socket still lingering once it is done (at most half a
  // second from now), then stops the thread. Idempotent.
  void finish() noexcept;

 private:
  struct Closing {
    socket_t sock;
    Clock::time_point deadline;
  };
  void run();
  void wake() const noexcept;

  std::chrono::milliseconds linger_;
  std::size_t capacity_;
  int wake_fd_ = -1;  // an eventfd: a new socket, or finish()
  std::mutex mutex_;
  std::vector<Closing> incoming_;
  bool finishing_ = false;
  std::thread thread_;
};

}  // namespace inference_server
