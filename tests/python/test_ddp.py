"""DDP with compcoll: accuracy against dense training, error-feedback keys
across DDP's bucket rebuild, and bytes on the wire."""
import json
import os
import re
import sys

import pytest

from conftest import EXAMPLES, launch, run_single, worker

ALGOS = ["dgc", "sbc", "sdagc", "csc", "onebit"]


@pytest.mark.end_to_end
def test_ddp_accuracy_matches_dense(tmp_path):
    """4 ranks, the digits example (same seed, data order and steps for every
    run): each algorithm's final test accuracy is within 1 point of dense
    training. Default densities; the example's optimiser is plain SGD."""
    out = tmp_path / "digits.json"
    png = tmp_path / "digits.png"
    r = run_single([sys.executable, os.path.join(EXAMPLES, "ddp_digits.py"), "--ranks", "4", "--steps", "400",
                    "--algos", ",".join(["dense"] + ALGOS), "--json", str(out), "--plot", str(png)],
                   timeout=600)
    print(r.stdout)
    results = {x["algo"]: x for x in json.loads(out.read_text())}
    dense = results["dense"]["accuracy"]
    assert dense > 0.9, results["dense"]
    assert png.exists() and png.stat().st_size > 10_000
    for algo in ALGOS:
        acc = results[algo]["accuracy"]
        print(f"{algo}: {100 * acc:.2f}% vs dense {100 * dense:.2f}% "
              f"(ratio {results[algo]['ratio']:.1f}x)")
        assert abs(acc - dense) <= 0.01 + 1e-9, f"{algo}: {acc} vs dense {dense}"
        assert results[algo]["compressed_calls"] == results[algo]["calls"] - 1  # the loss all_reduce
        assert results[algo]["ratio"] > 4


@pytest.mark.parametrize("algo", ["dgc", "onebit"])
def test_a_model_built_after_another_is_freed_starts_afresh(algo):
    """Two DDP models of one architecture trained one after the other in one
    process, then a third, 2 ranks: the third trains bit for bit as it does
    in a process of its own. Its buckets take over the freed models' slots
    with fresh states (rule 2b'), where they had carried the previous
    model's residual into its parameters."""
    env = {"COMPCOLL_ALGO": algo, "STEPS": "5"}
    alone = launch([worker("sequential_ddp.py")], 2, env=dict(env, MODELS="0"), timeout=180)
    after = launch([worker("sequential_ddp.py")], 2, env=dict(env, MODELS="2"), timeout=180)
    for solo, late in zip(alone, after):
        assert solo.result["identical"] and late.result["identical"], late.describe()
        assert late.result["last"] == solo.result["last"], late.describe()
        events = [e for _, _, e in late.result["trace"]]
        assert "carried" not in events, late.result["trace"]
        # each later model: fresh at its first bucket, fresh at its rebuild
        assert events.count("fresh") == 3 * 2 - 1, late.result["trace"]


def test_error_feedback_keys_survive_bucket_rebuild(tmp_path):
    """DDP allreduces one bucket of every parameter in iteration 1 and
    rebuilds its buckets (in gradient-ready order) before iteration 2. After
    the rebuild every bucket keeps one key for good; no state is reused for a
    tensor of another size or for the rebuilt same-size bucket (whose layout
    differs); the replaced states are reported, not silently reused."""
    ranks = launch([worker("ddp_keys.py")], 2, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                   timeout=240)
    for r in ranks:
        for name in ("small", "big"):
            res = r.result[name]
            its = res["iterations"]
            first, rebuilt, later = its[0], its[1], its[2:]
            assert len(first) == 1 and first[0][1] == res["params"]  # one bucket of everything
            keys = [(k, n) for k, n, _ in rebuilt]
            for it in later:  # stable from the rebuild on
                assert [(k, n) for k, n, _ in it] == keys and all(e == "same" for _, _, e in it)
            first_key = first[0][0]
            for k, n, event in rebuilt:
                if k == first_key:  # only ever with another size (state replaced) ...
                    assert n != res["params"] and event == "resized", rebuilt
                elif n == res["params"]:  # ... or the same size under a fresh key
                    assert event == "fresh", rebuilt
                else:
                    assert event in ("new", "resized"), rebuilt
            live = [s for s in res["slots"] if s["live"]]
            assert sorted((s["key"], s["numel"]) for s in live) == sorted(keys)
        assert len(r.result["big"]["iterations"][1]) > 1  # the big model really was split
        small_rebuilt = r.result["small"]["iterations"][1]
        assert small_rebuilt[0][2] == "fresh"


