#!/usr/bin/env bash
# The README's example command: sets up what is missing, builds and runs the
# main example (kernel_chain) in build/default, the folder scripts/test.sh
# uses too. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target kernel_chain
./build/default/examples/kernel_chain/kernel_chain "$@"
