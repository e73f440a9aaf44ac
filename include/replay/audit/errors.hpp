#pragma once
// audit_unavailable_error: the capture audit could not subscribe to CUDA's
// profiling interface (CUPTI), e.g. because a profiler already holds it.
#include <replay/detail/require_cxx20.hpp>

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay {

// CUPTI allows one subscriber per process: under Nsight Systems, Nsight
// Compute, cuda-gdb or compute-sanitizer (or beside another CUPTI client in
// the process) the audit cannot subscribe, and says so with this error.
class audit_unavailable_error : public ::std::runtime_error {
 public:
  // `reason`: why (CUPTI's answer, and what to do about it).
  audit_unavailable_error(::std::string_view reason, ::std::source_location where = ::std::source_location::current())
      : ::std::runtime_error(detail::concat("replay: the capture audit is unavailable: ", reason, " (at ",
                                            replay::to_string(where), ")")),
        reason_(reason) {}
  // Why, without the location.
  const ::std::string& reason() const noexcept { return reason_; }

 private:
  ::std::string reason_;
};

}  // namespace replay
