#!/usr/bin/env bash
# The one device check. Builds everything for sm_90 (the libtorch adapter too
# when PyTorch is installed), runs every test program with all suites and
# fails if any test case was skipped or failed or any program did not build,
# runs compute-sanitizer (memcheck, racecheck, synccheck) over the gpu suites,
# runs the benchmarks briefly and prints the target ratios (bench/*.ratios;
# a ratio below target is confirmed by running its benchmarks twice more and
# judging the median of the three),
# runs the examples and scripts/gpu-check.d/*.sh, and prints a summary last.
#
#   scripts/gpu-check.sh [--quick | --tests-only] [--lane cuda|heavy]
#                                    --quick: memcheck only (no racecheck/synccheck)
#                                    --tests-only: build and run the test programs only
#                                    --lane cuda|heavy: one lane only (below); the two
#                                    runs together check what one run without --lane does
#   REPLAY_CHECK_OUT=dir             logs and JSON (default build/gpu-check)
#   REPLAY_CHECK_DEADLINE_S=n        stop starting steps after n seconds; steps
#                                    cut short count as failures (default 3000)
#   REPLAY_BENCH_FILTER=regex        only these benchmarks
#   REPLAY_SKIP_TORCH=1              do not look for libtorch (test_torch and test_llm_decode are then not expected)
#   REPLAY_BENCH_MISS_OK=1           a benchmark ratio below its target is reported as
#                                    MISS but does not fail the run (noisy machines)
#   REPLAY_SANITIZER_UNSUPPORTED_OK=1 where compute-sanitizer refuses the device
#                                    ("Device not supported", a sandboxed driver), the
#                                    summary says "sanitizer: NOT RUN" without failing
#
# A GPU is required (REPLAY_REQUIRE_GPU=1 for every program): a case that
# would be skipped fails. Every program in tests/expected_cases.txt must be
# built and run at least its minimum number of cases; a built test program
# that is not listed there fails too.
#
# Two lanes. The CUDA-only lane (core, router, pipeline: tests, sanitizer,
# benchmarks, examples) and the heavy lane (building and running the libtorch
# adapter, its example and benchmarks, and the packaging consumers). With two
# or more GPUs they run at once, one GPU each, so neither disturbs the other's
# timings; with one GPU the heavy lane's build overlaps the sanitizer runs and
# its runs come after the CUDA-only lane. Only one process uses a GPU at a
# time: tests measure the device's free memory, and benchmarks its time.
# --lane runs one lane alone, each in about half the time of the whole check
# (the heavy lane then runs the packaging consumers and the TorchScript
# exports beside its build, as it does with a GPU of its own).
set -uo pipefail
cd "$(dirname "$0")/.."
quick=false
tests_only=false
only_lane=""
usage="usage: scripts/gpu-check.sh [--quick | --tests-only] [--lane cuda|heavy]"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=true ;;
    --tests-only) tests_only=true ;;
    --lane) only_lane=${2:-}; lane_given=true; [ $# -ge 2 ] && shift ;;
    --lane=*) only_lane=${1#--lane=}; lane_given=true ;;
    *) echo "gpu-check: unknown argument '$1' ($usage)" >&2; exit 2 ;;
  esac
  shift
done
if ${lane_given:-false} && [ "$only_lane" != cuda ] && [ "$only_lane" != heavy ]; then
  echo "gpu-check: --lane takes cuda or heavy, not '$only_lane' ($usage)" >&2
  exit 2
