#!/usr/bin/env bash
# Runs the CUDA examples besides kernel_chain on the device (gpu-check.sh runs
# kernel_chain itself). Each example checks its own results and exits non-zero
# when they are wrong. capture_audit's libtorch program, capture_audit_torchscript,
# is the heavy lane's: gpu-check.d/torch.sh runs it after the libtorch build.
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
exit $status
