#pragma once
#include <replay/detail/require_cxx20.hpp>
// Building graphs by hand: typed nodes with explicit dependencies, node
// handles for in-place updates on executable graphs, and conditional nodes
// (IF, IF/ELSE, WHILE, SWITCH). See docs/graph_builder.md.
#include "replay/graph/node.hpp"
#include "replay/graph/kernel_node.hpp"
#include "replay/graph/memcpy_node.hpp"
#include "replay/graph/memset_node.hpp"
#include "replay/graph/host_node.hpp"
#include "replay/graph/child_graph_node.hpp"
#include "replay/graph/event_nodes.hpp"
#include "replay/graph/memory_nodes.hpp"
#include "replay/graph/conditional.hpp"
#include "replay/graph/builder.hpp"
#include "replay/graph/conditional_node.hpp"
