#pragma once
#include <replay/detail/require_cxx20.hpp>
// Exchanging NCCL's unique id between the processes of one communicator.
// ncclCommInitRank needs the same ncclUniqueId on every rank: rank 0 makes it
// (ncclGetUniqueId) and hands it to the others, here through a file (written
// atomically: a temporary file renamed into place, so a reader never sees half
// an id) or through an environment variable, as hex text.
//
//   rank 0:  write_unique_id_file(path, new_unique_id(), nranks);
//   others:  ncclUniqueId id = read_unique_id_file(path, nranks, std::chrono::seconds(60));
//
// Use a fresh path per job (a stale file from an earlier job would hand out a
// dead id); the file records the number of ranks and a reader checks it.
#include <nccl.h>

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "replay/error.hpp"
#include "replay/nccl/error.hpp"

namespace replay {

// The exchange did not complete: no id appeared in time, or it could not be
// written or read.
class bootstrap_error : public ::std::runtime_error {
 public:
  explicit bootstrap_error(::std::string_view what, ::std::source_location where = ::std::source_location::current())
      : ::std::runtime_error("replay: " + ::std::string(what) + " at " + replay::to_string(where)), where_(where) {}
  const ::std::source_location& where() const noexcept { return where_; }

 private:
  ::std::source_location where_;
};

// A new unique id (ncclGetUniqueId); rank 0 makes it once per communicator.
inline ::ncclUniqueId new_unique_id(::std::source_location where = ::std::source_location::current()) {
  ::ncclUniqueId id{};
  check_nccl(::ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr, where);
  return id;
}

inline constexpr ::std::size_t unique_id_hex_size = 2 * sizeof(::ncclUniqueId);

// 256 lowercase hex digits.
inline ::std::string to_hex(const ::ncclUniqueId& id) {
  static constexpr char digits[] = "0123456789abcdef";
  ::std::string out;
  out.reserve(unique_id_hex_size);
  for (char c : id.internal) {
    const auto byte = static_cast<unsigned char>(c);
    out += digits[byte >> 4U];
    out += digits[byte & 0x0FU];
  }
  return out;
}

// The id written by to_hex(); usage_error for text of the wrong length or
// with a character that is not a hex digit (surrounding whitespace is ignored).
inline ::ncclUniqueId unique_id_from_hex(::std::string_view text,
                                         ::std::source_location where = ::std::source_location::current()) {
  while (!text.empty() && ::std::strchr(" \t\r\n", text.front()) != nullptr) {
    text.remove_prefix(1);
  }
  while (!text.empty() && ::std::strchr(" \t\r\n", text.back()) != nullptr) {
    text.remove_suffix(1);
  }
  if (text.size() != unique_id_hex_size) {
    throw usage_error("an NCCL unique id is " + ::std::to_string(unique_id_hex_size) + " hex digits, got " +
                          ::std::to_string(text.size()) + " characters",
                      where);
  }
  auto value = [&](char c) -> unsigned {
    if (c >= '0' && c <= '9') {
      return static_cast<unsigned>(c - '0');
    }
    if (c >= 'a' && c <= 'f') {
      return static_cast<unsigned>(c - 'a' + 10);
    }
    if (c >= 'A' && c <= 'F') {
      return static_cast<unsigned>(c - 'A' + 10);
    }
    throw usage_error(::std::string("an NCCL unique id holds only hex digits, got '") + c + "'", where);
  };
  ::ncclUniqueId id{};
  for (::std::size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>((value(text[2 * i]) << 4U) | value(text[2 * i + 1]));
  }
  return id;
}

namespace detail {
inline constexpr ::std::string_view unique_id_file_tag = "replay-nccl-unique-id v1 nranks=";

// Parses "<tag><nranks>\n<hex>\n"; false when the text is not (yet) a whole record.
inline bool parse_unique_id_record(const ::std::string& text, int& nranks, ::std::string& hex) {
  if (text.rfind(unique_id_file_tag, 0) != 0) {
    return false;
  }
  const auto line_end = text.find('\n');
  if (line_end == ::std::string::npos) {
    return false;
  }
  try {
    nranks = ::std::stoi(text.substr(unique_id_file_tag.size(), line_end - unique_id_file_tag.size()));
  } catch (...) {
    return false;
  }
  hex = text.substr(line_end + 1);
  return true;
}
}  // namespace detail

// Writes `id` for `nranks` ranks to `path`, atomically (a temporary file in
// the same folder, renamed over `path`). bootstrap_error if it cannot.
inline void write_unique_id_file(const ::std::filesystem::path& path, const ::ncclUniqueId& id, int nranks,
                                 ::std::source_location where = ::std::source_location::current()) {
  if (nranks < 1) {
    throw usage_error("write_unique_id_file: nranks must be at least 1, got " + ::std::to_string(nranks), where);
  }
  ::std::filesystem::path tmp = path;
  tmp += ".tmp." + ::std::to_string(static_cast<long long>(::getpid()));
  {
    ::std::ofstream out(tmp, ::std::ios::binary | ::std::ios::trunc);
    out << detail::unique_id_file_tag << nranks << '\n' << to_hex(id) << '\n';
    out.flush();
    if (!out) {
      ::std::error_code ignored;
      ::std::filesystem::remove(tmp, ignored);
      throw bootstrap_error("could not write the NCCL unique id to " + tmp.string(), where);
    }
  }
  ::std::error_code ec;
  ::std::filesystem::rename(tmp, path, ec);
  if (ec) {
    ::std::error_code ignored;
    ::std::filesystem::remove(tmp, ignored);
    throw bootstrap_error("could not rename " + tmp.string() + " to " + path.string() + ": " + ec.message(), where);
  }
}

// Waits for `path` (polling every `poll`) and returns the id in it.
// bootstrap_error when none appears within `timeout`; usage_error when the
// file was written for another number of ranks or holds no valid id.
inline ::ncclUniqueId read_unique_id_file(const ::std::filesystem::path& path, int nranks,
                                          ::std::chrono::milliseconds timeout,
                                          ::std::chrono::milliseconds poll = ::std::chrono::milliseconds(20),
                                          ::std::source_location where = ::std::source_location::current()) {
  const auto deadline = ::std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ::std::ifstream in(path, ::std::ios::binary);
    if (in) {
      ::std::ostringstream text;
      text << in.rdbuf();
      int file_nranks = 0;
      ::std::string hex;
      if (detail::parse_unique_id_record(text.str(), file_nranks, hex)) {
        if (file_nranks != nranks) {
          throw usage_error(path.string() + " holds an NCCL unique id for " + ::std::to_string(file_nranks) +
                                " ranks, but this rank expects " + ::std::to_string(nranks) +
                                " (a stale file from another job? use a fresh path per job)",
                            where);
        }
        return unique_id_from_hex(hex, where);
      }
    }
    if (::std::chrono::steady_clock::now() >= deadline) {
      throw bootstrap_error("no NCCL unique id appeared in " + path.string() + " within " +
                                ::std::to_string(timeout.count()) + " ms (did rank 0 start and write it?)",
                            where);
    }
    ::std::this_thread::sleep_for(poll);
  }
}

