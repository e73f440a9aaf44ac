#include "lingering_closer.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>

namespace inference_server {
namespace {

// After finish(): how long a socket still lingers at most.
constexpr auto finish_linger = std::chrono::milliseconds(500);

}  // namespace

LingeringCloser::LingeringCloser(std::chrono::milliseconds linger, std::size_t capacity)
    : linger_(linger), capacity_(capacity), wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  thread_ = std::thread([this] { run(); });
}

LingeringCloser::~LingeringCloser() {
  finish();
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
  }
}

void LingeringCloser::wake() const noexcept {
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void LingeringCloser::close(socket_t sock) noexcept {
  ::shutdown(sock, SHUT_WR);
  {
    std::lock_guard lock(mutex_);
    if (!finishing_ && incoming_.size() < capacity_ && wake_fd_ >= 0) {
      try {
        incoming_.push_back({sock, Clock::now() + linger_});
        sock = INVALID_SOCKET;
      } catch (...) {
        // no room: closed below
      }
    }
  }
  if (sock != INVALID_SOCKET) {
    ::close(sock);
    return;
  }
  wake();
}

void LingeringCloser::finish() noexcept {
  {
    std::lock_guard lock(mutex_);
    finishing_ = true;
  }
  if (wake_fd_ >= 0) {
    wake();
  }
  if (thread_.joinable()) {
    thread_.join();
  }
}

void LingeringCloser::run() {
  std::vector<Closing> closing;
  std::vector<pollfd> fds;
  std::array<char, 64 * 1024> sink{};
  bool shortened = false;
  for (;;) {
    bool finishing = false;
    {
      std::lock_guard lock(mutex_);
      closing.insert(closing.end(), incoming_.begin(), incoming_.end());
      incoming_.clear();
      finishing = finishing_;
    }
    if (finishing && closing.empty()) {
      return;
    }
    if (finishing && !shortened) {
      // The process is about to end: a client still reading its answer has
      // it in moments; one still sending is not waited for any longer.
      shortened = true;
      for (Closing& c : closing) {
        c.deadline = std::min(c.deadline, Clock::now() + finish_linger);
      }
    }
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    for (const Closing& c : closing) {
      fds.push_back(pollfd{c.sock, POLLIN, 0});
      next = std::min(next, c.deadline);
    }
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    (void)::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait, 0)));
    std::uint64_t wakes = 0;
    (void)!::read(wake_fd_, &wakes, sizeof wakes);
    const Clock::time_point now = Clock::now();
    std::size_t kept = 0;
    for (std::size_t i = 0; i < closing.size(); ++i) {
      bool done = now >= closing[i].deadline;
      if (!done && fds[i + 1].revents != 0) {
        // Drop what the client sent (a bounded amount per round, so one fast
        // sender does not hold up the others); its end (0) or an error closes.
        for (int round = 0; round < 16; ++round) {
          const ssize_t n = ::recv(closing[i].sock, sink.data(), sink.size(), MSG_DONTWAIT);
          if (n > 0) {
            continue;
          }
          done = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
          break;
        }
      }
      if (done) {
        ::close(closing[i].sock);
      } else {
        closing[kept++] = closing[i];
      }
    }
    closing.resize(kept);
  }
}

}  // namespace inference_server
