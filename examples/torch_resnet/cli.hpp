#pragma once
// Command-line helpers shared by the torch examples (torch_resnet, torch_bert).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace replay_examples {

// "1,8,32" (or "3x224x224" with 'x') as integers.
inline std::vector<std::int64_t> parse_list(std::string_view text, char separator = ',') {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(separator, start), text.size());
    out.push_back(std::stoll(std::string(text.substr(start, end - start))));
    start = end + 1;
  }
  return out;
}

// The value after option argv[i] (advancing i); std::invalid_argument when there is none.
inline std::string option_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) {
    throw std::invalid_argument(std::string(argv[i]) + " needs a value");
  }
  return argv[++i];
}

}  // namespace replay_examples
