-- wrk script for examples/inference_server: POSTs one raw float32 row per
-- request, derived from a request id (X-Request-Id), the same rows the server
-- derives with --verify K (model.hpp's input_value; K = REPLAY_LOAD_KEYS).
-- The server compares each answer bitwise with the reference it computed
-- alone and eagerly for that id, and says so in X-Replay-Check; this script
-- counts every answer that is not 200, not "ok", of the wrong size, or for
-- another id (X-Request-Id echoed), and prints one summary line:
--   REPLAY_LOAD responses=... bad_status=... bad_check=... ... rps=... p50_us=... p99_us=...
-- Environment: REPLAY_LOAD_WIDTH (input row, default 256), REPLAY_LOAD_OUTPUTS
-- (output row, default 16), REPLAY_LOAD_KEYS (default 512).
local ffi = require("ffi")

local width = tonumber(os.getenv("REPLAY_LOAD_WIDTH") or "256")
local outputs = tonumber(os.getenv("REPLAY_LOAD_OUTPUTS") or "16")
local keys = tonumber(os.getenv("REPLAY_LOAD_KEYS") or "512")

local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

local function input_value(key, j)
  local v = (key * 7919 + j * 104729 + (key * j) % 1013) % 10007
  return v / 10007.0 - 0.5
end

local bodies = {}
local counter = 0

function init(args)
  responses, bad_status, bad_check, bad_size, bad_id = 0, 0, 0, 0, 0
  local row = ffi.new("float[?]", width)
  for key = 0, keys - 1 do
    for j = 0, width - 1 do
      row[j] = input_value(key, j)
    end
    bodies[key] = ffi.string(row, width * 4)
  end
  first_id = tid * 100000000  -- ids stay below 2^31
  last_id = first_id
end

function request()
  local id = first_id + counter
  counter = counter + 1
  last_id = id
  return wrk.format("POST", "/v1/infer",
                    {["Content-Type"] = "application/octet-stream", ["X-Request-Id"] = string.format("%d", id)},
                    bodies[id % keys])
end

function response(status, headers, body)
  responses = responses + 1
  if status ~= 200 then
    bad_status = bad_status + 1
    return
  end
  if headers["X-Replay-Check"] ~= "ok" then
    bad_check = bad_check + 1
  end
  if #body ~= outputs * 4 then
    bad_size = bad_size + 1
  end
  -- The echoed id must be one this thread sent (its own range, not beyond the last one).
  local id = tonumber(headers["X-Request-Id"] or "-1")
  if id == nil or id < first_id or id > last_id then
    bad_id = bad_id + 1
  end
end

function done(summary, latency, requests)
  local r, s, c, z, i = 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    r = r + t:get("responses")
    s = s + t:get("bad_status")
    c = c + t:get("bad_check")
    z = z + t:get("bad_size")
    i = i + t:get("bad_id")
  end
  local e = summary.errors
  io.write(string.format(
    "REPLAY_LOAD responses=%d bad_status=%d bad_check=%d bad_size=%d bad_id=%d requests=%d " ..
    "connect_errors=%d read_errors=%d write_errors=%d timeouts=%d status_errors=%d " ..
    "rps=%.1f p50_us=%d p99_us=%d\n",
    r, s, c, z, i, summary.requests, e.connect, e.read, e.write, e.timeout, e.status,
    summary.requests / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99)))
end