// The id in environment variable `name` (hex, as to_hex writes it);
// usage_error when it is unset or malformed.
inline ::ncclUniqueId unique_id_from_env(const char* name,
                                         ::std::source_location where = ::std::source_location::current()) {
  const char* text = ::std::getenv(name);
  if (text == nullptr) {
    throw usage_error(::std::string("environment variable ") + name +
                          " is not set; rank 0 makes the id (replay::to_hex(replay::new_unique_id())) and "
                          "every rank must see it there",
                      where);
  }
  return unique_id_from_hex(text, where);
}

// Rank 0 makes an id and writes it to `path`; the other ranks wait for it.
inline ::ncclUniqueId exchange_unique_id(const ::std::filesystem::path& path, int rank, int nranks,
                                         ::std::chrono::milliseconds timeout,
                                         ::std::source_location where = ::std::source_location::current()) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    throw usage_error("exchange_unique_id: rank " + ::std::to_string(rank) + " is not in [0, " +
                          ::std::to_string(nranks) + ")",
                      where);
  }
  if (rank == 0) {
    const ::ncclUniqueId id = new_unique_id(where);
    write_unique_id_file(path, id, nranks, where);
    return id;
  }
  return read_unique_id_file(path, nranks, timeout, ::std::chrono::milliseconds(20), where);
}

}  // namespace replay
