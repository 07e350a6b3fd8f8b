"""Activation without code change: an unmodified DDP script that asks for
"gloo" gets compcoll when COMPCOLL_ALGO is set (torch's backend autoload, or
`python -m compcoll.run`), and plain Gloo otherwise."""
import json
import os
import time
import re
import shutil
import sys

import pytest
import torch

from conftest import REPO, launch, run_single, worker

pytestmark = pytest.mark.end_to_end  # conftest.py says what that means

SCRIPT = worker("plain_ddp.py")


def launch_plain(args, n, env):
    """For runs without compcoll: torch 2.15's own Gloo teardown occasionally
    aborts a rank at exit ("terminate called without an active exception")
    after the script has finished; what the script reported is what counts."""
    ranks = launch(args, n, env=env, check=False)
    for r in ranks:
        assert r.results, r.describe()
    return ranks


def stats_files(tmp_path, n):
    return [os.path.join(tmp_path, f"stats{r}.json") for r in range(n)]


def read_stats(tmp_path, n):
    out = []
    for p in stats_files(tmp_path, n):
        with open(p) as f:
            out.append(json.load(f))
    return out


def test_compcoll_algo_turns_gloo_into_compcoll(tmp_path):
    # Two settings the backend takes from the process group instead: each
    # rank says once that they change nothing.
    # The variables the backend does not read are neither read nor refused,
    # even with values other front ends would refuse (a rank outside the
    # world, a rendezvous that is no address), and the interposer's library.
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json"),
           "COMPCOLL_TIMEOUT_MS": "5000", "COMPCOLL_IFACE": "lo", "COMPCOLL_RANK": "5",
           "COMPCOLL_RENDEZVOUS": "/tmp/x", "COMPCOLL_NCCL_LIBRARY": "/nope.so"}
    ranks = launch([SCRIPT], 2, env=env)
    for r in ranks:
        assert r.result["backend"] == "gloo"  # what the script asked for and sees
        assert r.result["cpu_backend"] == "compcoll"
        for said in ("COMPCOLL_TIMEOUT_MS=5000 changes nothing for the PyTorch backend's groups: "
                     "every operation's limit is the process group's timeout",
                     "COMPCOLL_IFACE=lo changes nothing for the PyTorch backend's groups: the "
                     "process group gives",
                     "COMPCOLL_RANK=5 changes nothing for the PyTorch backend's groups",
                     "COMPCOLL_RENDEZVOUS=/tmp/x changes nothing for the PyTorch backend's groups",
                     "COMPCOLL_NCCL_LIBRARY=/nope.so changes nothing for the PyTorch backend's "
                     "groups: only the NCCL interposer loads NCCL itself"):
            assert r.stderr.count(said) == 1, r.describe()
    for st in read_stats(tmp_path, 2):
        assert st["algo"] == "dgc" and st["compressed_calls"] > 0, st
        print("stats:", st)


def test_the_compcoll_backend_without_an_algorithm_says_it_runs_exact():
    """init_process_group("compcoll") with COMPCOLL_ALGO unset ran every
    allreduce exact without a word: the script asked for compcoll by name.
    Now rank 0 says so once at WARN; COMPCOLL_ALGO=dense (exact meant) is
    not warned about."""
    said = 'init_process_group("compcoll") with COMPCOLL_ALGO unset: every allreduce runs exact'
    for env, warned in (({}, True), ({"COMPCOLL_ALGO": "dense"}, False)):
        ranks = launch([worker("named_backend.py")], 2, env=env)
        for r in ranks:
            assert r.result["algo"] == "dense" and r.result["sum"] == 3.0, r.result
            assert r.stderr.count(said) == (1 if warned and r.rank == 0 else 0), r.describe()


