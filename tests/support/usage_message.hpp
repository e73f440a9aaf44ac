#pragma once
// The message of the usage_error a call throws, for tests of replay's refusals.
#include <string>

#include "replay/error.hpp"

namespace replay_test {

// What `call` threw as replay::usage_error, or "no usage_error".
inline std::string usage_message(auto&& call) {
  try {
    call();
  } catch (const replay::usage_error& e) {
    return e.what();
  }
  return "no usage_error";
}

inline bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

}  // namespace replay_test
