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
#   bash scripts/test.sh --sanitize address|thread
#                                 the host cases and the servers' host tests
#                                 under AddressSanitizer with UndefinedBehavior-
#                                 Sanitizer, or ThreadSanitizer (presets
#                                 sanitize-address, sanitize-thread; builds in
#                                 build/sanitize-*, target replay_host_tests)
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
if [ "${1:-}" = "--sanitize" ]; then
  case "${2:-}" in
    address | thread) preset=sanitize-$2 tests=sanitize-$2 target=replay_host_tests ;;
    *) echo "scripts/test.sh: --sanitize takes address (with undefined) or thread, not '${2:-}'" >&2; exit 2 ;;
  esac
  # ThreadSanitizer tests the server built against the header-only httplib (tests/batcher.cmake).
  [ "$2" = thread ] && export REPLAY_SETUP_HTTPLIB_CURRENT=1
  shift 2
fi
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
