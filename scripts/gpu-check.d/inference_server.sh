#!/usr/bin/env bash
# gpu-check step: examples/inference_server under wrk, on the GPU.
#
# Three servers, one after the other, each serving the 20-layer CUDA MLP
# (--layers 20 --width 256, 78 kernels per batch):
#   eager      --eager --batching off    the model's kernels launched one by one, one request per run
#   replay     --batching off            one CUDA-graph replay (ShapeRouter bucket) per request
#   batched    --batching on             replay::Batcher gathers requests into bucketed replays
# each measured with wrk at 1, 8, 32 and 128 connections (requests/s, p50,
# p99). Every answer is checked: the server compares it bitwise with the
# reference it computed alone and eagerly for that request id (--verify), and
# the wrk script (examples/inference_server/load.lua) counts every answer that
# is not 200 + "ok" or not for its own id; the server's count of answers must
# match wrk's (up to the requests in flight when wrk stops). Then the goals:
#   batched >= 3.5x replay requests/s at 32 and 128 connections, p99 no worse;
#   replay >= 2x eager requests/s at 8, 32 and 128 connections.
# Where inference_server_torch was built (libtorch), also ResNet-50 fp16
# through a GraphedCallable at 32 connections, unbatched and batched (checked
# answers, within fp16 tolerance; no goals). Prints a table, writes inference_server.{txt,md,png} and the servers' stats
# JSON to $OUT_DIR (else $REPLAY_CHECK_OUT, else build/gpu-check).
#
# Environment:
#   WRK=/path/to/wrk                wrk binary (default: wrk on PATH)
#   WRK_LD_LIBRARY_PATH=dir[:dir]   library path for wrk alone (e.g. an extracted libluajit-5.1-2)
#   SERVER_LD_LIBRARY_PATH=dir      library path for the server alone (a split libcpp-httplib and its deps)
#   REPLAY_BUILD_DIR                build tree (default build/gpu)
#   REPLAY_LOAD_SECONDS             seconds per MLP measurement (default 7); REPLAY_LOAD_RESNET_SECONDS (5)
#   REPLAY_LOAD_DELAY_US            the batcher's --max-queue-delay-us (default 200)
#   REPLAY_LOAD_MODEL, REPLAY_LOAD_LAYERS, REPLAY_LOAD_WIDTH   the model (default mlp, 20, 256)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT_DIR:-${REPLAY_CHECK_OUT:-build/gpu-check}}
mkdir -p "$out"
build=${REPLAY_BUILD_DIR:-build/gpu}
server=$build/examples/inference_server/inference_server
wrk=${WRK:-wrk}
seconds=${REPLAY_LOAD_SECONDS:-7}
delay_us=${REPLAY_LOAD_DELAY_US:-200}
model=${REPLAY_LOAD_MODEL:-mlp}   # cpu: the CPU stand-in, to try the script without a GPU
layers=${REPLAY_LOAD_LAYERS:-20}
width=${REPLAY_LOAD_WIDTH:-256}
outputs=16
conns=(1 8 32 128)
lua=examples/inference_server/load.lua
results=$out/inference_server.tsv
log() { printf '[inference_server %s] %s\n' "$(date +%T)" "$*"; }

if [ ! -x "$server" ]; then
  echo "inference_server: FAILED: $server was not built (cpp-httplib, nlohmann_json or CLI11 not found when" \
       "configuring? see the CMake log and docs/batching.md)"
  exit 1
fi
# with_library_path DIRS COMMAND...: COMMAND with LD_LIBRARY_PATH=DIRS when DIRS is not empty.
with_library_path() {
  local dirs=$1; shift
  if [ -n "$dirs" ]; then LD_LIBRARY_PATH="$dirs" "$@"; else "$@"; fi
}
run_wrk() { with_library_path "${WRK_LD_LIBRARY_PATH:-${LD_LIBRARY_PATH:-}}" "$wrk" "$@"; }
wrk_version=$(run_wrk --version 2>&1 || true)  # wrk --version exits 1
if ! grep -q '^wrk' <<<"$wrk_version"; then
  echo "inference_server: FAILED: cannot run wrk ($wrk); set WRK and WRK_LD_LIBRARY_PATH"
  head -3 <<<"$wrk_version"
  exit 1
fi

status=0
fail() { echo "inference_server: FAILED: $*"; status=1; }
printf 'mode\tconnections\trps\tp50_ms\tp99_ms\n' >"$results"