fi
run_cuda=true
run_heavy=true
[ "$only_lane" = heavy ] && run_cuda=false
[ "$only_lane" = cuda ] && run_heavy=false
# The load generator's seconds per point (inference_server.sh): long enough
# for thousands of requests at every point.
export REPLAY_LOAD_SECONDS=${REPLAY_LOAD_SECONDS:-5} REPLAY_LOAD_RESNET_SECONDS=${REPLAY_LOAD_RESNET_SECONDS:-4}
OUT=${REPLAY_CHECK_OUT:-$PWD/build/gpu-check}
export OUT
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/*.txt "$OUT"/*.json "$OUT"/lane-* "$OUT"/sanitizer-unsupported
export PATH="/usr/local/cuda/bin:$PATH"
export REPLAY_REQUIRE_GPU=1
deadline=${REPLAY_CHECK_DEADLINE_S:-3000}
log() { printf '[gpu-check %4ds] %s\n' "$SECONDS" "$*"; }
left() { echo $((deadline - SECONDS)); }

# Lane results go to files so that background lanes can report.
note() { printf '%s\n' "$*" >>"$OUT/lane-$lane.notes"; }
fail() { note "$*"; echo 1 >"$OUT/lane-$lane.failed"; }
count_tests() { printf '%s %s %s %s\n' "$1" "$2" "$3" "$4" >>"$OUT/lane-$lane.counts"; }  # name passed failed skipped

# run_bounded SECONDS_WANTED CMD...: runs CMD under `timeout`, capped by the deadline.
run_bounded() {
  local want=$1; shift
  local budget
  budget=$(left)
  [ "$budget" -gt "$want" ] && budget=$want
  if [ "$budget" -lt 10 ]; then
    fail "  NOT RUN (deadline): $*"
    return 124
  fi
  timeout "$budget" "$@"
  local rc=$?
  [ "$rc" -eq 124 ] && fail "  TIMED OUT after ${budget}s: $*"
  return "$rc"
}

# run_test_program EXE: all suites; parses doctest's summary.
run_test_program() {
  local exe=$1 name
  name=$(basename "$exe")
  log "test $name"
  run_bounded 400 "$exe" --no-version >"$OUT/$name.log" 2>&1
  local rc=$?
  cat "$OUT/$name.log" >>"$OUT/tests-$lane.log"
  local line p f s
  line=$(grep -E '^\[doctest\] test cases:' "$OUT/$name.log" | tail -1)
  p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line")
  f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
  s=$(sed -E 's/.*\| *([0-9]+) skipped.*/\1/' <<<"$line")
  if ! [[ "$p" =~ ^[0-9]+$ ]]; then
    p=0 f=1 s=0
    grep -E 'FATAL|terminate|Segmentation|what\(\)' "$OUT/$name.log" | head -3 | while read -r l; do note "    $l"; done
  fi
  count_tests "$name" "$p" "$f" "$s"
  note "  $name: $p passed, $f failed, $s skipped (rc=$rc)"
  [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ] || fail "  $name did not pass cleanly"
  rm -f "$OUT/$name.log"
}

