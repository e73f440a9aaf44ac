// Programmatic dependent launch on the CPU: launch()'s compile-time argument
// checks, LaunchAttributes and LaunchOptions, the checks launch() makes before
// any CUDA call, the refusal of attributes a device lacks, CUDA's attribute
// list and edge data as replay writes and reads them.
#include <doctest/doctest.h>

#include <source_location>
#include <string>

#include "replay/graph.hpp"
#include "replay/graph_builder.hpp"
#include "replay/launch.hpp"
#include "replay/pdl.hpp"
#include "replay/programmatic_launch.hpp"
#include "usage_message.hpp"

namespace {
void scale(float*, int, float) {}
void no_args() {}

using replay_test::contains;
using replay_test::usage_message;
}  // namespace

// launch() takes what add_kernel takes: its arguments checked against the kernel's parameters.
static_assert(replay::kernel_arguments_for<decltype(&scale), float*, int, float>);
static_assert(!replay::kernel_arguments_for<decltype(&scale), const float*, int, float>);
static_assert(!replay::kernel_arguments_for<decltype(&scale), float*, int>);
static_assert(replay::kernel_arguments_for<decltype(&no_args)>);

// Attributes are typed values, built by their own calls, usable in constant expressions.
static_assert(replay::LaunchAttributes{}.empty());
static_assert(!replay::LaunchAttributes{}.needs_sm90());
using replay::ProgrammaticSerialization;
static_assert(replay::LaunchAttributes{}.programmatic_serialization() == ProgrammaticSerialization::off);
static_assert(replay::LaunchAttributes::programmatic().programmatic_serialization() == ProgrammaticSerialization::required);
static_assert(replay::LaunchAttributes::programmatic().needs_sm90());
static_assert(replay::LaunchAttributes::programmatic().count() == 1);
static_assert(replay::LaunchAttributes{}.with_priority(-2).priority() == -2);
static_assert(!replay::LaunchAttributes{}.with_priority(-2).needs_sm90());
static_assert(replay::LaunchAttributes{}.with_cluster_dims(dim3(2)).needs_sm90());
static_assert(replay::LaunchAttributes{}.with_programmatic_serialization().with_priority(0).with_cluster_dims(dim3(2)).count() ==
              3);
// Where supported: asked for and counted, never refused, so it needs no 9.0 device.
constexpr auto where_supported = replay::LaunchAttributes::programmatic_where_supported();
static_assert(where_supported.programmatic_serialization() == ProgrammaticSerialization::where_supported);
static_assert(!where_supported.needs_sm90());
static_assert(where_supported.count() == 1);
static_assert(!where_supported.empty());
static_assert(replay::LaunchAttributes{}
                  .with_programmatic_serialization(ProgrammaticSerialization::where_supported)
                  .with_cluster_dims(dim3(2))
                  .needs_sm90());
// One setting: a later call replaces an earlier one, off takes it back.
static_assert(replay::LaunchAttributes::programmatic_where_supported().with_programmatic_serialization().needs_sm90());
static_assert(replay::LaunchAttributes::programmatic()
                  .with_programmatic_serialization(ProgrammaticSerialization::where_supported)
                  .programmatic_serialization() == ProgrammaticSerialization::where_supported);
static_assert(replay::LaunchAttributes::programmatic()
                  .with_programmatic_serialization(ProgrammaticSerialization::off)
                  .empty());

static_assert(replay::to_string(replay::EdgeKind::programmatic) == "programmatic");
static_assert(replay::to_string(replay::EdgeKind::launch_completion) == "launch_completion");
static_assert(replay::to_string(replay::EdgeKind::plain) == "plain");