# measure MODE CONNECTIONS SECONDS PORT: one wrk run; appends to $results
# unless MODE is "warmup"; sets $answers to the number of answers wrk counted.
answers=0
measure() {
  local mode=$1 c=$2 d=$3 port=$4 t line
  t=$(( c < 4 ? c : 4 ))
  answers=0
  line=$(REPLAY_LOAD_WIDTH=$row REPLAY_LOAD_OUTPUTS=$out_row REPLAY_LOAD_KEYS=$keys \
         run_wrk -t"$t" -c"$c" -d"${d}s" --timeout 10s -s "$lua" "http://127.0.0.1:$port" 2>&1 |
         grep '^REPLAY_LOAD' | tail -1)
  if [ -z "$line" ]; then
    fail "$mode at $c connections: wrk printed no summary"
    return
  fi
  echo "$mode c=$c: $line" >>"$out/inference_server_wrk.log"
  get() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$line"; }
  local bad=$(( $(get bad_status) + $(get bad_check) + $(get bad_size) + $(get bad_id) ))
  local errors=$(( $(get connect_errors) + $(get read_errors) + $(get write_errors) + $(get timeouts) + $(get status_errors) ))
  [ "$bad" -eq 0 ] || fail "$mode at $c connections: $bad wrong answers ($line)"
  [ "$errors" -eq 0 ] || fail "$mode at $c connections: $errors socket errors or timeouts ($line)"
  if [ "$mode" != warmup ]; then
    awk -v m="$mode" -v c="$c" -v r="$(get rps)" -v p50="$(get p50_us)" -v p99="$(get p99_us)" \
        'BEGIN { printf "%s\t%d\t%.1f\t%.3f\t%.3f\n", m, c, r, p50 / 1000, p99 / 1000 }' >>"$results"
  fi
  answers=$(get responses)
}

serve() {  # serve MODE FLAGS...: start, warm up, measure at every concurrency, check, stop
  local mode=$1; shift
  local slog=$out/inference_server_$mode.log port pid answered=0 inflight=0
  : >"$slog"  # before the server starts: a port left in it from an earlier run must not be read
  local dirs=${SERVER_LD_LIBRARY_PATH:-${LD_LIBRARY_PATH:-}} launch=()
  [ -n "$dirs" ] && launch=(env LD_LIBRARY_PATH="$dirs")  # env execs the server: $! is the server
  "${launch[@]}" "$bin" "${model_args[@]}" --port 0 --verify $keys --threads 160 "$@" >"$slog" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do  # up to 2 minutes: CUDA and libtorch start, graphs are captured ("listening on": ready)
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$slog")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "${port:-}" ]; then
    fail "$mode: the server did not start:"; tail -5 "$slog"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    return
  fi
  log "$mode: $(sed -n 's/^inference_server: model: //p' "$slog" | head -1) on port $port"
  measure warmup 32 2 "$port"; answered=$((answered + answers)); inflight=$((inflight + 32))
  for c in "${serve_conns[@]}"; do
    measure "$mode" "$c" "$seconds" "$port"; answered=$((answered + answers)); inflight=$((inflight + c))
  done
  sleep 0.5  # the requests in flight when wrk stopped are answered
  curl_stats "$port" >"$out/inference_server_${mode}_stats.json"
  python3 - "$out/inference_server_${mode}_stats.json" "$answered" "$inflight" "$mode" <<'PY' || status=1
import json, sys
path, answered, inflight, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = json.load(open(path))
v, b, ok = s["verify"], s["batcher"], s["http"].get("200", 0)
problems = []
if v["mismatches"] or v["unverifiable"]:
    problems.append(f"{v['mismatches']} answers differ from the reference, {v['unverifiable']} unverifiable")
if v["checked"] != ok:
    problems.append(f"{v['checked']} answers checked but {ok} answered 200")
if not (0 <= ok - answered <= inflight):
    problems.append(f"the server answered {ok} requests, wrk counted {answered} (at most {inflight} in flight at the ends)")
if b["completed"] != b["enqueued"] or b["failed"] or b["timed_out"] or b["refused"]:
    problems.append(f"batcher: {b}")
r = s.get("router")
if r is not None and r.get("eager_fallbacks", 0):
    problems.append(f"router: {r['eager_fallbacks']} eager fallbacks")
print(f"  {mode}: {ok} answers, all checked equal to the reference; mean batch {b['mean_batch_rows']:.2f} rows, "
      f"padding waste {b['padding_waste']:.3f}, queue delay p50 {b['queue_delay_p50_us']:.0f} us p99 "
      f"{b['queue_delay_p99_us']:.0f} us" if not problems else f"  {mode}: FAILED: " + "; ".join(problems))
sys.exit(1 if problems else 0)
PY
  kill -TERM "$pid"
  local code=0
  wait "$pid" || code=$?
  [ "$code" -eq 0 ] || fail "$mode: the server exited $code after SIGTERM (expected 0)"
  tail -1 "$slog" | sed 's/^/  /'
}

