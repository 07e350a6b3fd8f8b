#!/usr/bin/env python3
"""Plots compcoll-bench allreduce results: time vs message size, one line per
algorithm (log-log), from the JSON list the benchmark prints with --json.

usage: plot_bench.py RESULTS.json OUT.png [TITLE]
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        results = json.load(f)
    series = defaultdict(list)
    for r in results:
        # Rows behind the host hierarchy (--hierarchy off,host) are their own series.
        label = r["algo"] if r.get("hierarchy", "off") == "off" else f'{r["algo"]}+{r["hierarchy"]}'
        series[label].append((r["count"] * 4, r["time_ms"]))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for algo, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=algo,
                linewidth=2.5 if algo == "auto" else 1.5,
                linestyle="--" if algo == "auto" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes, float32)")
    ax.set_ylabel("allreduce time (ms, median of the slowest rank)")
    ranks = results[0]["ranks"] if results else 0
    title = sys.argv[3] if len(sys.argv) > 3 else f"compcoll-bench allreduce, {ranks} ranks"
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
