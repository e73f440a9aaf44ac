#!/usr/bin/env python3
"""bench/llm_decode/summarize.py: the C++ bench and the Python peers are
compared only where they decoded the same prompt and new tokens; otherwise
their ratios are reported with no verdict and the output says why. From
made-up `llm_decode bench --json` and `decode_peers.py --json` reports."""
import sys

from summarize_runner import summarize


def cpp(new_tokens):
    rows = [{"method": "cpp_graphed", "batch": 1, "ms_per_step": 0.5, "tokens_per_s": 2000.0},
            {"method": "cpp_graphed_fused", "batch": 1, "ms_per_step": 0.25, "tokens_per_s": 4000.0}]
    return {"preset": "small", "prompt": 32, "new_tokens": new_tokens, "rows": rows}


def peers(new_tokens):
    results = [{"batch": 1, "status": "ok", "ms_per_step": 0.4, "tokens_per_s": 2500.0}]
    return {"settings": {"prompt_len": 32, "new_tokens": new_tokens},
            "peers": {"compile": {"status": "ok", "results": results}}}


failures = []
# Same lengths: judged (fused 4000 / 2500 = 1.6 >= 1.5; plain 2000 / 2500 = 0.8 < 1.0).
same = summarize(cpp(128), [peers(128)])
for line in ("| replay, fused kernels / best Python peer (compile), batch 1 | 1.600 | >= 1.5 | met |",
             "| replay / best Python peer (compile), batch 1 | 0.800 | >= 1.0 | MISSED |"):
    if line not in same:
        failures.append(line)
if "Not the same lengths" in same:
    failures.append("(no length warning at the same lengths)")
# 32 against 128 new tokens: the same ratios, no verdict, and the reason.
differ = summarize(cpp(32), [peers(128)])
for line in ("| replay, fused kernels / best Python peer (compile), batch 1 | 1.600 | >= 1.5 |  |",
             "| replay / best Python peer (compile), batch 1 | 0.800 | >= 1.0 |  |",
             "**Not the same lengths:** the C++ bench decoded prompt 32, new tokens 32; the peers"):
    if line not in differ:
        failures.append(line)
if failures:
    print("FAILED: missing from summarize.py's output:\n  " + "\n  ".join(failures) + "\n--- same ---\n" + same +
          "\n--- differ ---\n" + differ)
    sys.exit(1)
print("summarize lengths test: 1 passed, 0 failed")
