#!/usr/bin/env bash
# Installs what building replay's tests, benchmarks and examples needs, when it
# is missing, without touching the system's Python or a Conan you already have:
#   - CMake >= 3.25.2 and ninja: when the ones on PATH fall short (Debian 12's
#     CMake 3.25.1 cannot hand C++20 to nvcc), from PyPI into a virtual
#     environment of this checkout, build/.venv (python3-venv from apt first,
#     if the system Python lacks it);
#   - doctest, Google Benchmark, ccache, and cpp-httplib, nlohmann_json and CLI11 (for
#     examples/inference_server): Debian packages (doctest-dev,
#     libbenchmark-dev, ccache, libcpp-httplib-dev, nlohmann-json3-dev,
#     libcli11-dev);
#   - with REPLAY_SETUP_PACKAGING=1 (scripts/test.sh --all, CI) also Conan 2
#     (pinned, into build/.venv, unless a Conan 2 is already on PATH; a Conan 1
#     stays where it is, unused) and doxygen (apt), for the package and docs tests,
#     and a current cpp-httplib's header (pinned; Debian's source package) into
#     build/httplib-current, for a second build of examples/inference_server
#     (that header alone with REPLAY_SETUP_HTTPLIB_CURRENT=1: scripts/test.sh
#     --sanitize thread tests the server built against it);
#   - checks for nvcc.
# build/.venv/bin goes first on PATH for the calling script only.
# Safe to run again; does nothing when all is present.
# Sourced by scripts/test.sh, scripts/example.sh and .ci/run.
set -euo pipefail

replay_log() { printf 'replay setup: %s\n' "$*" >&2; }

