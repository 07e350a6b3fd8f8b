"""PyTorch's own DDP communication hooks under every compcoll algorithm
(issue 14), what FSDP's reduce-scatter means for compcoll, subgroups in the
stats file, and a clean DDP run's log (issue 12: no WARN for what is
expected)."""
import json
import os

import pytest

from conftest import launch, worker

ALGOS = ["dense", "dgc", "sbc", "sdagc", "csc", "onebit", "auto"]
HOOKS = ["powerSGD", "batched_powerSGD", "fp16_compress", "allreduce"]


def final_loss(run):
    """The mean of the last three steps' losses (one step is noisier)."""
    return sum(run["losses"][-3:]) / 3


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_comm_hooks_under_every_algorithm(world):
    """Every hook trains the same model over a Gloo group and over one
    compcoll group per algorithm (one process launch for all of them). Each
    finishes with parameters bitwise equal on every rank. dense is Gloo bit
    for bit (auto, even where it compresses nothing, may reduce float16 in
    another order at 4 ranks: it is held to the loss bound). The lossy
    algorithms compress what is at least COMPCOLL_MIN_ELEMS of the whole
    bucket of allreduce_hook and fp16_compress_hook; PowerSGD compresses
    itself, so nothing it issues is compressed again
    (test_powersgd_factors_are_never_compressed_again); their loss stays
    within the noise of Gloo's
    (batch to batch it moves by about 0.02-0.04 over these steps; measured
    here: the compressed runs' mean of the last three steps is within 0.003
    of Gloo's, so 0.02 is the bound)."""
    ranks = launch([worker("hooks.py")], world,
                   env={"TEST_HOOKS": ",".join(HOOKS), "TEST_ALGOS": ",".join(ALGOS),
                        "TEST_STEPS": "6", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                   timeout=420)
    for r in ranks:
        for hook in HOOKS:
            runs = r.result[hook]
            gloo = runs["gloo"]
            assert gloo["identical"], f"rank {r.rank} {hook}: Gloo itself diverged"
            for algo in ALGOS:
                run = runs[algo]
                where = f"rank {r.rank}, {world} ranks, {hook}, {algo}"
                assert run["identical"], f"{where}: ranks differ"
                assert len(run["losses"]) == 6, where
                if algo == "dense":
                    assert run["equal_to_gloo"], f"{where}: {run['losses']} vs {gloo['losses']}"
                elif "powerSGD" in hook:
                    # PowerSGD compresses itself: what it issues goes exact.
                    assert run["compressed_calls"] == 0, where
                    assert abs(final_loss(run) - final_loss(gloo)) <= 0.02, \
                        f"{where}: {run['losses']} vs Gloo {gloo['losses']}"
                else:
                    assert run["compressed_calls"] > 0 or algo == "auto", where
                    assert abs(final_loss(run) - final_loss(gloo)) <= 0.02, \
                        f"{where}: {run['losses']} vs Gloo {gloo['losses']}"
            if r.rank == 0:
                print(f"{world} ranks {hook}: gloo {final_loss(gloo):.4f} " +
                      " ".join(f"{a} {final_loss(runs[a]):.4f}" for a in ALGOS))


def test_fsdp_full_shard_warns_and_subgroups_reach_the_stats_file(tmp_path):
    """FSDP FULL_SHARD (default group) and fully_shard (a subgroup) under
    COMPCOLL_ALGO: their gradients go through reduce-scatter, nothing is
    compressed, and rank 0 says so once per group at WARN. The stats file
    (one per process) holds both groups under their names."""
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_STATS_FILE": str(tmp_path / "stats{rank}.json")}
    ranks = launch([worker("fsdp.py")], 2, env=env, timeout=240)
    warning = "compcoll compresses allreduce only"
    for r in ranks:
        res = r.result
        assert res["full_shard_backend"] == "compcoll", res
        for name, st in res["groups"].items():
            if name == "sub" and not res["fsdp2"]:
                continue
            assert st["compressed_calls"] == 0 and st["reduce_scatter_calls"] > 0, (name, st)
        lines = [ln for ln in r.stderr.splitlines() if warning in ln]
        expected = (2 if res["fsdp2"] else 1) if r.rank == 0 else 0
        assert len(lines) == expected, r.describe()
        assert all("compcoll WARN" in ln for ln in lines), lines
    for rank in range(2):
        with open(tmp_path / f"stats{rank}.json") as f:
            st = json.load(f)
        assert st["rank"] == rank and st["world_size"] == 2, st
        assert set(st["groups"]) == ({"0", "1"} if ranks[rank].result["fsdp2"] else {"0"}), st
        for name, g in st["groups"].items():
            assert g["group"] == name and g["reduce_scatter_calls"] > 0, g
        assert st["calls"] == sum(g["calls"] for g in st["groups"].values()), st


@pytest.mark.parametrize("mode", ["fsdp1", "fsdp2"])
def test_hsdp_compresses_the_allreduce_across_replicas(mode):
    """FSDP HYBRID_SHARD (fsdp1) and fully_shard on a 2-D mesh (fsdp2), 2
    replicas of 2 shards: every step's reduced shard is allreduced across
    replicas, and that allreduce is compressed (the replicate groups count a
    compressed call per step and FSDP unit); the reduce-scatters within a
    replica are not, and the shard groups' rank 0 says so at INFO (other
    groups compress), never with the WARN that nothing is saved. Replica
    peers hold the same parameter shard bit for bit."""
    steps = 3
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "INFO", "MODE": mode, "STEPS": str(steps)}
    ranks = launch([worker("hsdp.py")], 4, env=env, timeout=240)
    for r in ranks:
        rep, shard = r.result["groups"]["replicate"], r.result["groups"]["shard"]
        assert rep["compressed_calls"] >= steps and rep["ratio"] > 20, (r.rank, rep)
        assert shard["compressed_calls"] == 0 and shard["reduce_scatter_calls"] >= steps, shard
        assert "saves nothing" not in r.stderr, r.describe()
        infos = [ln for ln in r.stderr.splitlines()
                 if "compcoll compresses allreduce only" in ln and "(HSDP)" in ln]
        # Ranks 0 and 2 are their shard group's rank 0 (mesh [[0, 1], [2, 3]]).
        assert len(infos) == (1 if r.rank in (0, 2) else 0), r.describe()
        assert all("compcoll INFO" in ln for ln in infos), infos
    for r in (0, 1):  # replica peers: r and r + 2 hold shard r
        assert ranks[r].result["shard_digest"] == ranks[r + 2].result["shard_digest"]
    assert ranks[0].result["shard_digest"] != ranks[1].result["shard_digest"]


