"""Error-feedback state that survives a checkpoint: a run interrupted and
resumed matches an uninterrupted one bit for bit when the data order is the
same, through compcoll.state_dict/load_state_dict and through
COMPCOLL_STATE_DIR; a checkpoint of another configuration is a fresh start
with an INFO line, a malformed one a clear error."""
import json
import os
import shutil

# Their workers allreduce outside a backward pass and expect compression.
from conftest import launch as launch_plain, launch_direct as launch, worker

RANKS = 2
TRAIN = worker("checkpoint_train.py")


def run(tmp, name, start, stop, env, explicit, check=True, adam=False):
    args = [TRAIN, "--start", str(start), "--stop", str(stop), "--ckpt", str(tmp / name)]
    if explicit:
        args.append("--compcoll-state")
    if adam:
        args.append("--adam")
    return launch(args, RANKS, env=env, check=check)


def interrupted_equals_whole(tmp_path, env, explicit, ckpt_env=None, adam=False):
    whole = run(tmp_path, "whole", 0, 8, env, explicit, adam=adam)
    first = run(tmp_path, "resumed", 0, 4, dict(env, **(ckpt_env or {})), explicit, adam=adam)
    shutil.copytree(tmp_path / "resumed", tmp_path / "half")  # the checkpoint at step 4
    second = run(tmp_path, "resumed", 4, 8, dict(env, **(ckpt_env or {})), explicit, adam=adam)
    for w, a, b in zip(whole, first, second):
        assert a.result["losses"] + b.result["losses"] == w.result["losses"], w.rank
        assert b.result["params"] == w.result["params"], f"rank {w.rank}: parameters differ"
    return whole, first, second


def test_state_dict_resume_is_bit_exact(tmp_path):
    # Every algorithm resumes bit for bit in tests/plugin/state_file_test.cc;
    # here dgc with momentum correction (residual, momentum and step counter).
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_MOMENTUM": "0.9", "COMPCOLL_DENSITY": "0.01",
           "COMPCOLL_DEBUG": "INFO"}
    whole, _, second = interrupted_equals_whole(tmp_path, env, explicit=True)
    assert second[0].result["restored"] == {"cpu": True}
    # The same model and optimizer checkpoint without compcoll's state: the
    # resumed half differs (so the comparison above can fail).
    cold = run(tmp_path, "half", 4, 8, env, explicit=False)
    assert cold[0].result["params"] != whole[0].result["params"]


def test_state_dir_resume_is_bit_exact_and_needs_no_code(tmp_path):
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01", "COMPCOLL_DEBUG": "INFO"}
    state = {"COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    _, first, second = interrupted_equals_whole(tmp_path, env, explicit=False, ckpt_env=state)
    assert "no checkpoint" in first[0].stderr
    assert "restored the error-feedback state of 1 tensors" in second[1].stderr, second[1].stderr
    # Each rank's save, and the checkpoint it restored, kept as .restored
    # (used once: a run that fails before saving leaves none to restore).
    files = sorted(os.listdir(tmp_path / "state"))
    assert files == [f"compcoll-state-rank{r}-of{RANKS}.bin{ext}"
                     for r in range(RANKS) for ext in ("", ".restored")], files


def test_state_dir_resume_under_adam_is_bit_exact(tmp_path):
    # Adam's beta1 is moved into compcoll (COMPCOLL_MOMENTUM_HANDOVER=auto):
    # the optimizer's checkpoint keeps the script's beta1, compcoll's state
    # file the moved momentum, and the resumed run moves it again.
    # COMPCOLL_SELECTION=auto ranks by normalized value under Adam: its second
    # moments are in the state file too, or the resumed run would differ.
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01", "COMPCOLL_DEBUG": "INFO",
           "COMPCOLL_SELECTION": "auto"}
    state = {"COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    whole, _, second = interrupted_equals_whole(tmp_path, env, explicit=False, ckpt_env=state,
                                                adam=True)
    assert "(Adam's beta1) is moved into compcoll" in whole[0].stderr, whole[0].stderr
    assert "ranking by normalized value" in whole[0].stderr, whole[0].stderr
    assert "restored the error-feedback state of 1 tensors" in second[0].stderr, second[0].stderr


