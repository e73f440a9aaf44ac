#!/usr/bin/env python3
"""Tables and goal ratios of the LLM decode benchmarks (docs/llm_decode.md).

    python3 bench/llm_decode/summarize.py [--cpp BENCH.json] [--peers PEERS.json ...]
        [--pair BENCH.json PEERS.json ... [--pair ...]]
        [--load LOAD.json ...] [--goodput GOODPUT.json ...] [--name small] [--markdown OUT.md]

BENCH.json: `llm_decode bench --json` (C++ eager, graphed, graphed K steps per
launch; graph memory; capture time). PEERS.json: one or more outputs of
bench/llm_decode/decode_peers.py for the same weights (their peers are merged
batch by batch; a batch measured in two files keeps the first file's). A goal
against the best Python peer at a batch, or against a named peer, gets no
verdict where a peer (of PEER_LABELS) was skipped at that batch for a time
budget and measured in no file: it may be the faster one, and max-autotune's
compilation often spends the budget. A peer that failed (it cannot run here)
does not hold back the verdict; its note says why.

--pair (repeatable): a C++ bench report and the peers reports of the same
run, for peers measured over several runs or hosts: each peer is
divided by its own run's C++ step, and the goal at a batch is against the
lowest of those ratios (paired_ratios). One model per call.

LOAD.json (repeatable): `llm_decode load --json`. GOODPUT.json (repeatable):
`llm_decode goodput --json` (the highest offered rate within the TTFT / TPOT
p99 SLO, per policy, mix and repeat; with two or more, also the ratio across
the runs: every repeat's with the bracket the search's resolution gives it,
and the spread).

Prints ms per step and tokens/s per method and batch size, then each goal of
the issue as measured / target; exits 0 (the goals are reported, not
enforced: a benchmark's result is information, the tests check correctness).
"""
import argparse
import json
import statistics
import sys

PEER_LABELS = {
    "eager": "Python eager (llama.py step)",
    "cuda_graphs": "Python torch.cuda.CUDAGraph per bucket",
    "compile": "Python torch.compile reduce-overhead",
    "compile_max_autotune": "Python torch.compile max-autotune",
    "hf_eager": "Hugging Face generate, eager",
    "hf_static": "Hugging Face generate, static cache",
}
CPP_LABELS = {
    "cpp_eager": "C++ eager (same kernels, no graphs)",
    "cpp_graphed": "C++ replay, one step per launch",
    "cpp_graphed_fused": "C++ replay, fused kernels (DecodeKernels::fused)",
}


def load_rows(cpp, peers):
    """{method: {batch: (ms_per_step, tokens_per_s, extra)}}"""
    rows = {}
    for r in cpp.get("rows", []):
        rows.setdefault(r["method"], {})[r["batch"]] = (r["ms_per_step"], r["tokens_per_s"], r)
    for report in peers:
        for name, peer in report.get("peers", {}).items():
            for r in peer.get("results", []):
                if r.get("status") == "ok" and r.get("ms_per_step") and r["batch"] not in rows.get(name, {}):
                    rows.setdefault(name, {})[r["batch"]] = (r["ms_per_step"], r["tokens_per_s"], r)
    return rows


def out_of_time(peers, rows):
    """{peer: batches skipped for a time budget and measured in no file}."""
    skipped = {}
    for report in peers:
        for name, peer in report.get("peers", {}).items():
            for r in peer.get("results", []):
                if (name in PEER_LABELS and r.get("status") == "skipped" and "time budget" in (r.get("error") or "")
                        and r["batch"] not in rows.get(name, {})):
                    skipped.setdefault(name, set()).add(r["batch"])
    return skipped


def peer_notes(peers, paths, rows):
    """A line per peer and file that is not all ok, naming the batches no file
    measured, grouped by reason (a batch another file measured is left out)."""
    notes = []
    for path, report in zip(paths, peers):
        for name, peer in report.get("peers", {}).items():
            if peer.get("status") in ("ok", None):
                continue
            reasons = {}
            for r in peer.get("results", []):
                if r.get("status") != "ok" and r.get("batch") not in rows.get(name, {}):
                    why = f"{r.get('status')} ({r.get('error') or 'no reason given'})"
                    reasons.setdefault(why, []).append(str(r.get("batch")))
            if not reasons and not peer.get("error"):
                continue
            note = (f"{path}: {name}: {peer.get('status')}" + (f": {peer['error']}" if peer.get("error") else "")
                    + "".join(f"; batch {', '.join(b)} {why}" for why, b in reasons.items()))
            if note not in notes:
                notes.append(note)
    return notes


