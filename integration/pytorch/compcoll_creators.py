"""torch's table of c10d backend creators (torch.distributed.Backend._plugins,
where torch 2.15 registers "gloo" and "nccl" too): a creator's two calling
conventions, and putting compcoll's own creator, or a wrapper, in front of
torch's creator for a backend name. Nothing else of torch is touched.

A module of its own, outside the compcoll package, so that the autoload
(compcoll_autoload) can wrap torch's creators at `import torch` without
importing compcoll and its extension."""
from collections import namedtuple

import torch.distributed as dist

# torch's NCCL backends: "nccl" (in torch 2.15 its nccl2 backend) and the
# older one it keeps as "nccl-legacy"; a name this torch lacks is skipped.
NCCL_BACKENDS = ("NCCL", "NCCL-LEGACY")

# enable_reconfigure: torch's fault-tolerance regime (a group that waits for
# reconfigure() before its first collective), asked for by the script.
CreatorArgs = namedtuple("CreatorArgs",
                         "store rank size timeout group_name global_ranks enable_reconfigure",
                         defaults=(False,))


def creator_args(args):
    """The group a creator is asked to build, for either calling convention
    of Backend.register_backend."""
    if len(args) == 2:  # extended_api: (_DistributedBackendOptions, backend_options)
        opts, _backend_options = args
        return CreatorArgs(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                           getattr(opts, "group_id", None),
                           getattr(opts, "global_ranks_in_group", None),
                           bool(getattr(opts, "enable_reconfigure", False)))
    store, rank, size, timeout = args
    return CreatorArgs(store, rank, size, timeout, None, None)


def torch_plugin(name):
    """torch's plugin (creator_fn, extended_api) for backend `name` ("GLOO"),
    or None on a torch that builds that backend outside the table."""
    Backend = dist.Backend
    ensure = getattr(Backend, "_ensure_backend_registered", None)
    if ensure is not None:
        ensure(name.lower())  # torch registers its own creators lazily
    if not hasattr(Backend, "_BackendPlugin"):
        return None
    return getattr(Backend, "_plugins", {}).get(name)


def set_creator(name, creator, extended_api):
    dist.Backend._plugins[name] = dist.Backend._BackendPlugin(creator, extended_api)


def wrap(name, wrapper):
    """Makes backend `name` build its groups through wrapper(creator, *args),
    where creator(*args) builds the group as before. False where this torch
    has no such creator."""
    original = torch_plugin(name)
    if original is None:
        return False

    def creator(*args):
        return wrapper(original.creator_fn, *args)

    creator.torch_creator = torch_creator(original)
    set_creator(name, creator, original.extended_api)
    return True


def torch_creator(plugin):
    """torch's own creator under a plugin's wrappers (those of wrap())."""
    return getattr(plugin.creator_fn, "torch_creator", plugin.creator_fn)


def call_first(name, before):
    """Makes the creator of backend `name` call before(CreatorArgs) and then
    build the group as it did. False where this torch has no such creator."""
    def first(creator, *args):
        before(creator_args(args))
        return creator(*args)

    return wrap(name, first)
