#!/usr/bin/env bash
# gpu-check step for the libtorch adapter (replay/torch.hpp), run by
# scripts/gpu-check.sh after the build and the tests (test_torch runs there):
#   1. writes torchvision's ResNet-50 as TorchScript (scripts/make_torchscript_resnet.py),
#   2. runs the torch_resnet example, fp16 (torch::nn, TorchScript, prepared TorchScript),
#      and, where the capture audit was built, capture_audit_torchscript (a TorchScript
#      module's host read-back named with its line of model.py),
#   3. runs torch_call_bench (GraphedCallable's host cost over a raw replay) and its ratios,
#   4. runs the C++ ResNet benchmark (torch::nn and prepared TorchScript),
#   5. traces a BERT-base-sized encoder (scripts/make_torchscript_bert.py, into the
#      build directory) and runs the torch_bert example: the check against
#      Python's outputs, then C++ eager and replay over 2-D buckets,
#   6. runs the Python peers: bench/torch_resnet_bench.py (PyTorch eager,
#      torch.cuda.CUDAGraph, torch.compile reduce-overhead) and
#      bench/torch_bert_bench.py (eager, torch.compile reduce-overhead with
#      dynamic=False), torch.compile last and within what is left of the budget,
#   7. with time left, the piecewise benchmark (scripts/make_torchscript_piecewise.py's
#      model, exported with the others, and BERT with a read-back after layer 6,
#      make_torchscript_bert.py --readback): bench/torch_piecewise_bench.cpp, then its
#      Python peer bench/torch_piecewise_bench.py (torch.compile reduce-overhead),
#   8. prints a short results table last.
#   scripts/gpu-check.d/torch.sh [all | export | measure | piecewise]
#     all (default): every step; export: steps 1 and 5's exports only (nothing
#     timed: gpu-check.sh runs them beside its build); measure: the rest, with
#     the exported files already in the build directory; piecewise: step 7 on
#     its own (a few minutes after the build): the piecewise model's export and
#     BERT's with a read-back after layer 6 (into $build/bert_piecewise, shapes
#     1x128 and 8x128) when missing, the C++ benchmark on both (--bert), the
#     Python peer, and a summary line per batch and BERT shape.
# Bounded by REPLAY_TORCH_BUDGET_S (default 350 s; gpu-check.sh kills a step
# at 420 s): every step's timeout is capped by what is left, and torch.compile
# gets what the other steps leave (ResNet's at most REPLAY_TORCH_COMPILE_BUDGET_S,
# default 75 s: no batch size is started after it, so about 100 s in all;
# BERT's the rest, at most 90 s, shapes in order of importance).
# Files in $OUT: torch_example.txt, capture_audit_torchscript.txt, torch_call_bench.{txt,json}, torch_bench_cpp.{txt,json},
# torch_bench_py.json, torch_bench.txt (ResNet table), torch_bert.{txt,json},
# torch_bert_py.json, torch_bert_bench.txt (BERT table), torch_piecewise{,_py}.json,
# torch_piecewise{,_bench}.txt, torch_*.err, torch_results.txt (piecewise mode:
# torch_piecewise{,_py}.json, torch_piecewise{,_bench}.txt, torch_piecewise_results.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-all}
case "$mode" in
  all | export | measure | piecewise) ;;
  *) echo "torch: unknown mode '$mode' (all, export, measure or piecewise)"; exit 2 ;;
esac
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
build=${REPLAY_BUILD_DIR:-build/gpu}
step() { printf '[torch %s +%ds] %s\n' "$(date +%T)" "$((SECONDS - start))" "$*"; }

if [ -n "${REPLAY_SKIP_TORCH:-}" ]; then
  echo "torch: skipped (REPLAY_SKIP_TORCH is set)"
  exit 0
fi
example=$build/examples/torch_resnet/torch_resnet
bert=$build/examples/torch_bert/torch_bert
bench=$build/bench/torch/torch_resnet_bench
call_bench=$build/bench/torch/torch_call_bench
for exe in "$example" "$bert" "$bench" "$call_bench" "$build/tests/test_torch"; do
  if [ "$mode" != export ] && [ "$mode" != piecewise ] && [ ! -x "$exe" ]; then
    echo "torch: FAILED: $exe was not built (was Torch found when configuring? see build.log)"
    exit 1
  fi