def test_a_checkpoint_usable_on_some_ranks_only_is_restored_by_none(tmp_path):
    """Every rank loading rank 0's compcoll state ("save on rank 0, load
    everywhere"), or one rank with none to load: rank 0 restored its state,
    rank 1 started fresh, and under the momentum hand-over (SGD momentum
    0.9) each rank's optimizer got another delta: the replicas drifted
    apart in silence. load_state_dict is collective: the ranks restore
    together or none does, and each says why."""
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01"}
    run(tmp_path, "ck", 0, 4, env, explicit=True)
    for extra in (["--compcoll-from-rank", "0"], ["--compcoll-none-on-rank", "1"],
                  # Raises on its rank after taking part: the others do not
                  # wait for it until the timeout.
                  ["--compcoll-garbage-on-rank", "1"]):
        args = [TRAIN, "--start", "4", "--stop", "8", "--ckpt", str(tmp_path / "ck"),
                "--compcoll-state"] + extra
        res = launch(args, RANKS, env=env)
        assert res[0].result["params"] == res[1].result["params"], f"{extra}: the replicas differ"
        assert res[0].result["restored"] == {"cpu": False}, (extra, res[0].result["restored"])
        assert "another rank of the group has no usable checkpoint" in res[0].stderr, res[0].stderr
        if extra[0] == "--compcoll-from-rank":
            assert "it was written by rank 0 of 2, this is rank 1 of 2" in res[1].stderr, res[1].stderr
        if extra[0] == "--compcoll-garbage-on-rank":
            assert res[1].result["restored"].startswith("ValueError: compcoll.load_state_dict: not a"), \
                res[1].result


def test_other_configuration_starts_fresh_and_says_why(tmp_path):
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01", "COMPCOLL_DEBUG": "INFO"}
    run(tmp_path, "ck", 0, 3, env, explicit=True)
    other = run(tmp_path, "ck", 3, 5, dict(env, COMPCOLL_DENSITY="0.02"), explicit=True)
    assert other[0].result["restored"] == {"cpu": False}
    assert "not used (the configuration differs: density=0.02" in other[0].stderr, other[0].stderr


def test_a_state_dir_checkpoint_of_another_configuration_is_set_aside_not_overwritten(tmp_path):
    """COMPCOLL_STATE_DIR with a setting changed between runs: the old
    checkpoint cannot be restored, and the run's save at exit replaced it,
    said only at INFO. Now it is moved to <file>.unused, said at WARN
    (once per process), and the run saves its own in its place."""
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01",
           "COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    run(tmp_path, "ck", 0, 3, env, explicit=False)
    first = {p.name: p.read_bytes() for p in (tmp_path / "state").glob("*.bin")}
    assert len(first) == RANKS, first.keys()
    other = run(tmp_path, "ck", 3, 5, dict(env, COMPCOLL_DENSITY="0.02"), explicit=False)
    for r in other:
        warns = [ln for ln in r.stderr.splitlines()
                 if ln.startswith("compcoll WARN") and "not used (the configuration differs: "
                 "density=0.02" in ln]
        assert len(warns) == 1 and ".unused, and this run saves its own" in warns[0], r.stderr
    for name, data in first.items():
        assert (tmp_path / "state" / (name + ".unused")).read_bytes() == data, name
        assert (tmp_path / "state" / name).read_bytes() != data, name


