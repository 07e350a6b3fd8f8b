"""COMPCOLL_MOMENTUM_HANDOVER=auto (the default) under an unmodified DDP
script: the group takes SGD's momentum over at the first optimizer step when
every rank runs the same one, says so, and otherwise (Adam, Nesterov, ranks
that disagree, the setting off) changes nothing and says why; it never
hangs."""
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


def test_adam_and_nesterov_change_nothing_and_say_why():
    for opt, why in (("adam", "the optimizer is Adam, not torch.optim.SGD"),
                     ("sgd-nesterov:0.9", "SGD with nesterov=True"),
                     ("sgd:0", "SGD without momentum")):
        ranks = run("--opt", opt)
        assert [r.result["momentum"] for r in ranks] == [0.0, 0.0], opt
        assert why in ranks[0].stderr, ranks[0].stderr
        assert "momentum correction" not in ranks[0].stderr + ranks[1].stderr


def test_ranks_that_disagree_take_nothing_over_and_warn():
    ranks = run("--opt", "sgd:0.9", "--opt-rank1", "sgd:0.5")
    assert [r.result["momentum"] for r in ranks] == [0.0, 0.0]
    assert "the ranks' optimizers disagree (SGD momentum from 0.5 to 0.9" in ranks[0].stderr


def test_a_second_optimizer_is_reported_once():
    ranks = run("--opt", "sgd:0.9", "--second", "adam", "--steps", "5")
    assert all(abs(r.result["momentum"] - 0.9) < 1e-6 for r in ranks)
    assert ranks[0].stderr.count("follows the first optimizer this process stepped") == 1


def test_accumulation_without_no_sync_turns_it_off_again_and_warns():
    # Two allreduces of every gradient per optimizer step: the hand-over's
    # mirror would advance twice per step, so the group gives it up.
    ranks = run("--opt", "sgd:0.9", "--accumulate", "2", "--steps", "5")
    assert [r.result["momentum"] for r in ranks] == [0.0, 0.0]
    assert "COMPCOLL_MOMENTUM_HANDOVER=auto turned off again" in ranks[0].stderr, ranks[0].stderr
    assert "accumulate with no_sync()" in ranks[0].stderr


def test_one_allreduce_per_step_keeps_it():
    ranks = run("--opt", "sgd:0.9", "--steps", "6")
    assert all(abs(r.result["momentum"] - 0.9) < 1e-6 for r in ranks)
    assert "turned off again" not in ranks[0].stderr


def test_off_and_configured_momentum_leave_it_alone():
    for env in ({"COMPCOLL_MOMENTUM_HANDOVER": "0"}, {"COMPCOLL_MOMENTUM": "0.9"}):
        ranks = run("--opt", "sgd:0.9", **env)
        assert [r.result["momentum"] for r in ranks] == [0.0, 0.0], env
        assert "COMPCOLL_MOMENTUM_HANDOVER=auto" not in ranks[0].stderr, env


def test_replicas_stay_identical():
    # The hand-over's output is computed on every rank from the agreed m and
    # the same allreduced sum: the replicas' parameters stay bit for bit equal.
    ranks = launch([SCRIPT, "--opt", "sgd:0.9", "--steps", "6"], RANKS,
                   env=dict(ENV, COMPCOLL_WARMUP_STEPS="0"), timeout=120)
    assert ranks[0].result["momentum"] > 0
    assert ranks[0].result["params"] == ranks[1].result["params"]
