#!/usr/bin/env bash
# The README's test command: sets up what is missing, then configures, builds
# and runs every test (ctest). Without a GPU the gpu suites report "Skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-deps.sh
cmake --workflow --preset ci
