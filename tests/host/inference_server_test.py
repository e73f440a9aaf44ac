#!/usr/bin/env python3
"""The inference server with the CPU stand-in model, over HTTP.

Starts examples/inference_server on 127.0.0.1 on a free port (--port 0) and
checks: correct answers (raw float32 and JSON, against the server's own
single-row reference through --verify, and raw == JSON), many concurrent
clients with nothing lost or mixed up, 400 for a bad body size and malformed
JSON, 400 for a request above the largest batch, 503 for a full queue, 504 for
a missed deadline, /v1/stats, /metrics and /healthz, and a clean SIGTERM
(exit 0, requests in flight answered).

usage: inference_server_test.py path/to/inference_server
"""
import http.client
import json
import re
import signal
import struct
import subprocess
import sys
import threading
import time

SERVER = sys.argv[1]
WIDTH = 64
OUTPUTS = 16
VERIFY = 64
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what, flush=True)


def input_value(key, j):
    # Same as inference_server::input_value (model.hpp).
    v = (key * 7919 + j * 104729 + (key * j) % 1013) % 10007
    return struct.unpack("<f", struct.pack("<f", v / 10007.0 - 0.5))[0]


def row_for(key):
    return [input_value(key, j) for j in range(WIDTH)]


def start(*extra):
    proc = subprocess.Popen([SERVER, "--model", "cpu", "--port", "0", "--verify", str(VERIFY), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        print("server:", line.rstrip(), flush=True)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [print("server:", l.rstrip(), flush=True) for l in proc.stdout],
                             daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    raise SystemExit("the server did not start")


def request(port, method, path, body=None, headers=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    result = (resp.status, dict(resp.getheaders()), data)
    conn.close()
    return result


def infer_raw(port, rows, headers=None):
    body = struct.pack("<%df" % len(rows), *rows)
    h = {"Content-Type": "application/octet-stream"}
    h.update(headers or {})
    return request(port, "POST", "/v1/infer", body, h)


def stop(proc, what):
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = None
    check(code == 0, f"{what}: SIGTERM exits 0 (got {code})")


# ---- correct answers, errors, stats ------------------------------------------
proc, port = start("--max-queue-delay-us", "500")
try:
    status, _, body = request(port, "GET", "/healthz")
    check(status == 200 and body == b"ok\n", "/healthz answers ok")

    status, headers, body = infer_raw(port, row_for(5), {"X-Request-Id": "5"})
    check(status == 200, f"raw infer answers 200 (got {status} {body[:200]!r})")
    check(len(body) == OUTPUTS * 4, "raw answer is one row of float32 outputs")
    check(headers.get("X-Replay-Check") == "ok", "raw answer equals the reference for its id")
    check(headers.get("X-Request-Id") == "5", "the request id is echoed")
    raw = struct.unpack("<%df" % OUTPUTS, body)

    status, headers, body = request(port, "POST", "/v1/infer",
                                    json.dumps({"id": 5, "inputs": [row_for(5)]}),
                                    {"Content-Type": "application/json"})
    check(status == 200, f"JSON infer answers 200 (got {status} {body[:200]!r})")
    outputs = json.loads(body)["outputs"]
    check(len(outputs) == 1 and len(outputs[0]) == OUTPUTS, "JSON answer is one row of outputs")
    check(all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(outputs[0], raw)), "JSON answer equals the raw one")
    check(headers.get("X-Replay-Check") == "ok", "JSON answer equals the reference for its id")

    # Two rows in one request: each row's answer is that row's answer alone.
    status, _, body = infer_raw(port, row_for(7) + row_for(5))
    check(status == 200 and len(body) == 2 * OUTPUTS * 4, "a two-row request gets two rows")
    if status == 200:
        second = struct.unpack("<%df" % OUTPUTS, body[OUTPUTS * 4:])
        check(second == raw, "the second row's answer equals that row alone")

    # Many clients at once: every answer checked against its id's reference.
    results = []
    lock = threading.Lock()

    def client(t):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in range(40):
            rid = t * 1000 + i
            conn.request("POST", "/v1/infer", body=struct.pack("<%df" % WIDTH, *row_for(rid % VERIFY)),
                         headers={"Content-Type": "application/octet-stream", "X-Request-Id": str(rid)})
            resp = conn.getresponse()
            resp.read()
            with lock:
                results.append((rid, resp.status, resp.getheader("X-Request-Id"), resp.getheader("X-Replay-Check")))
        conn.close()

    threads = [threading.Thread(target=client, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(len(results) == 16 * 40, "every concurrent request was answered")
    check(all(s == 200 and h == str(rid) and c == "ok" for rid, s, h, c in results),
          "every concurrent answer is 200, for its own id, and equals its reference")

    status, _, body = infer_raw(port, row_for(1)[:-1])
    check(status == 400 and b"bytes" in body, f"a body of a partial row gets 400 with a message ({status} {body!r})")
    status, _, body = request(port, "POST", "/v1/infer", b"", {"Content-Type": "application/octet-stream"})
    check(status == 400, "an empty body gets 400")
    status, _, body = request(port, "POST", "/v1/infer", '{"inputs": [1, 2,', {"Content-Type": "application/json"})
    check(status == 400 and b"malformed JSON" in body, f"malformed JSON gets 400 with a message ({body!r})")
    status, _, body = request(port, "POST", "/v1/infer", '{"inputs": [[1, 2]]}', {"Content-Type": "application/json"})
    check(status == 400 and b"64 numbers" in body, f"a JSON row of the wrong size gets 400 ({body!r})")
    status, _, body = infer_raw(port, row_for(1) * 65)
    check(status == 400 and b"65 rows" in body and b"64 rows" in body,
          f"a request above the largest batch gets 400 naming both sizes ({body!r})")

    status, _, body = request(port, "GET", "/v1/stats")
    stats = json.loads(body)
    check(status == 200, "/v1/stats answers 200")
    check(stats["verify"]["mismatches"] == 0 and stats["verify"]["checked"] >= 16 * 40 + 2,
          f"/v1/stats counts the checked answers, no mismatch ({stats['verify']})")
    check(stats["batcher"]["completed"] == 16 * 40 + 3, f"the Batcher completed every request ({stats['batcher']})")
    check(stats["batcher"]["batches"] < stats["batcher"]["completed"], "concurrent requests were batched")
    check(stats["http"].get("400") == 5, f"400s are counted ({stats['http']})")

    status, _, body = request(port, "GET", "/metrics")
    text = body.decode()
    check(status == 200, "/metrics answers 200")
    check(re.search(r'^replay_http_requests_total\{code="200"\} \d+$', text, re.M) is not None,
          "/metrics counts requests by status code")
    for family in ("replay_batch_rows", "replay_queue_delay_seconds", "replay_request_latency_seconds"):
        check(f"# TYPE {family} histogram" in text and f'{family}_bucket{{le="+Inf"}}' in text,
              f"/metrics has the {family} histogram")
finally:
    stop(proc, "first server")

# ---- 503 (queue full), 504 (deadline), drain on SIGTERM -----------------------
proc, port = start("--batching", "off", "--cpu-delay-us", "1000000", "--queue-capacity", "1")
try:
    answers = {}

    def slow(name, headers=None):
        answers[name] = infer_raw(port, row_for(1), headers)

    running = threading.Thread(target=slow, args=("running",))
    running.start()
    time.sleep(0.3)   # the first request is running (1 s)
    queued = threading.Thread(target=slow, args=("queued", {"X-Timeout-Ms": "100"}))
    queued.start()    # waits in the queue (capacity 1), and its deadline passes
    time.sleep(0.2)   # the queued one expires, but only the worker removes it, after the running one
    status, _, body = infer_raw(port, row_for(2))
    check(status == 503 and b"queue is full" in body, f"a full queue gets 503 ({status} {body!r})")
    running.join()
    queued.join()
    check(answers["running"][0] == 200, "the running request completes")
    check(answers["queued"][0] == 504 and b"deadline" in answers["queued"][2],
          f"a request whose deadline passed in the queue gets 504 ({answers['queued'][0]} {answers['queued'][2]!r})")

    # SIGTERM while a request is in flight: it is answered, then the server exits 0.
    inflight = threading.Thread(target=slow, args=("inflight",))
    inflight.start()
    time.sleep(0.3)
    stop(proc, "second server")
    inflight.join()
    check(answers["inflight"][0] == 200, f"the request in flight at SIGTERM is answered ({answers['inflight'][0]})")
finally:
    if proc.poll() is None:
        proc.kill()

if failures:
    print(f"{len(failures)} check(s) FAILED")
    sys.exit(1)
print("inference_server test: all checks passed")
