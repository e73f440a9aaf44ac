#pragma once
// ShapeRouter: one CUDA graph per shape (or per bucket of shapes), chosen at
// run time. A CUDA graph replays only the shapes it was captured with, but a
// service sees changing batch sizes and sequence lengths; the router keeps one
// graph per key, pads keys up to buckets when asked to, captures on demand
// (after N eager warm-ups) or all at start (largest first), bounds the number
// and bytes of graphs with LRU eviction, and falls back to eager execution,
// once logged and never thrown, when a shape cannot be captured.
//
//   replay::ShapeRouter<int> router(
//       [&](int batch, replay::StreamRef s) { model(batch, s); },   // issues one shape's work
//       {.policy = replay::RoutingPolicy::bucketed, .buckets = {{1, 2, 4, 8, 16, 32, 64}}});
//   router.capture_all(stream);                      // optional: every bucket now, largest first
//   const int padded = router.padded_shape(batch);   // pad inputs up to this
//   router.run(batch, stream);                       // a hit is one lookup and one cudaGraphLaunch
//
// The policy logic is a template over the backend (graph type plus how to
// capture, update and launch it): CudaGraphBackend (Graph + GraphExec) on the
// GPU, a stand-in in the CPU tests. See docs/shape_router.md.
#include <replay/detail/require_cxx20.hpp>

// IWYU pragma: begin_exports
#include "replay/shape_router/keys.hpp"
#include "replay/shape_router/options.hpp"
#include "replay/shape_router/stats.hpp"
#include "replay/shape_router/backend.hpp"
#include "replay/shape_router/graph_memory.hpp"
#include "replay/shape_router/cuda_backend.hpp"
#include "replay/shape_router/router.hpp"
// IWYU pragma: end_exports
