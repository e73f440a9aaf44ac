#pragma once
// GraphExec: an owning, move-only cudaGraphExec_t. launch() is one checked
// cudaGraphLaunch and never synchronizes. update() tries cudaGraphExecUpdate
// (cheap: parameters only) and re-instantiates only when CUDA refuses, and it
// says which path it took and why in an UpdateResult.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>

#include "replay/detail/instantiate_policy.hpp"
#include "replay/detail/message.hpp"
#include "replay/detail/unique_handle.hpp"
#include "replay/error.hpp"
#include "replay/flags.hpp"
#include "replay/graph.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

enum class InstantiateFlags : unsigned long long {
  none = 0,
  auto_free_on_launch = ::cudaGraphInstantiateFlagAutoFreeOnLaunch,
  upload = ::cudaGraphInstantiateFlagUpload,
  device_launch = ::cudaGraphInstantiateFlagDeviceLaunch,
  use_node_priority = ::cudaGraphInstantiateFlagUseNodePriority,
};
template <>
inline constexpr bool enable_bitmask<InstantiateFlags> = true;

// Flag combinations CUDA documents as invalid; checked before instantiating.
constexpr const char* invalid_flags_reason(InstantiateFlags flags) noexcept {
  if (has_flag(flags, InstantiateFlags::device_launch) && has_flag(flags, InstantiateFlags::auto_free_on_launch)) {
    return "InstantiateFlags::device_launch cannot be combined with auto_free_on_launch";
  }
  constexpr auto known = InstantiateFlags::auto_free_on_launch | InstantiateFlags::upload |
                         InstantiateFlags::device_launch | InstantiateFlags::use_node_priority;
  if ((flags & ~known) != InstantiateFlags::none) {
    return "InstantiateFlags holds unknown bits";
  }
  return nullptr;
}

enum class UpdatePath {
  in_place,        // cudaGraphExecUpdate succeeded
  reinstantiated,  // CUDA refused the update; a new executable graph replaced the old
};

constexpr ::std::string_view to_string(UpdatePath path) noexcept {
  return path == UpdatePath::in_place ? "in_place" : "reinstantiated";
}

constexpr ::std::string_view to_string(::cudaGraphExecUpdateResult reason) noexcept {
  switch (reason) {
    case ::cudaGraphExecUpdateSuccess: return "success";
    case ::cudaGraphExecUpdateError: return "error";
    case ::cudaGraphExecUpdateErrorTopologyChanged: return "topology changed";
    case ::cudaGraphExecUpdateErrorNodeTypeChanged: return "node type changed";
    case ::cudaGraphExecUpdateErrorFunctionChanged: return "kernel function changed";
    case ::cudaGraphExecUpdateErrorParametersChanged: return "parameters changed in an unsupported way";
    case ::cudaGraphExecUpdateErrorNotSupported: return "node not supported for update";
    case ::cudaGraphExecUpdateErrorUnsupportedFunctionChange: return "unsupported kernel function change";
    case ::cudaGraphExecUpdateErrorAttributesChanged: return "node attributes changed";
  }
  return "unknown";
}

// What update() did.
struct UpdateResult {
  UpdatePath path = UpdatePath::in_place;
  // Why the in-place update was refused; cudaGraphExecUpdateSuccess when it was not.
  ::cudaGraphExecUpdateResult reason = ::cudaGraphExecUpdateSuccess;
  // The node CUDA blamed ("kernel node foo(float*)"), empty when it named none.
  ::std::string failed_node;

  bool in_place() const noexcept { return path == UpdatePath::in_place; }
  ::std::string describe() const {
    if (in_place()) {
      return "updated in place";
    }
    return failed_node.empty() ? detail::concat("re-instantiated: in-place update refused (", to_string(reason), ")")
                               : detail::concat("re-instantiated: in-place update refused (", to_string(reason),
                                                ", at ", failed_node, ")");
  }
};

// Thrown by GraphExec::update_in_place() when CUDA refuses the update.
class graph_update_error : public cuda_error {
 public:
  graph_update_error(::cudaError_t status, ::cudaGraphExecUpdateResult reason, ::std::string failed_node,
                     ::std::source_location where)
      : cuda_error(status, "cudaGraphExecUpdate", where,
                   failed_node.empty()
                       ? detail::concat("in-place update refused: ", to_string(reason))
                       : detail::concat("in-place update refused: ", to_string(reason), " at ", failed_node)),
        reason_(reason),
        failed_node_(::std::move(failed_node)) {}
  ::cudaGraphExecUpdateResult reason() const noexcept { return reason_; }
  const ::std::string& failed_node() const noexcept { return failed_node_; }

