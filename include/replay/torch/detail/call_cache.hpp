#pragma once
// What GraphedCallable's call path keeps from one call to the next, so that a
// replay costs a table lookup rather than a plan, a memset and fresh views:
// the bucket each batch pads to, how many leading rows of the static inputs
// may hold data (padding is zeroed only when that high-water mark is above
// the batch), and, in fast mode, the output views of each batch.
#include <replay/detail/require_cxx20.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace replay::detail {

class GraphedCallCache {
 public:
  using views_type = ::std::shared_ptr<::std::vector<::at::Tensor>>;

  // For buckets ascending, the last the capacity of the static inputs. Every
  // row may hold data at first (the examples' rows fill them).
  void reset(::std::span<const ::std::int64_t> buckets) {
    capacity_ = buckets.empty() ? 0 : buckets.back();
    padded_.assign(static_cast<::std::size_t>(capacity_) + 1, 0);
    ::std::size_t next = 0;
    for (::std::int64_t batch = 1; batch <= capacity_; ++batch) {
      while (buckets[next] < batch) {
        ++next;
      }
      padded_[static_cast<::std::size_t>(batch)] = buckets[next];
    }
    views_.assign(padded_.size(), Views{});
    dirty_rows_ = capacity_;
  }

  // The bucket `batch` (>= 1) pads to; 0 above the capacity.
  ::std::int64_t padded(::std::int64_t batch) const noexcept {
    return batch <= capacity_ ? padded_[static_cast<::std::size_t>(batch)] : 0;
  }

  // Rows at and above this may be assumed zero in every static input.
  ::std::int64_t dirty_rows() const noexcept { return dirty_rows_; }
  // Rows [0, rows) are about to receive data (marked before the copy, so that
  // a copy that fails half-way leaves the mark on the safe side).
  void mark_written(::std::int64_t rows) noexcept { dirty_rows_ = ::std::max(dirty_rows_, rows); }
  // Rows [rows, dirty_rows()) were zeroed in every static input.
  void mark_zeroed_from(::std::int64_t rows) noexcept { dirty_rows_ = rows; }

  // Fast mode: the views made for `batch` from `launched`, if they still are
  // views of it (the same static outputs, nobody changed their shape); null
  // otherwise. `padded` is the bucket of `batch`.
  const views_type* find_views(::std::int64_t batch, ::std::int64_t padded,
                               const ::std::vector<::at::Tensor>& launched) const noexcept {
    const Views& entry = views_[static_cast<::std::size_t>(batch)];
    if (entry.source != &launched || !entry.views || entry.views->size() != launched.size()) {
      return nullptr;
    }
    for (::std::size_t i = 0; i < launched.size(); ++i) {
      if (!is_output_view(entry.views->at(i), launched[i], batch, padded)) {
        return nullptr;
      }
    }
    return &entry.views;
  }
  const views_type& store_views(::std::int64_t batch, const ::std::vector<::at::Tensor>& launched, views_type views) {
    Views& entry = views_[static_cast<::std::size_t>(batch)];
    entry.source = &launched;
    entry.views = ::std::move(views);
    return entry.views;
  }
  // Called before any work that may capture, re-capture or evict: the cached
  // views must not keep the static outputs of a graph that goes away.
  void drop_views() noexcept {
    if (has_views_) {
      for (Views& entry : views_) {
        entry = Views{};
      }
      has_views_ = false;
    }
  }
  void note_views_stored() noexcept { has_views_ = true; }

  // True when `output` is what a call of `batch` hands out for the static
  // output `base`: `base` itself, or its first `batch` rows when `base` has
  // the bucket as dimension 0.
  static bool is_output_view(const ::at::Tensor& output, const ::at::Tensor& base, ::std::int64_t batch,
                             ::std::int64_t padded) noexcept {
    if (!sliced(base, batch, padded)) {
      return output.unsafeGetTensorImpl() == base.unsafeGetTensorImpl();
    }
    return output.defined() && output.dim() == base.dim() && output.size(0) == batch &&
           output.const_data_ptr() == base.const_data_ptr() && output.strides() == base.strides() &&
           output.sizes().slice(1) == base.sizes().slice(1);
  }
  // True when a call of `batch` returns the first `batch` rows of `base`.
  static bool sliced(const ::at::Tensor& base, ::std::int64_t batch, ::std::int64_t padded) noexcept {
    return padded > batch && base.dim() > 0 && base.size(0) == padded;
  }

 private:
  struct Views {
    const ::std::vector<::at::Tensor>* source = nullptr;  // the static outputs they were made from
    views_type views;
  };

  ::std::int64_t capacity_ = 0;
  ::std::vector<::std::int64_t> padded_;  // by batch, 1..capacity
  ::std::vector<Views> views_;            // by batch, 1..capacity
  ::std::int64_t dirty_rows_ = 0;
  bool has_views_ = false;
};

}  // namespace replay::detail