def test_dgc_wire_bytes_per_step_270x_below_dense(tmp_path):
    """dgc at density 0.001 on 4 ranks. Each rank sends its payload to the
    P-1 others (allgather) while dense ring allreduce sends 2(P-1)/P of the
    tensor, so fp32 values + u32 indices (8 bytes per entry) cap the ratio
    near 250x at 4 ranks. fp16 values + varint-coded index gaps (about 4
    bytes per entry) measure about 600x here and are held to DGC's 270x;
    the default fp8 values + Rice-coded gaps (about 2.4 bytes at this
    density) measure about 800x and are held to 450x."""
    encodings = ("fp32/u32", "fp16/varint", "fp8/rice")
    ranks = launch([worker("ddp_ratio.py")], 4,
                   env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TEST_ENCODINGS": ",".join(encodings)},
                   timeout=300)
    for r in ranks:
        for enc in encodings:
            ratios = [s["dense_bytes"] / s["wire_bytes"] for s in r.result[enc]["steps"]]
            assert all(s["compressed_calls"] == s["calls"] for s in r.result[enc]["steps"])
            print(f"rank {r.rank} {enc}: per-step ratio min {min(ratios):.1f} max {max(ratios):.1f}")
            if enc == "fp8/rice":
                assert min(ratios) >= 450, ratios
            elif enc == "fp16/varint":
                assert min(ratios) >= 270, ratios
            else:
                assert 150 <= min(ratios) <= 260, ratios  # the cap the docstring explains


@pytest.mark.parametrize("algo", ALGOS + ["auto"])
def test_every_ddp_option_keeps_replicas_identical_and_compressed(algo, tmp_path):
    """Env-only activation under each DDP option that changes how gradients
    reach the backend (gradient_as_bucket_view, static_graph,
    find_unused_parameters with a branch unused every other step, small
    buckets, no_sync accumulation, and all at once), SGD with momentum (so
    the momentum hand-over runs too): after 6 steps every rank holds the
    same parameters, finite and moved, and compcoll compressed calls in
    every variant, none of which is a silent dense run. The stats file each
    rank writes at exit (COMPCOLL_STATS_FILE) holds the variants' sums."""
    env = {"COMPCOLL_ALGO": algo, "COMPCOLL_WARMUP_STEPS": "0",
           "COMPCOLL_STATS_FILE": str(tmp_path / "stats-{rank}.json")}
    if algo == "auto":
        env["COMPCOLL_DEBUG"] = "INFO"  # auto's choices, each with its reason
    ranks = launch([worker("ddp_options.py")], 2, env=env, timeout=240)
    for r in ranks:
        res = r.result
        assert res["backend"] == "compcoll", r.describe()
        variants = {k: v for k, v in res.items() if isinstance(v, dict)}
        assert len(variants) == 7, res
        # auto compresses a size only where it measures compression faster,
        # which on loopback depends on the machine's load (a loaded CI machine
        # has chosen dense for every bucket of a variant). Such a variant is
        # not a silent no-op when auto said, with its reason, that it chose
        # dense for a size.
        auto_chose_dense = re.search(r"auto: .* x \w+: dense \(", r.stderr) is not None
        for name, v in variants.items():
            assert v["same_on_every_rank"] and v["finite"] and v["moved"], (algo, name, v)
            assert v["compressed_calls"] > 0 or (algo == "auto" and auto_chose_dense), \
                (algo, name, v, r.describe())
            assert v["calls"] >= 6, (algo, name, v)
        # DDP's rebuilt buckets (its own log): the small cap really splits them.
        assert variants["small_buckets"]["buckets"] > variants["plain"]["buckets"], res
        with open(tmp_path / f"stats-{r.rank}.json") as f:
            written = json.load(f)
        for key in ("calls", "compressed_calls"):
            assert written[key] == sum(v[key] for v in variants.values()), (algo, key, written)


@pytest.mark.parametrize("mode", ["ddp_optimizer", "python_reducer"])
def test_torch_compile_ddp_is_compressed_with_one_state_per_tensor(mode):
    """An unmodified DDP script under torch.compile, dgc from the
    environment, 2 ranks, 6 steps. ddp_optimizer: dynamo splits the graph at
    DDP's buckets, which DDP allreduces as usual. python_reducer (compiled
    autograd): every parameter's gradient goes as a temporary, freed before
    the next parameter's; two weights share a shape. Either way the replicas
    end identical, every large gradient is compressed, and each tensor keeps
    an error-feedback state of its own: from the third step on every step's
    calls carry the same keys, distinct within the step ("carried" for the
    reducer's temporaries, "same" for DDP's buckets), where they used to
    share one state per shape and drop it at every change of size."""
    ranks = launch([worker("compiled_ddp.py")], 2,
                   env={"COMPCOLL_ALGO": "dgc", "MODE": mode}, timeout=420)
    assert ranks[0].result["hash"] == ranks[1].result["hash"]
    for r in ranks:
        res = r.result
        assert "compcoll WARN" not in r.stderr, r.describe()
        steps = res["steps"]
        assert len(steps) == 6 and all(steps), steps
        # python_reducer: the 3 weights of 32768+ elements; DDP: its buckets
        sizes = sorted(n for _, n, _ in steps[-1])
        if mode == "python_reducer":
            assert sizes == [32768, 65536, 65536], steps[-1]
        keys = [[k for k, _, _ in s] for s in steps]
        assert len(set(keys[-1])) == len(keys[-1]), steps[-1]
        assert all(k == keys[2] for k in keys[2:]), keys
        steady = "carried" if mode == "python_reducer" else "same"
        assert all(e == steady for s in steps[2:] for _, _, e in s), steps
        assert res["stats"]["compressed_calls"] == sum(len(s) for s in steps), res["stats"]