version_ge() {  # version_ge A B: A >= B
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

replay_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPLAY_VENV=${REPLAY_VENV:-$replay_root/build/.venv}
export REPLAY_VENV

replay_apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    replay_log "missing $* and no apt-get: install them yourself"
    exit 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  replay_log "installing $* (apt)"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# The project's virtual environment, created on first use.
replay_venv() {
  if [ ! -x "$REPLAY_VENV/bin/python" ]; then
    replay_log "creating a virtual environment for the build tools in $REPLAY_VENV"
    if ! python3 -m venv "$REPLAY_VENV" >/dev/null 2>&1; then
      rm -rf "$REPLAY_VENV"
      # Debian and Ubuntu ship venv's pip bootstrap separately.
      replay_apt_install "python3-venv"
      python3 -m venv "$REPLAY_VENV"
    fi
  fi
  export PATH="$REPLAY_VENV/bin:$PATH"
  hash -r
}
replay_pip() {
  replay_venv
  "$REPLAY_VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2
  hash -r
}
# An earlier run's tools come first.
[ -d "$REPLAY_VENV/bin" ] && export PATH="$REPLAY_VENV/bin:$PATH"

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
command -v ccache >/dev/null 2>&1 || need_apt+=(ccache)  # repeated builds (REPLAY_USE_CCACHE)
[ -f /usr/include/httplib.h ] || need_apt+=(libcpp-httplib-dev)  # examples/inference_server
[ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)  # its requests
[ -f /usr/include/CLI/CLI.hpp ] || need_apt+=(libcli11-dev)  # its flags
if [ "${REPLAY_SETUP_PACKAGING:-0}" = 1 ] && ! command -v doxygen >/dev/null 2>&1; then
  need_apt+=(doxygen)
fi
[ ${#need_apt[@]} -eq 0 ] || replay_apt_install "${need_apt[@]}"

# CMake >= 3.25.2 and ninja.
cmake_ok=false
if command -v cmake >/dev/null 2>&1; then
  have=$(cmake --version | head -n1 | awk '{print $3}')
  version_ge "$have" 3.25.2 && cmake_ok=true
fi
if ! $cmake_ok || ! command -v ninja >/dev/null 2>&1; then
  replay_log "installing cmake and ninja from PyPI into $REPLAY_VENV"
  replay_pip "cmake>=3.28,<5" "ninja>=1.11"
  have=$(cmake --version | head -n1 | awk '{print $3}')
  version_ge "$have" 3.25.2 || { replay_log "cmake $have is still older than 3.25.2"; exit 1; }
fi

# A current cpp-httplib for a second build of examples/inference_server
# (cmake/ReplayHttplib.cmake): upstream's header-only httplib.h, pinned by
# version and checksum, from Debian's source package (its .orig tarball is
# upstream's release) in sid or testing, fetched with apt-get source into a
# private apt state under build/. Fetched under REPLAY_SETUP_PACKAGING=1 (CI
# then builds and tests the server against both httplibs) or
# REPLAY_SETUP_HTTPLIB_CURRENT=1; used whenever it is there.
REPLAY_HTTPLIB_CURRENT_VERSION=0.41.0
REPLAY_HTTPLIB_CURRENT_SHA256=e9112546cbae828180f72c2ae6da4bfd8d15ae38138bd99b898e5e30128acc28  # httplib.h
replay_httplib_current_dir=$replay_root/build/httplib-current
replay_httplib_current_ok() {
  [ -f "$replay_httplib_current_dir/include/httplib.h" ] &&
    [ "$(sha256sum "$replay_httplib_current_dir/include/httplib.h" | cut -d' ' -f1)" = "$REPLAY_HTTPLIB_CURRENT_SHA256" ]
}
replay_fetch_httplib_current() {
  local work="$replay_httplib_current_dir/apt" version
  local apt=(-qq -oDir::Etc::SourceList="$work/sources.list" -oDir::Etc::SourceParts=/dev/null
             -oDir::State::Lists="$work/lists" -oDir::Cache="$work/cache" -oDebug::NoLocking=1
             -oAPT::Sandbox::User="$(id -un)")
  rm -rf "$work" && mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  printf 'deb-src [trusted=yes] http://deb.debian.org/debian %s main\n' sid testing >"$work/sources.list"
  replay_log "fetching cpp-httplib $REPLAY_HTTPLIB_CURRENT_VERSION (Debian's source package) into $replay_httplib_current_dir"
  apt-get "${apt[@]}" update >/dev/null || { replay_log "apt-get update (Debian sid, testing sources) failed"; return 1; }
  version=$(apt-cache "${apt[@]}" showsrc cpp-httplib 2>/dev/null | awk '/^Version:/ {print $2}' |
            grep -F "$REPLAY_HTTPLIB_CURRENT_VERSION+ds-" | sort -V | tail -n1 || true)
  if [ -z "$version" ]; then
    replay_log "Debian's sid and testing no longer have cpp-httplib $REPLAY_HTTPLIB_CURRENT_VERSION" \
               "(they have: $(apt-cache "${apt[@]}" showsrc cpp-httplib 2>/dev/null | awk '/^Version:/ {print $2}' | xargs));" \
               "raise REPLAY_HTTPLIB_CURRENT_VERSION and REPLAY_HTTPLIB_CURRENT_SHA256 in scripts/setup-deps.sh"
    return 1
  fi
  (cd "$work" && apt-get "${apt[@]}" source --download-only "cpp-httplib=$version" >/dev/null 2>&1) ||
    { replay_log "apt-get source cpp-httplib=$version failed"; return 1; }
  mkdir -p "$replay_httplib_current_dir/include"
  tar -xJf "$work/cpp-httplib_$REPLAY_HTTPLIB_CURRENT_VERSION+ds.orig.tar.xz" -O \
    "cpp-httplib-$REPLAY_HTTPLIB_CURRENT_VERSION+ds/httplib.h" >"$replay_httplib_current_dir/include/httplib.h" ||
    { replay_log "no httplib.h in cpp-httplib_$REPLAY_HTTPLIB_CURRENT_VERSION+ds.orig.tar.xz"; return 1; }
  rm -rf "$work"
  replay_httplib_current_ok ||
    { replay_log "httplib.h of cpp-httplib $version does not have the pinned checksum"; return 1; }
}
if { [ "${REPLAY_SETUP_PACKAGING:-0}" = 1 ] || [ "${REPLAY_SETUP_HTTPLIB_CURRENT:-0}" = 1 ]; } &&
  ! replay_httplib_current_ok; then
  replay_fetch_httplib_current || { replay_log "cannot fetch the current cpp-httplib for the server's second build"; exit 1; }
fi
if replay_httplib_current_ok; then
  export REPLAY_HTTPLIB_CURRENT_INCLUDE_DIR="$replay_httplib_current_dir/include"
fi

# Conan 2 for the package.conan_create test (it runs `conan profile detect`
# and `conan create . -nr` offline in a Conan home of its own).
REPLAY_CONAN_VERSION=2.34.0
if [ "${REPLAY_SETUP_PACKAGING:-0}" = 1 ]; then
  conan_major=$(conan --version 2>/dev/null | awk '{print $3}' | cut -d. -f1 || true)
  if [ "$conan_major" != "2" ]; then
    [ -n "$conan_major" ] && replay_log "conan on PATH is version $conan_major; leaving it alone, using one in $REPLAY_VENV"
    replay_log "installing conan==$REPLAY_CONAN_VERSION from PyPI into $REPLAY_VENV"
    replay_pip "conan==$REPLAY_CONAN_VERSION"
    [ "$(conan --version 2>/dev/null | awk '{print $3}' | cut -d. -f1)" = 2 ] ||
      { replay_log "conan 2 is still missing after installing it"; exit 1; }
  fi
fi
