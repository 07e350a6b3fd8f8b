"""Every rank of a group must create it with compcoll, or none.

Env-only activation decides per process: a rank whose environment lacks
COMPCOLL_ALGO (a variable exported on one node and not another, a launcher
that does not pass it on) builds torch's own Gloo for the same group, on the
same store, while the others build compcoll's inner Gloo under another key
prefix. Neither side ever finds the other: the compcoll ranks would wait in
the store for the group's whole timeout (30 minutes by default) and fail
with a key name. So a compcoll rank first joins on the store and, while it
waits for the others, watches for a rank that is building torch's own Gloo
instead: Gloo's rendezvous announces rank p under the key "0/p" of the
group's backend store (device 0's context). Such a rank is named within a
few seconds.

A rank whose COMPCOLL_* settings do not parse (a value mistyped on one node)
cannot create the group either: it leaves its error under a key of its own
before it raises (announce_bad_configuration), and the ranks waiting for it
raise naming that rank and its error, instead of failing later in the
configuration exchange with a closed connection and no rank.

A key "0/p" left by an earlier group of the same name on a reused store
(torchrun's agent store) is told apart by the grace period: rank p joins
within it when it is a compcoll rank after all. A join counter left by an
earlier group lets this one through at once, as before this check existed.
"""
import os
import time

# One spelling of the keys, shared with the watch of a rank building torch's
# own gloo (compcoll_autoload._end_if_compcoll_ranks_join).
from compcoll_autoload import GLOO_ANNOUNCES, JOINED, JOINED_RANK, PEERS_PER_SCAN

# A rank's configuration error, for the others (announce_bad_configuration),
# and how many of them have read one.
BAD_CONFIG_RANK = "compcoll_join/bad_config/{}"
BAD_CONFIG_SEEN = "compcoll_join/bad_config_seen"
# How long a rank with a bad configuration waits for the others to read it
# before it raises: its process may host the store (rank 0) and end with it.
BAD_CONFIG_LINGER_SECONDS = 5.0
GRACE_SECONDS = 3.0
# The store serves every rank of the job: a join that completes at once (the
# usual case) looks at no Gloo key, and a slow one looks at a few per scan.
SCAN_AFTER_SECONDS = 0.5
SCAN_EVERY_SECONDS = 0.25
MAX_PAUSE_SECONDS = 0.1


def _plain_gloo_rank(store, rank, size, start, suspects, now):
    """A peer seen building torch's own Gloo for GRACE_SECONDS without
    joining, or None. Looks at PEERS_PER_SCAN peers from `start`."""
    for i in range(min(size, PEERS_PER_SCAN)):
        p = (start + i) % size
        if p == rank:
            continue
        if store.check([GLOO_ANNOUNCES.format(p)]) and not store.check([JOINED_RANK.format(p)]):
            if now - suspects.setdefault(p, now) >= GRACE_SECONDS:
                return p
    return None


def announce_bad_configuration(store, rank, size, error):
    """This rank cannot create the group with compcoll: its COMPCOLL_*
    settings do not parse (error). Left for the ranks that wait for it to
    join, and waited on until they have read it (at most
    BAD_CONFIG_LINGER_SECONDS); the caller then raises error itself."""
    if size <= 1:
        return
    try:
        store.set(BAD_CONFIG_RANK.format(rank), str(error)[:2000])
    except Exception:  # noqa: BLE001 - the store is gone: nobody to tell; raise our own
        return
    _linger_until_told(store, size)


def _linger_until_told(store, size):
    """Waits (at most BAD_CONFIG_LINGER_SECONDS) until every rank but the
    bad one has read a bad configuration: each rank that raises for it may
    host the store (rank 0), and its exit would cut the others off before
    they read it. A store already gone ends the wait."""
    deadline = time.monotonic() + BAD_CONFIG_LINGER_SECONDS
    try:
        while store.add(BAD_CONFIG_SEEN, 0) < size - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the store's host is gone
        pass


def _bad_configuration(store, rank, size, start):
    """(p, its error) for a peer that announced a bad configuration, or None.
    Looks at PEERS_PER_SCAN peers from `start`."""
    for i in range(min(size, PEERS_PER_SCAN)):
        p = (start + i) % size
        if p != rank and store.check([BAD_CONFIG_RANK.format(p)]):
            return p, store.get(BAD_CONFIG_RANK.format(p)).decode(errors="replace")
    return None


def _missing(store, rank, size, limit=8):
    out = []
    for p in range(size):
        if p != rank and not store.check([JOINED_RANK.format(p)]):
            out.append(p)
            if len(out) == limit:
                break
    return out


def await_every_rank(store, rank, size, timeout, group):
    """Returns once every rank of the group has joined with compcoll. Raises
    RuntimeError naming a rank that builds torch's own Gloo instead, or, at
    the group's timeout, the ranks that never came."""
    if size <= 1:
        return
    store.set(JOINED_RANK.format(rank), "1")
    store.add(JOINED, 1)
    started = time.monotonic()
    deadline = started + timeout.total_seconds()
    suspects, start, pause, next_scan = {}, 0, 0.001, started + SCAN_AFTER_SECONDS
    while store.add(JOINED, 0) < size:
        now = time.monotonic()
        plain, bad = None, None
        if now >= next_scan:
            plain = _plain_gloo_rank(store, rank, size, start, suspects, now)
            bad = _bad_configuration(store, rank, size, start)
            start = (start + PEERS_PER_SCAN) % size
            next_scan = now + SCAN_EVERY_SECONDS
        if bad is not None:
            store.add(BAD_CONFIG_SEEN, 1)
            _linger_until_told(store, size)
            raise RuntimeError(
                f"compcoll: group '{group}': rank {bad[0]} cannot create it with compcoll: its "
                f"COMPCOLL_* settings are refused ({bad[1]}); set the same valid values on "
                f"every rank (rank {rank} waited for it)")
        if plain is not None:
            algo = os.environ.get("COMPCOLL_ALGO", "")
            why = f"COMPCOLL_ALGO={algo} here" if algo else "the group's backend is compcoll here"
            raise RuntimeError(
                f"compcoll: group '{group}': rank {plain} is creating it as torch's own gloo, "
                f"without compcoll, while rank {rank} creates it with compcoll ({why}): "
                "COMPCOLL_ALGO (and the backend asked for) must be the same on every rank (an "
                "environment that did not reach every node or process?); set it alike "
                "everywhere, or unset it everywhere")
        if now >= deadline:
            missing = _missing(store, rank, size)
            raise RuntimeError(
                f"compcoll: group '{group}': ranks {missing} did not create it with compcoll "
                f"within the group's timeout of {timeout.total_seconds():.0f} s (rank {rank} "
                "waited for them); they did not start, or created another group")
        time.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE_SECONDS)
