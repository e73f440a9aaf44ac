#!/usr/bin/env python3
"""Plots `llm_decode load --json` (continuous, grouped, chunked, chunked-grouped and static batching):
throughput, p99 time per output token and p99 time to first token against the
offered load.

    python3 bench/llm_decode/plot_load.py LOAD.json OUT.png [--title TEXT]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("load")
    p.add_argument("out")
    p.add_argument("--title", default="")
    args = p.parse_args()
    rows = json.load(open(args.load))["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    styles = {"continuous": "o-", "grouped": "^-", "chunked": "D-", "chunked-grouped": "v-", "static": "s--"}
    for batching in [b for b in styles if any(r["batching"] == b for r in rows)]:
        style = styles[batching]
        pts = sorted((r for r in rows if r["batching"] == batching), key=lambda r: r["offered_rps"])
        x = [r["offered_rps"] for r in pts]
        axes[0].plot(x, [r["tokens_per_s"] for r in pts], style, label=batching)
        (p99,) = axes[1].plot(x, [r["tpot_p99_ms"] for r in pts], style, label=batching)
        axes[1].plot(x, [r["tpot_p50_ms"] for r in pts], style, color=p99.get_color(), alpha=0.4,
                     label=f"{batching} (p50)")
        axes[2].plot(x, [r["ttft_p99_ms"] for r in pts], style, label=batching)
    axes[0].set_ylabel("generated tokens/s")
    axes[1].set_ylabel("time per output token, ms (p99; faint: p50)")
    axes[2].set_ylabel("time to first token p99, ms")
    rates = sorted({r["offered_rps"] for r in rows})
    for ax in axes:
        ax.set_xlabel("offered load, requests/s (Poisson)")
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[2].set_yscale("log")
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
