"""Error-feedback keys (BufferSlots) and the stats file at exit, on one or
two ranks."""
import json
import os

# Their workers allreduce outside a backward pass and expect compression.
from conftest import launch_direct as launch, worker


def test_buffer_slot_rules(tmp_path):
    r = launch([worker("keys_unit.py")], 1, env={"COMPCOLL_ALGO": "dgc"})[0].result
    s = r["steps"]
    # 1. a live buffer keeps its slot
    assert [e for _, _, e in s["persistent"]] == ["new", "same", "same"]
    assert len({k for k, _, _ in s["persistent"]}) == 1
    # views of one storage at different offsets are different buffers
    assert s["views"][0][0] != s["views"][1][0] and s["views"][2][0] == s["views"][0][0]
    # a new buffer while the old one is alive is another tensor: new state
    assert [e for _, _, e in s["alive_new_buffer"]] == ["new", "new"]
    # 2b/2a: reallocated every step: fresh state once (as at DDP's rebuild), then carried
    events = [e for _, _, e in s["reallocated"]]
    keys = [k for k, _, _ in s["reallocated"]]
    assert events == ["new", "fresh", "carried", "carried"]
    assert keys[0] != keys[1] and keys[1] == keys[2] == keys[3]
    # a tensor reallocated every call while the previous one is alive: two
    # slots alternate (A B A B), the third overlapped takeover (call 5)
    # merges A's state into B's and goes to B, and every later call continues B,
    # also once the previous tensor is freed first (calls 10, 11)
    slot_ids = [k.split(".")[0] for k, _, _ in s["overlapping"]]  # "t<slot>.<generation>"
    a, b = slot_ids[0], slot_ids[1]
    assert a != b and slot_ids == [a, b, a, b] + [b] * 7, slot_ids
    shaped = {x["key"].split(".")[0]: x for x in s["overlapping_slots"]}
    assert shaped[a]["retired"] and not shaped[a]["chain"], shaped
    assert shaped[b]["chain"] and not shaped[b]["retired"] and shaped[b]["uses"] == 9, shaped
    assert sum(x["overlapped"] for x in shaped.values()) == 3, shaped
    # two tensors of one shape reallocated so are left to alternate, never merged
    assert not [x for x in s["two_overlapping"] if x["overlapped"] or x["chain"] or x["retired"]]
    # ...and nothing else in this script was
    assert all(x["overlapped"] == 0 and not x["chain"] and not x["retired"]
               for x in r["slots"] if x["numel"] != 20_007)
    # temporaries freed right after their call, inside backward passes: one
    # slot per position, never shared within a pass; fresh at the second
    # pass (2b), carried after it
    passes = s["temporaries_in_backward"]
    slots_by_pass = [[k.split(".")[0] for k, _, _ in p] for p in passes]
    assert len(set(slots_by_pass[0])) == 3 and all(x == slots_by_pass[0] for x in slots_by_pass)
    events = [[e for _, _, e in p] for p in passes]
    # a fresh state at the first pass (a new slot, or a dead one of another
    # shape left by the steps above); the second pass carries it, or starts
    # afresh once on a slot never replaced before (2b); then carried
    assert set(events[0]) <= {"new", "resized"}, events
    assert set(events[1]) <= {"fresh", "carried"} and events[2:] == [["carried"] * 3] * 2, events
    assert all(sorted(n for _, n, _ in p) == [20_003, 20_003, 20_005] for p in passes), passes
    assert [p[0][1] for p in passes] == [passes[0][0][1]] * 4  # one call order every pass
    # two owners taking turns with temporaries of one shape: one slot each
    owned = s["owners_in_turn"]
    slot_of = {o: {k.split(".")[0] for k, _, _ in calls} for o, calls in owned.items()}
    assert all(len(v) == 1 for v in slot_of.values()) and slot_of["1"] != slot_of["2"], owned
    assert all([e for _, _, e in calls][2:] == ["carried"] * 2 for calls in owned.values()), owned
    # 2b': a lasting buffer's tensor is gone: the next is another tensor
    gone = s["lasting_then_gone"]
    events = [e for _, _, e in gone]  # a new slot, or a dead one of another shape (2c)
    assert events[0] in ("new", "resized") and events[1:] == [
        "same", "same", "fresh", "fresh", "carried"], gone
    assert len({k for k, _, _ in gone}) == 3 and gone[4][0] == gone[5][0], gone
    # 2c: another size takes over a dead slot; the Communicator replaces the state
    assert s["other_size_takes_dead_slot"][0][2] == "resized"
    assert s["small_dense_no_slot"] is True
    shapes, nslots = s["shapes_after_300_sizes"]
    assert shapes <= nslots < 20, s["shapes_after_300_sizes"]
    # 2c with the same element count in another dtype: the residual is dropped
    assert s["dtype_change"] == ["resized", True], s["dtype_change"]
    assert r["stats"]["compressed_calls"] >= 14


def test_stats_file_written_at_exit_without_destroy(tmp_path):
    """A script that never destroys its process group still writes
    COMPCOLL_STATS_FILE (the backend is finished at interpreter exit)."""
    code = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "x = torch.randn(50_000)\n"
            "for _ in range(3): dist.all_reduce(x)\n"
            "print('RESULT {}')\n")
    env = {"COMPCOLL_ALGO": "onebit", "COMPCOLL_STATS_FILE": str(tmp_path / "s{rank}.json")}
    launch(["-c", code], 2, env=env)
    for rank in range(2):
        with open(os.path.join(tmp_path, f"s{rank}.json")) as f:
            st = json.load(f)
        assert st["algo"] == "onebit" and st["compressed_calls"] == 3 and st["rank"] == rank


def test_functional_collectives_keep_one_state_when_results_are_held():
    """torch's functional collectives (what torch.compile and DTensor call)
    reduce a new output tensor every call. A loop that keeps each result
    until the next one exists reallocates with overlap: the backend merges
    the two alternating states once and continues one chain; results stay
    identical on every rank and every call is compressed."""
    code = (
        "import json, torch, torch.distributed as dist\n"
        "import torch.distributed._functional_collectives as funcol\n"
        "dist.init_process_group('gloo')\n"
        "import compcoll\n"
        "torch.manual_seed(dist.get_rank())\n"
        "y, sums = None, []\n"
        "for _ in range(10):\n"
        "    y = funcol.wait_tensor(funcol.all_reduce(torch.randn(50_000), 'sum', dist.group.WORLD))\n"
        "    sums.append(float(y.double().sum()))\n"
        "st = compcoll.stats()\n"
        "print('RESULT ' + json.dumps({'sums': sums, 'slots': compcoll.slots(),\n"
        "      'compressed': st['compressed_calls']}))\n"
        "dist.destroy_process_group()\n")
    ranks = launch(["-c", code], 2, env={"COMPCOLL_ALGO": "dgc"})
    assert ranks[0].result["sums"] == ranks[1].result["sums"]
    for r in ranks:
        assert r.result["compressed"] == 10, r.describe()
        slots = r.result["slots"]
        assert [s["chain"] for s in slots].count(True) == 1, slots
        assert [s["retired"] for s in slots].count(True) == 1, slots
        assert not [ln for ln in r.stderr.splitlines() if "compcoll WARN" in ln], r.describe()
