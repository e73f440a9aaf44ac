#!/usr/bin/env bash
# scripts/gpu-check.sh refuses a bad argument with status 2 and a message
# naming it, before it configures, builds or writes anything.
#   tests/scripts/gpu_check_arguments_test.sh SOURCE_DIR
set -u
script=$1/scripts/gpu-check.sh
status=0
expect_refusal() {
  local want=$1 out rc scratch
  shift
  scratch=$(mktemp -d)
  out=$(cd "$scratch" && REPLAY_CHECK_OUT="$scratch/out" bash "$script" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" <<<"$out" || [ -e "$scratch/out" ]; then
    echo "FAIL: gpu-check.sh $* exited $rc (want 2, with \"$want\", nothing written): $out"
    status=1
  fi
  rm -rf "$scratch"
}
expect_refusal "--lane takes cuda or heavy, not 'gpu'" --lane gpu
expect_refusal "--lane takes cuda or heavy, not ''" --lane
expect_refusal "--lane takes cuda or heavy, not 'all'" --lane=all
expect_refusal "unknown argument '--fast'" --fast
expect_refusal "unknown argument 'cuda'" --quick cuda
[ "$status" -eq 0 ] && echo "gpu-check.sh argument checks: ok"
exit "$status"
