#!/usr/bin/env bash
# The one device check: builds everything for sm_90, runs every test program
# (all suites; fails if any test case was skipped, failed, or a program did
# not build), runs compute-sanitizer (memcheck, racecheck, synccheck) over the
# gpu suites, runs the benchmarks briefly, the main example, and prints a
# short summary last. Logs and JSON land in $OUT (default build/gpu-check).
#
#   scripts/gpu-check.sh [--quick]     --quick: skip racecheck/synccheck
#   REPLAY_BENCH_FILTER=regex          only these benchmarks
#   REPLAY_SKIP_TORCH=1                do not look for libtorch
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
quick=false
[ "${1:-}" = "--quick" ] && quick=true
OUT=${OUT:-$root/build/gpu-check}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
log() { printf '[gpu-check %s] %s\n' "$(date +%T)" "$*"; }
status=0
summary=()
note() { summary+=("$*"); }

# ---- configure and build -------------------------------------------------
torch_prefix=""
if [ -z "${REPLAY_SKIP_TORCH:-}" ]; then
  torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
fi
log "configure (torch prefix: ${torch_prefix:-none})"
if ! cmake --preset gpu ${torch_prefix:+-DCMAKE_PREFIX_PATH="$torch_prefix"} >"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"; echo "configure FAILED"; exit 1
fi
# The CUDA-only targets first; then the rest (the libtorch adapter, whose
# translation units are slow to compile) builds in the background while the
# sanitizer runs over the CUDA-only test programs.
light_targets=$(cmake --build build/gpu --target help 2>/dev/null | sed -nE 's/^([A-Za-z0-9_]+): phony$/\1/p' |
  grep -E '^(test_[a-z_]+|[a-z_]+_bench|kernel_chain|dynamic_batch|pipeline_throughput)$' | grep -v torch | tr '\n' ' ')
build_start=$SECONDS
log "build (light): $light_targets"
cmake --build --preset gpu -- -k 0 $light_targets >>"$OUT/build.log" 2>&1 || status=1
note "build of CUDA-only targets: $((SECONDS - build_start)) s"
log "build (rest) in the background"
( cmake --build --preset gpu -- -k 0 >"$OUT/build-rest.log" 2>&1; echo $? >"$OUT/build-rest.rc" ) &
build_pid=$!

# ---- compute-sanitizer (CUDA-only programs, during the background build) ---
: >"$OUT/sanitizer.log"
sanitizer_errors=0
tools="memcheck"
$quick || tools="memcheck racecheck synccheck"
run_sanitizer() {  # run_sanitizer TOOL EXE [doctest args...]
  local tool=$1 exe=$2; shift 2
  log "compute-sanitizer --tool $tool $(basename "$exe")"
  # API errors are not memory errors: the tests provoke many on purpose.
  REPLAY_UNDER_SANITIZER=1 compute-sanitizer --tool "$tool" --error-exitcode 99 --report-api-errors no \
    "$exe" --test-suite=gpu --no-version "$@" >"$OUT/san.tmp" 2>&1
  local rc=$?
  local errs
  errs=$(grep -Eo '(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+' "$OUT/san.tmp" | grep -Eo '[0-9]+$' | awk '{s+=$1} END {print s+0}')
  { echo "=== $tool $(basename "$exe") rc=$rc"; grep -E 'SUMMARY|test cases:|^=========' "$OUT/san.tmp" | head -40; } >>"$OUT/sanitizer.log"
  sanitizer_errors=$((sanitizer_errors + errs))
  if [ "$rc" -ne 0 ]; then
    status=1
    note "  sanitizer $tool $(basename "$exe"): rc=$rc, $errs errors"
  fi
}
if command -v compute-sanitizer >/dev/null 2>&1; then
  san_start=$SECONDS
  for tool in $tools; do
    for exe in build/gpu/tests/test_*; do
      [ -x "$exe" ] || continue
      case "$(basename "$exe")" in *_host|test_torch) continue ;; esac
      run_sanitizer "$tool" "$exe"
    done
  done
  note "sanitizer on CUDA-only tests: $((SECONDS - san_start)) s"
else
  status=1
  note "sanitizer: compute-sanitizer NOT FOUND"
fi

log "waiting for the background build"
wait "$build_pid"
if [ "$(cat "$OUT/build-rest.rc" 2>/dev/null)" != 0 ]; then
  status=1
  note "BUILD: FAILED (see build.log); failing targets:"
  grep -E '^FAILED' "$OUT/build-rest.log" | head -20 | while read -r l; do note "  $l"; done