def test_a_state_dir_run_of_another_world_size_sets_the_old_files_aside(tmp_path):
    """A 2-rank run, then a 3-rank run, then a 2-rank run on one
    COMPCOLL_STATE_DIR: the 3-rank run found no file of its size and started
    fresh without a word, leaving the 2-rank files in place, and the last
    run restored them, older than its model checkpoint. Now the 3-rank run
    says so at WARN and moves them to <file>.unused (rank 0 also those of
    ranks it does not have), and the last run starts fresh (setting the
    3-rank files aside in turn)."""
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01", "COMPCOLL_DEBUG": "INFO",
           "COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    run(tmp_path, "two", 0, 2, env, explicit=False)
    three = launch([TRAIN, "--start", "0", "--stop", "2", "--ckpt", str(tmp_path / "three")], 3,
                   env=env)
    assert "of a run of another world size" in three[0].stderr, three[0].stderr
    files = sorted(os.listdir(tmp_path / "state"))
    assert files == sorted([f"compcoll-state-rank{r}-of2.bin.unused" for r in range(2)] +
                           [f"compcoll-state-rank{r}-of3.bin" for r in range(3)]), files
    # The 3-rank files are of another size for this run in turn.
    again = run(tmp_path, "two", 2, 4, env, explicit=False)
    assert "restored" not in again[0].stderr, again[0].stderr
    assert "of a run of another world size" in again[0].stderr, again[0].stderr
    assert sorted(os.listdir(tmp_path / "state")) == sorted(
        [f"compcoll-state-rank{r}-of2.bin{ext}" for r in range(2) for ext in ("", ".unused")] +
        [f"compcoll-state-rank{r}-of3.bin.unused" for r in range(3)])


def test_malformed_state_file_is_a_clear_error(tmp_path):
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01",
           "COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    run(tmp_path, "ck", 0, 2, env, explicit=False)
    bad = tmp_path / "state" / f"compcoll-state-rank1-of{RANKS}.bin"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    res = run(tmp_path, "ck", 2, 3, env, explicit=False, check=False)
    assert all(r.returncode != 0 for r in res)
    assert "compcoll state file" in res[1].stderr and str(bad) in res[1].stderr, res[1].stderr
    assert "another rank's checkpoint is unreadable" in res[0].stderr, res[0].stderr


def test_a_state_dir_that_cannot_be_written_fails_at_init_not_at_exit(tmp_path):
    """COMPCOLL_STATE_DIR inside a regular file: every rank fails when the
    group is created, naming the directory and why, before any training
    step; nothing waits for an exit warning."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATE_DIR": str(blocker / "state")}
    res = run(tmp_path, "ck", 0, 2, env, explicit=False, check=False)
    for r in res:
        assert r.returncode != 0 and not r.results, r.describe()
        assert f"COMPCOLL_STATE_DIR {blocker / 'state'}: cannot create the directory" in r.stderr, \
            r.describe()


def test_a_group_over_every_rank_keeps_its_own_state_file(tmp_path):
    """A new_group over every rank has the default group's rank and size:
    it saves to a file named by torch's group name, beside the default
    group's, no WARN says a file is taken, and both restore at the next
    start with their own states (the subgroup's tensor has another size)."""
    code = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "sub = dist.new_group(list(range(dist.get_world_size())))\n"
            "x, y = torch.ones(50_000), torch.ones(70_000)\n"
            "for _ in range(3):\n"
            "    dist.all_reduce(x)\n"
            "    dist.all_reduce(y, group=sub)\n"
            "print('RESULT {}')\n"
            "dist.destroy_process_group()\n")
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "INFO",
           "COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    first = launch(["-c", code], RANKS, env=env)
    files = sorted(os.listdir(tmp_path / "state"))
    for r in range(RANKS):
        assert f"compcoll-state-rank{r}-of{RANKS}.bin" in files, files
        assert f"compcoll-state-group-1-rank{r}-of{RANKS}.bin" in files, files
    again = launch(["-c", code], RANKS, env=env)
    for res in first + again:
        assert "another communicator of this process uses" not in res.stderr, res.stderr
    for res in again:
        assert res.stderr.count("restored the error-feedback state of 1 tensors") == 2, res.stderr
        assert "starting it fresh" not in res.stderr, res.stderr