done

status=0
start=$SECONDS
budget=${REPLAY_TORCH_BUDGET_S:-350}
left() { echo $((budget - (SECONDS - start))); }
failed() { echo "torch: $* FAILED"; status=1; }
# bounded SECONDS CMD...: CMD under `timeout`, at most SECONDS and at most what is left (+30 s).
bounded() {
  local want=$1 cap
  shift
  cap=$(( $(left) + 30 ))
  [ "$cap" -lt "$want" ] && want=$cap
  [ "$want" -lt 10 ] && { echo "torch: no time left for: $*"; return 124; }
  timeout "$want" "$@"
}

torchscript=$build/resnet50_torchscript.pt
bert_dir=$build/bert
piecewise_dir=$build/piecewise_model
piecewise_bench=$build/bench/torch/torch_piecewise_bench

# piecewise_benchmark BERT_DIR: the C++ benchmark (with BERT when
# BERT_DIR/bert_readback.pt exists), then its Python peer and the summary.
piecewise_benchmark() {
  local bert_args=()
  [ -f "$1/bert_readback.pt" ] && bert_args=(--bert "$1")
  step "piecewise benchmark (C++ eager, piecewise, whole graph${bert_args:+; BERT with a read-back}; then torch.compile reduce-overhead)"
  bounded 120 "$piecewise_bench" "$piecewise_dir" "${bert_args[@]}" --json "$OUT/torch_piecewise.json" \
    >"$OUT/torch_piecewise.txt" 2>&1 || failed "C++ piecewise benchmark (rc=$?)"
  cat "$OUT/torch_piecewise.txt"
  bounded 180 python3 bench/torch_piecewise_bench.py --cpp-json "$OUT/torch_piecewise.json" \
    --json "$OUT/torch_piecewise_py.json" >"$OUT/torch_piecewise_bench.txt" 2>"$OUT/torch_piecewise_py.err" ||
    { failed "Python piecewise benchmark"; tail -5 "$OUT/torch_piecewise_py.err"; }
}

if [ "$mode" = piecewise ]; then
  [ -x "$piecewise_bench" ] || { echo "torch: FAILED: $piecewise_bench was not built"; exit 1; }
  bert_pw_dir=$build/bert_piecewise
  if [ ! -f "$piecewise_dir/readback.pt" ] || [ ! -f "$piecewise_dir/whole.pt" ] || [ ! -f "$piecewise_dir/kernels.pt" ]; then
    step "TorchScript export (the piecewise benchmark's model, scripted)"
    bounded 90 python3 scripts/make_torchscript_piecewise.py "$piecewise_dir" >"$OUT/torch_piecewise_export.txt" 2>&1 ||
      failed "piecewise model export (rc=$?)"
    grep -v Warning "$OUT/torch_piecewise_export.txt" | tail -1
  fi
  if [ ! -f "$bert_pw_dir/bert_readback.pt" ]; then
    step "TorchScript export (BERT-base, fp16, and the same with a read-back after layer 6)"
    bounded 150 python3 scripts/make_torchscript_bert.py "$bert_pw_dir" --readback --shapes 1x128,8x128 \
      >"$OUT/torch_bert_piecewise_export.txt" 2>&1 || failed "BERT read-back export (rc=$?)"
    grep -v Warning "$OUT/torch_bert_piecewise_export.txt" | tail -3
  fi
  piecewise_benchmark "$bert_pw_dir"
  {
    echo "torch piecewise: $((SECONDS - start)) s, $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
    cat "$OUT/torch_piecewise_bench.txt" 2>/dev/null
    grep -hE "^  target" "$OUT/torch_piecewise.txt" 2>/dev/null
  } | tee "$OUT/torch_piecewise_results.txt"
  exit "$status"
