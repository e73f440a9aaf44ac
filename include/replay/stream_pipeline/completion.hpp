#pragma once
// What a pipeline completion callback receives (PipelineCompletion), and the callback type.
#include <replay/detail/require_cxx20.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <span>

namespace replay {

// What a completion callback receives. `output` points into pipeline-owned
// (or the caller's destination) memory and is valid only during the callback;
// it is empty when the item failed, and `error` then holds the exception.
template <class Out>
struct PipelineCompletion {
  ::std::uint64_t id = 0;  // the item's submission number
  ::std::span<const Out> output;
  ::std::exception_ptr error;

  bool ok() const noexcept { return error == nullptr; }
  void rethrow_if_error() const {
    if (error != nullptr) {
      ::std::rethrow_exception(error);
    }
  }
};

template <class Out>
using PipelineCallback = ::std::function<void(const PipelineCompletion<Out>&)>;

}  // namespace replay
