#pragma once
// The aten operators running on the capturing thread, for the capture
// audit: while an audited capture runs, a thread-local RecordFunction
// callback keeps this thread's stack of operator names, and the audit asks
// for the innermost one with every call it records ("cudaStreamSynchronize
// inside aten::_local_scalar_dense"). Registered only for audited captures.
#include <replay/detail/require_cxx20.hpp>

#include <ATen/record_function.h>

#include <memory>
#include <vector>

#include "replay/detail/capture_observer.hpp"

namespace replay::detail {

inline ::std::vector<const char*>& running_operators() noexcept {
  thread_local ::std::vector<const char*> operators;
  return operators;
}

inline const char* innermost_operator() noexcept {
  const ::std::vector<const char*>& operators = running_operators();
  return operators.empty() ? nullptr : operators.back();
}

// Tracks this thread's aten operators for its lifetime.
class OperatorTracking {
 public:
  OperatorTracking() {
    running_operators().clear();
    operator_name_source().store(&innermost_operator, ::std::memory_order_release);
    handle_ = ::at::addThreadLocalCallback(
        ::at::RecordFunctionCallback(&on_start, &on_end).scopes({::at::RecordScope::FUNCTION}));
  }
  OperatorTracking(const OperatorTracking&) = delete;
  OperatorTracking& operator=(const OperatorTracking&) = delete;
  ~OperatorTracking() {
    try {
      ::at::removeCallback(handle_);
    } catch (...) {
    }
    running_operators().clear();
  }

 private:
  static ::std::unique_ptr<::at::ObserverContext> on_start(const ::at::RecordFunction& fn) {
    try {
      running_operators().push_back(fn.name());
    } catch (...) {  // out of memory: the name is left out
    }
    return nullptr;
  }
  static void on_end(const ::at::RecordFunction& /*fn*/, ::at::ObserverContext* /*context*/) {
    if (!running_operators().empty()) {
      running_operators().pop_back();
    }
  }

  ::at::CallbackHandle handle_ = 0;
};

}  // namespace replay::detail
