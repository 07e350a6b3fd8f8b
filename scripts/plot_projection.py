#!/usr/bin/env python3
"""Plots `compcoll-bench project --json` output: projected time per call vs
rank count, one panel per link rate, one line per algorithm and sparse
pattern (log-log). Solid lines: allgather pattern and the non-sparse
algorithms; dashed: the scatter pattern; dotted: under the host hierarchy
(one leader per host, "+host"); dash-dotted: sharded ("+shards").

usage: plot_projection.py PROJECTION.json OUT.png [TITLE]
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def label(r):
    return (r["algo"] + ("/" + r["pattern"] if r["pattern"] else "")
            + ("+" + r["hierarchy"] if r.get("hierarchy", "off") != "off" else ""))


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        rows = json.load(f)
    if not rows:
        print("plot_projection.py: no rows", file=sys.stderr)
        return 1
    links = []
    for r in rows:
        if r["link"] not in links:
            links.append(r["link"])
    fig, axes = plt.subplots(1, len(links), figsize=(5.2 * len(links), 4.8), dpi=110,
                             sharey=True, squeeze=False)
    colors = {}
    for ax, link in zip(axes[0], links):
        series = defaultdict(list)
        for r in rows:
            if r["link"] == link:
                series[label(r)].append((r["ranks"], r["time_ms"]))
        for name, points in series.items():
            points.sort()
            algo = name.split("+")[0].split("/")[0]  # one color per algorithm, in every mode
            if algo not in colors:
                colors[algo] = f"C{len(colors)}"
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                    color=colors[algo],
                    linestyle=":" if name.endswith("+host") else "-." if name.endswith("+shards")
                    else "--" if name.endswith("/scatter") else "-",
                    label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_title(f"{link} links")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("projected time per call (ms)")
    axes[0][-1].legend(fontsize=8)
    title = sys.argv[3] if len(sys.argv) > 3 else "compcoll-bench project"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
