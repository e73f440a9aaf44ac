#include "request_stream.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace inference_server {
namespace {

void describe_address(const sockaddr_storage& address, socklen_t length, std::string& ip, int& port) {
  char host[NI_MAXHOST] = {};
  char service[NI_MAXSERV] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof host, service, sizeof service,
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(service);
  }
}

}  // namespace

void RequestStream::begin_request(Clock::time_point deadline, std::size_t byte_cap) {
  read_deadline_ = deadline;
  byte_cap_ = byte_cap;
  bytes_read_ = 0;
  timed_out_ = false;
  over_cap_ = false;
  answer_started_ = false;
  write_deadline_ = {};
}

bool RequestStream::wait_for(short events, Clock::time_point deadline) const {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      return false;
    }
    pollfd p{sock_, events, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1'000'000)));
    if (ready > 0) {
      return true;  // readable, writable, or an error or hang-up that the next call reports
    }
    if (ready < 0 && errno != EINTR) {
      return false;
    }
  }
}

bool RequestStream::is_readable() const { return has_buffered_input() || wait_for(POLLIN, read_deadline_); }

bool RequestStream::is_writable() const {
  return wait_for(POLLOUT, write_deadline_ == Clock::time_point{} ? Clock::now() + write_timeout_ : write_deadline_);
}

ssize_t RequestStream::read(char* ptr, std::size_t size) {
  if (bytes_read_ >= byte_cap_) {
    over_cap_ = true;
    return -1;
  }
  size = std::min(size, byte_cap_ - bytes_read_);
  while (!has_buffered_input()) {
    // Large reads (a body) go straight to the caller; small ones (httplib
    // reads the head a byte at a time) through the buffer.
    char* into = size >= buffer_.size() ? ptr : buffer_.data();
    const std::size_t room = size >= buffer_.size() ? size : buffer_.size();
    const ssize_t n = ::recv(sock_, into, room, MSG_DONTWAIT);
    if (n == 0) {
      return 0;  // the client closed
    }
    if (n > 0) {
      if (into == ptr) {
        bytes_read_ += static_cast<std::size_t>(n);
        return n;
      }
      buffer_begin_ = 0;
      buffer_end_ = static_cast<std::size_t>(n);
      break;
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return -1;
    }
    if (!wait_for(POLLIN, read_deadline_)) {
      timed_out_ = Clock::now() >= read_deadline_;
      return -1;
    }
  }
  const std::size_t n = std::min(size, buffer_end_ - buffer_begin_);
  std::memcpy(ptr, buffer_.data() + buffer_begin_, n);
  buffer_begin_ += n;
  bytes_read_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t RequestStream::write(const char* ptr, std::size_t size) {
  if (!answer_started_) {
    answer_started_ = true;
    write_deadline_ = Clock::now() + write_timeout_;
  }
  for (;;) {
    const ssize_t n = ::send(sock_, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      return n;
    }
    if (errno == EINTR) {
      continue;
    }
    if ((errno != EAGAIN && errno != EWOULDBLOCK) || !wait_for(POLLOUT, write_deadline_)) {
      return -1;
    }
  }
}

void RequestStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    describe_address(address, length, ip, port);
  }
}

void RequestStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    describe_address(address, length, ip, port);
  }
}

}  // namespace inference_server
