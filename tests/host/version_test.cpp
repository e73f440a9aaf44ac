// The version in version.hpp must equal CMakeLists.txt's project(VERSION).
#include <doctest/doctest.h>

#include <string>

#include "replay/version.hpp"

TEST_SUITE("host") {
  TEST_CASE("REPLAY_VERSION agrees with the CMake project version") {
    CHECK(std::string(REPLAY_VERSION_STRING) == REPLAY_CMAKE_PROJECT_VERSION);
    CHECK(std::to_string(REPLAY_VERSION_MAJOR) + "." + std::to_string(REPLAY_VERSION_MINOR) + "." +
              std::to_string(REPLAY_VERSION_PATCH) ==
          REPLAY_VERSION_STRING);
    static_assert(REPLAY_VERSION == REPLAY_VERSION_MAJOR * 10000 + REPLAY_VERSION_MINOR * 100 + REPLAY_VERSION_PATCH);
  }
}
