#pragma once
// Several decode steps per launch: the captured step repeated in a WHILE node.
// Defined in loop_control.cu (device code: the node's condition is set by a
// kernel); declared here for the libtorch side, which nvcc does not compile.
#include <cstdint>

#include <replay/graph.hpp>

namespace llm_decode {

// A graph holding one WHILE node whose body runs `step` (as a child graph)
// and then a one-thread kernel that sets the loop's condition from
// `*keep_going` (device memory the step writes: non-zero to run another pass).
// The body runs at least once per launch.
replay::Graph make_decode_loop(replay::GraphRef step, const std::int64_t* keep_going);

}  // namespace llm_decode
