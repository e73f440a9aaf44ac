#!/usr/bin/env bash
# gpu-check step for the libtorch adapter (replay/torch.hpp), run by
# scripts/gpu-check.sh after the build and the tests (test_torch runs there):
#   1. writes torchvision's ResNet-50 as TorchScript (scripts/make_torchscript_resnet.py),
#   2. runs the torch_resnet example with both models (torch::nn and TorchScript),
#   3. runs the C++ benchmark, then the Python one in the same device call
#      (PyTorch eager, torch.cuda.CUDAGraph, torch.compile reduce-overhead last,
#      its compilations capped by REPLAY_TORCH_COMPILE_BUDGET_S, default 100 s),
#   4. prints one side-by-side table with the targets, last.
# About 3 minutes; torch.compile's compilation is most of it.
# Files in $OUT: torch_example.txt, torch_bench_cpp.{txt,json}, torch_bench_py.json,
# torch_bench.txt (the table), torch_bench_py.err.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
build=${REPLAY_BUILD_DIR:-build/gpu}
step() { printf '[torch %s] %s\n' "$(date +%T)" "$*"; }

if [ -n "${REPLAY_SKIP_TORCH:-}" ]; then
  echo "torch: skipped (REPLAY_SKIP_TORCH is set)"
  exit 0
fi
example=$build/examples/torch_resnet/torch_resnet
bench=$build/bench/torch/torch_resnet_bench
if [ ! -x "$example" ] || [ ! -x "$bench" ] || [ ! -x "$build/tests/test_torch" ]; then
  echo "torch: FAILED: the adapter's targets were not built (was Torch found when configuring? see build.log)"
  exit 1
fi

status=0
start=$SECONDS
torchscript=$build/resnet50_torchscript.pt
step "TorchScript export"
if ! timeout 180 python3 scripts/make_torchscript_resnet.py "$torchscript"; then
  echo "torch: TorchScript export FAILED"
  status=1
fi
args=()
[ -f "$torchscript" ] && args=(--torchscript "$torchscript")

step "example torch_resnet ${args[*]}"
timeout 300 "$example" "${args[@]}" >"$OUT/torch_example.txt" 2>&1
rc=$?
cat "$OUT/torch_example.txt"
[ "$rc" -eq 0 ] || { echo "torch: example FAILED (rc=$rc)"; status=1; }

step "C++ benchmark"
timeout 180 "$bench" --json "$OUT/torch_bench_cpp.json" >"$OUT/torch_bench_cpp.txt" 2>&1
rc=$?
cat "$OUT/torch_bench_cpp.txt"
[ "$rc" -eq 0 ] || { echo "torch: C++ benchmark FAILED (rc=$rc)"; status=1; }

step "Python benchmark (eager, torch.cuda.CUDAGraph, then torch.compile)"
timeout 480 python3 bench/torch_resnet_bench.py --json "$OUT/torch_bench_py.json" \
  --cpp-json "$OUT/torch_bench_cpp.json" --compile-budget-s "${REPLAY_TORCH_COMPILE_BUDGET_S:-100}" \
  >"$OUT/torch_bench.txt" 2>"$OUT/torch_bench_py.err"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "torch: Python benchmark FAILED (rc=$rc); its last messages:"
  tail -5 "$OUT/torch_bench_py.err"
  status=1
fi
grep -E "torch.compile (failed|: budget)" "$OUT/torch_bench_py.err" || true

echo "torch step: $((SECONDS - start)) s, $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
cat "$OUT/torch_bench.txt"
exit "$status"