fi
if [ "$mode" != measure ]; then
  rm -f "$torchscript" "$bert_dir"/bert_*.pt "$piecewise_dir"/*.pt
  step "TorchScript export (ResNet-50)"
  bounded 120 python3 scripts/make_torchscript_resnet.py "$torchscript" || failed "TorchScript export"
  step "TorchScript export (BERT-base, fp16, traced on the GPU)"
  bounded 150 python3 scripts/make_torchscript_bert.py "$bert_dir" --readback >"$OUT/torch_bert_export.txt" 2>&1 ||
    failed "BERT export (rc=$?)"
  grep -v Warning "$OUT/torch_bert_export.txt" | tail -3
  step "TorchScript export (the piecewise benchmark's model, scripted)"
  bounded 90 python3 scripts/make_torchscript_piecewise.py "$piecewise_dir" >"$OUT/torch_piecewise_export.txt" 2>&1 ||
    failed "piecewise model export (rc=$?)"
  grep -v Warning "$OUT/torch_piecewise_export.txt" | tail -1
fi
if [ "$mode" = export ]; then
  echo "torch exports: $((SECONDS - start)) s, $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
  exit "$status"
fi
for file in "$torchscript" "$bert_dir/bert_torchscript.pt" "$bert_dir/bert_reference.pt"; do
  [ -f "$file" ] || failed "$file is missing (export: scripts/gpu-check.d/torch.sh export)"
done
args=()
[ -f "$torchscript" ] && args=(--torchscript "$torchscript")

step "example torch_resnet ${args[*]}"
bounded 150 "$example" "${args[@]}" --dtypes fp16 --iterations 30 >"$OUT/torch_example.txt" 2>&1 ||
  failed "example torch_resnet (rc=$?)"
cat "$OUT/torch_example.txt"

# A TorchScript model with a read-back halfway, graphed piecewise
# (examples/torch_piecewise): its own checks against eager, bit for bit.
piecewise_example=$build/examples/torch_piecewise/torch_piecewise
if [ -x "$piecewise_example" ]; then
  step "example torch_piecewise"
  bounded 90 "$piecewise_example" >"$OUT/torch_piecewise_example.txt" 2>&1 ||
    failed "example torch_piecewise (rc=$?)"
  cat "$OUT/torch_piecewise_example.txt"
else
  failed "examples/torch_piecewise was not built"
fi

# The capture audit inside TorchScript (examples/capture_audit): built where
# CUPTI was found, as test_audit is. Its own checks, and the line it must print.
audit_example=$build/examples/capture_audit/capture_audit_torchscript
if [ -x "$audit_example" ]; then
  step "example capture_audit_torchscript"
  bounded 90 "$audit_example" >"$OUT/capture_audit_torchscript.txt" 2>&1 ||
    failed "example capture_audit_torchscript (rc=$?)"
  cat "$OUT/capture_audit_torchscript.txt"
  grep -qF "(a .item()), called from model.py:3 (in forward)" \
    "$OUT/capture_audit_torchscript.txt" || failed "capture_audit_torchscript: no finding naming model.py:3"
elif [ -x "$build/tests/test_audit" ]; then
  failed "capture_audit_torchscript was not built although the capture audit was"
fi

step "torch_call_bench (GraphedCallable host cost over a raw replay)"
bounded 90 "$call_bench" --benchmark_out="$OUT/torch_call_bench.json" \
  --benchmark_out_format=json >"$OUT/torch_call_bench.txt" 2>&1 || failed "torch_call_bench (rc=$?)"
cat "$OUT/torch_call_bench.txt"
python3 scripts/bench_ratios.py --ratios bench/torch/call_overhead.ratios "$OUT/torch_call_bench.json" \
  >"$OUT/torch_call_ratios.txt" 2>&1
cat "$OUT/torch_call_ratios.txt"

step "C++ ResNet benchmark"
bounded 150 "$bench" "${args[@]}" --json "$OUT/torch_bench_cpp.json" >"$OUT/torch_bench_cpp.txt" 2>&1 ||
  failed "C++ benchmark (rc=$?)"
cat "$OUT/torch_bench_cpp.txt"

if [ -f "$bert_dir/bert_torchscript.pt" ]; then
  step "example torch_bert (check against Python, then C++ eager and replay)"
  bounded 150 "$bert" --model "$bert_dir/bert_torchscript.pt" --reference "$bert_dir/bert_reference.pt" \
    --iterations 100 --json "$OUT/torch_bert.json" >"$OUT/torch_bert.txt" 2>&1 || failed "example torch_bert (rc=$?)"
  cat "$OUT/torch_bert.txt"
fi

compile_budget=$(( $(left) - 100 ))
[ "$compile_budget" -gt "${REPLAY_TORCH_COMPILE_BUDGET_S:-75}" ] && compile_budget=${REPLAY_TORCH_COMPILE_BUDGET_S:-75}
[ "$compile_budget" -lt 0 ] && compile_budget=0
step "Python ResNet benchmark (eager, torch.cuda.CUDAGraph, then torch.compile within ${compile_budget} s)"
bounded 240 python3 bench/torch_resnet_bench.py --json "$OUT/torch_bench_py.json" \
  --cpp-json "$OUT/torch_bench_cpp.json" --compile-budget-s "$compile_budget" \
  >"$OUT/torch_bench.txt" 2>"$OUT/torch_bench_py.err" || { failed "Python ResNet benchmark"; tail -5 "$OUT/torch_bench_py.err"; }
grep -E "torch.compile (failed|: budget)" "$OUT/torch_bench_py.err" || true

bert_budget=$(( $(left) - 40 ))
[ "$bert_budget" -gt 90 ] && bert_budget=90
[ "$bert_budget" -lt 0 ] && bert_budget=0
step "Python BERT benchmark (eager, then torch.compile dynamic=False within ${bert_budget} s)"
bounded 200 python3 bench/torch_bert_bench.py --json "$OUT/torch_bert_py.json" --cpp-json "$OUT/torch_bert.json" \
  --compile-budget-s "$bert_budget" >"$OUT/torch_bert_bench.txt" 2>"$OUT/torch_bert_py.err" ||
  { failed "Python BERT benchmark"; tail -5 "$OUT/torch_bert_py.err"; }
grep -E "torch.compile (failed|: budget)" "$OUT/torch_bert_py.err" || true

# Breakable captures: C++ eager, piecewise, a whole graph without the
# read-back and one with the read-back's kernels (bench/torch_piecewise_bench.cpp), then torch.compile
# reduce-overhead with its graph break (bench/torch_piecewise_bench.py). Last,
# and only with time left, so that it never takes the other steps' budget.
if [ -x "$piecewise_bench" ] && [ -f "$piecewise_dir/readback.pt" ] && [ "$(left)" -gt 60 ]; then
  piecewise_benchmark "$bert_dir"
else
  echo "torch: piecewise benchmark skipped ($(left) s of the budget left, or not built / not exported)"
fi

{
  echo "torch step: $((SECONDS - start)) s, $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
  cat "$OUT/torch_bench.txt" 2>/dev/null
  cat "$OUT/torch_bert_bench.txt" 2>/dev/null
  cat "$OUT/torch_piecewise_bench.txt" 2>/dev/null
  echo "---- torch results ----"
  grep -E "vs unprepared" "$OUT/torch_example.txt" |
    sed -E 's/.*(b=[0-9]+).*max-abs-err\/max\|ref\| ([^ ]+).*/\1 \2/' | tr '\n' ' ' |
    sed -E 's/^(.+) $/  ResNet-50 prepared fp16 vs unprepared, max-abs-error \/ max|ref| (tolerance 1e-02): \1\n/'
  grep -E "^torch_bert: checked" "$OUT/torch_bert.txt" 2>/dev/null | sed 's/^torch_bert: /  BERT: /'
  sed 's/^/  /' "$OUT/torch_call_ratios.txt" 2>/dev/null
  grep -hE "^  (target|bound)" "$OUT/torch_bench.txt" "$OUT/torch_bert_bench.txt" "$OUT/torch_piecewise.txt" \
    "$OUT/torch_piecewise_bench.txt" 2>/dev/null
} | tee "$OUT/torch_results.txt"
exit "$status"