# Cases one tool leaves out, as "tool program case-pattern": each with its
# reason here, and printed in the log and the summary.
#   racecheck checks shared-memory hazards only. The router's 8-thread stress
#   case (8 threads capturing and replaying at once beside device-wide
#   synchronizations and stream-ordered allocations) uses no shared memory,
#   and racecheck (CUDA 13.0) intermittently stops there with its own
#   "Internal Sanitizer Error: Detected a failure to track a kernel launch",
#   with replay's capture bookkeeping old or new alike. memcheck and synccheck
#   run the case in full, and the test run itself checks every result.
sanitizer_exclusions=(
  "racecheck test_shape_router stress: 8 threads*"
)
# run_sanitizer TOOL EXE: the gpu suite under compute-sanitizer.
# compute-sanitizer (CUDA 13.0) at times stops tracking with its own
# "Internal Sanitizer Error: Detected a failure to track a kernel launch",
# which racecheck counts as a hazard though the program did nothing. A run
# whose every counted error is such a line is run once more, both runs go
# into the log and the notes, and the second one counts; a hazard or error
# of the program's own fails at once.
run_sanitizer() {
  local tool=$1 exe=$2 name entry exclude=() attempt rc errs internal
  name=$(basename "$exe")
  # Some machines' runtimes (a sandboxed driver) refuse compute-sanitizer
  # itself ("Device not supported"): once seen, the remaining runs are left
  # out and the summary says the sanitizer did not run, never that it passed.
  [ -f "$OUT/sanitizer-unsupported" ] && return 0
  for entry in "${sanitizer_exclusions[@]}"; do
    read -r etool eprog epattern <<<"$entry"
    if [ "$etool" = "$tool" ] && [ "$eprog" = "$name" ]; then
      exclude=(--test-case-exclude="$epattern")
      note "  sanitizer $tool $name: leaves out the cases \"$epattern\" (see sanitizer_exclusions)"
    fi
  done
  local again=""
  for attempt in 1 2; do
    log "compute-sanitizer --tool $tool $name$again"
    # API errors are not memory errors: the tests provoke many on purpose.
    export REPLAY_UNDER_SANITIZER=1
    run_bounded 240 compute-sanitizer --tool "$tool" --error-exitcode 99 \
      --report-api-errors no "$exe" --test-suite=gpu --no-version "${exclude[@]}" >"$OUT/san-$lane.tmp" 2>&1
    rc=$?
    unset REPLAY_UNDER_SANITIZER
    errs=$(grep -Eo '(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+' "$OUT/san-$lane.tmp" | grep -Eo '[0-9]+$' | awk '{s+=$1} END {print s+0}')
    # compute-sanitizer's own refusal (its "========= " lines) and no error
    # found: it checked nothing (the program then fails at its first
    # allocation, error 999, which says nothing of the program).
    if grep -qE '^========= .*Device not supported' "$OUT/san-$lane.tmp" && [ "$errs" -eq 0 ]; then
      grep -m1 -E '^========= .*Device not supported' "$OUT/san-$lane.tmp" >"$OUT/sanitizer-unsupported"
      echo "=== $tool $name rc=$rc: compute-sanitizer refused the device" >>"$OUT/sanitizer.log"
      note "  sanitizer $tool $name: compute-sanitizer refuses this device ($(head -c 200 "$OUT/sanitizer-unsupported")); no sanitizer run on this machine"
      rm -f "$OUT/san-$lane.tmp"
      return 0
    fi
    internal=$(grep -c 'Internal Sanitizer Error' "$OUT/san-$lane.tmp")
    { echo "=== $tool $name rc=$rc errors=$errs$again"
      grep -E 'SUMMARY|test cases:|^========= [A-Z]|TEST CASE:|ERROR:|FATAL|THREW|values:|\[replay_test\] FAILED' "$OUT/san-$lane.tmp" | head -80; } >>"$OUT/sanitizer.log"
    if [ "$attempt" -eq 1 ] && [ "$rc" -ne 0 ] && [ "$errs" -gt 0 ] && [ "$errs" -le "$internal" ]; then
      note "  sanitizer $tool $name: $errs error(s), each compute-sanitizer's own \"Internal Sanitizer Error\" and none of the program's; run again"
      again=" (second run: the first stopped on the sanitizer's own error)"
      continue
    fi
    break
  done
  printf '%s\n' "$errs" >>"$OUT/lane-$lane.sanitizer"
  [ "$rc" -eq 0 ] || fail "  sanitizer $tool $name: rc=$rc, $errs errors"
  rm -f "$OUT/san-$lane.tmp"
}

# ---- configure -------------------------------------------------------------
lane=main
torch_prefix=""
if [ -z "${REPLAY_SKIP_TORCH:-}" ]; then
  torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
fi
log "configure (torch prefix: ${torch_prefix:-none})"
if ! cmake --preset gpu ${torch_prefix:+-DCMAKE_PREFIX_PATH="$torch_prefix"} >"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"
  echo "RESULT: FAIL (configure)"
  exit 1
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -ge 1 ] || gpus=1

# ---- build the CUDA-only targets ---------------------------------------------
light_targets=$(cmake --build build/gpu --target help 2>/dev/null | sed -nE 's/^([A-Za-z0-9_]+): phony$/\1/p' |
  grep -E '^(test_[a-z0-9_]+|[a-z0-9_]+_bench|kernel_chain|dynamic_batch|piecewise_chain|pipeline_throughput|device_loop|capture_audit|replay_kernel_trace)$' | grep -v -e torch -e llm_decode | tr '\n' ' ')
if $run_cuda; then
  log "build (CUDA-only): $light_targets"
  start=$SECONDS
  # shellcheck disable=SC2086
  cmake --build --preset gpu -- -k 0 $light_targets >>"$OUT/build.log" 2>&1 ||
    { fail "BUILD of CUDA-only targets FAILED:"; grep -E '^FAILED' "$OUT/build.log" | head -10 | while read -r l; do note "  $l"; done; }
  note "build of CUDA-only targets: $((SECONDS - start)) s"
fi

