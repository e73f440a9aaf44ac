#pragma once
// The httplib::Stream the server reads requests from and writes answers to:
// one per connection, over a socket, with bounds httplib's own stream does
// not have. Reading a request has one deadline for the whole request (head
// and body: a client that drips a byte at a time cannot hold a worker longer
// than the read timeout) and a cap on its bytes (a head without an end, or a
// body past the limit, stops being read); writing an answer has one deadline
// for the whole answer. Reads are buffered, and what is buffered beyond one
// request stays for the next (pipelining).
#include <httplib.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <string>

namespace inference_server {

class RequestStream final : public httplib::Stream {
 public:
  using Clock = std::chrono::steady_clock;

  RequestStream(socket_t sock, Clock::duration write_timeout) : sock_(sock), write_timeout_(write_timeout) {}

  // A new request begins: it must arrive by `deadline` and hold at most `byte_cap` bytes.
  void begin_request(Clock::time_point deadline, std::size_t byte_cap);

  bool timed_out() const { return timed_out_; }          // a read of this request passed its deadline
  bool over_cap() const { return over_cap_; }            // this request passed its byte cap
  std::size_t bytes_read() const { return bytes_read_; } // of this request
  bool answer_started() const { return answer_started_; }
  bool has_buffered_input() const { return buffer_begin_ < buffer_end_; }

  // httplib::Stream
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, std::size_t size) override;
  ssize_t write(const char* ptr, std::size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return sock_; }

 private:
  // Waits until the socket is readable (POLLIN) or writable (POLLOUT), until `deadline`.
  bool wait_for(short events, Clock::time_point deadline) const;

  socket_t sock_;
  Clock::duration write_timeout_;
  Clock::time_point read_deadline_{};
  Clock::time_point write_deadline_{};
  std::size_t byte_cap_ = 0;
  std::size_t bytes_read_ = 0;
  bool timed_out_ = false;
  bool over_cap_ = false;
  bool answer_started_ = false;
  std::array<char, 16 * 1024> buffer_{};
  std::size_t buffer_begin_ = 0;
  std::size_t buffer_end_ = 0;
};

}  // namespace inference_server
