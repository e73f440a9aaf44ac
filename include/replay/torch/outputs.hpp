#pragma once
// GraphedOutputs: the outputs of one GraphedCallable call, sliced back to the
// caller's batch (clones, or in fast mode checked views of static outputs).
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/stats.hpp"
#include "replay/torch/detail/capture.hpp"
#include "replay/torch/errors.hpp"

namespace replay {

// The outputs of one GraphedCallable call, sliced back to the caller's batch.
// Safe mode (the default), eager runs: tensors of their own. Fast mode
// (GraphedFlags::view_outputs): views of the static outputs, which the next
// replay of the same GraphedCallable overwrites; every accessor checks that
// no replay happened since and throws stale_output_error otherwise. A tensor
// taken out and kept is not checked any more: clone() it to keep it.
class GraphedOutputs {
 public:
  GraphedOutputs() = default;

  ::std::size_t size() const noexcept { return tensors_ ? tensors_->size() : 0; }
  bool empty() const noexcept { return size() == 0; }

  // Checked access. operator[] cannot take a source location; at() does.
  const ::at::Tensor& operator[](::std::size_t index) const { return at(index); }
  const ::at::Tensor& at(::std::size_t index, ::std::source_location where = ::std::source_location::current()) const {
    check_fresh(where);
    if (index >= size()) {
      throw usage_error(
          detail::concat("GraphedOutputs: output ", index, " requested, but the callable returned ", size()),
          where);
    }
    return (*tensors_)[index];
  }
  const ::std::vector<::at::Tensor>& tensors(::std::source_location where = ::std::source_location::current()) const {
    check_fresh(where);
    return tensors_ ? *tensors_ : no_tensors();
  }

  // True when these are fast-mode views and a later replay has overwritten them.
  bool stale() const noexcept {
    return generation_ != nullptr && generation_->load(::std::memory_order_acquire) != valid_generation_;
  }
  // True when the tensors alias the static outputs (fast mode, graph replay).
  bool is_view() const noexcept { return generation_ != nullptr; }

  // Copies of their own (checked first).
  ::std::vector<::at::Tensor> clone(::std::source_location where = ::std::source_location::current()) const {
    check_fresh(where);
    ::std::vector<::at::Tensor> out;
    out.reserve(size());
    for (const ::at::Tensor& t : tensors(where)) {
      out.push_back(t.clone());
    }
    return out;
  }
  // The tensors, unchecked from here on (checked once now).
  ::std::vector<::at::Tensor> release(::std::source_location where = ::std::source_location::current()) && {
    check_fresh(where);
    generation_.reset();
    ::std::shared_ptr<::std::vector<::at::Tensor>> held = ::std::exchange(tensors_, nullptr);
    if (!held) {
      return {};
    }
    // Fast-mode views may be shared with the GraphedCallable's cache: copied then.
    return held.use_count() == 1 ? ::std::move(*held) : *held;
  }

  ::std::int64_t batch() const noexcept { return batch_; }
  // The bucket the call ran as (the batch itself when it ran eagerly above the largest bucket).
  ::std::int64_t padded_batch() const noexcept { return padded_batch_; }
  RouteKind route() const noexcept { return route_; }
  // True when a graph computed these (as opposed to an eager run).
  bool graphed() const noexcept { return Route<::std::int64_t>{padded_batch_, route_}.graph(); }

 private:
  friend class GraphedCallable;

  void check_fresh(const ::std::source_location& where) const {
    if (stale()) [[unlikely]] {
      throw stale_output_error(detail::concat("GraphedOutputs: these fast-mode outputs (GraphedFlags::view_outputs) "
                                              "were overwritten by a later replay of the same GraphedCallable (",
                                              generation_->load(::std::memory_order_acquire) - valid_generation_,
                                              " replay(s) since); clone() them before the next call, or use safe mode"),
                               where);
    }
  }

  static const ::std::vector<::at::Tensor>& no_tensors() noexcept {
    static const ::std::vector<::at::Tensor> none;
    return none;
  }

  // Shared, not copied: fast-mode calls of one batch hand out the same views
  // (GraphedCallable caches them), so a call allocates nothing.
  ::std::shared_ptr<::std::vector<::at::Tensor>> tensors_;
  ::std::shared_ptr<const ::std::atomic<::std::uint64_t>> generation_;  // null: owned, never stale
  ::std::uint64_t valid_generation_ = 0;
  ::std::int64_t batch_ = 0;
  ::std::int64_t padded_batch_ = 0;
  RouteKind route_ = RouteKind::eager_fallback;
};

}  // namespace replay
