"""split_group and merge_remote_group (torch asks a group's backend for the
new group's) on compcoll groups: every such group is a compcoll group that
compresses, with bits equal on its ranks; a rank outside every child of a
split gets no group; the parent keeps working. Plain Gloo can do both, so a
compcoll group must too."""
import json

# Their workers allreduce outside a backward pass and expect compression.
from conftest import launch_direct as launch, worker


def test_split_and_merged_groups_are_compcoll_groups_that_compress(tmp_path):
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json")}
    ranks = launch([worker("split_group.py")], 3, env=env, timeout=240)
    res = [r.result for r in ranks]
    for key, members in (("first", {0: [0, 2], 1: [1], 2: [0, 2]}),
                         ("second", {0: [0, 1], 1: [0, 1], 2: None}),
                         ("world", {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}),
                         ("merged", {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]})):
        for r in res:
            group = r[key]
            if members[r["rank"]] is None:
                assert group is None, (key, r)
                continue
            assert group["ranks"] == members[r["rank"]], (key, r)
            assert group["backend"] == "compcoll" and group["algo"] == "dgc", (key, group)
            assert group["compressed_calls"] > 0, (key, group)
        # Equal bits on the ranks of each child.
        by_members = {}
        for r in res:
            if r[key] is not None:
                by_members.setdefault(tuple(r[key]["ranks"]), set()).add(r[key]["digest"])
        assert all(len(d) == 1 for d in by_members.values()), (key, by_members)
    # Each process's stats file names every group it was in.
    for r in res:
        with open(tmp_path / f"stats{r['rank']}.json") as f:
            st = json.load(f)
        names = {r[k]["name"] for k in ("first", "second", "world", "merged") if r[k] is not None}
        assert set(st["groups"]) == names, (st["groups"].keys(), names)


def test_a_group_asked_for_with_enable_reconfigure_is_never_silently_compcoll():
    """torch's enable_reconfigure asks for a group that reconfigure() sets up
    later; compcoll cannot be reconfigured. Under COMPCOLL_ALGO a "gloo"
    group asked for that way stays torch's own Gloo, and rank 0 says so;
    init_process_group("compcoll", enable_reconfigure=True) is an error that
    says why. (Before, compcoll built the group at once and ignored it.)"""
    gloo = launch([worker("reconfigure.py")], 1, env={"COMPCOLL_ALGO": "dgc",
                                                       "RECONFIGURE_BACKEND": "gloo"})[0]
    assert gloo.result == {"cpu_backend": "gloo", "supports_reconfigure": True}, gloo.describe()
    said = [ln for ln in gloo.stderr.splitlines() if ln.startswith("compcoll WARN")]
    assert len(said) == 1 and "enable_reconfigure=True" in said[0] \
        and "it is torch's own Gloo, and its allreduces are not compressed" in said[0], said
    explicit = launch([worker("reconfigure.py")], 1, env={"COMPCOLL_ALGO": "dgc",
                                                          "RECONFIGURE_BACKEND": "compcoll"})[0]
    assert "compcoll: group '0' is created with enable_reconfigure=True" in \
        explicit.result.get("error", ""), explicit.describe()