def test_uncompressible_gradient_sums_are_reported_once_per_reason():
    """Under COMPCOLL_ALGO, a float64 DDP model, a non-contiguous view, an
    all_reduce_coalesced of float tensors (said nowhere before: a comm hook
    reducing its bucket with it compressed nothing, silently) and a sparse
    embedding gradient go to Gloo (exact, not counted) and rank 0 says so once for each, at
    WARN, naming the reason; integer sums, MAX and small tensors pass
    without a word, as on every other rank."""
    ranks = launch([worker("uncompressed.py")], 2, env={"COMPCOLL_ALGO": "dgc"}, timeout=180)
    reasons = {"float64": "a float64 tensor", "view": "a non-contiguous view",
               "sparse": "a sparse tensor", "coalesced": "an all_reduce_coalesced (SUM, 2 tensors"}
    for r in ranks:
        assert r.result["backend"] == "compcoll" and r.result["exact"], r.describe()
        assert r.result["calls"] == 0, r.describe()  # nothing went through compcoll
        warns = [ln for ln in r.stderr.splitlines() if "compcoll WARN" in ln]
        if r.rank != 0:
            assert not warns, r.describe()
            continue
        assert len(warns) == len(reasons), r.describe()
        for name, words in reasons.items():
            said = [ln for ln in warns if words in ln]
            assert len(said) == 1 and "went to Gloo uncompressed" in said[0], (name, warns)
        # The view is reduced outside backward, where the default scope keeps
        # it exact too: contiguous alone would change nothing, and it is said.
        view = [ln for ln in warns if reasons["view"] in ln][0]
        assert "It was also issued outside a backward pass" in view, view


