"""Reliability of the PyTorch backend: non-finite gradients, a rank killed
in the middle of training (issue 7, extended to the PyTorch layer), and a
process that must not abort as it exits."""
import math
import re
import time

import pytest

# Their workers allreduce outside a backward pass and expect compression.
from conftest import launch as launch_scoped
from conftest import launch_direct as launch, worker

ALGOS = ["dense", "dgc", "sbc", "sdagc", "csc", "onebit"]


def test_nonfinite_values_reach_every_rank_like_the_dense_sum(tmp_path):
    """NaN, +Inf and -Inf in one rank's gradient appear in every rank's
    output exactly where the dense sum has them and nowhere else; the next
    clean steps are finite, identical on all ranks and accurate (the
    residual and momentum did not keep the poison)."""
    ranks = launch([worker("reliability.py"), "nonfinite"], 3,
                   env={"TEST_ALGOS": ",".join(ALGOS), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                   timeout=240)
    for r in ranks:
        for algo in ALGOS:
            res = r.result[algo]
            where = f"{algo} rank {r.rank}"
            assert res["nan_at"] == [7], f"{where}: NaN at {res['nan_at']}"
            assert res["posinf_at"] == [1234], f"{where}: +Inf at {res['posinf_at']}"
            assert res["neginf_at"] == [40000], f"{where}: -Inf at {res['neginf_at']}"
            assert res["clean_finite"] and res["clean_identical"], where
            # One clean step of a fresh compressed stream is far from the
            # dense sum (that is what error feedback repays later); finite
            # and bounded is the check here, exactness is dense's.
            bound = 1e-6 if algo == "dense" else 1.5
            assert math.isfinite(res["clean_rel_err"]) and res["clean_rel_err"] <= bound, \
                f"{where}: clean step relative error {res['clean_rel_err']}"


def killed_run(algo, victim, timeout_s=5):
    """reliability.py killed on 3 ranks: the survivors' results, after the
    checks every such run passes: the victim died of its SIGKILL; every
    survivor's allreduce raised within the group's timeout + 2 s, naming
    compcoll, and its process ended."""
    ranks = launch([worker("reliability.py"), "killed"], 3,
                   env={"COMPCOLL_ALGO": algo, "TEST_TIMEOUT_S": str(timeout_s),
                        "TEST_VICTIM": str(victim), "TEST_KILL_AFTER": "20"},
                   timeout=120, check=False)
    assert ranks[victim].returncode == -9, ranks[victim].describe()
    survivors = [r for r in ranks if r.rank != victim]
    for r in survivors:
        assert r.returncode == 0, r.describe()
        res = r.result
        assert res["backend"] == "compcoll", res
        assert res["error"] is not None, f"rank {r.rank} never saw the failure: {res}"
        assert res["calls"] >= 20, res
        assert res["error_after_s"] <= timeout_s + 2, res
        assert "compcoll" in res["error"], res["error"]
    return [r.result for r in survivors]


@pytest.mark.parametrize("algo", ["dgc", "onebit"])
def test_rank_killed_mid_training_is_named_by_every_survivor_in_time(algo, tmp_path):
    """A rank SIGKILLed between allreduces of an unmodified "gloo" script
    running under compcoll: every survivor's allreduce raises in time (Gloo
    names only an address), and its error names the dead rank, with its pid
    and host, from the group's failure board."""
    for res in killed_run(algo, victim=2):
        assert re.search(r"rank 2 \(pid \d+ on host [^)]+\) posted no failure", res["error"]), \
            res["error"]


def test_the_store_hosts_death_is_said_when_the_killed_rank_hosted_it(tmp_path):
    """Rank 0 hosts the store (init_method env://, no launcher): killed, it
    takes the failure board with it, and the survivors say so (the store's
    host may be the rank that is gone) instead of naming nobody."""
    for res in killed_run("dgc", victim=0):
        assert "the store could not be asked" in res["error"], res["error"]
        assert "rank 0's, unless a launcher such as torchrun hosts it" in res["error"], \
            res["error"]


@pytest.mark.parametrize("algo", ["dgc", "csc"])
def test_set_timeout_shortens_compcolls_own_waits(algo, tmp_path):
    """dist.set_timeout() on a live group reaches compcoll's waits, not only
    Gloo's: created with 600 s, shortened to 3 s, a compressed allreduce
    whose peer hangs fails within 3 s + 3 s (2 s of slack and the failure
    board's 1 s of listening), naming the new timeout."""
    timeout_s = 3
    ranks = launch([worker("reliability.py"), "retimed"], 3,
                   env={"COMPCOLL_ALGO": algo, "TEST_TIMEOUT_S": str(timeout_s),
                        "TEST_VICTIM": "2", "TEST_KILL_AFTER": "5"},
                   timeout=120, check=False)
    for r in ranks:
        assert r.returncode == 0, r.describe()
    assert ranks[2].result["victim"], ranks[2].describe()
    for r in ranks[:2]:
        res = r.result
        assert res["backend"] == "compcoll", res
        assert res["error"] is not None, f"rank {r.rank}: the allreduce did not fail: {res}"
        assert res["error_after_s"] <= timeout_s + 3, res
        assert f"{timeout_s * 1000} ms" in res["error"], res["error"]
        # The hung rank is alive, its connections open: only the board names it.
        assert re.search(r"rank 2 \(pid \d+ on host [^)]+\) posted no failure", res["error"]), \
            res["error"]


def test_a_rank_waiting_in_an_operation_stops_when_another_ranks_failure_is_posted(tmp_path):
    """Rank 0's timeout is short, rank 1's long (60 s), rank 2 hangs: rank 0
    fails at its timeout and posts it; rank 1, still waiting, reads the post
    and fails within seconds instead of a minute, naming rank 0's failure
    and rank 2 as silent. Both processes then exit through the interpreter
    with the broken group alive, promptly."""
    short_s = 3
    started = time.monotonic()
    ranks = launch([worker("reliability.py"), "released"], 3,
                   env={"COMPCOLL_ALGO": "dgc", "TEST_TIMEOUT_S": "60",
                        "TEST_SHORT_S": str(short_s), "TEST_VICTIM": "2", "TEST_HANG_S": "30",
                        "TEST_LINGER_S": "5"},
                   timeout=120, check=False)
    for r in ranks:
        assert r.returncode == 0, r.describe()
    assert time.monotonic() - started < 60, "a survivor waited out the long timeout"
    first, waiting = ranks[0].result, ranks[1].result
    # Rank 0's error comes from its watchdog or from its inner Gloo's wait,
    # whichever is first at the same deadline: both name the timeout.
    assert f"{short_s * 1000} ms" in first["error"], first
    assert "rank 1 stopped waiting when a failure was posted" in first["error"], first
    # Released at rank 0's post: its check follows within one read (0.5 s),
    # then it listens for a tenth of its timeout at most 3 s.
    assert waiting["error"] is not None and waiting["took_s"] < short_s + 5, waiting
    assert "stopped waiting after" in waiting["error"], waiting
    assert "rank 0 failed (it posted so on the group's failure board)" in waiting["error"], waiting
    assert f"{short_s * 1000} ms" in waiting["error"], waiting  # rank 0's post, quoted
    assert re.search(r"rank 2 \(pid \d+ on host [^)]+\) posted no failure", waiting["error"]), \
        waiting


def rank0_of_a_late_peer_run(mode, env):
    """Runs reliability.py MODE on 2 ranks (rank 1 comes late); both exit
    cleanly whatever the collectives did. Rank 0's result."""
    ranks = launch([worker("reliability.py"), mode], 2, env=env, timeout=120, check=False)
    for r in ranks:
        assert r.returncode == 0, r.describe()
    return ranks[0].result


@pytest.mark.parametrize("algo", ["dgc", "onebit"])
def test_an_operations_own_timeout_is_its_deadline_shorter_or_longer(algo, tmp_path):
    """An allreduce whose options carry a timeout (AllreduceOptions.timeout,
    which ProcessGroupGloo applies to that operation alone) gets it from
    compcoll too, for its compressed waits and its deadline: 0.5 s in a
    group of 60 s fails within 0.5 s + 2 s, naming 500 ms; 8 s in a group
    of 2 s waits out a peer 4 s late and succeeds, and the group works."""
    res = rank0_of_a_late_peer_run("op_timeout", {"COMPCOLL_ALGO": algo, "TEST_TIMEOUT_S": "60",
                                                 "TEST_OP_TIMEOUT_S": "0.5", "TEST_LATE_S": "3"})
    assert res["backend"] == "compcoll", res
    assert res["error"] is not None, f"the allreduce did not fail: {res}"
    assert res["took_s"] <= 0.5 + 2, res
    assert "500 ms" in res["error"], res["error"]

    long = launch([worker("reliability.py"), "op_timeout"], 2,
                  env={"COMPCOLL_ALGO": algo, "TEST_TIMEOUT_S": "2", "TEST_OP_TIMEOUT_S": "8",
                       "TEST_LATE_S": "4"},
                  timeout=120)
    for r in long:
        res = r.result
        assert res["error"] is None, res["error"]
        assert res["usable"], res
    assert long[0].result["took_s"] >= 3.5, long[0].result  # it did wait for the late peer


def test_an_ephemeral_timeout_extends_the_next_operations_until_one_completes(tmp_path):
    """_add_ephemeral_timeout (torch.compile extends every group's timeout
    so around a long compile): in a 2 s group extended by 4 s, a dgc
    allreduce waits out a peer 3 s late; the extension ends with it, so the
    next allreduce, 3 s late again, fails at the group's 2 s."""
    res = rank0_of_a_late_peer_run("ephemeral", {"COMPCOLL_ALGO": "dgc", "TEST_TIMEOUT_S": "2",
                                                "TEST_EXTRA_S": "4", "TEST_LATE_S": "3"})
    assert res["backend"] == "compcoll", res
    assert res["extended"]["error"] is None, res["extended"]["error"]
    assert res["extended"]["took_s"] >= 2.5, res  # it did wait past the group's 2 s
    assert res["after"]["error"] is not None, f"the extension outlived its operation: {res}"
    assert res["after"]["took_s"] <= 2 + 2, res
    assert "2000 ms" in res["after"]["error"], res["after"]["error"]


def test_collective_timing_is_accepted_and_times_compressed_works():
    """_enable_collectives_timing, which ProcessGroupGloo accepts, was
    refused by the compcoll backend ("missing implementation"): now it
    reaches the inner backends, and a compressed allreduce's work reports
    its duration (_get_duration()); delegated operations stay Gloo's."""
    ranks = launch([worker("reliability.py"), "timing"], 2, env={"COMPCOLL_ALGO": "dgc"},
                   timeout=120)
    for r in ranks:
        res = r.result
        assert res["backend"] == "compcoll", res
        for op, ms in res["durations"].items():
            assert 0 < ms < 60_000, (op, res)
        assert res["timeout_s"] == 1800, res  # the group's: torch's default 30 minutes



@pytest.mark.parametrize("nranks", [2, 3])
def test_point_to_point_posted_behind_a_busy_worker_completes(nranks):
    """Every rank posts a receive and then a send while its group's worker
    runs a compressed allreduce, so both wait in the queue. Gloo's send and
    receive works have no future, and the worker used to wait for the
    receive itself, with the rank's own send queued behind it: every rank
    hung until the group's timeout, where plain Gloo completes at once."""
    ranks = launch([worker("p2p_while_busy.py")], nranks, env={"COMPCOLL_ALGO": "dgc"},
                   timeout=150)
    for r in ranks:
        res = r.result
        assert res["backend"] == "compcoll", res
        src = res["src"]
        assert res["got"] == [x for k in range(3) for x in (100.0 * k + src, -1.0 - src)], res
        assert max(res["seconds"]) < 10, res  # the timeout is 20 s


def test_a_receive_queued_behind_a_busy_worker_times_from_its_wait_as_gloos():
    """A receive posted while the worker is busy, matched 4.5 s later and
    waited on after 6 s, in a group whose timeout is 3 s: Gloo's receive
    counts its timeout from the wait, so it completes, and the group goes
    on. compcoll's used to count it from the posting: the receive failed
    and the group was unusable on both ranks."""
    ranks = launch([worker("p2p_late_match.py")], 2, env={"COMPCOLL_ALGO": "dgc"},
                   timeout=120)
    for r in ranks:
        assert r.result["backend"] == "compcoll", r.result
        assert r.result.get("next") == [2.0] * 4, r.result
    assert ranks[0].result.get("received") == [7.0] * 4, ranks[0].result


def test_no_thread_of_the_backend_holds_the_callers_tensors():
    """While an operation is in flight, and after it, the caller's tensors
    carry no reference but their Python object's: the worker and the inner
    backend (Gloo's threads) hold aliases (csrc/python_free.h). Holding the
    caller's own tensors, a thread that dropped the last of its references
    while the interpreter finalized aborted the process after the script's
    last line ("terminate called without an active exception", 1 in ~37
    runs of test_optimizer_momentum's ZeroRedundancyOptimizer script). Torch's
    own Gloo holds 2-4 references per tensor there; compcoll held as many
    before, and after wait() still 4 for a delegated float64 allreduce."""
    ranks = launch_scoped([worker("caller_references.py")], 2,
                          env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_MIN_ELEMS": "1000"}, timeout=120)
    res = ranks[0].result
    assert len(res["ok"]) == 10, res
    bad = {op: res["counts"][op] for op, fine in res["ok"].items() if not fine}
    assert not bad, f"references to the caller's tensors [before, in flight, after]: {bad}"


def test_no_inner_backend_thread_frees_the_callers_storage():
    """A delegated operation whose caller let go of its tensors, work and
    storages while it was in flight: the storages (whose Python objects
    exist, as all_gather_object's do) are freed on the caller's thread, at
    its next call into the backend, never on the inner backend's thread
    (csrc/deferred_release.h), and every one of them is freed. Before, Gloo's
    runLoop freed them, and did so once while the interpreter finalized:
    the process aborted after its last line (AsyncAllgatherWork, about 1
    exit in 400 of test_hooks' two-model script)."""
    ranks = launch_scoped([worker("storage_release.py")], 2,
                          env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_MIN_ELEMS": "1000"}, timeout=120)
    freed_by = ranks[0].result["freed_by"]
    assert len(freed_by) == 14, freed_by
    bad = {op: who for op, who in freed_by.items() if set(who) != {"main"}}
    assert not bad, f"who freed each storage: {bad}"
    # Let go as they become unshared, not kept for the process's lifetime
    # (about 45 operations were issued).
    assert ranks[0].result["kept"] <= 4, ranks[0].result["kept"]


EXIT_WITH_AN_OPERATION_A_PEER_NEVER_JOINS = """
import json, os, sys, time, torch, torch.distributed as dist
from datetime import timedelta
d = os.environ["TEST_DIR"]
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
dist.all_reduce(torch.ones(1 << 16))  # both here
mode = os.environ["TEST_MODE"]
if mode == "callback":
    # Both join w; its callback, on rank 0's worker, issues a broadcast that
    # rank 1 never joins, and waits for it there.
    import threading
    t, in_callback = torch.ones(8), threading.Event()
    def callback(f):
        in_callback.set()
        dist.broadcast(t, 1)
    if rank == 1:
        time.sleep(1.0)  # w completes after its callback is attached: on the worker
    w = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    if rank == 0:
        w.get_future().then(callback)
        assert in_callback.wait(30)
    else:
        w.wait()
if rank == 0:
    destroy_s = None
    if mode in ("operation", "destroy"):
        # A peer that never joins (stopped, or its host gone without a
        # reset): an operation still waits on it when this process exits.
        dist.all_reduce(torch.ones(1 << 16), async_op=True)
    if mode == "destroy":
        start = time.monotonic()
        dist.destroy_process_group()
        destroy_s = time.monotonic() - start
    with open(os.path.join(d, "rank0.tmp"), "w") as f:
        json.dump({"pid": os.getpid(), "exiting_at": time.time(), "destroy_s": destroy_s}, f)
    os.replace(os.path.join(d, "rank0.tmp"), os.path.join(d, "rank0"))  # read whole
    sys.exit(0)
path = os.path.join(d, "rank0")
for _ in range(400):  # bounded: 40 s
    if os.path.exists(path):
        break
    time.sleep(0.1)
rank0 = json.load(open(path))
gone = None
for _ in range(400):  # rank 0 exits; not the group's 60 s later
    try:
        os.kill(rank0["pid"], 0)
    except ProcessLookupError:
        gone = time.time()
        break
    time.sleep(0.1)
print("RESULT", json.dumps({"exit_took_s": None if gone is None else gone - rank0["exiting_at"],
                            "rank0_destroy_s": rank0["destroy_s"]}))
os._exit(0)
"""


@pytest.mark.parametrize("mode", ["operation", "callback", "destroy"])
def test_a_process_exits_without_waiting_the_timeout_for_an_operation_a_peer_never_joins(
        mode, tmp_path):
    """Plain Gloo's process exits at once with an operation still waiting on
    a peer; compcoll's waits, to write the stats and error-feedback state,
    at most CompcollBackend::kEndDrainBound (5 s) for the worker, not the
    group's timeout (60 s here, 30 minutes by default), and says what held
    it and what it did not write (which is then not written). The worker is
    held by the operation, or by a future callback waiting for a broadcast
    it issued; destroy_process_group is bounded alike (plain Gloo's returns
    at once)."""
    stats = tmp_path / "stats-0.json"
    ranks = launch(["-c", EXIT_WITH_AN_OPERATION_A_PEER_NEVER_JOINS], 2,
                   env={"COMPCOLL_ALGO": "dgc", "TEST_DIR": str(tmp_path), "TEST_MODE": mode,
                        "COMPCOLL_STATS_FILE": str(tmp_path / "stats-{rank}.json")},
                   timeout=150, check=False)
    assert ranks[0].returncode == 0, ranks[0].describe()
    took = ranks[1].result["exit_took_s"]
    assert took is not None and took < 5 + 5, ranks[1].describe()
    running = r"all_reduce \(Float, 65536 elements\) \(operation #\d+\), running on the worker for "
    held_by = {"operation": r"the process exits while " + running,
               "destroy": r"the group ends while " + running,
               "callback": r"the process exits while the future callbacks of all_reduce \(Float, "
                           r"65536 elements\) \(operation #\d+\), which have held the worker"}[mode]
    assert re.search(held_by, ranks[0].stderr), ranks[0].stderr
    if mode == "destroy":
        assert ranks[1].result["rank0_destroy_s"] < 5 + 3, ranks[1].describe()
    not_written = {"operation": r"and error-feedback state \(COMPCOLL_STATE_DIR\) are not written",
                   "callback": r"and error-feedback state \(COMPCOLL_STATE_DIR\) are not written",
                   "destroy": r"are not written, and its error-feedback state \(COMPCOLL_STATE_DIR\) "
                              r"is saved only if that operation completes"}[mode]
    assert re.search(r"after waiting 5000 ms for it \(a peer may be stopped or gone\), not the "
                     r"group's timeout: this group's stats \(COMPCOLL_STATS_FILE\) " + not_written,
                     ranks[0].stderr), ranks[0].stderr
    assert not stats.exists(), "said not written, yet written"


def test_a_child_forked_after_the_group_was_made_exits_at_once():
    """os.fork() after init_process_group: the child inherits the parent's
    backends but not their threads. Its normal exit finishes none of them
    (it used to wait for a worker that is not there until the group's
    timeout, 60 s here, and would then have written the parent's files)."""
    ranks = launch_scoped([worker("reinit_and_fork.py")], 2,
                          env={"COMPCOLL_ALGO": "dgc", "REINIT_MODE": "fork"}, timeout=150)
    for r in ranks:
        assert r.result["child_status"] == 0, r.describe()
        assert r.result["child_exit_s"] < 10, r.describe()