def test_ddp_resume_gives_the_rebuilt_bucket_its_checkpointed_state(tmp_path):
    """DDP's first iteration after a restart reduces its initial bucket (the
    whole 2.1M-parameter model) under the key its first rebuilt bucket had
    (530K): the checkpointed state is kept aside through that call, not
    replaced, and the rebuilt bucket of the second iteration takes it back
    instead of a new state. No WARN: nothing was lost."""
    code = ("import torch, torch.nn as nn, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "dist.init_process_group('gloo')\n"
            "torch.manual_seed(0)\n"
            "model = DDP(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024),\n"
            "            nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)))\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
            "g = torch.Generator().manual_seed(dist.get_rank())\n"
            "for _ in range(3):\n"
            "    x, y = torch.randn(16, 512, generator=g), torch.randint(0, 10, (16,), generator=g)\n"
            "    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()\n"
            "print('RESULT {}')\n"
            "dist.destroy_process_group()\n")
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "TRACE",
           "COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    rebuilt_made_new = "new error-feedback state for key:t0.0 (529930 elements)"
    first = launch(["-c", code], RANKS, env=env)
    for res in first:
        assert rebuilt_made_new in res.stderr, res.stderr[-3000:]
    again = launch(["-c", code], RANKS, env=env)
    for res in again:
        assert "restored the error-feedback state of 2 tensors" in res.stderr, res.stderr[-3000:]
        assert "the checkpointed state is kept aside for a call of its size" in res.stderr, \
            res.stderr[-3000:]
        assert "kept aside by a call of another size, is back at its size" in res.stderr, \
            res.stderr[-3000:]
        assert rebuilt_made_new not in res.stderr, res.stderr[-3000:]
        assert "WARN" not in res.stderr, res.stderr[-3000:]


def test_device_lane_keeps_its_own_state_file(tmp_path):
    """The test lane staged_cpu (the cuda lane's path, on cpu tensors) saves
    beside the host lane and restores its own file at the next start."""
    code = ("import torch, torch.distributed as dist\n"
            "import compcoll\n"
            "from compcoll import _backend\n"
            "_backend._TEST_STAGED_CPU = True\n"
            "dist.init_process_group('compcoll')\n"
            "x = torch.ones(50_000)\n"
            "for _ in range(3): dist.all_reduce(x)\n"
            "print('RESULT {}')\n"
            "dist.destroy_process_group()\n")
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "INFO",
           "COMPCOLL_STATE_DIR": str(tmp_path / "state")}
    launch(["-c", code], RANKS, env=env)
    files = sorted(os.listdir(tmp_path / "state"))
    assert f"compcoll-state-staged_cpu-rank0-of{RANKS}.bin" in files, files
    assert f"compcoll-state-rank0-of{RANKS}.bin" in files, files
    again = launch(["-c", code], RANKS, env=env)
    assert "restored the error-feedback state of 1 tensors" in again[0].stderr, again[0].stderr


