#!/usr/bin/env python3
"""The inference server with the CPU stand-in model, over real sockets on loopback.

Starts examples/inference_server (--model cpu, --port 0) and drives it with
Python's http.client and raw sockets. One group of checks per run (ctest
registers one entry per group):

  answers    correct answers (raw float32 and JSON, against the server's own
             single-row reference through --verify), many concurrent clients,
             400/503/504, /v1/stats, /metrics, /healthz, /readyz, SIGTERM with
             a request in flight
  input      every malformed input gets 400 (or 405/404/411/501) with a message
             naming the fault, and every answer is counted
  limits     bodies refused before they are read (413), peak memory under 8
             concurrent 64 MiB bodies, an exception while answering (a 500
             with its message, counted), 504 and a released HTTP thread when
             a batch outlives its deadline, /readyz while loading and after
             repeated executor failures
  slow       clients that send their body a byte at a time, more of them than
             threads: /healthz answers within a second, a request beyond
             capacity gets 503 at once, the slow bodies get 408 at the read
             timeout, SIGTERM still drains within its bound; a burst far
             beyond capacity gets 200 or 503, none reset; a busy kept-alive
             client yields the only slot to a waiting connection
             (a head sent a byte at a time is not bounded as a whole: httplib's
             public API has no deadline for it; it holds a thread, but
             neither /healthz nor the drain)
  shutdown   SIGTERM with more connections than threads: every request sent
             is answered, with Connection: close; idle kept-alive connections
             close at once (with httplib before 0.18.1 the process ends with them); a drain past --drain-timeout-ms exits 1; a second
             SIGTERM exits at once
  debug      a debug build (assertions on) survives SIGTERM with an idle
             kept-alive connection, and SIGTERM while the model loads

usage: inference_server_test.py SERVER [--debug-server DEBUG_SERVER] [--group NAME ...]
"""
import argparse
import http.client
import json
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

WIDTH = 64
OUTPUTS = 16
VERIFY = 64
failures = []
sanitized = False  # --sanitized: the server is built under a sanitizer (cmake/ReplaySanitize.cmake)


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what, flush=True)
    return condition


def input_value(key, j):
    # Same as inference_server::input_value (model.hpp).
    v = (key * 7919 + j * 104729 + (key * j) % 1013) % 10007
    return struct.unpack("<f", struct.pack("<f", v / 10007.0 - 0.5))[0]


def row_for(key):
    return [input_value(key, j) for j in range(WIDTH)]


def raw_body(rows):
    return struct.pack("<%df" % len(rows), *rows)


