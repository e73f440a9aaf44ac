#pragma once
// replay::eager(stream, name, region): a break inside a piecewise capture
// (replay::capture_piecewise). The segment captured so far ends (and runs),
// `region(stream)` runs eagerly, and the next segment begins on the same
// stream in the same mode. At each launch of the executable the region runs
// again, between the segments, with the launch's stream.
//
//   auto exec = replay::capture_piecewise(stream, [&](replay::StreamRef s) {
//     first_half<<<g, b, 0, s.get()>>>(x);
//     const bool big = replay::eager(s, "read back", [&](replay::StreamRef r) {
//       flag.copy_to(std::span(host_flag), r);   // stream-ordered read-back
//       r.synchronize();                          // the one sync this region needs
//       return host_flag[0] != 0;                 // steers what follows
//     });
//     if (big) { second_half_big<<<g, b, 0, s.get()>>>(x); } else { second_half_small<<<g, b, 0, s.get()>>>(x); }
//   });
//   exec.launch(stream);   // segment, region, then the segment kept for the value it returned
//
// The region is kept by the executable and called at every launch: what it
// refers to must outlive the executable, and it must issue its work on the
// stream it is given. A value it returns keys the segments after it (their
// bytes are the key): return void, or an integer, enum, bool, or a struct of
// those without padding. See docs/piecewise.md.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "replay/detail/capture_state.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/signature_checks.hpp"
#include "replay/error.hpp"
#include "replay/piecewise/detail/session.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

// What replay::eager throws inside a capture that makes one graph
// (replay::capture, CaptureScope, a ShapeRouter's whole capture): the work
// declares a break there. A ShapeRouter with BreakPolicy::piecewise catches
// it to capture the key piecewise instead.
class region_in_capture_error : public usage_error {
 public:
  // `what` and `where` as for usage_error.
  explicit region_in_capture_error(::std::string_view what,
                                   ::std::source_location where = ::std::source_location::current())
      : usage_error(what, where) {}
};

namespace detail {
template <class Region>
consteval void check_region() {
  static_assert(::std::invocable<::std::decay_t<Region>&, StreamRef>,
                "replay::eager: the region must be callable as region(replay::StreamRef s), issue its work on s, and "
                "return void or a value that steers what follows");
  if constexpr (::std::invocable<::std::decay_t<Region>&, StreamRef>) {
    using Value = ::std::invoke_result_t<::std::decay_t<Region>&, StreamRef>;
    if constexpr (!::std::is_void_v<Value>) {
      static_assert(::std::is_same_v<Value, ::std::remove_cvref_t<Value>>,
                    "replay::eager: a region returns its value by value, not a reference");
      static_assert(::std::is_trivially_copyable_v<Value> && ::std::has_unique_object_representations_v<Value> &&
                        ::std::default_initializable<Value>,
                    "replay::eager: a region's value keys the segments after it by its bytes: return an integer, "
                    "enum, bool, or a struct of those without padding (not a float, a pointer to owned data or a "
                    "std::string)");
    }
  }
}
template <class Region>
using region_value_t = ::std::invoke_result_t<::std::decay_t<Region>&, StreamRef>;

[[noreturn, gnu::cold]] inline void refuse_break_here(::std::string_view name, const ::std::source_location& where) {
  if (piecewise_thread_state().regions_running > 0) {
    throw usage_error(concat("replay::eager(\"", name,
                             "\") inside a region: a region already runs eagerly; call its work directly"),
                      where);
  }
  if (open_capture_scopes() > 0) {
    throw region_in_capture_error(
        concat("replay::eager(\"", name,
               "\") inside a capture that makes one graph (replay::capture, CaptureScope, GraphBuilder::capture): "
               "it cannot hold an eager region; capture with replay::capture_piecewise to break it into segments"),
        where);
  }
  throw usage_error(concat("replay::eager(\"", name,
                           "\") outside any capture on this thread: it marks a break inside "
                           "replay::capture_piecewise (on the thread that runs the work); to run the same work "
                           "eagerly, with its regions in place, call it through replay::run_eagerly(stream, work)"),
                    where);
}
}  // namespace detail

