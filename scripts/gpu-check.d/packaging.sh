#!/usr/bin/env bash
# Packaging on the device: the consumers of an installed replay, of
# FetchContent and of the README (tests/package/, registered by
# tests/packaging.cmake) run their graph round trip, which they skip on a
# machine without a GPU; so does the torch component's consumer (it graphs a
# tensor function with replay::torch) when the adapter was built.
set -uo pipefail
cd "$(dirname "$0")/../.."
log=$(ctest --test-dir build/gpu --parallel 4 -L package -R 'package\.(install|find_package|fetchcontent|readme|torch_component|audit_component)' -V 2>&1)
rc=$?
echo "$log" | grep -E 'consumer:|torch adapter|tests passed|\(Failed\)|\*\*\*' || true
if [ $rc -ne 0 ]; then
  echo "$log" | tail -60
  echo "packaging: a consumer failed"
  exit 1
fi
# grep -q reads a here-string, not a pipe: it stops at its first match, and
# under pipefail an echo cut short by that (SIGPIPE) would fail the check.
if grep -q 'graph round trip was not run' <<<"$log"; then
  echo "packaging: a consumer found no CUDA device"
  exit 1
fi
grep -q 'consumer: replay .*: ok' <<<"$log" || { echo "packaging: no consumer ran its round trip"; exit 1; }
if [ -z "${REPLAY_SKIP_TORCH:-}" ]; then
  grep -q 'consumer: replay .* with its torch adapter: ok' <<<"$log" ||
    { echo "packaging: the torch consumer did not run its graph round trip on the GPU"; exit 1; }
fi
echo "packaging: consumers ran their graph round trip"