def test_a_checkpoint_with_compression_off_holds_no_state_and_says_so(tmp_path):
    # The same script as a dense baseline (COMPCOLL_ALGO unset): its
    # checkpoints must not fail for want of compcoll; it is said once.
    run(tmp_path, "ck", 0, 2, {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01"}, explicit=True)
    off = run(tmp_path, "ck", 2, 4, {}, explicit=True)  # loads the compressed run's dict
    assert off[0].result["restored"] == {"cpu": False}, off[0].result["restored"]
    said = [line for line in off[0].stderr.splitlines() if "compcoll WARN" in line]
    assert any("load_state_dict" in line and "lanes cpu) is not used" in line for line in said), said
    assert sum("compcoll.state_dict" in line for line in said) == 1, said
    again = run(tmp_path, "ck", 4, 5, {}, explicit=True)  # loads the dense run's (empty) dict
    assert again[0].result["restored"] == {}, again[0].result["restored"]


def test_asking_compcoll_about_a_group_it_does_not_serve_leaves_torchs_gloo_alone(tmp_path):
    """compcoll.state_dict() (and every API that asks whether a group is
    compcoll's) on a group with compression off: the question took a
    reference to torch's Gloo backend and never gave it back, so the backend
    outlived destroy_process_group with its sockets open, and the process
    could abort at exit ("terminate called without an active exception",
    6 runs in 10). Its sockets are closed after destroy, as without the
    question. Where nothing is served, gradient_scope() and
    mark_tensor_parallel() say once that they change nothing."""
    code = ("import gc, json, os, torch, torch.distributed as dist, compcoll\n"
            "def sockets():\n"
            "    n = 0\n"
            "    for fd in os.listdir('/proc/self/fd'):\n"
            "        try:\n"
            "            n += os.readlink(f'/proc/self/fd/{fd}').startswith('socket:')\n"
            "        except OSError:\n"
            "            pass\n"
            "    return n\n"
            "dist.init_process_group('gloo')\n"
            "dist.all_reduce(torch.ones(10))\n"
            "for _ in range(3):\n"
            "    compcoll.state_dict()\n"
            "    assert compcoll.backend_of() is None\n"
            "with compcoll.gradient_scope():\n"
            "    dist.all_reduce(torch.ones(10))\n"
            "marked = compcoll.mark_tensor_parallel(None)\n"
            "dist.destroy_process_group()\n"
            "gc.collect()\n"
            "print('RESULT ' + json.dumps({'sockets': sockets(), 'marked': marked}))\n")
    for res in launch_plain(["-c", code], RANKS, env={"COMPCOLL_WARMUP_STEPS": None}):
        assert res.result == {"sockets": 0, "marked": False}, res.describe()
        said = [line for line in res.stderr.splitlines() if "compcoll WARN" in line]
        expected = 3 if res.rank == 0 else 0  # state_dict, gradient_scope, mark_tensor_parallel
        assert len(said) == expected, said
        if res.rank == 0:
            assert "compcoll.gradient_scope(): no process group of this process is a compcoll " \
                   "group" in said[1], said
            assert "compcoll.mark_tensor_parallel(): the group is not a compcoll group" in said[2], \
                said


def test_a_process_group_created_again_in_the_process_loads_and_saves_the_state(tmp_path):
    """destroy_process_group, then init_process_group again in the same
    process (DDP of the first still holding its backend): the new group
    loads what the first saved (the first one's file is set aside as
    .restored) and saves its own. Before, the first group's claim on the
    file outlived it, and the second neither loaded nor saved, saying that
    another communicator of the process used it."""
    state = tmp_path / "state"
    ranks = launch([worker("reinit_and_fork.py")], 2,
                   env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATE_DIR": str(state),
                        "COMPCOLL_DEBUG": "INFO", "REINIT_MODE": "reinit",
                        "COMPCOLL_STATS_FILE": str(tmp_path / "stats-{rank}.json"),
                        "TEST_DIR": str(tmp_path)}, timeout=180)
    for r in ranks:
        assert "another communicator of this process uses" not in r.stderr, r.stderr
        assert "restored the error-feedback state of 1 tensors" in r.stderr, r.stderr
        first, second = r.result["files_after_phase1"], r.result["files_after_phase2"]
        mine = f"compcoll-state-rank{r.rank}-of2.bin"
        assert mine in first, first
        assert second[mine] != first[mine], (first, second)  # the second group saved
        assert second[mine + ".restored"] == first[mine], (first, second)  # and loaded the first's
        # The stats file keeps both groups, which torch named "0" alike.
        stats = json.load(open(tmp_path / f"stats-{r.rank}.json"))
        assert sorted(stats["groups"]) == ["0", "0 (2)"], stats["groups"]
        assert stats["calls"] == sum(g["calls"] for g in stats["groups"].values()) > 0, stats
