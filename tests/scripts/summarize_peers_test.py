#!/usr/bin/env python3
"""bench/llm_decode/summarize.py: peers files are merged batch by batch (the
first file keeps a batch measured twice); a goal against the best Python peer
gets no verdict at a batch where a peer ran out of time and no file measured
it, while a peer that failed outright does not hold the verdict back; the
notes name only batches no file measured; with --pair, each peer is judged
against the C++ step of its own run, by the lowest such ratio, and not where
where any run's lengths differ, where a peer is missing or cannot be paired,
or across two models. From made-up `llm_decode bench --json` and
`decode_peers.py --json` reports."""
import subprocess
import sys

from summarize_runner import summarize


def cpp():
    rows = []
    for batch in (1, 8):
        rows.append({"method": "cpp_graphed", "batch": batch, "ms_per_step": 0.5, "tokens_per_s": 2000.0 * batch})
        rows.append({"method": "cpp_graphed_fused", "batch": batch, "ms_per_step": 0.25,
                     "tokens_per_s": 4000.0 * batch})
    return {"preset": "small", "prompt": 32, "new_tokens": 128, "rows": rows}


def ok(batch, tokens_per_s):
    return {"batch": batch, "status": "ok", "ms_per_step": 1000.0 * batch / tokens_per_s, "tokens_per_s": tokens_per_s}


def report(peers):
    return {"settings": {"prompt_len": 32, "new_tokens": 128}, "peers": peers}


# File 1: reduce-overhead at 1 and 8; max-autotune at 1 only (its budget ran out at 8).
first = report({
    "compile": {"status": "ok", "results": [ok(1, 2500.0), ok(8, 20000.0)]},
    "compile_max_autotune": {"status": "partial", "error": None, "results": [
        ok(1, 2000.0), {"batch": 8, "status": "skipped", "error": "OutOfTime: the compile time budget ran out"}]},
})
# File 2: max-autotune at 8 (faster than reduce-overhead there), and a second batch-1 figure that must not win.
second = report({"compile_max_autotune": {"status": "ok", "results": [ok(8, 25000.0), ok(1, 8000.0)]}})
# A peer that cannot run here (failed before any batch), and one that ran out of time at batch 1.
cannot_run = report({"hf_eager": {"status": "failed", "error": "ModuleNotFoundError: No module named 'transformers'",
                                  "results": [{"batch": b, "status": "skipped",
                                               "error": "ModuleNotFoundError: No module named 'transformers'"}
                                              for b in (1, 8)]}})
out_of_time = report({"hf_static": {"status": "skipped", "error": "OutOfTime: the run time budget ran out",
                                    "results": [{"batch": 1, "status": "skipped",
                                                 "error": "the run time budget was spent before this batch"}]}})


failures = []


def expect(text, lines, absent=()):
    for line in lines:
        if line not in text:
            failures.append(line)
    for line in absent:
        if line in text:
            failures.append(f"(not expected) {line}")


# One file: batch 8 lacks max-autotune, so it is reported with no verdict and the lacking peer named.
alone = summarize(cpp(), [first])
expect(alone, [
    "| replay, fused kernels / best Python peer (compile), batch 1 | 1.600 | >= 1.5 | met |",
    "| replay / best Python peer (compile; not measured at this batch: compile_max_autotune), "
    "batch 8 | 0.800 | >= 1.0 |  |",
    "| replay, fused kernels / best Python peer (compile; not measured at this batch: compile_max_autotune), "
    "batch 8 | 1.600 | >= 1.5 |  |",
    "peers0.json: compile_max_autotune: partial; batch 8 skipped (OutOfTime: the compile time budget ran out)",
])
# Both files: batch 8 takes max-autotune from the second (32000 / 25000 = 1.28, judged); batch 1 keeps the
# first file's max-autotune (2000, slower than reduce-overhead's 2500), not the second's 8000.
merged = summarize(cpp(), [first, second])
expect(merged, [
    "| replay, fused kernels / best Python peer (compile), batch 1 | 1.600 | >= 1.5 | met |",
    "| replay, fused kernels / best Python peer (compile_max_autotune), batch 8 | 1.280 | >= 1.5 | MISSED |",
], absent=["not measured at this batch", "compile_max_autotune: partial"])  # the second file measured batch 8
# A peer that failed outright holds no verdict back (its note says why); one that ran out of time at batch 1
# holds back batch 1's verdicts, its own goal's included.
others = summarize(cpp(), [first, second, cannot_run, out_of_time])
expect(others, [
    "| replay, fused kernels / best Python peer (compile; not measured at this batch: hf_static), batch 1 | "
    "1.600 | >= 1.5 |  |",
    "| replay, fused kernels / best Python peer (compile_max_autotune), batch 8 | 1.280 | >= 1.5 | MISSED |",
    "peers2.json: hf_eager: failed: ModuleNotFoundError: No module named 'transformers'; batch 1, 8 skipped",
    "| replay / Hugging Face generate, static cache, batch 1: the peer ran out of time | unknown | >= 2 |  |",
], absent=["hf_eager), batch", "hf_eager, hf_static", "hf_static, hf_eager"])
without = summarize(cpp(), [first, second, cannot_run])  # the failed peer alone: batch 1 judged
expect(without, ["| replay, fused kernels / best Python peer (compile), batch 1 | 1.600 | >= 1.5 | met |"])
# --pair: each peer against the C++ step of its own run. Run 2 is a slower host (fused 0.35 ms at batch 8):
# its max-autotune (0.42 ms) is slower than run 1's reduce-overhead (0.40 ms) but the closer to its own C++
# step (1.20 against 1.60), so batch 8 is judged against it; run 2's batch-1 reduce-overhead, measured in run
# 1 too, is left out.
slower = {"preset": "small", "prompt": 32, "new_tokens": 128, "rows": [
    {"method": "cpp_graphed_fused", "batch": b, "ms_per_step": 0.35, "tokens_per_s": 1000.0 * b / 0.35}
    for b in (1, 8)]}
