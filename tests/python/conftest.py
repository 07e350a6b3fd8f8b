"""Shared helpers for the compcoll PyTorch tests.

Multi-rank tests start one plain Python process per rank (as torchrun would:
RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), so every rank imports
torch with the environment under test (COMPCOLL_ALGO decides at `import
torch` whether the gloo hook is installed). Gloo is kept on the loopback
interface. Every run has a deadline; on expiry every process it started is
killed and the test fails with their output.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "integration", "pytorch", "examples")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "end_to_end: a whole user job (an example, the convergence suite, a launcher, a "
        "wheel install, a long accuracy run). Its compcoll calls are the ones the API tests "
        "make, repeated for many steps, so the sanitized run (scripts/run-sanitizers.sh "
        "python) leaves it out with -m 'not end_to_end'; every other run includes it.")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(extra=None):
    """The test environment: no COMPCOLL_* or torchrun variables leak in from
    the caller; Gloo on loopback; one thread per rank (2 cores)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("COMPCOLL_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                          "MASTER_ADDR", "MASTER_PORT",
                                                          "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # The tests check compression's steady state (ratios, exact codec output)
    # in a few steps: no warm-up unless a test asks for one (the default's
    # steps of higher density are the convergence suite's business).
    env["COMPCOLL_WARMUP_STEPS"] = "0"
    env.update(extra or {})
    return {k: v for k, v in env.items() if v is not None}  # None: leave that variable out


# Workers that allreduce tensors themselves, outside a backward pass, and
# check that compcoll compresses them, as a script's own loop over .grad
# does: by default (COMPCOLL_TORCH_SCOPE=backward) only what is issued in a
# backward pass is compressed (test_scope.py tests that default; DDP and
# its hooks run under it everywhere else).
DIRECT_CALLS = {"COMPCOLL_TORCH_SCOPE": "all"}


class RankResult:
    def __init__(self, rank, returncode, stdout, stderr):
        self.rank, self.returncode, self.stdout, self.stderr = rank, returncode, stdout, stderr

    @property
    def results(self):
        """Objects printed by the worker as 'RESULT <json>' lines."""
        return [json.loads(line[len("RESULT "):]) for line in self.stdout.splitlines()
                if line.startswith("RESULT ")]

    @property
    def result(self):
        r = self.results
        assert r, f"rank {self.rank} printed no RESULT line\n{self.describe()}"
        return r[-1]

    def describe(self):
        return (f"--- rank {self.rank} exit {self.returncode}\n--- stdout:\n{self.stdout[-4000:]}"
                f"\n--- stderr:\n{self.stderr[-6000:]}")


def launch(args, nranks, env=None, timeout=180, check=True, cwd=None, rank_env=None):
    """Runs `python3 <args>` as nranks processes (torchrun-style env) and
    returns their RankResults, rank order. rank_env: a list of one more
    environment per rank, on top of env (ranks that disagree)."""
    port = free_port()
    procs = []
    for rank in range(nranks):
        e = base_env(dict(env or {}, **(rank_env[rank] if rank_env else {})))
        e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nranks),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable] + list(args), env=e, cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return collect(procs, timeout, check)


def launch_direct(args, nranks, env=None, **kwargs):
    """launch() for workers that allreduce outside a backward pass and expect
    compression (DIRECT_CALLS)."""
    return launch(args, nranks, env=dict(DIRECT_CALLS, **(env or {})), **kwargs)


def run_single(args, env=None, timeout=300, check=True, cwd=None):
    """Runs one command (a launcher such as torchrun or an example)."""
    proc = subprocess.Popen(args, env=base_env(env), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return collect([proc], timeout, check)[0]


def collect(procs, timeout, check):
    deadline = time.monotonic() + timeout
    outs = [None] * len(procs)
    timed_out = False
    for i, p in enumerate(procs):
        try:
            outs[i] = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:  # only the processes this helper started
            if p.poll() is None:
                p.kill()
        for i, p in enumerate(procs):
            if outs[i] is None:
                try:
                    outs[i] = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    outs[i] = ("", "(no output: process did not exit after kill)")
    results = [RankResult(i, p.returncode, *outs[i]) for i, p in enumerate(procs)]
    if timed_out:
        pytest.fail(f"ranks did not finish within {timeout} s\n" +
                    "\n".join(r.describe() for r in results))
    if check:
        bad = [r for r in results if r.returncode != 0]
        if bad:
            pytest.fail("a rank failed\n" + "\n".join(r.describe() for r in results))
    return results


def worker(name):
    return os.path.join(WORKERS, name)


@pytest.fixture(scope="session")
def compcoll_ext():
    """The installed extension (the tests exercise the installed package)."""
    import compcoll  # noqa: F401
    from compcoll import _C

    return _C