 private:
  ::cudaGraphExecUpdateResult reason_;
  ::std::string failed_node_;
};

namespace detail {
// The view GraphExec is built on: the handle, checked.
class graph_exec_ref {
 public:
  explicit constexpr graph_exec_ref(::cudaGraphExec_t exec) noexcept : exec_(exec) {}
  constexpr ::cudaGraphExec_t get() const noexcept { return exec_; }
  ::cudaGraphExec_t handle(::std::source_location where = ::std::source_location::current()) const {
    if (exec_ == nullptr) [[unlikely]] {
      throw_used_after_move(where);
    }
    return exec_;
  }

 private:
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_used_after_move(const ::std::source_location& where) {
    throw usage_error("GraphExec used after move (or after release())", where);
  }
  ::cudaGraphExec_t exec_;
};
struct graph_exec_traits {
  using handle_type = ::cudaGraphExec_t;
  static constexpr ::cudaGraphExec_t empty() noexcept { return nullptr; }
  static void destroy(::cudaGraphExec_t exec) noexcept { (void)::cudaGraphExecDestroy(exec); }
};
}  // namespace detail

class GraphExec : public detail::unique_handle<detail::graph_exec_ref, detail::graph_exec_traits> {
  using base = detail::unique_handle<detail::graph_exec_ref, detail::graph_exec_traits>;

 public:
  // Instantiates `graph`. With InstantiateFlags::upload the executable graph is
  // also uploaded to the device on `upload_stream`, so the first launch pays no upload.
  explicit GraphExec(GraphRef graph, InstantiateFlags flags = InstantiateFlags::none,
                     StreamRef upload_stream = cudaStreamPerThread,
                     ::std::source_location where = ::std::source_location::current())
      : base(instantiate(graph, flags, upload_stream, where)), flags_(flags) {}

  [[nodiscard]] static GraphExec from_native_handle(::cudaGraphExec_t exec,
                                                    InstantiateFlags flags = InstantiateFlags::none) noexcept {
    return GraphExec(exec, flags);
  }
  static GraphExec from_native_handle(int, InstantiateFlags = InstantiateFlags::none) = delete;
  static GraphExec from_native_handle(::std::nullptr_t, InstantiateFlags = InstantiateFlags::none) = delete;

  GraphExec(GraphExec&&) noexcept = default;
  GraphExec& operator=(GraphExec&&) noexcept = default;
  ~GraphExec() = default;

  InstantiateFlags flags() const noexcept { return flags_; }

  // Uploads the executable graph so the next launch does not pay for it.
  void upload(StreamRef stream, ::std::source_location where = ::std::source_location::current()) const {
    check(::cudaGraphUpload(handle(where), stream.handle(where)), "cudaGraphUpload", where);
  }

  // Enqueues one replay on `stream`. Never synchronizes.
  void launch(StreamRef stream, ::std::source_location where = ::std::source_location::current()) const {
    check(::cudaGraphLaunch(handle(where), stream.handle(where)), "cudaGraphLaunch", where);
  }

  // Makes this executable graph run `graph` instead: in place when CUDA allows
  // it (same topology, changed parameters such as pointers), otherwise by
  // instantiating `graph` afresh with the same flags. An in-place update takes
  // effect for launches made after it; launches already enqueued run the old
  // parameters. A replaced executable graph is destroyed at once, and CUDA
  // frees it when its enqueued launches complete. A re-instantiated graph is
  // uploaded on `upload_stream` when the flags ask for upload (no stream is
  // kept from construction: it might not outlive this object).
  UpdateResult update(GraphRef graph, StreamRef upload_stream = cudaStreamPerThread,
                      ::std::source_location where = ::std::source_location::current()) {
    UpdateResult result = try_update_in_place(graph, where);
    if (!result.in_place()) {
      GraphExec fresh(graph, flags_, upload_stream, where);
      *this = ::std::move(fresh);
    }
    return result;
  }