// Inside replay::capture_piecewise on `stream`: ends the current segment, runs
// region(stream) eagerly, begins the next segment, and returns what the
// region returned. Inside replay::run_eagerly (and a ShapeRouter's eager runs
// of its work: warm-ups, keys that run eagerly) it runs region(stream) in
// place. Refused with usage_error
// (before any CUDA call) outside a piecewise capture, inside a capture that
// makes one graph (region_in_capture_error), inside another
// region, on another stream than the capturing one, and inside a capture
// nested in the piecewise one (a GraphBuilder body, a CaptureScope).
template <class Region>
detail::region_value_t<Region> eager(StreamRef stream, ::std::string_view name, Region&& region,
                                     ::std::source_location where = ::std::source_location::current()) {
  detail::check_region<Region>();
  using Value = detail::region_value_t<Region>;
  detail::PiecewiseThreadState& state = detail::piecewise_thread_state();
  if (state.capture == nullptr || state.regions_running > 0) [[unlikely]] {
    if (state.capture == nullptr && state.regions_running == 0 && state.regions_inline > 0 &&
        detail::open_capture_scopes() == 0) {
      // run_eagerly(), or a ShapeRouter's eager run of its work: the region runs in place.
      const detail::RegionRunning running;
      return ::std::invoke(region, stream);
    }
    detail::refuse_break_here(name, where);
  }
  ::std::string value;
  state.capture->take_break(stream, name, detail::PiecewiseCallable::make(::std::forward<Region>(region)), value,
                            where);
  if constexpr (!::std::is_void_v<Value>) {
    if (value.size() != sizeof(Value)) {
      throw usage_error(detail::concat("replay::eager(\"", name, "\"): the region's value has ", sizeof(Value),
                                       " bytes where this break returned ", value.size(),
                                       " before: the piecewise work is not the same given the same region values"),
                        where);
    }
    Value out{};
    ::std::memcpy(&out, value.data(), sizeof(Value));
    return out;
  }
}

// Runs work(stream) eagerly, now, with every replay::eager inside it running
// its region in place: the same work a piecewise capture records, run without
// a capture (an eager baseline, a fallback). Returns what work returns. A
// replay::eager elsewhere outside a capture stays refused, so a break that
// strays outside its capture is still caught.
template <class Work>
decltype(auto) run_eagerly(StreamRef stream, Work&& work) {
  detail::check_capture_work<Work>();
  const detail::RegionsInline regions_in_place;
  return ::std::invoke(::std::forward<Work>(work), stream);
}

// The same, with the region named "eager" in inspection and DOT output.
template <class Region>
detail::region_value_t<Region> eager(StreamRef stream, Region&& region,
                                     ::std::source_location where = ::std::source_location::current()) {
  return eager(stream, ::std::string_view("eager"), ::std::forward<Region>(region), where);
}

// A region whose output moves: region(stream) returns where its output is
// this time (device memory, as a std::span<const T>, e.g. a buffer's span()),
// and replay copies it into `into`, a buffer at a fixed address that the
// segments after the break read, in stream order right after the region. The
// returned memory must hold the output for work issued on the stream right
// after the region returns (memory freed in stream order on that stream later
// is fine). Sizes must match.
template <class T, MemorySpace Space, class Region>
void eager_into(StreamRef stream, ::std::string_view name, BufferView<T, Space> into, Region&& region,
                ::std::source_location where = ::std::source_location::current()) {
  static_assert(::std::invocable<::std::decay_t<Region>&, StreamRef> &&
                    ::std::convertible_to<::std::invoke_result_t<::std::decay_t<Region>&, StreamRef>,
                                          ::std::span<const T>>,
                "replay::eager_into: the region must be callable as region(replay::StreamRef s) and return where "
                "its output is this time, as a std::span<const T> of device memory (a buffer's span())");
  eager(
      stream, name,
      [into, output = ::std::forward<Region>(region), where](StreamRef s) mutable {
        const ::std::span<const T> moved = ::std::invoke(output, s);
        if (moved.size() != into.size()) {
          throw usage_error(detail::concat("replay::eager_into: the region returned ", moved.size(),
                                           " elements for a buffer of ", into.size()),
                            where);
        }
        check(::cudaMemcpyAsync(into.data(), moved.data(), moved.size_bytes(), ::cudaMemcpyDefault, s.handle(where)),
              "cudaMemcpyAsync", where);
      },
      where);
}

}  // namespace replay
