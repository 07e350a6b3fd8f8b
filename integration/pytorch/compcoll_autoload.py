"""compcoll's torch entry points, kept apart from the compcoll package so
that `import torch` pays nothing for them when compression is off.

autoload()           group "torch.backends": torch runs it at `import torch`
                     (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0). With
                     COMPCOLL_ALGO set to an algorithm other than dense it
                     makes the "gloo" backend resolve to compcoll at once (see
                     compcoll._backend.install_gloo_hook). Otherwise it
                     imports nothing of compcoll and only puts a small check
                     in front of torch's gloo and NCCL creators, which reads
                     the environment again as each group is created:
                     - COMPCOLL_ALGO set since `import torch` (a script that
                       sets os.environ before init_process_group, as it sets
                       MASTER_ADDR): the group is compcoll's all the same;
                     - other COMPCOLL_* variables set: the first group says
                       that they change nothing (compcoll._notices);
                     - nothing set: torch builds the group, nothing imported.
register_compcoll()  group "torch.distributed.backends": torch runs it the
                     first time the backend name "compcoll" is used.
"""
import functools
import os
import sys
import threading
import time

# The keys a compcoll rank sets on the group's store as it joins
# (compcoll._join, which reads them from here: one spelling).
JOINED = "compcoll_join/count"
JOINED_RANK = "compcoll_join/rank/{}"
GLOO_ANNOUNCES = "0/{}"  # torch's ProcessGroupGloo: device 0's context, rank p
PEERS_PER_SCAN = 8  # the store serves every rank of the job
# How long a rank building torch's own gloo waits, once a compcoll rank has
# joined the same group, before it ends itself: past compcoll._join's grace
# (3 s), so that the compcoll ranks name it first while its store still
# serves them.
PLAIN_RANK_ENDS_AFTER_SECONDS = 5.0
WATCH_AFTER_SECONDS = 1.0
WATCH_EVERY_SECONDS = 0.5


def compression_requested(environ=os.environ):
    """True when COMPCOLL_ALGO names an algorithm other than dense."""
    return environ.get("COMPCOLL_ALGO", "").strip() not in ("", "dense")


def settings_given(environ=os.environ):
    """COMPCOLL_* variables other than COMPCOLL_ALGO are set."""
    return any(k.startswith("COMPCOLL_") and k != "COMPCOLL_ALGO" for k in environ)


def autoload():
    if compression_requested():
        from compcoll import _backend

        _backend.install_gloo_hook()
        return
    import compcoll_creators as creators

    creators.wrap("GLOO", _gloo_group)
    for name in creators.NCCL_BACKENDS:
        creators.wrap(name, functools.partial(_nccl_group, name))


def _gloo_group(creator, *args):
    """torch creates a gloo group, compcoll having been off at `import torch`."""
    if compression_requested():
        from compcoll import _backend

        _backend.install_gloo_hook()  # the next gloo groups go to compcoll directly
        return _backend.create_for_gloo(*args)
    _say_off("GLOO", args)
    done = threading.Event()
    try:
        import compcoll_creators as creators

        a = creators.creator_args(args)
        if a.size > 1:
            threading.Thread(target=_end_if_compcoll_ranks_join, args=(a, done),
                             name="compcoll-plain-gloo-watch", daemon=True).start()
    except Exception:  # noqa: BLE001 - a watch must never break a group's creation
        pass
    try:
        return creator(*args)
    finally:
        done.set()


def _end_if_compcoll_ranks_join(a, done):
    """This rank builds torch's own gloo (COMPCOLL_ALGO unset or dense here)
    while another rank joined the same group with compcoll: torch's
    rendezvous would wait for it for the group's whole timeout (30 minutes
    by default), since the compcoll ranks build their inner Gloo under other
    keys. The compcoll ranks name this rank within seconds and fail
    (compcoll._join); this one says why and ends, as nothing can interrupt
    torch's rendezvous. Idle (no store traffic) when the group is built
    within WATCH_AFTER_SECONDS, as it usually is."""
    if done.wait(WATCH_AFTER_SECONDS):
        return
    # A peer that joined with compcoll and does not announce itself to
    # torch's rendezvous, for PLAIN_RANK_ENDS_AFTER_SECONDS: not a stale key
    # of an earlier group on a reused store (its rank announces, as this one).
    try:
        # A connection of its own: torch's rendezvous holds the group's store
        # client while it waits for the peers, so a check on it would wait too.
        store = a.store.clone()
    except Exception:  # noqa: BLE001 - a store that cannot be cloned: no watch
        return
    suspects, start = {}, 0
    while not done.wait(WATCH_EVERY_SECONDS):
        try:
            if not store.check([JOINED]):
                continue
            now = time.monotonic()
            # Every suspect is checked again each round (a peer that has
            # announced since is cleared), and PEERS_PER_SCAN more are looked at.
            fresh = {(start + i) % a.size for i in range(min(a.size, PEERS_PER_SCAN))}
            for p in sorted(fresh | set(suspects)):
                if p == a.rank:
                    continue
                if (store.check([JOINED_RANK.format(p)])
                        and not store.check([GLOO_ANNOUNCES.format(p)])):
                    suspects.setdefault(p, now)
                else:
                    suspects.pop(p, None)
            start = (start + PEERS_PER_SCAN) % a.size
            ranks = sorted(p for p, t in suspects.items()
                           if now - t >= PLAIN_RANK_ENDS_AFTER_SECONDS)
            if not ranks:
                continue
        except Exception:  # noqa: BLE001 - the store is gone: torch's rendezvous fails itself
            return
        if done.is_set():
            return
        print(f"compcoll: group '{a.group_name or 0}': rank {a.rank} is creating it as torch's "
              f"own gloo (COMPCOLL_ALGO unset or dense here), while rank(s) {ranks} create it "
              "with compcoll: COMPCOLL_ALGO (and the backend asked for) must be the same on "
              "every rank (an environment that did not reach every node or process?); set it "
              "alike everywhere, or unset it everywhere. Ending this process: torch's rendezvous "
              f"would wait for them for the group's timeout ({a.timeout})",
              file=sys.stderr, flush=True)
        os._exit(1)


def _nccl_group(name, creator, *args):
    """torch creates an NCCL group, compcoll having been off at `import torch`."""
    if compression_requested():
        from compcoll import _backend, _notices
        import compcoll_creators as creators

        _backend.install_gloo_hook()  # and the NCCL notice for the next NCCL groups
        _notices.nccl_left_alone(creators.creator_args(args))
    else:
        _say_off(name, args)
    return creator(*args)


_off_unsayable = False  # the fallback below was printed


def _say_off(name, args):
    """compcoll is off, yet configured: the first group says which settings
    change nothing (compcoll._notices). A notice must never break a group's
    creation: if compcoll cannot be loaded, say that instead, once."""
    global _off_unsayable
    if not settings_given():
        return
    try:
        from compcoll import _notices
        import compcoll_creators as creators

        _notices.off_notice(creators.creator_args(args), name)
    except Exception as e:  # noqa: BLE001 - anything, reported below
        if _off_unsayable:
            return
        _off_unsayable = True
        print(f"compcoll WARN COMPCOLL_ALGO is unset or dense, so compcoll is off; the other "
              f"COMPCOLL_* variables set change nothing (compcoll could not be loaded to say "
              f"more: {type(e).__name__}: {e})", file=sys.stderr)


def register_compcoll():
    from compcoll import _backend

    _backend.register()