  // Like update(), but never re-instantiates: throws graph_update_error, naming
  // the reason and the failing node, when CUDA refuses the update.
  void update_in_place(GraphRef graph, ::std::source_location where = ::std::source_location::current()) {
    ::cudaGraphExecUpdateResultInfo info{};
    const ::cudaError_t status = ::cudaGraphExecUpdate(handle(where), graph.handle(where), &info);
    if (status != ::cudaSuccess) {
      detail::clear_error_slot(status);
      throw graph_update_error(status, info.result, describe_failed(info), where);
    }
  }

 private:
  GraphExec(::cudaGraphExec_t exec, InstantiateFlags flags) noexcept : base(exec), flags_(flags) {}

  static ::std::string describe_failed(const ::cudaGraphExecUpdateResultInfo& info) {
    if (info.errorNode == nullptr) {
      return {};
    }
    if (info.errorFromNode != nullptr) {
      return detail::concat(describe_node(info.errorNode), " (edge from ", describe_node(info.errorFromNode), ")");
    }
    return describe_node(info.errorNode);
  }

  UpdateResult try_update_in_place(GraphRef graph, const ::std::source_location& where) {
    ::cudaGraphExecUpdateResultInfo info{};
    const ::cudaError_t status = ::cudaGraphExecUpdate(handle(where), graph.handle(where), &info);
    if (status == ::cudaSuccess) {
      return {};
    }
    if (status != ::cudaErrorGraphExecUpdateFailure) {
      check(status, "cudaGraphExecUpdate", where);  // a real error, not a refusal
    }
    detail::clear_error_slot(status);
    return UpdateResult{UpdatePath::reinstantiated, info.result, describe_failed(info)};
  }

  // The CUDA steps of detail::instantiate_diagnosed_once.
  struct InstantiateSteps {
    InstantiateFlags exec_flags;
    const ::std::source_location& where;
    ::cudaError_t first = ::cudaSuccess;  // why instantiate() failed

    ::std::optional<::cudaGraphExec_t> instantiate(GraphRef graph) {
      ::cudaGraphExec_t exec = nullptr;
      first = ::cudaGraphInstantiate(&exec, graph.handle(where), to_underlying(exec_flags));
      if (first != ::cudaSuccess) {
        return ::std::nullopt;
      }
      return exec;
    }
    // Asks again through the params form, which says why and at which node.
    ::cudaGraphExec_t instantiate_diagnosed(GraphRef graph) const {
      ::cudaGraphInstantiateParams params{};
      params.flags = to_underlying(exec_flags);
      ::cudaGraphExec_t retry = nullptr;
      const ::cudaError_t retried = ::cudaGraphInstantiateWithParams(&retry, graph.get(), &params);
      detail::clear_error_slot(first);
      if (retried == ::cudaSuccess && retry != nullptr) {
        return retry;  // the failure was transient (e.g. memory freed meanwhile): keep the good one
      }
      detail::clear_error_slot(retried);
      if (retry != nullptr) {
        (void)::cudaGraphExecDestroy(retry);
      }
      throw cuda_error(first, "cudaGraphInstantiate", where,
                       params.errNode_out != nullptr
                           ? detail::concat("instantiate result ", static_cast<int>(params.result_out), ", at ",
                                            describe_node(params.errNode_out))
                           : detail::concat("instantiate result ", static_cast<int>(params.result_out)));
    }
  };

  static ::cudaGraphExec_t instantiate(GraphRef graph, InstantiateFlags flags, StreamRef upload_stream,
                                       const ::std::source_location& where) {
    if (const char* reason = invalid_flags_reason(flags)) {
      throw usage_error(reason, where);
    }
    // cudaGraphInstantiate with every flag but upload (which only it accepts
    // through the params form), then an explicit upload: the same effect, and
    // the flags are the ones cudaGraphExecGetFlags reports back.
    const auto exec_flags = flags & ~InstantiateFlags::upload;
    InstantiateSteps steps{exec_flags, where};
    const ::cudaGraphExec_t exec = detail::instantiate_diagnosed_once<::cudaGraphExec_t>(graph, steps);
    if (has_flag(flags, InstantiateFlags::upload)) {
      const ::cudaError_t uploaded = ::cudaGraphUpload(exec, upload_stream.handle(where));
      if (uploaded != ::cudaSuccess) {
        (void)::cudaGraphExecDestroy(exec);
        check(uploaded, "cudaGraphUpload", where);
      }
    }
    return exec;
  }

  InstantiateFlags flags_ = InstantiateFlags::none;
};

}  // namespace replay