second_run = report({"compile_max_autotune": {"status": "ok", "results": [ok(8, 8000.0 / 0.42)]},
                     "compile": {"status": "ok", "results": [ok(1, 5000.0)]}})
paired = summarize(pairs=[(cpp(), [report({"compile": first["peers"]["compile"]})]), (slower, [second_run])])
expect(paired, [
    "| Python torch.compile reduce-overhead | 1 | 0.400 | 0.250 (run 1) | 1.600 |",
    "| Python torch.compile max-autotune | 8 | 0.420 | 0.350 (run 2) | 1.200 |",
    "| replay, fused kernels / best Python peer (compile, run 1), each against its own run's C++ step, batch 1 | "
    "1.600 | >= 1.5 | met |",
    "| replay, fused kernels / best Python peer (compile_max_autotune, run 2), each against its own run's C++ step, "
    "batch 8 | 1.200 | >= 1.5 | MISSED |",
], absent=["| 1 | 0.200 |"])
expect(paired, ["| replay / best Python peer (compile, run 1), each against its own run's C++ step, batch 1 | "
                "0.800 | >= 1.0 | MISSED |"])  # the plain step: its own goal, against 1.0
# A run whose C++ bench decoded other lengths than its peers: no verdict at a batch where any of its ratios
# stands, even where another run's ratio is the lower one; the run says why.
shorter = dict(cpp(), new_tokens=32)
unequal = summarize(pairs=[(shorter, [report({"compile_max_autotune": {"status": "ok", "results": [ok(1, 2000.0)]}})]),
                           (cpp(), [report({"compile": {"status": "ok", "results": [ok(1, 2500.0)]}})])])
expect(unequal, ["| replay, fused kernels / best Python peer (compile, run 2), each against its own run's C++ step, "
                 "batch 1 | 1.600 | >= 1.5 |  |",
                 "**Not the same lengths:** the C++ bench decoded prompt 32, new tokens 32"])
# A peer out of time in one run and measured in none holds its batch's verdict back, and so does a peer
# measured only in a run whose bench lacks that batch (noted).
only_one = dict(cpp(), rows=[r for r in cpp()["rows"] if r["batch"] == 1])
hf_at_8 = report({"hf_static": {"status": "ok", "results": [ok(8, 9.0)]}})
holes = summarize(pairs=[(cpp(), [first]), (only_one, [hf_at_8])])
expect(holes, [
    "| replay, fused kernels / best Python peer (compile, run 1; not measured at this batch: compile_max_autotune, "
    "hf_static), each against its own run's C++ step, batch 8 | 1.600 | >= 1.5 |  |",
    "run 2: hf_static at batch 8 has no C++ row of its run to be set against",
    "| replay, fused kernels / best Python peer (compile, run 1), each against its own run's C++ step, batch 1 | "
    "1.600 | >= 1.5 | met |",
])
# Runs of two models in one call are refused.
try:
    summarize(pairs=[(cpp(), [first]), (dict(cpp(), preset="1b"), [second])])
    failures.append("(expected a refusal) --pair runs of two presets")
except subprocess.CalledProcessError as e:
    if "--pair runs of different models" not in e.stderr:
        failures.append(f"(expected the refusal's words) {e.stderr}")
if failures:
    print("FAILED: summarize.py's output:\n  " + "\n  ".join(failures) + "\n--- alone ---\n" + alone +
          "\n--- merged ---\n" + merged + "\n--- others ---\n" + others + "\n--- without ---\n" + without +
          "\n--- paired ---\n" + paired + "\n--- unequal ---\n" + unequal + "\n--- holes ---\n" + holes)
    sys.exit(1)
print("summarize peers test: 8 passed, 0 failed")
