#!/usr/bin/env bash
# gpu-check step for the NCCL component (replay/nccl.hpp), run by
# scripts/gpu-check.sh after the build and the tests (test_nccl's gpu suite
# runs there, on one GPU):
#   1. the tensor_parallel_mlp example with one rank: one thread per GPU
#      (ncclCommInitAll) and one process per GPU (unique id through a file),
#      each with --steps (random batch sizes, same bucket every step, no hang);
#   2. with two GPUs or more: the same with every GPU, and test_nccl_multi
#      (suite gpu_multi). gpu-check.sh gives each of its lanes one GPU, so this
#      part waits for the CUDA-only lane to finish ($OUT/lane-light.done) and
#      then uses every GPU.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless set; docs/nccl.md).
# Bounded: every run has its own timeout.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${REPLAY_BUILD_DIR:-build/gpu}
OUT=${OUT:-build/gpu-check}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
example=$build/examples/tensor_parallel_mlp/tensor_parallel_mlp
tests=$build/tests/test_nccl_multi
step() { printf '[nccl %s] %s\n' "$(date +%T)" "$*"; }

if grep -q '^NCCL_LIBRARY:FILEPATH=.*NOTFOUND' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "nccl: skipped: NCCL was not found when configuring (no system NCCL, no nvidia-nccl-cu13 wheel)"
  exit 0
fi
if [ ! -x "$example" ] || [ ! -x "$tests" ]; then
  echo "nccl: FAILED: NCCL was found but tensor_parallel_mlp or test_nccl_multi was not built (see build.log)"
  exit 1
fi
status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run_mlp SECONDS ARGS...: the example, bounded.
run_mlp() {
  local limit=$1; shift
  step "tensor_parallel_mlp $*"
  timeout "$limit" "$example" "$@"
  local rc=$?
  [ "$rc" -eq 0 ] || { echo "nccl: tensor_parallel_mlp $* FAILED (rc=$rc)"; status=1; }
}

# run_processes N SECONDS STEPS: N processes, one per GPU, unique id through a file.
run_processes() {
  local n=$1 limit=$2 steps=$3 pids=() r rc
  step "tensor_parallel_mlp: $n process(es), --steps $steps"
  rm -f "$tmp/id.$n"
  for ((r = 0; r < n; r++)); do
    timeout "$limit" "$example" --rank "$r" --nranks "$n" --id-file "$tmp/id.$n" --steps "$steps" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid"
    rc=$?
    [ "$rc" -eq 0 ] || { echo "nccl: a process of the $n-process run FAILED (rc=$rc)"; status=1; }
  done
}

run_mlp 240 --ranks 1 --steps 100000
run_processes 1 120 10000

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -ge 2 ]; then
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    step "waiting for the CUDA-only lane before using all $gpus GPUs"
    for _ in $(seq 1 240); do [ -f "$OUT/lane-light.done" ] && break; sleep 1; done
    [ -f "$OUT/lane-light.done" ] || echo "nccl: note: the CUDA-only lane is still running; its timings may be disturbed"
    unset CUDA_VISIBLE_DEVICES
  fi
  run_mlp 300 --steps 100000
  run_processes "$gpus" 240 20000
  step "test_nccl_multi"
  timeout 240 "$tests" --no-version
  rc=$?
  [ "$rc" -eq 0 ] || { echo "nccl: test_nccl_multi FAILED (rc=$rc)"; status=1; }
else
  echo "nccl: one GPU here: the multi-GPU runs (tensor_parallel_mlp over every GPU, test_nccl_multi) were not made"
fi
echo "nccl step: $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
exit "$status"
