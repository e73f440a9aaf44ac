#pragma once
// Whose code a stack frame is (CUDA's, CUPTI's, replay's, the standard
// library's, or the user's) and which frame of a call's stack is the
// user's: the first one, from the innermost out, that is none of the
// others. Pure functions over resolved frames, tested on the CPU.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "replay/audit/call.hpp"
#include "replay/detail/message.hpp"

namespace replay::detail::audit {

// cuda: CUDA, CUPTI and NVIDIA's libraries (cuBLAS, cuDNN, NCCL...);
// framework: libtorch (its operators are named separately, from
// RecordFunction), so that the user's frame is the user's code that called it.
enum class FrameOwner : unsigned char { cuda, replay, standard_library, framework, user, unknown };

// The file name of a path ("/usr/lib/libcuda.so.1" -> "libcuda.so.1").
constexpr ::std::string_view base_name(::std::string_view path) noexcept {
  const auto slash = path.rfind('/');
  return slash == ::std::string_view::npos ? path : path.substr(slash + 1);
}

constexpr bool contains_path(::std::string_view path, ::std::string_view part) noexcept {
  return path.find(part) != ::std::string_view::npos;
}

// True when `text` begins with one of `prefixes` (a library's file name, a
// runtime's entry points).
constexpr bool starts_with_any(::std::string_view text,
                               ::std::initializer_list<::std::string_view> prefixes) noexcept {
  for (const ::std::string_view prefix : prefixes) {
    if (text.starts_with(prefix)) {
      return true;
    }
  }
  return false;
}

// True when a demangled function name's qualified name begins with `scope`
// ("replay::", "std::"), also after a return type ("void replay::f<int>(int)"),
// but not when the scope only appears in template or function arguments
// ("replay_test::f()::{lambda(replay::StreamRef)#1}::operator()").
constexpr bool in_scope(::std::string_view function, ::std::string_view scope) noexcept {
  if (function.starts_with(scope)) {
    return true;
  }
  int depth = 0;  // of <>, () and {}
  for (::std::size_t i = 0; i < function.size(); ++i) {
    const char c = function[i];
    if (c == '<' || c == '(' || c == '{') {
      ++depth;
    } else if ((c == '>' || c == ')' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ' ' && depth == 0 && function.substr(i + 1).starts_with(scope)) {
      return true;
    }
  }
  return false;
}

// Kernel names (demangled) whose host-side launch stubs are CUDA's code, not the user's.
constexpr bool is_launch_stub(::std::string_view function, ::std::span<const ::std::string> kernels) noexcept {
  if (function.starts_with("__device_stub__")) {
    return true;
  }
  for (const ::std::string& kernel : kernels) {
    if (!kernel.empty() && function == kernel) {
      return true;
    }
  }
  return false;
}

// The compiler's sanitizer runtimes: GCC's shared ones (libasan.so,
// libtsan.so...), Clang's (libclang_rt.asan-x86_64.so...), and a static one
// by its entry points' names.
constexpr bool is_sanitizer_runtime(::std::string_view object, ::std::string_view function) noexcept {
  return starts_with_any(object, {"libasan.", "libtsan.", "libubsan.", "liblsan.", "libhwasan.", "libclang_rt."}) ||
         starts_with_any(function, {"__interceptor_", "__asan_", "__tsan_", "__ubsan_", "__lsan_", "__sanitizer_",
                                    "__sanitizer::", "__asan::", "__tsan::", "__ubsan::"});
}

// Whose code a file is, by its path; nullopt for a file of the user's.
constexpr ::std::optional<FrameOwner> owner_of_file(::std::string_view file) noexcept {
  if (file.ends_with(".stub.c") || contains_path(file, "/crt/host_runtime.h") ||
      contains_path(file, "/cuda_runtime.h") || contains_path(file, "/crt/device_functions.h")) {
    return FrameOwner::cuda;
  }
  if (contains_path(file, "/ATen/") || contains_path(file, "/c10/") || contains_path(file, "/torch/csrc/") ||
      contains_path(file, "/torch/include/")) {
    return FrameOwner::framework;
  }
  if (contains_path(file, "/include/replay/")) {
    return FrameOwner::replay;
  }
  if (is_standard_library_file(file)) {
    return FrameOwner::standard_library;
  }
  return ::std::nullopt;
}

constexpr FrameOwner frame_owner(const AuditFrame& frame, ::std::span<const ::std::string> kernels = {}) noexcept {
  const ::std::string_view object = base_name(frame.object);
  const ::std::string_view function = frame.function;
  const ::std::string_view file = frame.file;
  // CUDA's and CUPTI's libraries, and NVIDIA's.
  if (starts_with_any(object, {"libcuda.", "libcudart", "libcupti", "libnvidia-", "libcudadebugger", "libcublas",
                               "libcudnn", "libnccl", "libcufft", "libcurand", "libcusparse", "libcusolver",
                               "libnvrtc", "libnvJitLink", "libnvshmem"})) {
    return FrameOwner::cuda;
  }
  if (starts_with_any(object, {"libtorch", "libc10", "libcaffe2"})) {
    return FrameOwner::framework;
  }
  // A sanitizer's runtime (its interceptor of backtrace() is the innermost
  // frame of every stack taken under it): the toolchain's, like libstdc++.
  if (is_sanitizer_runtime(object, function)) {
    return FrameOwner::standard_library;
  }
  // The host stub nvcc generates for a kernel launch.
  if (is_launch_stub(function, kernels)) {
    return FrameOwner::cuda;
  }
  // With line information the file decides: a function inlined into the
  // standard library's or replay's code (a lambda run by std::thread or by
  // a router) keeps its own file and line, while the name addr2line gives
  // the frame may be the function it was inlined into.
  if (!file.empty() && !file.starts_with("??")) {
    return owner_of_file(file).value_or(FrameOwner::user);
  }
  // Without it, the name: CUDA's runtime linked statically (its functions
  // have names but no line information), replay, the standard library.
  const bool upper_after_cuda = function.size() > 4 && function.starts_with("cuda") && function[4] >= 'A' &&
                                function[4] <= 'Z';
  const bool upper_after_cu = function.size() > 2 && function.starts_with("cu") && function[2] >= 'A' &&
                              function[2] <= 'Z';
  if (upper_after_cuda || upper_after_cu || function.starts_with("__cuda") || function.starts_with("__cudart") ||
      function.starts_with("libcudart") || in_scope(function, "cudart::")) {
    return FrameOwner::cuda;
  }
  if (in_scope(function, "replay::")) {
    return FrameOwner::replay;
  }
  if (in_scope(function, "std::") || in_scope(function, "__gnu_cxx::") ||
      starts_with_any(object, {"libstdc++", "libc.so", "libc-", "libpthread", "libgcc_s", "ld-linux"}) ||
      function == "start_thread" || function == "clone" || function == "clone3" ||
      function.starts_with("__libc_start") || function == "execute_native_thread_routine") {
    return FrameOwner::standard_library;
  }
  if (function.empty() || function == "??") {
    return FrameOwner::unknown;
  }
  return FrameOwner::user;
}

// The user's frame: the first (innermost) frame that is the user's. Where no
// frame has a name or line (no symbols at all), the first unknown frame
// outside CUDA's code, which is then the best guess.
inline ::std::optional<::std::size_t> first_user_frame(::std::span<const AuditFrame> frames,
                                                       ::std::span<const ::std::string> kernels = {}) {
  ::std::optional<::std::size_t> last_cuda;
  for (::std::size_t i = 0; i < frames.size(); ++i) {
    const FrameOwner owner = frame_owner(frames[i], kernels);
    if (owner == FrameOwner::user) {
      return i;
    }
    if (owner == FrameOwner::cuda) {
      last_cuda = i;
    }
  }
  for (::std::size_t i = last_cuda ? *last_cuda + 1 : 0; i < frames.size(); ++i) {
    if (frame_owner(frames[i], kernels) == FrameOwner::unknown) {
      return i;
    }
  }
  return ::std::nullopt;
}

// "file.cu:42 (in f(int))", "libfoo.so [0x7f12...] (in f)", or "an unknown frame".
inline ::std::string describe_frame(const AuditFrame& frame) {
  ::std::string out;
  if (!frame.file.empty() && frame.line != 0) {
    out = frame.file + ":" + ::std::to_string(frame.line);
  } else if (!frame.object.empty()) {
    out = ::std::string(base_name(frame.object));
    char address[32];
    (void)::std::snprintf(address, sizeof address, " [0x%zx]", static_cast<::std::size_t>(frame.address));
    out += address;
  } else {
    out = "an unknown frame";
  }
  if (!frame.function.empty() && frame.function != "??") {
    out += " (in " + frame.function + ")";
  }
  return out;
}

}  // namespace replay::detail::audit
