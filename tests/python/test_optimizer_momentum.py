"""COMPCOLL_MOMENTUM_HANDOVER=auto (the default) under an unmodified DDP
script: the group takes SGD's momentum over (hand-over) or moves Adam's beta1
into compcoll at the first optimizer step when every rank runs the same one,
says so, and otherwise (Nesterov, amsgrad, ranks that disagree, the setting
off) changes nothing and says why; it never hangs."""
from conftest import launch, worker

RANKS = 2
SCRIPT = worker("optimizer_momentum.py")
ENV = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DENSITY": "0.01", "COMPCOLL_MIN_ELEMS": "1000",
       "COMPCOLL_DEBUG": "INFO"}


def run(*args, **env):
    return launch([SCRIPT, *args], RANKS, env=dict(ENV, **env), timeout=120)


def test_sgd_momentum_is_taken_over_on_every_rank():
    ranks = run("--opt", "sgd:0.9")
    for r in ranks:
        assert abs(r.result["momentum"] - 0.9) < 1e-6, r.describe()
        assert "COMPCOLL_MOMENTUM_HANDOVER=auto: the optimizer's SGD momentum is 0.9" in r.stderr
        assert "masking at densities <= 0.02" in r.stderr, r.stderr


def test_an_optimizer_one_rank_steps_before_training_is_not_followed_and_never_hangs():
    """Rank 0 alone fits a probe model (SGD momentum 0.5) before DDP
    training: the agreement waits until the group has compressed something,
    so the probe's step is no collective the other rank never joins (it
    hung until the group's timeout, 30 minutes by default), and the
    training optimizer's momentum is the one taken over."""
    ranks = run("--opt", "sgd:0.9", "--rank0-probe", "sgd:0.5")
    for r in ranks:
        assert abs(r.result["momentum"] - 0.9) < 1e-6, r.describe()


def test_zero_redundancy_optimizer_is_looked_through():
    """torch's ZeroRedundancyOptimizer steps an SGD or Adam of its own on each
    rank's shard: that one is taken over, as without ZeRO, and the wrapper
    is not a second optimizer to warn about. The replicas stay identical."""
    for opt, moved in (("zero-sgd:0.9", False), ("zero-adam", True)):
        ranks = run("--opt", opt)
        for r in ranks:
            res = r.result
            assert abs(res["momentum"] - 0.9) < 1e-6 and res["moved"] == moved, r.describe()
            if moved:  # the shard optimizer runs with beta1 = 0, and saves the script's
                assert (res["beta1"], res["beta1_saved"]) == (0.0, 0.9), res
            assert "compcoll WARN" not in r.stderr and "follows the first optimizer" not in \
                r.stderr, r.describe()
        assert ranks[0].result["params"] == ranks[1].result["params"]


def test_adam_beta1_is_moved_into_compcoll_and_its_checkpoint_keeps_it():
    for opt in ("adam", "adamw:0.8"):
        b1 = 0.8 if opt.startswith("adamw") else 0.9
        ranks = run("--opt", opt, "--reload", "1")
        for r in ranks:
            res = r.result
            assert abs(res["momentum"] - b1) < 1e-6 and res["moved"], r.describe()
            # Runs with beta1 = 0 (again after the load_state_dict at step 1),
            # checkpoints the script's, and gets it back without compcoll.
            assert (res["beta1"], res["beta1_saved"], res["beta1_after"]) == (0.0, b1, b1), res
        assert f"the optimizer's momentum {b1} (Adam's beta1) is moved into compcoll" in \
            ranks[0].stderr, ranks[0].stderr
        assert "the optimizer runs with beta1 = 0" in ranks[0].stderr
        assert "momentum factor masking at every step, ranking by normalized value" in \
            ranks[0].stderr, ranks[0].stderr
        assert ranks[0].result["params"] == ranks[1].result["params"]