def test_values_beside_compressed_gradients_get_no_advice_that_changes_nothing():
    """After DDP's gradients were compressed, a float64 or non-contiguous
    allreduce issued outside backward is values (metrics, a histogram),
    which the default scope keeps exact whatever its dtype or layout: an
    INFO line, not a WARN whose advice ("train it in float32", "reduce
    t.contiguous()") would change nothing."""
    ranks = launch([worker("values_after_gradients.py")], 2,
                   env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "INFO"}, timeout=180)
    for r in ranks:
        assert r.result["compressed"] > 0 and r.result["exact"], r.describe()
        assert not [ln for ln in r.stderr.splitlines() if "compcoll WARN" in ln], r.describe()
    infos = [ln for ln in ranks[0].stderr.splitlines()
             if "compcoll INFO" in ln and "taken as values" in ln]
    assert len(infos) == 2 and "a float64 tensor" in infos[0] \
        and "a non-contiguous view" in infos[1], infos


def test_clean_ddp_run_prints_no_warn(tmp_path):
    """A DDP script with COMPCOLL_ALGO set: DDP's bucket rebuild replaces
    buffers (same size and other sizes), which is expected and reported at
    INFO, not WARN. With COMPCOLL_DEBUG=INFO the drop is still reported."""
    for debug in ("WARN", "INFO"):
        ranks = launch([worker("clean_ddp.py")], 2,
                       env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": debug}, timeout=180)
        for r in ranks:
            warns = [ln for ln in r.stderr.splitlines() if "compcoll WARN" in ln]
            assert not warns, r.describe()
            if debug == "INFO":
                drops = [ln for ln in r.stderr.splitlines()
                         if "compcoll INFO" in ln and "residual" in ln and "dropped" in ln]
                assert drops, r.describe()


def test_a_hook_reducing_a_fresh_tensor_each_step_keeps_one_state():
    """A comm hook that allreduces a new tensor every step while DDP still
    holds the previous one would split its error-feedback state between two
    alternating slots: the backend recognises it, merges the two states into
    one, says so once at INFO (rank 0), and every later step continues that
    one state. PyTorch's allreduce_hook, which reduces the bucket in place,
    never meets it. No WARN either way. (fp16_compress_hook's float16 copy
    may or may not be freed before the next step's, depending on when the
    backend's worker drops it; where it is not, it is this pattern too.)"""
    phrase = "newly allocated tensor while the previous one is still alive"
    env = {"TEST_ALGOS": "dgc", "TEST_STEPS": "12", "TEST_GLOO_REFERENCE": "0",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COMPCOLL_DEBUG": "INFO"}
    fresh = launch([worker("hooks.py")], 2, env=dict(env, TEST_HOOKS="fresh_allreduce"),
                   timeout=180)
    for r in fresh:
        lines = r.stderr.splitlines()
        merged = [ln for ln in lines if "compcoll INFO" in ln and phrase in ln]
        assert len(merged) == (1 if r.rank == 0 else 0), r.describe()
        assert not [ln for ln in lines if "compcoll WARN" in ln], r.describe()
        run = r.result["fresh_allreduce"]["dgc"]
        assert run["identical"], r.describe()
        # the bucket's chain slot carries every step after the merge
        chain = [s for s in run["slots"] if s["chain"]]
        assert len(chain) == 1 and chain[0]["uses"] >= 12 - 5, run["slots"]
    if fresh[0].rank == 0:
        print(next(ln for ln in fresh[0].stderr.splitlines() if phrase in ln))
    own = launch([worker("hooks.py")], 2, env=dict(env, TEST_HOOKS="allreduce"), timeout=180)
    for r in own:
        assert not [ln for ln in r.stderr.splitlines() if phrase in ln], r.describe()
        assert not [s for s in r.result["allreduce"]["dgc"]["slots"] if s["overlapped"]]


def test_replicas_stay_identical_under_the_momentum_hand_over_with_fresh_tensors():
    """SGD with momentum 0.9: compcoll takes the momentum over and hands
    s_t - m * h back, h a mirror of the optimizer's buffer. fp16_compress_hook
    reduces a fresh tensor every step, and when the previous one is freed
    differs between ranks, so the tensor's error-feedback slot may differ
    too: a mirror kept per slot made the ranks hand back different updates,
    and the replicas drifted apart (every run of 24 steps, at dgc, sbc and
    csc). The mirror is kept by the call's place in the backward pass, the
    same on every rank."""
    env = {"TEST_ALGOS": "dgc,sbc,csc", "TEST_STEPS": "24", "TEST_MOMENTUM": "0.9",
           "TEST_HOOKS": "fp16_compress,fresh_allreduce", "TEST_GLOO_REFERENCE": "0",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    for r in launch([worker("hooks.py")], 2, env=env, timeout=300):
        for hook, runs in r.result.items():
            for algo, run in runs.items():
                assert run["identical"], f"{hook} {algo}: replicas differ\n{r.describe()}"


def test_fsdp_no_shard_reduces_alike_on_every_rank_under_the_momentum_hand_over():
    """FSDP NO_SHARD allreduces each flat gradient, a tensor freed at a
    time of each rank's own: with SGD momentum handed over, the ranks'
    reduced gradients differed from some step on (2 runs in 3 for an outside
    review, 1 in 3 here under load) until the mirror was kept by call order."""
    for r in launch([worker("fsdp_no_shard_momentum.py")], 2,
                    env={"COMPCOLL_ALGO": "dgc", "STEPS": "30"}, timeout=300):
        assert r.result["steps_differing"] == [], r.describe()
        assert r.result["stats"]["compressed_calls"] >= 30, r.result["stats"]
        assert abs(r.result["stats"]["optimizer_momentum"] - 0.9) < 1e-6, r.result["stats"]


def test_nested_backward_passes_keep_each_tensors_momentum_mirror():
    """Reentrant activation checkpointing runs each layer's backward as a
    nested autograd pass: the hand-over's mirrors of fresh tensors are
    counted since the optimizer step, across passes, so two layers of one
    shape keep their own (counted per pass, they shared one, and every step
    after the first handed back s_j - m * s_other: an outside review). The
    reduced gradients are those of the same run without checkpointing."""
    env = {"COMPCOLL_ALGO": "dgc"}
    flat = launch([worker("reentrant_checkpoint.py")], 2, env=dict(env, CHECKPOINT="0"))
    nested = launch([worker("reentrant_checkpoint.py")], 2, env=dict(env, CHECKPOINT="1"))
    for f, n in zip(flat, nested):
        assert n.result["stats"]["compressed_calls"] == 12, n.describe()
        assert abs(n.result["stats"]["optimizer_momentum"] - 0.9) < 1e-6, n.describe()
        assert n.result["sums"] == f.result["sums"], (f.result["sums"], n.result["sums"])


@pytest.mark.parametrize("hook", ["fp16", "fresh"])
def test_two_models_with_hooks_never_share_a_state(hook):
    """Two DDP models of one architecture, each with a hook that reduces a
    fresh tensor every call (torch's fp16_compress_hook, or a copy the hook
    keeps alive until its next call), trained in backward passes of their
    own, 2 ranks, dgc. Model A trains bit for bit as it does alone: no
    residual of B's ever reaches A's gradient. Each model's tensors keep
    slots of their own (one owner per registered hook), A's and B's slots
    are used equally often, and replicas are identical."""
    env = {"COMPCOLL_ALGO": "dgc", "HOOK": hook, "STEPS": "8"}
    alone = launch([worker("two_models.py")], 2, env=dict(env, MODE="alone"), timeout=180)
    both = launch([worker("two_models.py")], 2, env=dict(env, MODE="both"), timeout=180)
    for solo, pair in zip(alone, both):
        assert solo.result["identical"] and pair.result["identical"], pair.describe()
        assert pair.result["a"] == solo.result["a"], pair.describe()
        used = [s for s in pair.result["slots"] if s["uses"] > 0]
        by_owner = {}
        for s in used:
            by_owner.setdefault(s["owner"], []).append(s)
        assert len(by_owner) == 2 and 0 not in by_owner, used
        assert [sum(s["uses"] for s in v) for v in by_owner.values()] == [8, 8], used
        assert pair.result["stats"]["compressed_calls"] == 16, pair.result["stats"]


def test_powersgd_with_several_buckets_keeps_one_order():
    """PowerSGD with two DDP buckets per step (after the rebuild), 4 ranks:
    one bucket's callbacks allreduce its factors while the autograd thread
    submits the next bucket's allreduce. compcoll runs a callback's operations right
    after the one that completed (docs/pytorch.md), so every rank issues the
    same order: every algorithm finishes with identical parameters. (Plain
    Gloo runs the callbacks on its own threads: there the two race, and this
    run fails with a collective mismatch, so there is no Gloo reference.)"""
    ranks = launch([worker("hooks.py")], 4,
                   env={"TEST_HOOKS": "powerSGD,batched_powerSGD", "TEST_ALGOS": ",".join(ALGOS),
                        "TEST_STEPS": "6", "TEST_BUCKET_MB": "0.03", "TEST_GLOO_REFERENCE": "0",
                        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                   timeout=300)
    for r in ranks:
        for hook in ("powerSGD", "batched_powerSGD"):
            for algo in ALGOS:
                run = r.result[hook][algo]
                assert run["identical"] and len(run["losses"]) == 6, (r.rank, hook, algo, run)


def test_post_local_sgd_compresses_its_gradients_and_averages_exactly():
    """Post-local SGD as torch documents it (post_localSGD_hook and
    PostLocalSGDOptimizer with a PeriodicModelAverager), 4 ranks in two
    subgroups, COMPCOLL_ALGO=dgc from the environment: the hook's allreduces
    run in backward and are compressed (over the world until START, then
    within each subgroup); the averager's allreduce of the parameters runs
    after the optimizer step and is exact, so every averaging step leaves
    every rank with the same bits, and between them the subgroups drift
    apart. A clean run: the averager's exact allreduce is expected beside
    compressed DDP, so nothing is said at WARN; the subgroups' log lines
    name their group beside their rank."""
    start, period, steps = 3, 2, 8  # workers/post_local_sgd.py
    ranks = launch([worker("post_local_sgd.py")], 4,
                   env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "INFO"}, timeout=240)
    for r in ranks:
        res = r.result
        assert res["finite"] and len(res["steps"]) == steps, res
        for s in res["steps"]:
            n = s["step"]
            averaged = n > start and (n - start - 1) % period == 0
            assert s["same_in_subgroup"], (r.rank, s)
            assert s["same"] == (n <= start or averaged), (r.rank, s)
            if n <= start:  # one bucket a step, allreduced over the world
                assert s["world_compressed"] == n and s["sub_compressed"] == 0, (r.rank, s)
            else:  # within the subgroup; the world's calls are the averager's, exact
                assert s["world_compressed"] == start and s["sub_compressed"] == n - start, \
                    (r.rank, s)
        assert s["world_calls"] == start + (steps - start + 1) // period, s
        assert not [ln for ln in r.stderr.splitlines() if ln.startswith("compcoll WARN")], \
            r.describe()
        # A subgroup's communicator names its group beside its rank in the
        # subgroup; the world's does not.
        created = [ln for ln in r.stderr.splitlines() if "communicator of " in ln]
        assert any(ln.startswith(f"compcoll INFO [rank {r.rank % 2}, group '") and
                   "communicator of 2 ranks" in ln for ln in created), created
        assert any(ln.startswith(f"compcoll INFO [rank {r.rank}] communicator of 4 ranks")
                   for ln in created), created


@pytest.mark.parametrize("algo,wrapper", [("dgc", ""), ("csc", ""), ("dgc", "fp16"),
                                          ("dgc", "bf16")])
def test_powersgd_factors_are_never_compressed_again(algo, wrapper):
    """PowerSGD's factors above COMPCOLL_MIN_ELEMS: compressing them again
    zeroed whole factors and its orthogonalization turned the model into NaN
    (dgc at step 4; csc at step 3 without warm-up), silently. Now what the
    hook issues goes exact, the model stays finite and the same on every
    rank, and rank 0 says once at WARN that COMPCOLL_ALGO changes nothing
    for that model. Inside torch's fp16/bf16 compress wrapper the hook has
    another name, and was compressed again (NaN from step 3): it is found by
    its PowerSGDState now."""
    ranks = launch([worker("powersgd_factors.py")], 2,
                   env={"COMPCOLL_ALGO": algo, "COMPCOLL_WARMUP_STEPS": "0",
                        "TEST_WRAPPER": wrapper}, timeout=180)
    for r in ranks:
        res = r.result
        assert res["finite"] and res["identical"], (r.rank, res)
        assert res["compressed_calls"] == 0 and res["calls"] >= 6, (r.rank, res)
    name = f"{wrapper}_compress_wrapper_hook" if wrapper else "powerSGD_hook"
    said = [ln for ln in ranks[0].stderr.splitlines()
            if ln.startswith("compcoll WARN") and f"{name} compresses the gradients itself" in ln]
    assert len(said) == 1, ranks[0].stderr


@pytest.mark.parametrize("hook", ["QUANTIZE_PER_TENSOR", "QUANTIZE_PER_CHANNEL"])
def test_a_quantization_hook_is_said_to_leave_nothing_to_compress(hook):
    """DDP's quantization hooks reduce gradients with all_gather of 8-bit
    values and issue no allreduce: under COMPCOLL_ALGO nothing is compressed,
    which was said nowhere (the end-of-job notice counts allreduce calls, and
    there were none). Now rank 0 says once at WARN, naming the hook, and the
    model still trains the same on every rank."""
    ranks = launch([worker("quantization_hook.py")], 2,
                   env={"COMPCOLL_ALGO": "dgc", "TEST_HOOK": hook}, timeout=180)
    for r in ranks:
        res = r.result
        assert res["identical"] and len(res["losses"]) == 4, (r.rank, res)
        assert res["compressed_calls"] == 0, (r.rank, res)
    name = {"QUANTIZE_PER_TENSOR": "quantization_pertensor_hook",
            "QUANTIZE_PER_CHANNEL": "quantization_perchannel_hook"}[hook]
    for r in ranks:
        said = [ln for ln in r.stderr.splitlines()
                if ln.startswith("compcoll WARN") and f"DDP comm hook {name} reduces" in ln]
        assert len(said) == (1 if r.rank == 0 else 0), r.stderr


def test_hierarchical_model_averager_subgroups_are_not_warned_about():
    """HierarchicalModelAverager beside compressed DDP: its subgroups carry
    only the averaging of parameters (values, after the optimizer step,
    exact), and rank 0 warned for each one that gradients might be going
    uncompressed ("set COMPCOLL_TORCH_SCOPE=all"), although the world group
    compressed DDP's gradients. Now that is an INFO line, and the replicas
    stay the same bits."""
    ranks = launch([worker("hierarchical_averager.py")], 4, env={"COMPCOLL_ALGO": "dgc"},
                   timeout=240)
    for r in ranks:
        res = r.result
        assert res["compressed_calls"] > 0, res
        # DDP keeps the replicas equal, and averaging equal values keeps them so
        assert all(s["same"] for s in res["steps"]), (r.rank, res)
        assert res["averaging_calls"] > 0, res
        assert not [ln for ln in r.stderr.splitlines() if ln.startswith("compcoll WARN")], \
            r.describe()
