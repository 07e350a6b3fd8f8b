"""compcoll._join: a compcoll rank waits on the group's store for the others
and names a rank that builds torch's own Gloo instead (a real torch store;
the peers are threads writing what a rank writes)."""
import datetime
import threading
import time

import pytest
import torch.distributed as dist

from compcoll import _join

TIMEOUT = datetime.timedelta(seconds=20)


def join_later(store, rank, delay):
    def run():
        time.sleep(delay)
        store.set(_join.JOINED_RANK.format(rank), "1")
        store.add(_join.JOINED, 1)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_every_rank_joins():
    store = dist.HashStore()
    peers = [join_later(store, r, 0.05 * r) for r in (1, 2)]
    _join.await_every_rank(store, 0, 3, TIMEOUT, "0")
    for t in peers:
        t.join()


def test_a_rank_building_torchs_gloo_is_named_after_the_grace_period():
    store = dist.HashStore()
    join_later(store, 1, 0.0).join()
    store.set(_join.GLOO_ANNOUNCES.format(2), "address of rank 2")  # what Gloo's rendezvous writes
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"group 'g': rank 2 is creating it as torch's own gloo"):
        _join.await_every_rank(store, 0, 3, TIMEOUT, "g")
    assert _join.GRACE_SECONDS <= time.monotonic() - start < _join.GRACE_SECONDS + 5


def test_a_stale_gloo_key_of_a_rank_that_joins_in_time_is_no_error():
    """A reused store (torchrun's agent store) may still hold an earlier
    group's "0/1": rank 1 joining within the grace period clears it."""
    store = dist.HashStore()
    store.set(_join.GLOO_ANNOUNCES.format(1), "stale")
    peer = join_later(store, 1, _join.GRACE_SECONDS / 3)
    _join.await_every_rank(store, 0, 2, TIMEOUT, "0")
    peer.join()


def test_ranks_that_never_come_are_named_at_the_timeout():
    store = dist.HashStore()
    join_later(store, 1, 0.0).join()
    with pytest.raises(RuntimeError, match=r"ranks \[2, 3\] did not create it with compcoll within "
                                           r"the group's timeout of 1 s"):
        _join.await_every_rank(store, 0, 4, datetime.timedelta(seconds=1), "0")
