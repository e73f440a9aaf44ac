#!/usr/bin/env bash
# The README's test command: sets up what is missing, then configures, builds
# and runs the tests with ctest, and says last how many passed, failed and were
# skipped, and why.
#   bash scripts/test.sh          the edit loop: builds the test programs only
#                                 (target replay_tests) and runs labels host and
#                                 gpu (without a GPU the gpu cases are reported
#                                 Skipped, never Passed)
#   bash scripts/test.sh --all    everything: also the benchmarks, examples and
#                                 header self-containment checks, and the
#                                 package and docs tests (consumer projects,
#                                 Conan, vcpkg port, README, Doxygen); CI runs this
# Extra arguments after those go to ctest (e.g. -R shape_router, -L host).
# Builds in build/default, the folder scripts/example.sh uses too
# (REPLAY_PRESET=ci: build/ci with the libtorch adapter required, as CI does).
# Repeated builds go through ccache when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=default
target=replay_tests
if [ "${1:-}" = "--all" ]; then
  tests=all
  target=all
  shift
  export REPLAY_SETUP_PACKAGING=1
fi
preset=${REPLAY_PRESET:-default}
[ "$preset" = default ] || tests=$preset
source scripts/setup-deps.sh
cmake --preset "$preset"
cmake --build --preset "$preset" --target "$target"
junit=build/$preset/Testing/test-results.xml
status=0
ctest --preset "$tests" --output-junit "$PWD/$junit" "$@" || status=$?
if command -v python3 >/dev/null 2>&1 && [ -f "$junit" ]; then
  python3 scripts/test_summary.py "$junit"
fi
exit "$status"
