#pragma once
// The move-only ownership every owning handle type shares (Stream, Event,
// Graph, GraphExec): an owning type is its non-owning view plus the duty to
// destroy the handle. Moves hand the handle over and leave the empty handle
// behind; release() gives it up; the destructor destroys it, never throwing.
#include <replay/detail/require_cxx20.hpp>

#include <utility>

namespace replay::detail {

// Traits: using handle_type; static handle_type empty() noexcept (what a
// moved-from or released object holds); static void destroy(handle_type) noexcept.
// View: constructible from a handle_type, copy-assignable, with get().
template <class View, class Traits>
class unique_handle : public View {
 public:
  using handle_type = typename Traits::handle_type;

  unique_handle(const unique_handle&) = delete;
  unique_handle& operator=(const unique_handle&) = delete;
  unique_handle(unique_handle&& other) noexcept : View(other.release()) {}
  unique_handle& operator=(unique_handle&& other) noexcept {
    if (this != &other) {
      reset(other.release());
    }
    return *this;
  }
  ~unique_handle() { reset(); }

  // Gives up ownership: the caller destroys the returned handle.
  [[nodiscard]] handle_type release() noexcept {
    const handle_type handle = View::get();
    View::operator=(View(Traits::empty()));
    return handle;
  }
  // False when moved from, released, or made empty.
  explicit operator bool() const noexcept { return View::get() != Traits::empty(); }

 protected:
  explicit unique_handle(handle_type handle) noexcept : View(handle) {}

  // Destroys the owned handle (if any) and takes `next`.
  void reset(handle_type next = Traits::empty()) noexcept {
    const handle_type old = View::get();
    View::operator=(View(next));
    if (old != Traits::empty()) {
      Traits::destroy(old);  // destructors never throw
    }
  }
};

}  // namespace replay::detail
