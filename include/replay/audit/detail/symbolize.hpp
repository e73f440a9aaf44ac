#pragma once
// Call stacks: taken cheaply while a call is recorded (return addresses
// only, glibc's backtrace()), resolved when a report is made: the object
// and nearest exported symbol from dladdr, function names, files and lines
// from addr2line (binutils; REPLAY_AUDIT_ADDR2LINE names another) run once
// per object over all the addresses a report needs, cached for the process.
#include <replay/detail/require_cxx20.hpp>

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/audit/call.hpp"
#include "replay/audit/detail/frames.hpp"

extern char** environ;  // NOLINT: POSIX

namespace replay::detail::audit {

inline constexpr int max_stack_depth = 64;

// Return addresses of the calling thread's stack, innermost first.
struct RawStack {
  ::std::array<void*, max_stack_depth> frames{};
  int depth = 0;
};

inline void capture_stack(RawStack& stack) noexcept {
  stack.depth = ::backtrace(stack.frames.data(), max_stack_depth);
  if (stack.depth < 0) {
    stack.depth = 0;
  }
}

// "_Z3fooi" -> "foo(int)"; a name that is not mangled comes back as it is.
inline ::std::string demangle(const char* name) {
  if (name == nullptr) {
    return {};
  }
  int status = 0;
  ::std::unique_ptr<char, decltype(&::std::free)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                                      &::std::free);
  return status == 0 && out ? ::std::string(out.get()) : ::std::string(name);
}

// One line of addr2line's output for an address: a function and its
// location, innermost inlined function first.
struct SourceLine {
  ::std::string function;
  ::std::string file;
  unsigned line = 0;
};

// "path/file.cu:42", "path/file.cu:42 (discriminator 3)", "??:0", "??:?"
inline SourceLine parse_location(::std::string function, ::std::string_view location) {
  SourceLine out;
  out.function = function == "??" ? ::std::string() : ::std::move(function);
  if (const auto paren = location.find(" ("); paren != ::std::string_view::npos) {
    location = location.substr(0, paren);
  }
  const auto colon = location.rfind(':');
  if (colon == ::std::string_view::npos) {
    return out;
  }
  const ::std::string_view file = location.substr(0, colon);
  const ::std::string_view line = location.substr(colon + 1);
  unsigned number = 0;
  const auto parsed = ::std::from_chars(line.data(), line.data() + line.size(), number);
  if (file != "??" && parsed.ec == ::std::errc()) {
    out.file = ::std::string(file);
    out.line = number;
  }
  return out;
}

// Parses `addr2line -a -f -C -i` output: for each address a line "0x...",
// then pairs of lines (function, file:line), one pair per inlined level.
inline ::std::vector<::std::vector<SourceLine>> parse_addr2line(::std::string_view text) {
  ::std::vector<::std::vector<SourceLine>> out;
  ::std::vector<::std::string_view> lines;
  while (!text.empty()) {
    const auto end = text.find('\n');
    lines.push_back(text.substr(0, end));
    text = end == ::std::string_view::npos ? ::std::string_view() : text.substr(end + 1);
  }
  for (::std::size_t i = 0; i < lines.size();) {
    if (lines[i].starts_with("0x")) {
      out.emplace_back();
      ++i;
      continue;
    }
    if (out.empty() || i + 1 >= lines.size()) {
      break;
    }
    out.back().push_back(parse_location(::std::string(lines[i]), lines[i + 1]));
    i += 2;
  }
  return out;
}

