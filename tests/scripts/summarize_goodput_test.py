#!/usr/bin/env python3
"""bench/llm_decode/summarize.py: the goodput ratio across several runs, with
the bracket the search's resolution gives each, from made-up
`llm_decode goodput --json` reports."""
import copy
import sys

from summarize_runner import summarize


def search(mix, batching, goodput, bound="measured", failing=None):
    return {"repeat": 1, "mix": mix, "batching": batching, "goodput_rps": goodput, "bound": bound,
            "lowest_failing_rps": failing, "complete": True, "points": []}


def report(tpot, uniform_continuous, uniform_failing, uniform_static, static_failing):
    searches = [search("uniform", "chunked", uniform_continuous, failing=uniform_failing),
                search("uniform", "static", uniform_static, failing=static_failing),
                search("exponential", "chunked", 900.0, failing=990.0),
                search("exponential", "static", 50.0, bound="below")]
    ratio = uniform_continuous / uniform_static
    ratios = [{"repeat": 1, "mix": "uniform", "best_continuous": "chunked", "continuous_rps": uniform_continuous,
               "continuous_bound": "measured", "static_rps": uniform_static, "static_bound": "measured",
               "ratio": ratio, "ratio_kind": "measured", "target_met": ratio >= 2},
              {"repeat": 1, "mix": "exponential", "best_continuous": "chunked", "continuous_rps": 900.0,
               "continuous_bound": "measured", "static_rps": 50.0, "static_bound": "below", "ratio": 18.0,
               "ratio_kind": "at_least", "target_met": True}]
    return {"slo": {"ttft_p99_ms": 100, "tpot_p99_ms": tpot, "tpot_factor": 2}, "batch1_step_ms": tpot / 2,
            "requests": 1000, "repeats": 1, "complete": True, "rows": [], "searches": searches, "ratios": ratios,
            "spread": {m: {"ratio": {"repeats": 1, "min": x["ratio"], "median": x["ratio"], "max": x["ratio"],
                                     "target_met_every_repeat": x["target_met"]}}
                       for m, x in (("uniform", ratios[0]), ("exponential", ratios[1]))},
            "target": 2.0, "mixes": {"uniform": "uniform", "exponential": "exponential"},
            "bounds": {"uniform": {"rows": 64, "mean_length": 104.0, "mean_longest": 228.8, "ratio": 2.2},
                       "exponential": {"rows": 64, "mean_length": 126.2, "mean_longest": 539.1, "ratio": 4.27}}}


runs = [report(0.66, 1300.0, 1400.0, 600.0, 660.0), report(0.67, 1200.0, 1300.0, 600.0, 660.0)]
out = summarize(goodput=runs)
failures = []
expected = [
    # run 1: 1300 / 660 = 1.97 to 1400 / 600 = 2.33; run 2: 1200 / 660 = 1.82 to 1300 / 600 = 2.17
    "| 1 | uniform | 0.660 | chunked | 1300 | 600 | 2.17 | measured | 1.97 to 2.33 |",
    "| 1 | uniform | 0.670 | chunked | 1200 | 600 | 2.00 | measured | 1.82 to 2.17 |",
    "| 1 | exponential | 0.660 | chunked | 900 | below 50 | 18.00 | at_least | 18.00 to unbounded |",
    "- uniform: continuous (best) / static min / median / max 2.00 / 2.08 / 2.17 over 2 of 2 repeat(s) (measured); "
    ">= 2 in every one: yes; beyond the search's resolution in every one: no",
    "- exponential: continuous (best) / static min / median / max 18.00 / 18.00 / 18.00 over 2 of 2 repeat(s) "
    "(at_least); >= 2 in every one: yes; beyond the search's resolution in every one: yes",
    "### Goodput across 2 runs",
    # 0.95 x 2.2 = 2.09: run 1's 2.17 reaches it, run 2's 2.00 does not.
    "- uniform: the mix's own bound at 64 rows, E[longest] / E[length] = 228.8 / 104.0 = 2.20; continuous (best) / "
    "static >= 0.95 x it (2.09) in every run: no",
    "- exponential: the mix's own bound at 64 rows, E[longest] / E[length] = 539.1 / 126.2 = 4.27; continuous (best) "
    "/ static >= 0.95 x it (4.06) in every run: yes",
]
for line in expected:
    if line not in out:
        failures.append(line)
# One run alone has no across-runs section.
single = summarize(goodput=runs[:1])
if "Goodput across" in single:
    failures.append("(no across-runs section for one run)")
# One run's repeats against the bound: run 1's 2.17 >= 2.09.
if ("- uniform: the mix's own bound at 64 rows, E[longest] / E[length] = 228.8 / 104.0 = 2.20; continuous (best) / "
        "static >= 0.95 x it (2.09) in every repeat: yes") not in single:
    failures.append("(one run's uniform repeats judged against the bound)")
# A run the budget ended before any uniform ratio: its bound meets nothing.
cut = copy.deepcopy(runs[0])
cut["ratios"] = [r for r in cut["ratios"] if r["mix"] != "uniform"]
cut["spread"]["uniform"] = {}
ended = summarize(goodput=[cut])
if "(2.09) in every repeat: no" not in ended:
    failures.append("(a mix without ratios does not meet its bound)")
# Reports without bounds (written before goodput recorded them) are not judged against one.
unbounded = summarize(goodput=[{k: v for k, v in r.items() if k != "bounds"} for r in runs])
if "the mix's own bound" in unbounded:
    failures.append("(no bound line for reports without bounds)")
if failures:
    print("FAILED: missing from summarize.py's output:\n  " + "\n  ".join(failures) + "\n--- output ---\n" + out)
    sys.exit(1)
print("summarize goodput test: 1 passed, 0 failed")