fi
cat "$OUT/build-rest.log" >>"$OUT/build.log"; rm -f "$OUT/build-rest.log" "$OUT/build-rest.rc"
note "build total: $((SECONDS - build_start)) s"

# ---- tests -----------------------------------------------------------------
: >"$OUT/tests.log"
total_pass=0 total_fail=0 total_skip=0
for exe in build/gpu/tests/test_*; do
  [ -x "$exe" ] || continue
  name=$(basename "$exe")
  log "test $name"
  "$exe" --no-version >"$OUT/$name.log" 2>&1
  rc=$?
  cat "$OUT/$name.log" >>"$OUT/tests.log"
  line=$(grep -E '^\[doctest\] test cases:' "$OUT/$name.log" | tail -1)
  p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line")
  f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
  s=$(sed -E 's/.*\| *([0-9]+) skipped.*/\1/' <<<"$line")
  [[ "$p" =~ ^[0-9]+$ ]] || { p=0; f=1; s=0; note "  $name: no doctest summary (crashed?), rc=$rc"; }
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
  note "  $name: $p passed, $f failed, $s skipped (rc=$rc)"
  [ "$rc" -eq 0 ] || status=1
  rm -f "$OUT/$name.log"
done
[ "$total_skip" -eq 0 ] || { status=1; note "  SKIPPED test cases on a GPU machine: $total_skip (not allowed)"; }
[ "$total_fail" -eq 0 ] || status=1

# The libtorch tests under memcheck (most of their cases skip themselves
# there: cuDNN under the sanitizer takes minutes).
if [ -x build/gpu/tests/test_torch ] && command -v compute-sanitizer >/dev/null 2>&1; then
  run_sanitizer memcheck build/gpu/tests/test_torch
fi
rm -f "$OUT/san.tmp"
note "sanitizer ($tools): $sanitizer_errors errors"

# ---- benchmarks ------------------------------------------------------------
filter=${REPLAY_BENCH_FILTER:-.}
mkdir -p "$OUT/bench"
for exe in build/gpu/bench/*; do
  [ -x "$exe" ] && [ -f "$exe" ] || continue
  name=$(basename "$exe")
  log "bench $name"
  "$exe" --benchmark_min_time=0.05s --benchmark_filter="$filter" \
    --benchmark_out="$OUT/bench/$name.json" --benchmark_out_format=json >"$OUT/bench/$name.txt" 2>&1 ||
    { status=1; note "  bench $name FAILED"; tail -5 "$OUT/bench/$name.txt"; }
done
python3 scripts/bench_ratios.py "$OUT"/bench/*.json >"$OUT/ratios.txt" 2>&1 || true
# Few files come back from the device: fold the raw outputs into two.
cat "$OUT"/bench/*.txt >"$OUT/bench.txt" 2>/dev/null
python3 - "$OUT" <<'PY' || true
import json, glob, os, sys
out = sys.argv[1]
merged = {}
for f in sorted(glob.glob(os.path.join(out, "bench", "*.json"))):
    try:
        merged[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:
        merged[os.path.basename(f)[:-5]] = {"error": str(e)}
json.dump(merged, open(os.path.join(out, "bench.json"), "w"), indent=1)
PY
rm -rf "$OUT/bench"

# ---- examples --------------------------------------------------------------
: >"$OUT/examples.log"
if [ -x build/gpu/examples/kernel_chain/kernel_chain ]; then
  log "example kernel_chain"
  build/gpu/examples/kernel_chain/kernel_chain >>"$OUT/examples.log" 2>&1 || { status=1; note "  example kernel_chain FAILED"; }
fi
for extra in scripts/gpu-check.d/*.sh; do
  [ -f "$extra" ] || continue
  log "extra $(basename "$extra")"
  OUT="$OUT" bash "$extra" >>"$OUT/examples.log" 2>&1 || { status=1; note "  $(basename "$extra") FAILED"; }
done

# ---- summary (last) --------------------------------------------------------
{
  echo "================ replay gpu-check summary ================"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
  echo "tests: $total_pass passed, $total_fail failed, $total_skip skipped"
  for l in "${summary[@]}"; do echo "$l"; done
  echo "---- benchmark ratios ----"
  cat "$OUT/ratios.txt"
  echo "---- example output ----"
  tail -20 "$OUT/examples.log"
  if [ "$status" -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
} | tee "$OUT/summary.txt"
exit "$status"