def label(method):
    if method in CPP_LABELS:
        return CPP_LABELS[method]
    if method.startswith("cpp_graphed_k"):
        return f"C++ replay, {method[len('cpp_graphed_k'):]} steps per launch (WHILE node)"
    return PEER_LABELS.get(method, method)


# The goal we propose beside the 2x: continuous (best) / static at or
# above this share of the mix's own bound (goodput.hpp's batching_bound, in the
# report's "bounds": E[longest of the rows] / E[length], what the output
# lengths alone allow when both policies have the same rows and step).
BOUND_SHARE = 0.95


def bound_goal(mix, bound, ratios, scope, out, goals):
    """The line and goal row for one mix's ratios against BOUND_SHARE x its bound."""
    floor = BOUND_SHARE * bound["ratio"]
    # No ratio (a run the budget ended before this mix's) meets nothing.
    every = bool(ratios) and all(
        r["ratio_kind"] in ("measured", "at_least") and r.get("ratio") is not None and r["ratio"] >= floor
        for r in ratios)
    out.append(f"- {mix}: the mix's own bound at {bound['rows']} rows, E[longest] / E[length] = "
               f"{bound['mean_longest']:.1f} / {bound['mean_length']:.1f} = {bound['ratio']:.2f}; continuous (best) / "
               f"static >= {BOUND_SHARE:g} x it ({floor:.2f}) in every {scope}: {'yes' if every else 'no'}")
    known = [r["ratio"] for r in ratios if r["ratio_kind"] != "unknown" and r.get("ratio") is not None]
    goals.append((f"goodput, continuous (best policy) / static, outputs {mix}, against the mix's bound "
                  f"({bound['ratio']:.2f}): the lowest of {len(known)}", min(known) if known else None,
                  f">= {BOUND_SHARE:g} x the bound ({floor:.2f}) in every {scope}", every))


def goodput_tables(report, title, out, goals):
    """The points of `llm_decode goodput --json`, each search's goodput, and the
    continuous (best) / static ratio per mix over the repeats."""
    slo = report["slo"]
    out.append(f"### Goodput under the SLO{title}: TTFT p99 <= {slo['ttft_p99_ms']:g} ms, TPOT p99 <= "
               f"{slo['tpot_p99_ms']:.3f} ms ({slo['tpot_factor']:g}x the batch-1 step of "
               f"{report['batch1_step_ms']:.3f} ms); at least {report['requests']} requests per point, "
               f"{report['repeats']} repeat(s)" + ("" if report.get("complete") else " (INCOMPLETE: the budget ended it)"))
    out.append("")
    out.append("| repeat | outputs | batching | offered req/s | TTFT p99 ms | TPOT p99 ms | finished | | s |")
    out.append("|---:|---|---|---:|---:|---:|---:|---|---:|")
    for r in report["rows"]:
        out.append(f"| {r['repeat']} | {r['mix']} | {r['batching']} | {r['offered_rps']:.0f} | {r['ttft_p99_ms']:.1f} | "
                   f"{r['tpot_p99_ms']:.3f} | {r['finished']}/{r['requests']} | {'pass' if r['passed'] else 'FAIL'} | "
                   f"{r['seconds']:.1f} |")
    out.append("")
    out.append("| repeat | outputs | batching | goodput req/s | bound | lowest failing req/s |")
    out.append("|---:|---|---|---:|---|---:|")
    for s in report["searches"]:
        failing = s.get("lowest_failing_rps")
        out.append(f"| {s['repeat']} | {s['mix']} | {s['batching']} | {s['goodput_rps']:.0f} | {s['bound']} | "
                   f"{'—' if failing is None else f'{failing:.0f}'} |")
    out.append("")
    for mix, spread in report.get("spread", {}).items():
        for policy, s in spread.items():
            if policy in ("ratio", "ratio_unknown_repeats"):
                continue
            out.append(f"- {mix}, {policy}: goodput min / median / max {s['min_rps']:.0f} / {s['median_rps']:.0f} / "
                       f"{s['max_rps']:.0f} req/s over {s['repeats']} repeat(s), bounds {s['bounds']}")
        if "ratio" in spread:
            r = spread["ratio"]
            kinds = sorted({x["ratio_kind"] for x in report["ratios"] if x["mix"] == mix})
            goals.append((f"goodput, continuous (best policy) / static, outputs {report['mixes'].get(mix, mix)}: "
                          f"median of {r['repeats']} (min {r['min']:.2f}, max {r['max']:.2f}; {', '.join(kinds)})",
                          r["median"], f">= {report['target']:g} in every repeat", r["target_met_every_repeat"]))
        bound = report.get("bounds", {}).get(mix)
        if bound:
            bound_goal(mix, bound, [x for x in report["ratios"] if x["mix"] == mix], "repeat", out, goals)
        if spread.get("ratio_unknown_repeats"):
            # Both goodputs below the search's floor (or both at its ceiling):
            # no value, so not shown rather than averaged in.
            goals.append((f"goodput, continuous (best policy) / static, outputs {report['mixes'].get(mix, mix)}: "
                          f"unknown in {spread['ratio_unknown_repeats']} repeat(s) (both below --min-rate, or both "
                          f"at --max-rate)", None, f">= {report['target']:g} in every repeat", False))
    out.append("")


