"""The GPU benchmarks of integration/bench/gpu (run on a GPU machine by
scripts/run-gpu-checks.sh and docs/gpu.md) on a machine without one: each
says in one line that it needs a CUDA device and exits 1, rather than
failing on an import or a missing device half way. On a GPU machine they
are run for real by run-gpu-checks.sh, not here."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

SCRIPTS = ["staging_cost.py", "ddp_step_time.py", "topk_dgc_baseline.py"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: scripts/run-gpu-checks.sh runs them")
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_gpu_benchmark_without_a_gpu_says_so_in_one_line(script):
    path = os.path.join(REPO, "integration", "bench", "gpu", script)
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "needs a CUDA device" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
