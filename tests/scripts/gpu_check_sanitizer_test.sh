#!/usr/bin/env bash
# scripts/gpu-check.sh's run_sanitizer against a stand-in compute-sanitizer:
# compute-sanitizer's own "Device not supported" with no error found marks the
# machine as one where the sanitizer cannot run (later runs are left out, none
# counted as passed or failed); the same words printed by the program, or
# beside a real error, are judged as any run is; a clean run counts 0 errors.
#   tests/scripts/gpu_check_sanitizer_test.sh SOURCE_DIR
set -u
script=$1/scripts/gpu-check.sh
status=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/bin"
# The functions under test, taken from the script itself.
# shellcheck disable=SC2016 # written for the functions' file, expanded there
{
  echo 'note() { echo "NOTE $*" >>"$OUT/notes"; }; log() { :; }; fail() { echo "FAIL $*" >>"$OUT/notes"; }'
  echo 'run_bounded() { shift; "$@"; }'
  sed -n '/^sanitizer_exclusions=(/,/^)/p' "$script"
  sed -n '/^run_sanitizer() {/,/^}/p' "$script"
} >"$scratch/functions.sh"
grep -q '^run_sanitizer() {' "$scratch/functions.sh" || { echo "FAIL: run_sanitizer() not found in $script"; exit 1; }

# stand_in OUTPUT RC: a compute-sanitizer that prints OUTPUT, exits RC and counts its runs.
stand_in() {
  printf '#!/usr/bin/env bash\necho run >>"%s/runs"\nprintf "%%s\\n" %q\nexit %s\n' "$scratch" "$1" "$2" \
    >"$scratch/bin/compute-sanitizer"
  chmod +x "$scratch/bin/compute-sanitizer"
}
# case NAME: runs run_sanitizer for memcheck and racecheck in a fresh OUT.
run_case() {
  rm -rf "$scratch/out" "$scratch/runs"
  mkdir -p "$scratch/out"
  # shellcheck disable=SC2034 # OUT and lane are run_sanitizer's globals
  (OUT=$scratch/out lane=light PATH="$scratch/bin:$PATH"
   # shellcheck disable=SC1091
   . "$scratch/functions.sh"
   run_sanitizer memcheck /bin/true
   run_sanitizer racecheck /bin/true)
}
check() {  # description, then a test command
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what"
    sed 's/^/  /' "$scratch/out/notes" 2>/dev/null
    status=1
  fi
}
runs() { wc -l <"$scratch/runs" 2>/dev/null || echo 0; }

refused=$'========= COMPUTE-SANITIZER\n========= Error: Device not supported.\n[doctest] test cases: 2 | 0 passed | 2 failed | 0 skipped\n========= ERROR SUMMARY: 0 errors'
stand_in "$refused" 1
run_case
check "a refused device leaves a marker" test -s "$scratch/out/sanitizer-unsupported"
check "a refused device is run once, then left out" test "$(runs)" -eq 1
check "a refused run is not counted" test ! -e "$scratch/out/lane-light.sanitizer"
check "a refused run does not fail by itself" bash -c "! grep -q '^FAIL' '$scratch/out/notes'"

printed=$'program: Device not supported\n========= Invalid __global__ write of size 4\n========= ERROR SUMMARY: 1 error'
stand_in "$printed" 99
run_case
check "the program's own words leave no marker" test ! -e "$scratch/out/sanitizer-unsupported"
check "an error beside the program's words fails" grep -q '^FAIL.*rc=99, 1 errors' "$scratch/out/notes"
check "both tools run" test "$(runs)" -eq 2

beside=$'========= Error: Device not supported.\n========= Invalid __global__ read of size 4\n========= ERROR SUMMARY: 1 error'
stand_in "$beside" 99
run_case
check "an error beside the refusal leaves no marker" test ! -e "$scratch/out/sanitizer-unsupported"
check "an error beside the refusal fails" grep -q '^FAIL.*1 errors' "$scratch/out/notes"

clean=$'[doctest] test cases: 2 | 2 passed | 0 failed | 0 skipped\n========= ERROR SUMMARY: 0 errors'
stand_in "$clean" 0
run_case
check "a clean run counts 0 errors for each tool" test "$(tr '\n' ' ' <"$scratch/out/lane-light.sanitizer")" = "0 0 "
check "a clean run does not fail" bash -c "! grep -q '^FAIL' '$scratch/out/notes' 2>/dev/null"

[ "$status" -eq 0 ] && echo "gpu-check.sh sanitizer checks: ok"
exit "$status"
