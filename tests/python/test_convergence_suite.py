"""The convergence suite (integration/pytorch/convergence) end to end at a
tiny horizon: plain DDP on "gloo" per algorithm, compression from the
environment only, a table, JSON and PNG; dense is plain Gloo (no stats
file), compressed runs report their ratio from COMPCOLL_STATS_FILE, over the
whole run and over its last tenth (after a 2-step warm-up here)."""
import json
import os
import subprocess
import sys

from conftest import REPO, base_env

RUN = os.path.join(REPO, "integration", "pytorch", "convergence", "run.py")


def test_suite_runs_and_reports(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, RUN, "--tasks", "mixed", "--algos", "dense,dgc", "--ranks", "2",
           "--short", "3", "--long", "6", "--out", str(out), "--run-timeout", "240",
           "--env", "COMPCOLL_WARMUP_STEPS=2"]
    proc = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["algo"] for r in rows] == ["dense", "dgc"]
    dense, dgc = rows
    assert dense["ratio"] == 1.0 and dense["compressed_calls"] == 0
    # mixed: two compressed buckets and one dense one per step after DDP's rebuild
    assert dgc["compressed_calls"] > 0 and dgc["ratio"] > 2, dgc
    assert dgc["calls"] > dgc["compressed_calls"], dgc
    # Both ratios, labelled: the whole run's (stats file, warm-up included)
    # and the last tenth's (per-call trace lines; here the last of 6 steps,
    # after the warm-up's two steps at 25 %).
    assert dgc["tail_steps"] == 1 and dgc["tail_ratio"] > 1.5 * dgc["ratio"], dgc
    assert dense["tail_ratio"] == 1.0
    # The stats file says what the warm-up decided: the last call's density.
    stats = json.loads((out / "runs" / "mixed" / "dgc" / "stats0.json").read_text())
    assert 0.0005 < stats["last_density"] < 0.002, stats
    for r in rows:
        assert r["short"]["step"] == 3 and r["long"]["step"] == 6
        assert r["long"]["loss"] > 0 and 0 <= r["long"]["metric"] <= 1
    assert "loss_vs_dense_pct" in dgc["short"]
    table = (out / "results.md").read_text()
    assert "| mixed | dgc |" in table and "| ratio, whole run | ratio, last 1 steps |" in table
    assert (out / "loss.png").stat().st_size > 1000
    # --reuse keeps finished runs of the same settings instead of training again
    again = subprocess.run(cmd + ["--reuse"], env=base_env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "2 runs in 0 s" in again.stdout, again.stdout[-2000:]
