#pragma once
// Graphviz DOT of a piecewise executable: segments as boxes (their node
// counts by type), regions as hexagons, the edges after a region labelled
// with the value that leads there.
#include <replay/detail/require_cxx20.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "replay/detail/message.hpp"
#include "replay/graph.hpp"
#include "replay/piecewise/detail/capture.hpp"

namespace replay::detail {

// A region value's bytes as text: an unsigned integer (little-endian) up to 8 bytes, hex bytes beyond.
inline ::std::string region_value_text(::std::string_view bytes) {
  if (bytes.empty()) {
    return {};
  }
  if (bytes.size() <= 8) {
    ::std::uint64_t value = 0;
    for (::std::size_t i = bytes.size(); i-- > 0;) {
      value = (value << 8) | static_cast<unsigned char>(bytes[i]);
    }
    return ::std::to_string(value);
  }
  static constexpr char digits[] = "0123456789abcdef";
  ::std::string out = "0x";
  for (const char c : bytes) {
    out += digits[static_cast<unsigned char>(c) >> 4];
    out += digits[static_cast<unsigned char>(c) & 0xF];
  }
  return out;
}

inline void append_dot(const PiecewiseNode& node, ::std::size_t& next_id, ::std::string& out) {
  const ::std::size_t id = next_id++;
  ::std::size_t nodes = 0;
  ::std::string counts;
  for (const auto& [type, count] : node.segment.node_counts) {
    nodes += count;
    counts += concat(counts.empty() ? "" : ", ", count, " ", to_string(type));
  }
  out += concat("  s", id, " [shape=box, label=\"segment ", id, "\\n", nodes, " nodes",
                counts.empty() ? ::std::string() : concat(": ", counts), "\"];\n");
  if (!node.segment.has_region) {
    return;
  }
  out += concat("  r", id, " [shape=hexagon, style=filled, fillcolor=lightyellow, label=\"region ",
                dot_escaped(node.segment.region_name), "\\n(eager, host)\"];\n  s", id, " -> r", id, ";\n");
  for (const auto& [key, child] : node.children) {
    const ::std::size_t child_id = next_id;
    append_dot(*child, next_id, out);
    const ::std::string label = region_value_text(key);
    out += label.empty() ? concat("  r", id, " -> s", child_id, ";\n")
                         : concat("  r", id, " -> s", child_id, " [label=\"", label, "\"];\n");
  }
}

inline ::std::string piecewise_dot(const PiecewiseTree& tree) {
  ::std::string out = "digraph piecewise {\n  rankdir=TB;\n";
  if (const PiecewiseNode* root = tree.root()) {
    ::std::size_t next_id = 0;
    append_dot(*root, next_id, out);
  }
  out += "}\n";
  return out;
}

}  // namespace replay::detail