def resolution_bracket(ratio, searches):
    """The continuous (best) / static ratio's bracket from the searches'
    resolution: a goodput is the highest passing rate and the truth lies below
    the lowest failing one, so the true ratio lies between continuous / static's
    lowest failing rate and continuous's lowest failing rate / static. None for
    a side that has no failing rate (a search that reached its ceiling); a
    static search that passed nothing makes the ratio a lower bound (high None)."""
    def search(batching):
        return next((s for s in searches if s["repeat"] == ratio["repeat"] and s["mix"] == ratio["mix"]
                     and s["batching"] == batching), None)
    c, st = search(ratio["best_continuous"]), search("static")
    if c is None or st is None:
        return None, None
    c_fail, st_fail = c.get("lowest_failing_rps"), st.get("lowest_failing_rps")
    if st["bound"] == "below":
        return ratio["ratio"], None
    low = c["goodput_rps"] / st_fail if st_fail else None
    high = c_fail / st["goodput_rps"] if c_fail and st["goodput_rps"] > 0 else None
    return low, high


def goodput_across_runs(reports, paths, out, goals):
    """Several `llm_decode goodput --json` runs (other hosts, seeds or days):
    every repeat's continuous (best) / static ratio with its resolution
    bracket, and the spread over all of them, per mix."""
    out.append(f"### Goodput across {len(reports)} runs")
    out.append("")
    out.append("| run | repeat | outputs | TPOT p99 limit ms | best continuous | req/s | static req/s | ratio | kind | "
               "bracket from the resolution |")
    out.append("|---|---:|---|---:|---|---:|---:|---:|---|---|")
    by_mix = {}
    for path, report in zip(paths, reports):
        for r in report["ratios"]:
            low, high = resolution_bracket(r, report["searches"])
            bracket = ("—" if low is None and high is None else
                       f"{low:.2f} to {'unbounded' if high is None else f'{high:.2f}'}" if low is not None else
                       f"up to {high:.2f}")
            static = (f"below {r['static_rps']:.0f}" if r["static_bound"] == "below" else f"{r['static_rps']:.0f}")
            value = r.get("ratio")
            out.append(f"| {path} | {r['repeat']} | {r['mix']} | {report['slo']['tpot_p99_ms']:.3f} | "
                       f"{r.get('best_continuous', '—')} | {r['continuous_rps']:.0f} | {static} | "
                       f"{'unknown' if value is None or r['ratio_kind'] == 'unknown' else f'{value:.2f}'} | "
                       f"{r['ratio_kind']} | {bracket} |")
            by_mix.setdefault(r["mix"], []).append((r, low, report["target"]))
    out.append("")
    for mix, entries in by_mix.items():
        known = sorted(r["ratio"] for r, _, _ in entries if r["ratio_kind"] != "unknown" and r.get("ratio") is not None)
        target = entries[0][2]
        every = all(r.get("target_met") for r, _, _ in entries)
        beyond = all(low is not None and low >= target for _, low, _ in entries)
        if known:
            median = statistics.median(known)
            kinds = sorted({r["ratio_kind"] for r, _, _ in entries})
            out.append(f"- {mix}: continuous (best) / static min / median / max {known[0]:.2f} / {median:.2f} / "
                       f"{known[-1]:.2f} over {len(known)} of {len(entries)} repeat(s) ({', '.join(kinds)}); "
                       f">= {target:g} in every one: {'yes' if every else 'no'}; beyond the search's resolution "
                       f"in every one: {'yes' if beyond else 'no'}")
            goals.append((f"goodput across {len(reports)} runs, continuous (best policy) / static, outputs {mix}: median "
                          f"of {len(known)} (min {known[0]:.2f}, max {known[-1]:.2f}; {', '.join(kinds)})", median,
                          f">= {target:g} in every run", every))
        else:
            out.append(f"- {mix}: the ratio is unknown in every repeat")
        bounds = [report.get("bounds", {}).get(mix) for report in reports]
        if all(bounds) and len({(b["rows"], round(b["ratio"], 6)) for b in bounds}) == 1:
            bound_goal(mix, bounds[0], [r for r, _, _ in entries], "run", out, goals)
        elif any(bounds):
            out.append(f"- {mix}: the mix's bound is in {sum(1 for b in bounds if b)} of {len(bounds)} reports, or "
                       f"differs between them: not judged across runs")
    out.append("")


