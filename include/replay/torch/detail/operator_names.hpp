#pragma once
// The aten operators running on the capturing thread, for the capture
// audit: while an audited capture runs, a thread-local RecordFunction
// callback keeps this thread's stack of operator names, and the audit asks
// for the innermost one with every call it records ("cudaStreamSynchronize
// inside aten::_local_scalar_dense"). Inside TorchScript it also asks for
// the script's lines that called it: the interpreter keeps each node's
// source range (the file and line it was scripted from, through the debug
// information of a saved module), and torch::jit::currentCallstack() gives
// them for the node running on this thread. Registered only for audited captures.
#include <replay/detail/require_cxx20.hpp>

#include <ATen/record_function.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "replay/detail/capture_observer.hpp"

namespace replay::detail {

// This thread's running aten operators, and the script lines of the
// innermost one, read when first asked for while it runs.
struct OperatorStack {
  ::std::vector<const char*> names;
  ::std::vector<OperatorCaller> callers;
  bool callers_read = false;
};

inline OperatorStack& operator_stack() noexcept {
  thread_local OperatorStack stack;
  return stack;
}

// The TorchScript lines the running node was called from, innermost first:
// empty outside the interpreter. A node of a loaded module points into the
// module's serialized code; the range that code was generated from (the
// scripted source file) is named where the module kept it.
inline ::std::vector<OperatorCaller> script_callers() {
  ::std::vector<OperatorCaller> out;
  for (const ::torch::jit::StackEntry& entry : ::torch::jit::currentCallstack()) {
    ::torch::jit::SourceRange range = entry.range;
    if (::std::optional<::torch::jit::SourceRange> original = range.findSourceRangeThatGenerated()) {
      range = ::std::move(*original);
    }
    const auto file_line = range.file_line_col();
    if (!file_line) {
      continue;  // a node made by a pass without a source range, or code without a file name
    }
    // StackEntry::filename holds the function's name.
    out.push_back(OperatorCaller{entry.filename, ::std::get<0>(*file_line),
                                 static_cast<unsigned>(::std::get<1>(*file_line))});
  }
  return out;
}

// The innermost running operator and its script lines (RunningOperatorSource).
inline RunningOperator running_operator() noexcept {
  OperatorStack& stack = operator_stack();
  if (stack.names.empty()) {
    return {};
  }
  if (!stack.callers_read) {
    stack.callers_read = true;
    try {
      stack.callers = script_callers();
    } catch (...) {  // no lines then
      stack.callers.clear();
    }
  }
  return RunningOperator{stack.names.back(), stack.callers};
}

// Tracks this thread's aten operators for its lifetime.
class OperatorTracking {
 public:
  OperatorTracking() {
    operator_stack() = OperatorStack{};
    running_operator_source().store(&running_operator, ::std::memory_order_release);
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
    operator_stack() = OperatorStack{};
  }

 private:
  static ::std::unique_ptr<::at::ObserverContext> on_start(const ::at::RecordFunction& fn) {
    OperatorStack& stack = operator_stack();
    stack.callers_read = false;  // another operator, perhaps another node
    try {
      stack.names.push_back(fn.name());
    } catch (...) {  // out of memory: the name is left out
    }
    return nullptr;
  }
  static void on_end(const ::at::RecordFunction& /*fn*/, ::at::ObserverContext* /*context*/) {
    OperatorStack& stack = operator_stack();
    stack.callers_read = false;
    if (!stack.names.empty()) {
      stack.names.pop_back();
    }
  }

  ::at::CallbackHandle handle_ = 0;
};

}  // namespace replay::detail
