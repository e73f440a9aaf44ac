#!/usr/bin/env bash
# The README's test command: sets up what is missing, then configures, builds
# and runs the tests with ctest.
#   bash scripts/test.sh          the edit loop: labels host and gpu (without a
#                                 GPU the gpu cases are reported Skipped)
#   bash scripts/test.sh --all    also the package and docs tests (consumer
#                                 projects, Conan, vcpkg port, README, Doxygen)
# Extra arguments after those go to ctest (e.g. -R shape_router, -L host).
# Builds in build/default, the folder scripts/example.sh uses too
# (REPLAY_PRESET=ci: build/ci with the libtorch adapter required, as CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
tests=default
if [ "${1:-}" = "--all" ]; then
  tests=all
  shift
  export REPLAY_SETUP_PACKAGING=1
fi
preset=${REPLAY_PRESET:-default}
[ "$preset" = default ] || tests=$preset
source scripts/setup-deps.sh
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$tests" "$@"
