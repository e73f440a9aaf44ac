#!/usr/bin/env bash
# gpu-check step for examples/llm_decode (heavy lane; run by scripts/gpu-check.sh
# after test_llm_decode ran with the other test programs):
#   check:   random weights for the "small" preset; `llm_decode generate` with one
#            and with 4 steps per launch (24 requests from 4 threads through
#            continuous batching, every executor call replayed eagerly: the
#            tokens must be equal bit for bit), with the ATen operators and
#            with the fused kernels, with the fused kernels and chunked
#            prefill, and with the fused kernels past 256 positions (300 new
#            tokens: the attention split over blocks); scripts/llm_decode_compare.py
#            (C++ against llama.py and Hugging Face on the same weights);
#   measure: for each preset in REPLAY_LLM_PRESETS (default "small"): the C++
#            benchmark (eager, graphed, graphed 4 steps per launch, graphed with
#            the fused kernels), the Python
#            peers (bench/llm_decode/decode_peers.py: eager, torch.cuda.CUDAGraph,
#            Hugging Face generate eager and static cache, torch.compile
#            reduce-overhead and max-autotune last,
#            within what is left of the budget), the summary with the goals
#            (bench/llm_decode/summarize.py); for "small" also the load test
#            (continuous, grouped, chunked and static batching; uniform and exponential
#            output lengths) and its plots.
#   goodput: `llm_decode goodput` on the "small" preset with the fused kernels:
#            the highest offered rate at which TTFT p99 <= 100 ms and TPOT p99 <=
#            2x the batch-1 decode step (measured first, in the same run), for
#            static batching and continuous batching (continuous, chunked,
#            chunked-grouped), exponential and uniform output lengths, at least
#            1,000 requests per point, the whole search 3 times (the spread);
#            every point and its time printed. Not part of `all`: a run of its
#            own, e.g. REPLAY_LLM_BUDGET_S=450 scripts/gpu-check.d/llm_decode.sh goodput
#            (about 5 to 7 minutes; the program starts no point that would end
#            past the budget less 60 s, and writes what it measured).
#            REPLAY_LLM_GOODPUT_ARGS: more options for it (e.g. "--repeats 1").
#   scripts/gpu-check.d/llm_decode.sh [all | check | measure | goodput]   (default: $REPLAY_LLM_MODE, else check)
# gpu-check.sh runs the check (about 40 s); the measurement takes minutes
# (the Python peers compile), so it is a run of its own, e.g.
#   REPLAY_LLM_PRESETS="small 1b" REPLAY_LLM_BUDGET_S=540 scripts/gpu-check.d/llm_decode.sh measure
# after a build of build/gpu (llm_decode's target).
# Bounded by REPLAY_LLM_BUDGET_S (default 360 s, goodput 450 s; gpu-check.sh
# kills a step at 420 s). REPLAY_LLM_PEERS: the Python peers to measure (default all:
# eager,cuda_graphs,hf_eager,hf_static,compile,compile_max_autotune: torch.compile
# in its two decode modes, reduce-overhead and max-autotune, each with a third of
# the peers' budget). The C++ bench and the peers decode the same lengths:
# REPLAY_LLM_PROMPT (default 32) prompt tokens, REPLAY_LLM_NEW_TOKENS (default
# 128) new tokens a row. The load test:
# REPLAY_LLM_LOAD_MIXES (default "uniform exponential"; "none" skips it),
# REPLAY_LLM_LOAD_RATES (default 50,100,200,400,800 requests/s),
# REPLAY_LLM_LOAD_KERNELS (default fused: the engine's fastest step; aten
# for the plain operators). Files in $OUT: llm_*.txt,
# llm_*.json, llm_load_small_{uniform,exponential}.png, llm_results.md;
# goodput: llm_goodput_small.{txt,json}, llm_goodput.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-${REPLAY_LLM_MODE:-check}}
case "$mode" in
  all | check | measure | goodput) ;;
  *) echo "llm_decode: unknown mode '$mode' (all, check, measure or goodput)"; exit 2 ;;
esac
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
build=${REPLAY_BUILD_DIR:-build/gpu}
exe=$build/examples/llm_decode/llm_decode
weights=$build/llm_weights
presets=${REPLAY_LLM_PRESETS:-small}
default_budget=360
[ "$mode" = goodput ] && default_budget=450
budget=${REPLAY_LLM_BUDGET_S:-$default_budget}
start=$SECONDS
status=0
step() { printf '[llm_decode %s +%ds] %s\n' "$(date +%T)" "$((SECONDS - start))" "$*"; }
failed() { echo "llm_decode: $* FAILED"; status=1; }
left() { echo $((budget - (SECONDS - start))); }
bounded() {  # bounded SECONDS CMD...: at most SECONDS and at most what is left
  local want=$1 cap
  shift
  cap=$(left)
  [ "$cap" -lt "$want" ] && want=$cap
  [ "$want" -lt 10 ] && { echo "llm_decode: no time left for: $*"; return 124; }
  timeout "$want" "$@"
}

