#pragma once
// The one version of replay. CMakeLists.txt's project(VERSION) must equal it;
// tests/host/version_test.cpp and the packaging checks keep them in step.
#include <replay/detail/require_cxx20.hpp>
#define REPLAY_VERSION_MAJOR 0
#define REPLAY_VERSION_MINOR 1
#define REPLAY_VERSION_PATCH 0
#define REPLAY_VERSION_STRING "0.1.0"
// Single comparable number, like CUDART_VERSION: 10000 * major + 100 * minor + patch.
#define REPLAY_VERSION (REPLAY_VERSION_MAJOR * 10000 + REPLAY_VERSION_MINOR * 100 + REPLAY_VERSION_PATCH)
