#pragma once
// Replaces the global allocation functions with malloc and free behind a hook,
// for tests that count a thread's allocations or make them fail. Include it in
// exactly one translation unit of a test program, which defines the hook:
//
//   void replay_test::before_each_allocation() { ... }  // may throw std::bad_alloc
//
// Every form that can reach free() is replaced, the nothrow and array ones
// too: a sanitizer replaces all of them, so a partial set would pair its
// nothrow new (std::stable_sort's temporary buffer) with our delete.
// The aligned forms are left to the implementation: they pair with each other.
#include <cstddef>
#include <cstdlib>
#include <new>

namespace replay_test {
void before_each_allocation();
}  // namespace replay_test

// GCC pairs the mallocs below with the frees and warns about a mismatch that is not one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t n) {
  replay_test::before_each_allocation();
  if (void* p = std::malloc(n == 0 ? 1 : n)) {
    return p;
  }
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& tag) noexcept { return ::operator new(n, tag); }

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