# ---- heavy lane: libtorch adapter and packaging consumers -------------------
# run_step NAME LOGNAME [ARGS...]: scripts/gpu-check.d/NAME, its output in step-LOGNAME.txt.
run_step() {
  local name=$1 logname=$2
  shift 2
  log "step $name${*:+ $*}"
  run_bounded 420 bash "scripts/gpu-check.d/$name" "$@" >"$OUT/step-$logname.txt" 2>&1 ||
    fail "  step $name${*:+ $*} FAILED"
}
heavy_lane() {
  lane=heavy
  local start=$SECONDS side=() pid steps_run=() packaging_beside=false exports_beside=false
  if [ -n "${heavy_gpu_alone:-}" ] && ! $tests_only; then
    # Nothing else uses this lane's GPU yet and neither is timed: the packaging
    # consumers (projects of their own, built from the source tree) and the
    # TorchScript exports run beside the build.
    run_step packaging.sh packaging & side+=($!)
    packaging_beside=true
    steps_run+=(packaging)
    if [ -n "$torch_prefix" ]; then
      run_step torch.sh torch-export export & side+=($!)
      exports_beside=true
      steps_run+=(torch-export)
    fi
  fi
  log "build (rest: libtorch adapter, packaging)"
  cmake --build --preset gpu -- -k 0 >"$OUT/build-heavy.log" 2>&1 ||
    { fail "BUILD of the remaining targets FAILED:"; grep -E '^FAILED' "$OUT/build-heavy.log" | head -10 | while read -r l; do note "  $l"; done; }
  note "build of the remaining targets: $((SECONDS - start)) s"
  for pid in "${side[@]}"; do wait "$pid"; done
  [ -n "${heavy_wait_for:-}" ] && while [ ! -f "$heavy_wait_for" ]; do sleep 2; done
  # The libtorch adapter's test programs: test_torch and test_torch_<area>.
  local torch_test
  for torch_test in build/gpu/tests/test_torch build/gpu/tests/test_torch_*; do
    [ -x "$torch_test" ] || continue
    run_test_program "$torch_test"
    $tests_only || { command -v compute-sanitizer >/dev/null && run_sanitizer memcheck "$torch_test"; }
  done
  if [ ! -x build/gpu/tests/test_torch ] && [ -n "$torch_prefix" ]; then
    fail "  test_torch was not built although PyTorch is installed"
  fi
  # examples/llm_decode's model and engine (libtorch; its program runs in gpu-check.d/llm_decode.sh).
  if [ -x build/gpu/tests/test_llm_decode ]; then
    run_test_program build/gpu/tests/test_llm_decode
  elif [ -n "$torch_prefix" ]; then
    fail "  test_llm_decode was not built although PyTorch is installed"
  fi
  $tests_only && return  # the steps run examples and benchmarks
  local extra name args
  for extra in scripts/gpu-check.d/*.sh; do
    [ -f "$extra" ] || continue
    name=$(basename "$extra")
    args=()
    case "$name" in
      examples.sh) continue ;;  # the CUDA-only lane's
      packaging.sh) $packaging_beside && continue ;;
      torch.sh) $exports_beside && args=(measure) ;;
    esac
    run_step "$name" "${name%.sh}" "${args[@]}"
    steps_run+=("${name%.sh}")
  done
  for name in "${steps_run[@]}"; do
    tail -25 "$OUT/step-$name.txt" >>"$OUT/lane-heavy.tail" 2>/dev/null
  done
  note "heavy lane: $((SECONDS - start)) s"
}

heavy_pid=""
if $run_heavy && ! $run_cuda; then
  log "the heavy lane alone (--lane heavy)"
  ( heavy_gpu_alone=1 heavy_lane ) &
  heavy_pid=$!
elif $run_heavy && [ "$gpus" -ge 2 ]; then
  log "$gpus GPUs: the heavy lane runs on GPU 1, at the same time"
  ( export CUDA_VISIBLE_DEVICES=1; heavy_gpu_alone=1 heavy_lane ) &
  heavy_pid=$!
elif $run_heavy; then
  ( heavy_wait_for="$OUT/lane-light.done" heavy_lane ) &
  heavy_pid=$!
fi

# ---- CUDA-only lane ----------------------------------------------------------
filter=${REPLAY_BENCH_FILTER:-.}
cuda_lane() {
  lane=light
  [ "$gpus" -ge 2 ] && export CUDA_VISIBLE_DEVICES=0
  for exe in build/gpu/tests/test_*; do
    [ -x "$exe" ] || continue
    # test_*_multi (suite gpu_multi, two GPUs or more): gpu-check.d/nccl.sh, with every GPU.
    case "$(basename "$exe")" in test_torch | test_torch_* | test_llm_decode | test_*_multi) continue ;; esac
    run_test_program "$exe"
  done
  if $tests_only; then
    note "tests only: sanitizer, benchmarks and examples not run"
  elif command -v compute-sanitizer >/dev/null 2>&1; then
    tools="memcheck"
    $quick || tools="memcheck racecheck synccheck"
    start=$SECONDS
    for tool in $tools; do
      for exe in build/gpu/tests/test_*; do
        [ -x "$exe" ] || continue
        case "$(basename "$exe")" in *_host | *_multi | test_torch | test_torch_* | test_llm_decode) continue ;; esac
        # compute-sanitizer holds CUDA's profiling interface (CUPTI), which
        # allows one subscriber per process: the capture audit cannot run
        # under it (it says so, and throws). Its test program runs in full
        # above; the audit itself launches no kernel.
        if [ "$(basename "$exe")" = test_audit ]; then
          [ "$tool" = memcheck ] && note "  sanitizer: test_audit left out (compute-sanitizer holds CUPTI, the one subscriber the audit needs)"
          continue
        fi
        run_sanitizer "$tool" "$exe"
      done
    done
    note "sanitizer ($tools) on CUDA-only tests: $((SECONDS - start)) s"
  else
    fail "compute-sanitizer NOT FOUND"
  fi
  mkdir -p "$OUT/bench"
  for exe in build/gpu/bench/*; do
    $tests_only && break
    [ -x "$exe" ] && [ -f "$exe" ] || continue
    case "$exe" in *.so) continue ;; esac  # the kernel trace's library (bench/kernel_trace.cmake), no benchmark
    name=$(basename "$exe")
    # A program that is no longer a target (a benchmark program renamed or
    # split) stays in an old build folder: its rows would stand beside the
    # current ones under the same names, so it does not run.
    if [[ " $light_targets " != *" $name "* ]]; then
      note "  bench $name: not a target of this build (left by an older one), not run"
      continue
    fi
    log "bench $name"
    run_bounded 150 "$exe" --benchmark_min_time=0.05s --benchmark_filter="$filter" \
      --benchmark_out="$OUT/bench/$name.json" --benchmark_out_format=json >"$OUT/bench/$name.txt" 2>&1 ||
      fail "  bench $name FAILED"
  done
  if $tests_only; then
    echo "not run (--tests-only)" >"$OUT/ratios.txt"
  else
    python3 scripts/bench_ratios.py "$OUT"/bench/*.json >"$OUT/ratios.txt" 2>&1
  fi
  # A ratio below its target is confirmed before it counts: the benchmarks
  # behind it run twice more, and the row is judged on the median of its three
  # ratios (all shown). One disturbed run then does not fail the check; a real
  # regression misses in most runs and still does.
  if ! $tests_only && grep -q 'MISS (target' "$OUT/ratios.txt"; then
    reruns=()
    miss_filters=$(python3 scripts/bench_ratios.py --miss-filters "$OUT"/bench/*.json)  # program<TAB>filter lines
    for round in 1 2; do
      mkdir -p "$OUT/rerun$round"
      while IFS=$'\t' read -r prog names; do
        [ -n "$prog" ] && [ -x "build/gpu/bench/$prog" ] || continue
        log "bench $prog again ($round of 2): $names"
        run_bounded 120 "build/gpu/bench/$prog" --benchmark_min_time=0.05s --benchmark_filter="$names" \
          --benchmark_out="$OUT/rerun$round/$prog.json" --benchmark_out_format=json >>"$OUT/bench/reruns.txt" 2>&1 ||
          fail "  bench $prog (again) FAILED"
      done <<<"$miss_filters"
      reruns+=(--rerun "$OUT/rerun$round")
    done
    note "benchmark rows below target on the first run, run twice more: $(grep -c 'MISS (target' "$OUT/ratios.txt")"
    python3 scripts/bench_ratios.py "${reruns[@]}" "$OUT"/bench/*.json >"$OUT/ratios.txt" 2>&1
    rm -rf "$OUT"/rerun1 "$OUT"/rerun2
  fi
  cat "$OUT"/bench/*.txt >"$OUT/bench.txt" 2>/dev/null
  python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
merged = {}
for f in sorted(glob.glob(os.path.join(out, "bench", "*.json"))):
    try:
        merged[os.path.basename(f)[:-5]] = json.load(open(f))
    except Exception as e:  # a benchmark that crashed leaves a broken file
        merged[os.path.basename(f)[:-5]] = {"error": str(e)}
json.dump(merged, open(os.path.join(out, "bench.json"), "w"), indent=1)
PY
  rm -rf "$OUT/bench"
  : >"$OUT/examples.log"
  if ! $tests_only && [ -x build/gpu/examples/kernel_chain/kernel_chain ]; then
    log "example kernel_chain"
    run_bounded 60 build/gpu/examples/kernel_chain/kernel_chain >>"$OUT/examples.log" 2>&1 || fail "  example kernel_chain FAILED"
  fi
  if ! $tests_only && [ -f scripts/gpu-check.d/examples.sh ]; then
    log "examples.sh"
    run_bounded 120 bash scripts/gpu-check.d/examples.sh >>"$OUT/examples.log" 2>&1 || fail "  examples.sh FAILED"
  fi
  touch "$OUT/lane-light.done"
}

if $run_cuda; then
  cuda_lane
else
  echo "not run (--lane heavy: the CUDA-only benchmarks are --lane cuda)" >"$OUT/ratios.txt"
  : >"$OUT/examples.log"
fi
unset CUDA_VISIBLE_DEVICES

lane=main
if [ -n "$heavy_pid" ]; then
  log "waiting for the heavy lane"
  wait "$heavy_pid"
  heavy_rc=$?
  [ "$heavy_rc" -eq 0 ] || fail "heavy lane exited with status $heavy_rc"
fi
cat "$OUT/build-heavy.log" >>"$OUT/build.log" 2>/dev/null
rm -f "$OUT/build-heavy.log"
cat "$OUT"/tests-*.log >"$OUT/tests.log" 2>/dev/null
rm -f "$OUT"/tests-*.log

# ---- summary (last) ------------------------------------------------------------
read -r total_pass total_fail total_skip < <(cat "$OUT"/lane-*.counts 2>/dev/null |
  awk '{p+=$2; f+=$3; s+=$4} END {print p+0, f+0, s+0}')

# Every expected program ran at least its minimum number of cases; no unlisted program.
expected_notes=""
while read -r prog min; do
  case "$prog" in test_*) ;; *) continue ;; esac
  case "$prog" in test_*_multi)  # suite gpu_multi: run by gpu-check.d/nccl.sh with two GPUs or more
    expected_notes+="  $prog: not run by the lanes (needs two GPUs or more; scripts/gpu-check.d/nccl.sh runs it)"$'\n'
    continue ;;
  esac
  # The libtorch test programs are the heavy lane's; the others the CUDA-only lane's.
  heavy_program=false
  case "$prog" in test_torch | test_torch_* | test_llm_decode) heavy_program=true ;; esac
  if $heavy_program && [ -n "${REPLAY_SKIP_TORCH:-}" ]; then
    expected_notes+="  $prog: not expected (REPLAY_SKIP_TORCH)"$'\n'
    continue
  fi
  if $heavy_program && ! $run_heavy; then
    expected_notes+="  $prog: the heavy lane's (--lane heavy)"$'\n'
    continue
  fi
  ! $heavy_program && ! $run_cuda && continue  # the CUDA-only lane's (--lane cuda)
  ran=$(awk -v n="$prog" '$1 == n {print $2 + $3}' "$OUT"/lane-*.counts 2>/dev/null | tail -1)
  if [ -z "$ran" ]; then
    expected_notes+="  FAIL: $prog (expected, at least $min cases) did not run"$'\n'
    echo 1 >"$OUT/lane-main.failed"
  elif [ "$ran" -lt "$min" ]; then
    expected_notes+="  FAIL: $prog ran $ran cases, fewer than the $min expected"$'\n'
    echo 1 >"$OUT/lane-main.failed"
  fi
done < tests/expected_cases.txt
for exe in build/gpu/tests/test_*; do
  [ -x "$exe" ] && [ -f "$exe" ] || continue
  grep -qE "^$(basename "$exe")[[:space:]]" tests/expected_cases.txt ||
    { expected_notes+="  FAIL: $(basename "$exe") is not listed in tests/expected_cases.txt"$'\n'; echo 1 >"$OUT/lane-main.failed"; }
done

# Benchmark ratios below target (MISS), or stated for a benchmark that did not run (n/a).
bench_misses=$(grep -c 'MISS (target' "$OUT/ratios.txt" 2>/dev/null || true)
bench_absent=$(grep -c '^n/a ' "$OUT/ratios.txt" 2>/dev/null || true)
bench_verdict="all ratios on target"
if $tests_only; then
  bench_verdict="not run (--tests-only)"
elif ! $run_cuda; then
  bench_verdict="not run (--lane heavy: the CUDA-only benchmarks are --lane cuda; the torch step prints its own targets)"
elif [ "${bench_misses:-0}" -gt 0 ] || { [ "$filter" = . ] && [ "${bench_absent:-0}" -gt 0 ]; }; then
  if [ "${REPLAY_BENCH_MISS_OK:-0}" = 1 ]; then
    bench_verdict="${bench_misses} below target, ${bench_absent} absent (not failing: REPLAY_BENCH_MISS_OK=1)"
  else
    bench_verdict="FAIL: ${bench_misses} below target, ${bench_absent} absent (REPLAY_BENCH_MISS_OK=1 to accept on a noisy machine)"
    echo 1 >"$OUT/lane-main.failed"
  fi
fi
sanitizer_errors=$(cat "$OUT"/lane-*.sanitizer 2>/dev/null | awk '{s+=$1} END {print s+0}')
sanitizer_unsupported=false
if [ -f "$OUT/sanitizer-unsupported" ]; then
  sanitizer_unsupported=true
  [ "${REPLAY_SANITIZER_UNSUPPORTED_OK:-0}" = 1 ] || echo 1 >"$OUT/lane-main.failed"
fi
status=0
ls "$OUT"/lane-*.failed >/dev/null 2>&1 && status=1
[ "$total_skip" -eq 0 ] || status=1
[ "$total_pass" -gt 0 ] || status=1
{
  echo "================ replay gpu-check summary ================"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
  echo "wall time: ${SECONDS} s"
  echo "tests: $total_pass passed, $total_fail failed, $total_skip skipped"
  printf '%s' "$expected_notes"
  echo "benchmarks: $bench_verdict"
  case "$only_lane" in
    cuda) echo "lane: the CUDA-only lane alone (--lane cuda); --lane heavy checks the rest (libtorch adapter, server, NCCL, packaging and torch steps)" ;;
    heavy) echo "lane: the heavy lane alone (--lane heavy); --lane cuda checks the rest (CUDA-only tests, sanitizer runs, benchmarks, examples)" ;;
  esac
  if ! $tests_only && $sanitizer_unsupported; then
    echo "sanitizer: NOT RUN: compute-sanitizer refuses this device ($(head -c 200 "$OUT/sanitizer-unsupported"))$([ "${REPLAY_SANITIZER_UNSUPPORTED_OK:-0}" = 1 ] && echo "; not failing: REPLAY_SANITIZER_UNSUPPORTED_OK=1" || echo "; failing (REPLAY_SANITIZER_UNSUPPORTED_OK=1 to accept)"); $sanitizer_errors errors in the runs that ran"
  elif ! $tests_only; then
    if $run_cuda; then
      echo "sanitizer: $sanitizer_errors errors ($($quick && echo memcheck || echo memcheck, racecheck, synccheck)$($run_heavy && echo "; memcheck on the test_torch programs"))"
    else
      echo "sanitizer: $sanitizer_errors errors (memcheck on the test_torch programs)"
    fi
  fi
  cat "$OUT"/lane-main.notes "$OUT"/lane-light.notes "$OUT"/lane-heavy.notes 2>/dev/null
  echo "---- benchmark ratios ----"
  cat "$OUT/ratios.txt"
  echo "---- examples ----"
  grep -vE '^\s*$' "$OUT/examples.log" | tail -30
  echo "---- heavy lane steps (tails) ----"
  cat "$OUT/lane-heavy.tail" 2>/dev/null
  if [ "$status" -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
} | tee "$OUT/summary.txt"
rm -f "$OUT"/lane-* "$OUT"/sanitizer-unsupported
exit "$status"
