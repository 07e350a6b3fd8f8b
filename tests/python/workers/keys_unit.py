"""The buffer-slot rules (docs/pytorch.md, "Error-feedback keys") on one
rank: which key and event each allreduce gets."""
import gc

import torch
import torch.distributed as dist

from common import emit, init

rank, world = init("compcoll")
import compcoll  # noqa: E402
from compcoll import _C  # noqa: E402

b = compcoll.backend_of()
N = 20_000


def ar(t):
    dist.all_reduce(t)
    key, numel, event = _C.key_trace(b)[-1]
    return [key, numel, event]


steps = {}
persistent = torch.randn(N)
steps["persistent"] = [ar(persistent) for _ in range(3)]
view_a, view_b = torch.randn(2 * N).split(N)  # two views of one storage
steps["views"] = [ar(view_a), ar(view_b), ar(view_a)]
kept = [torch.randn(N)]
steps["alive_new_buffer"] = [ar(kept[0])]
kept.append(torch.randn(N))
steps["alive_new_buffer"].append(ar(kept[1]))
# reallocated every step (p.grad with zero_grad(set_to_none=True)):
realloc = []
for _ in range(4):
    g = torch.randn(N)
    realloc.append(ar(g))
    del g
    gc.collect()
steps["reallocated"] = realloc
# reallocated every call, the previous tensor still alive during the next
# call (a comm hook returning the tensor it reduced): two slots alternate
# until the third overlapped takeover, whose slot's state is merged into
# the other, which every later call continues.
M = N + 7  # a shape no other step uses
prev, overlap = None, []
for _ in range(9):
    g = torch.randn(M)
    overlap.append(ar(g))
    prev = g  # noqa: F841 (held until the next call has reduced its tensor)
del prev, g
gc.collect()
# and once the previous tensor is freed first: the chain goes on
for _ in range(2):
    overlap.append(ar(torch.randn(M)))
    gc.collect()
steps["overlapping"] = overlap
steps["overlapping_slots"] = [s for s in compcoll.slots() if s["numel"] == M]
# two tensors of one shape, each reallocated every step with the previous
# step's pair still alive: never merged (that would mix the two tensors)
M2 = N + 11
prev2, pairs = None, []
for _ in range(8):
    pair = [torch.randn(M2), torch.randn(M2)]
    pairs.append([ar(pair[0]), ar(pair[1])])
    prev2 = pair  # noqa: F841
del prev2, pair
gc.collect()
steps["two_overlapping"] = [s for s in compcoll.slots() if s["numel"] == M2]
# Inside backward passes, a temporary per parameter, freed before the next
# one (compiled autograd's python reducer): two of one shape and one of
# another. Each keeps its own state: the k-th of a shape in a pass takes the
# slot of the k-th in the previous pass, never one used in its own pass.
grads = [torch.nn.Parameter(torch.randn(N + 3)) for _ in range(2)]
grads.append(torch.nn.Parameter(torch.randn(N + 5)))
passes = []


def reduce_a_temporary(p):
    tmp = p.grad * 1.0  # freed when the hook returns
    passes[-1].append(ar(tmp))


for p in grads:
    p.register_post_accumulate_grad_hook(reduce_a_temporary)
for _ in range(4):
    passes.append([])
    sum((p * p).sum() for p in grads).backward()
    for p in grads:
        p.grad = None
steps["temporaries_in_backward"] = passes
# Two owners (two models' comm hooks, compcoll/_ddp_hooks.py), each reducing
# one temporary of one shape in a backward pass of its own, taking turns:
# one slot per owner, never the other's.
owned = {1: [], 2: []}
models = {o: torch.nn.Parameter(torch.randn(N + 9)) for o in owned}


def owned_temporary(owner):
    def hook(p):
        saved = _C._enter_owner(owner)
        try:
            owned[owner].append(ar(p.grad * 1.0))
        finally:
            _C._exit_owner(saved)
    return hook


for o, p in models.items():
    p.register_post_accumulate_grad_hook(owned_temporary(o))
for _ in range(4):
    for p in models.values():
        (p * p).sum().backward()
        p.grad = None
steps["owners_in_turn"] = owned
# 2b': a lasting buffer (reduced call after call) is freed, then buffers of
# its shape come, each freed after one call: the first is another tensor (a
# new DDP model's first bucket after the previous model was freed), fresh,
# and the slot starts over, so the next (that model's rebuild) is a first
# replacement, fresh too; the one after it carries.
L = N + 13
lasting = torch.randn(L)
steps["lasting_then_gone"] = [ar(lasting) for _ in range(3)]
del lasting
gc.collect()
for _ in range(3):
    t = torch.randn(L)
    steps["lasting_then_gone"].append(ar(t))
    del t
    gc.collect()
del persistent
gc.collect()
steps["other_size_takes_dead_slot"] = [ar(torch.randn(N + 1))]
# Sizes that keep changing (a temporary per call, each of another length):
# the slots' per-shape counts stay at most one per slot, not one per size.
for i in range(300):
    dist.all_reduce(torch.randn(N + 2 + i))
steps["shapes_after_300_sizes"] = [_C.slot_shapes_tracked(b), len(compcoll.slots())]
before = len(_C.key_trace(b))
dist.all_reduce(torch.randn(100))  # kept dense by the policy: no slot, no state
steps["small_dense_no_slot"] = len(_C.key_trace(b)) == before
x = torch.randn(N, dtype=torch.float16)
steps["half"] = [ar(x), ar(x)]
# 2c across dtypes: a float16 buffer taking over the dead slot of a float32
# one of the same element count gets a fresh state, not the float32 residual.
# A fresh group, so that this dead slot is the only one.
g = dist.new_group(backend="compcoll")
f32 = torch.randn(N)
dist.all_reduce(f32, group=g)
dist.all_reduce(f32, group=g)  # a residual now
del f32
gc.collect()
x16 = torch.randn(N).to(torch.float16)
took_over = x16.clone()
dist.all_reduce(took_over, group=g)
event = _C.key_trace(compcoll.backend_of(g))[-1][2]
fresh = x16.clone()  # took_over is alive: a new slot, a fresh state
dist.all_reduce(fresh, group=g)
steps["dtype_change"] = [event, bool(torch.equal(took_over, fresh))]
dist.destroy_process_group(g)
emit({"steps": steps, "slots": compcoll.slots(), "stats": compcoll.stats()})
dist.destroy_process_group()
