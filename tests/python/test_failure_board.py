"""The failure board (integration/pytorch/csrc/failure_board.h) on its own,
over real stores: torch's HashStore, and a TCPStore whose host process is
killed or stopped. The backend's use of it (a killed or stuck rank named in
the survivors' errors, a waiting rank released by another's failure) is
tested in test_reliability.py."""
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from compcoll import _C

TIMEOUT = timedelta(seconds=5)  # the group's: report() listens a tenth, at least 1 s


def boards(store, size, timeout=TIMEOUT):
    return [_C._FailureBoard(store, r, size, timeout) for r in range(size)]


def test_a_failed_rank_names_the_ranks_that_posted_nothing_with_pid_and_host():
    b = boards(dist.HashStore(), 3)
    assert b[1].check_peers() is None  # nothing posted yet
    start = time.monotonic()
    said = b[0].report("all_reduce failed: Connection reset by peer [10.0.0.7]:41235")
    took = time.monotonic() - start
    assert 0.9 <= took <= 2.5, took  # it listened for the others, bounded
    me = f"pid {os.getpid()} on host {os.uname().nodename}"
    assert f"ranks 1 ({me}) and 2 ({me}) posted no failure within 1.0 s" in said, said
    assert "gone (killed, crashed" in said and "stuck" in said, said
    # The others see it when they look, and a second report is the first's.
    assert b[2].check_peers() == (0, False,
                                  "all_reduce failed: Connection reset by peer [10.0.0.7]:41235")
    assert b[0].report("a later failure") == said