def test_moved_adam_beta1_equals_the_explicit_recipe_bit_for_bit():
    # What a user who knows DGC's recipe writes by hand: Adam with beta1 0 and
    # COMPCOLL_MOMENTUM = the script's beta1 (masking at every step, the
    # default with an explicit momentum, as the moved beta1 masks). Both rank
    # by magnitude here: under Adam, COMPCOLL_SELECTION=auto ranks by
    # normalized value from the call after the hand-over, whose second
    # moment then starts a call later than an explicit recipe's can
    # (the log line checked above says which ranking runs).
    common = {"COMPCOLL_WARMUP_STEPS": "0", "COMPCOLL_SELECTION": "magnitude"}
    auto = run("--opt", "adam", "--steps", "6", **common)
    recipe = run("--opt", "adam:0", "--steps", "6", COMPCOLL_MOMENTUM="0.9", **common)
    plain = run("--opt", "adam", "--steps", "6", COMPCOLL_MOMENTUM_HANDOVER="0", **common)
    assert auto[0].result["moved"] and not recipe[0].result["moved"]
    assert auto[0].result["params"] == recipe[0].result["params"]
    assert auto[0].result["params"] != plain[0].result["params"]  # the test can fail


def test_nesterov_amsgrad_and_no_momentum_change_nothing_and_say_why():
    """Nothing is taken over, and rank 0 says why. An optimizer whose momentum
    exists but cannot be taken over (Nesterov, amsgrad) is said at WARN with
    what to set instead: it trains without DGC's correction and with its own
    momentum on delayed updates, and said only at INFO it went unnoticed."""
    for opt, why, warned in (("sgd-nesterov:0.9", "SGD with nesterov=True", True),
                             ("sgd:0", "SGD without momentum", False),
                             ("adam-amsgrad", "Adam with amsgrad=True", True),
                             ("adam:0", "Adam with beta1 0.0", False),
                             # Not taken over and, before, not named either.
                             ("rmsprop:0.9", "the optimizer is RMSprop", True)):
        ranks = run("--opt", opt)
        assert [r.result["momentum"] for r in ranks] == [0.0, 0.0], opt
        assert why in ranks[0].stderr, ranks[0].stderr
        for r in ranks:
            warns = [ln for ln in r.stderr.splitlines()
                     if ln.startswith("compcoll WARN") and "cannot take over the momentum" in ln]
            assert len(warns) == (1 if warned and r.rank == 0 else 0), (opt, r.stderr)
            if warns:
                assert why in warns[0] and "COMPCOLL_MOMENTUM=0.9" in warns[0], warns
                assert ("COMPCOLL_NESTEROV=1" in warns[0]) == ("nesterov" in opt), warns
            other = [ln for ln in r.stderr.splitlines() if "cannot take over" not in ln]
            assert "momentum correction" not in "\n".join(other), (opt, r.stderr)


def test_ranks_that_disagree_take_nothing_over_and_warn():
    ranks = run("--opt", "sgd:0.9", "--opt-rank1", "sgd:0.5")
    assert [r.result["momentum"] for r in ranks] == [0.0, 0.0]
    assert "the ranks' optimizers disagree (momentum from 0.5 to 0.9, all of one kind" in \
        ranks[0].stderr
    ranks = run("--opt", "sgd:0.9", "--opt-rank1", "adam")
    assert [r.result["momentum"] for r in ranks] == [0.0, 0.0]
    assert [r.result["beta1"] for r in ranks] == [None, 0.9]  # rank 1's Adam is left alone
    assert "SGD on some, Adam on others" in ranks[0].stderr


def test_a_second_optimizer_is_reported_once():
    ranks = run("--opt", "sgd:0.9", "--second", "adam", "--steps", "5")
    assert all(abs(r.result["momentum"] - 0.9) < 1e-6 for r in ranks)
    # At WARN in compcoll's own form, by rank 0 only (it was a Python
    # logging warning on every rank).
    said = [ln for ln in ranks[0].stderr.splitlines() if "follows the first optimizer" in ln]
    assert len(said) == 1 and said[0].startswith("compcoll WARN [rank 0]"), ranks[0].stderr
    assert "follows the first optimizer" not in ranks[1].stderr, ranks[1].stderr


