#!/usr/bin/env bash
# Installs what building replay's tests, benchmarks and examples needs, when it
# is missing: a CMake >= 3.25.2 and ninja (from PyPI: Debian's 3.25.1 cannot
# hand C++20 to nvcc), doctest and Google Benchmark (Debian packages), and
# cpp-httplib for the inference server example (Debian package), and
# checks for nvcc; and Conan 2 (pinned, from PyPI) for the packaging test.
# Safe to run again; does nothing when all is present.
# Sourced by scripts/test.sh and scripts/example.sh.
set -euo pipefail

replay_log() { printf 'replay setup: %s\n' "$*" >&2; }

version_ge() {  # version_ge A B: A >= B
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

# CUDA toolkit (nvcc). Only the toolkit is needed to build; running needs a GPU.
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  else
    replay_log "nvcc not found: install the CUDA toolkit (12.4 or newer) and put nvcc on PATH"
    exit 1
  fi
fi
export CUDACXX="${CUDACXX:-$(command -v nvcc)}"

# Debian packages for the test and benchmark frameworks.
need_apt=()
[ -f /usr/include/doctest/doctest.h ] || need_apt+=(doctest-dev)
[ -f /usr/include/benchmark/benchmark.h ] || need_apt+=(libbenchmark-dev)
[ -f /usr/include/httplib.h ] || need_apt+=(libcpp-httplib-dev)  # examples/inference_server
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    replay_log "installing ${need_apt[*]}"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    replay_log "missing ${need_apt[*]} and no apt-get: install doctest, Google Benchmark and cpp-httplib yourself"
    exit 1
  fi
fi

# CMake >= 3.25.2 and ninja, from PyPI when the system ones fall short.
cmake_ok=false
if command -v cmake >/dev/null 2>&1; then
  have=$(cmake --version | head -n1 | awk '{print $3}')
  version_ge "$have" 3.25.2 && cmake_ok=true
fi
if ! $cmake_ok || ! command -v ninja >/dev/null 2>&1; then
  replay_log "installing cmake and ninja from PyPI"
  python3 -m pip install -q --disable-pip-version-check "cmake>=3.28,<5" "ninja>=1.11" 2>&1 | grep -v "Running pip as the 'root'" >&2 || true
  hash -r
  # pip may install into a user or pyenv bin folder; make sure it comes first.
  for d in "$(python3 -c 'import sysconfig;print(sysconfig.get_path("scripts"))')" "$HOME/.local/bin"; do
    [ -x "$d/cmake" ] && export PATH="$d:$PATH"
  done
  have=$(cmake --version | head -n1 | awk '{print $3}')
  version_ge "$have" 3.25.2 || { replay_log "cmake $have is still older than 3.25.2"; exit 1; }
fi

# Conan 2 for the packaging test (tests/packaging.cmake runs `conan create . -nr`
# offline in a Conan home of its own, where it runs `conan profile detect`).
REPLAY_CONAN_VERSION=2.34.0
conan_major=$(conan --version 2>/dev/null | awk '{print $3}' | cut -d. -f1 || true)
if [ "$conan_major" != "2" ]; then
  replay_log "installing conan==$REPLAY_CONAN_VERSION from PyPI"
  python3 -m pip install -q --disable-pip-version-check "conan==$REPLAY_CONAN_VERSION" 2>&1 | grep -v "Running pip as the 'root'" >&2 || true
  hash -r
  for d in "$(python3 -c 'import sysconfig;print(sysconfig.get_path("scripts"))')" "$HOME/.local/bin"; do
    [ -x "$d/conan" ] && export PATH="$d:$PATH"
  done
  command -v conan >/dev/null 2>&1 || { replay_log "conan is still missing after pip install"; exit 1; }
fi
