"""What the GPU benchmarks of this directory share: each row runs in a child
process of its own (LD_PRELOAD and COMPCOLL_* are read when a process or a
group starts), which prints one JSON line last, and may leave a compcoll
stats file behind."""
import json
import os
import subprocess


def run_row(argv, env, stats_path, row, error_lines=1, timeout=600):
    """Runs argv with env. On failure sets row["error"] to the last
    error_lines of its stderr and returns None; otherwise returns its last
    JSON line as a dict, and copies compressed_calls and calls from the
    stats file at stats_path into row when it exists (returning the whole
    stats under the key "stats" of the result, for rows that want more)."""
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        row["error"] = r.stderr.strip().splitlines()[-error_lines:] or [f"exit {r.returncode}"]
        return None
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stats"] = None
    if stats_path and os.path.exists(stats_path):
        with open(stats_path) as f:
            out["stats"] = json.load(f)
        row["compressed_calls"] = out["stats"].get("compressed_calls")
        row["calls"] = out["stats"].get("calls")
    return out