def test_a_momentum_schedule_is_said_to_change_nothing_once():
    """OneCycleLR cycles the momentum by default (cycle_momentum=True):
    compcoll keeps the momentum it took over at the first step, so the
    schedule's values change nothing; rank 0 says so once, for SGD's
    hand-over and for Adam's moved beta1 (an outside review found both
    silent). Without a schedule, nothing is said."""
    phrase = "took over at its first step (a momentum schedule"
    for opt in ("sgd:0.9", "adam:0.9"):
        ranks = run("--opt", opt, "--steps", "6", "--schedule")
        assert ranks[0].stderr.count(phrase) == 1, ranks[0].describe()
        assert phrase not in ranks[1].stderr, ranks[1].describe()
        quiet = run("--opt", opt, "--steps", "6")
        assert all(phrase not in r.stderr for r in quiet), quiet[0].describe()


def test_accumulation_without_no_sync_turns_it_off_again_and_warns():
    # Two allreduces of every gradient per optimizer step: the hand-over's
    # mirror would advance twice per step, so the group gives it up.
    ranks = run("--opt", "sgd:0.9", "--accumulate", "2", "--steps", "5")
    assert [r.result["momentum"] for r in ranks] == [0.0, 0.0]
    assert "COMPCOLL_MOMENTUM_HANDOVER=auto turned off again" in ranks[0].stderr, ranks[0].stderr
    assert "accumulate with no_sync()" in ranks[0].stderr
    # Adam's beta1, moved into compcoll at the first step, comes back.
    ranks = run("--opt", "adam", "--accumulate", "2", "--steps", "5")
    assert [(r.result["momentum"], r.result["beta1"]) for r in ranks] == [(0.0, 0.9)] * 2


def test_one_allreduce_per_step_keeps_it():
    ranks = run("--opt", "sgd:0.9", "--steps", "6")
    assert all(abs(r.result["momentum"] - 0.9) < 1e-6 for r in ranks)
    assert "turned off again" not in ranks[0].stderr


def test_off_and_configured_momentum_leave_it_alone():
    for env in ({"COMPCOLL_MOMENTUM_HANDOVER": "0"}, {"COMPCOLL_MOMENTUM": "0.9"}):
        ranks = run("--opt", "sgd:0.9", **env)
        assert [r.result["momentum"] for r in ranks] == [0.0, 0.0], env
        assert "COMPCOLL_MOMENTUM_HANDOVER=auto:" not in ranks[0].stderr, env


def test_replicas_stay_identical():
    # The hand-over's output is computed on every rank from the agreed m and
    # the same allreduced sum: the replicas' parameters stay bit for bit equal.
    ranks = launch([SCRIPT, "--opt", "sgd:0.9", "--steps", "6"], RANKS,
                   env=dict(ENV, COMPCOLL_WARMUP_STEPS="0"), timeout=120)
    assert ranks[0].result["momentum"] > 0
    assert ranks[0].result["params"] == ranks[1].result["params"]


def test_a_configured_momentum_the_optimizer_applies_again_is_said_once():
    """COMPCOLL_MOMENTUM=m replaces the optimizer's momentum: with SGD's or
    Adam's own momentum on top it was applied twice, and
    COMPCOLL_MOMENTUM_HANDOVER=1 with an optimizer that has none cancelled
    it, without a word. Now the first step after the group compressed says
    so once at WARN on rank 0; the settings that fit say nothing."""
    cases = [  # (optimizer, extra env, what rank 0 says at WARN or None)
        ("sgd:0.9", {}, "the momentum is applied twice"),
        ("adam", {}, "set the optimizer's beta1 to 0"),
        ("sgd:0", {}, None),
        ("sgd:0.9", {"COMPCOLL_MOMENTUM_HANDOVER": "1"}, None),
        ("sgd:0", {"COMPCOLL_MOMENTUM_HANDOVER": "1"}, "but SGD without momentum"),
        ("sgd:0.5", {"COMPCOLL_MOMENTUM_HANDOVER": "1"}, "but SGD with momentum 0.5"),
    ]
    for opt, env, said in cases:
        ranks = run("--opt", opt, COMPCOLL_MOMENTUM="0.9", **env)
        for r in ranks:
            warns = [ln for ln in r.stderr.splitlines()
                     if ln.startswith("compcoll WARN") and "COMPCOLL_MOMENTUM" in ln]
            if said is None or r.rank != 0:
                assert warns == [], (opt, env, r.rank, warns)
            else:
                assert len(warns) == 1 and said in warns[0], (opt, env, r.stderr)