if [ ! -x "$exe" ]; then
  if [ -n "${REPLAY_SKIP_TORCH:-}" ]; then
    echo "llm_decode: skipped (REPLAY_SKIP_TORCH is set)"
    exit 0
  fi
  echo "llm_decode: FAILED: $exe was not built (Torch, nlohmann_json and CLI11 are needed; see the CMake log)"
  exit 1
fi

weights_for() {  # weights_for PRESET: writes them once
  local dir=$weights/$1
  [ -f "$dir/weights.pt" ] || "$exe" write-weights --preset "$1" --seed 1 --out "$dir" >/dev/null || return 1
  echo "$dir"
}

if [ "$mode" = goodput ]; then
  small=$(weights_for small) || { echo "llm_decode: writing the small weights FAILED"; exit 1; }
  step "goodput under the SLO (small, fused kernels; within $(left) s)"
  # shellcheck disable=SC2086 # REPLAY_LLM_GOODPUT_ARGS is a list of options
  bounded "$(left)" "$exe" goodput --weights "$small" --kernels fused --budget-s "$(( $(left) - 60 ))" \
    ${REPLAY_LLM_GOODPUT_ARGS:-} --json "$OUT/llm_goodput_small.json" 2>&1 | tee "$OUT/llm_goodput_small.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || failed "goodput (rc=$rc)"
  if [ -f "$OUT/llm_goodput_small.json" ]; then
    python3 bench/llm_decode/summarize.py --name small --goodput "$OUT/llm_goodput_small.json" \
      --markdown "$OUT/llm_goodput.md" >/dev/null || failed "goodput summary"
  else
    failed "goodput wrote no $OUT/llm_goodput_small.json"
  fi
  echo "llm_decode step: $((SECONDS - start)) s, $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
  exit "$status"
fi

if [ "$mode" != measure ]; then
  small=$(weights_for small) || failed "writing the small weights"
  for k in 1 4; do
    step "generate, $k step(s) per launch: graphed engine against eager replays of its calls"
    bounded 120 "$exe" generate --weights "$small" --steps-per-launch "$k" --json "$OUT/llm_generate_k$k.json" \
      >"$OUT/llm_generate_k$k.txt" 2>&1 || failed "generate, $k step(s) per launch (rc=$?)"
    tail -3 "$OUT/llm_generate_k$k.txt"
    step "generate with the fused kernels, $k step(s) per launch"
    bounded 120 "$exe" generate --weights "$small" --kernels fused --steps-per-launch "$k" \
      --json "$OUT/llm_generate_fused_k$k.json" >"$OUT/llm_generate_fused_k$k.txt" 2>&1 ||
      failed "generate with the fused kernels, $k step(s) per launch (rc=$?)"
    tail -3 "$OUT/llm_generate_fused_k$k.txt"
    step "generate with the fused kernels and chunked prefill (16 prompt tokens per launch), $k step(s) per launch"
    bounded 120 "$exe" generate --weights "$small" --kernels fused --prefill-chunk 16 --steps-per-launch "$k" \
      --json "$OUT/llm_generate_chunked_k$k.json" >"$OUT/llm_generate_chunked_k$k.txt" 2>&1 ||
      failed "generate with chunked prefill, $k step(s) per launch (rc=$?)"
    tail -3 "$OUT/llm_generate_chunked_k$k.txt"
    step "generate with the fused kernels past 256 positions (300 new tokens: attention split over blocks), $k step(s) per launch"
    bounded 120 "$exe" generate --weights "$small" --kernels fused --new-tokens 300 --steps-per-launch "$k" \
      --json "$OUT/llm_generate_long_k$k.json" >"$OUT/llm_generate_long_k$k.txt" 2>&1 ||
      failed "generate past 256 positions, $k step(s) per launch (rc=$?)"
    tail -3 "$OUT/llm_generate_long_k$k.txt"
  done
  step "C++ against llama.py and Hugging Face (scripts/llm_decode_compare.py)"
  bounded 120 python3 scripts/llm_decode_compare.py "$small" "$OUT/llm_generate_k1.json" \
    --json "$OUT/llm_compare.json" >"$OUT/llm_compare.txt" 2>&1 || failed "the comparison with Python (rc=$?)"
  tail -1 "$OUT/llm_compare.txt"
