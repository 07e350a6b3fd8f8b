"""The convergence suite (integration/pytorch/convergence) end to end at a
tiny horizon: plain DDP on "gloo" per algorithm, compression from the
environment only, a table, JSON and PNG; dense is plain Gloo (no stats
file), compressed runs report their ratio from COMPCOLL_STATS_FILE, over the
whole run and over its last tenth (after a 2-step warm-up here)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, base_env

pytestmark = pytest.mark.end_to_end  # conftest.py says what that means

RUN = os.path.join(REPO, "integration", "pytorch", "convergence", "run.py")


def test_suite_runs_and_reports(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, RUN, "--tasks", "mixed", "--algos", "dense,jitter,dgc", "--ranks", "2",
           "--short", "3", "--long", "6", "--out", str(out), "--run-timeout", "240",
           "--env", "COMPCOLL_WARMUP_STEPS=2"]
    proc = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["algo"] for r in rows] == ["dense", "jitter", "dgc"]
    dense, jitter, dgc = rows
    # The control: plain Gloo (no compcoll, no stats file) from weights
    # scaled by 1 + 1e-6, compared with dense like an algorithm; after 6
    # steps it has moved, but by about that much.
    assert jitter["ratio"] == 1.0 and jitter["compressed_calls"] == 0, jitter
    assert not (out / "runs" / "mixed" / "jitter" / "stats0.json").exists()
    curves = {c["algo"]: c["curve"] for c in json.loads((out / "curves.json").read_text())}
    assert curves["jitter"] != curves["dense"], curves
    assert abs(jitter["long"]["loss_vs_dense_pct"]) < 0.01, jitter
    assert dense["ratio"] == 1.0 and dense["compressed_calls"] == 0
    # mixed: two compressed buckets and one dense one per step after DDP's rebuild
    assert dgc["compressed_calls"] > 0 and dgc["ratio"] > 2, dgc
    assert dgc["calls"] > dgc["compressed_calls"], dgc
    # Both ratios, labelled: the whole run's (stats file, warm-up included)
    # and the last tenth's (per-call trace lines; here the last of 6 steps,
    # after the warm-up's two steps at 25 %).
    assert dgc["tail_steps"] == 1 and dgc["tail_ratio"] > 1.5 * dgc["ratio"], dgc
    assert dense["tail_ratio"] == 1.0
    # The stats file says what the warm-up decided: the last call's density,
    # dgc's default after the warm-up (COMPCOLL_DENSITY=auto: 12.75 bytes
    # per thousand elements at fp8 + rice, 2.125 an entry: 0.006).
    stats = json.loads((out / "runs" / "mixed" / "dgc" / "stats0.json").read_text())
    assert 0.0055 < stats["last_density"] < 0.0065, stats
    for r in rows:
        assert r["short"]["step"] == 3 and r["long"]["step"] == 6
        assert r["long"]["loss"] > 0 and 0 <= r["long"]["metric"] <= 1
    assert "loss_vs_dense_pct" in dgc["short"]
    # A horizon's held-out figures are the means over its window (5 by
    # default, a fiftieth of the horizon apart, at least a step: 2-6 for the
    # long horizon here, 1-3 for the short); rank 0 evaluated at each.
    evals = json.loads((out / "runs" / "mixed" / "dgc" / "rank0.json").read_text())["evals"]
    assert sorted(map(int, evals)) == [1, 2, 3, 4, 5, 6]
    for h, steps in (("long", [2, 3, 4, 5, 6]), ("short", [1, 2, 3])):
        assert dgc[h]["steps_averaged"] == len(steps)
        assert abs(dgc[h]["loss"] - sum(evals[str(s)]["loss"] for s in steps) / len(steps)) < 1e-12
        assert abs(dgc[h]["metric"] - sum(evals[str(s)]["metric"] for s in steps) / len(steps)) < 1e-12
        assert dgc[h]["loss_at_step"] == evals[str(dgc[h]["step"])]["loss"]
    assert "the mean of 5 evaluations" in (out / "results.md").read_text()
    table = (out / "results.md").read_text()
    assert "| mixed | dgc |" in table and "| ratio, whole run | ratio, last 1 steps |" in table
    assert (out / "loss.png").stat().st_size > 1000
    # Where a gap opens: each run's training loss against dense's, per tenth
    # of the run (6 steps here, so some tenths hold no step).
    bounds = [round(i * 6 / 10) for i in range(11)]
    expected = [None if hi <= lo else
                100 * (sum(curves["dgc"][lo:hi]) - sum(curves["dense"][lo:hi])) / sum(curves["dense"][lo:hi])
                for lo, hi in zip(bounds, bounds[1:])]
    assert len(dgc["train_gap_pct"]) == 10, dgc
    for got, want in zip(dgc["train_gap_pct"], expected):
        assert (got is None and want is None) or abs(got - want) < 1e-9, (dgc["train_gap_pct"], expected)
    assert all(g == 0 for g in dense["train_gap_pct"] if g is not None), dense
    assert "Training loss against dense" in table and "| 5-6 |" in table, table
    # --reuse keeps finished runs of the same settings instead of training again
    again = subprocess.run(cmd + ["--reuse"], env=base_env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "3 runs in 0 s" in again.stdout, again.stdout[-2000:]


def test_suite_over_seeds_reports_mean_and_range(tmp_path):
    """--seeds runs every task and algorithm once per seed, compares each run
    with dense of its own seed and reports the gaps' mean and range, the seeds
    within the issue's bounds, and dense's own spread between seeds."""
    out = tmp_path / "out"
    cmd = [sys.executable, RUN, "--tasks", "mixed", "--algos", "dense,dgc", "--ranks", "2",
           "--short", "3", "--long", "6", "--seeds", "1,2", "--out", str(out), "--run-timeout", "240",
           "--env", "COMPCOLL_WARMUP_STEPS=2"]
    proc = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [(r["seed"], r["algo"]) for r in rows] == [(1, "dense"), (1, "dgc"), (2, "dense"), (2, "dgc")]
    # The seed draws the weights and batches: dense differs between seeds.
    assert rows[0]["long"]["loss"] != rows[2]["long"]["loss"]
    agg = {a["algo"]: a for a in json.loads((out / "across_seeds.json").read_text())}
    dgc_gaps = [r["long"]["loss_vs_dense_pct"] for r in rows if r["algo"] == "dgc"]
    g = agg["dgc"]["long"]
    assert agg["dgc"]["seeds"] == [1, 2] and g["seeds_compared"] == 2
    assert abs(g["gap_mean_pct"] - sum(dgc_gaps) / 2) < 1e-9
    assert (g["gap_min_pct"], g["gap_max_pct"]) == (min(dgc_gaps), max(dgc_gaps))
    assert g["seeds_within_bound"] == sum(x <= 2.0 for x in dgc_gaps)
    dense_losses = [r["long"]["loss"] for r in rows if r["algo"] == "dense"]
    spread = 100 * (max(dense_losses) - min(dense_losses)) / (sum(dense_losses) / 2)
    assert abs(agg["dense"]["long"]["loss_spread_pct"] - spread) < 1e-9
    assert "gap_mean_pct" not in agg["dense"]["long"]
    table = (out / "results.md").read_text()
    assert "seeds 1, 2" in table and "| within 5 % |" in table and "| mixed | dgc | 2 |" in table
    assert (out / "runs" / "mixed" / "dgc" / "seed2" / "stats0.json").exists()
    # A seed named twice is a clear error, before anything runs.
    bad = subprocess.run(cmd[:-2] + ["--seeds", "1,1"], env=base_env(), capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "names a seed twice" in bad.stderr, bad.stderr


REGIMES = os.path.join(REPO, "integration", "pytorch", "convergence", "regimes.py")


def test_regime_detector_reports_where_accordion_would_switch(tmp_path):
    """regimes.py: the norm of each interval's summed gradient, and the
    intervals whose norm changed by eta or more from the previous one."""
    out = tmp_path / "regimes.json"
    cmd = [sys.executable, REGIMES, "--tasks", "mixed", "--steps", "20", "--ranks", "2",
           "--intervals", "2,5", "--eta", "0.1", "--json", str(out)]
    proc = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(r["task"], r["interval"]) for r in runs] == [("mixed", 2), ("mixed", 5)]
    for r in runs:
        n, i = r["norms"], r["interval"]
        assert len(n) == 20 // i and all(x > 0 for x in n)
        expected = [(j + 1) * i for j in range(1, len(n)) if abs(n[j - 1] - n[j]) >= 0.1 * n[j - 1]]
        assert r["critical_ends"] == expected
        assert f"| mixed | 1 | {i} |" in proc.stdout
    bad = subprocess.run(cmd[:2] + ["--tasks", "nope"], env=base_env(), capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "unknown ['nope']" in bad.stderr, bad.stderr
    bad = subprocess.run(cmd[:2] + ["--seeds", "one"], env=base_env(), capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "comma-separated integers" in bad.stderr, bad.stderr
