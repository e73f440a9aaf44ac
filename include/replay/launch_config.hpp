#pragma once
#include <replay/detail/require_cxx20.hpp>
// LaunchConfig: a kernel's grid, block and dynamic shared memory.
// LaunchAttributes: what a launch asks of CUDA beyond that (programmatic
// stream serialization, priority, cluster dimensions), as typed values.
// LaunchOptions: both, and the caller's source line, for replay::launch
// (launch.hpp), whose kernel arguments are variadic and so cannot be followed
// by a defaulted std::source_location: the line rides on LaunchOptions'
// converting constructors, as it does on Deps and ExecSite.
#include <cuda_runtime_api.h>

#include <optional>
#include <source_location>

namespace replay {

// Grid, block and dynamic shared memory of a kernel launch or kernel node.
struct LaunchConfig {
  // Blocks in the grid.
  ::dim3 grid{1, 1, 1};
  // Threads in a block.
  ::dim3 block{1, 1, 1};
  // Dynamic shared memory per block, in bytes.
  unsigned int shared_bytes = 0;
};

// Whether a launch asks for programmatic stream serialization
// (cudaLaunchAttributeProgrammaticStreamSerialization):
// - off: a plain launch;
// - required: programmatic, and replay::launch refuses it with a usage_error
//   where the device is older than 9.0 or the kernel's code there was
//   compiled from older PTX (its wait compiled out);
// - where_supported: programmatic where programmatic_launch_supported(kernel)
//   holds when the kernel is launched, a plain launch elsewhere, never a
//   refusal (the kernel's wait_for_prerequisite_grid() is then a no-op or
//   compiled out, and it starts after its predecessor has finished). For code
//   that runs on any GPU.
enum class ProgrammaticSerialization : unsigned char { off, required, where_supported };

// The attributes of a launch (cudaLaunchAttribute), each set by its own
// builder call (a later call for the same attribute replaces the earlier
// one); those not set are not passed to CUDA.
//
//   auto attributes = replay::LaunchAttributes{}.with_programmatic_serialization().with_priority(-1);
//
// Programmatic stream serialization and cluster dimensions need a device of
// compute capability 9.0 or newer; replay::launch refuses them elsewhere with
// a usage_error, except programmatic serialization asked for where supported.
class LaunchAttributes {
 public:
  constexpr LaunchAttributes() noexcept = default;

  // Attributes asking for programmatic dependent launch only.
  [[nodiscard]] static constexpr LaunchAttributes programmatic() noexcept {
    return LaunchAttributes{}.with_programmatic_serialization();
  }
  // Attributes asking for programmatic dependent launch where the device and
  // the kernel take it, and for a plain launch elsewhere.
  [[nodiscard]] static constexpr LaunchAttributes programmatic_where_supported() noexcept {
    return LaunchAttributes{}.with_programmatic_serialization(ProgrammaticSerialization::where_supported);
  }

  // Lets this kernel start before the previous kernel on its stream has
  // finished (cudaLaunchAttributeProgrammaticStreamSerialization): it must call
  // replay::wait_for_prerequisite_grid() (pdl.hpp) before it reads what that
  // kernel writes. Captured into a graph, the edge from the previous kernel is
  // a programmatic edge (EdgeKind::programmatic). `mode` as above; off takes
  // an earlier request back.
  constexpr LaunchAttributes& with_programmatic_serialization(
      ProgrammaticSerialization mode = ProgrammaticSerialization::required) noexcept {
    programmatic_ = mode;
    return *this;
  }
  // The launch's priority among the device's work (cudaLaunchAttributePriority;
  // lower numbers run first, as for stream priorities; CUDA clamps the value
  // to the device's range).
  constexpr LaunchAttributes& with_priority(int priority) noexcept {
    priority_ = priority;
    return *this;
  }
  // Thread block clusters of `dims` blocks (cudaLaunchAttributeClusterDimension);
  // each grid dimension must be a multiple of the cluster's.
  constexpr LaunchAttributes& with_cluster_dims(::dim3 dims) noexcept {
    cluster_ = dims;
    return *this;
  }

  // How programmatic stream serialization is asked for.
  constexpr ProgrammaticSerialization programmatic_serialization() const noexcept { return programmatic_; }
  // The priority asked for, if any.
  constexpr ::std::optional<int> priority() const noexcept { return priority_; }
  // The cluster dimensions asked for, if any.
  constexpr ::std::optional<::dim3> cluster_dims() const noexcept { return cluster_; }
  // How many attributes are set: the number passed to CUDA, or one more where
  // programmatic serialization asked for where supported is not supported.
  constexpr unsigned int count() const noexcept {
    return (programmatic_ != ProgrammaticSerialization::off ? 1U : 0U) + (priority_ ? 1U : 0U) +
           (cluster_ ? 1U : 0U);
  }
  // Whether any attribute is set.
  constexpr bool empty() const noexcept { return count() == 0; }
  // Whether an attribute needs compute capability 9.0 or newer (launch()
  // refuses it elsewhere; programmatic serialization where supported does not).
  constexpr bool needs_sm90() const noexcept {
    return programmatic_ == ProgrammaticSerialization::required || cluster_.has_value();
  }

 private:
  ProgrammaticSerialization programmatic_ = ProgrammaticSerialization::off;
  ::std::optional<int> priority_;
  ::std::optional<::dim3> cluster_;
};

// What replay::launch takes besides the kernel and its arguments: the launch
// configuration, its attributes, and the caller's source line (captured by
// these converting constructors where the call is written, since the kernel's
// arguments come last). Written in place at the call:
//
//   replay::launch(s, {blocks, threads}, kernel, x, n);                          // grid, block
//   replay::launch(s, {config, replay::LaunchAttributes::programmatic()}, kernel, x, n);
class LaunchOptions {
 public:
  // `config` with `attributes`.
  LaunchOptions(const LaunchConfig& config, const LaunchAttributes& attributes = {},  // NOLINT: implicit by design
                ::std::source_location where = ::std::source_location::current()) noexcept
      : config_(config), attributes_(attributes), where_(where) {}
  // A grid of `grid` blocks of `block` threads, `shared_bytes` of dynamic shared memory.
  LaunchOptions(::dim3 grid, ::dim3 block, unsigned int shared_bytes = 0,  // NOLINT: implicit by design
                const LaunchAttributes& attributes = {},
                ::std::source_location where = ::std::source_location::current()) noexcept
      : config_{grid, block, shared_bytes}, attributes_(attributes), where_(where) {}

  // The grid, block and dynamic shared memory.
  const LaunchConfig& config() const noexcept { return config_; }
  // The attributes.
  const LaunchAttributes& attributes() const noexcept { return attributes_; }
  // Where the launch was written.
  const ::std::source_location& where() const noexcept { return where_; }

 private:
  LaunchConfig config_;
  LaunchAttributes attributes_;
  ::std::source_location where_;
};

}  // namespace replay
