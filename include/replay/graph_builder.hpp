#pragma once
#include <replay/detail/require_cxx20.hpp>
// Building graphs by hand: typed nodes with explicit dependencies, node
// handles for in-place updates on executable graphs, and conditional nodes
// (IF, IF/ELSE, WHILE, SWITCH). See docs/graph_builder.md.
#include "replay/graph_builder/node.hpp"
#include "replay/graph_builder/kernel_node.hpp"
#include "replay/graph_builder/memcpy_node.hpp"
#include "replay/graph_builder/memset_node.hpp"
#include "replay/graph_builder/host_node.hpp"
#include "replay/graph_builder/child_graph_node.hpp"
#include "replay/graph_builder/event_nodes.hpp"
#include "replay/graph_builder/memory_nodes.hpp"
#include "replay/graph_builder/conditional.hpp"
#include "replay/graph_builder/builder.hpp"
#include "replay/graph_builder/conditional_node.hpp"