fi

if [ "$mode" != check ]; then
  # The C++ bench and the peers decode the same lengths, or their ratios are
  # not judged (bench/llm_decode/summarize.py).
  decode_prompt=${REPLAY_LLM_PROMPT:-32}
  decode_new_tokens=${REPLAY_LLM_NEW_TOKENS:-128}
  for preset in $presets; do
    dir=$(weights_for "$preset") || { failed "writing the $preset weights"; continue; }
    step "C++ benchmark ($preset, prompt $decode_prompt, $decode_new_tokens new tokens)"
    bounded 200 "$exe" bench --weights "$dir" --prompt "$decode_prompt" --new-tokens "$decode_new_tokens" \
      --json "$OUT/llm_bench_$preset.json" >"$OUT/llm_bench_$preset.txt" 2>&1 ||
      failed "C++ benchmark $preset (rc=$?)"
    cat "$OUT/llm_bench_$preset.txt"
    if [ "$preset" = small ]; then
      # Two output-length mixes: uniform, and a chat-like exponential tail.
      mixes=${REPLAY_LLM_LOAD_MIXES:-uniform exponential}
      [ "$mixes" = none ] && mixes=""
      for lengths in $mixes; do
        load_kernels=${REPLAY_LLM_LOAD_KERNELS:-fused}
        # Chunked prefill needs the fused kernels.
        policies=continuous,grouped,chunked,static
        [ "$load_kernels" = fused ] || policies=continuous,grouped,static
        step "load test (small, $lengths output lengths, $load_kernels kernels): ${policies//,/, } batching"
        length_args=(--output-lengths uniform --new-tokens-min 16 --new-tokens-max 192)
        [ "$lengths" = exponential ] &&
          length_args=(--output-lengths exponential --new-tokens-min 8 --new-tokens-mean 128 --new-tokens-max 768)
        bounded 200 "$exe" load --weights "$dir" --kernels "$load_kernels" --rates "${REPLAY_LLM_LOAD_RATES:-50,100,200,400,800}" \
          --policies "$policies" --requests 128 --seconds 3 "${length_args[@]}" \
          --json "$OUT/llm_load_small_$lengths.json" >"$OUT/llm_load_small_$lengths.txt" 2>&1 ||
          failed "load test, $lengths (rc=$?)"
        cat "$OUT/llm_load_small_$lengths.txt"
        python3 bench/llm_decode/plot_load.py "$OUT/llm_load_small_$lengths.json" "$OUT/llm_load_small_$lengths.png" \
          --title "llm_decode, small preset, $lengths output lengths, $load_kernels kernels: ${policies//,/, } batching" ||
          failed "the load plot ($lengths)"
      done
    fi
    # The peers share what is left; torch.compile goes last.
    peers_budget=$(( $(left) - 20 ))
    [ "$preset" = small ] && [ "$presets" != small ] && peers_budget=$(( peers_budget / 2 ))
    if [ "$peers_budget" -gt 30 ]; then
      step "Python peers ($preset, within ${peers_budget} s)"
      timeout $((peers_budget + 20)) python3 bench/llm_decode/decode_peers.py --weights "$dir" \
        --prompt-len "$decode_prompt" --new-tokens "$decode_new_tokens" \
        --peers "${REPLAY_LLM_PEERS:-eager,cuda_graphs,hf_eager,hf_static,compile,compile_max_autotune}" --repeats 3 \
        --budget-s "$peers_budget" --compile-budget-s "$((peers_budget / 3))" --json "$OUT/llm_peers_$preset.json" \
        >/dev/null 2>"$OUT/llm_peers_$preset.err"
      rc=$?
      [ "$rc" -le 1 ] || failed "Python peers $preset (rc=$rc)"  # 1: something not measured (in the JSON)
      grep -E "^decode_peers: " "$OUT/llm_peers_$preset.err" | tail -5
    else
      echo "llm_decode: no time left for the Python peers ($preset)"
    fi
    load_args=()
    for f in "$OUT"/llm_load_"$preset"_*.json; do [ -f "$f" ] && load_args+=(--load "$f"); done
    python3 bench/llm_decode/summarize.py --name "$preset" --cpp "$OUT/llm_bench_$preset.json" \
      --peers "$OUT/llm_peers_$preset.json" "${load_args[@]}" --markdown "$OUT/llm_results_$preset.md" ||
      failed "summary $preset"
  done
  cat "$OUT"/llm_results_*.md >"$OUT/llm_results.md" 2>/dev/null
fi
echo "llm_decode step: $((SECONDS - start)) s, $([ "$status" -eq 0 ] && echo ok || echo FAILED)"
exit "$status"