curl_stats() {
  python3 -c 'import http.client,sys; c=http.client.HTTPConnection("127.0.0.1",int(sys.argv[1]),timeout=10); c.request("GET","/v1/stats"); print(c.getresponse().read().decode())' "$1"
}

: >"$out/inference_server_wrk.log"
log "wrk: $(head -1 <<<"$wrk_version"); $seconds s per point"
bin=$server row=$width out_row=$outputs keys=512 serve_conns=("${conns[@]}")
model_args=(--model "$model" --layers "$layers" --width "$width" --outputs "$outputs")
serve eager --eager --batching off
serve replay --batching off
serve batched --batching on --max-queue-delay-us "$delay_us"

# ResNet-50 fp16 through the libtorch adapter, where it was built: checked
# answers at 32 connections, without and with batching (no goals).
torch_server=$build/examples/inference_server/inference_server_torch
if [ -x "$torch_server" ] && [ -z "${REPLAY_SKIP_TORCH:-}" ]; then
  bin=$torch_server row=$((3 * 224 * 224)) out_row=1000 keys=8 serve_conns=(32)
  model_args=(--model resnet50 --max-batch 32)
  seconds=${REPLAY_LOAD_RESNET_SECONDS:-5}
  serve resnet_replay --batching off
  serve resnet_batched --batching on --max-queue-delay-us "$delay_us"
else
  log "ResNet-50: inference_server_torch not built (no libtorch), skipped"
fi

python3 - "$results" "$out" "$delay_us" <<'PY' || status=1
import sys
results, out, delay = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [l.rstrip("\n").split("\t") for l in open(results)][1:]
data = {(m, int(c)): (float(r), float(p50), float(p99)) for m, c, r, p50, p99 in rows}
conns = sorted({c for _, c in data})
names = {"eager": "eager, unbatched", "replay": "replay, unbatched", "batched": f"replay + Batcher ({delay} us)",
         "resnet_replay": "ResNet-50 fp16, GraphedCallable, unbatched",
         "resnet_batched": f"ResNet-50 fp16, GraphedCallable + Batcher ({delay} us)"}
lines = ["| server | connections | requests/s | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|"]
for m in names:
    for c in conns:
        if (m, c) in data:
            r, p50, p99 = data[(m, c)]
            lines.append(f"| {names[m]} | {c} | {r:,.0f} | {p50:.2f} | {p99:.2f} |")
goals, ok = [], True
for c in sorted({c for m, c in data if m in ("eager", "replay", "batched")}):
    if ("replay", c) in data and ("batched", c) in data and ("eager", c) in data:
        rb, re_, rr = data[("batched", c)][0], data[("eager", c)][0], data[("replay", c)][0]
        pb, pr = data[("batched", c)][2], data[("replay", c)][2]
        line = f"{c:>4} connections: batched/replay {rb / rr:5.2f}x (p99 {pb:.2f} vs {pr:.2f} ms), replay/eager {rr / re_:5.2f}x"
        if c >= 32:
            g = rb >= 3.5 * rr and pb <= pr
            ok &= g
            line += f"  [batched >= 3.5x, p99 no worse: {'met' if g else 'MISSED'}]"
        if c >= 8:
            g = rr >= 2.0 * re_
            ok &= g
            line += f"  [replay >= 2x eager: {'met' if g else 'MISSED'}]"
        goals.append(line)
    else:
        ok = False
        goals.append(f"{c:>4} connections: a measurement is missing")
text = "\n".join(lines) + "\n\n" + "\n".join(goals) + "\n"
print(text)
open(f"{out}/inference_server.md", "w").write(text)
open(f"{out}/inference_server.txt", "w").write(text)
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, style in (("eager", "s-"), ("replay", "o-"), ("batched", "^-"), ("resnet_replay", "x"), ("resnet_batched", "D")):
        pts = [(data[(m, c)][0], data[(m, c)][2], c) for c in conns if (m, c) in data]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=names[m])
            for x, y, c in pts:
                ax.annotate(str(c), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("requests/s")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title("inference_server: throughput vs p99 latency (labels: connections)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/inference_server.png", dpi=120)
    print(f"plot: {out}/inference_server.png")
except Exception as e:  # the measurement stands without the plot
    print(f"no plot: {e}")
sys.exit(0 if ok else 1)
PY
[ $status -eq 0 ] && echo "inference_server: PASSED" || echo "inference_server: FAILED"
exit $status
