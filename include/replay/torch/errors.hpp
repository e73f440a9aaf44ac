#pragma once
// The libtorch adapter's errors: stale_output_error, capture_failed_error.
#include <replay/detail/require_cxx20.hpp>

#include <stdexcept>

#include "replay/error.hpp"

namespace replay {

// A fast-mode output read after a later replay overwrote it.
class stale_output_error : public usage_error {
 public:
  using usage_error::usage_error;
};

// A capture of a torch callable that failed (thrown by TorchGraphBackend, and
// by GraphedCallable under GraphedFlags::no_fallback).
class capture_failed_error : public ::std::runtime_error {
 public:
  using ::std::runtime_error::runtime_error;
};

}  // namespace replay