def test_a_stats_file_without_rank_is_said_to_keep_one_rank(tmp_path):
    """Every process writes its own stats file: without {rank} in the name
    the ranks write one file and it keeps the last to finish, which the
    PyTorch backend never said (the C API's communicator does). Now the
    job's rank 0 says it once at WARN."""
    path = tmp_path / "stats.json"
    ranks = launch([SCRIPT], 2, env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATS_FILE": str(path)})
    said = f"COMPCOLL_STATS_FILE={path} has no {{rank}}: all 2 ranks write that one file"
    for r in ranks:
        assert r.stderr.count(said) == (1 if r.rank == 0 else 0), r.describe()
    assert json.loads(path.read_text())["compressed_calls"] > 0


def test_a_stats_file_that_cannot_be_written_fails_at_init_not_at_exit(tmp_path):
    """COMPCOLL_STATS_FILE inside a regular file: every rank fails when the
    group is created, naming each rank's path and why, before any training
    step, instead of warning after the run that its stats are lost."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATS_FILE": str(blocker / "stats{rank}.json")}
    ranks = launch([SCRIPT], 2, env=env, check=False)
    for r in ranks:
        assert r.returncode != 0 and not r.results, r.describe()
        assert "COMPCOLL_STATS_FILE cannot be written: " in r.stderr, r.describe()
        for rank in range(2):
            assert (f"rank {rank}: {blocker / f'stats{rank}.json'}: cannot create its directory "
                    f"{blocker}") in r.stderr, r.describe()


OFF_NOTICE = "compcoll WARN [rank 0] {algo}, so compcoll is off and this 'gloo' group is torch's own: "


def notices(r):
    return [line for line in r.stderr.splitlines() if line.startswith("compcoll WARN")]


@pytest.mark.parametrize("algo", ["dgc", "auto"])
def test_a_lone_rank_hears_that_compression_saves_nothing(algo):
    """torchrun --nproc-per-node 1 with COMPCOLL_ALGO=dgc: no allreduce
    crosses a link, so compression only changes the results. It still runs
    (a one-rank preview of training under it), and rank 0 says so once.
    auto stays exact on a lone rank and says nothing."""
    r = launch([worker("plain_ddp.py")], 1, env={"COMPCOLL_ALGO": algo})[0]
    said = [ln for ln in notices(r) if "world size 1" in ln]
    if algo == "auto":
        assert said == [], r.describe()
    else:
        assert len(said) == 1 and "COMPCOLL_ALGO=dgc saves nothing" in said[0], r.describe()
        assert "COMPCOLL_ALGO=auto keeps a lone rank exact" in said[0], said


def test_unset_means_plain_gloo(tmp_path):
    """Plain Gloo; the settings given without COMPCOLL_ALGO are named once,
    on rank 0, not silently ignored."""
    env = {"COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json")}
    ranks = launch_plain([SCRIPT], 2, env)
    for r in ranks:
        assert r.result["cpu_backend"] == "gloo"
    assert not any(os.path.exists(p) for p in stats_files(tmp_path, 2))
    said = notices(ranks[0])
    assert len(said) == 1 and said[0].startswith(OFF_NOTICE.format(algo="COMPCOLL_ALGO is unset")), \
        ranks[0].describe()
    for name in ("COMPCOLL_STATS_FILE=", "COMPCOLL_WARMUP_STEPS=0", "change nothing",
                 "set COMPCOLL_ALGO to one of dgc"):
        assert name in said[0], said[0]
    assert notices(ranks[1]) == [], ranks[1].describe()


def test_nothing_set_means_nothing_imported(tmp_path):
    """No COMPCOLL_* variable at all: the autoload imports nothing and
    nothing is said: torch behaves as without compcoll."""
    ranks = launch_plain([SCRIPT], 2, {"COMPCOLL_WARMUP_STEPS": None})
    for r in ranks:
        assert r.result["cpu_backend"] == "gloo"
        assert not r.result["compcoll_imported"], r.describe()
        assert "compcoll" not in r.stderr, r.describe()


def test_compcoll_algo_set_by_the_script_after_import_torch_works_too(tmp_path):
    """A script that sets COMPCOLL_ALGO in os.environ after `import torch`
    (as scripts set MASTER_ADDR) gets compcoll all the same: the autoload,
    which found nothing at `import torch`, reads the environment again as
    each group is created. Settings set that way are named when compcoll is
    off, as settings from the launcher are."""
    late = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json")}
    ranks = launch([SCRIPT], 2, env={"COMPCOLL_WARMUP_STEPS": None,
                                     "SCRIPT_SETS_ENV": json.dumps(late)})
    for r in ranks:
        assert r.result["cpu_backend"] == "compcoll" and r.result["backend"] == "gloo", r.describe()
    for st in read_stats(tmp_path, 2):
        assert st["algo"] == "dgc" and st["compressed_calls"] > 0, st
    ranks = launch_plain([SCRIPT], 2, {"COMPCOLL_WARMUP_STEPS": None,
                                       "SCRIPT_SETS_ENV": json.dumps({"COMPCOLL_DENSITY": "0.01"})})
    assert all(r.result["cpu_backend"] == "gloo" for r in ranks)
    said = notices(ranks[0])
    assert len(said) == 1 and said[0].startswith(OFF_NOTICE.format(algo="COMPCOLL_ALGO is unset")) \
        and "COMPCOLL_DENSITY=0.01" in said[0], ranks[0].describe()
    assert not notices(ranks[1]), ranks[1].describe()


@pytest.mark.parametrize("cleared", ["", "dense"])
def test_compcoll_algo_cleared_by_the_script_means_plain_gloo(cleared):
    """The reverse: COMPCOLL_ALGO set at `import torch` (the hook goes in)
    and cleared by the script before init_process_group (a second phase of
    training, say): the group is torch's own Gloo, as with no COMPCOLL_ALGO
    from the start. It was a compcoll backend running every allreduce exact."""
    # torch's own Gloo: its exit race applies (launch_plain).
    ranks = launch_plain([SCRIPT], 2, {"COMPCOLL_ALGO": "dgc",
                                       "SCRIPT_SETS_ENV": json.dumps({"COMPCOLL_ALGO": cleared})})
    for r in ranks:
        assert r.result["cpu_backend"] == "gloo", r.describe()


def test_a_mistyped_compcoll_algo_is_named(tmp_path):
    ranks = launch_plain([SCRIPT], 2, {"COMPCOLL_ALGORITHM": "dgc"})
    assert all(r.result["cpu_backend"] == "gloo" for r in ranks)
    said = notices(ranks[0])
    assert len(said) == 1 and "COMPCOLL_ALGORITHM=dgc" in said[0], ranks[0].describe()
    assert "COMPCOLL_ALGORITHM is not a compcoll variable and is ignored; did you mean " \
        "COMPCOLL_ALGO?" in said[0], said[0]


def test_dense_means_plain_gloo(tmp_path):
    env = {"COMPCOLL_ALGO": "dense", "COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json")}
    ranks = launch_plain([SCRIPT], 2, env)
    for r in ranks:
        assert r.result["cpu_backend"] == "gloo"
    assert not any(os.path.exists(p) for p in stats_files(tmp_path, 2))
    said = notices(ranks[0])
    assert len(said) == 1 and said[0].startswith(OFF_NOTICE.format(algo="COMPCOLL_ALGO=dense")), \
        ranks[0].describe()


NCCL_NOTICE = "this group's cuda tensors go to torch's NCCL backend, which it leaves as it is"


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="torch without NCCL")
def test_an_nccl_group_is_told_that_its_cuda_tensors_are_not_compressed(tmp_path):
    """COMPCOLL_ALGO turns "gloo" into compcoll, not "nccl": a GPU script's
    init_process_group("nccl") hears so once, on rank 0, as the group is
    created, instead of training uncompressed without a word. Without a GPU
    torch then refuses the group; with one it runs as it would."""
    r = launch([worker("nccl_group.py")], 1, env={"COMPCOLL_ALGO": "dgc"}, check=False)[0]
    said = notices(r)
    assert len(said) == 1 and NCCL_NOTICE in said[0], r.describe()
    assert 'init_process_group("compcoll")' in said[0] and "LD_PRELOAD=libcompcoll_nccl.so" in said[0]
    if torch.cuda.is_available():
        assert r.returncode == 0 and r.result["first"] == 1.0, r.describe()
    else:
        assert r.returncode != 0 and "CUDA" in r.stderr, r.describe()
    # The NCCL interposer, preloaded, compresses torch's NCCL allreduces itself.
    interposer = os.path.join(REPO, "build", "plugin", "nccl_interposer", "libcompcoll_nccl.so")
    if os.path.exists(interposer):
        # After whatever is preloaded already (the ASan runtime in the sanitizer run).
        preload = ":".join(p for p in (os.environ.get("LD_PRELOAD"), interposer) if p)
        r = launch([worker("nccl_group.py")], 1, check=False,
                   env={"COMPCOLL_ALGO": "dgc", "LD_PRELOAD": preload})[0]
        assert NCCL_NOTICE not in r.stderr, r.describe()


def test_a_script_that_turns_compcoll_on_itself_hears_what_is_true_then(tmp_path):
    """At `import torch` only COMPCOLL_DENSITY is set, so compcoll is off and
    arranges the off notice. The script then sets COMPCOLL_ALGO and installs
    the gloo hook itself: its NCCL group hears the NCCL notice, not that
    compcoll is off. With the hook installed but COMPCOLL_ALGO still unset,
    nothing is compressed anywhere, and the NCCL group hears the off notice."""
    on = launch([worker("nccl_group.py")], 1, check=False,
                env={"COMPCOLL_DENSITY": "0.01", "NCCL_GROUP_SETS_ALGO": "dgc"})[0]
    said = notices(on)
    assert len(said) == 1 and "COMPCOLL_ALGO=dgc turns 'gloo' groups into compcoll" in said[0] \
        and NCCL_NOTICE in said[0], on.describe()
    off = launch([worker("nccl_group.py")], 1, check=False,
                 env={"COMPCOLL_DENSITY": "0.01", "NCCL_GROUP_SETS_ALGO": "dense"})[0]
    said = notices(off)
    assert len(said) == 1 and "COMPCOLL_ALGO=dense, so compcoll is off and this 'nccl' group is " \
        "torch's own: " in said[0] and "COMPCOLL_DENSITY=0.01" in said[0], off.describe()


def test_a_rank_without_compcoll_algo_is_named_within_seconds(tmp_path):
    """COMPCOLL_ALGO reached rank 0 but not rank 1 (an environment that did
    not reach every node): rank 1 builds torch's own Gloo, rank 0 compcoll's.
    Rank 0 names rank 1 within seconds instead of waiting out the group's
    timeout (120 s here, 30 minutes by default) and failing on a store key;
    rank 1, whose store host is then gone, fails too. Nobody hangs."""
    ranks = launch([worker("group_or_error.py")], 2, check=False, timeout=100,
                   rank_env=[{"COMPCOLL_ALGO": "dgc"}, {}])
    first = ranks[0].result
    assert "rank 1 is creating it as torch's own gloo, without compcoll, while rank 0 creates it " \
        "with compcoll (COMPCOLL_ALGO=dgc here): COMPCOLL_ALGO (and the backend asked for) must be " \
        "the same on every rank" \
        in first.get("error", ""), ranks[0].describe()
    assert first["seconds"] < 30, first
    assert "error" in ranks[1].result, ranks[1].describe()


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_rank_whose_settings_are_refused_is_named_by_the_others(bad_rank):
    """A value mistyped on one node: that rank's error names the variable,
    and the others name that rank and its error within seconds, instead of
    failing in the configuration exchange with a closed connection that
    names nobody (found by an outside review)."""
    rank_env = [{"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01"} for _ in range(3)]
    rank_env[bad_rank]["COMPCOLL_DENSITY"] = "0.01x"
    ranks = launch([worker("group_or_error.py")], 3, check=False, timeout=100, rank_env=rank_env)
    for r in ranks:
        error = r.result.get("error", "")
        assert "COMPCOLL_DENSITY=0.01x: not a finite number" in error, r.describe()
        if r.rank != bad_rank:
            assert f"rank {bad_rank} cannot create it with compcoll: its COMPCOLL_* settings are " \
                "refused" in error, r.describe()
            assert r.result["seconds"] < 30, r.result


def test_a_rank_without_compcoll_algo_that_hosts_the_store_ends_within_seconds(tmp_path):
    """The other way round: rank 0, which serves the store, lacks
    COMPCOLL_ALGO and builds torch's own Gloo, whose rendezvous nothing can
    interrupt. Rank 1 names rank 0 within seconds (while rank 0's store still
    serves it), then rank 0 says why and ends instead of waiting out the
    group's timeout (120 s here, 30 minutes by default)."""
    started = time.monotonic()
    ranks = launch([worker("group_or_error.py")], 2, check=False, timeout=100,
                   rank_env=[{}, {"COMPCOLL_ALGO": "dgc"}])
    assert time.monotonic() - started < 60, [r.describe() for r in ranks]
    assert "rank 0 is creating it as torch's own gloo, without compcoll, while rank 1 creates " \
        "it with compcoll" in ranks[1].result.get("error", ""), ranks[1].describe()
    assert ranks[0].returncode == 1, ranks[0].describe()
    assert "rank 0 is creating it as torch's own gloo (COMPCOLL_ALGO unset or dense here), " \
        "while rank(s) [1] create it with compcoll" in ranks[0].stderr, ranks[0].describe()


def test_launcher_where_autoload_is_off(tmp_path):
    env = {"COMPCOLL_ALGO": "sbc", "COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json"),
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    plain = launch_plain([SCRIPT], 2, env)  # autoload off: nothing happens ...
    assert all(r.result["cpu_backend"] == "gloo" for r in plain)
    assert not any(os.path.exists(p) for p in stats_files(tmp_path, 2))
    ranks = launch(["-m", "compcoll.run", SCRIPT], 2, env=env)  # ... the launcher does it
    assert all(r.result["cpu_backend"] == "compcoll" for r in ranks)
    for st in read_stats(tmp_path, 2):
        assert st["algo"] == "sbc" and st["compressed_calls"] > 0, st


def test_torchrun(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {"COMPCOLL_ALGO": "csc", "COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json")}
    r = run_single([torchrun, "--standalone", "--nproc-per-node", "2", SCRIPT], env=env, timeout=240)
    # Both ranks share torchrun's stdout: lines may run together.
    lines = [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", r.stdout)]
    assert len(lines) == 2 and all(x["cpu_backend"] == "compcoll" for x in lines), r.describe()
    for st in read_stats(tmp_path, 2):
        assert st["algo"] == "csc" and st["compressed_calls"] > 0, st


def test_import_compcoll_before_torch(tmp_path):
    """`import compcoll` first, with COMPCOLL_ALGO set: torch's autoload runs
    inside compcoll's import and must find a whole compcoll._backend."""
    import subprocess

    code = ("import compcoll, torch.distributed as dist; "
            "print(compcoll.is_gloo_hooked(), dist.is_backend_available('compcoll'))")
    for algo in ("dgc", ""):
        env = dict(os.environ, COMPCOLL_ALGO=algo)
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split() == [str(bool(algo)), "True"], (algo, out.stdout, out.stderr[-2000:])
