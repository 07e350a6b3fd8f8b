"""COMPCOLL_TORCH_SCOPE: compcoll compresses the allreduces issued during a
backward pass (DDP's buckets, comm hooks and what their callbacks issue), and
sends any other exactly, saying so once, since an allreduce of values
(parameters being averaged, evaluation results) would lose most of its
entries to sparsification. COMPCOLL_TORCH_SCOPE=all compresses every
eligible allreduce. compcoll.gradient_scope() marks gradient sums issued
elsewhere, as DDP's Join does for a rank that has run out of inputs."""
import pytest

from conftest import launch, worker

OUTSIDE = "issued outside a backward pass took the exact dense path"


def run(scope):
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_TORCH_SCOPE": scope, "COMPCOLL_DEBUG": "INFO"}
    return launch([worker("scope.py")], 2, env=env, timeout=240)


def test_only_allreduces_in_a_backward_pass_are_compressed_unless_scope_is_all():
    default, everything = run(None), run("all")
    for r, a in zip(default, everything):
        res, res_all = r.result, a.result
        # Outside backward: exact by default (and said once, by rank 0) ...
        assert res["direct"] == {"compressed": 0, "exact": True}, res
        assert res["chained"] == {"compressed": 0, "exact": True}, res
        # A warning where the group compressed nothing before (the world
        # group's direct phase); an INFO line beside compressed DDP (the
        # averaging phase's group), where an allreduce outside backward is
        # values and exact is right.
        said = [ln for ln in r.stderr.splitlines() if OUTSIDE in ln]
        assert len(said) == (2 if r.rank == 0 else 0), r.describe()
        if said:
            warned = [ln for ln in said if ln.startswith("compcoll WARN [rank 0]")]
            assert len(warned) == 1 and "set COMPCOLL_TORCH_SCOPE=all" in warned[0], said
            informed = [ln for ln in said if ln.startswith("compcoll INFO [rank 0]")]
            assert len(informed) == 1 and "taken as values" in informed[0], said
            assert "set COMPCOLL_TORCH_SCOPE=all" in informed[0], said
        assert res["averaging"]["ddp_compressed"] > 0 and res["averaging"]["compressed"] == 0, res
        assert res["averaging"]["exact"], res
        assert res_all["averaging"]["compressed"] == 1 and not res_all["averaging"]["exact"], res_all
        # ... compressed with COMPCOLL_TORCH_SCOPE=all, without a word.
        assert res_all["direct"]["compressed"] == 1 and not res_all["direct"]["exact"], res_all
        assert res_all["chained"]["compressed"] == 2, res_all
        assert OUTSIDE not in a.stderr, a.describe()
        # In backward: DDP's buckets, a hook's chained allreduces and an
        # autograd Function's are compressed alike under both.
        for phase in ("ddp", "hook_chain", "in_backward"):
            assert res[phase]["compressed"] == res_all[phase]["compressed"] > 0, (phase, res, res_all)
        assert res["hook_chain"]["compressed"] > res["ddp"]["compressed"], res
        assert res["in_backward"]["compressed"] == 3, res
        # ... unless the script marked the group as tensor-parallel.
        for got in (res["in_backward_marked"], res_all["in_backward_marked"]):
            assert got == {"marked": True, "calls": 3, "compressed": 0, "exact": True}, got
        # A callback chained on a delegated operation issued in backward
        # takes its scope, on Gloo's thread (rank 0) as at once (rank 1).
        assert res["delegated_chain"] == res_all["delegated_chain"] == {"compressed": 1}, \
            (res, res_all)
        # compcoll.gradient_scope() makes a direct allreduce a gradient sum.
        assert res["scoped"]["compressed"] == res_all["scoped"]["compressed"] == 1, (res, res_all)
        # Leaving it (after a nested scope, and by an exception) restores
        # the thread's scope: exact by default, compressed under all.
        assert res["scoped"]["after"] == 0 and res["scoped"]["after_exact"], res
        assert res_all["scoped"]["after"] == 1 and not res_all["scoped"]["after_exact"], res_all
        # DDP's Join: rank 0, out of inputs from the start, shadows rank 1's
        # backward passes outside any backward pass of its own, and takes
        # the same (compressed) route; it takes part in the optimizer-step
        # agreement on the momentum without an optimizer. The replicas stay
        # equal, both ranks make as many compressed calls (rank 1's 4 steps,
        # one more than the ddp phase's 3, whose first step compresses one
        # bucket and the others two each), and the momentum is taken over.
        for j in (res["join"], res_all["join"]):
            assert j == {"compressed": res["ddp"]["compressed"] + 2, "replicas_equal": True,
                         "optimizer_momentum": 0.9}, (res, res_all)
        # Two optimizers stepped one after the other are one step to the
        # hand-over, on the shadowing rank as on the other.
        for j in (res["join_two_optimizers"], res_all["join_two_optimizers"]):
            assert j == {"replicas_equal": True, "optimizer_momentum": 0.9}, (res, res_all)


@pytest.mark.parametrize("imported,scope,compiled", [("early", None, False),
                                                     ("late", "all", False),
                                                     ("early", None, True)])
