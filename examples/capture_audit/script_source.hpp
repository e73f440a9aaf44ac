#pragma once
// Defines a TorchScript module's methods from source text under a file name
// of its own. Module::define names every source "<string>"; parsed here with
// a named torch::jit::Source, the interpreter's source ranges, and so the
// capture audit's findings and TorchScript's own tracebacks, say
// "model.py:3" (a module scripted in Python and saved keeps its file and
// lines the same way). Shared by the capture_audit_torchscript example and
// test_torch.
#include <torch/csrc/jit/frontend/lexer.h>
#include <torch/csrc/jit/frontend/parser.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

namespace replay_examples {

// Every `def` in `source` becomes a method of `module`; `source`'s first
// line is line 1 of `file_name`.
inline void define_methods(torch::jit::Module& module, const std::string& source, const std::string& file_name) {
  torch::jit::Parser parser(std::make_shared<torch::jit::Source>(source, file_name, 1));
  std::vector<torch::jit::Def> definitions;
  std::vector<torch::jit::ResolverPtr> resolvers;
  while (parser.lexer().cur().kind != torch::jit::TK_EOF) {
    definitions.emplace_back(parser.parseFunction(/*is_method=*/true));
    resolvers.push_back(torch::jit::nativeResolver());
  }
  const torch::jit::SimpleSelf self(module.type());
  module._ivalue()->compilation_unit()->define(*module.type()->name(), /*properties=*/{}, /*propResolvers=*/{},
                                               definitions, resolvers, &self);
}

// The 1-based line of `source` that holds `text` first (0: none).
inline unsigned line_holding(const std::string& source, const std::string& text) {
  const std::size_t at = source.find(text);
  if (at == std::string::npos) {
    return 0;
  }
  unsigned line = 1;
  for (std::size_t i = 0; i < at; ++i) {
    line += source[i] == '\n' ? 1U : 0U;
  }
  return line;
}

}  // namespace replay_examples