// The addr2line to run: REPLAY_AUDIT_ADDR2LINE, else the first addr2line on
// PATH; empty when there is none.
inline ::std::string find_addr2line() {
  if (const char* chosen = ::std::getenv("REPLAY_AUDIT_ADDR2LINE"); chosen != nullptr && *chosen != '\0') {
    return chosen;
  }
  const char* path = ::std::getenv("PATH");
  ::std::string_view dirs = path != nullptr ? path : "/usr/bin:/bin";
  while (!dirs.empty()) {
    const auto colon = dirs.find(':');
    const ::std::string_view dir = dirs.substr(0, colon);
    dirs = colon == ::std::string_view::npos ? ::std::string_view() : dirs.substr(colon + 1);
    if (dir.empty()) {
      continue;
    }
    ::std::string candidate = ::std::string(dir) + "/addr2line";
    if (::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return {};
}

// Runs `program args...` and returns what it wrote to stdout (nothing when
// it could not be started).
inline ::std::string run_for_output(const ::std::vector<::std::string>& command) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    return {};
  }
  ::posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  ::posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  ::posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  ::std::vector<char*> argv;
  for (const ::std::string& arg : command) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  ::pid_t child = 0;
  const int spawned = ::posix_spawn(&child, argv[0], &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  ::std::string out;
  if (spawned == 0) {
    char buffer[4096];
    for (;;) {
      const ::ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
      if (n > 0) {
        out.append(buffer, static_cast<::std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ::close(pipe_fds[0]);
  return out;
}

// Where an address lives: the object's path and the address relative to it.
struct ObjectAddress {
  ::std::string object;
  ::std::uintptr_t relative = 0;
  ::std::string symbol;  // nearest exported symbol (demangled), empty if none
};

inline ::std::string self_executable() {
  char path[4096];
  const ::ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? ::std::string(path, static_cast<::std::size_t>(n)) : ::std::string();
}

inline ObjectAddress locate(::std::uintptr_t address) {
  ObjectAddress out;
  ::Dl_info info{};
  ::link_map* map = nullptr;
  if (::dladdr1(reinterpret_cast<void*>(address), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0) {
    return out;
  }
  // The link map's l_addr is the load bias: 0 for a non-PIE executable, the
  // base for shared objects and PIE, so that the difference is the address
  // in the file that addr2line reads.
  out.relative = address - (map != nullptr ? static_cast<::std::uintptr_t>(map->l_addr) : 0U);
  // The main program's link map has no name.
  out.object = map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0' ? ::std::string(map->l_name)
                                                                                 : self_executable();
  if (info.dli_sname != nullptr) {
    out.symbol = demangle(info.dli_sname);
  }
  return out;
}

// Resolves return addresses into frames (inlined functions become frames of
// their own, innermost first). Results are cached for the process.
class Symbolizer {
 public:
  static Symbolizer& instance() {
    static Symbolizer* symbolizer = new Symbolizer();  // never destroyed: used from any thread until exit
    return *symbolizer;
  }

  // Frames for each stack, in the same order.
  ::std::vector<::std::vector<AuditFrame>> resolve(const ::std::vector<::std::vector<::std::uintptr_t>>& stacks) {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    // Every address not yet known, grouped by object.
    ::std::map<::std::string, ::std::vector<::std::uintptr_t>> wanted;
    for (const auto& stack : stacks) {
      for (::std::size_t i = 0; i < stack.size(); ++i) {
        const ::std::uintptr_t address = lookup_address(stack[i], i);
        if (cache_.find(address) != cache_.end()) {
          continue;
        }
        Entry& entry = cache_[address];
        entry.where = locate(address);
        if (!entry.where.object.empty() && worth_reading(entry.where.object)) {
          wanted[entry.where.object].push_back(address);
        }
      }
    }
    if (!wanted.empty() && addr2line_.empty() && !searched_) {
      addr2line_ = find_addr2line();
      searched_ = true;
    }
    for (auto& [object, addresses] : wanted) {
      run_addr2line(object, addresses);
    }
    ::std::vector<::std::vector<AuditFrame>> out;
    out.reserve(stacks.size());
    for (const auto& stack : stacks) {
      ::std::vector<AuditFrame> frames;
      for (::std::size_t i = 0; i < stack.size(); ++i) {
        const Entry& entry = cache_[lookup_address(stack[i], i)];
        if (entry.lines.empty()) {
          frames.push_back(AuditFrame{stack[i], entry.where.object, entry.where.symbol, {}, 0});
          continue;
        }
        for (const SourceLine& line : entry.lines) {
          frames.push_back(AuditFrame{stack[i], entry.where.object,
                                      line.function.empty() ? entry.where.symbol : line.function, line.file,
                                      line.line});
        }
      }
      out.push_back(::std::move(frames));
    }
    return out;
  }

  // True when file and line information can be had (an addr2line was found).
  bool has_line_information() {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    if (!searched_) {
      addr2line_ = find_addr2line();
      searched_ = true;
    }
    return !addr2line_.empty();
  }

 private:
  struct Entry {
    ObjectAddress where;
    ::std::vector<SourceLine> lines;
  };

  // Objects whose frames are never the user's (CUDA's and NVIDIA's
  // libraries, libtorch, the C and C++ runtime) keep their dladdr names:
  // reading their symbol tables (a gigabyte for libtorch_cuda) buys nothing.
  static bool worth_reading(const ::std::string& object) {
    const AuditFrame frame{0, object, {}, {}, 0};
    const FrameOwner owner = frame_owner(frame);
    return owner != FrameOwner::cuda && owner != FrameOwner::framework && owner != FrameOwner::standard_library;
  }

  // A return address points after the call: one byte back is inside the
  // call instruction, whose line is the caller's line. Frame 0 (the
  // recorder's own) is not a return address.
  static ::std::uintptr_t lookup_address(::std::uintptr_t address, ::std::size_t index) noexcept {
    return index == 0 || address == 0 ? address : address - 1;
  }

  void run_addr2line(const ::std::string& object, const ::std::vector<::std::uintptr_t>& addresses) {
    if (addr2line_.empty()) {
      return;
    }
    constexpr ::std::size_t batch = 512;  // keeps the command line short
    for (::std::size_t first = 0; first < addresses.size(); first += batch) {
      ::std::vector<::std::string> command{addr2line_, "-a", "-f", "-C", "-i", "-e", object};
      const ::std::size_t last = ::std::min(addresses.size(), first + batch);
      for (::std::size_t i = first; i < last; ++i) {
        char hex[32];
        (void)::std::snprintf(hex, sizeof hex, "0x%zx", static_cast<::std::size_t>(cache_[addresses[i]].where.relative));
        command.emplace_back(hex);
      }
      const auto groups = parse_addr2line(run_for_output(command));
      for (::std::size_t i = first; i < last && i - first < groups.size(); ++i) {
        cache_[addresses[i]].lines = groups[i - first];
      }
    }
  }

  ::std::mutex mutex_;
  ::std::map<::std::uintptr_t, Entry> cache_;
  ::std::string addr2line_;
  bool searched_ = false;
};

// The calling thread's stack, resolved at once (for tests and one-off use).
inline ::std::vector<AuditFrame> current_frames() {
  RawStack raw;
  capture_stack(raw);
  ::std::vector<::std::uintptr_t> stack;
  for (int i = 0; i < raw.depth; ++i) {
    stack.push_back(reinterpret_cast<::std::uintptr_t>(raw.frames[static_cast<::std::size_t>(i)]));
  }
  return Symbolizer::instance().resolve({stack}).front();
}

}  // namespace replay::detail::audit
