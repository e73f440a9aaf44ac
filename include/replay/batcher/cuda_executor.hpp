#pragma once
#include <replay/detail/require_cxx20.hpp>
// StagedCudaExecutor: a BatchExecutor over static device buffers. The
// Batcher writes a batch's rows into pinned staging; run(rows) zeroes the
// padding rows there, copies the padded batch to the device input in ONE
// host-to-device copy, issues the work (a ShapeRouter replay, or any
// callable), copies the real output rows back in ONE device-to-host copy,
// and waits for the stream.
//
//   replay::ShapeRouter<int> router(forward, replay::ShapeRouterOptions<int>::bucketed({1, 2, 4, 8, 16, 32, 64}));
//   replay::Batcher batcher(replay::router_executor(router, input.view(), output.view(), 256, 10, stream));
#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <functional>
#include <source_location>
#include <span>
#include <utility>
#include <vector>

#include "replay/batcher/policy.hpp"
#include "replay/batcher/detail/message.hpp"
#include "replay/error.hpp"
#include "replay/shape_router.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

template <BufferElement In, BufferElement Out = In>
class StagedCudaExecutor {
 public:
  using input_type = In;
  using output_type = Out;
  // Issues the batch's work on `stream`: the first `padded_rows` rows of the
  // device input are valid (rows beyond `rows` are zero); the first `rows`
  // rows of the device output are read back.
  using issue_type = ::std::function<void(::std::size_t rows, ::std::size_t padded_rows, StreamRef stream)>;

  // `batch_sizes`: strictly ascending; the device buffers hold at least the
  // largest batch. The buffers and the stream are borrowed and must outlive
  // the executor; the executor owns its pinned staging.
  StagedCudaExecutor(issue_type issue, BufferView<In> device_input, BufferView<Out> device_output,
                     ::std::size_t input_row_elements, ::std::size_t output_row_elements,
                     ::std::vector<::std::size_t> batch_sizes, StreamRef stream,
                     ::std::source_location where = ::std::source_location::current())
      : issue_(::std::move(issue)),
        input_(device_input),
        output_(device_output),
        in_row_(input_row_elements),
        out_row_(output_row_elements),
        sizes_(::std::move(batch_sizes)),
        stream_(stream),
        staging_in_(checked_elements(input_row_elements, output_row_elements, sizes_, device_input.size(),
                                     device_output.size(), issue_, where) *
                        input_row_elements,
                    where),
        staging_out_(sizes_.back() * output_row_elements, where) {}

  ::std::size_t input_row_elements() const noexcept { return in_row_; }
  ::std::size_t output_row_elements() const noexcept { return out_row_; }
  ::std::vector<::std::size_t> batch_sizes() const { return sizes_; }
  ::std::span<In> input_staging() noexcept { return staging_in_.span(); }

  ::std::span<const Out> run(::std::size_t rows, ::std::source_location where = ::std::source_location::current()) {
    if (rows == 0 || rows > sizes_.back()) {
      throw usage_error(detail::batcher_message("StagedCudaExecutor::run(): ", rows,
                                                " rows is outside 1..the largest batch (", sizes_.back(), ")"),
                        where);
    }
    const ::std::size_t padded = padded_batch_rows(sizes_, rows);
    const ::std::span<In> staging = staging_in_.span();
    ::std::fill(staging.begin() + static_cast<::std::ptrdiff_t>(rows * in_row_),
                staging.begin() + static_cast<::std::ptrdiff_t>(padded * in_row_), In{});
    try {
      input_.first(padded * in_row_, where).copy_from(staging_in_.first(padded * in_row_, where), stream_, where);
      issue_(rows, padded, stream_);
      staging_out_.first(rows * out_row_, where).copy_from(output_.first(rows * out_row_, where), stream_, where);
      stream_.synchronize(where);
    } catch (...) {
      // The staging areas are written again by the next batch: nothing of
      // this one may still be in flight. Its own error is the one to report.
      (void)::cudaStreamSynchronize(stream_.get());
      throw;
    }
    return {staging_out_.data(), rows * out_row_};
  }

  StreamRef stream() const noexcept { return stream_; }

 private:
  // Validates everything before the pinned buffers are allocated; returns the largest batch.
  static ::std::size_t checked_elements(::std::size_t in_row, ::std::size_t out_row,
                                        const ::std::vector<::std::size_t>& sizes, ::std::size_t input_elements,
                                        ::std::size_t output_elements, const issue_type& issue,
                                        const ::std::source_location& where) {
    if (!issue) {
      throw usage_error("StagedCudaExecutor: the issue callable is empty", where);
    }
    if (in_row == 0 || out_row == 0) {
      throw usage_error("StagedCudaExecutor: row sizes must be positive", where);
    }
    if (sizes.empty() || sizes.front() == 0 || !::std::is_sorted(sizes.begin(), sizes.end()) ||
        ::std::adjacent_find(sizes.begin(), sizes.end()) != sizes.end()) {
      throw usage_error("StagedCudaExecutor: batch sizes must be positive and strictly ascending", where);
    }
    const ::std::size_t largest = sizes.back();
    if (input_elements < largest * in_row || output_elements < largest * out_row) {
      throw usage_error(detail::batcher_message("StagedCudaExecutor: the device buffers hold ", input_elements,
                                                " input and ", output_elements, " output elements; the largest batch (",
                                                largest, " rows) needs ", largest * in_row, " and ",
                                                largest * out_row),
                        where);
    }
    return largest;
  }

  issue_type issue_;
  BufferView<In> input_;
  BufferView<Out> output_;
  ::std::size_t in_row_;
  ::std::size_t out_row_;
  ::std::vector<::std::size_t> sizes_;
  StreamRef stream_;
  PinnedBuffer<In> staging_in_;
  PinnedBuffer<Out> staging_out_;
};

// A StagedCudaExecutor whose batches are replays of `router` (bucketed, one
// integral dimension: the batch size); its batch sizes are the router's
// buckets. The router is borrowed and must outlive the executor. Its runs on
// `stream` are outside any lease: under the router's default
// StreamSharing::lease_required, `stream` becomes the router's stream, and
// another executor (or unleased run) on another stream is refused.
template <::std::integral Key, class Backend, BufferElement In, BufferElement Out>
  requires ::std::same_as<typename Backend::stream_type, StreamRef>
StagedCudaExecutor<In, Out> router_executor(ShapeRouter<Key, Backend>& router, BufferView<In> device_input,
                                            BufferView<Out> device_output, ::std::size_t input_row_elements,
                                            ::std::size_t output_row_elements, StreamRef stream,
                                            ::std::source_location where = ::std::source_location::current()) {
  const auto& options = router.options();
  if (options.policy != RoutingPolicy::bucketed || options.buckets.size() != 1) {
    throw usage_error("router_executor(): the router must be bucketed with one bucket list (the batch size)", where);
  }
  ::std::vector<::std::size_t> sizes;
  for (const auto bucket : options.buckets.front()) {
    sizes.push_back(static_cast<::std::size_t>(bucket));
  }
  return StagedCudaExecutor<In, Out>(
      [&router](::std::size_t rows, ::std::size_t, StreamRef s) { router.run(static_cast<Key>(rows), s); },
      device_input, device_output, input_row_elements, output_row_elements, ::std::move(sizes), stream, where);
}

}  // namespace replay
