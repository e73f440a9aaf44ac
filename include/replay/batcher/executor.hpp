#pragma once
#include <replay/detail/require_cxx20.hpp>
// BatchExecutor: what a Batcher runs. The Batcher gathers requests, writes
// their rows one after another into the executor's input staging area, and
// calls run(rows); the executor pads the batch up to one of its batch sizes,
// runs it, and returns the rows of output. A Batcher calls an executor from
// one thread at a time (its worker), so an executor needs no locking.
//
// An executor provides
//   input_type, output_type                       element types of a row
//   std::size_t input_row_elements() const        elements per input row (> 0)
//   std::size_t output_row_elements() const       elements per output row (> 0)
//   std::vector<std::size_t> batch_sizes() const  the sizes it runs, strictly
//                                                 ascending; the last is the largest batch
//   std::span<input_type> input_staging()         room for the largest batch
//   std::span<const output_type> run(std::size_t rows)
//       runs the first `rows` rows of the staging area (rows <= largest batch)
//       and returns at least rows * output_row_elements() elements, valid
//       until the next run(); throws on failure.
// StagedCudaExecutor (replay/batcher/cuda_executor.hpp) is the CUDA one; the
// CPU tests use a stand-in.
#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

namespace replay {

template <class E>
concept BatchExecutor = requires { typename E::input_type; typename E::output_type; } &&
                        requires(E& executor, const E& const_executor, ::std::size_t rows) {
                          { const_executor.input_row_elements() } -> ::std::convertible_to<::std::size_t>;
                          { const_executor.output_row_elements() } -> ::std::convertible_to<::std::size_t>;
                          { const_executor.batch_sizes() } -> ::std::convertible_to<::std::vector<::std::size_t>>;
                          { executor.input_staging() } -> ::std::same_as<::std::span<typename E::input_type>>;
                          { executor.run(rows) } -> ::std::same_as<::std::span<const typename E::output_type>>;
                        };

}  // namespace replay
