#!/usr/bin/env bash
# Runs the CUDA examples besides kernel_chain on the device (gpu-check.sh runs
# kernel_chain itself). Each example checks its own results and exits non-zero
# when they are wrong. capture_audit's libtorch program, capture_audit_torchscript,
# is the heavy lane's: gpu-check.d/torch.sh runs it after the libtorch build.
# Last, kernel_chain once more under the kernel trace (bench/kernel_trace).
set -uo pipefail
status=0
for ex in dynamic_batch piecewise_chain pipeline_throughput device_loop capture_audit; do
  bin=build/gpu/examples/$ex/$ex
  if [ -x "$bin" ]; then
    echo "== $ex"
    args=(); [ "$ex" = pipeline_throughput ] && args=(16 8 4)
    "$bin" "${args[@]}" || { echo "$ex FAILED"; status=1; }
    if [ "$ex" = capture_audit ]; then  # REPLAY_AUDIT=1 audits a capture that does not ask for it
      REPLAY_AUDIT=1 "$bin" --from-environment || { echo "$ex --from-environment FAILED"; status=1; }
    fi
  else
    echo "== $ex: not built"; status=1
  fi
done
# The kernel trace (bench/kernel_trace): kernel_chain run under it writes its
# graph's kernels (a graph node each), and summarize_trace.py reads them.
trace_library=build/gpu/bench/libreplay_kernel_trace.so
if [ -f "$trace_library" ]; then
  echo "== kernel trace"
  trace=$(mktemp --suffix=.csv)
  if REPLAY_KERNEL_TRACE="$trace" CUDA_INJECTION64_PATH="$PWD/$trace_library" \
       build/gpu/examples/kernel_chain/kernel_chain 100 4096 5 &&
     awk -F, '$4 != 0 && $5 ~ /step_kernel/ { found = 1; exit } END { exit !found }' "$trace" &&
     python3 bench/kernel_trace/summarize_trace.py "$trace"; then
    :
  else
    echo "kernel trace FAILED"; status=1
  fi
  rm -f "$trace"
elif grep -q '^replay_kernel_trace:' <(cmake --build build/gpu --target help 2>/dev/null); then
  echo "== kernel trace: a target of this build, but not built"; status=1
else
  echo "== kernel trace: not a target of this build (no CUPTI), not run"
fi
exit $status