TEST_SUITE("host") {
  TEST_CASE("LaunchOptions takes a config, or grid and block, with attributes and the caller's line") {
    const auto take = [](const replay::LaunchOptions& options) { return options; };
    const replay::LaunchOptions grid_block = take({4, 256});
    CHECK(grid_block.config().grid.x == 4);
    CHECK(grid_block.config().block.x == 256);
    CHECK(grid_block.config().shared_bytes == 0);
    CHECK(grid_block.attributes().empty());
    const replay::LaunchConfig config{dim3(2, 3), dim3(64), 128};
    const int line = static_cast<int>(std::source_location::current().line()) + 1;
    const replay::LaunchOptions with = take({config, replay::LaunchAttributes::programmatic().with_priority(1)});
    CHECK(static_cast<int>(with.where().line()) == line);
    CHECK(with.config().grid.y == 3);
    CHECK(with.config().shared_bytes == 128);
    CHECK(with.attributes().programmatic_serialization() == ProgrammaticSerialization::required);
    CHECK(with.attributes().priority() == 1);
    CHECK_FALSE(with.attributes().cluster_dims().has_value());
  }

  TEST_CASE("launch refuses a null kernel, a zero dimension and a partial cluster before any CUDA call") {
    const replay::StreamRef s(cudaStreamPerThread);
    float* x = nullptr;
    void (*null_kernel)(float*, int, float) = nullptr;
    CHECK(contains(usage_message([&] { replay::launch(s, {1, 32}, null_kernel, x, 1, 1.0F); }),
                   "null function pointer"));
    CHECK(contains(usage_message([&] { replay::launch(s, {0, 32}, scale, x, 1, 1.0F); }), "at least 1"));
    CHECK(contains(usage_message([&] { replay::launch(s, {dim3(1), dim3(1, 0)}, scale, x, 1, 1.0F); }),
                   "at least 1"));
    const auto cluster = [](dim3 dims) { return replay::LaunchAttributes{}.with_cluster_dims(dims); };
    CHECK(contains(usage_message([&] { replay::launch(s, {dim3(6), dim3(32), 0, cluster(dim3(4))}, scale, x, 1, 1.0F); }),
                   "whole number of clusters"));
    CHECK(contains(usage_message([&] { replay::launch(s, {dim3(6), dim3(32), 0, cluster(dim3(0))}, scale, x, 1, 1.0F); }),
                   "cluster dimensions must all be at least 1"));
    // The error names the caller's line.
    const int line = static_cast<int>(std::source_location::current().line()) + 1;
    const std::string where = usage_message([&] { replay::launch(s, {0, 32}, scale, x, 1, 1.0F); });
    CHECK(contains(where, std::to_string(line).c_str()));
  }

  TEST_CASE("attributes a device older than compute capability 9.0 lacks are refused by name") {
    const auto refuse = [](const replay::LaunchAttributes& attributes, int major) {
      return usage_message([&] {
        replay::detail::refuse_unsupported_attributes(attributes, major, 0, "launch", std::source_location::current());
      });
    };
    const std::string pdl = refuse(replay::LaunchAttributes::programmatic(), 8);
    CHECK(contains(pdl, "programmatic dependent launch"));
    CHECK(contains(pdl, "compute capability 9.0"));
    CHECK(contains(pdl, "has 8.x"));
    CHECK(contains(refuse(replay::LaunchAttributes{}.with_cluster_dims(dim3(2)), 7), "thread block clusters"));
    CHECK(refuse(replay::LaunchAttributes::programmatic(), 9) == "no usage_error");
    CHECK(refuse(replay::LaunchAttributes{}.with_cluster_dims(dim3(2)), 10) == "no usage_error");
    CHECK(refuse(replay::LaunchAttributes{}.with_priority(3), 5) == "no usage_error");  // any device
  }

  TEST_CASE("a programmatic launch of code compiled from PTX older than 9.0 is refused, saying why and what to do") {
    const auto refuse = [](int ptx_version) {
      return usage_message([&] {
        replay::detail::refuse_ptx_below_sm90(ptx_version, 3, "launch", "the kernel",
                                              "launch it without programmatic serialization",
                                              std::source_location::current());
      });
    };
    const std::string ptx80 = refuse(80);
    CHECK(contains(ptx80, "launch: programmatic stream serialization"));
    CHECK(contains(ptx80, "compiled for compute capability 9.0 or newer"));
    CHECK(contains(ptx80, "the kernel runs code JIT-compiled on device 3 from PTX 8.0 (compute_80)"));
    CHECK(contains(ptx80, "compiled out"));
    CHECK(contains(ptx80, "would not wait for its predecessor"));
    CHECK(contains(ptx80, "CMAKE_CUDA_ARCHITECTURES=90"));
    CHECK(contains(ptx80, "-arch=sm_90"));
    CHECK(contains(ptx80, "or launch it without programmatic serialization"));
    CHECK(contains(refuse(89), "from PTX 8.9 (compute_89)"));
    CHECK(contains(refuse(52), "from PTX 5.2"));
    CHECK(refuse(90) == "no usage_error");
    CHECK(refuse(100) == "no usage_error");
    CHECK(refuse(120) == "no usage_error");
  }

  TEST_CASE("programmatic_launch_supported refuses a null kernel before any CUDA call") {
    void (*null_kernel)(float*, int, float) = nullptr;
    const std::string message = usage_message([&] { (void)replay::programmatic_launch_supported(null_kernel); });
    CHECK(contains(message, "programmatic_launch_supported: the kernel is a null function pointer"));
  }

  TEST_CASE("launch attributes become CUDA's list, in order, only those set") {
    cudaLaunchAttribute list[3];
    CHECK(replay::detail::fill_launch_attributes(replay::LaunchAttributes{}, list) == 0);
    // Where supported is resolved by launch() before the list is made: unresolved, it is not passed.
    auto unresolved = replay::LaunchAttributes::programmatic_where_supported().with_priority(-1);
    REQUIRE(replay::detail::fill_launch_attributes(unresolved, list) == 1);
    CHECK(list[0].id == cudaLaunchAttributePriority);
    const auto all = replay::LaunchAttributes{}.with_cluster_dims(dim3(2, 1, 1)).with_priority(-1).with_programmatic_serialization();
    REQUIRE(replay::detail::fill_launch_attributes(all, list) == 3);
    CHECK(list[0].id == cudaLaunchAttributeProgrammaticStreamSerialization);
    CHECK(list[0].val.programmaticStreamSerializationAllowed == 1);
    CHECK(list[1].id == cudaLaunchAttributePriority);
    CHECK(list[1].val.priority == -1);
    CHECK(list[2].id == cudaLaunchAttributeClusterDimension);
    CHECK(list[2].val.clusterDim.x == 2);
    CHECK(list[2].val.clusterDim.y == 1);
    CHECK(list[2].val.clusterDim.z == 1);
  }

#if CUDART_VERSION >= 12030
  TEST_CASE("Deps::programmatic carries its kind and leads only to a kernel node") {
    // A node handle that is never passed to CUDA: validate() looks only at the handles and the kind.
    const replay::Node node = replay::Node::from_native_handle(reinterpret_cast<cudaGraphNode_t>(0x1000));
    const replay::Deps plain{node};
    CHECK(plain.kind() == replay::EdgeKind::plain);
    const replay::Deps programmatic = replay::Deps::programmatic(node);
    CHECK(programmatic.kind() == replay::EdgeKind::programmatic);
    CHECK(programmatic.size() == 1);
    CHECK(replay::Deps::programmatic({node, node}, replay::EdgeKind::launch_completion).kind() ==
          replay::EdgeKind::launch_completion);
    const auto here = std::source_location::current();
    CHECK_NOTHROW(programmatic.validate("add_kernel", here, true));
    CHECK(contains(usage_message([&] { programmatic.validate("add_fill", here); }), "lead only to a kernel node"));
    CHECK(contains(usage_message([&] { replay::Deps::programmatic(replay::Node{}).validate("add_kernel", here, true); }),
                   "empty node handle"));
    CHECK_NOTHROW(plain.validate("add_fill", here));
  }

  TEST_CASE("edge kinds map to CUDA's edge data and back") {
    for (const replay::EdgeKind kind :
         {replay::EdgeKind::plain, replay::EdgeKind::programmatic, replay::EdgeKind::launch_completion}) {
      CHECK(replay::detail::edge_kind(replay::detail::edge_data(kind)) == kind);
    }
    const cudaGraphEdgeData programmatic = replay::detail::edge_data(replay::EdgeKind::programmatic);
    CHECK(programmatic.type == cudaGraphDependencyTypeProgrammatic);
    CHECK(programmatic.from_port == cudaGraphKernelNodePortProgrammatic);
    CHECK(programmatic.to_port == 0);
    const cudaGraphEdgeData plain = replay::detail::edge_data(replay::EdgeKind::plain);
    CHECK(plain.type == cudaGraphDependencyTypeDefault);
    CHECK(plain.from_port == cudaGraphKernelNodePortDefault);
    cudaGraphEdgeData odd{};
    odd.to_port = 1;
    CHECK(replay::detail::edge_kind(odd) == replay::EdgeKind::other);
    CHECK(std::string(replay::detail::dot_edge_style(replay::EdgeKind::programmatic)).find("dashed") !=
          std::string::npos);
    CHECK(replay::detail::dot_edge_style(replay::EdgeKind::plain).empty());
  }
#endif
}
