#pragma once
// StreamPipeline<In, Out>: "load the next batch while computing this one".
// Items stream through K slots; each slot owns a pinned host input and output,
// device input and output buffers, and the events that order its stages. The
// stages run on three streams, host-to-device copy, compute and
// device-to-host copy, so that copies in both directions overlap compute.
//
//   replay::StreamPipeline<float> pipeline(
//       {.input_capacity = 1 << 20, .slots = 3},
//       [](replay::BufferView<float> in, replay::BufferView<float> out, replay::StreamRef s) {
//         my_kernel<<<grid(in.size()), 256, 0, s.get()>>>(in.data(), out.data(), in.size());
//         replay::check_last_launch();
//       });
//   auto ticket = pipeline.submit(std::span<const float>(batch));   // blocks while every slot is busy
//   std::vector<float> result = ticket.get();                        // or pipeline.run(batches)
//
// Results come back in submission order; an error in one item reaches that
// item's ticket (or callback) alone. Pinned inputs and destinations are used
// in place (a PinnedBuffer, pinned BufferView or RegisteredHostBuffer is known
// pinned from its type); pageable ones go through the slot's pinned staging in
// chunks, the host copy of one chunk overlapping the DMA of the last, spread
// over a few helper threads for large items. A completion thread owned by the
// pipeline waits for items, delivers their outputs and frees their slots; no
// CUDA host callback is used. See docs/stream_pipeline.md.
#include <replay/detail/require_cxx20.hpp>

// IWYU pragma: begin_exports
#include "replay/stream_pipeline/options.hpp"
#include "replay/stream_pipeline/registered_host_buffer.hpp"
#include "replay/stream_pipeline/host_range.hpp"
#include "replay/stream_pipeline/completion.hpp"
#include "replay/stream_pipeline/stats.hpp"
#include "replay/stream_pipeline/ticket.hpp"
#include "replay/stream_pipeline/stage_runner.hpp"
#include "replay/stream_pipeline/producer.hpp"
#include "replay/stream_pipeline/basic_pipeline.hpp"
#include "replay/stream_pipeline/pipeline.hpp"
// IWYU pragma: end_exports
