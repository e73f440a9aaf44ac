#pragma once
// How a float read back in TorchScript decides what follows. A float cannot
// key segments exactly (it changes every call); but when the scripted code
// only compares it with constants and branches on the results
// (`if float(h.abs().max()) > 1e4:`), the segments after the read-back
// depend on those comparisons' outcomes alone, and those outcomes are the
// key, computed at each replay from the new value. Any other use (the value
// flows into a tensor op, a shape, the output) makes the analysis give up:
// the value then keys exactly.
#include <replay/detail/require_cxx20.hpp>

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace replay::detail {

// One comparison of the value read back with a constant.
struct ScalarDecision {
  enum class Compare : unsigned char { gt, lt, ge, le, eq, ne };
  Compare compare = Compare::gt;
  double constant = 0.0;
  bool value_first = true;  // value OP constant; false: constant OP value

  bool evaluate(double value) const noexcept {
    const double a = value_first ? value : constant;
    const double b = value_first ? constant : value;
    switch (compare) {
      case Compare::gt:
        return a > b;
      case Compare::lt:
        return a < b;
      case Compare::ge:
        return a >= b;
      case Compare::le:
        return a <= b;
      case Compare::eq:
        return a == b;
      default:
        return a != b;
    }
  }
};

// What the analysis found for one read-back.
struct ScalarReadAnalysis {
  // Every use of the value is a comparison with a constant whose result is
  // only a prim::If condition: `decisions` key the segments after it.
  bool decisions_only = false;
  ::std::vector<ScalarDecision> decisions;
  // Otherwise, the first use that is not such a comparison ("aten::mul").
  ::std::string other_use;
};

inline ::std::optional<ScalarDecision::Compare> comparison_of(::torch::jit::NodeKind kind) {
  using Compare = ScalarDecision::Compare;
  const ::std::string name = kind.toQualString();
  if (name == "aten::gt") {
    return Compare::gt;
  }
  if (name == "aten::lt") {
    return Compare::lt;
  }
  if (name == "aten::ge") {
    return Compare::ge;
  }
  if (name == "aten::le") {
    return Compare::le;
  }
  if (name == "aten::eq") {
    return Compare::eq;
  }
  if (name == "aten::ne") {
    return Compare::ne;
  }
  return ::std::nullopt;
}

// A float or int constant's value.
inline ::std::optional<double> constant_number(const ::torch::jit::Value* value) {
  const ::torch::jit::Node* node = value->node();
  if (node->kind() != ::torch::jit::prim::Constant || !node->hasAttribute(::torch::jit::attr::value)) {
    return ::std::nullopt;
  }
  const ::c10::IValue constant = ::torch::jit::toIValue(value).value_or(::c10::IValue());
  if (constant.isDouble()) {
    return constant.toDouble();
  }
  if (constant.isInt()) {
    return static_cast<double>(constant.toInt());
  }
  return ::std::nullopt;
}

// How `value` (a float read back: aten::Float, aten::item) is used.
inline ScalarReadAnalysis analyse_scalar_read(const ::torch::jit::Value* value) {
  ScalarReadAnalysis out;
  for (const ::torch::jit::Use& use : value->uses()) {
    const ::torch::jit::Node* user = use.user;
    const auto compare = comparison_of(user->kind());
    if (!compare || user->inputs().size() != 2 || user->outputs().size() != 1) {
      out.other_use = user->kind().toQualString();
      return out;
    }
    const bool value_first = use.offset == 0;
    const auto constant = constant_number(user->input(value_first ? 1 : 0));
    if (!constant || user->input(value_first ? 1 : 0) == value) {
      out.other_use = ::std::string(user->kind().toQualString()) + " with a value that is not a constant";
      return out;
    }
    for (const ::torch::jit::Use& condition : user->output()->uses()) {
      if (condition.user->kind() != ::torch::jit::prim::If || condition.offset != 0) {
        out.other_use = ::std::string(condition.user->kind().toQualString()) + " (of a comparison's result)";
        return out;
      }
    }
    out.decisions.push_back(ScalarDecision{*compare, *constant, value_first});
  }
  out.decisions_only = !out.decisions.empty();
  if (!out.decisions_only) {
    out.other_use = "nothing (the value is not used)";
  }
  return out;
}

// True for the nodes that read a float back: float(t), t.item().
inline bool reads_float_back(const ::torch::jit::Node* node) {
  const ::std::string name = node->kind().toQualString();
  return (name == "aten::Float" || name == "aten::item") && node->outputs().size() == 1 &&
         node->output()->type()->kind() != ::c10::TypeKind::IntType &&
         node->output()->type()->kind() != ::c10::TypeKind::BoolType;
}

inline bool same_range(const ::torch::jit::SourceRange& a, const ::torch::jit::SourceRange& b) {
  if (a.source() == nullptr || b.source() == nullptr) {
    return false;
  }
  return a.start() == b.start() && a.end() == b.end() &&
         (a.source() == b.source() || a.text().str() == b.text().str());
}

// The node of `block` (or of a block nested in it) reading a float back at `range`.
inline const ::torch::jit::Node* find_float_read(const ::torch::jit::Block* block,
                                                  const ::torch::jit::SourceRange& range) {
  for (const ::torch::jit::Node* node : block->nodes()) {
    if (reads_float_back(node) && same_range(node->sourceRange(), range)) {
      return node;
    }
    for (const ::torch::jit::Block* inner : node->blocks()) {
      if (const ::torch::jit::Node* found = find_float_read(inner, range)) {
        return found;
      }
    }
  }
  return nullptr;
}

// A module's forward graph with every call inlined (what the read-backs are
// looked up in); null when it has none.
inline ::std::shared_ptr<::torch::jit::Graph> inlined_forward_graph(const ::torch::jit::Module& module) {
  try {
    const auto method = module.find_method("forward");
    if (!method) {
      return nullptr;
    }
    ::std::shared_ptr<::torch::jit::Graph> graph = method->graph()->copy();
    ::torch::jit::Inline(*graph);
    return graph;
  } catch (...) {
    return nullptr;  // the read-backs then key by their exact values
  }
}

}  // namespace replay::detail