def length_mismatch(cpp, peers, paths):
    """Why the C++ bench and the peers decoded different lengths, or None: a
    step's attention reads more keys later in a sequence, so their ratios are
    only judged at the same prompt and new tokens."""
    if not cpp:
        return None
    def said(value):
        return "not recorded" if value is None else value

    mine = (cpp.get("prompt"), cpp.get("new_tokens"))
    for path, report in zip(paths, peers):
        settings = report.get("settings", {})
        theirs = (settings.get("prompt_len"), settings.get("new_tokens"))
        if None in mine or None in theirs or mine != theirs:
            return (f"the C++ bench decoded prompt {said(mine[0])}, new tokens {said(mine[1])}; the peers ({path}) "
                    f"prompt {said(theirs[0])}, new tokens {said(theirs[1])}: the ratios against the peers are "
                    f"reported, not judged (run both with the same --prompt / --prompt-len and --new-tokens)")
    return None


def ratio(a, b):
    return a / b if b else float("nan")


# The steps judged against the best Python peer, and their targets.
STEP_TARGETS = (("cpp_graphed", "replay", 1.0), ("cpp_graphed_fused", "replay, fused kernels", 1.5))


def lacking_label(lacking):
    """The words a goal carries for the peers that no file measured at its batch."""
    return f"; not measured at this batch: {', '.join(lacking)}" if lacking else ""


