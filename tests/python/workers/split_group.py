"""split_group and merge_remote_group on a group that COMPCOLL_ALGO turned
into compcoll (an unmodified "gloo" script): the groups made from it are
compcoll groups of their own. 3 ranks: split [[0, 2], [1]], then [[0, 1]]
(rank 2 in no child), then every rank merged into one group on a store of
its own (as fault-tolerant trainers rebuild a group). Each compresses its
allreduces; the parent keeps working beside them. Reports results as
checksums, each group's stats and its backend."""
import datetime
import hashlib

import torch
import torch.distributed as dist

import compcoll
from common import emit

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()


def run(group, steps=4, n=100_000, registered=True):
    """Compressed allreduces of per-rank random gradients; a digest of the
    results (equal on the group's ranks when their bits are equal)."""
    g = torch.Generator().manual_seed(rank)
    digest = hashlib.sha256()
    for _ in range(steps):
        t = torch.randn(n, generator=g)
        if registered:
            dist.all_reduce(t, group=group)
        else:  # a merged group is not in torch.distributed's registry
            group.allreduce([t]).wait()
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def describe(group, registered=True):
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    digest = run(group, registered=registered)
    st = compcoll.stats(group)
    ranks = dist.get_process_group_ranks(group) if registered else list(range(group.size()))
    return {"ranks": ranks, "digest": digest,
            "backend": group._get_backend(torch.device("cpu")).name(),
            "name": group.group_name, "compressed_calls": st["compressed_calls"],
            "algo": st["algo"]}


run(None, steps=1)  # the parent compresses before the split
first = dist.split_group(split_ranks=[[0, 2], [1]])
second = dist.split_group(split_ranks=[[0, 1]])
store = dist.PrefixStore("merge", dist.distributed_c10d._get_default_store())
merged = dist.group.WORLD.merge_remote_group(store, 3, datetime.timedelta(seconds=60), "merged")
out = {"first": describe(first), "second": describe(second), "world": describe(dist.group.WORLD),
       "merged": describe(merged, registered=False), "rank": rank}
emit(out)
dist.destroy_process_group()
