"""The convergence suite's report: a table (JSON and markdown) and a PNG of
training loss against step. Losses and metrics are rank 0's held-out
evaluation at the short and the long horizon; "vs dense" is the relative
difference of the held-out loss to the dense run of the same task (so +5.0 %
means 5 % higher, i.e. worse, than dense). Two compression ratios: over the
whole run (every call, warm-up included) and over the calls of the last tenth
of the run (the long horizon's steady state).
"""


def _dense_of(results):
    return {r["task"]: r for r in results if r["algo"] == "dense"}


def summary(results):
    """One row per run, with the horizon figures and the gap to dense."""
    dense = _dense_of(results)
    rows = []
    for r in results:
        row = {k: r[k] for k in ("task", "algo", "label", "optimizer", "env", "ranks", "ratio",
                                 "compressed_calls", "calls", "train_s", "wall_s")}
        row["tail_ratio"] = 1.0 if r["algo"] == "dense" else r.get("tail_ratio")
        row["tail_steps"] = r.get("tail_steps", max(1, r["long"] // 10))
        for name, step in (("short", r["short"]), ("long", r["long"])):
            ev = r["evals"][str(step)]
            row[name] = {"step": step, "loss": ev["loss"], "metric": ev["metric"]}
            d = dense.get(r["task"])
            if d is not None:
                dl = d["evals"][str(step)]["loss"]
                row[name]["loss_vs_dense_pct"] = 100.0 * (ev["loss"] - dl) / dl
        rows.append(row)
    return rows


def markdown(results):
    from tasks import TASKS

    rows = summary(results)
    r0 = results[0]
    lines = [f"{r0['ranks']} ranks; short horizon {r0['short']} steps, long {r0['long']} steps; "
             f"optimizer {r0['optimizer']}; configuration `{r0['label']}`" +
             (" (" + " ".join(f"{k}={v}" for k, v in r0["env"].items()) + ")" if r0["env"] else ""),
             "",
             "| task | algo | loss@short | vs dense | metric@short | loss@long | vs dense | "
             f"metric@long | ratio, whole run | ratio, last {max(1, r0['long'] // 10)} steps | train s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        def gap(h):
            g = row[h].get("loss_vs_dense_pct")
            return "" if g is None or row["algo"] == "dense" else f"{g:+.1f} %"
        lines.append(f"| {row['task']} | {row['algo']} | {row['short']['loss']:.4f} | {gap('short')} | "
                     f"{row['short']['metric']:.4f} | {row['long']['loss']:.4f} | {gap('long')} | "
                     f"{row['long']['metric']:.4f} | {row['ratio']:.1f}x | "
                     f"{'-' if row['tail_ratio'] is None else format(row['tail_ratio'], '.1f') + 'x'} | "
                     f"{row['train_s']:.1f} |")
    tasks = sorted({r["task"] for r in results})
    lines += ["", "Metrics: " + "; ".join(f"{t}: {TASKS[t].metric}" for t in tasks) + "."]
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = list(dict.fromkeys(r["task"] for r in results))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for r in results:
            if r["task"] != task:
                continue
            steps = len(r["curve"])
            w = max(1, steps // 40)
            y = np.convolve(r["curve"], np.ones(w) / w, mode="valid")
            tail = r.get("tail_ratio") if r["algo"] != "dense" else None
            label = f"{r['algo']} ({r['ratio']:.0f}x" + (f", late {tail:.0f}x)" if tail else ")")
            ax.plot(np.arange(len(y)) + w, y, label=label,
                    lw=2.0 if r["algo"] == "dense" else 1.0, color="k" if r["algo"] == "dense" else None)
        ax.axvline(results[0]["short"], color="grey", ls=":", lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel(f"training loss (mean of ranks, moving avg of {w})")
        ax.set_yscale("log")
        ax.set_title(task)
        ax.legend(fontsize=8)
    fig.suptitle(f"compcoll convergence suite, {results[0]['ranks']} ranks, DDP on gloo "
                 f"({results[0]['label']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