def paired_ratios(pairs, title, out, goals, notes):
    """--pair: each peer against the C++ bench of its own run. Peers measured
    in runs of their own (max-autotune compiles for minutes per batch size, so
    a run measures a few batch sizes) are each divided by the C++ step of the
    run that measured them, so that differences between hosts or runs
    stay out of the ratio. Each C++ step (STEP_TARGETS) gets its own ratios
    and goals. A (peer, batch) measured in two runs keeps the first run's. The
    goal at a batch is against the peer with the lowest ratio; it gets no
    verdict where any run with a ratio at that batch decoded other lengths
    than its peers, or where a peer was not measured at that batch in any run
    for a time budget, or was measured only in a run whose bench lacks that
    batch. The runs must be of one model: bench presets and peers' parameter
    counts that differ between runs are refused (SystemExit)."""
    if not pairs:
        return
    presets = {cpp.get("preset") for _, cpp, _, _ in pairs} - {None}
    sizes = {report.get("model", {}).get("parameters") for _, _, _, peers in pairs for report in peers} - {None}
    if len(presets) > 1 or len(sizes) > 1:
        raise SystemExit(f"summarize.py: --pair runs of different models (bench presets {sorted(presets)}, "
                         f"peers' parameters {sorted(sizes)}): give each model's runs a call of its own")
    entries = {}   # (step, peer, batch) -> (peer ms, C++ ms, run)
    unpaired = {}  # peer -> batches measured only where the run's bench lacks them
    skipped = {}   # peer -> batches skipped for a time budget
    unequal = {}   # run -> why its lengths differ
    out.append(f"### Each peer against the C++ step of its own run{title} (--pair)")
    out.append("")
    for run, (cpp_path, cpp, peer_paths, peers) in enumerate(pairs, start=1):
        rows = load_rows(cpp, peers)
        mismatch = length_mismatch(cpp, peers, peer_paths)
        if mismatch:
            unequal[run] = mismatch
        out.append(f"- run {run}: {cpp_path} with {', '.join(peer_paths)}"
                   + (f". **Not the same lengths:** {mismatch}" if mismatch else ""))
        notes.extend(n for n in peer_notes(peers, peer_paths, rows) if n not in notes)
        for peer in PEER_LABELS:
            for batch, (ms, _, _) in sorted(rows.get(peer, {}).items()):
                paired = False
                for step, _, _ in STEP_TARGETS:
                    if batch in rows.get(step, {}):
                        paired = True
                        entries.setdefault((step, peer, batch), (ms, rows[step][batch][0], run))
                if not paired:
                    unpaired.setdefault(peer, set()).add(batch)
                    notes.append(f"run {run}: {peer} at batch {batch} has no C++ row of its run to be set against")
        for peer, batches in out_of_time(peers, rows).items():
            skipped.setdefault(peer, set()).update(batches)
    out.append("")
    if not entries:
        out.append("No peer's batch has a C++ row in its own run.")
        out.append("")
        return
    for step, step_label, target in STEP_TARGETS:
        mine = {key: value for key, value in entries.items() if key[0] == step}
        if not mine:
            continue
        out.append(f"| peer | batch | peer ms | {step_label} ms (its run) | peer / C++ |")
        out.append("|---|---:|---:|---:|---:|")
        order = list(PEER_LABELS)
        for (_, peer, batch), (ms, cpp_ms, run) in sorted(mine.items(), key=lambda e: (e[0][2], order.index(e[0][1]))):
            out.append(f"| {label(peer)} | {batch} | {ms:.3f} | {cpp_ms:.3f} (run {run}) | {ratio(ms, cpp_ms):.3f} |")
        out.append("")
        for batch in sorted({key[2] for key in mine}):
            here = [(ratio(ms, cpp_ms), peer, run) for (_, peer, b), (ms, cpp_ms, run) in mine.items() if b == batch]
            measured = {peer for _, peer, _ in here}
            lacking = [m for m in PEER_LABELS
                       if m not in measured and batch in skipped.get(m, set()) | unpaired.get(m, set())]
            r, peer, run = min(here)
            judged = not lacking and not any(run_of in unequal for _, _, run_of in here)
            goals.append((f"{step_label} / best Python peer ({peer}, run {run}{lacking_label(lacking)}), each against "
                          f"its own run's C++ step, batch {batch}", r, f">= {target:.1f}",
                          r >= target if judged else None))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpp", help="llm_decode bench --json")
    p.add_argument("--peers", nargs="*", default=[])
    p.add_argument("--pair", nargs="+", action="append", metavar="FILE",
                   help="BENCH.json PEERS.json [PEERS.json ...]: these peers against the C++ bench of their own "
                        "run (repeatable; one model per call)")
    p.add_argument("--load", action="append", help="llm_decode load --json (repeatable)")
    p.add_argument("--goodput", action="append", help="llm_decode goodput --json (repeatable)")
    p.add_argument("--name", default="")
    p.add_argument("--markdown")
    args = p.parse_args()
    pairs = []
    for files in args.pair or []:
        if len(files) < 2:
            p.error(f"--pair {' '.join(files)}: takes a C++ bench report, then one or more peers reports")
        pairs.append((files[0], json.load(open(files[0])), files[1:], [json.load(open(f)) for f in files[1:]]))
    cpp = json.load(open(args.cpp)) if args.cpp else {}
    peers = []
    peer_paths = []  # the files that loaded, beside their reports
    notes = []
    for path in args.peers:
        try:
            peers.append(json.load(open(path)))
            peer_paths.append(path)
        except (OSError, ValueError) as e:
            notes.append(f"peers file {path}: {e}")
    rows = load_rows(cpp, peers)
    mismatch = length_mismatch(cpp, peers, peer_paths)
    notes.extend(peer_notes(peers, peer_paths, rows))
    unmeasured = out_of_time(peers, rows)
    batches = sorted({b for m in rows.values() for b in m})
    out = []
    title = f" ({args.name})" if args.name else ""
    if rows:
        out.append(f"### Decode steps{title}: ms per step / tokens per second")
        out.append("")
        out.append("| method | " + " | ".join(f"batch {b}" for b in batches) + " |")
        out.append("|---|" + "---:|" * len(batches))
    order = ["cpp_graphed"] + (["cpp_graphed_fused"] if "cpp_graphed_fused" in rows else []) + sorted(m for m in rows if m.startswith("cpp_graphed_k")) + ["cpp_eager"] + \
        [m for m in PEER_LABELS if m in rows]
    for m in order:
        if m not in rows:
            continue
        cells = []
        for b in batches:
            if b in rows[m]:
                ms, tps, _ = rows[m][b]
                cells.append(f"{ms:.3f} / {tps:,.0f}")
            else:
                cells.append("—")
        out.append(f"| {label(m)} | " + " | ".join(cells) + " |")
    if rows:
        out.append("")

    goals = []
    if mismatch:
        out.append(f"**Not the same lengths:** {mismatch}.")
        out.append("")

    def against_peer(ok):
        """A verdict against a peer: none where the lengths differ."""
        return None if mismatch else ok

    graphed = rows.get("cpp_graphed", {})
    python_peers = [m for m in PEER_LABELS if m in rows]
    for b in batches:
        if b not in graphed:
            continue
        best = max(((rows[m][b][1], m) for m in python_peers if b in rows[m]), default=None)
        if best:
            # A peer that ran out of time here may be the faster one.
            lacking = [m for m in PEER_LABELS if b in unmeasured.get(m, ())]
            for step, step_label, target in STEP_TARGETS:
                if b in rows.get(step, {}):
                    r = ratio(rows[step][b][1], best[0])
                    goals.append((f"{step_label} / best Python peer ({best[1]}{lacking_label(lacking)}), batch {b}", r,
                                  f">= {target:.1f}", None if lacking else against_peer(r >= target)))
    if 1 in graphed:
        for peer, target in (("hf_static", 2.0), ("hf_eager", 10.0)):
            if 1 in rows.get(peer, {}):
                r = ratio(graphed[1][1], rows[peer][1][1])
                goals.append((f"replay / {PEER_LABELS[peer]}, batch 1", r, f">= {target:g}", against_peer(r >= target)))
            elif 1 in unmeasured.get(peer, ()):
                goals.append((f"replay / {PEER_LABELS[peer]}, batch 1: the peer ran out of time", None,
                              f">= {target:g}", None))
        host = graphed[1][2].get("host_fraction")
        if host is not None:
            goals.append(("host time per step / step, batch 1", host, "<= 0.05", host <= 0.05))
        # Reported, not a target: folding K steps into a launch saves at most
        # the host's share of a launch, printed beside the gain.
        for m in sorted(x for x in rows if x.startswith("cpp_graphed_k")):
            if 1 in rows[m]:
                r = ratio(rows[m][1][1], graphed[1][1])
                share = graphed[1][2].get("host_fraction")
                bound = f"reported; host share of a one-step launch {100 * share:.1f}%" if share is not None else "reported"
                goals.append((f"{label(m)} / one step per launch, batch 1", r, bound, None))
    # The step against the memory bandwidth (bench rows carry bytes_per_step
    # and peak_share): the fused step's share of peak at batch 1 (1b: >= 78%),
    # and its batch-64 step against its batch-1 step.
    # (`small`: its batch-1 step <= 0.20 ms on an H100.)
    fused_rows = rows.get("cpp_graphed_fused") or graphed
    preset = cpp.get("preset")
    if preset == "1b" and 1 in fused_rows and fused_rows[1][2].get("peak_share"):
        share = fused_rows[1][2]["peak_share"]
        goals.append(("fused step's share of HBM peak, batch 1", share, ">= 0.78", share >= 0.78))
    if preset == "small" and 1 in fused_rows:
        ms = fused_rows[1][0]
        goals.append(("fused step, ms, batch 1 (the target is an H100's)", ms, "<= 0.20", ms <= 0.20))
    if 1 in fused_rows and 64 in fused_rows:
        r = ratio(fused_rows[64][0], fused_rows[1][0])
        goals.append(("fused step, batch 64 / batch 1 time", r, "<= 1.25", r <= 1.25))
    memory = cpp.get("memory")
    if memory and memory.get("ratio"):
        goals.append(("graph memory, all buckets / the largest alone", memory["ratio"], "<= 1.25",
                      memory["ratio"] <= 1.25))
    capture = cpp.get("capture", {})
    if "cpp_graphed" in capture:
        c = capture["cpp_graphed"]
        threads = capture.get("threads", {})
        out.append(f"Start-up capture of {c['graphs']} graphs: {c['seconds_serial']:.2f} s on one thread"
                   + (f", {threads['seconds']:.2f} s on {threads['threads']} threads" if threads else "")
                   + f"; pool {c['pool_bytes'] / 2**20:.1f} MiB.")
        out.append("")
    for load_path in args.load or []:
        load = json.load(open(load_path))
        per_point = (f"at least {load.get('requests')} requests and {load['seconds']:g} s of arrivals per point"
                     if load.get("seconds") else f"{load.get('requests')} requests per point")
        out.append(f"### Load test{title}: {per_point}, prompts {load.get('prompt_tokens')}, "
                   f"outputs {load.get('new_tokens')} tokens, Poisson arrivals; prefill {load.get('prefill', 'unpadded')}"
                   + (f", grouped: {load['min_admission']} requests or {load['admission_delay_us'] / 1000:g} ms"
                      if "min_admission" in load else "")
                   + (f", chunked: {load['chunk_tokens']} prompt tokens per launch" if "chunk_tokens" in load else "")
                   + (f", chunked-grouped: {load['grouped_chunk_tokens']} prompt tokens per launch, admissions grouped"
                      if "grouped_chunk_tokens" in load else ""))
        out.append("")
        out.append("| batching | offered req/s | done req/s | tokens/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | finished |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        by = {}
        for r in load["rows"]:
            by[(r["batching"], r["offered_rps"])] = r
            out.append(f"| {r['batching']} | {r['offered_rps']:g} | {r['completed_rps']:.1f} | {r['tokens_per_s']:,.0f} | "
                       f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | {r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f} | "
                       f"{r['finished']}/{r['requests']} |")
        out.append("")
        rates = sorted({rate for _, rate in by})
        for policy in ("continuous", "grouped", "chunked", "chunked-grouped"):
            for rate in rates:
                c, s = by.get((policy, rate)), by.get(("static", rate))
                if c and s:
                    # Throughput at one offered rate is reported; the serving
                    # goal is goodput under the SLO (`llm_decode goodput`).
                    r = ratio(c["tokens_per_s"], s["tokens_per_s"])
                    goals.append((f"{policy} / static throughput at {rate:g} req/s offered, outputs {load.get('new_tokens')} "
                                  f"(TPOT p99 {c['tpot_p99_ms']:.2f} vs {s['tpot_p99_ms']:.2f} ms)", r,
                                  "reported", None))
    goodput_reports = [json.load(open(path)) for path in args.goodput or []]
    for report in goodput_reports:
        goodput_tables(report, title, out, goals)
    if len(goodput_reports) > 1:
        goodput_across_runs(goodput_reports, args.goodput, out, goals)
    paired_ratios(pairs, title, out, goals, notes)
    out.append(f"### Goals{title}")
    out.append("")
    out.append("| goal | measured | target | |")
    out.append("|---|---:|---|---|")
    for name, value, target, ok in goals:
        verdict = "" if ok is None else ("met" if ok else "MISSED")
        out.append(f"| {name} | {'unknown' if value is None else f'{value:.3f}'} | {target} | {verdict} |")
    if notes:
        out.append("")
        out.extend(f"- {n}" for n in notes)
    text = "\n".join(out)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