def test_tensor_parallel_allreduces_stay_exact_beside_compressed_ddp(imported, scope, compiled):
    """DDP over the "dp" dimension of a 2 x 2 mesh, a column-wise and a
    row-wise layer over "tp" (DTensor). The tensor-parallel allreduces (the
    row-wise output in forward, the column-wise input gradient in backward)
    sum activations: exact under either scope, with DTensor imported before
    or after the process group, and said once at INFO by each tp group's
    rank 0, never at WARN. DDP's gradient sums are compressed. Before,
    the backward ones were compressed with a residual carried from batch to
    batch, and the forward ones drew the WARN that advises
    COMPCOLL_TORCH_SCOPE=all. Compiled (torch.compile; without DDP, which
    torch cannot compile over TP), the collectives run from the graphs and
    stay exact: it is the group that is marked, not the call. A Partial
    DTensor made Replicate without a parallel style marks its group too,
    and over the dp group, after DDP compressed there, says so at WARN."""
    steps = 4
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "INFO", "COMPCOLL_TORCH_SCOPE": scope,
           "IMPORT": imported, "STEPS": str(steps), "COMPILE": "1" if compiled else None}
    ranks = launch([worker("tensor_parallel.py")], 4, env=env, timeout=300)
    for r in ranks:
        dp, tp = r.result["groups"]["dp"], r.result["groups"]["tp"]
        assert r.result["partial"] == {"marked_before": False, "marked_after": True,
                                       "exact": True}, r.result["partial"]
        if compiled:
            assert dp["compressed_calls"] == 0, dp  # no DDP (one exact call, the last phase)
        else:
            assert dp["compressed_calls"] >= steps and dp["ratio"] > 20, (r.rank, dp)
        # One allreduce in forward and one in backward per step, all exact.
        assert tp["calls"] == 2 * steps and tp["compressed_calls"] == 0, (r.rank, tp)
        warns = [ln for ln in r.stderr.splitlines() if "compcoll WARN" in ln]
        if compiled:  # nothing compressed in the job: said, naming why
            assert all("compressed none" in ln and "a tensor-parallel group's" in ln
                       for ln in warns), r.describe()
        else:
            # Only the last phase's: a Partial reduced over the dp group,
            # after its DDP compressed, by that group's rank 0 (ranks 0, 1).
            late = ("marked as carrying tensor parallelism after "
                    f"{dp['compressed_calls']} compressed allreduces")
            assert len(warns) == (1 if r.rank in (0, 1) else 0), r.describe()
            assert all(late in ln for ln in warns), r.describe()
        said = [ln for ln in r.stderr.splitlines()
                if "took the exact dense path, as will every allreduce of this group" in ln
                and "carries tensor parallelism" in ln]
        # Once per marked group, by its rank 0: ranks 0 and 2 are their tp
        # group's (mesh [[0, 1], [2, 3]]), ranks 0 and 1 their dp group's,
        # rank 0 the flat mesh's.
        assert len(said) == {0: 3, 1: 1, 2: 1}.get(r.rank, 0), r.describe()
        assert all(ln.startswith("compcoll INFO [rank 0]") for ln in said), said  # group rank
    # Data-parallel peers hold the same shards; the two tp ranks differ.
    digests = [r.result["digest"] for r in ranks]
    assert digests[0] != digests[1] and (compiled or digests[0] == digests[2]
                                         and digests[1] == digests[3]), digests


def test_sync_batchnorm_statistics_stay_exact_inside_the_backward_pass():
    """SyncBatchNorm's backward allreduces the statistics of its input
    gradient (2C floats) from inside the backward pass, where the default
    scope compresses: they are values, and sparsified they made every input
    gradient of the batch wrong (relative error ~0.2 at C = 8192, found by an
    outside review). They take the exact route: the input gradients are a
    plain Gloo run's, bit for bit, and nothing is compressed."""
    env = {"STEPS": "3", "CHANNELS": "8192"}
    plain = launch([worker("sync_batchnorm.py")], 2,
                   env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"), timeout=180)
    ours = launch([worker("sync_batchnorm.py")], 2, env=dict(env, COMPCOLL_ALGO="dgc"),
                  timeout=180)
    for p, o in zip(plain, ours):
        assert "stats" not in p.result, p.describe()
        stats = o.result["stats"]
        assert stats["calls"] == 3 and stats["compressed_calls"] == 0, o.describe()
        assert o.result["checksum"] == p.result["checksum"], (p.describe(), o.describe())



@pytest.mark.parametrize("mode", ["checkpoint", "checkpoint_reentrant", "checkpoint_in_function",
                                  "differentiable"])
def test_activations_summed_in_a_backward_pass_stay_exact(mode):
    """Allreduces issued inside the backward pass that sum activations or
    their gradients: activation checkpointing's recomputation of a forward
    allreduce (non-reentrant, also when it runs inside a Function of the
    script's own, and reentrant) and the backward of
    torch.distributed.nn.functional.all_reduce. They were compressed as
    gradient sums (4 of 8 calls), so the gradients differed from the
    uncheckpointed model's (0.3028 against 0.3072) and a residual of
    activations was carried into the next batch, silently. Now they are
    exact (said once at INFO, naming the autograd node), the gradients equal
    those of the same model with exact sums bit for bit, and DDP's bucket
    beside them is still compressed at every step."""
    ranks = launch([worker("activations_in_backward.py")], 2,
                   env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_WARMUP_STEPS": "0",
                        "COMPCOLL_DEBUG": "INFO", "TEST_MODE": mode}, timeout=240)
    for r in ranks:
        res = r.result
        assert res["alone"] == {"compressed": 0, "exact": True, "steps": 3}, (r.rank, res)
        assert res["ddp"]["compressed"] == res["ddp"]["steps"], (r.rank, res)
    note = "issued in a backward pass "
    said = [ln for ln in ranks[0].stderr.splitlines()
            if ln.startswith("compcoll INFO") and note in ln and "took the exact dense path" in ln]
    assert len(said) == 1, ranks[0].describe()
    assert ("recomputation of a forward" if mode.startswith("checkpoint_in") or mode == "checkpoint"
            else "while autograd evaluated") in said[0], said
    assert not [ln for ln in ranks[1].stderr.splitlines() if note in ln]