def test_ranks_that_failed_alike_are_quoted_once_and_followers_are_not_suspects():
    b = boards(dist.HashStore(), 5)
    b[1].report("rank 1/5: all_reduce (operation #6) timed out after 3000 ms, waiting for its peers")
    b[2].report("rank 2/5: all_reduce (operation #7) timed out after 3000 ms, waiting for its peers")
    b[3].report("stopped waiting in all_reduce when rank 1's failure was posted", followed=True)
    said = b[0].report("[/src/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                       "[127.0.0.1]:7554. This is typically caused by a remote worker crashing.")
    assert "rank 4 (" in said and "posted no failure" in said, said
    # Numbers aside, ranks 1 and 2 said the same: one quote, no rank prefix.
    assert said.count("timed out after") == 1, said
    assert ("ranks 1 and 2 failed too: all_reduce (operation #6) timed out after 3000 ms, "
            "waiting for its peers") in said, said
    assert "rank 3 stopped waiting when a failure was posted" in said, said
    assert "rank 3 (" not in said, said  # a follower is alive: not named as silent
    # Rank 4, last to report, reads rank 0 without Gloo's source location
    # and advice, and ranks 1 and 2 as failing the way it did.
    said4 = b[4].report("rank 4/5: all_reduce (operation #9) timed out after 3000 ms, waiting "
                        "for its peers")
    assert "rank 0 failed too: Connection closed by peer [127.0.0.1]:7554" in said4, said4
    assert "pair.cc" not in said4 and "typically" not in said4, said4
    assert "ranks 1 and 2 failed the same way" in said4, said4
    assert "posted no failure" not in said4, said4  # every rank posted


def test_posts_left_on_the_store_by_an_earlier_group_are_not_this_groups():
    store = dist.HashStore()
    earlier = boards(store, 2)
    earlier[0].report("the earlier group failed")
    now = boards(store, 2)
    assert now[1].check_peers() is None
    said = now[1].report("this group failed")
    assert "rank 0 (" in said and "posted no failure" in said, said
    assert "earlier" not in said, said


def test_a_post_counted_and_never_written_hides_no_later_post():
    """A poster that died between its two store calls (count, then post)
    leaves a hole: the posts after it are read all the same."""
    store = dist.HashStore()
    b = boards(store, 3)
    store.add("compcoll_board/count", 1)  # the dead poster's count, its post never set
    b[1].report("all_reduce failed: Connection reset by peer")
    assert b[2].check_peers() == (1, False, "all_reduce failed: Connection reset by peer")
    said = b[0].report("all_reduce timed out")
    assert "rank 1 failed too" in said and "rank 2 (" in said, said


def test_a_rank_with_no_peers_has_nothing_to_say():
    assert boards(dist.HashStore(), 1)[0].report("failed") == ""


def test_the_listening_and_reading_follow_the_timeout_and_the_group_size():
    store = dist.HashStore()
    small = _C._FailureBoard(store, 0, 4, timedelta(minutes=30))
    assert small.check_every == timedelta(seconds=0.5)
    # A tenth of the timeout, from a waiting rank's read and half a second
    # more (so that it is heard from) to that read and 2.5 s.
    assert small.listen_for(timedelta(minutes=30)) == timedelta(seconds=3)
    assert small.listen_for(timedelta(seconds=3)) == timedelta(seconds=1)
    mid = _C._FailureBoard(store, 0, 128, timedelta(seconds=10))
    assert mid.check_every == timedelta(seconds=2)  # 128 ranks' reads go to one store
    assert mid.listen_for(timedelta(seconds=10)) == timedelta(seconds=2.5)
    large = _C._FailureBoard(store, 0, 1024, timedelta(minutes=30))
    assert large.check_every == timedelta(seconds=5)
    assert large.listen_for(timedelta(minutes=30)) == timedelta(seconds=7.5)
    # An operation's own timeout, not the group's, bounds the listening.
    b = boards(store, 2, timeout=timedelta(minutes=30))[0]
    start = time.monotonic()
    b.report("an all_reduce with a 500 ms timeout failed", timeout=timedelta(seconds=0.5))
    assert time.monotonic() - start < 2


@pytest.fixture
def store_host():
    """A TCPStore served by a process of its own: (its Popen, a client)."""
    code = ("import sys, time, torch.distributed as d\n"
            "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
            "print(s.port, flush=True)\n"
            "time.sleep(120)\n")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        yield host, client
    finally:
        host.kill()
        host.wait()


def test_a_store_whose_host_is_gone_is_said_so(store_host):
    host, client = store_host
    board = _C._FailureBoard(client, 1, 3, TIMEOUT)
    host.kill()
    host.wait()
    start = time.monotonic()
    said = board.report("all_reduce failed: Connection reset by peer")
    assert time.monotonic() - start < 3, said
    assert "the store could not be asked (posting this rank's failure: " in said, said
    assert "rank 0's, unless a launcher such as torchrun hosts it" in said, said
    assert "posted no failure" not in said, said  # nobody could be asked
    assert board.check_peers() is None  # and the store is not asked again


def test_a_stopped_store_host_costs_at_most_the_bound(store_host):
    host, client = store_host
    board = _C._FailureBoard(client, 1, 3, TIMEOUT)
    os.kill(host.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        said = board.report("all_reduce timed out")
        took = time.monotonic() - start
    finally:
        os.kill(host.pid, signal.SIGCONT)
    # A store call's bound (2 s) and the listening (1 s), not the store's 60 s.
    assert 1.5 <= took <= 8, (took, said)
    # SIGSTOP lands asynchronously: the post may still have been answered.
    assert re.search(r"the store was slow to answer \((posting this rank's failure|reading the "
                     r"failures posted): no answer within 2\.0 s\)", said), said
    assert "busy or stopped" in said and "gone" not in said, said


def test_a_store_slow_for_a_while_is_asked_again(store_host):
    """A store host stopped for longer than a call's bound (rank 0's process
    busy, say) does not end the board: once it answers again, a waiting rank
    reads the failure posted meanwhile."""
    host, client = store_host
    b = boards(client, 3)
    os.kill(host.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert b[1].check_peers() is None
        assert 1.5 <= time.monotonic() - start <= 4
    finally:
        os.kill(host.pid, signal.SIGCONT)
    b[0].report("all_reduce failed: Connection reset by peer")
    seen = None
    for _ in range(50):  # bounded: the stalled call returns once the host runs
        seen = b[1].check_peers()
        if seen is not None:
            break
        time.sleep(0.1)
    assert seen == (0, False, "all_reduce failed: Connection reset by peer")
