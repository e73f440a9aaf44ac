#pragma once
#include <replay/detail/require_cxx20.hpp>
// Programmatic dependent launch, the kernel's side: wait for the grid this
// one depends on, and let the grids that depend on this one start. For
// kernels launched with LaunchAttributes::with_programmatic_serialization()
// (launch.hpp), or joined by a programmatic edge in a graph
// (GraphBuilder::add_programmatic_dependency). Device code: the functions
// exist where a CUDA compiler compiles (__CUDACC__), and compile to nothing
// below sm_90, where there are no programmatic launches (a kernel there starts
// after its predecessor has finished, so there is nothing to wait for).
//
// A kernel launched programmatically may start while the kernel before it is
// still running. Before wait_for_prerequisite_grid() it may:
//   - read inputs that no earlier kernel of the chain writes (weights,
//     constants, its own parameters), compute addresses, prefetch;
// it must not:
//   - read anything the prerequisite kernel (or one before it) writes: those
//     writes are visible only after the wait;
//   - write anything the prerequisite kernel (or one before it) reads or
//     writes.
// The wait returns once the prerequisite grid has completed and its memory
// operations are visible, whether or not that grid called
// release_dependent_grids(); without a programmatic prerequisite it returns
// at once. A kernel that reads a predecessor's output calls it on every path
// that reads, in every thread that reads.
//
//   __global__ void layer(const float* weights, const float* in, float* out, int n) {
//     const float w = weights[threadIdx.x];   // not written by the chain: fine before the wait
//     replay::wait_for_prerequisite_grid();   // `in` is the previous kernel's output
//     replay::release_dependent_grids();      // the next kernel may start its prologue
//     ...
//   }

namespace replay {

#if defined(__CUDACC__)

// Waits until the grids this kernel depends on programmatically have completed
// and their memory is visible (griddepcontrol.wait, as
// cudaGridDependencySynchronize). Nothing below sm_90.
__device__ __forceinline__ void wait_for_prerequisite_grid() noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Signals that the grids depending on this one programmatically may be
// scheduled now (griddepcontrol.launch_dependents, as
// cudaTriggerProgrammaticLaunchCompletion); once every block has signalled or
// exited, they may start. It does not make this grid's writes visible to
// them: their wait does, at this grid's completion. Nothing below sm_90.
__device__ __forceinline__ void release_dependent_grids() noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif  // __CUDACC__

}  // namespace replay