class Server:
    """One server process; its output is echoed and kept."""

    def __init__(self, binary, *extra, wait_ready=True):
        self.proc = subprocess.Popen([binary, "--model", "cpu", "--port", "0", "--verify", str(VERIFY), *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.port = None
        self.stderr = []
        self.bound = threading.Event()
        self.ready = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if not self.bound.wait(30) or (wait_ready and not self.ready.wait(30)):
            self.proc.kill()
            raise SystemExit("the server did not start")

    def _read_stdout(self):
        for line in self.proc.stdout:
            print("server:", line.rstrip(), flush=True)
            m = re.search(r"accepting connections on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self.bound.set()
            if "listening on http://" in line:
                self.ready.set()

    def _read_stderr(self):
        for line in self.proc.stderr:
            print("server (stderr):", line.rstrip(), flush=True)
            self.stderr.append(line)

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """The exit code, or None if the server still runs after `timeout` seconds (then it is killed)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def stop(self, what, timeout=30):
        self.signal()
        code = self.wait(timeout)
        check(code == 0, f"{what}: SIGTERM exits 0 (got {code})")
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def memory_kib(self, field):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0


def request(port, method, path, body=None, headers=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    result = (resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    conn.close()
    return result


def infer_raw(port, rows, headers=None, timeout=30):
    h = {"Content-Type": "application/octet-stream"}
    h.update(headers or {})
    return request(port, "POST", "/v1/infer", raw_body(rows), h, timeout)


def infer_json(port, text, headers=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return request(port, "POST", "/v1/infer", text, h)


def connect(port, timeout=10):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_response(sock, timeout=10):
    """One HTTP response from a raw socket: (status, headers (lower-case names), body), or None when the
    connection ended before a whole status line and head arrived."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
    except (ConnectionResetError, socket.timeout):
        return None
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, value = line.split(":", 1)
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    length = int(headers.get("content-length", ["0"])[0])
    try:
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return status, {k: v[0] if len(v) == 1 else v for k, v in headers.items()}, rest[:length]


def answered(sock):
    """True when the server has sent something (or closed): peeks without waiting."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # (with a timeout, recv would first wait for data)
    try:
        sock.recv(1, socket.MSG_PEEK)
        return True
    except BlockingIOError:
        return False
    finally:
        sock.settimeout(timeout)


def raw_exchange(port, data, timeout=10):
    with connect(port, timeout) as s:
        s.sendall(data)
        return read_response(s, timeout)


def post_head(length_or_chunked, content_type="application/octet-stream", extra=""):
    framing = "Transfer-Encoding: chunked" if length_or_chunked == "chunked" else f"Content-Length: {length_or_chunked}"
    return (f"POST /v1/infer HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n{framing}\r\n{extra}\r\n"
            ).encode()


def message_of(body):
    try:
        return json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        return ""


def stats(port):
    return json.loads(request(port, "GET", "/v1/stats")[2])


# ---- answers --------------------------------------------------------------------
def group_answers(binary):
    server = Server(binary, "--max-queue-delay-us", "500")
    port = server.port
    try:
        status, _, body = request(port, "GET", "/healthz")
        check(status == 200 and body == b"ok\n", "/healthz answers ok")
        status, _, body = request(port, "GET", "/readyz")
        check(status == 200 and body == b"ready\n", f"/readyz answers ready ({status} {body!r})")

        status, headers, body = infer_raw(port, row_for(5), {"X-Request-Id": "5"})
        check(status == 200, f"raw infer answers 200 (got {status} {body[:200]!r})")
        check(len(body) == OUTPUTS * 4, "raw answer is one row of float32 outputs")
        check(headers.get("x-replay-check") == "ok", "raw answer equals the reference for its id")
        check(headers.get("x-request-id") == "5", "the request id is echoed")
        raw = struct.unpack("<%df" % OUTPUTS, body)

        status, headers, body = infer_json(port, json.dumps({"id": 5, "inputs": [row_for(5)]}))
        check(status == 200, f"JSON infer answers 200 (got {status} {body[:200]!r})")
        outputs = json.loads(body)["outputs"]
        check(len(outputs) == 1 and len(outputs[0]) == OUTPUTS, "JSON answer is one row of outputs")
        check(all(struct.unpack("<f", struct.pack("<f", a))[0] == b for a, b in zip(outputs[0], raw)),
              "JSON answer equals the raw one (float32 written exactly)")
        check(headers.get("x-replay-check") == "ok", "JSON answer equals the reference for its id")

        largest = 2**64 - 1
        status, headers, _ = infer_json(port, json.dumps({"inputs": row_for(largest % VERIFY)}),
                                        {"X-Request-Id": str(largest)})
        check(status == 200 and headers.get("x-request-id") == str(largest) and headers.get("x-replay-check") == "ok",
              "a flat JSON row and the largest X-Request-Id are taken, the id echoed exactly")

        # Two rows in one request: each row's answer is that row's answer alone.
        status, _, body = infer_raw(port, row_for(7) + row_for(5))
        check(status == 200 and len(body) == 2 * OUTPUTS * 4, "a two-row request gets two rows")
        if status == 200:
            check(struct.unpack("<%df" % OUTPUTS, body[OUTPUTS * 4:]) == raw, "the second row's answer equals that row alone")

        # Many clients at once, each on one kept-alive connection: every answer checked against its id's reference.
        results = []
        lock = threading.Lock()

        def client(t):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for i in range(40):
                rid = t * 1000 + i
                conn.request("POST", "/v1/infer", body=raw_body(row_for(rid % VERIFY)),
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

        status, _, body = infer_raw(port, row_for(1) * 65)
        check(status == 400 and b"65 rows" in body and b"64 rows" in body,
              f"a request above the largest batch gets 400 naming both sizes ({body!r})")

        s = stats(port)
        check(s["ready"] is True and s["verify"]["mismatches"] == 0 and s["verify"]["checked"] >= 16 * 40 + 3,
              f"/v1/stats counts the checked answers, no mismatch ({s['verify']})")
        check(s["batcher"]["completed"] == 16 * 40 + 4, f"the Batcher completed every request ({s['batcher']})")
        check(s["batcher"]["batches"] < s["batcher"]["completed"], "concurrent requests were batched")
        check(s["http"].get("200") == 16 * 40 + 4 and s["http"].get("400") == 1, f"answers are counted ({s['http']})")

        status, _, body = request(port, "GET", "/metrics")
        text = body.decode()
        check(status == 200, "/metrics answers 200")
        check(re.search(r'^replay_http_requests_total\{endpoint="/v1/infer",code="200"\} \d+$', text, re.M) is not None,
              "/metrics counts answers by endpoint and status code")
        check(re.search(r"^replay_ready 1$", text, re.M) is not None, "/metrics says the server is ready")
        for family in ("replay_batch_rows", "replay_queue_delay_seconds", "replay_request_latency_seconds"):
            check(f"# TYPE {family} histogram" in text and f'{family}_bucket{{le="+Inf"}}' in text,
                  f"/metrics has the {family} histogram")
    finally:
        if server.proc.poll() is None:
            server.stop("answers server")
        server.kill()

    # 503 (queue full), 504 (deadline in the queue), drain on SIGTERM.
    server = Server(binary, "--batching", "off", "--cpu-delay-us", "1000000", "--queue-capacity", "1")
    port = server.port
    try:
        answers = {}

        def slow(name, headers=None):
            answers[name] = infer_raw(port, row_for(1), headers)

        running = threading.Thread(target=slow, args=("running",))
        running.start()
        time.sleep(0.3)   # the first request is running (1 s)
        queued = threading.Thread(target=slow, args=("queued", {"X-Timeout-Ms": "100"}))
        queued.start()    # waits in the queue (capacity 1), and its deadline passes
        time.sleep(0.2)
        status, headers, body = infer_raw(port, row_for(2))
        check(status == 503 and b"queue is full" in body and headers.get("retry-after") == "1",
              f"a full queue gets 503 with Retry-After ({status} {headers} {body!r})")
        running.join()
        queued.join()
        check(answers["running"][0] == 200, "the running request completes")
        check(answers["queued"][0] == 504 and b"deadline" in answers["queued"][2],
              f"a request whose deadline passed gets 504 ({answers['queued'][0]} {answers['queued'][2]!r})")

        # SIGTERM while a request is in flight: it is answered, then the server exits 0.
        inflight = threading.Thread(target=slow, args=("inflight",))
        inflight.start()
        time.sleep(0.3)
        server.stop("queue server")
        inflight.join()
        check(answers["inflight"][0] == 200, f"the request in flight at SIGTERM is answered ({answers['inflight'][0]})")
    finally:
        server.kill()


# ---- input ------------------------------------------------------------------------
def group_input(binary):
    server = Server(binary)
    port = server.port
    row = json.dumps(row_for(3))
    row63 = json.dumps(row_for(3)[:63])
    row65 = json.dumps(row_for(3) + [0.5])
    # (what, body, headers, expected status, words the message must hold)
    cases = [
        ("duplicate \"inputs\"", f'{{"inputs": [{row}], "inputs": [{row}]}}', {}, 400, ['"inputs"', "twice"]),
        ("duplicate \"id\"", f'{{"id": 1, "inputs": [{row}], "id": 2}}', {}, 400, ['"id"', "twice"]),
        ("\"id\": 1e300", f'{{"id": 1e300, "inputs": [{row}]}}', {}, 400, ['"id" must be an integer', "1e300"]),
        ("\"id\": -1", f'{{"id": -1, "inputs": [{row}]}}', {}, 400, ['"id" must be an integer', "-1"]),
        ("\"id\": 1.5", f'{{"id": 1.5, "inputs": [{row}]}}', {}, 400, ['"id" must be an integer']),
        ("\"id\": 2^64", f'{{"id": 18446744073709551616, "inputs": [{row}]}}', {}, 400, ['"id" must be an integer']),
        ("\"id\" a string", f'{{"id": "7", "inputs": [{row}]}}', {}, 400, ['"id" must be an integer', "string"]),
        ("rows of 65 and 63", f'{{"inputs": [{row65}, {row63}]}}', {}, 400, ["inputs[0]", "65", "each row holds 64"]),
        ("rows of 64 and 63", f'{{"inputs": [{row}, {row63}]}}', {}, 400, ["inputs[1]", "63", "each row holds 64"]),
        ("an unknown key", f'{{"inputs": [{row}], "input": 1}}', {}, 400, ["unknown key", '"input"']),
        ("no \"inputs\"", '{"id": 1}', {}, 400, ['no "inputs"']),
        ("empty \"inputs\"", '{"inputs": []}', {}, 400, ['"inputs" is empty']),
        ("a NaN literal", '{"inputs": [[NaN]]}', {}, 400, ["malformed JSON"]),
        ("truncated JSON", '{"inputs": [1, 2,', {}, 400, ["malformed JSON"]),
        ("text after the object", f'{{"inputs": [{row}]}} x', {}, 400, ["malformed JSON"]),
        ("a number beyond float32", '{"inputs": [1e39' + ", 0" * 63 + "]}", {}, 400, ["inputs[0]", "float32 range"]),
        ("a number beyond double", '{"inputs": [1e400' + ", 0" * 63 + "]}", {}, 400, ["1e400"]),
        ("a list at the top", f"[{row}]", {}, 400, ["must be a JSON object"]),
        ("a flat list of 100 numbers", '{"inputs": [' + ", ".join(["0.5"] * 100) + "]}", {}, 400, ["100 numbers", "whole rows of 64"]),
        ("rows after numbers", f'{{"inputs": [0.5, {row}]}}', {}, 400, ["inputs[1]", "numbers"]),
        ("numbers after rows", f'{{"inputs": [{row}, 0.5]}}', {}, 400, ["inputs[1]", "rows"]),
        ("a row in a row", '{"inputs": [[[0.5]]]}', {}, 400, ["inputs[0][0]", "numbers only"]),
        ("a string in a row", '{"inputs": [["0.5"]]}', {}, 400, ["inputs[0][0]", "string"]),
        ("X-Request-Id and \"id\" disagree", f'{{"id": 6, "inputs": [{row}]}}', {"X-Request-Id": "5"}, 400, ["says 5", "says 6"]),
    ]
    header_cases = [
        ("X-Timeout-Ms: 5abc", {"X-Timeout-Ms": "5abc"}, ["X-Timeout-Ms must be an integer from 1 to 3600000", "5abc"]),
        ("X-Timeout-Ms: 0", {"X-Timeout-Ms": "0"}, ["X-Timeout-Ms must be an integer"]),
        ("X-Timeout-Ms: -5", {"X-Timeout-Ms": "-5"}, ["X-Timeout-Ms must be an integer"]),
        ("X-Timeout-Ms: +5", {"X-Timeout-Ms": "+5"}, ["X-Timeout-Ms must be an integer"]),
        ("X-Timeout-Ms: 3600001", {"X-Timeout-Ms": "3600001"}, ["X-Timeout-Ms must be an integer"]),
        ("X-Timeout-Ms beyond 2^64", {"X-Timeout-Ms": "99999999999999999999999"}, ["X-Timeout-Ms must be an integer"]),
        ("X-Request-Id: -1", {"X-Request-Id": "-1"}, ["X-Request-Id must be an integer from 0 to 18446744073709551615"]),
        ("X-Request-Id: 2^64", {"X-Request-Id": "18446744073709551616"}, ["X-Request-Id must be an integer"]),
        ("X-Request-Id: 12 34", {"X-Request-Id": "12 34"}, ["X-Request-Id must be an integer"]),
    ]
    try:
        infer_400 = 0
        for what, body, headers, code, words in cases:
            status, _, answer = infer_json(port, body, headers)
            message = message_of(answer)
            check(status == code and all(w in message for w in words),
                  f"{what}: {code} with a message naming the fault (got {status} {answer[:300]!r})")
            infer_400 += status == 400
        for what, headers, words in header_cases:
            status, _, answer = infer_raw(port, row_for(1), headers)
            message = message_of(answer)
            check(status == 400 and all(w in message for w in words),
                  f"{what}: 400 with a message naming the fault (got {status} {answer[:300]!r})")
            infer_400 += status == 400
        bad = raw_body(row_for(1)[:10] + [float("nan")] + row_for(1)[11:])
        status, _, answer = request(port, "POST", "/v1/infer", bad, {"Content-Type": "application/octet-stream"})
        check(status == 400 and "input 10 (row 0, column 10) is NaN" in message_of(answer),
              f"a NaN in a raw body: 400 naming it ({status} {answer!r})")
        status, _, answer = infer_raw(port, row_for(1)[:-1])
        check(status == 400 and "whole rows of 64" in message_of(answer) and "252 bytes" in message_of(answer),
              f"a raw body of a partial row: 400 naming the sizes ({status} {answer!r})")
        status, _, answer = request(port, "POST", "/v1/infer", b"", {"Content-Type": "application/octet-stream"})
        check(status == 400 and "0 bytes" in message_of(answer), f"an empty body: 400 ({status} {answer!r})")
        infer_400 += 3
        # The same header twice.
        r = raw_exchange(port, post_head(WIDTH * 4, extra="X-Request-Id: 1\r\nX-Request-Id: 2\r\n") + raw_body(row_for(1)))
        check(r is not None and r[0] == 400 and "appears 2 times" in message_of(r[2]),
              f"X-Request-Id twice: 400 with a message ({r})")
        infer_400 += 1

        # The protocol: methods, paths, framing.
        status, headers, answer = request(port, "GET", "/v1/infer")
        check(status == 405 and headers.get("allow") == "POST" and "POST" in message_of(answer),
              f"GET /v1/infer: 405 with Allow: POST and a message ({status} {headers} {answer!r})")
        status, headers, answer = request(port, "PUT", "/v1/infer", b"x" * 100)
        check(status == 405 and headers.get("allow") == "POST", f"PUT /v1/infer: 405 ({status} {answer!r})")
        status, headers, answer = request(port, "POST", "/v1/stats", b"{}")
        check(status == 405 and headers.get("allow") == "GET, HEAD" and message_of(answer),
              f"POST /v1/stats: 405 with a message ({status} {headers} {answer!r})")
        status, _, answer = request(port, "GET", "/nope")
        check(status == 404 and "/nope" in message_of(answer) and "POST /v1/infer" in message_of(answer),
              f"an unknown path: 404 naming it and the endpoints ({status} {answer!r})")
        r = raw_exchange(port, post_head("12abc") + b"x" * 12)
        check(r is not None and r[0] == 400 and "Content-Length must be an integer" in message_of(r[2]),
              f"Content-Length: 12abc: 400 with a message ({r})")
        infer_400 += 1
        r = raw_exchange(port, b"POST /v1/infer HTTP/1.1\r\nHost: test\r\n\r\n")
        check(r is not None and r[0] == 411 and "Content-Length" in message_of(r[2]), f"no Content-Length: 411 ({r})")
        r = raw_exchange(port, post_head("10", extra="Transfer-Encoding: chunked\r\n") + b"x" * 10)
        check(r is not None and r[0] == 400 and "not both" in message_of(r[2]),
              f"Content-Length and chunked: 400 ({r})")
        infer_400 += 1
        r = raw_exchange(port, b"POST /v1/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n")
        check(r is not None and r[0] == 501 and "gzip" in message_of(r[2]), f"Transfer-Encoding: gzip: 501 ({r})")
        r = raw_exchange(port, b"GARBAGE\r\n\r\n")
        check(r is not None and r[0] == 400 and "malformed" in message_of(r[2]), f"a malformed request line: 400 with a message ({r})")
        r = raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nBroken header line\r\n" + b"x" * 70000 + b"\r\n\r\n")
        check(r is not None and r[0] in (400, 413) and message_of(r[2]), f"an endless header: 4xx with a message ({r})")

        s = stats(port)
        expected = {"400": infer_400, "405": 2, "411": 1, "501": 1}
        check(s["http"] == expected, f"every /v1/infer answer is counted ({s['http']}, expected {expected})")
        expected = {"400": 2, "404": 1, "405": 1}  # (GET /v1/stats itself is answered after it counts)
        check(s["http_other"] == expected,
              f"every other answer is counted, whatever produced it ({s['http_other']}, expected {expected})")
    finally:
        server.stop("input server")
        server.kill()


# ---- limits -----------------------------------------------------------------------
def send_huge(port, chunked, total, results, index):
    """Sends a `total`-byte body (in 1 MiB pieces; JSON when chunked) while watching for an answer; stops at
    the answer."""
    piece = b"7" * (1 << 20)
    try:
        with connect(port, 30) as s:
            if chunked:
                s.sendall(post_head("chunked", "application/json") + b"%x\r\n{\"inputs\": [\r\n" % len(b'{"inputs": ['))
            else:
                s.sendall(post_head(total))
            sent = 0
            while sent < total and not answered(s):
                try:
                    s.sendall((b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(piece)
            results[index] = read_response(s, 10)
    except OSError as e:
        results[index] = e


def group_limits_out_of_memory(binary):
    """The limits group's std::bad_alloc check: a 500 with its message, counted; the server goes on."""
    server = Server(binary, "--threads", "2", "--max-body-bytes", str(256 << 20))
    port = server.port
    try:
        body = raw_body(row_for(1)) * (96 << 20 >> 8)  # 96 MiB of whole rows
        room = server.memory_kib("VmSize") * 1024 + len(body) * 3 // 2
        resource.prlimit(server.proc.pid, resource.RLIMIT_AS, (room, resource.RLIM_INFINITY))  # the soft limit
        status, _, answer = request(port, "POST", "/v1/infer", body, {"Content-Type": "application/octet-stream"})
        check(status == 500 and "out of memory" in message_of(answer),
              f"std::bad_alloc while answering: 500 with a message ({status} {answer[:200]!r})")
        resource.prlimit(server.proc.pid, resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        s = stats(port)
        check(s["http"] == {"500": 1}, f"...counted ({s['http']})")
        check(infer_raw(port, row_for(1))[0] == 200, "the server answers after it")
    finally:
        server.stop("out-of-memory server")
        server.kill()


def group_limits(binary):
    server = Server(binary, "--threads", "16")
    port = server.port
    try:
        limit = stats(port)["body_limit_bytes"]
        check(limit == 64 * WIDTH * 32 + 64 * 1024, f"the body limit is derived from --max-batch rows as JSON ({limit})")
        # The largest batch as JSON, each number in full precision, fits the limit.
        text = '{"inputs": [' + ", ".join(["[" + ", ".join(["-1.23456789e-30"] * WIDTH) + "]"] * 64) + "]}"
        status, _, answer = infer_json(port, text)
        check(status == 200, f"the largest batch as JSON in full precision ({len(text)} bytes) is taken ({status} {answer[:200]!r})")

        # A body over the limit is refused from its Content-Length, before one byte of it is sent.
        with connect(port) as s:
            s.sendall(post_head(64 << 20))
            r = read_response(s, 5)
        check(r is not None and r[0] == 413 and str(limit) in message_of(r[2]) and r[1].get("connection") == "close",
              f"Content-Length above the limit: 413 before the body is sent, naming the limit ({r})")
        results = [None]
        send_huge(port, True, 4 << 20, results, 0)
        check(isinstance(results[0], tuple) and results[0][0] == 413, f"a chunked body above the limit: 413 ({results[0]})")

        # 8 concurrent 64 MiB bodies (4 raw with Content-Length, 4 JSON chunked): memory stays near the
        # largest legal body.
        before = server.memory_kib("VmHWM")
        results = [None] * 8
        clients = [threading.Thread(target=send_huge, args=(port, i % 2 == 1, 64 << 20, results, i)) for i in range(8)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        after = server.memory_kib("VmHWM")
        check(all(isinstance(r, tuple) and r[0] == 413 for r in results), f"every 64 MiB body gets 413 ({results})")
        grown = (after - before) * 1024
        bound = 8 * 2 * limit + (8 << 20)  # each body at most twice (its text, its numbers), and the threads
        print(f"peak resident memory: {before} KiB before, {after} KiB after 8 bodies of 64 MiB "
              f"(limit {limit} bytes; bound on growth {bound >> 20} MiB)", flush=True)
        if sanitized:  # the sanitizer's shadow memory and quarantine grow with the threads and allocations
            print("peak memory bound: not checked under a sanitizer")
        else:
            check(grown <= bound,
                  f"peak memory grew by {grown >> 20} MiB under 8 bodies of 64 MiB (bound {bound >> 20} MiB)")
        status, _, _ = infer_raw(port, row_for(1))
        check(status == 200, "the server still answers after the huge bodies")
    finally:
        server.stop("limits server")
        server.kill()

    # An exception while answering (std::bad_alloc: the address space is capped just above what the
    # server holds plus one copy of the body) is a 500 with its message, counted; the server goes on.
    if sanitized:
        print("out-of-memory server: not run under a sanitizer (its allocator ends the program instead of "
              "throwing std::bad_alloc)")
    else:
        group_limits_out_of_memory(binary)

    # A batch that outlives the request's deadline: 504 at the deadline, and the HTTP thread is free again.
    server = Server(binary, "--threads", "1", "--batching", "off", "--cpu-delay-us", "3000000")
    port = server.port
    try:
        for attempt in ("first", "second"):
            start = time.monotonic()
            status, _, answer = infer_raw(port, row_for(1), {"X-Timeout-Ms": "100"})
            took = time.monotonic() - start
            check(status == 504 and "100 ms" in message_of(answer) and took < 1.0,
                  f"{attempt} request, X-Timeout-Ms: 100 with a 3 s batch: 504 in about 100 ms ({status}, {took:.3f} s, {answer!r})")
        start = time.monotonic()
        status, _, _ = request(port, "GET", "/v1/stats", timeout=5)
        check(status == 200 and time.monotonic() - start < 1.0,
              "the only HTTP thread answers again while the batch still runs")
    finally:
        server.stop("deadline server")
        server.kill()

    # Readiness: 503 while the model loads, 200 once ready, 503 after repeated executor failures.
    server = Server(binary, "--cpu-load-ms", "1500", "--cpu-fail-after", "2", "--unready-after-failures", "3",
                    "--batching", "off", wait_ready=False)
    port = server.port
    try:
        status, _, body = request(port, "GET", "/readyz")
        check(status == 503 and b"loading" in body, f"/readyz while the model loads: 503 ({status} {body!r})")
        status, _, body = request(port, "GET", "/healthz")
        check(status == 200, "/healthz while the model loads: 200")
        status, headers, body = infer_raw(port, row_for(1))
        check(status == 503 and "loading" in message_of(body) and headers.get("retry-after") == "1",
              f"/v1/infer while the model loads: 503 with Retry-After ({status} {body!r})")
        check(server.ready.wait(30), "the model finished loading")
        status, _, body = request(port, "GET", "/readyz")
        check(status == 200, f"/readyz once ready: 200 ({status} {body!r})")
        codes = [infer_raw(port, row_for(1))[0] for _ in range(5)]
        check(codes == [200, 200, 500, 500, 500], f"two batches succeed, then each fails ({codes})")
        status, _, body = request(port, "GET", "/readyz")
        check(status == 503 and b"3 batches failed in a row" in body and b"--cpu-fail-after" in body,
              f"/readyz after 3 failed batches: 503 naming the failure ({status} {body!r})")
        status, _, _ = request(port, "GET", "/healthz")
        check(status == 200, "/healthz stays 200 (the process is alive)")
        s = stats(port)
        check(s["executor"]["failures_in_a_row"] == 3 and s["http"].get("500") == 3 and s["ready"] is False,
              f"/v1/stats: the failures and the 500s are counted ({s['executor']} {s['http']})")
    finally:
        server.stop("readiness server")
        server.kill()


# ---- slow ----------------------------------------------------------------------------
def group_slow(binary):
    read_timeout = 3.0
    server = Server(binary, "--threads", "2", "--max-pending-connections", "2",
                    "--read-timeout-ms", str(int(read_timeout * 1000)))
    port = server.port
    drips = []
    answers = {}
    stop_dripping = threading.Event()

    # Each sends its head whole and its body a byte every 100 ms: never a whole request within the read
    # timeout. (Not a head sent a byte at a time: httplib's public API bounds each wait for bytes, not a
    # whole head, so such a head holds a thread as long as it keeps coming; checked below for what it
    # does not hold; see docs/batching.md.)
    def drip(i):
        try:
            with connect(port, 30) as s:
                s.sendall(post_head(WIDTH * 4))
                for byte in raw_body(row_for(i)):
                    if stop_dripping.wait(0.1) or answered(s):
                        break
                    s.sendall(bytes([byte]))
                answers[i] = read_response(s, 30)
        except OSError as e:
            answers[i] = e

    try:
        started = time.monotonic()
        for i in range(6):  # 2 holding the slots, 2 waiting for them, 2 beyond capacity
            t = threading.Thread(target=drip, args=(i,))
            t.start()
            drips.append(t)
            time.sleep(0.05)
        time.sleep(0.5)
        for probe in range(3):
            start = time.monotonic()
            try:
                status, _, body = request(port, "GET", "/healthz", timeout=5)
            except OSError as e:
                status, body = None, repr(e).encode()
            took = time.monotonic() - start
            check(status == 200 and took < 1.0,
                  f"/healthz with every slot held by slow clients answers within a second ({status}, {took:.3f} s)")
        start = time.monotonic()
        status, _, body = request(port, "GET", "/readyz", timeout=5)
        check(status == 200 and time.monotonic() - start < 1.0, f"/readyz answers too ({status})")
        start = time.monotonic()
        status, headers, body = infer_raw(port, row_for(1), timeout=5)
        took = time.monotonic() - start
        check(status == 503 and "at capacity" in message_of(body) and headers.get("retry-after") == "1" and took < 1.0,
              f"a request beyond capacity: 503 at once, with a message ({status}, {took:.3f} s, {body!r})")

        time.sleep(max(0.0, 1.2 - (time.monotonic() - started)))
        sigterm = time.monotonic()
        server.signal()
        code = server.wait(read_timeout + 5)
        took = time.monotonic() - sigterm
        check(code == 0 and took <= read_timeout + 2.0,
              f"SIGTERM with slow clients still drains within the read timeout ({code}, {took:.1f} s)")
        stop_dripping.set()
        for t in drips:
            t.join()
        print("the slow clients' answers:", sorted(r[0] if isinstance(r, tuple) else repr(r) for r in answers.values()),
              flush=True)
        timed_out = sum(1 for r in answers.values() if isinstance(r, tuple) and r[0] == 408)
        refused = sum(1 for r in answers.values() if isinstance(r, tuple) and r[0] == 503)
        check(timed_out >= 2 and timed_out + refused == 6,
              f"the slow clients get 408 (read timeout) or 503 (beyond capacity) ({answers})")
    finally:
        stop_dripping.set()
        server.kill()


    # A head dripped a byte at a time holds a thread (no deadline for a whole head through httplib's
    # public API), but no slot, and holds up neither health checks nor the drain: SIGTERM exits 0 at
    # once, as no request of it has arrived.
    server = Server(binary, "--threads", "1", "--max-pending-connections", "1")
    port = server.port
    stop_dripping = threading.Event()
    try:
        def drip_head():
            try:
                with connect(port, 30) as s:
                    for byte in post_head(WIDTH * 4):
                        if stop_dripping.wait(0.1) or answered(s):
                            break
                        s.sendall(bytes([byte]))
            except OSError:
                pass

        dripper = threading.Thread(target=drip_head)
        dripper.start()
        time.sleep(0.5)
        start = time.monotonic()
        status, _, _ = request(port, "GET", "/healthz", timeout=5)
        check(status == 200 and time.monotonic() - start < 1.0,
              f"/healthz while a head drips at --threads 1 answers within a second ({status})")
        start = time.monotonic()
        server.signal()
        code = server.wait(10)
        took = time.monotonic() - start
        check(code == 0 and took < 2.0, f"SIGTERM while a head drips: exit 0 at once ({code}, {took:.2f} s)")
        stop_dripping.set()
        dripper.join()
    finally:
        stop_dripping.set()
        server.kill()

    # A burst of one-request connections far beyond capacity: each gets 200 or 503 (its body read and
    # dropped first), none is reset.
    server = Server(binary, "--threads", "4", "--max-pending-connections", "4", "--cpu-delay-us", "2000")
    port = server.port
    try:
        outcomes = []
        lock = threading.Lock()

        def one_request():
            for _ in range(10):
                try:
                    status = infer_raw(port, row_for(1), timeout=10)[0]
                except OSError as e:
                    status = repr(e)
                with lock:
                    outcomes.append(status)

        burst = [threading.Thread(target=one_request) for _ in range(64)]
        for t in burst:
            t.start()
        for t in burst:
            t.join()
        counts = {str(k): outcomes.count(k) for k in set(outcomes)}
        print("the burst's answers:", counts, flush=True)
        check(len(outcomes) == 640 and set(outcomes) <= {200, 503} and 200 in outcomes and 503 in outcomes,
              f"a burst of 640 requests on 64 connections at a time, 4 slots and 4 waiting: 200 or 503 each, none reset ({counts})")
    finally:
        server.stop("a burst beyond capacity")
        server.kill()

    # A busy kept-alive client does not keep the only slot from a connection waiting for it.
    server = Server(binary, "--threads", "1", "--max-pending-connections", "4", "--keep-alive-timeout-ms", "20000")
    port = server.port
    try:
        busy = {"answers": 0, "closed": False}

        def keep_busy():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                resp.read()
                busy["answers"] += 1
                if resp.getheader("Connection") == "close":
                    busy["closed"] = True
                    break
            conn.close()

        busy_thread = threading.Thread(target=keep_busy)
        busy_thread.start()
        time.sleep(0.2)
        start = time.monotonic()
        status = infer_raw(port, row_for(1), timeout=10)[0]
        took = time.monotonic() - start
        busy_thread.join()
        check(busy["closed"] and busy["answers"] > 1,
              f"while a connection waits for the only slot, the busy one's answer says Connection: close ({busy})")
        check(status == 200 and took < 2.0, f"...and the waiting connection is served ({status}, {took:.2f} s)")
    finally:
        server.stop("one slot, a busy client")
        server.kill()


# ---- shutdown --------------------------------------------------------------------------
def group_shutdown(binary):
    # More connections than threads, each with its request sent, when SIGTERM comes.
    server = Server(binary, "--threads", "2", "--max-pending-connections", "8", "--batching", "off",
                    "--cpu-delay-us", "300000")
    port = server.port
    try:
        results = [None] * 6

        def post(i):
            try:
                with connect(port, 30) as s:
                    s.sendall(post_head(WIDTH * 4) + raw_body(row_for(i)))
                    results[i] = read_response(s, 30)
            except OSError as e:
                results[i] = e

        clients = [threading.Thread(target=post, args=(i,)) for i in range(6)]
        for c in clients:
            c.start()
        time.sleep(0.1)
        server.stop("six connections, two threads")
        for c in clients:
            c.join()
        check(all(isinstance(r, tuple) for r in results),
              f"every request sent before SIGTERM gets a status line ({[r if not isinstance(r, tuple) else r[0] for r in results]})")
        check(all(isinstance(r, tuple) and r[0] == 200 and r[1].get("connection") == "close" for r in results),
              f"...200, with Connection: close ({[r[:2] if isinstance(r, tuple) else r for r in results]})")
    finally:
        server.kill()

    # Kept-alive connections: an idle one is closed at once, a busy one's answer says Connection: close.
    server = Server(binary, "--batching", "off", "--cpu-delay-us", "500000", "--keep-alive-timeout-ms", "20000")
    port = server.port
    try:
        idle = connect(port)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        first = read_response(idle)
        check(first is not None and first[0] == 200 and first[1].get("connection") != "close",
              f"a kept-alive connection's answer before the drain keeps it open ({first})")
        busy = connect(port)
        busy.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        read_response(busy)
        busy.sendall(post_head(WIDTH * 4) + raw_body(row_for(1)))
        time.sleep(0.1)
        start = time.monotonic()
        server.signal()
        answer = read_response(busy, 10)
        check(answer is not None and answer[0] == 200 and answer[1].get("connection") == "close",
              f"the answer in flight on a kept-alive connection says Connection: close ({answer})")
        idle.settimeout(5)
        try:
            end = idle.recv(1)
        except OSError:
            end = b"error"
        check(end == b"", f"the idle kept-alive connection is closed by the drain ({end!r})")
        code = server.wait(10)
        check(code == 0 and time.monotonic() - start < 5.0,
              f"the server exits 0 without waiting for the keep-alive timeout ({code}, {time.monotonic() - start:.1f} s)")
        idle.close()
        busy.close()
    finally:
        server.kill()

    # A drain that outlasts --drain-timeout-ms exits 1, saying so.
    server = Server(binary, "--batching", "off", "--cpu-delay-us", "5000000", "--timeout-ms", "20000",
                    "--drain-timeout-ms", "500")
    port = server.port
    try:
        def never_answered():
            try:
                infer_raw(port, row_for(1), timeout=30)
            except OSError:
                pass  # the process ends before the batch does

        threading.Thread(target=never_answered, daemon=True).start()
        time.sleep(0.3)
        start = time.monotonic()
        server.signal()
        code = server.wait(5)
        took = time.monotonic() - start
        time.sleep(0.1)
        check(code == 1 and took < 2.0, f"a drain longer than --drain-timeout-ms 500 exits 1 ({code}, {took:.2f} s)")
        check(any("--drain-timeout-ms" in line for line in server.stderr), f"...saying so on stderr ({server.stderr})")
    finally:
        server.kill()

    # A second SIGTERM exits at once, non-zero, and says so.
    server = Server(binary, "--batching", "off", "--cpu-delay-us", "5000000", "--timeout-ms", "20000")
    port = server.port
    try:
        def cut_short():
            try:
                infer_raw(port, row_for(1), timeout=30)
            except OSError:
                pass  # the second SIGTERM ends the process without answering

        threading.Thread(target=cut_short, daemon=True).start()
        time.sleep(0.3)
        server.signal()
        time.sleep(0.3)
        check(server.proc.poll() is None, "the first SIGTERM drains (the 5 s batch keeps it running)")
        start = time.monotonic()
        server.signal()
        code = server.wait(5)
        took = time.monotonic() - start
        time.sleep(0.1)
        check(code == 128 + signal.SIGTERM and took < 1.0,
              f"a second SIGTERM exits at once with {128 + signal.SIGTERM} ({code}, {took:.2f} s)")
        check(any("second signal" in line for line in server.stderr), f"...saying so on stderr ({server.stderr})")
    finally:
        server.kill()


# ---- debug -------------------------------------------------------------------------------
def group_debug(binary):
    server = Server(binary, "--keep-alive-timeout-ms", "20000")
    port = server.port
    try:
        idle = connect(port)
        idle.sendall(post_head(WIDTH * 4) + raw_body(row_for(1)))
        first = read_response(idle)
        check(first is not None and first[0] == 200, f"the debug build answers ({first})")
        start = time.monotonic()
        code = server.stop("debug build with an idle kept-alive connection", timeout=10)
        check(code == 0 and time.monotonic() - start < 5.0, "...at once")
        idle.close()
    finally:
        server.kill()
    server = Server(binary, "--cpu-load-ms", "1000", wait_ready=False)
    try:
        status, _, _ = request(server.port, "GET", "/healthz")
        check(status == 200, "the debug build answers /healthz while the model loads")
        server.stop("debug build, SIGTERM while the model loads", timeout=10)
    finally:
        server.kill()


GROUPS = {"answers": group_answers, "input": group_input, "limits": group_limits, "slow": group_slow,
          "shutdown": group_shutdown, "debug": group_debug}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server")
    parser.add_argument("--debug-server", help="a debug build of the server (the debug group)")
    parser.add_argument("--group", action="append", choices=sorted(GROUPS), help="run these groups (default: all)")
    parser.add_argument("--sanitized", action="store_true",
                        help="the server is built under a sanitizer: leave out the std::bad_alloc check and "
                             "the bound on peak memory")
    args = parser.parse_args()
    global sanitized
    sanitized = args.sanitized
    for name in args.group or list(GROUPS):
        if name == "debug" and not args.debug_server:
            print("debug group: no --debug-server given, skipped")
            continue
        print(f"---- {name}", flush=True)
        GROUPS[name](args.debug_server if name == "debug" else args.server)
    if failures:
        print(f"{len(failures)} check(s) FAILED")
        sys.exit(1)
    print("inference_server test: all checks passed")


if __name__ == "__main__":
    main()
